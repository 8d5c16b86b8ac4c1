"""From a params file to a finished run: config -> registry -> task, policy, optimizer -> `wafer.train.run`."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from wafer import registry
from wafer.config import ConfigError, Params, RunConfig, load_params
from wafer.config.errors import Problem
from wafer.config.loader import parse_yaml
from wafer.train import Task, run, seed_of


@dataclasses.dataclass
class Plan:
  """Everything `wafer.train.run` needs, built from one params file."""

  params: Params
  task: Task
  optimizer: Any
  loss_scale: Any
  policy: Any

  @property
  def runconfig(self) -> RunConfig:
    """The typed ``runconfig`` section the run loop reads."""
    return self.params.runconfig

  @property
  def seed(self) -> int:
    return seed_of(self.params.runconfig)


def plan(params: Params) -> Plan:
  """Resolve the model, the precision policy, the optimizer and the loss scaling of ``params``."""
  task = registry.get_model(params.model.name)(params)
  policy = params.policy()
  optimizer, loss_scale = params.build_optimizer()  # eval-only files: identity, static scale 1
  return Plan(params, task, optimizer, loss_scale, policy)


def load_plan(path: str | Path | dict, overrides: list[str] | tuple[str, ...] = ()) -> Plan:
  """Load a params file (after the model packages registered their strict schemas) and plan it.

  Raises:
    wafer.config.ConfigError: the file is wrong, or ``model.name`` names no registered model (with the
      file, the line and the nearest registered name).
  """
  registry.load_plugins()
  params = load_params(path, list(overrides))
  try:
    return plan(params)
  except registry.UnknownModelError as error:
    raise ConfigError(
      Problem(
        ("model", "name"), str(error).removeprefix("model.name: "), params.model.name, line=_line(path)
      ),
      params.source,
    ) from None


def _line(path: str | Path | dict) -> int | None:
  """The line of ``model.name`` in a legacy-layout params file, when it is there."""
  if isinstance(path, dict):
    return None
  try:
    return parse_yaml(Path(path).read_text(encoding="utf-8"))[1].get(("model", "name"))
  except (OSError, ValueError):
    return None


def schedule_note(params: Params) -> str | None:
  """A note when the learning-rate schedule ends before ``max_steps`` at a rate of 0, else None.

  The rate then stays 0 (Cerebras holds a schedule's last value), so the steps after the schedule's end
  change nothing: usually ``total_iters`` and ``max_steps`` were meant to agree.
  """
  rc, opt = params.runconfig, params.optimizer
  if opt is None or rc.max_steps is None or rc.mode not in ("train", "train_and_eval"):
    return None
  try:
    schedule = opt.schedule()
  except Exception:  # optimizers without a schedule (Rprop's number, Adafactor's relative steps)
    return None
  end = schedule.total_iters
  if end is None or end >= rc.max_steps or float(schedule(end)) != 0.0:
    return None
  return (
    f"note: optimizer.learning_rate ends at step {end} with rate 0, before runconfig.max_steps={rc.max_steps}: "
    f"steps {end + 1}..{rc.max_steps} will not change the weights (make the schedule's total_iters add up "
    "to max_steps to use them)"
  )


def run_plan(p: Plan, *, progress: bool = True) -> dict[str, Any]:
  """Run a plan; returns the run loop's summary."""
  note = schedule_note(p.params)
  if note is not None:
    print(note, flush=True)
  return run(p.task, p.runconfig, p.optimizer, p.loss_scale, p.policy, progress=progress, config=p.params)


def run_params(path: str | Path | dict, overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
  """Load, plan and run a params file; returns the run loop's summary."""
  return run_plan(load_plan(path, overrides))
