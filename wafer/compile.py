"""Ahead-of-time compilation of a step, and the errors that keep its graph static.

``wafer.compile(step_fn, *example_args)`` traces ``step_fn`` once, lowers it and compiles it
with XLA (``jax.jit(...).trace(...).lower().compile()``), and returns a `CompiledStep` that runs
only that graph. As on a Cerebras system:

* a call whose arguments differ in shape, dtype or pytree structure raises `StaticGraphError`
  (it would need a second compile);
* Python control flow on traced values, value fetches in the step (``float(x)``, ``x.item()``,
  ``np.asarray(x)``, ``int(x)``), printing traced values and asserting on them raise
  `StaticGraphError` at trace time, naming your file and line and the fix.

``validate_only=True`` traces and lowers without the XLA compile. `enable_compilation_cache`
points JAX's persistent compilation cache at a directory (the executor uses the model_dir), so
a rerun of the same step loads the compiled artifact instead of compiling again.
"""

from __future__ import annotations

import contextlib
import os
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from wafer import closures as _closures
from wafer.cluster import data_parallel_shardings
from wafer.errors import WaferError

_INTERNAL_DIRS = tuple(
  str(Path(m.__file__).resolve().parent) + os.sep
  for m in (jax, np, contextlib)
  if getattr(m, "__file__", None)
) + (str(Path(__file__).resolve().parent) + os.sep,)


class StaticGraphError(WaferError):
  """The step's graph would change, or the step reads values while it is traced.

  Attributes:
    where: ``"file:line"`` of the offending user code (None when not known).
  """

  def __init__(self, message: str, where: str | None = None):
    super().__init__(message)
    self.where = where


_FIXES = {
  "control_flow": (
    "Python control flow on a traced value",
    "The step is traced once and compiled; a Python `if`, `while` or `assert` on a traced value "
    "cannot be decided then.",
    "use jnp.where(cond, a, b) or jax.lax.cond / jax.lax.while_loop for data-dependent choices; "
    "check values on the host in a step closure (@wafer.step_closure).",
  ),
  "value_fetch": (
    "a value fetch inside the step",
    "float(x), int(x), x.item() and np.asarray(x) need the value, which does not exist while "
    "the step is traced (tensor-to-scalar decay).",
    "keep the value as an array (jnp ops), or read it after the step in a step closure: "
    "@wafer.step_closure def log(loss): print(float(loss)).",
  ),
  "print": (
    "printing a traced value inside the step",
    "The step's Python body runs once, at trace time, when values do not exist.",
    "print from a step closure (@wafer.step_closure), or use jax.debug.print for a debug run.",
  ),
}


def _user_frame(tb: Any) -> tuple[str, int, str] | None:
  """(file, line, source text) of the deepest frame outside JAX, NumPy and wafer.compile."""
  found = None
  for frame in traceback.extract_tb(tb):
    path = str(Path(frame.filename).resolve())
    if path.startswith(_INTERNAL_DIRS) or "site-packages" in path or frame.filename.startswith("<frozen"):
      continue
    found = (frame.filename, frame.lineno or 0, (frame.line or "").strip())
  return found


def _static_graph_error(kind: str, error: BaseException) -> StaticGraphError:
  what, why, fix = _FIXES[kind]
  frame = _user_frame(error.__traceback__)
  if frame is None:
    where, location = None, ""
  else:
    where = f"{frame[0]}:{frame[1]}"
    location = f" at {where}\n    {frame[2]}"
  return StaticGraphError(f"{what}{location}\n{why}\nFix: {fix}", where)


class _PrintedTracer(Exception):
  pass


@contextlib.contextmanager
def _no_printing_tracers() -> Iterator[None]:
  """Make str()/repr()/format() of a tracer raise while the step is traced."""
  tracer = jax.core.Tracer
  saved = {name: tracer.__dict__.get(name) for name in ("__str__", "__repr__", "__format__")}

  def refuse(self: Any, *args: Any) -> str:
    raise _PrintedTracer()

  for name in saved:
    setattr(tracer, name, refuse)
  try:
    yield
  finally:
    for name, method in saved.items():
      if method is None:
        delattr(tracer, name)
      else:
        setattr(tracer, name, method)


class CompiledStep:
  """A step compiled once; calls run that graph and nothing else.

  Attributes:
    in_avals: ``jax.ShapeDtypeStruct`` leaves of the example arguments.
    traced: the ``jax.stages.Traced`` step (its ``.jaxpr`` feeds the cost model).
    lowered, compiled: the AOT stages (``compiled`` is None with ``validate_only``).
    compilations: how many XLA compilations this object did (1, or 0 with validate_only).
  """

  def __init__(
    self, fn: Callable, example_args: tuple, traced: Any, lowered: Any, compiled: Any, collector: Any
  ):
    leaves_with_paths, self._in_tree = jax.tree_util.tree_flatten_with_path(example_args)
    self._paths = [jax.tree_util.keystr(p) for p, _ in leaves_with_paths]
    self.in_avals = [_aval(x) for _, x in leaves_with_paths]
    self.fn = fn
    self.traced, self.lowered, self.compiled = traced, lowered, compiled
    self.compilations = 0 if compiled is None else 1
    self._closures = list(collector.closures)
    self._pending: list[Any] | None = None

  @property
  def jaxpr(self) -> Any:
    return self.traced.jaxpr

  @property
  def has_closures(self) -> bool:
    return bool(self._closures)

  def check_args(self, args: tuple) -> None:
    """Raise `StaticGraphError` unless ``args`` match the compiled signature exactly."""
    leaves_with_paths, tree = jax.tree_util.tree_flatten_with_path(args)
    if tree != self._in_tree:
      raise StaticGraphError(
        "the step's arguments changed structure since it was compiled.\n"
        f"  compiled: {self._in_tree}\n  got:      {tree}\n"
        "The graph is compiled once and must not change: pass the same pytrees (same keys, same "
        "number of leaves) every step."
      )
    for (_path, leaf), want, name in zip(leaves_with_paths, self.in_avals, self._paths):
      got = _aval(leaf)
      if got.shape != want.shape or got.dtype != want.dtype:
        hint = (
          "use fixed batches: drop the last partial batch (drop_remainder=True / drop_last: True)"
          if got.dtype == want.dtype and got.ndim == want.ndim
          else "convert the argument to the compiled dtype and shape before the call"
        )
        raise StaticGraphError(
          f"argument args{name} is {got.dtype}{list(got.shape)}; the compiled step takes "
          f"{want.dtype}{list(want.shape)}. A different shape or dtype would need a second "
          f"compile, which a wafer run does not allow. Fix: {hint}."
        )

  def __call__(self, *args: Any) -> Any:
    """Run the compiled graph; returns ``step_fn``'s outputs (closure values are kept aside)."""
    if self.compiled is None:
      raise RuntimeError("this step was only validated (validate_only=True); compile it to run it")
    self.check_args(args)
    out, closure_arrays = self.compiled(*args)
    self._pending = closure_arrays
    return out

  def run_closures(self, checkpoint: bool = False) -> None:
    """Fetch the last step's closure values and run its closures, in queue order.

    Step closures always run; checkpoint closures only with ``checkpoint=True``.
    """
    if self._pending is None or not self._closures:
      return
    host = jax.device_get(self._pending)
    if any(isinstance(c, _closures.InnerClosure) for c in self._closures):
      jax.effects_barrier()  # the debug callbacks of closures inside grad / scan / cond have run
    offset = 0
    for closure in self._closures:
      if isinstance(closure, _closures.InnerClosure):
        if closure.kind == _closures.STEP or checkpoint:
          closure.call_latest()
        continue
      n = len(closure.array_slots)
      values = host[offset : offset + n]
      offset += n
      if closure.kind == _closures.STEP or checkpoint:
        closure.call(values)
    self._pending = None


def _aval(x: Any) -> jax.ShapeDtypeStruct:
  if isinstance(x, jax.ShapeDtypeStruct):
    return x
  shape = np.shape(x)
  dtype = x.dtype if hasattr(x, "dtype") else jax.numpy.asarray(x).dtype
  return jax.ShapeDtypeStruct(shape, dtype)


def compile(
  step_fn: Callable[..., Any],
  *example_args: Any,
  donate_argnums: int | Sequence[int] = (),
  num_csx: int = 1,
  batch_argnums: Sequence[int] = (),
  validate_only: bool = False,
) -> CompiledStep:
  """Trace, lower and compile ``step_fn`` for arguments shaped like ``example_args``.

  Args:
    step_fn: a function of pytrees of arrays (params, optimizer state, batch, ...).
    example_args: arrays or ``jax.ShapeDtypeStruct``s fixing every shape and dtype.
    donate_argnums: arguments whose buffers the step may reuse (the train state).
    num_csx: data-parallel systems; > 1 shards ``batch_argnums`` along axis 0 over that many
      JAX devices (`wafer.cluster`) and replicates the rest.
    batch_argnums: which arguments hold the global batch (axis 0), for ``num_csx > 1``.
    validate_only: trace and lower only; no XLA compile.

  Raises:
    StaticGraphError: the step reads values or branches on them while traced (the message
      names your file and line and the fix).
  """
  in_shardings = None
  if num_csx > 1:
    in_shardings = data_parallel_shardings(example_args, batch_argnums, num_csx)
  collector_box: list[Any] = []

  def with_closures(*args: Any) -> tuple[Any, list[Any]]:
    with _closures.collecting() as collector:
      out = step_fn(*args)
    collector_box.append(collector)
    return out, list(collector.arrays)

  jitted = jax.jit(with_closures, donate_argnums=donate_argnums, in_shardings=in_shardings)
  try:
    with _no_printing_tracers():
      traced = jitted.trace(*example_args)
  except jax.errors.TracerBoolConversionError as e:
    raise _static_graph_error("control_flow", e) from None
  except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError,
          jax.errors.TracerIntegerConversionError) as e:  # fmt: skip
    kind = "control_flow" if _is_branch(e) else "value_fetch"
    raise _static_graph_error(kind, e) from None
  except _PrintedTracer as e:
    raise _static_graph_error("print", e) from None
  lowered = traced.lower()
  compiled = None if validate_only else lowered.compile()
  return CompiledStep(step_fn, example_args, traced, lowered, compiled, collector_box[-1])


def _is_branch(error: BaseException) -> bool:
  frame = _user_frame(error.__traceback__)
  if frame is None:
    return False
  text = frame[2]
  return text.startswith(("if ", "elif ", "while ", "assert "))


def enable_compilation_cache(directory: str | os.PathLike) -> Path:
  """Use ``directory`` for JAX's persistent compilation cache (every compile is cached)."""
  path = Path(directory)
  path.mkdir(parents=True, exist_ok=True)
  if jax.config.jax_compilation_cache_dir != str(path):
    try:  # JAX opens its cache once per process; reopen it at the new directory
      from jax._src import compilation_cache

      compilation_cache.reset_cache()
    except (ImportError, AttributeError):  # pragma: no cover - older/newer JAX without it
      pass
  jax.config.update("jax_compilation_cache_dir", str(path))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return path
