"""metrics.jsonl, TensorBoard scalars, Cerebras-style log lines and a progress bar; process 0 only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class Metrics:
  """Appends one JSON object per record to ``model_dir/metrics.jsonl``, mirrors numbers to TensorBoard
  and prints the log line. With ``enabled=False`` (processes other than 0) it writes nothing."""

  def __init__(self, model_dir: Path, device: str, enabled: bool = True):
    self.path = Path(model_dir) / "metrics.jsonl"
    self.device = device
    self.enabled = enabled
    self.writer = None
    if enabled:
      from tensorboardX import SummaryWriter

      self.writer = SummaryWriter(str(Path(model_dir) / "tensorboard"))

  def say(self, line: str) -> None:
    """Print a log line (process 0 only)."""
    if self.enabled:
      print(line, flush=True)

  def write(self, record: dict[str, Any], line: str) -> None:
    if not self.enabled:
      return
    with self.path.open("a") as f:
      f.write(json.dumps(record) + "\n")
    if self.writer is not None:
      for key, value in record.items():
        if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
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
