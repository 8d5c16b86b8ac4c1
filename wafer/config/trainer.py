"""The modelzoo trainer (v2) layout, converted to the legacy layout that :class:`Params` validates.

What is converted (modelzoo's ``TRAINER_PARAMS_TO_LEGACY``, docs/references.md):

=======================================================  ==========================================
trainer (v2)                                             legacy
=======================================================  ==========================================
``init.backend.backend_type`` (or ``init.device``)       ``runconfig.target_device``
``init.backend.cluster_config.num_csx`` /                ``runconfig.num_csx`` / ``num_workers_per_csx``
``num_workers_per_csx`` / ``max_wgt_servers`` /          / ``num_wgt_servers`` / ``num_act_servers``
``max_act_per_csx``                                      (and mount_dirs, python_paths, job_*)
``init.backend.compile_only`` / ``validate_only`` /      ``runconfig.*``
``compile_dir``
``init.model_dir``, ``init.seed``                        ``runconfig.model_dir``, ``runconfig.seed``
``init.model``                                           ``model``
``init.optimizer: {Type: {...}}``                        ``optimizer.optimizer_type: Type`` + keys
                                                         (``lr`` -> ``learning_rate``)
``init.schedulers``: one LR scheduler; ``SequentialLR``  ``optimizer.learning_rate``: a scheduler, or
/ ``ChainedScheduler`` of plain schedulers               a list (``main_scheduler: chained`` for chained)
``init.precision.enabled`` / ``fp16_type``               ``model.mixed_precision`` / ``model.fp16_type``
``init.precision.precision_opt_level``                   ``runconfig.precision_opt_level``
``init.precision.{loss_scaling_factor, ...}``            ``optimizer.{...}`` (loss scaling, clipping)
``init.loop.{max_steps, num_steps, num_epochs,           ``runconfig.*``
steps_per_epoch, eval_frequency, eval_steps}``
``init.loop.grad_accum_steps``                           ``optimizer.grad_accum_steps``
``init.checkpoint.steps`` (+ save_initial_checkpoint,    ``runconfig.checkpoint_steps`` (+ same names)
autoload_last_checkpoint, disable_strict_..., max_...)
``init.logging.log_steps``                               ``runconfig.log_steps``
``init.callbacks: [{ScopedTrainFlags|                    ``train_input|eval_input.micro_batch_size``
ScopedValidateFlags: {csx.performance.micro_batch_size}}]``
``fit.train_dataloader`` / ``fit.val_dataloader``        ``train_input`` / ``eval_input``
``validate.val_dataloader``, ``validate_all.val_         ``eval_input`` (when they agree with fit's)
dataloaders`` (a single one)
``fit.ckpt_path`` / ``validate.ckpt_path``               ``runconfig.checkpoint_path``
=======================================================  ==========================================

``init.sparsity`` becomes the top-level ``sparsity`` (`wafer.config.sparsity`); a logging-only callback (``ComputeNorm``) is ignored with a note.

The mode defaults to ``train`` when there is a ``fit`` section, else ``eval`` (``validate``) or
``eval_all`` (``validate_all`` only). Anything else (other callbacks, several LR schedulers,
weight-decay schedulers, nested Sequential schedulers, several validation dataloaders, a list of
trainers) is an error naming the key, never silently dropped.
"""

from __future__ import annotations

import copy
from typing import Any

from wafer.config.errors import ConfigError, Loc, Problem, unknown_key_message
from wafer.config.modelzoo import IGNORED

_TRAINER_KEYS = ("init", "fit", "validate", "validate_all")
_INIT_KEYS = (
  "backend",
  "device",
  "model_dir",
  "seed",
  "model",
  "optimizer",
  "schedulers",
  "precision",
  "loop",
  "checkpoint",
  "logging",
  "callbacks",
  "sparsity",
)
_BACKEND_KEYS = ("backend_type", "cluster_config", "compile_only", "validate_only", "compile_dir")
_CLUSTER = {
  "num_csx": "num_csx",
  "num_workers_per_csx": "num_workers_per_csx",
  "max_wgt_servers": "num_wgt_servers",
  "max_act_per_csx": "num_act_servers",
  "mount_dirs": "mount_dirs",
  "python_paths": "python_paths",
  "job_labels": "job_labels",
  "job_priority": "job_priority",
  "job_time_sec": "job_time_sec",
}
_PRECISION_MODEL = {"enabled": "mixed_precision", "fp16_type": "fp16_type"}
_PRECISION_OPT = (
  "loss_scaling_factor",
  "initial_loss_scale",
  "steps_per_increase",
  "min_loss_scale",
  "max_loss_scale",
  "max_gradient_norm",
  "max_gradient_value",
  "log_loss_scale",
)
_LOOP_RUN = ("max_steps", "num_steps", "num_epochs", "steps_per_epoch", "eval_frequency", "eval_steps")
_CHECKPOINT = {
  "steps": "checkpoint_steps",
  "save_initial_checkpoint": "save_initial_checkpoint",
  "autoload_last_checkpoint": "autoload_last_checkpoint",
  "max_checkpoints": "max_checkpoints",
  "disable_strict_checkpoint_loading": "disable_strict_checkpoint_loading",
}
_SCOPED = {"ScopedTrainFlags": "train_input", "ScopedValidateFlags": "eval_input"}
_MICRO_BATCH = "csx.performance.micro_batch_size"
_SEQUENTIAL = ("sequentiallr", "sequential")
_CHAINED = ("chainedscheduler", "chainedlr", "chained")


def is_trainer_layout(data: Any) -> bool:
  """Whether ``data`` (a parsed params file) is in the trainer layout (a top-level ``trainer``)."""
  return isinstance(data, dict) and "trainer" in data


def from_trainer_layout(data: dict[str, Any]) -> dict[str, Any]:
  """Convert a trainer-layout params dict to the legacy layout (see the module doc for the table).

  Raises:
    ConfigError: a key the converter does not handle, or a malformed section.
  """
  return convert_with_origins(data)[0]


class _Converter:
  def __init__(self) -> None:
    self.out: dict[str, dict[str, Any]] = {}
    self.renames: list[tuple[Loc, Loc]] = []
    self.problems: list[Problem] = []
    self.ignored: list[tuple[Loc, str]] = []

  def put(self, legacy: Loc, value: Any, written: Loc) -> None:
    node = self.out
    for part in legacy[:-1]:
      node = node.setdefault(part, {})
    node[legacy[-1]] = copy.deepcopy(value)
    self.renames.append((legacy, written))

  def bad(self, loc: Loc, message: str, *values: Any) -> None:
    self.problems.append(Problem(loc, message, *values))

  def mapping(self, value: Any, loc: Loc, allowed: tuple[str, ...] | None = None) -> dict[str, Any]:
    """``value`` as a mapping (empty on error), unknown keys reported."""
    if value is None:
      return {}
    if not isinstance(value, dict):
      self.bad(loc, "must be a mapping", value)
      return {}
    if allowed is not None:
      for key in value:
        if key not in allowed:
          self.bad(
            loc + (key,), unknown_key_message(key, allowed) + " (not converted from the trainer layout)"
          )
    return value


def convert_with_origins(data: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[Loc, Loc]]]:
  """``(legacy dict, renames)``; ``renames`` maps legacy key paths to the paths as written.

  Raises:
    ConfigError: every key that does not convert.
  """
  out, renames, problems, _ = convert_all(data)
  if problems:
    raise ConfigError(problems)
  return out, renames


def convert_all(
  data: dict[str, Any],
) -> tuple[dict[str, Any], list[tuple[Loc, Loc]], list[Problem], list[tuple[Loc, str]]]:
  """``(legacy dict, renames, problems, ignored)``: the conversion of what converts, the problems of what
  does not (so that they are reported with the problems of the converted file), and the callbacks
  ignored as logging-only (``(key path as written, name)``, `wafer.config.modelzoo.IGNORED`)."""
  c = _Converter()
  for key in data:
    if key != "trainer":
      c.bad(
        (key,),
        "a trainer-layout file has only the top-level key 'trainer' (legacy sections such as "
        "runconfig cannot be mixed in)",
      )
  trainer, tloc = data["trainer"], ("trainer",)
  if isinstance(trainer, list):
    if len(trainer) != 1 or not isinstance(trainer[0], dict) or set(trainer[0]) != {"trainer"}:
      raise ConfigError(Problem(tloc, "a list of trainers is not supported; give one trainer"))
    trainer, tloc = trainer[0]["trainer"], ("trainer", 0, "trainer")
  trainer = c.mapping(trainer, tloc, _TRAINER_KEYS)
  init = c.mapping(trainer.get("init"), tloc + ("init",), _INIT_KEYS)
  iloc = tloc + ("init",)
  _convert_init(c, init, iloc)
  _convert_dataloaders(c, trainer, tloc)
  _convert_callbacks(c, init.get("callbacks"), iloc + ("callbacks",))
  mode = (
    "train"
    if "fit" in trainer
    else "eval"
    if "validate" in trainer
    else "eval_all"
    if "validate_all" in trainer
    else None
  )
  if mode is not None:
    c.out.setdefault("runconfig", {}).setdefault("mode", mode)
  c.renames.sort(key=lambda r: -len(r[0]))
  return c.out, c.renames, c.problems, c.ignored


def _convert_init(c: _Converter, init: dict[str, Any], iloc: Loc) -> None:
  if "backend" in init:
    backend = init["backend"]
    bloc = iloc + ("backend",)
    if isinstance(backend, str):
      c.put(("runconfig", "target_device"), backend, bloc)
    else:
      backend = c.mapping(backend, bloc, _BACKEND_KEYS)
      if "backend_type" in backend:
        c.put(("runconfig", "target_device"), backend["backend_type"], bloc + ("backend_type",))
      cluster = c.mapping(backend.get("cluster_config"), bloc + ("cluster_config",), tuple(_CLUSTER))
      for key, legacy in _CLUSTER.items():
        if key in cluster:
          c.put(("runconfig", legacy), cluster[key], bloc + ("cluster_config", key))
      for key in ("compile_only", "validate_only", "compile_dir"):
        if key in backend:
          c.put(("runconfig", key), backend[key], bloc + (key,))
  if "device" in init:
    c.put(("runconfig", "target_device"), init["device"], iloc + ("device",))
  for key in ("model_dir", "seed"):
    if key in init:
      c.put(("runconfig", key), init[key], iloc + (key,))
  if "model" in init:
    c.put(("model",), c.mapping(init["model"], iloc + ("model",)), iloc + ("model",))
  if "sparsity" in init:  # weight sparsity (wafer.config.sparsity)
    c.put(("sparsity",), init["sparsity"], iloc + ("sparsity",))
  if "optimizer" in init:
    _convert_optimizer(c, init["optimizer"], iloc + ("optimizer",))
  if init.get("schedulers") is not None:
    _convert_schedulers(c, init["schedulers"], iloc + ("schedulers",))
  ploc = iloc + ("precision",)
  precision = c.mapping(
    init.get("precision"), ploc, tuple(_PRECISION_MODEL) + _PRECISION_OPT + ("precision_opt_level",)
  )
  for key, legacy in _PRECISION_MODEL.items():
    if key in precision:
      c.put(("model", legacy), precision[key], ploc + (key,))
  if "precision_opt_level" in precision:
    c.put(
      ("runconfig", "precision_opt_level"), precision["precision_opt_level"], ploc + ("precision_opt_level",)
    )
  for key in _PRECISION_OPT:
    if key in precision:
      c.put(("optimizer", key), precision[key], ploc + (key,))
  lloc = iloc + ("loop",)
  loop = c.mapping(init.get("loop"), lloc, _LOOP_RUN + ("grad_accum_steps",))
  for key in _LOOP_RUN:
    if key in loop:
      c.put(("runconfig", key), loop[key], lloc + (key,))
  if "grad_accum_steps" in loop:
    c.put(("optimizer", "grad_accum_steps"), loop["grad_accum_steps"], lloc + ("grad_accum_steps",))
  cloc = iloc + ("checkpoint",)
  checkpoint = c.mapping(init.get("checkpoint"), cloc, tuple(_CHECKPOINT))
  for key, legacy in _CHECKPOINT.items():
    if key in checkpoint:
      c.put(("runconfig", legacy), checkpoint[key], cloc + (key,))
  gloc = iloc + ("logging",)
  logging = c.mapping(init.get("logging"), gloc, ("log_steps",))
  if "log_steps" in logging:
    c.put(("runconfig", "log_steps"), logging["log_steps"], gloc + ("log_steps",))


_EXAMPLES = {
  "optimizer": "{AdamW: {lr: 0.001, weight_decay: 0.01}}",
  "scheduler": "{LinearLR: {initial_learning_rate: 0.001, end_learning_rate: 0.0, total_iters: 1000}}",
  "callback": "{ScopedTrainFlags: {csx.performance.micro_batch_size: 16}}",
}


def _single(c: _Converter, value: Any, loc: Loc, what: str) -> tuple[str, dict[str, Any]] | None:
  """``{Name: {...}}`` -> ``(Name, {...})``."""
  if not isinstance(value, dict) or len(value) != 1:
    c.bad(loc, f"must be a mapping with one key, the {what} name (e.g. {_EXAMPLES[what]})", value)
    return None
  ((name, args),) = value.items()
  if args is None:
    args = {}
  if not isinstance(name, str) or not isinstance(args, dict):
    c.bad(loc + (name,), f"the {what}'s arguments must be a mapping", args)
    return None
  return name, args


def _convert_optimizer(c: _Converter, value: Any, oloc: Loc) -> None:
  item = _single(c, value, oloc, "optimizer")
  if item is None:
    return
  name, args = item
  c.put(("optimizer", "optimizer_type"), name, oloc + (name,))
  if "lr" in args and "learning_rate" in args:  # both become optimizer.learning_rate: one would be dropped
    c.bad(
      oloc + (name, "learning_rate"),
      "lr and learning_rate are the same setting (lr is its trainer-layout name); give one of them",
      args["learning_rate"],
    )
    return
  for key, arg in args.items():
    legacy = "learning_rate" if key == "lr" else key
    c.put(("optimizer", legacy), arg, oloc + (name, key))


def _scheduler(c: _Converter, value: Any, loc: Loc) -> dict[str, Any] | None:
  item = _single(c, value, loc, "scheduler")
  if item is None:
    return None
  name, args = item
  if name.lower() in _SEQUENTIAL + _CHAINED:
    c.bad(loc + (name,), f"a nested {name} cannot be converted to the legacy layout")
    return None
  if "scheduler" in args:  # a wrapper (ScalePerParamLR): its argument would replace its name
    c.bad(
      loc + (name, "scheduler"),
      f"{name} wraps another scheduler; a scheduler that wraps others is not converted (convertible: one "
      "learning-rate scheduler, or a SequentialLR or ChainedScheduler of them)",
    )
    return None
  return {"scheduler": name, **copy.deepcopy(args)}


def _convert_schedulers(c: _Converter, value: Any, sloc: Loc) -> None:
  items = value if isinstance(value, list) else [value]
  if len(items) != 1:
    c.bad(
      sloc,
      "only one learning-rate scheduler can be converted (wrap several in SequentialLR); "
      "weight-decay and other schedulers are not converted",
      value,
    )
    return
  loc = sloc + (0,) if isinstance(value, list) else sloc
  item = _single(c, items[0], loc, "scheduler")
  if item is None:
    return
  name, args = item
  if name.lower() not in _SEQUENTIAL + _CHAINED:
    lr = _scheduler(c, items[0], loc)
    if lr is not None:
      c.put(("optimizer", "learning_rate"), lr, loc + (name,))
    return
  args = c.mapping(args, loc + (name,), ("schedulers", "milestones"))
  subs_in = args.get("schedulers")
  if not isinstance(subs_in, list) or not subs_in:
    c.bad(loc + (name, "schedulers"), "must be a non-empty list of schedulers", subs_in)
    return
  subs = [_scheduler(c, s, loc + (name, "schedulers", i)) for i, s in enumerate(subs_in)]
  if any(s is None for s in subs):
    return
  if name.lower() in _CHAINED:
    for s in subs:
      s["main_scheduler"] = "chained"
  elif "milestones" in args:
    milestones = args["milestones"]
    if not isinstance(milestones, list) or len(milestones) != len(subs) - 1:
      c.bad(
        loc + (name, "milestones"),
        f"must be a list of {len(subs) - 1} step(s), one per scheduler boundary",
        milestones,
      )
      return
    expected, total = [], 0
    for s in subs[:-1]:
      total += s.get("total_iters") if isinstance(s.get("total_iters"), int) else 0
      expected.append(total)
    if all(isinstance(s.get("total_iters"), int) for s in subs[:-1]) and expected != milestones:
      c.bad(
        loc + (name, "milestones"), f"Expected {name} to have milestones {expected}, but got {milestones}"
      )
      return
    prev = 0
    for s, m in zip(subs[:-1], milestones, strict=True):
      s.setdefault("total_iters", m - prev)
      prev = m
  c.put(("optimizer", "learning_rate"), subs if len(subs) > 1 else subs[0], loc + (name, "schedulers"))


def _convert_dataloaders(c: _Converter, trainer: dict[str, Any], tloc: Loc) -> None:
  fit = c.mapping(trainer.get("fit"), tloc + ("fit",), ("train_dataloader", "val_dataloader", "ckpt_path"))
  validate = c.mapping(trainer.get("validate"), tloc + ("validate",), ("val_dataloader", "ckpt_path"))
  vall = c.mapping(trainer.get("validate_all"), tloc + ("validate_all",), ("val_dataloaders", "ckpt_paths"))
  if "train_dataloader" in fit:
    loc = tloc + ("fit", "train_dataloader")
    c.put(("train_input",), c.mapping(fit["train_dataloader"], loc), loc)
  candidates = [
    (tloc + ("fit", "val_dataloader"), fit.get("val_dataloader")),
    (tloc + ("validate", "val_dataloader"), validate.get("val_dataloader")),
    (tloc + ("validate_all", "val_dataloaders"), vall.get("val_dataloaders")),
  ]
  chosen: tuple[Loc, Any] | None = None
  for loc, value in candidates:
    if value is None:
      continue
    if isinstance(value, list):
      if len(value) != 1:
        c.bad(loc, "only a single validation dataloader can be converted (eval_input)", value)
        continue
      value, loc = value[0], loc + (0,)
    if chosen is None:
      chosen = (loc, value)
      c.put(("eval_input",), c.mapping(value, loc), loc)
    elif value != chosen[1]:
      c.bad(loc, f"differs from {'.'.join(map(str, chosen[0]))}; the legacy layout has one eval_input")
  for section, loc in ((fit, tloc + ("fit",)), (validate, tloc + ("validate",))):
    if "ckpt_path" in section:
      c.put(("runconfig", "checkpoint_path"), section["ckpt_path"], loc + ("ckpt_path",))
  if vall.get("ckpt_paths") is not None:
    c.bad(
      tloc + ("validate_all", "ckpt_paths"), "not converted: eval_all evaluates every checkpoint in model_dir"
    )


def _convert_callbacks(c: _Converter, value: Any, loc: Loc) -> None:
  if value is None:
    return
  if not isinstance(value, list):
    c.bad(loc, "must be a list of callbacks", value)
    return
  for i, item in enumerate(value):
    cb = _single(c, item, loc + (i,), "callback")
    if cb is None:
      continue
    name, args = cb
    if ("callback", name) in IGNORED:
      c.ignored.append((loc + (i, name), name))
      continue
    if name not in _SCOPED:
      c.bad(
        loc + (i, name),
        f"callback {name!r} is not converted; convertible: {', '.join(_SCOPED)} with {_MICRO_BATCH}; "
        f"ignored (logging only): {', '.join(k for s, k in IGNORED if s == 'callback')}",
      )
      continue
    for key, arg in args.items():
      if key != _MICRO_BATCH:
        c.bad(loc + (i, name, key), f"flag {key!r} is not converted; convertible: {_MICRO_BATCH}")
      elif _SCOPED[name] not in c.out:
        c.bad(
          loc + (i, name, key), f"sets the micro batch of {_SCOPED[name]}, but there is no such dataloader"
        )
      else:
        c.put((_SCOPED[name], "micro_batch_size"), arg, loc + (i, name, key))
