"""Checkpoints in ``model_dir/checkpoints`` (orbax; atomic; multi-process into one shared directory).

A checkpoint holds the `TrainState` (its ``step`` is the checkpoint's number) and, as JSON, the
identity of the input pipeline it was written with (not its position: that is in the state).
`Checkpoints.restore_latest` skips a checkpoint that cannot be read (truncated or missing
files): it reports the step and the path in one line and restores the newest readable one.
An entry named like a checkpoint that is not a folder (a file ``checkpoints/20``, which orbax
does not list) counts as an unreadable checkpoint: reported and skipped alike. Nothing is deleted
or overwritten; a later save at the step of an unreadable checkpoint first moves it aside to
``checkpoints/<step>.unreadable`` (``<step>.unreadable.1``, ... when that name is taken) and says so.

With many processes every process reads the checkpoint's files itself, and the processes agree
(`wafer.cluster.agree`) on each outcome: a checkpoint one process cannot read is skipped by all
(each says the same reason), one that does not fit the model stops all with the same error, and a
save that fails on one process (or process 0's move aside) stops all.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Collection
from pathlib import Path
from typing import Any

import jax

from wafer import cluster
from wafer._io import what_to_do
from wafer.errors import CheckpointMismatch, ExecutorError


class UnreadableCheckpoint(Exception):
  """A checkpoint whose files cannot be read (truncated, missing, corrupt); ``str()`` says why."""


class Checkpoints:
  """An orbax `CheckpointManager` of train states, every process taking part (``jax.distributed``)."""

  def __init__(self, model_dir: Path, max_to_keep: int | None, say: Any = print):
    import orbax.checkpoint as ocp

    self._ocp, self.say = ocp, say
    self.directory = Path(model_dir).resolve() / "checkpoints"
    if self.directory.exists() and not self.directory.is_dir():  # refused before training, not at the save
      raise ExecutorError(
        f"{self.directory} is a file, not the folder of checkpoints: move it away (or give another --model_dir)"
      )
    self.manager = ocp.CheckpointManager(
      self.directory,
      options=ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep, enable_async_checkpointing=False, create=True
      ),
      item_handlers={"state": ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()},
    )

  def steps(self) -> list[int]:
    """The checkpoints' steps: orbax's and those of entries named like a checkpoint that are not folders."""
    return sorted(set(self.manager.all_steps()) | set(self._not_folders()))

  def _not_folders(self) -> list[int]:
    """The steps of entries ``checkpoints/<step>`` that are not folders (orbax skips them, and its save at
    that step would delete them)."""
    try:
      entries = list(self.directory.iterdir())
    except OSError:
      return []
    return [
      int(p.name) for p in entries if p.name.isdigit() and str(int(p.name)) == p.name and not p.is_dir()
    ]

  def close(self) -> None:
    """Finish pending work and stop orbax's threads (a run that fails mid-restore leaves none behind)."""
    self.manager.close()

  def save(self, state: Any, meta: dict[str, Any]) -> int:
    """Save ``state`` as checkpoint number ``state.step``; returns that number."""
    ocp = self._ocp
    step = int(jax.device_get(state.step))
    if step in self.steps():  # an unreadable checkpoint we resumed before (or a file): keep it, aside
      with cluster.same_outcome():  # also the barrier: the others reload once process 0 has moved it
        if jax.process_index() == 0:
          self._set_aside(step)
      self.manager.reload()
    failure = None
    with _OrbaxOutputHeld() as held:  # orbax's tracebacks of a failure this error reports are not printed
      try:
        self.manager.save(
          step,
          args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
          force=True,
        )
        self.manager.wait_until_finished()
      except (
        OSError,
        ValueError,
      ) as error:  # a full disk, a read-only or vanished model_dir (TensorStore: ValueError)
        held.reported = error
        saved = [s for s in self.steps() if s != step]
        newest = f"the newest saved checkpoint is step {max(saved)}" if saved else "no checkpoint was saved"
        reason, os_error = _write_failure(error)
        todo = (
          what_to_do(os_error) if os_error is not None else "free space in model_dir (or make it writable)"
        )
        failure = ExecutorError(
          f"Cannot save the checkpoint of step {step} in {self.directory}: {reason}; {newest}, and nothing saved "
          f"before was changed. {todo[0].upper()}{todo[1:]} and rerun the same command: it resumes from there."
        )
        failure.__cause__ = error
    cluster.agree(failure)
    return step

  def aside(self, step: int) -> Path:
    """Where checkpoint ``step`` goes when it is set aside: a free ``checkpoints/<step>.unreadable`` name."""
    return _aside(self.directory, step)

  def _set_aside(self, step: int) -> None:
    """Move the unreadable checkpoint ``step`` to a free ``<step>.unreadable`` name (process 0 does it)."""
    path, aside = self.directory / str(step), _aside(self.directory, step)
    try:
      path.rename(aside)
    except OSError as error:
      raise ExecutorError(
        f"Cannot move the unreadable checkpoint of step {step} aside ({path} -> {aside}: "
        f"{error.strerror or error}) before saving step {step} again: {what_to_do(error)}, or move it away "
        "yourself (it is kept for inspection), and rerun the same command."
      ) from None
    self.say(
      f"Note: moved the unreadable checkpoint of step {step} aside ({path} -> {aside}) to save step {step}."
    )

  def restore(self, step: int, like: Any) -> tuple[Any, dict[str, Any]]:
    """The state and metadata of checkpoint ``step``; ``like``: the state or its `abstract` form.

    Raises:
      UnreadableCheckpoint: its files cannot be read (checked before orbax starts reading, so a
        damaged checkpoint leaves no orbax/TensorStore work behind).
      CheckpointMismatch: the checkpoint's arrays do not fit ``like`` (another model or optimizer).
    """
    ocp = self._ocp
    with cluster.same_outcome():  # every process reads the files; one that cannot stops the others alike
      renamed = self._check(step, like)
    restored, failure = None, None
    try:
      restored = self.manager.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(like), meta=ocp.args.JsonRestore())
      )
    except Exception as error:
      # the files were read whole by `_check`: with other array paths, the state's structure changed
      # (an optimizer wrapped in gradient clipping), not the checkpoint
      failure = (
        CheckpointMismatch(self._does_not_fit(step, renamed), step)
        if renamed is not None
        else UnreadableCheckpoint(_reason(error))
      )
      failure.__cause__ = error
    cluster.agree(failure)
    return restored.state, restored.meta

  def _check(self, step: int, like: Any) -> str | None:
    """`restore`'s checks of checkpoint ``step`` before orbax reads it (its errors), on this process's reading.

    Returns how the arrays' paths differ when only they do (the same shapes, another structure: orbax
    decides whether they fit), else None.
    """
    path = self.directory / str(step)
    if path.exists() and not path.is_dir():
      size = path.stat().st_size
      raise UnreadableCheckpoint(f"it is a file of {size:,} byte{'s' * (size != 1)}, not a checkpoint folder")
    damage = _damage(self.directory / str(step)) or _json_damage(self.directory / str(step))
    if damage is not None:
      raise UnreadableCheckpoint(damage)
    try:
      saved = self.manager.item_metadata(step)["state"]
    except Exception as error:  # unreadable metadata
      raise UnreadableCheckpoint(_reason(error)) from error
    if not _path_shapes(saved) and _path_shapes(like):  # state/_METADATA lost: orbax would report 0 arrays
      raise UnreadableCheckpoint("its array metadata (state/_METADATA) is missing or lists no arrays")
    mismatch = _shape_mismatch(saved, like)
    if mismatch is not None and _loss_scale_only(saved, like):
      how = f"only its loss-scale state differs ({mismatch}; bfloat16 and float32 keep no loss-scale state)"
      raise CheckpointMismatch(self._does_not_fit(step, how), step, loss_scale_only=True)
    if mismatch is not None:  # checked before orbax starts reading: a failed read leaves its threads behind
      raise CheckpointMismatch(self._does_not_fit(step, mismatch), step)
    return _path_difference(saved, like)

  def _does_not_fit(self, step: int, how: str) -> str:
    """The message of a readable checkpoint whose state does not fit this run's (``how``: the difference)."""
    return (
      f"The checkpoint of step {step} in {self.directory} does not fit this model: {how}. The "
      "model keys (sizes, vocab_size, layers), the optimizer (its type, gradient clipping, loss scaling) and "
      "the sparsity section must be the ones the checkpoint was written with; restore them, or use a new "
      "model_dir."
    )

  def meta(self, step: int) -> dict[str, Any]:
    """The JSON metadata saved with checkpoint ``step`` as far as it can be read ({} when it cannot)."""
    return read_meta(self.directory, step)

  def unreadable(self, step: int, why: UnreadableCheckpoint) -> str:
    """The one-line report of an unreadable checkpoint."""
    return f"Warning: the checkpoint of step {step} at {self.directory / str(step)} cannot be read ({why})"

  def agreed_steps(self) -> list[int]:
    """`steps`, checked to be the same on every process (each then tries the same checkpoints, in
    the same order, through the same agreements); a collective with many processes.

    Raises:
      ClusterConfigError: the processes see different checkpoints (model_dir is not one shared folder).
    """
    steps = self.steps()
    cluster.same_on_every_process(
      {"checkpoint steps": steps},
      what="see different checkpoints",
      fix=f"model_dir ({self.directory.parent}) must be one folder every host sees (a shared file system).",
    )
    return steps

  def restore_latest(self, like: Any, say: Any = print) -> tuple[Any, dict[str, Any]] | None:
    """The newest checkpoint that can be read, or None when there is none.

    An unreadable one is reported with ``say`` ("... step N at PATH cannot be read ...") and
    skipped; a readable one that does not fit the model raises `ExecutorError`.

    Raises:
      ExecutorError: checkpoints exist but none can be read.
    """
    steps = self.agreed_steps()
    for step in reversed(steps):
      try:
        return self.restore(step, like)
      except UnreadableCheckpoint as why:
        say(f"{self.unreadable(step, why)}; trying the one before it.")
    if steps:
      raise ExecutorError(self.none_readable(steps))
    return None

  def none_readable(self, steps: list[int]) -> str:
    """The error of a run that found checkpoints ``steps`` and could read none of them."""
    return (
      f"None of the checkpoints in {self.directory} (steps {', '.join(map(str, steps))}) can be read. "
      "Move them away (nothing was deleted) or use a new model_dir."
    )


def read_meta(directory: Path, step: int) -> dict[str, Any]:
  """The JSON metadata saved with checkpoint ``step`` of ``directory`` (``model_dir/checkpoints``) as far as
  it can be read ({} when it cannot); reads only, creates nothing."""
  import json

  try:
    meta = json.loads((Path(directory) / str(step) / "meta" / "metadata").read_text(encoding="utf-8"))
  except (OSError, ValueError):
    return {}
  return meta if isinstance(meta, dict) else {}


def misnamed(model_dir: Path) -> list[Path]:
  """The folders in ``model_dir/checkpoints`` that hold a checkpoint's files (``state`` and ``meta``) but are
  not named by a step (``ckpt_4``, ``4.bak``): never read, since only ``checkpoints/<step>`` is. Reads only.

  Orbax's own unfinished ``<step>.orbax-checkpoint-tmp*`` folders and wafer's ``<step>.unreadable*`` (set
  aside, `Checkpoints.aside`) are not listed.
  """
  try:
    entries = sorted(Path(model_dir, "checkpoints").iterdir())
  except OSError:
    return []
  return [
    p
    for p in entries
    if not (p.name.isdigit() and str(int(p.name)) == p.name)
    and ".orbax-checkpoint-tmp" not in p.name
    and ".unreadable" not in p.name
    and (p / "state").is_dir()
    and (p / "meta").is_dir()
  ]


def newest_step(model_dir: Path) -> int | None:
  """The step of the newest checkpoint folder in ``model_dir/checkpoints`` (None when there is none), read
  from the folder names alone (orbax names a finished checkpoint by its step); creates nothing."""
  try:
    entries = list((Path(model_dir) / "checkpoints").iterdir())
  except OSError:
    return None
  steps = [int(p.name) for p in entries if p.name.isdigit() and str(int(p.name)) == p.name and p.is_dir()]
  return max(steps, default=None)


def _aside(directory: Path, step: int) -> Path:
  """A free name for setting checkpoint ``step`` aside: ``<step>.unreadable``, else ``<step>.unreadable.<n>``.

  A step can be set aside more than once (damaged again after a resume); an earlier one is kept.
  """
  path, n = directory / f"{step}.unreadable", 1
  while path.exists():
    path, n = directory / f"{step}.unreadable.{n}", n + 1
  return path


_OS_ERROR_CODE = re.compile(r"\[os_error_code='?(\d+)'?\]")
"""How TensorStore's errors (ValueErrors) carry the OS error: ``... No space left on device [os_error_code='28']``."""
_QUOTED_PATH = re.compile(r'"(/[^"]*)"')


def _write_failure(error: OSError | ValueError) -> tuple[str, OSError | None]:
  """What a failed checkpoint write says, whole (the OS error's text and the file), and that OS error.

  An ``OSError`` gives its own; a TensorStore ``ValueError`` names it by ``os_error_code`` after the
  files it was writing (the last one is the file that failed). Another error is its first line, whole.

  >>> _write_failure(OSError(28, "No space left on device", "/md/checkpoints/10/d/a1"))[0]
  'No space left on device (errno 28), writing /md/checkpoints/10/d/a1'
  >>> _write_failure(ValueError('RESOURCE_EXHAUSTED: Failed writing: "/md/c/10/d/a1": Failed to write 9 bytes '
  ...                           "to file 22: No space left on device [os_error_code='28']"))[0]
  'No space left on device (errno 28), writing /md/c/10/d/a1'
  """
  if isinstance(error, OSError):
    code, path = error.errno, error.filename
  else:
    found = _OS_ERROR_CODE.search(str(error))
    code = int(found.group(1)) if found else None
    paths = _QUOTED_PATH.findall(str(error))
    path = paths[-1] if paths else None
  if code is None:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}", None
  os_error = OSError(code, os.strerror(code), path)
  return f"{os.strerror(code)} (errno {code})" + (f", writing {path}" if path else ""), os_error


class _OrbaxOutputHeld:
  """While a save runs, hold orbax's absl log records and the unraisable exceptions of its writes;
  at the end let them through, except those about ``reported`` (the failure wafer's own error reports:
  orbax logs it with a traceback from each of its threads, and TensorStore's writes still pending when
  orbax's event loop closed raise "Event loop is closed" once each). Nothing else is hidden."""

  def __init__(self) -> None:
    self.reported: BaseException | None = None
    self._records: list[logging.LogRecord] = []
    self._unraisable: list[Any] = []
    self._logger = logging.getLogger("absl")

  def filter(self, record: logging.LogRecord) -> bool:
    self._records.append(record)
    return False

  def _hold_unraisable(self, unraisable: Any) -> None:
    self._unraisable.append(unraisable)

  def __enter__(self) -> _OrbaxOutputHeld:
    self._logger.addFilter(self)
    self._previous_hook, sys.unraisablehook = sys.unraisablehook, self._hold_unraisable
    return self

  def __exit__(self, *exc: object) -> None:
    self._logger.removeFilter(self)
    if sys.unraisablehook == self._hold_unraisable:
      sys.unraisablehook = self._previous_hook
    records, unraisable, self._records, self._unraisable = self._records, self._unraisable, [], []
    for record in records:
      if not self._about_reported(record):
        self._logger.handle(record)
    for args in unraisable:
      orphaned = isinstance(args.exc_value, RuntimeError) and str(args.exc_value) == "Event loop is closed"
      if not (self.reported is not None and orphaned):
        self._previous_hook(args)

  def _about_reported(self, record: logging.LogRecord) -> bool:
    """Whether ``record`` is orbax's report of the failure wafer reports (an error with its text)."""
    if self.reported is None or record.levelno < logging.ERROR:
      return False
    text = str(self.reported).strip()
    head = text.splitlines()[0] if text else ""
    logged = record.exc_info[1] if record.exc_info else None
    return (
      logged is self.reported
      or (logged is not None and str(logged) == str(self.reported))
      or (bool(head) and head in record.getMessage())
    )


def _reason(error: BaseException) -> str:
  text = str(error).strip()
  return f"{type(error).__name__}: {text.splitlines()[0][:300] if text else ''}"


def _damage(step_dir: Path) -> str | None:
  """Why the array store of a checkpoint cannot be read (every stored value is read), or None."""
  import tensorstore as ts

  try:
    for item in sorted(p for p in step_dir.iterdir() if (p / "manifest.ocdbt").is_file()):
      kv = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{item}/"}).result()
      for key in kv.list().result():
        kv.read(key).result()
  except Exception as error:  # TensorStore: truncated, missing or corrupt files
    return _reason(error)
  return None


_JSON_FILES = ("_METADATA", "_sharding")
"""orbax's JSON files of an item (beside ``array_metadatas/process_<i>``), read only once restoring has started."""


def _json_damage(step_dir: Path) -> str | None:
  """Why orbax's JSON files or wafer's ``meta/metadata`` of a checkpoint cannot be used, or None.

  orbax reads ``array_metadatas/*`` in the middle of a restore, when a failure leaves its reads behind
  (tracebacks of orphaned coroutines); a ``meta/metadata`` that is JSON but not wafer's object (a list)
  would fail later, in the resume checks.
  """
  import json

  files = [
    p
    for p in step_dir.rglob("*")
    if p.is_file() and (p.name in _JSON_FILES or p.parent.name == "array_metadatas")
  ]
  meta = step_dir / "meta" / "metadata"
  for path in [*sorted(files), *([meta] if meta.is_file() else [])]:
    where = path.relative_to(step_dir)
    try:
      value = json.loads(path.read_bytes())
    except (OSError, ValueError) as error:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
      return f"{where}: {_reason(error)}"
    if path == meta:
      kinds = (
        {k: type(value.get(k)).__name__ for k in ("config", "data_pipeline")}
        if isinstance(value, dict)
        else {}
      )
      if not isinstance(value, dict) or any(v not in ("dict", "NoneType") for v in kinds.values()):
        return (
          f"{where} is not the JSON object wafer writes (a {{'config': {{...}}, 'data_pipeline': {{...}}}}; "
          f"found {_short(value)})"
        )
  return None


def _short(value: object) -> str:
  text = repr(value)
  return text if len(text) <= 60 else text[:57] + "..."


def _path_shapes(tree: Any) -> dict[str, tuple[int, ...]]:
  """``{"a/b/0/value": shape}`` for the array leaves of a pytree (checkpoint metadata or live state)."""

  def name(entry: Any) -> str:
    for attr in ("key", "name", "idx"):
      if hasattr(entry, attr):
        return str(getattr(entry, attr))
    return str(entry)

  leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: hasattr(x, "shape"))[0]
  out = {}
  for path, leaf in leaves:
    if hasattr(leaf, "shape"):
      key = "/".join(name(e) for e in path)
      out[key.removesuffix("/value")] = tuple(leaf.shape)  # an nnx Variable's array is saved as .../value
  return out


def _shape_mismatch(saved: Any, like: Any) -> str | None:
  """How the checkpoint's arrays differ from the model's, or None when they fit."""
  have, want = _path_shapes(saved), _path_shapes(like)
  if set(have) == set(want):
    params_first = sorted(want, key=lambda p: (not p.startswith("params"), p))
    diffs = [f"{p}: checkpoint {have[p]}, model {want[p]}" for p in params_first if have[p] != want[p]]
    return (
      "; ".join(diffs[:3]) + (f" (and {len(diffs) - 3} more)" if len(diffs) > 3 else "") if diffs else None
    )
  if sorted(have.values()) == sorted(want.values()):
    return None  # the same shapes under other paths: `_path_difference` says how, if orbax refuses them
  if len(have) == len(want):  # paths spelled differently: compare the shapes
    how = f"the checkpoint and the model's state hold {_arrays(len(have))} each, of different shapes"
  else:
    how = f"the checkpoint holds {_arrays(len(have))}, the model's state {len(want)}"
  parts = [how, _loss_scale_change(have, want), _layout_difference(have, want)]
  return "; ".join(part for part in parts if part)


def _arrays(count: int) -> str:
  """``"1 array"``, ``"2 arrays"``."""
  return f"{count} array" + ("" if count == 1 else "s")


def _loss_scale_kind(paths: Collection[str]) -> str | None:
  """``"dynamic"``, ``"static"`` or None (no loss scale among ``paths``): by the arrays under ``loss_scale/``
  (a `precision.DynamicLossScale` has its counters beside the scale)."""
  names = {p.split("/", 1)[1] for p in paths if p.startswith("loss_scale/")}
  if not names:
    return None
  return "dynamic" if "steps_since_rescale" in names else "static"


def _loss_scale_change(have: Collection[str], want: Collection[str]) -> str | None:
  """What changed in the loss scale's type between a checkpoint's paths and this run's, or None.

  >>> print(_loss_scale_change(["loss_scale/loss_scale", "loss_scale/steps_since_rescale"], ["loss_scale/loss_scale"]))
  the loss scale was dynamic when the checkpoint was written and is static now (optimizer.loss_scaling_factor, and model.fp16_type: with bfloat16, 'dynamic' is a static scale of 1)
  """
  then, now = _loss_scale_kind(have), _loss_scale_kind(want)
  if then is None or now is None or then == now:
    return None
  return (
    f"the loss scale was {then} when the checkpoint was written and is {now} now (optimizer.loss_scaling_factor, "
    "and model.fp16_type: with bfloat16, 'dynamic' is a static scale of 1)"
  )


def _loss_scale_only(saved: Any, like: Any) -> bool:
  """Whether the arrays of the checkpoint and the model's state differ (in paths or shapes) only in the loss
  scale's state (``loss_scale/...``: a dynamic scale's counters that a static scale has not).

  >>> import numpy as np
  >>> _loss_scale_only({"params": np.zeros(2), "loss_scale": {"scale": np.zeros(()), "skipped": np.zeros(())}},
  ...   {"params": np.zeros(2), "loss_scale": {"scale": np.zeros(())}})
  True
  """
  have, want = _path_shapes(saved), _path_shapes(like)
  differ = (set(have) ^ set(want)) | {p for p in set(have) & set(want) if have[p] != want[p]}
  return bool(differ) and all(p.split("/")[0] == "loss_scale" for p in differ)


def _path_difference(saved: Any, like: Any, shown: int = 2) -> str | None:
  """How the arrays' paths of the checkpoint and the model's state differ, or None when they are the same.

  >>> import numpy as np
  >>> print(_path_difference({"opt": {"0": {"m": np.zeros(2)}}}, {"opt": {"1": {"0": {"m": np.zeros(2)}}}}))
  its state is laid out otherwise (arrays only in the checkpoint: opt/0/m; arrays only in this run's state: opt/1/0/m)
  """
  difference = _layout_difference(_path_shapes(saved), _path_shapes(like), shown)
  return None if difference is None else f"its state is laid out otherwise ({difference})"


def _layout_difference(have: Collection[str], want: Collection[str], shown: int = 2) -> str | None:
  """The array paths only in the checkpoint (``have``) and only in this run's state (``want``), ``shown``
  of each, or None when the paths are the same."""
  if set(have) == set(want):
    return None
  only_saved, only_now = sorted(set(have) - set(want)), sorted(set(want) - set(have))

  def some(paths: list[str]) -> str:
    return ", ".join(paths[:shown]) + (f" and {len(paths) - shown} more" if len(paths) > shown else "")

  parts = [f"arrays only in the checkpoint: {some(only_saved)}"] if only_saved else []
  parts += [f"arrays only in this run's state: {some(only_now)}"] if only_now else []
  return "; ".join(parts)
