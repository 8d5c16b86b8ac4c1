"""Cluster settings: ``num_csx`` systems run data parallel over JAX devices, in one or many processes.

``num_csx > 1`` maps to a 1-D ``jax.sharding.Mesh`` with axis ``"csx"``: the global batch is
split along axis 0 and everything else is replicated, so gradients are averaged by XLA's
all-reduce, the analogue of SwarmX's reduce.

Many processes (one per host): `initialize` starts ``jax.distributed`` (the ``wafer run``
flags ``--num_processes``, ``--process_id``, ``--coordinator_address``, or what
``jax.distributed.initialize`` reads itself: ``JAX_COORDINATOR_ADDRESS`` and the SLURM / MPI
environment). `mesh` then spreads the ``num_csx`` systems evenly over all processes' devices;
each process reads the whole global batch and hands JAX only its own rows
(`global_batch`); the replicated train state is assembled with `replicated`.

A mistake that one process finds (a resume whose settings do not fit, a damaged file, a model_dir
process 0 cannot write) must stop every process, not leave the others waiting in the next
collective until ``jax.distributed`` times out. At each such decision every process calls
`agree` (or runs the code under `same_outcome`): if any process has an error, every process
raises it, the same type with the same message (`first_error`).

Nothing here changes process-wide settings except `initialize`, which the CLI calls once.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import importlib
import io
import json
import pickle
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from wafer.config.schema import batch_split_problem
from wafer.errors import ClusterConfigError, OtherProcessFailed

AXIS = "csx"


_MAX_MESSAGE = 64 * 1024
"""Characters of an error message that `first_error` passes to the other processes (the rest is cut)."""


def first_error(error: BaseException | None) -> BaseException | None:
  """The error of the lowest-numbered process that has one at this point, on every process; None if none has.

  Call it on every process at the same point of the run (it is a collective with many processes),
  with this process's own error or None. The process that had the error gets its own exception
  back (its traceback kept); every other process gets one of the same type with the same message
  (and the same ``int``/``float``/``str``/``bool``/None attributes, e.g. a step number), so each
  process takes the same branch, or raises the same error and the CLI prints the same line. An
  error whose type is not wafer's, precision's or the models' (a bug) reaches the others as
  `OtherProcessFailed` naming the process, its type and its message. With one process: ``error``
  as is, no collective.

  >>> first_error(None) is None
  True
  >>> first_error(KeyError("k"))
  KeyError('k')
  """
  if jax.process_count() == 1:
    return error
  from jax.experimental import multihost_utils

  with _collective(error):
    failed = np.asarray(multihost_utils.process_allgather(np.int32(error is not None))).reshape(-1)
  if not failed.any():
    return None
  source = int(np.argmax(failed))
  payload = _describe(error) if error is not None else b""  # (outside: a bug here is not a lost process)
  with _collective(error):
    received = _broadcast_bytes(payload, source)
  if jax.process_index() == source:
    return error
  return _rebuild(json.loads(received.decode("utf-8")), source)


_SAME_COMMAND = (
  "Every process runs the same command with the same params file and overrides; only --process_id differs."
)


def same_on_every_process(
  values: dict[str, Any], what: str = "were started with different settings", fix: str = _SAME_COMMAND
) -> None:
  """Stop every process when one was started with other settings than process 0 (a collective).

  ``values``: ``{"key.path": JSON value}``, the settings every process of the run must share (all
  run the same command; only ``--process_id`` differs). With one process: nothing to compare.
  ``what`` and ``fix`` word the error for other shared values (the checkpoints every process sees).

  Raises:
    ClusterConfigError: on every process, naming the first process that differs and its keys.
  """
  if jax.process_count() == 1:
    return
  mine = json.dumps(values, sort_keys=True, default=repr)
  with _collective(None):
    sent = _broadcast_bytes(mine.encode("utf-8"), 0)
  first = json.loads(sent.decode("utf-8"))
  ours = json.loads(mine)
  keys = sorted(k for k in set(first) | set(ours) if first.get(k, "(unset)") != ours.get(k, "(unset)"))
  problem = None
  if keys:
    shown = "; ".join(
      f"{k}: process 0 {first.get(k, '(unset)')!r}, process {jax.process_index()} {ours.get(k, '(unset)')!r}"
      for k in keys[:5]
    ) + (f" (and {len(keys) - 5} more)" if len(keys) > 5 else "")
    problem = ClusterConfigError(f"the processes of this run {what} ({shown}). {fix}")
  agree(problem)


@contextlib.contextmanager
def _collective(own: BaseException | None) -> Iterator[None]:
  """Turn the failure of one of this module's collectives into one line (`OtherProcessFailed`).

  A process that died (killed, out of memory) or cannot be reached makes the collective raise from
  inside JAX (``Gloo AllGather failed ... Connection closed by peer``, a deadline); this process then
  stops with that said plainly. Its own error, if it had one, is kept as the cause.
  """
  try:
    yield
  except Exception as failure:  # noqa: BLE001 (whatever the transport raised: said in the message)
    first = (str(failure).strip().splitlines() or [type(failure).__name__])[0][:300]
    lost = OtherProcessFailed(
      f"process {jax.process_index()} of {jax.process_count()}: another process of this run stopped or "
      f"cannot be reached (a collective failed: {first}); its output says why. Every process of the run "
      "must be running: rerun them all (a run resumes from its last checkpoint)."
    )
    lost.peer_lost = True  # `wafer run` then exits at once, without JAX's shutdown barrier (it aborts)
    raise lost from (own if own is not None else failure)


def _broadcast_bytes(payload: bytes, source: int) -> bytes:
  """Process ``source``'s ``payload`` on every process (the others' payload is ignored; a collective)."""
  from jax.experimental import multihost_utils

  me = jax.process_index()
  size = int(multihost_utils.broadcast_one_to_all(np.int32(len(payload)), is_source=me == source))
  sent = np.frombuffer(payload, np.uint8) if me == source else np.zeros(size, np.uint8)
  return np.asarray(multihost_utils.broadcast_one_to_all(sent, is_source=me == source)).tobytes()


def agree(error: BaseException | None) -> None:
  """Raise `first_error` ``(error)`` when there is one (on every process), else return (a collective)."""
  shared = first_error(error)
  if shared is None:
    return
  if shared is error:
    raise error
  raise shared from None


@contextlib.contextmanager
def same_outcome() -> Iterator[None]:
  """Run a block on every process and `agree` on how it ended: an ``Exception`` on any process stops all.

  The block must hold no collective (a process that failed before it would leave the others there).

  >>> with same_outcome():
  ...   raise ValueError("no")
  Traceback (most recent call last):
  ValueError: no
  """
  try:
    yield
  except Exception as error:
    agree(error)
    raise
  agree(None)


@functools.cache
def _own_packages() -> frozenset[str]:
  """Packages whose exceptions `first_error` rebuilds on the other processes (the rest are bugs to them):
  ``wafer``, ``precision`` and the top-level package of every installed model plugin (``wafer.models``
  entry points), so that a third-party plugin's `WaferError` reaches every process as itself."""
  from importlib import metadata

  from wafer.registry import GROUP

  plugins = {entry.value.split(":")[0].split(".")[0] for entry in metadata.entry_points(group=GROUP)}
  return frozenset({"wafer", "precision", *plugins})


def _describe(error: BaseException) -> bytes:
  """What `first_error` tells the other processes about ``error``: type, message, attributes, a pickle.

  The pickle (when ``error`` pickles) carries attributes JSON cannot, e.g. a `ConfigError`'s problems.
  """
  cls = type(error)
  attrs = {k: v for k, v in vars(error).items() if v is None or isinstance(v, (bool, int, float, str))}
  try:
    pickled = base64.b64encode(pickle.dumps(error)).decode("ascii") if _own(cls.__module__) else None
  except Exception:  # noqa: BLE001 (an attribute that does not pickle: the type, message and attributes do)
    pickled = None
  described = {"type": f"{cls.__module__}:{cls.__qualname__}", "message": str(error), "attrs": attrs}
  if pickled is not None and len(pickled) <= _MAX_MESSAGE:
    described["pickle"] = pickled
  described["message"] = described["message"][:_MAX_MESSAGE]
  return json.dumps(described).encode("utf-8")


def _own(module: str) -> bool:
  return module.split(".")[0] in _own_packages()


# What an error of ours holds besides builtins: a `ConfigError`'s problems and their "no value" marker.
_ERROR_PARTS = frozenset({("wafer.errors", "Problem"), ("wafer.errors", "_MISSING")})


class _OwnUnpickler(pickle.Unpickler):
  """Unpickles only exception classes of `_own_packages`, the parts of `_ERROR_PARTS` and plain
  builtins: an error, never a call of one of our functions or other classes."""

  def find_class(self, module: str, name: str) -> Any:
    if module == "builtins" and name in ("object", "set", "frozenset", "complex", "slice"):
      return super().find_class(module, name)
    if _own(module) and "." not in name:  # a dotted name reaches through a module to anything
      found = super().find_class(module, name)
      if (isinstance(found, type) and issubclass(found, BaseException)) or (module, name) in _ERROR_PARTS:
        return found
    raise pickle.UnpicklingError(f"{module}.{name} is not an error class of this run")


def _rebuild(described: dict[str, Any], source: int) -> BaseException:
  """An exception of the described type and message, else `OtherProcessFailed` naming process ``source``."""
  module, _, qualname = described["type"].partition(":")
  message = described["message"]
  if described.get("pickle") is not None:
    try:
      copy = _OwnUnpickler(io.BytesIO(base64.b64decode(described["pickle"]))).load()
      if isinstance(copy, Exception) and type(copy).__qualname__ == qualname and str(copy) == message:
        return copy
    except Exception:  # noqa: BLE001 (a type whose constructor takes more than its message: rebuilt below)
      pass
  cls: Any = None
  if _own(module):
    try:
      cls = importlib.import_module(module)
      for part in qualname.split("."):
        cls = getattr(cls, part)
    except (ImportError, AttributeError):
      cls = None
  if isinstance(cls, type) and issubclass(cls, Exception):
    copy = cls.__new__(cls)
    BaseException.__init__(copy, message)
    try:
      for key, value in described["attrs"].items():
        setattr(copy, key, value)
      if str(copy) == message:
        return copy
    except Exception:  # noqa: BLE001 (a type that cannot be copied this way: say what it was instead)
      pass
  return OtherProcessFailed(
    f"process {source} of {jax.process_count()} stopped with {described['type'].replace(':', '.')}: {message} "
    "(its output has the details); every process of the run stops with it."
  )


def initialize(
  coordinator_address: str | None = None, num_processes: int | None = None, process_id: int | None = None
) -> None:
  """``jax.distributed.initialize`` for a run of many processes (call once, before any JAX work).

  Arguments left None come from the environment (``JAX_COORDINATOR_ADDRESS``, SLURM, MPI).
  On CPU the cross-process collectives are gloo (JAX's default).

  Raises:
    ClusterConfigError: the settings are incomplete or inconsistent (the message says which).
  """
  check_flags(coordinator_address, num_processes, process_id)
  try:
    jax.distributed.initialize(
      coordinator_address=coordinator_address, num_processes=num_processes, process_id=process_id
    )
  except (ValueError, TypeError) as error:
    raise ClusterConfigError(
      f"cannot start the processes of this run: {str(error).rstrip('.')}. Give --num_processes N --process_id I "
      "--coordinator_address HOST:PORT (the same N and address on every host, I = 0..N-1), or run under "
      "SLURM / MPI, or set JAX_COORDINATOR_ADDRESS."
    ) from None


def check_flags(
  coordinator_address: str | None = None, num_processes: int | None = None, process_id: int | None = None
) -> None:
  """The process flags' own checks (`initialize` makes them; a one-process run makes them too).

  Raises:
    ClusterConfigError: a process id out of range, or an address that is not HOST:PORT.
  """
  if num_processes is not None and (
    num_processes < 1 or (process_id is not None and not 0 <= process_id < num_processes)
  ):
    raise ClusterConfigError(
      f"--process_id {process_id} with --num_processes {num_processes}; allowed: 0 <= process_id < num_processes"
    )
  if coordinator_address is not None:  # (JAX reads it with split(":")[1]: an IndexError from inside it)
    host, _, port = str(coordinator_address).rpartition(":")
    if not host or not port.isdigit():
      raise ClusterConfigError(
        f"--coordinator_address {coordinator_address!r}; allowed: HOST:PORT, e.g. 10.0.0.1:1234 (the same on "
        "every host)"
      )


def mesh(num_csx: int) -> jax.sharding.Mesh:
  """A 1-D mesh (axis ``"csx"``) of ``num_csx`` devices: ``num_csx / process_count`` from each process.

  In one process these are the first ``num_csx`` devices.
  """
  devices = jax.devices()
  procs = jax.process_count()
  if procs > 1 and num_csx % procs:  # first: the device hint below assumes an even spread
    raise ClusterConfigError(
      f"num_csx={num_csx} cannot be spread evenly over {procs} processes; allowed: a multiple of the "
      "number of processes (every process drives the same number of systems)."
    )
  if num_csx > len(devices):
    raise ClusterConfigError(
      f"num_csx={num_csx} needs {num_csx} JAX devices; "
      + (f"the {procs} processes have {len(devices)}" if procs > 1 else f"this process has {len(devices)}")
      + f". On CPU, set XLA_FLAGS=--xla_force_host_platform_device_count={-(-num_csx // procs)} before JAX "
      "starts."
    )
  if procs == 1:
    return jax.sharding.Mesh(np.asarray(devices[:num_csx]), (AXIS,))
  per = num_csx // procs
  chosen = []
  for p in range(procs):
    local = [d for d in devices if d.process_index == p]
    if len(local) < per:
      raise ClusterConfigError(
        f"num_csx={num_csx} needs {per} devices in each process; process {p} has {len(local)}"
      )
    chosen += local[:per]
  return jax.sharding.Mesh(np.asarray(chosen), (AXIS,))


def data_parallel_shardings(example_args: Sequence[Any], batch_argnums: Sequence[int], num_csx: int) -> tuple:
  """``in_shardings`` for `jax.jit`: batch arguments split on axis 0, the rest replicated.

  Raises:
    ClusterConfigError: a batch dimension not divisible by ``num_csx`` (the global batch is
      split evenly across systems), or no batch argument named.
  """
  if not batch_argnums:
    raise ClusterConfigError("num_csx > 1 needs batch_argnums: which arguments hold the global batch")
  m = mesh(num_csx)
  replicated_ = NamedSharding(m, PartitionSpec())
  split = NamedSharding(m, PartitionSpec(AXIS))
  shardings = []
  for i, arg in enumerate(example_args):
    if i not in batch_argnums:
      shardings.append(jax.tree.map(lambda _: replicated_, arg))
      continue
    for leaf in jax.tree.leaves(arg):
      if not np.ndim(leaf):
        raise ClusterConfigError(
          f"argument {i} is a batch argument but holds a scalar: a batch argument has the global batch "
          f"on axis 0, split evenly over num_csx={num_csx} systems"
        )
      problem = batch_split_problem(np.shape(leaf)[0], num_csx)
      if problem is not None:
        raise ClusterConfigError(f"batch_size {np.shape(leaf)[0]} (argument {i}): {problem}")
    shardings.append(jax.tree.map(lambda _: split, arg))
  return tuple(shardings)


def replicated(tree: Any, num_csx: int) -> Any:
  """``tree`` placed whole on every device of `mesh` ``(num_csx)`` (every process holds the same values)."""
  sharding = NamedSharding(mesh(num_csx), PartitionSpec())
  if jax.process_count() == 1:
    return jax.device_put(tree, sharding)

  def one(x: Any) -> Any:
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      data = one(jax.random.key_data(x))
      return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
    local = np.asarray(jax.device_get(x))
    return jax.make_array_from_process_local_data(sharding, local, local.shape)

  return jax.tree.map(one, tree)


def local_systems(num_csx: int) -> tuple[int, ...]:
  """The systems (positions on `mesh` ``(num_csx)``) whose devices belong to this process.

  All of them in one process.
  """
  if jax.process_count() == 1:
    return tuple(range(num_csx))
  me = jax.process_index()
  return tuple(i for i, d in enumerate(mesh(num_csx).devices.flat) if d.process_index == me)


def global_batch(batch: Any, num_csx: int, *, local: bool = False) -> Any:
  """The global batch as arrays split over `mesh` ``(num_csx)``.

  In one process the batch is returned as is (the compiled step splits it). With many, each
  process gives JAX only the rows of its own systems (`local_systems`): ``batch`` holds the whole
  global batch (the same on every process) and this process's rows are cut from it, or, with
  ``local=True``, it already holds just those rows, in system order (a data source that builds
  only this process's rows, as `wafer.data.GrainBatchSource.for_systems` does).
  """
  if jax.process_count() == 1:
    return batch
  sharding = NamedSharding(mesh(num_csx), PartitionSpec(AXIS))
  mine = local_systems(num_csx)

  def one(x: Any) -> Any:
    x = np.asarray(x)
    if local:
      rows = x.shape[0] // len(mine)
      return jax.make_array_from_process_local_data(sharding, x, (rows * num_csx, *x.shape[1:]))
    rows = x.shape[0] // num_csx
    part = np.concatenate([x[i * rows : (i + 1) * rows] for i in mine])
    return jax.make_array_from_process_local_data(sharding, part, x.shape)

  return jax.tree.map(one, batch)
