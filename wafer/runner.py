"""From a params file to a finished run: plugins -> config -> registry (task) and `Params.build` (runtime)
-> `wafer.train.run`."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax

from wafer import registry
from wafer.compile import cheap_sharding_probes
from wafer.config import ConfigError, Params, RunConfig, Runtime, load_params
from wafer.config.schema import TRAIN_MODES
from wafer.errors import Problem
from wafer.train import RunSummary, Task, run, seed_of


@dataclasses.dataclass
class Plan:
  """Everything `wafer.train.run` needs, built from one params file: the task and the runtime, and
  ``notes`` on what the runtime does with the model (weight sparsity's tensors), printed first."""

  params: Params
  task: Task
  runtime: Runtime
  notes: tuple[str, ...] = ()

  @property
  def optimizer(self) -> Any:
    return self.runtime.optimizer

  @property
  def loss_scale(self) -> Any:
    return self.runtime.loss_scale

  @property
  def policy(self) -> Any:
    return self.runtime.policy

  @property
  def runconfig(self) -> RunConfig:
    """The typed ``runconfig`` section the run loop reads."""
    return self.runtime.runconfig

  @property
  def seed(self) -> int:
    return seed_of(self.runtime.runconfig)


def plan(params: Params) -> Plan:
  """Resolve the model (`wafer.registry`) and build the runtime objects of ``params`` (`Params.build`)."""
  with cheap_sharding_probes():  # model builders trace their initialisers (nnx.eval_shape)
    task = registry.get_model(params.model.name)(params)
  runtime = params.build()  # eval-only files: identity optimizer, static scale 1
  notes = []
  describe = getattr(runtime.optimizer, "describe", None)  # weight sparsity (wafer.sparsity)
  if describe is not None:  # its filters checked against the model's parameters before any trace
    notes.append(describe(jax.eval_shape(task.init_params, jax.random.key(0))))
  return Plan(params, task, runtime, tuple(notes))


def load_plan(
  path: str | Path | dict,
  overrides: list[str] | tuple[str, ...] = (),
  *,
  mode: str | None = None,
  flags: dict[str, str] | None = None,
) -> Plan:
  """Load the model plugins (once), then a params file, and plan it. ``mode`` sets ``runconfig.mode``;
  ``flags`` names the command-line flag each override came from (`wafer.config.load_params`).

  Raises:
    wafer.config.ConfigError: the file is wrong, or ``model.name`` names no registered model (with the
      file, the line and the nearest registered name).
  """
  registry.load_plugins()
  params = load_params(path, list(overrides), mode=mode, flags=flags)
  try:
    return plan(params)
  except (registry.UnknownModelError, registry.PluginError) as error:  # (a plugin's: the model may be its)
    raise ConfigError(
      params.locate(Problem(("model", "name"), str(error).removeprefix("model.name: "), params.model.name)),
      params.source,
    ) from None


def schedule_note(params: Params) -> str | None:
  """A note when the learning-rate schedule ends before ``max_steps`` at a rate of 0, else None.

  The rate then stays 0 (Cerebras holds a schedule's last value), so the steps after the schedule's end
  change nothing: usually ``total_iters`` and ``max_steps`` were meant to agree.
  """
  rc, opt = params.runconfig, params.optimizer
  if opt is None or rc.max_steps is None or rc.mode not in TRAIN_MODES:
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


def missing_data_warnings(params: Params) -> list[str]:
  """For a check (``validate_only`` / ``compile_only``), which reads no data: a warning for each input section
  the mode reads whose ``data_dir`` does not exist, with the error the run will stop with there
  (`wafer.data.processors.missing_data`); none for a run, which stops with that error itself.

  A warning, not an error: a modelzoo file names the data its release's scripts write, and checking the
  file before that data is there is what a validation is for.
  """
  from wafer.config.schema import EVAL_MODES
  from wafer.data.processors import missing_data

  rc = params.runconfig
  if not (rc.validate_only or rc.compile_only):
    return []
  out = []
  for name, modes in (("train_input", TRAIN_MODES), ("eval_input", EVAL_MODES)):
    section = getattr(params, name)
    missing = missing_data(name, section) if section is not None and rc.mode in modes else None
    if missing is not None:
      out.append(f"Warning: the run will stop reading its data: {missing}")
  return out


def run_plan(p: Plan, *, progress: bool = True) -> RunSummary:
  """Run a plan; returns the run loop's summary. Its first lines are the loader's notes (what was inferred,
  ignored and translated; the release and its half type and loss scaling: ``Params.notes``)."""
  for line in p.params.notes:
    print(line, flush=True)
  note = schedule_note(p.params)
  if note is not None:
    print(note, flush=True)
  for line in [*p.notes, *missing_data_warnings(p.params)]:
    print(line, flush=True)
  return run(p.task, p.runtime, progress=progress)


def run_params(path: str | Path | dict, overrides: list[str] | tuple[str, ...] = ()) -> RunSummary:
  """Load, plan and run a params file; returns the run loop's summary."""
  return run_plan(load_plan(path, overrides))
