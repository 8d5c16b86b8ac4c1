"""`RunSummary`: what `wafer.train.run` returns, typed; the CLI and `wafer sweep` read it the same way."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

__all__ = ("RunSummary",)


@dataclasses.dataclass
class RunSummary:
  """The outcome of one `wafer.train.run`.

  Attributes:
    model_dir: the run's folder.
    task: the task's name.
    eval_metric: the name of the eval metric (``"loss"``, ``"accuracy"``).
    final_step: the global step reached (None for a run that only validated or compiled).
    params: the final parameters (None when nothing was trained or restored).
    losses: ``[(step, loss), ...]`` at the logged steps of this run (None when it did not train).
    evals: ``[(step, metric), ...]`` of ``train_and_eval``'s evaluations.
    eval: the metric of an ``eval`` run, at ``eval_step``.
    eval_step: the step ``eval`` evaluated.
    eval_all: ``{step: metric}`` of an ``eval_all`` run, one per checkpoint.
    trained_samples, trained_seconds: samples trained and the time it took (this run).
    compile_report: the path of ``compile_report.txt``, when written.
    samples_per_sec_estimate: the cost model's wafer rate for the train step, when estimated.

  For code written against the summary dict of earlier versions, a summary also reads as a mapping of
  the attributes that are set (not None): ``summary["final_step"]``, ``summary.get("losses")``,
  ``"eval" in summary``.
  """

  model_dir: str
  task: str
  eval_metric: str = "loss"
  final_step: int | None = None
  params: Any = None
  losses: list[tuple[int, float]] | None = None
  evals: list[tuple[int, float]] | None = None
  eval: float | None = None
  eval_step: int | None = None
  eval_all: dict[int, float] | None = None
  trained_samples: int | None = None
  trained_seconds: float | None = None
  compile_report: str | None = None
  samples_per_sec_estimate: float | None = None

  @classmethod
  def from_dict(cls, values: dict[str, Any]) -> RunSummary:
    """A summary of the run loop's record (its keys are the attributes)."""
    return cls(**values)

  def eval_results(self) -> list[tuple[Any, float]]:
    """Every evaluation of the run as ``(step, metric)``, in the order made: ``train_and_eval``'s, then
    ``eval_all``'s, then ``eval``'s (its step, or ``"latest"`` when not known)."""
    out = list(self.evals or []) + list((self.eval_all or {}).items())
    if self.eval is not None:
      out.append((self.eval_step if self.eval_step is not None else "latest", self.eval))
    return out

  def to_dict(self) -> dict[str, Any]:
    """The attributes that are set, as a dict (``params`` included)."""
    return {
      f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None
    }

  # the mapping view, for code written against the summary dict
  def __getitem__(self, key: str) -> Any:
    if key not in self:
      raise KeyError(key)
    return getattr(self, key)

  def __contains__(self, key: object) -> bool:
    return isinstance(key, str) and key in self._names() and getattr(self, key) is not None

  def get(self, key: str, default: Any = None) -> Any:
    """``summary[key]`` when set, else ``default``."""
    return self[key] if key in self else default

  def keys(self) -> list[str]:
    """The names of the attributes that are set."""
    return list(self.to_dict())

  def __iter__(self) -> Iterator[str]:
    return iter(self.keys())

  @classmethod
  def _names(cls) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))
