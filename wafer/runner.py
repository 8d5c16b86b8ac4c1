"""From a params file to a finished run: config -> registry -> task, policy, optimizer -> executor."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from wafer import registry
from wafer.config import Params, load_params
from wafer.executor import RunSettings, Task, run


@dataclasses.dataclass
class Plan:
  """Everything `wafer.executor.run` needs, built from one params file."""

  params: Params
  task: Task
  settings: RunSettings
  optimizer: Any
  loss_scale: Any
  policy: Any


def settings_of(params: Params) -> RunSettings:
  """`RunSettings` from ``runconfig`` (with Cerebras' defaults for missing keys)."""
  rc = params.runconfig
  activation = rc.activation_steps or (rc.log_steps if rc.enable_act_frequency else None)
  return RunSettings(
    mode=rc.mode,
    model_dir=rc.model_dir,
    num_steps=rc.num_steps,
    max_steps=rc.max_steps,
    log_steps=rc.log_steps,
    checkpoint_steps=rc.checkpoint_steps or 0,
    activation_steps=activation,
    eval_steps=rc.eval_steps,
    eval_frequency=rc.eval_frequency,
    seed=1 if rc.seed is None else rc.seed,
    num_csx=rc.num_csx,
    num_workers_per_csx=rc.num_workers_per_csx,
    compile_only=rc.compile_only,
    validate_only=rc.validate_only,
    max_checkpoints=rc.max_checkpoints,
  )


def plan(params: Params) -> Plan:
  """Resolve the model, the precision policy, the optimizer and the loss scaling of ``params``."""
  task = registry.get_model(params.model.name)(params)
  policy = params.policy()
  optimizer, loss_scale = params.build_optimizer()  # eval-only files: identity, static scale 1
  return Plan(params, task, settings_of(params), optimizer, loss_scale, policy)


def load_plan(path: str | Path | dict, overrides: list[str] | tuple[str, ...] = ()) -> Plan:
  """Load a params file (after the model packages registered their strict schemas) and plan it."""
  registry.load_plugins()
  return plan(load_params(path, list(overrides)))


def run_params(path: str | Path | dict, overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
  """Load, plan and run a params file; returns the executor's summary."""
  p = load_plan(path, overrides)
  return run(p.task, p.settings, p.optimizer, p.loss_scale, p.policy)
