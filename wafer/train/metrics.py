"""metrics.jsonl, TensorBoard scalars, Cerebras-style log lines and a progress bar; process 0 only.

``model_dir/metrics.jsonl`` holds one JSON object per line, each with an integer ``"step"``: the
training records (``loss``, ``loss_scale``, ``samples_per_sec``, ...) and the eval records
(``eval/<metric>``, with the ``eval_mode`` and ``eval_batches`` that made them: `eval_marks`);
a NaN or infinite number is written as ``null`` (strict JSON). Its training records are the history of the
run that led to the newest checkpoint; its eval records are every evaluation made, the runs of ``--mode
eval`` / ``eval_all`` appending theirs (a step evaluated twice has two records):

* a line is written whole (one ``write``) and a failed write (a full disk) is cut back off, so a
  run that keeps going never leaves a partial line; a run killed mid-write (SIGKILL) can, and
  `read_metrics` skips it, reporting ``file:line``;
* resuming from the checkpoint of step k (`Metrics.resume`) moves the records of steps after k
  (the killed run logged them; the rerun logs them again) and any partial line out of
  ``metrics.jsonl`` into ``metrics.superseded.jsonl`` (appended; nothing is deleted), in two
  atomic rewrites (the superseded file first: a crash in between leaves a record in both files,
  never in neither), and says so in the log. ``metrics.jsonl`` then never holds a step twice from
  training, and its records after k are the rerun's. TensorBoard hides the same steps
  (``purge_step``).
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from wafer._io import strict_json, what_to_do, write_bytes_atomically
from wafer.errors import ExecutorError

__all__ = ("SUPERSEDED", "Metrics", "Progress", "read_metrics")

SUPERSEDED = "metrics.superseded.jsonl"
"""Where `Metrics.resume` moves the records a resumed run logs again (and partial lines), beside metrics.jsonl."""


def _record(line: bytes) -> dict[str, Any] | None:
  """The record of one line of metrics.jsonl (without its newline), or None when it is not one."""
  try:
    record = json.loads(line)
  except ValueError:  # partial JSON, or bytes that are not UTF-8
    return None
  if not isinstance(record, dict) or type(record.get("step")) is not int:
    return None
  return record


def _json_line(record: dict[str, Any]) -> bytes:
  """``record`` as one line of strict JSON: a NaN or infinite number is written as ``null`` (JSON has no
  NaN; Python's bare ``NaN`` breaks jq and other readers), which `read_metrics` reads back as nan.

  >>> _json_line({"step": 5, "loss": float("nan"), "loss_scale": 1.0})
  b'{"step": 5, "loss": null, "loss_scale": 1.0}\\n'
  """
  return (json.dumps(strict_json(record), allow_nan=False) + "\n").encode("utf-8")


def _lines(data: bytes) -> list[tuple[int, bytes, bool]]:
  """``(line number, line, complete)`` for each non-blank line; the last is incomplete without its newline."""
  parts = data.split(b"\n")
  out = []
  for i, part in enumerate(parts, start=1):
    if part.strip():
      out.append((i, part, i < len(parts)))
  return out


def read_metrics(path: str | os.PathLike[str], say: Callable[[str], object] | None = print) -> list[dict]:
  """The records of a metrics.jsonl file, in file order; lines that are not records are skipped.

  A line that is not a JSON object with an integer ``"step"`` (the partial last line of a run
  killed while writing it, or damage) is reported with ``say`` as ``PATH:LINE: ...`` (``say=None``:
  silently) and skipped, never merged with the next record. A ``null`` value (a NaN or infinite number:
  a diverged loss) is read as ``nan``, so the records' numbers stay numbers.

  >>> import os, pathlib, tempfile
  >>> path = os.path.join(tempfile.mkdtemp(), "metrics.jsonl")
  >>> _ = pathlib.Path(path).write_text('{"step": 1, "loss": 2.5}\\n{"step": 2, "lo')
  >>> read_metrics(path, say=lambda line: print(line.replace(path, "metrics.jsonl")))
  metrics.jsonl:2: not a complete record (a run killed while writing it?); skipped: '{"step": 2, "lo'
  [{'step': 1, 'loss': 2.5}]
  """
  data = Path(path).read_bytes()
  records = []
  for number, line, complete in _lines(data):
    record = _record(line)
    if record is None:
      if say is not None:
        what = "not a complete record (a run killed while writing it?)" if not complete else "not a record"
        say(f"{os.fspath(path)}:{number}: {what}; skipped: {line[:60].decode('utf-8', 'replace')!r}")
      continue
    records.append({k: math.nan if v is None else v for k, v in record.items()})
  return records


def _append(path: Path, data: bytes) -> None:
  """Append ``data`` to ``path`` (created if missing); on an error the file is cut back to its old size."""
  fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
  try:
    size = os.lseek(fd, 0, os.SEEK_END)
    try:
      done = 0
      while done < len(data):  # one write unless the disk fills or a signal cuts it short
        done += os.write(fd, data[done:])
    except OSError:
      os.ftruncate(fd, size)  # no partial line: the file as it was before this record
      raise
  finally:
    os.close(fd)


def eval_marks(mode: str, batches: int) -> dict[str, Any]:
  """What an eval record of metrics.jsonl says beside its step and value: the mode that evaluated
  (``eval_mode``) and the batches averaged (``eval_batches``). Evaluations of one checkpoint by several runs
  (``--mode eval`` again with another ``eval_steps`` or ``eval_input``) are all kept, with one step: these
  tell them apart.

  >>> eval_marks("eval", 4)
  {'eval_mode': 'eval', 'eval_batches': 4}
  """
  return {"eval_mode": mode, "eval_batches": batches}


_NOT_CHARTED = frozenset({"step", *eval_marks("eval", 0)})
"""Keys of a record that TensorBoard does not chart: the step, and `eval_marks`' keys."""


class Metrics:
  """Appends one JSON object per record to ``model_dir/metrics.jsonl``, mirrors numbers to TensorBoard
  and prints the log line. With ``enabled=False`` (processes other than 0) it writes nothing.

  Call `resume` with the step the run starts from before the first `write` of a training run (the
  eval modes do not: they add eval records to the history as it is).
  """

  def __init__(self, model_dir: Path, device: str, enabled: bool = True):
    self.path = Path(model_dir) / "metrics.jsonl"
    self.device = device
    self.enabled = enabled
    self.writer = None
    self._purge_step: int | None = None
    self._checked_tail = False

  def say(self, line: str) -> None:
    """Print a log line (process 0 only)."""
    if self.enabled:
      print(line, flush=True)

  def resume(self, step: int, from_checkpoint: bool = True) -> None:
    """Start the history at ``step``: records of later steps and partial lines move to `SUPERSEDED`.

    ``from_checkpoint``: False when the run starts from its initial state, there being no checkpoint.

    Both files are rewritten atomically (`wafer._io`), metrics.superseded.jsonl first, so a crash
    in between leaves a record in both files, never in neither. TensorBoard events of steps after
    ``step`` are hidden from then on (tensorboardX ``purge_step``).

    Raises:
      ExecutorError: the files cannot be rewritten (full disk, read-only model_dir).
    """
    if not self.enabled:
      return
    self._purge_step = step + 1
    self._checked_tail = True
    if not self.path.exists():
      return
    try:
      data = self.path.read_bytes()
      keep, moved, notes = [], [], []
      for number, line, complete in _lines(data):
        record = _record(line)
        if record is not None and record["step"] <= step:
          keep.append(line)
        elif record is None:
          moved.append(line)
          what = "not a complete record (a run killed while writing it?)" if not complete else "not a record"
          notes.append(f"{self.path}:{number}: {what}")
        else:
          moved.append(line)
      if not moved:
        if data and not data.endswith(b"\n"):
          write_bytes_atomically(self.path, data + b"\n")
        return
      later = sorted(r["step"] for r in map(_record, moved) if r is not None)
      aside = self.path.with_name(SUPERSEDED)
      old = aside.read_bytes() if aside.exists() else b""
      if old and not old.endswith(b"\n"):
        old += b"\n"
      write_bytes_atomically(aside, old + b"".join(line + b"\n" for line in moved))
      write_bytes_atomically(self.path, b"".join(line + b"\n" for line in keep))
    except OSError as error:
      raise ExecutorError(
        f"Cannot rewrite {self.path} for the resume at step {step} ({error.strerror or error}); nothing was "
        f"trained: {what_to_do(error)}, and rerun the same command."
      ) from None
    for note in notes[:3]:
      self.say(f"Warning: {note}; moved to {aside}.")
    if len(notes) > 3:
      self.say(
        f"Warning: and {len(notes) - 3} more line(s) of {self.path} that are not records; moved to {aside}."
      )
    if later and not from_checkpoint:
      self.say(
        f"Note: {self.path.name} held {len(later)} record(s) of an earlier run (steps {later[0]}..{later[-1]}) "
        f"that left no checkpoint to resume from (it stopped before its first, or runconfig.checkpoint_steps "
        f"was unset or 0); moved to {aside}: this run starts again from step {step}."
      )
    elif later:
      self.say(
        f"Note: {self.path.name} held {len(later)} record(s) of steps after the checkpoint of step {step} "
        f"(steps {later[0]}..{later[-1]}, logged by a run that stopped before its next checkpoint); moved to "
        f"{aside}: this run logs those steps again."
      )

  def _fix_tail(self) -> None:
    """A partial last line (a run killed mid-write) is ended, so the next record starts a line of its own."""
    self._checked_tail = True
    try:
      with self.path.open("rb") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() == 0:
          return
        f.seek(-1, os.SEEK_END)
        if f.read(1) == b"\n":
          return
    except FileNotFoundError:
      return
    _append(self.path, b"\n")  # read_metrics reports and skips the partial line
    self.say(f"Warning: {self.path} ended in a partial line (a run killed while writing it); it is skipped.")

  def write(self, record: dict[str, Any], line: str) -> None:
    """Append ``record`` as one line, add its numbers to TensorBoard, print ``line``.

    Raises:
      ExecutorError: the line cannot be written (full disk, read-only model_dir); the file is left
        as it was before this record.
    """
    if not self.enabled:
      return
    data = _json_line(record)
    try:
      if not self._checked_tail:
        self._fix_tail()
      _append(self.path, data)
    except OSError as error:
      raise ExecutorError(
        f"Cannot write the metrics of step {record.get('step')} to {self.path} ({error.strerror or error}): "
        f"{what_to_do(error)}, and rerun the same command: it resumes from the newest checkpoint and logs the "
        "steps after it again."
      ) from None
    if self.writer is None:
      from tensorboardX import SummaryWriter

      # tensorboardX logs "NaN or Inf found in input tensor" for every such scalar: a NaN loss is
      # already in the log line and metrics.jsonl (and stops the run unless check_loss_values is
      # off, as in a sweep, where a diverging format is a result), so once per step is noise
      logging.getLogger("tensorboardX.x2num").setLevel(logging.ERROR)
      self.writer = SummaryWriter(str(self.path.parent / "tensorboard"), purge_step=self._purge_step)
    for key, value in record.items():  # (the eval marks say how a record was made: no chart of their own)
      if key not in _NOT_CHARTED and isinstance(value, (int, float)) and not isinstance(value, bool):
        self.writer.add_scalar(key, value, record["step"])
    self.writer.flush()
    print(line, flush=True)

  def close(self) -> None:
    if self.writer is not None:
      self.writer.close()


class Progress:
  """A rich progress bar updated only at log steps (no device sync in between)."""

  def __init__(self, enabled: bool, start: int, total: int):
    self.bar = None
    if enabled:
      from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

      self.bar = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                          TimeRemainingColumn(), transient=True)  # fmt: skip
      self.task = self.bar.add_task("train", total=total, completed=start, info="")
      self.bar.start()

  def update(self, step: int, loss: float, rate: float) -> None:
    if self.bar is not None:
      self.bar.update(self.task, completed=step, info=f"loss {loss:.4f}  {rate:,.0f} samples/s")

  def close(self) -> None:
    if self.bar is not None:
      self.bar.stop()
