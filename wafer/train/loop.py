"""The run loop: train / eval / train_and_eval / eval_all on steps compiled once, with checkpoints.

`run(task, runconfig, optimizer, loss_scale, policy)` takes the typed ``runconfig`` section
(`wafer.config.RunConfig`), compiles the train step once (`wafer.compile`, the train state
donated), restores the newest readable checkpoint in ``model_dir`` if there is one, and runs:

* steps until ``min(num_steps, max_steps - step)`` are done (Cerebras' rule,
  `RunConfig.num_train_steps`; ``max_steps`` counts from step 0, so a resumed run does the rest);
* a log line, a ``metrics.jsonl`` record and TensorBoard scalars at every ``log_steps``-th step,
  the final one and step 1, from the step's metrics fetched then (the device is not synchronised
  on other steps); step closures run at those steps and every ``activation_steps``-th step,
  checkpoint closures at checkpoint steps;
* a checkpoint (orbax; atomic) at steps N, 2N, ... and the final step (none when ``checkpoint_steps``
  is unset or 0, as in modelzoo; the run says so at its end): the whole `TrainState`,
  with the input pipeline's identity and the run's settings (`settings_of`), so that a resume
  that does not fit names the keys that changed;
* on resume from the checkpoint of step k, ``metrics.jsonl`` keeps the records up to k and moves
  the killed run's later ones to ``metrics.superseded.jsonl`` (`Metrics.resume`): each step once;
* ctrl-C raises `RunInterrupted`, whose message names the newest checkpoint and how to resume; so does
  a SIGTERM (``timeout``, a preemption) while the run goes in the main thread (`terminate_as_interrupt`).

Eval runs the eval step compiled once through `wafer.compile`, under the same `precision.Policy`
and the same ``num_csx`` sharding as training, in every eval mode. With many processes
(`wafer.cluster.initialize`) every process runs this loop; process 0 writes metrics and logs.
One run at a time writes into a model_dir: process 0 locks it before any slow work, until the run
ends (`wafer.train.lock`), and a second run into it stops at once, naming the run that holds it.
A mistake any one process finds (damaged data or checkpoint, settings that do not fit the
checkpoint, a model_dir process 0 cannot write) stops every process with the same error
(`wafer.cluster.agree`), at these points: at the start (every process must have been started with
the same settings), after the data and compile step (and the compile report), at each checkpoint
a resume or eval tries, after the resume's checks, at each checkpoint save and at each metrics
record. An error reading a training batch in the middle of training is not shared (that would
cost a collective, and a device synchronisation, on every step).
Nothing process-wide (JAX config, caches, cluster) is changed by `run`.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import precision
import wafer
from wafer import cluster
from wafer._io import make_writable_dir
from wafer.compile import cheap_sharding_probes
from wafer.config import ConfigError, RunConfig, Runtime
from wafer.config.errors import Problem
from wafer.config.schema import MODES, TRAIN_MODES
from wafer.errors import CheckpointMismatch, ExecutorError, RunInterrupted, Terminated, with_article
from wafer.train.checkpoint import Checkpoints, UnreadableCheckpoint, misnamed, newest_step, read_meta
from wafer.train.lock import ModelDirLock
from wafer.train.metrics import SUPERSEDED, Metrics, Progress, eval_marks
from wafer.train.state import TrainState, abstract, initial_state, step_shapes
from wafer.train.step import make_eval_step, make_train_step
from wafer.train.summary import RunSummary
from wafer.train.task import Task, next_batch


def seed_of(runconfig: RunConfig) -> int:
  """The run seed: ``runconfig.seed``, 1 when unset (`RunConfig.run_seed`)."""
  return runconfig.run_seed


def steps_to_run(runconfig: RunConfig, initial_step: int, data: Any = None) -> int:
  """Steps a run starting at ``initial_step`` performs; 0 when ``max_steps`` is already reached.

  ``data``: the training `BatchSource`; its ``epoch_steps()``, when it has one, is the epoch length
  ``num_epochs`` counts unless ``steps_per_epoch`` is set.

  Raises:
    wafer.config.ConfigError: no step count set, an epoch count without a known epoch length, or
      ``initial_step`` beyond ``max_steps``.
  """
  check_max_steps(runconfig, initial_step)
  if runconfig.max_steps is not None and initial_step == runconfig.max_steps:
    return 0
  return runconfig.num_train_steps(initial_step, epoch_steps(data))


def check_max_steps(runconfig: RunConfig, initial_step: int) -> None:
  """Refuse a run resuming at ``initial_step`` (its checkpoint's step) beyond ``runconfig.max_steps``.

  Checked before the run reads data or compiles (`_Run._refuse_unfit_checkpoint`) and again at the resume
  (`steps_to_run`).

  Raises:
    wafer.config.ConfigError: at ``runconfig.max_steps``, naming the checkpoint's step and the ways on.
  """
  if runconfig.max_steps is None or initial_step <= runconfig.max_steps:
    return
  raise ConfigError(
    Problem(
      ("runconfig", "max_steps"),
      f"Initial global step {initial_step} already exceeds max step {runconfig.max_steps}: model_dir holds "
      f"the checkpoint of step {initial_step}. Raise runconfig.max_steps above {initial_step} to train "
      "further, evaluate it with --mode eval, or use a new model_dir",
      runconfig.max_steps,
    ),
    f"model_dir {runconfig.model_dir}",
  )


def epoch_steps(data: Any) -> int | None:
  """The epoch length of the training `BatchSource` ``data`` (its ``epoch_steps()``), or None when unknown."""
  epoch = getattr(data, "epoch_steps", None)
  return epoch() if callable(epoch) else None


def make_model_dir(path: str | os.PathLike[str], key: str = "runconfig.model_dir") -> Path:
  """``runconfig.model_dir`` (named ``key`` in messages), created if missing and checked writable first.

  Raises:
    ExecutorError: it is a file, or it cannot be created or written (checkpoints would be lost).
  """
  problem = make_writable_dir(path, key, "no checkpoint or metric")
  if problem is not None:
    raise ExecutorError(f"{problem}; give a directory wafer can write (--model_dir DIR)")
  return Path(path)


def require_checkpoint(runconfig: RunConfig) -> None:
  """An eval mode (``eval``, ``eval_all``) needs a checkpoint in ``model_dir``: refused, creating nothing,
  when ``model_dir/checkpoints`` holds none (a new folder, a mistyped path). Only checks (``validate_only``,
  ``compile_only``) need none.

  Raises:
    ExecutorError: naming the folder and what to do.
  """
  if runconfig.mode not in ("eval", "eval_all") or runconfig.validate_only or runconfig.compile_only:
    return
  folder = Path(runconfig.model_dir) / "checkpoints"
  try:
    named = [p for p in folder.iterdir() if p.name.isdigit() and str(int(p.name)) == p.name]
  except OSError:  # no such folder (or not a folder: Checkpoints says so)
    named = [] if not folder.exists() or folder.is_dir() else [folder]
  if not named:
    others = misnamed(Path(runconfig.model_dir))
    aside = (
      f"; {', '.join(p.name for p in others)} there hold{'s' * (len(others) == 1)} a checkpoint's files, but only "
      "folders named by their step are read: rename to the step (checkpoints/4)"
      if others
      else ""
    )
    raise ExecutorError(
      f"mode {runconfig.mode}: no checkpoint in {folder}: train first, or point --model_dir "
      "(runconfig.model_dir) at a run's folder (runconfig.save_initial_checkpoint: true makes a training run "
      f"also write checkpoint 0, the initial weights){aside}"
    )


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
  """Inside, a SIGTERM raises `wafer.errors.Terminated` (a `KeyboardInterrupt`) where the main thread is,
  as ctrl-C does, so that the run ends with `RunInterrupted`'s message, not silently (exit 143). Only in
  the main thread (signal handlers can be set nowhere else), and not where SIGTERM is ignored; the
  previous handler is restored at the end."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  previous = signal.getsignal(signal.SIGTERM)
  if previous == signal.SIG_IGN:
    yield
    return

  def handler(signum: int, frame: Any) -> None:
    raise Terminated("SIGTERM")

  signal.signal(signal.SIGTERM, handler)
  try:
    yield
  finally:
    signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


_RESUME_ONLY = (
  ("checkpoint_path", None),
  ("load_checkpoint_states", None),
  ("autoload_last_checkpoint", True),
  ("disable_strict_checkpoint_loading", False),
)
"""Checkpoint-loading keys of modelzoo that wafer does not implement, with the one value it honours."""


def check_checkpoint_keys(runconfig: RunConfig) -> None:
  """Refuse checkpoint-loading settings the run would otherwise ignore (and train other weights).

  wafer resumes from the newest readable checkpoint in ``model_dir`` and loads nothing else; a run
  that silently ignored ``checkpoint_path`` would train from scratch where the user asked for a
  warm start, and one that ignored ``autoload_last_checkpoint: false`` would resume where the user
  asked for a fresh start.

  Raises:
    ExecutorError: naming each such key, its value and what to do instead.
  """
  found = [(k, getattr(runconfig, k)) for k, honoured in _RESUME_ONLY if getattr(runconfig, k) != honoured]
  if not found:
    return
  keys = ", ".join(f"runconfig.{k}={v!r}" for k, v in found)
  raise ExecutorError(
    f"{keys}: not implemented; wafer resumes from the newest readable checkpoint in model_dir "
    f"({runconfig.model_dir}) and loads no other. To start from a wafer checkpoint, copy its step folder "
    "(model_dir/checkpoints/<step>) into a new model_dir's checkpoints/; to start fresh, use a new model_dir. "
    "Then remove the key(s) (or set them to null / their defaults)."
  )


def checkpoint_iterations(checkpoint_steps: int, first: int, last: int) -> set[int]:
  """Steps in ``(first, last]`` that checkpoint: multiples of N, and always ``last``.

  >>> sorted(checkpoint_iterations(4, 0, 10)), sorted(checkpoint_iterations(4, 8, 10))
  ([4, 8, 10], [10])
  """
  if checkpoint_steps <= 0:
    return set()
  marks = {s for s in range(first + 1, last + 1) if s % checkpoint_steps == 0}
  return marks | {last} if last > first else marks


def run(
  task: Task,
  runtime: Runtime | RunConfig,
  optimizer: optax.GradientTransformation | None = None,
  loss_scale: Any = None,
  policy: precision.Policy | None = None,
  *,
  progress: bool = True,
  config: Any = None,
) -> RunSummary:
  """Run ``task`` under ``runtime`` (`wafer.config.Runtime`, from ``params.build()``): its
  ``runconfig.mode``, optimizer, loss scale and policy. Returns a `RunSummary` (final step, losses,
  evaluations, paths).

  The runtime's ``params`` (a `wafer.config.Params`, or None) has its ``model``, ``train_input`` and
  ``optimizer`` settings saved with every checkpoint (with the batch size, always saved), so that a
  resume whose settings changed names the keys (`changed_settings`): an error when the checkpoint does
  not fit (another model shape, batch size or input pipeline), a note otherwise (e.g. a new learning
  rate). ``progress``: show a progress bar when stderr is a terminal.

  The earlier form ``run(task, runconfig, optimizer, loss_scale, policy, config=params)`` is accepted
  too (``config`` is then the runtime's ``params``). The step runs at the policy's precision level: a
  ``runconfig.precision_opt_level`` given explicitly must be that level (a mixed-precision policy's),
  else an `ExecutorError` says both; left unset, it is not read.
  """
  if isinstance(runtime, Runtime):
    if optimizer is not None or loss_scale is not None or policy is not None or config is not None:
      raise TypeError("run(task, runtime): the runtime carries the optimizer, loss scale, policy and params")
    runtime_ = runtime
  else:
    if optimizer is None or loss_scale is None or policy is None:
      missing = [
        n for n, v in (("optimizer", optimizer), ("loss_scale", loss_scale), ("policy", policy)) if v is None
      ]
      raise TypeError(
        f"run(task, runconfig, optimizer, loss_scale, policy): all five are needed ({', '.join(missing)} not "
        "given); or run(task, runtime) with the Runtime of params.build(), which carries them"
      )
    runtime_ = Runtime(optimizer, loss_scale, policy, runtime, config)
  _check_run_arguments(task, runtime_)
  _check_precision_level(runtime_.runconfig, runtime_.policy)
  summary = _Run(
    task,
    runtime_.runconfig,
    runtime_.optimizer,
    runtime_.loss_scale,
    runtime_.policy,
    progress,
    runtime_.params,
  ).go()
  return RunSummary.from_dict(summary)


_COMPARED_SECTIONS = ("model", "train_input", "optimizer", "sparsity")
"""The params sections a checkpoint records (runconfig keys such as max_steps change between runs by design)."""


def settings_of(config: Any) -> dict[str, Any]:
  """``{"model.hidden_size": 50, ...}``: the `_COMPARED_SECTIONS` keys of a `Params` (JSON values), else {}.

  >>> settings_of({"model": {"name": "m", "sizes": [2, 3]}, "runconfig": {"max_steps": 5}})
  {'model.name': 'm', 'model.sizes': [2, 3]}
  """
  if config is None:
    return {}
  dump: dict[str, Any] = {}
  for section in _COMPARED_SECTIONS:
    value = config.get(section) if isinstance(config, dict) else getattr(config, section, None)
    try:  # each section by its own (model plugin's) schema: the Params field's type would drop its keys
      # sparsity's many optional keys: only those given (the section is recorded since it was added)
      dump[section] = (
        value.model_dump(mode="json", exclude_none=section == "sparsity")
        if hasattr(value, "model_dump")
        else value
      )
    except Exception:  # a section that cannot be dumped is not recorded (nothing to compare, no error)
      continue
  out: dict[str, Any] = {}

  def walk(prefix: str, value: Any) -> None:
    if isinstance(value, dict):
      for k, v in value.items():
        walk(f"{prefix}.{k}", v)
    else:
      out[prefix] = value

  for section in _COMPARED_SECTIONS:
    if isinstance(dump.get(section), dict):
      walk(section, dump[section])
  return out


_CHANGES_SHOWN = 12
"""Changed settings a message lists (the rest are counted)."""


def listed(changes: Sequence[str]) -> str:
  """``changes`` joined with ``; ``, the first `_CHANGES_SHOWN` of them and a count of the rest."""
  shown = "; ".join(changes[:_CHANGES_SHOWN])
  more = len(changes) - _CHANGES_SHOWN
  return shown + (f"; and {more} more" if more > 0 else "")


def changed_settings(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
  """``["model.hidden_size: checkpoint 50, now 40", ...]`` for the keys whose value differs (sorted).

  A run started without a params file (``wafer.train.run(task, ...)``) records only its batch size;
  when either side is such a run, only the keys both recorded are compared.

  >>> changed_settings({"model.width": 50, "optimizer.lr": 0.1}, {"model.width": 40, "optimizer.lr": 0.1})
  ['model.width: checkpoint 50, now 40']
  >>> changed_settings({"model.width": 50, "train_input.batch_size": 8}, {"train_input.batch_size": 8})
  []
  """
  missing = object()
  configured = all(any(k not in _ALWAYS_RECORDED for k in side) for side in (saved, now))
  keys = set(saved) | set(now) if configured else set(saved) & set(now)
  if _POLICY_KEY not in saved:  # a checkpoint written before the policy was recorded: not a change
    keys.discard(_POLICY_KEY)
  return [
    f"{k}: checkpoint {_show(saved.get(k, missing))}, now {_show(now.get(k, missing))}"
    for k in sorted(keys)
    if saved.get(k, missing) != now.get(k, missing)
  ]


def run_settings(config: Any, batch_size: int, policy: Any) -> dict[str, Any]:
  """The settings a run records with each checkpoint and compares on resume: the `settings_of` its params
  (``config``), its batch size and its precision policy (`changed_settings`)."""
  return {**settings_of(config), "train_input.batch_size": batch_size, _POLICY_KEY: str(policy)}


def checkpoint_changes(model_dir: str | Path, settings: dict[str, Any]) -> tuple[int, list[str]] | None:
  """``(step, changes)``: the newest checkpoint in ``model_dir`` and the `settings` (`run_settings`) changed
  since it was written, as a resume there would name them; None when ``model_dir`` has no checkpoint.
  Reads only (a sweep checks its runs' folders before any run trains: `wafer.sweep.sweep`)."""
  step = newest_step(Path(model_dir))
  if step is None:
    return None
  meta = read_meta(Path(model_dir) / "checkpoints", step)
  return step, (changed_settings(meta["config"], settings) if isinstance(meta.get("config"), dict) else [])


_POLICY_KEY = "precision.policy"
"""The settings key of the run's precision policy (`str(policy)`; not a params-file key: every key that
changes it is, and some that do not say so, as a level-2 softmax overriding attention_softmax_fp32)."""
_ALWAYS_RECORDED = ("train_input.batch_size", _POLICY_KEY)
"""Keys every run records, with a params file or without."""


def _show(value: Any) -> str:
  return "(unset)" if type(value) is object else repr(value)


_STEPS_AFTER_RESUME = 2
"""The steps after a resume whose loss is always read (one device synchronisation each). The first step's
loss is computed from the restored weights, the second's from weights updated with the restored optimizer
state (a damaged momentum). A non-finite loss at these steps, or at a log step before a finite loss was
logged after them, suspects the checkpoint the run resumed from, not the learning rate."""


class _Run:
  def __init__(self, task, rc, optimizer, loss_scale, policy, progress, config=None):
    if rc.mode not in MODES:
      raise ExecutorError(f"mode={rc.mode!r}; allowed: {', '.join(MODES)}")
    # the policy as the run computes it (half type, level, softmax): one key for every change of numerics
    self.settings = run_settings(config, task.batch_size, policy)
    self.task, self.rc, self.policy, self.progress, self.params = task, rc, policy, progress, config
    self.optimizer, self.loss_scale = optimizer, loss_scale
    self.num_csx = rc.num_csx
    self.distributed = jax.process_count() > 1
    self.main = jax.process_index() == 0
    self.model_dir = Path(rc.model_dir)
    self.summary: dict[str, Any] = {
      "model_dir": str(self.model_dir),
      "task": task.name,
      "eval_metric": task.eval_metric_name,
    }
    self.eval_compiled: Any = None
    self.said_short_eval = False  # eval_steps beyond the eval data: said once per run
    self.lock: ModelDirLock | None = None  # process 0's lock of model_dir, held while the run goes
    # (step, largest |value| of its weights and optimizer state, on device) of the checkpoint the run
    # resumed from, while a non-finite loss suspects it (_STEPS_AFTER_RESUME)
    self.just_resumed: tuple[int, jax.Array] | None = None

  def say(self, line: str) -> None:
    if self.main:
      print(line, flush=True)

  def place(self, state: TrainState) -> TrainState:
    """The state replicated over the systems' devices (as is for one system in one process)."""
    return cluster.replicated(state, self.num_csx) if self.num_csx > 1 or self.distributed else state

  def go(self) -> dict[str, Any]:
    run_keys = self.rc.model_dump(mode="json", exclude={"model_dir"})  # hosts may mount model_dir elsewhere
    cluster.same_on_every_process({**self.settings, **{f"runconfig.{k}": v for k, v in run_keys.items()}})
    if self.distributed:  # num_csx must spread evenly over the processes (after the settings agree: one
      with cluster.same_outcome():  # process's own num_csx error left the others in that collective)
        cluster.mesh(self.num_csx)
    # damaged data or a model_dir process 0 cannot write stops every process; the traces of the state's
    # shapes, the step and the estimate probe tracer.sharding at every flax.nnx RNG draw (cheap here)
    try:
      with terminate_as_interrupt():
        with cluster.same_outcome(), cheap_sharding_probes():
          init = self._prepare()
        if init is None:
          kind = "Validation" if self.rc.validate_only else "Compile"
          self.say(f"{kind} completed successfully ({self.task.name}).")
          return self.summary
        return self._go(init)
    finally:
      if self.lock is not None:
        self.lock.release()

  def _prepare(self) -> TrainState | None:
    """Check the settings, read the data, compile the train step, write the compile report (no collective).

    Returns the initial train state, or None for a run that only checks (validate_only / compile_only).
    """
    task, rc = self.task, self.rc
    check_checkpoint_keys(rc)
    require_checkpoint(rc)  # before model_dir is created: an eval of a mistyped path creates nothing
    make_model_dir(self.model_dir)
    if self.main:  # process 0 writes model_dir; another run writing there is refused before any slow work
      self.lock = ModelDirLock.acquire(self.model_dir, say=self.say)
    seed = seed_of(rc)
    check_only = rc.validate_only or rc.compile_only
    for folder in misnamed(self.model_dir):  # a copied or renamed checkpoint: said, not silently skipped
      self.say(
        f"Note: {folder} holds a checkpoint's files but is not read: only folders named by their step "
        f"(checkpoints/<step>, e.g. checkpoints/4) are; rename it to its step to use it."
      )
    # a checkpoint the run could not resume (or evaluate) is refused before any slow work, and before the
    # compile report of the run whose checkpoints they are is overwritten
    self._refuse_unfit_checkpoint(seed)
    if check_only and rc.mode in ("eval", "eval_all"):  # the step the mode runs: the eval step
      self._check_eval_step(seed)
      return None
    if check_only and task.batch_spec is not None:
      # on shapes: the state is jax.eval_shape of its initialisation and the batch the task's
      # batch_spec, so a params file of a 175B model is checked in the memory of its graph
      kind = "Validating" if rc.validate_only else "Compiling"
      self.say(f"{kind} the train step of {task.name} on shapes (no data is read, no weights are built)...")
      init, example_batch = step_shapes(task, self.optimizer, self.loss_scale, seed)
      compile_batch, lowered_only = example_batch, rc.validate_only
    else:
      init = self.place(initial_state(task, self.optimizer, self.loss_scale, jax.random.key(seed)))
      self.template = abstract(init)
      if rc.mode in ("eval", "eval_all"):  # as modelzoo: the eval step only, no training data read
        self.say(f"Mode {rc.mode}: the training data is not read and the train step not compiled.")
        return init
      self.say(f"Preparing the training data of {task.name}...")
      t0 = time.perf_counter()
      self.data = task.train_data(seed)
      if not _is_batch_source(self.data):  # resuming needs its position: get_state / set_state
        raise ExecutorError(
          f"Task.train_data(seed) returned {with_article(type(self.data).__name__)}; {TRAIN_DATA_ALLOWED}: a plain iterator "
          "or list has no position to checkpoint and resume"
        )
      # With many processes, a source that can build only this process's systems' rows does so: the
      # input workers are split by process (every process holds the same position).
      self.local_rows = self.distributed and hasattr(self.data, "for_systems")
      if self.local_rows:
        self.data = self.data.for_systems(cluster.local_systems(self.num_csx))
      start = self.data.get_state()
      example_batch = next_batch(
        self.data, 0
      )  # the compile's example; then rewind, so the data is built once
      self.data.set_state(start)
      rows = _local_rows(task.batch_size, self.num_csx) if self.local_rows else task.batch_size
      _check_batch_rows(example_batch, rows)
      if task.batch_spec is not None:
        _check_batch_spec(example_batch, task.batch_spec(), self.local_rows, self.num_csx)
      compile_batch = cluster.global_batch(example_batch, self.num_csx, local=self.local_rows)
      lowered_only = False  # as before the shapes-only path: the data path says "Compiled"
      self.say(f"Data ready in {time.perf_counter() - t0:.1f} s. Compiling the train step ({self.policy})...")
    step_fn = make_train_step(task, self.optimizer, self.policy)
    if rc.validate_only:  # traced once for the check and the estimate (jax.jit's trace cache: same shapes)
      step_fn = jax.jit(step_fn)
    t1 = time.perf_counter()
    # a validation traces the step as the estimate does (autocast's products whole, not the CPU's
    # chunked emulation of their accumulation: `precision.whole_products`), so the two share one trace
    with precision.whole_products() if rc.validate_only else contextlib.nullcontext():
      self.compiled = wafer.compile(
        step_fn,
        init,
        compile_batch,
        num_csx=self.num_csx,
        batch_argnums=self._batch_argnums(),
        donate_argnums=(0,),
        validate_only=rc.validate_only,
      )
    self.say(f"{'Traced and lowered' if lowered_only else 'Compiled'} in {time.perf_counter() - t1:.1f} s.")
    if self.main:
      # validation: the batch's scaling followed through the step's one trace (the same graph, where
      # it can be followed: `wafer.costmodel.graph.extract`); else the step is traced twice
      scaling = "dataflow" if rc.validate_only else "traced"
      how = (
        "follows the batch through its trace" if rc.validate_only else "traces the step at two batch sizes"
      )
      self.say(f"Estimating the rate on the wafer (cost model: {how})...")
      _write_compile_report(
        step_fn,
        init,
        example_batch,
        task,
        self.num_csx,
        self.policy,
        self.model_dir,
        self.summary,
        self.params,
        scaling=scaling,
      )
    return None if check_only else init

  def _check_eval_step(self, seed: int) -> None:
    """validate_only / compile_only in an eval mode: the eval step traced (and compiled) on the eval batch's
    shapes (`Task.eval_batch_spec`, else the first eval batch's); no compile report (it rates the train step)."""
    task, rc = self.task, self.rc
    if task.eval_data is None:
      raise ExecutorError(f"model {task.name!r} has no eval data (eval_input); eval modes need it")
    params = jax.eval_shape(
      lambda key: initial_state(task, self.optimizer, self.loss_scale, key).params, jax.random.key(seed)
    )
    kind = "Validating" if rc.validate_only else "Compiling"
    if task.eval_batch_spec is not None:
      self.say(f"{kind} the eval step of {task.name} on shapes (no data is read, no weights are built)...")
      batch = task.eval_batch_spec()
    else:
      self.say(f"{kind} the eval step of {task.name} on the first eval batch...")
      first = next(iter(task.eval_data()), None)
      if first is None:
        raise ExecutorError(
          "Iterating the eval data did not return any values: the dataset is too small for the batch size."
        )
      batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype), first)
    t1 = time.perf_counter()
    with precision.whole_products() if rc.validate_only else contextlib.nullcontext():
      wafer.compile(
        make_eval_step(task, self.policy),
        params,
        batch,
        num_csx=self.num_csx,
        batch_argnums=self._batch_argnums(),
        validate_only=rc.validate_only,
      )
    self.say(
      f"{'Traced and lowered' if rc.validate_only else 'Compiled'} the eval step in {time.perf_counter() - t1:.1f} "
      f"s (mode {rc.mode} runs no train step: no compile report is written)."
    )

  def _refuse_unfit_checkpoint(self, seed: int) -> None:
    """Refuse, before the data, the compile and the compile report, a newest checkpoint in model_dir that this
    run could not use: another batch size (a mode that trains resumes it), another model or other array shapes,
    or (a mode that trains) a step beyond ``runconfig.max_steps`` (`check_max_steps`).

    Raises:
      ExecutorError: what `_resume_from` / `_restore_latest` would raise later; under validate_only /
        compile_only, saying that the real run would be refused.
    """
    step = newest_step(self.model_dir)
    if step is None:
      return
    problem = None
    meta = read_meta(self.model_dir / "checkpoints", step)
    config = meta.get("config")
    # (a damaged meta: the run's restore reports it and tries the checkpoint before it)
    saved_batch = config.get("train_input.batch_size") if isinstance(config, dict) else None
    pipeline = meta.get("data_pipeline")
    pipeline = pipeline.get("pipeline") if isinstance(pipeline, dict) else None
    saved_csx = pipeline.get("num_csx") if isinstance(pipeline, dict) else None  # (a pipeline that shards)
    if self.rc.mode in TRAIN_MODES and saved_batch not in (None, self.task.batch_size):
      problem = self._batch_refusal(step, saved_batch)
    elif self.rc.mode in TRAIN_MODES and saved_csx not in (None, self.num_csx):
      problem = self._pipeline_refusal(
        step, f"its input pipeline was written for runconfig.num_csx={saved_csx}, this run has {self.num_csx}"
      )
    else:
      shapes = jax.eval_shape(
        lambda key: initial_state(self.task, self.optimizer, self.loss_scale, key), jax.random.key(seed)
      )
      checkpoints = Checkpoints(self.model_dir, None, say=self.say)
      try:
        checkpoints._check(step, shapes)
      except UnreadableCheckpoint:  # the run's restore says so, and tries the one before it
        pass
      except CheckpointMismatch as error:
        problem = self._with_changes(str(error) + self._eval_hint(error), step)
      else:  # the checkpoint the run resumes from: a max_steps below its step is refused now too
        if self.rc.mode in TRAIN_MODES:
          try:
            check_max_steps(self.rc, step)
          except ConfigError as error:
            if not (self.rc.validate_only or self.rc.compile_only):
              raise
            problem = str(error)
      finally:
        checkpoints.close()
    if problem is None:
      return
    if self.rc.validate_only or self.rc.compile_only:
      flag = "--validate_only" if self.rc.validate_only else "--compile_only"
      problem = f"{flag}: the run would be refused (nothing was written): {problem}"
    raise ExecutorError(problem)

  def _pipeline_refusal(self, step: int, reason: str) -> str:
    """The error of a resume from checkpoint ``step`` whose input pipeline differs from this run's (``reason``)."""
    return self._with_changes(
      f"Cannot resume from the checkpoint of step {step}: {reason}. Batch k of a run depends on the batch "
      "size, the number of input workers (num_workers_per_csx x num_csx; workers shard the data), the "
      "shuffle settings and the data; restore the settings the checkpoint was written with, or use a new "
      "model_dir.",
      step,
    )

  def _batch_refusal(self, step: int, saved_batch: Any) -> str:
    """The error of a resume from checkpoint ``step``, written with batch size ``saved_batch``."""
    return self._with_changes(
      f"Cannot resume from the checkpoint of step {step}: it was written with train_input.batch_size="
      f"{saved_batch}, this run has {self.task.batch_size} (batch k of the data would not be the run's "
      f"batch k). Set train_input.batch_size back to {saved_batch}, or use a new model_dir (not "
      f"{self.model_dir}).",
      step,
    )

  def _go(self, init: TrainState) -> dict[str, Any]:
    rc = self.rc
    self.checkpoints = Checkpoints(self.model_dir, rc.max_checkpoints, say=self.say)
    self.metrics = Metrics(self.model_dir, jax.devices()[0].platform.upper(), enabled=self.main)
    try:
      if rc.mode == "train":
        state = self._resume(init)
        self._train(
          state, int(state.step) + steps_to_run(rc, int(state.step), self.data), rc.checkpoint_steps or 0
        )
      elif rc.mode == "eval":
        self._eval(init)
      elif rc.mode == "eval_all":
        self._eval_all()
      else:
        self._train_and_eval(init)
    except KeyboardInterrupt as error:  # ctrl-C or SIGTERM: say where model_dir stands and how to go on
      raise RunInterrupted(self._interrupted(), signum=getattr(error, "signum", signal.SIGINT)) from None
    finally:
      self.metrics.close()
      self.checkpoints.close()
    return self.summary

  def _interrupted(self) -> str:
    """What an interrupted run leaves in model_dir and how to go on."""
    where = f" at step {self.at_step}" if getattr(self, "at_step", None) is not None else ""
    if self.rc.mode in ("eval", "eval_all"):
      return (
        f"Interrupted{where} while evaluating; evaluation writes no checkpoint: those in {self.model_dir} "
        "are as they were, and metrics.jsonl holds the evaluations done."
      )
    try:
      steps = self.checkpoints.steps()
    except Exception:  # noqa: BLE001 (model_dir gone or unreadable: still report the interruption)
      return f"Interrupted{where}; the checkpoints in {self.model_dir} could not be listed."
    if not steps:
      return (
        f"Interrupted{where}, before the first checkpoint: rerunning the same command starts again from step "
        f"0 (the records in {self.model_dir / 'metrics.jsonl'} then move to {SUPERSEDED})."
      )
    newest = max(steps)
    return (
      f"Interrupted{where}. {self.model_dir} is consistent: its newest checkpoint is step {newest} "
      f"({self.checkpoints.directory / str(newest)}). Rerun the same command to resume from there (records of "
      f"later steps in metrics.jsonl then move to {SUPERSEDED})."
    )

  def _batch_argnums(self) -> tuple[int, ...]:
    return (1,) if self.num_csx > 1 else ()

  def _resume(self, init: TrainState) -> TrainState:
    """The newest readable checkpoint's state, the data source moved to its position; else ``init``.

    Also starts metrics.jsonl's history at the restored step (`Metrics.resume`: the killed run's
    records of later steps move to metrics.superseded.jsonl).

    Raises:
      ExecutorError: the checkpoint does not fit this run (model shapes, batch size, input
        pipeline); the message names the settings that changed since it was written.
    """
    restored = self._restore_latest()
    if restored is None:
      with cluster.same_outcome():  # process 0 rewrites metrics.jsonl: its error stops every process
        # records of a run that left no checkpoint (killed before its first, or none asked for) move aside
        self.metrics.resume(int(init.step), from_checkpoint=False)
      if self.rc.save_initial_checkpoint:  # the step-0 checkpoint of a fresh run (modelzoo's key)
        self.checkpoints.save(init, self._meta())
      return init
    with cluster.same_outcome():  # settings that do not fit the checkpoint stop every process, alike
      return self._resume_from(*restored)

  def _resume_from(self, state: TrainState, meta: dict[str, Any]) -> TrainState:
    """`_resume` once a checkpoint is restored: its settings checked, the data moved, metrics.jsonl cut."""
    step, position = int(state.step), int(state.data_position)
    saved_batch = meta.get("config", {}).get("train_input.batch_size", self.task.batch_size)
    if saved_batch != self.task.batch_size:  # batch k of the data would not be the run's batch k
      raise ExecutorError(self._batch_refusal(step, saved_batch))
    wanted = {**self.data.get_state(), **meta.get("data_pipeline", {}), "next_batch": position}
    try:
      self.data.set_state(wanted)
    except ValueError as error:
      raise ExecutorError(self._pipeline_refusal(step, str(error))) from error
    # a max_steps below the checkpoint's step: refused before "Resuming"
    steps_to_run(self.rc, step, self.data)
    self.say(f"Resuming from the checkpoint at step {step}.")
    self.just_resumed = (step, _largest_magnitude((state.params, state.opt_state)))  # not fetched (no sync)
    self._note_changes(self._changes(meta), step)
    self.metrics.resume(step)  # the killed run's records after `step` move to metrics.superseded.jsonl
    return state

  def _changes(self, meta: dict[str, Any]) -> list[str]:
    """The settings changed since the checkpoint of ``meta`` was written (`changed_settings`)."""
    if "config" not in meta:
      return []
    changes = changed_settings(meta["config"], self.settings)
    if self.rc.mode in ("eval", "eval_all"):  # eval reads eval_input only: train_input's keys are no change
      changes = [c for c in changes if not c.startswith("train_input.")]
    return changes

  def _note_changes(self, changes: list[str], step: int) -> None:
    """One line naming ``changes``, the settings changed since checkpoint ``step`` (none: nothing said)."""
    if changes:
      self.say(f"Note: settings changed since the checkpoint of step {step}: {listed(changes)}.")

  def _restore_latest(self) -> tuple[TrainState, dict[str, Any]] | None:
    """`Checkpoints.restore_latest`; a checkpoint of another model names the settings that changed."""
    try:
      return self.checkpoints.restore_latest(self.template, say=self.say)
    except CheckpointMismatch as error:  # on every process (agreed); each reads the recorded settings,
      with cluster.same_outcome():  # so they raise one message even if one process read them otherwise
        raise ExecutorError(self._with_changes(str(error) + self._eval_hint(error), error.step)) from None

  def _eval_hint(self, error: CheckpointMismatch) -> str:
    """In an eval mode, for a checkpoint that differs only in its loss-scale state: that eval does not use it,
    and how to evaluate anyway; else ''."""
    if self.rc.mode not in ("eval", "eval_all") or not error.loss_scale_only:
      return ""
    return (
      " Eval does not use the loss-scale state, but a checkpoint is restored whole: evaluate with the loss "
      "scaling it was written with, in its own half type (model.fp16_type, below), or in float16 with its "
      "optimizer.loss_scaling_factor; bfloat16 and float32 keep no loss-scale state, so a checkpoint written "
      "with one is not evaluated in them."
    )

  def _with_changes(self, message: str, step: int) -> str:
    """``message`` and the settings that changed since checkpoint ``step`` was written (when it recorded them)."""
    checkpoints = getattr(self, "checkpoints", None)  # none yet when checked before the run (_prepare)
    meta = (
      checkpoints.meta(step) if checkpoints is not None else read_meta(self.model_dir / "checkpoints", step)
    )
    if "config" not in meta:
      return message
    before, now = meta["config"].get("model.name"), self.settings.get("model.name")
    if before is not None and now is not None and before != now:  # the cause, first; every key differs
      return (
        f"{self.model_dir} holds checkpoints of model {before!r} (step {step}), and this run is model "
        f"{now!r}: give this run a model_dir of its own (--model_dir), or move those checkpoints away. "
        f"{message}"
      )
    changes = changed_settings(meta["config"], self.settings)
    if not changes:
      return message
    return f"{message} Settings changed since that checkpoint was written: {listed(changes)}."

  def _meta(self) -> dict[str, Any]:
    """What a checkpoint records beside the state: the input pipeline's identity and the run's settings."""
    return {"data_pipeline": self._pipeline(), "config": self.settings}

  def _pipeline(self) -> dict[str, Any]:
    """What identifies the input pipeline (its state without the position, which is in the train state)."""
    return {k: v for k, v in self.data.get_state().items() if k != "next_batch"}

  def _train(
    self, state: TrainState, last: int, checkpoint_steps: int, run_end: int | None = None
  ) -> TrainState:
    """Train ``state`` to step ``last``; ``run_end``: the end of the whole run (train_and_eval)."""
    task, rc, metrics = self.task, self.rc, self.metrics
    done = int(state.step)  # the host's copy of state.step, read once; the checkpoint's number is state.step
    if last == done:
      self._nothing_to_train(done)
      self.summary.update(final_step=done, params=state.params)
      self.summary.setdefault("losses", [])
      return state
    # the run's checkpoint steps (N, 2N, ... and its end), not each train_and_eval stretch's end
    marks = {s for s in checkpoint_iterations(checkpoint_steps, done, run_end or last) if s <= last}
    log_every = max(1, rc.log_steps)
    activation = rc.effective_activation_steps
    bar = Progress(self.progress and self.main and sys.stderr.isatty(), done, last)
    start_time, start_step = time.perf_counter(), done
    window_time, window_step = start_time, done
    losses = []
    skipped_before = _skipped_steps(state)  # the loss scale's count, where it keeps one
    logged_skips = []  # `skipped` of each logged step: the count of a loss scale that keeps none
    while done < last:
      batch = cluster.global_batch(next_batch(self.data, done), self.num_csx, local=self.local_rows)
      state, step_metrics = self.compiled(state, batch)
      done += 1
      self.at_step = done
      is_log = done % log_every == 0 or done == last or done == 1
      is_closure_step = is_log or bool(activation and done % activation == 0)
      if is_closure_step or done in marks:  # step closures: log and activation steps; checkpoint closures
        self.compiled.run_closures(checkpoint=done in marks, step=is_closure_step)
      if is_log:
        m = jax.device_get(step_metrics)
        now = time.perf_counter()
        rate = (done - window_step) * task.batch_size / max(now - window_time, 1e-9)
        # since the run's first step, over training time only (train_and_eval's stretches together)
        global_rate = (self.summary.get("trained_samples", 0) + (done - start_step) * task.batch_size) / max(
          self.summary.get("trained_seconds", 0.0) + now - start_time, 1e-9
        )
        window_time, window_step = now, done
        loss = float(m["loss"])
        record = {"step": done, "loss": loss, "loss_scale": float(m["loss_scale"])}
        if "optimizer_step" in m:
          record["optimizer_step"] = int(m["optimizer_step"])
        record.update(skipped=bool(m["skipped"]), samples_per_sec=rate, avg_samples_per_sec=global_rate)
        line = (f"| Train Device={metrics.device}, Step={done}, Loss={loss:.5f}, Rate={rate:.2f} samples/sec, "
                f"GlobalRate={global_rate:.2f} samples/sec")  # fmt: skip
        with cluster.same_outcome():  # process 0 writes: its full disk stops every process
          metrics.write(record, line)
        losses.append((done, loss))
        logged_skips.append(record["skipped"])
        bar.update(done, loss, rate)
        if rc.check_loss_values and not math.isfinite(loss):  # modelzoo's check, on the fetched loss
          bar.close()
          raise ExecutorError(self._non_finite_loss(done, loss))
        if self.just_resumed is not None and done >= self.just_resumed[0] + _STEPS_AFTER_RESUME:
          self.just_resumed = None  # a finite loss logged after the resume: the checkpoint is not suspected
      elif (
        self.just_resumed is not None
        and rc.check_loss_values
        and done <= self.just_resumed[0] + _STEPS_AFTER_RESUME
      ):
        # the first steps after a resume run on the restored state as it is: their losses are read (a
        # device synchronisation each, once per resume), so a damaged checkpoint is named, not trained on
        loss = float(jax.device_get(step_metrics["loss"]))
        if not math.isfinite(loss):
          bar.close()
          raise ExecutorError(self._non_finite_loss(done, loss))
        if done >= self.just_resumed[0] + _STEPS_AFTER_RESUME:
          self.just_resumed = None  # the steps read after the resume were finite: not suspected later
      if done in marks:
        self.checkpoints.save(state, self._meta())
    bar.close()
    elapsed = time.perf_counter() - start_time
    samples = (done - start_step) * task.batch_size
    # train_and_eval trains in stretches between evaluations: the final line counts them all
    total_samples = self.summary.get("trained_samples", 0) + samples
    total_elapsed = self.summary.get("trained_seconds", 0.0) + elapsed
    self.summary.update(trained_samples=total_samples, trained_seconds=total_elapsed)
    if run_end is not None and done < run_end:
      self.say(
        f"Trained to step {done} of {run_end} ({samples} sample(s) in {elapsed:.2f} seconds); evaluating."
      )
    else:
      self.say(
        f"Training completed successfully! Processed {total_samples} sample(s) in {total_elapsed:.2f} seconds."
      )
    if not checkpoint_steps and done == (run_end or last):
      self.say(
        "Note: runconfig.checkpoint_steps is unset (or 0), so no checkpoint was written (as in modelzoo): the "
        "trained weights are not kept, and a rerun starts again from step 0. Set runconfig.checkpoint_steps "
        "(e.g. to max_steps) to keep them."
      )
    skipped_after = _skipped_steps(state)
    all_skipped = (
      skipped_after - skipped_before == done - start_step
      if skipped_before is not None and skipped_after is not None
      else bool(logged_skips) and all(logged_skips)
    )
    if all_skipped:
      self.say(self._all_skipped(start_step, done, skipped_before is None))
    elif skipped_before is not None and skipped_after is not None and skipped_after > skipped_before:
      self.say(
        f"Loss scaling skipped {skipped_after - skipped_before} of steps {start_step + 1}..{done} (gradients "
        f"not finite: weights, optimizer state and schedule held); {skipped_after} in the run so far."
      )
    self.summary.update(final_step=done, params=state.params)
    self.summary["losses"] = self.summary.get("losses", []) + losses
    return state

  def _non_finite_loss(self, step: int, loss: float) -> str:
    """The error of a NaN or infinite loss at ``step`` (``runconfig.check_loss_values``)."""
    steps = self.checkpoints.steps()
    if self.just_resumed is not None:  # one of the first steps after the resume: the checkpoint is suspect
      return self._damaged_resume(step, loss, steps)
    every = max(1, int(self.rc.log_steps or 1))
    if not steps:
      where = "no checkpoint was written before it (the rerun starts from step 0)"
    elif every > 1 and max(steps) > step - every:  # the loss is read at log steps only
      seen = f"step {step - every}" if step - every >= 1 else "none was logged before"
      where = (
        f"the newest checkpoint, step {max(steps)}, was written after the last loss seen finite "
        f"({seen}; the loss is read at log steps), so it may hold the diverged run: resume from an "
        "earlier one, or from step 0"
      )
    else:
      where = f"its newest checkpoint, step {max(steps)}, was written before it"
    return (
      f"Step {step}: the loss is {'NaN' if math.isnan(loss) else loss} (runconfig.check_loss_values is true: a "
      "NaN or infinite loss stops the run). Training diverged, or a batch holds NaN/Inf: lower "
      "optimizer.learning_rate (or warm it up), clip the gradients (optimizer.max_gradient_norm), "
      f"{'' if self._dynamic_scaling() else 'use dynamic loss scaling (optimizer.loss_scaling_factor: dynamic) or a smaller static one, '}"
      f"or check the input data; then rerun: {where}. runconfig.check_loss_values: false trains on regardless (a step whose "
      "gradients are not finite is then skipped)."
    )

  def _damaged_resume(self, step: int, loss: float, steps: list[int]) -> str:
    """The error of a non-finite loss at ``step`` soon after a resume (`_STEPS_AFTER_RESUME`)."""
    resumed, largest = self.just_resumed
    path = self.checkpoints.directory / str(resumed)
    try:
      value = float(jax.device_get(largest))
      held = (
        "its weights and optimizer state hold NaN or Inf"
        if not math.isfinite(value)
        else f"the largest |value| among its weights and optimizer state is {value:.3g}"
      )
    except Exception:  # noqa: BLE001 (the value only adds to the message)
      held = ""
    before = [s for s in steps if s < resumed]
    then = (
      f"it then resumes from the checkpoint of step {max(before)}, the one before"
      if before
      else "it then starts again from step 0 (no checkpoint before it)"
    )
    return (
      f"Step {step}: the loss is {'NaN' if math.isnan(loss) else loss}, {step - resumed} step"
      f"{'s' * (step - resumed != 1)} after the run resumed from the checkpoint of step {resumed} ({path}), "
      "before any finite loss was logged: that checkpoint may be damaged"
      f"{f' ({held})' if held else ''}: its files may have changed since it was written. Move it aside (to "
      f"{self.checkpoints.aside(resumed)}, where wafer keeps checkpoints it cannot read) and "
      f"rerun the same command: {then}. If the loss is not finite again from there, training diverged: lower "
      "optimizer.learning_rate, clip the gradients (optimizer.max_gradient_norm) or check the input data "
      "(runconfig.check_loss_values is true: a NaN or infinite loss stops the run)."
    )

  def _all_skipped(self, first: int, last: int, logged_only: bool) -> str:
    """The warning of a run (or stretch) whose every step was skipped (non-finite gradients)."""
    which = "every logged step" if logged_only else "every step"
    head = (
      f"Warning: {which} of steps {first + 1}..{last} was skipped: the gradients were not finite (NaN or "
      "Inf), so the weights, the optimizer state and the learning-rate schedule did not change."
    )
    if self._dynamic_scaling():
      return (
        f"{head} Dynamic loss scaling halves its scale at each skip, so the first steps of a run are skipped "
        "until the scale is small enough (from optimizer.initial_loss_scale): train longer, or start from a "
        "lower optimizer.initial_loss_scale. If it goes on, lower optimizer.learning_rate or check the input "
        "data for NaN/Inf."
      )
    return (
      f"{head} Lower optimizer.learning_rate, use dynamic loss scaling (optimizer.loss_scaling_factor: dynamic) "
      "or a smaller static loss scale, or check the input data for NaN/Inf."
    )

  def _dynamic_scaling(self) -> bool:
    """Whether the run's loss scale is dynamic (its advice then does not suggest turning it on)."""
    return isinstance(self.loss_scale, precision.DynamicLossScale)

  def _nothing_to_train(self, done: int) -> None:
    self.say(
      f"Nothing to train: model_dir already holds the checkpoint of step {done} (max_steps). Raise "
      "runconfig.max_steps to train further, or use another model_dir."
    )

  def _train_and_eval(self, init: TrainState) -> None:
    rc = self.rc
    freq = rc.eval_frequency
    if freq is None and rc.num_epochs is not None:  # modelzoo's rule: evaluate after every epoch
      freq = rc.steps_per_epoch or epoch_steps(self.data)
      if freq is None:  # num_train_steps' error: an epoch count needs a known epoch length
        rc.num_train_steps(0, None)
    if freq is None:
      raise ExecutorError(
        "runconfig.eval_frequency is unset: train_and_eval needs it (evaluate every N steps), or num_epochs "
        "(evaluate after every epoch)"
      )
    ckpt = rc.checkpoint_steps or 0
    if ckpt and freq % ckpt and ckpt % freq:
      raise ExecutorError(
        f"checkpoint_steps ({ckpt}) and frequency of evaluation steps ({freq}) must be multiples of each other."
      )
    if self.task.eval_data is not None:
      with cluster.same_outcome():  # eval data one process cannot read stops every process
        self.task.eval_data()  # build the eval data now, not in the middle of the training log
    state = self._resume(init)
    done = int(state.step)
    end = done + steps_to_run(rc, done, self.data)
    self.summary["evals"] = []
    if end == done:
      self._nothing_to_train(done)
    while done < end:
      target = min((done // freq + 1) * freq, end)  # multiples of freq from step 0: a resume evaluates alike
      state = self._train(state, target, ckpt, end)
      done = target
      self.summary["evals"].append((done, self._evaluate(state.params, done)))

  def _eval(self, init: TrainState) -> None:
    restored = self._restore_latest()
    if restored is None:  # removed since the run began (require_checkpoint checked at its start)
      require_checkpoint(self.rc)
      raise ExecutorError(f"no checkpoint in {self.model_dir / 'checkpoints'}")
    state = restored[0]
    self._note_changes(self._changes(restored[1]), int(state.step))
    step = int(state.step)
    self.summary["eval"] = self._evaluate(state.params, step)
    self.summary["eval_step"] = step

  def _eval_all(self) -> None:
    steps = self.checkpoints.agreed_steps()
    if not steps:  # removed since the run began (require_checkpoint checked at its start)
      require_checkpoint(self.rc)
      raise ExecutorError(f"no checkpoint in {self.model_dir / 'checkpoints'}")
    self.summary["eval_all"] = {}
    noted: list[str] = []
    for step in steps:
      try:
        state, meta = self.checkpoints.restore(step, self.template)
        changes = self._changes(meta)
        if changes != noted:  # said again only where it differs (a resume may have changed settings)
          self._note_changes(changes, step)
          noted = changes
      except UnreadableCheckpoint as why:  # say so, evaluate the others
        self.say(f"{self.checkpoints.unreadable(step, why)}; skipping it.")
        continue
      except CheckpointMismatch as error:
        with cluster.same_outcome():  # every process is here (agreed): one message
          raise ExecutorError(self._with_changes(str(error) + self._eval_hint(error), step)) from None
      self.summary["eval_all"][step] = self._evaluate(state.params, step)
    if not self.summary["eval_all"]:  # every one skipped (agreed): no evaluation is not a success
      raise ExecutorError(self.checkpoints.none_readable(steps))

  def _evaluate(self, params: Any, step: int) -> float:
    task, rc = self.task, self.rc
    if task.eval_data is None:
      raise ExecutorError(f"model {task.name!r} has no eval data (eval_input); eval modes need it")
    values = []
    for i, batch in enumerate(task.eval_data()):
      if rc.eval_steps is not None and i >= rc.eval_steps:
        break
      batch = cluster.global_batch(batch, self.num_csx)
      if self.eval_compiled is None:  # once per run, under the training policy and sharding
        self.eval_compiled = wafer.compile(
          make_eval_step(task, self.policy),
          params,
          batch,
          num_csx=self.num_csx,
          batch_argnums=self._batch_argnums(),
        )
      values.append(self.eval_compiled(params, batch))
    if not values:
      raise ExecutorError(
        "Iterating the eval data did not return any values: the dataset is too small for the batch size."
      )
    if rc.eval_steps is not None and len(values) < rc.eval_steps and not self.said_short_eval:
      self.said_short_eval = True  # once per run, not at every eval of train_and_eval / eval_all
      self.say(
        f"Warning: runconfig.eval_steps is {rc.eval_steps}, but the eval data has only {len(values)} batch"
        f"{'es' * (len(values) != 1)}: evaluated those {len(values)} (one pass over the eval data). Set "
        f"eval_steps to {len(values)} or less, or leave it unset (one pass), to evaluate what it says."
      )
    value = float(np.mean(jax.device_get(values)))
    name = task.eval_metric_name
    with cluster.same_outcome():  # process 0 writes: its full disk stops every process
      self.metrics.write(
        {"step": step, f"eval/{name}": value, **eval_marks(rc.mode, len(values))},
        f"Avg Eval {name.capitalize()}: {value:.5f} (step {step})",
      )
    return value


@jax.jit
def _largest_magnitude(tree: Any) -> jax.Array:
  """The largest |value| among the floating-point arrays of ``tree`` (0 when it has none; NaN if one is NaN)."""
  floats = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating) and x.size]
  return (
    jnp.max(jnp.stack([jnp.max(jnp.abs(x)).astype(jnp.float32) for x in floats]))
    if floats
    else jnp.float32(0)
  )


def _skipped_steps(state: TrainState) -> int | None:
  """The steps the loss scale has skipped so far (`precision.DynamicLossScale` counts them), or None."""
  count = getattr(state.loss_scale, "num_skipped_steps", None)
  return None if count is None else int(jax.device_get(count))


def _shapes_by_path(tree: Any) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
  """``{"['input_ids']": ((32, 128), int32), ...}``: each leaf's shape and dtype by its key path."""
  leaves = jax.tree_util.tree_leaves_with_path(tree)
  return {jax.tree_util.keystr(path): (tuple(np.shape(x)), np.dtype(x.dtype)) for path, x in leaves}


def _check_run_arguments(task: Any, runtime: Runtime) -> None:
  """`run`'s arguments have the types it reads (a wrong one failed later as a bare AttributeError)."""
  wrong = []
  if not isinstance(task, Task):
    wrong.append(f"task is {with_article(type(task).__name__)}; it must be a wafer.train.Task")
  elif not callable(task.train_data) or (
    _is_batch_source(task.train_data) and not isinstance(task.train_data, type)  # a class of the seed is fine
  ):
    wrong.append(
      f"Task.train_data is {with_article(type(task.train_data).__name__)}; {TRAIN_DATA_ALLOWED} (lambda seed: "
      "IndexedBatches(batch_of))"
    )
  if not isinstance(runtime.runconfig, RunConfig):
    wrong.append(
      f"runconfig is {with_article(type(runtime.runconfig).__name__)}; it must be a wafer.config.RunConfig "
      "(RunConfig.model_validate(a_dict) builds one)"
    )
  opt = runtime.optimizer
  if not (callable(getattr(opt, "init", None)) and callable(getattr(opt, "update", None))):
    wrong.append(
      f"optimizer is {with_article(type(opt).__name__)}; it must be an optax.GradientTransformation"
    )
  if not isinstance(runtime.loss_scale, (precision.StaticLossScale, precision.DynamicLossScale)):
    wrong.append(
      f"loss_scale is {runtime.loss_scale!r}; it must be a precision.DynamicLossScale.create(format) or a "
      "precision.StaticLossScale.create(value) (StaticLossScale.create(1.0): no scaling)"
    )
  if not isinstance(runtime.policy, precision.Policy):
    wrong.append(
      f"policy is {runtime.policy!r}; it must be a precision.Policy (precision.Policy.parse('c=cb16') "
      "reads a policy string)"
    )
  if wrong:
    raise TypeError("wafer.train.run: " + "; ".join(wrong))


def _check_precision_level(runconfig: RunConfig, policy: precision.Policy) -> None:
  """Refuse a ``runconfig.precision_opt_level`` set explicitly (``model_fields_set``) that differs from
  the mixed-precision ``policy``'s level: the step compiles at the policy's level, so the runconfig's
  was silently ignored. Left unset, the policy's level holds (the default 1 is not a choice); a
  float32 policy rounds nothing at any level. ``wafer run`` builds its policy from the runconfig
  (`wafer.config.Params.policy`), so the two always agree there.

  Raises:
    ExecutorError: both levels, and how to make them agree.
  """
  level = runconfig.precision_opt_level
  if "precision_opt_level" not in runconfig.model_fields_set or not policy.is_mixed or level == policy.level:
    return
  raise ExecutorError(
    f"wafer.train.run: runconfig.precision_opt_level is {level} but the policy ({policy}) is at level "
    f"{policy.level}; the step compiles at the policy's level, so the runconfig's would be ignored. Fix: "
    f"make them agree (precision.Policy(..., level={level}), or precision.Policy.from_config(..., "
    "precision_opt_level=runconfig.precision_opt_level)), or leave precision_opt_level out of the RunConfig."
  )


TRAIN_DATA_ALLOWED = (
  "it must be a function of the seed returning a wafer.train.BatchSource (next(), get_state(), set_state()), "
  "e.g. wafer.train.IndexedBatches(lambda k: batches[k % len(batches)]) over a list of batches"
)
"""What `Task.train_data` may be, said by the errors of a wrong one."""


def _is_batch_source(data: Any) -> bool:
  """``data`` has what the loop reads of a `BatchSource`: ``next()``, ``get_state()`` and ``set_state()``."""
  return all(callable(getattr(data, name, None)) for name in ("__next__", "get_state", "set_state"))


def _local_rows(global_rows: int, num_csx: int) -> int:
  """This process's share of ``global_rows``: the rows of its systems (`cluster.local_systems`)."""
  return global_rows * len(cluster.local_systems(num_csx)) // num_csx


def _check_batch_rows(batch: Any, rows: int) -> None:
  """Every array of a training batch has ``rows`` rows (axis 0), ``Task.batch_size`` of them: the
  logged sample counts and rates and the compile report's batch are computed from it."""
  leaves = jax.tree_util.tree_leaves_with_path(batch)
  wrong = [
    f"{jax.tree_util.keystr(path) or 'the batch'} has shape {list(np.shape(x))}"
    for path, x in leaves
    if np.ndim(x) == 0 or np.shape(x)[0] != rows
  ]
  if wrong or not leaves:
    raise ExecutorError(
      f"Task.batch_size is {rows} here, but the first training batch "
      + ("; ".join(wrong) if leaves else "holds no arrays")
      + f": every array of a batch has the batch as axis 0, {rows} rows. Set Task.batch_size to the "
      "rows the data gives (train_input.batch_size in a params file), or make the data give that many."
    )


def _check_batch_spec(batch: Any, spec: Any, local_rows: bool, num_csx: int) -> None:
  """The data's batch has the shapes the config declares (what ``--validate_only`` traced), or an error."""
  have, want = _shapes_by_path(batch), _shapes_by_path(spec)
  if local_rows:  # this process's rows only
    want = {k: ((_local_rows(s[0], num_csx), *s[1:]), d) for k, (s, d) in want.items()}
  wrong = [
    f"{k}: the data has {list(have[k][0]) if k in have else 'nothing'} {have[k][1] if k in have else ''}, "
    f"the config says {list(s)} {d}"
    for k, (s, d) in want.items()
    if have.get(k) != (s, d)
  ] + [f"{k}: in the data, not declared by the config" for k in have if k not in want]
  if wrong:
    raise ExecutorError(
      "train_input: the batches of the data do not have the shapes its settings declare ("
      + "; ".join(wrong)
      + "). --validate_only checks the declared shapes, so they must agree: set the input section's sizes "
      "(max_sequence_length, max_predictions_per_seq, batch_size) to what the data holds."
    )


def _write_compile_report(
  step_fn, state, batch, task, num_csx, policy, model_dir, summary, params=None, scaling="traced"
) -> None:
  """The cost model's estimate of the train step in the run's compute format (the policy's), saved; the
  params file's micro_batch_size and release as given (`wafer.costmodel.estimate.run_inputs`)."""
  from wafer.costmodel.estimate import run_inputs

  try:
    report = wafer.estimate(
      step_fn,
      state,
      batch,
      batch_argnums=(1,),  # the state (parameters, optimizer state) is never data
      batch_size=task.batch_size,
      num_csx=num_csx,
      policy=policy,
      scaling=scaling,
      **run_inputs(params),
    )
  except Exception as error:  # the cost model must not stop a run; say why it is missing
    print(f"note: no compile report ({type(error).__name__}: {error})", flush=True)
    return
  try:
    report.save(model_dir)
  except OSError as error:  # a full or read-only model_dir: say so now, before any step is trained
    raise ExecutorError(
      f"cannot write the compile report into model_dir {model_dir} ({error.strerror or error}); checkpoints "
      "could not be saved either: free space there, or give another --model_dir"
    ) from None
  summary["compile_report"] = str(model_dir / "compile_report.txt")
  mode = report.mode.replace("_", " ")  # "pipeline", "weight streaming"
  where = f"see {model_dir / 'compile_report.txt'}"
  if not report.fits:  # no rate, not "0 samples/s"
    print(f"Estimate: does not fit on the wafer in {mode} (release {report.release}): {report.reason}; "
          f"would fit: {report.remedy}; {where}", flush=True)  # fmt: skip
    return
  summary["samples_per_sec_estimate"] = float(report.samples_per_sec)
  seq, source = report.details.get("sequence_length"), report.details.get("sequence_source") or ""
  of = ""
  if seq and "not set" in source:  # a length the file does not state: the reader sees it was assumed
    of = f" of {seq:,}-token sequences ({source}: the data's own length decides it; set it to that)"
  print(f"Estimated {report.samples_per_sec:,.1f} samples/s{of} on the wafer ({mode}, release "
        f"{report.release}); {where}", flush=True)  # fmt: skip
