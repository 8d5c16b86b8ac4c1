"""The run loop: train / eval / train_and_eval / eval_all on one compiled step, with checkpoints.

`run(task, settings, optimizer, loss_scale, policy)` compiles the train step once
(`wafer.compile`), restores the latest checkpoint in ``model_dir`` if there is one, and runs:

* iterations ``0 .. num_steps-1`` (1-based "steps" in logs): ``num_steps`` and ``max_steps``
  follow Cerebras (``max_steps`` counts from step 0, so a resumed run does the remainder);
* a log line, a ``metrics.jsonl`` record and TensorBoard scalars at every ``log_steps``-th step,
  the final one, and step 1 of a run that starts from scratch (the initial loss is on record), from values fetched by a step closure; the step closures (the model's own
  too) run at those steps and at every ``activation_steps``-th step, and checkpoint closures at
  checkpoint steps: the device is never synchronised on other steps;
* a checkpoint (orbax; atomic) at steps N, 2N, ... and the final step, holding the parameters,
  optimizer state, loss-scale state, optimizer step and the data iterator's position.

The data source yields batches for consecutive steps and reports its position; a restart
continues from the saved position, so a run killed at any moment and restarted ends with the
same parameters, bit for bit, as one that was never interrupted.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
import optax

import precision
import wafer
from wafer import cluster
from wafer.closures import add_step_closure
from wafer.errors import WaferError


class ExecutorError(WaferError, ValueError):
  """Settings or state that the executor cannot run with; the message says what to change."""


class BatchSource(Protocol):
  """Batches for consecutive steps; its position survives a restart."""

  def __next__(self) -> Any: ...

  def get_state(self) -> dict[str, Any]: ...

  def set_state(self, state: dict[str, Any]) -> None: ...


@dataclasses.dataclass
class Task:
  """What to train and evaluate.

  Attributes:
    name: shown in logs and reports.
    init_params: ``key -> params`` (float32 pytree).
    loss_fn: ``(params, batch) -> float32 scalar``, written in float32 (autocast applies the policy).
    train_data: ``seed -> BatchSource`` of fixed-size training batches, repeating forever.
    eval_data: ``() -> iterable of batches`` (one pass), or None.
    eval_metric: ``(params, batch) -> float32 scalar`` averaged over eval batches (default: the loss).
    eval_metric_name: its name in logs and metrics (``loss``, ``accuracy``, ``perplexity``...).
    batch_size: global batch size (samples per step).
  """

  name: str
  init_params: Callable[[jax.Array], Any]
  loss_fn: Callable[[Any, Any], jax.Array]
  train_data: Callable[[int], BatchSource]
  batch_size: int
  eval_data: Callable[[], Any] | None = None
  eval_metric: Callable[[Any, Any], jax.Array] | None = None
  eval_metric_name: str = "loss"


@dataclasses.dataclass
class RunSettings:
  """The runconfig keys the executor reads (see ``cerebras.md`` section 6)."""

  mode: str = "train"
  model_dir: str = "model_dir"
  num_steps: int | None = None
  max_steps: int | None = None
  log_steps: int = 1
  checkpoint_steps: int = 0
  activation_steps: int | None = None
  eval_steps: int | None = None
  eval_frequency: int | None = None
  seed: int = 1
  num_csx: int = 1
  num_workers_per_csx: int = 0
  compile_only: bool = False
  validate_only: bool = False
  max_checkpoints: int | None = None
  progress: bool = True


MODES = ("train", "eval", "train_and_eval", "eval_all")


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainState:
  params: Any
  opt_state: Any
  loss_scale: Any
  step: jax.Array  # int32 optimizer step: the schedule's t; held on skipped steps


def initial_state(
  task: Task, optimizer: optax.GradientTransformation, loss_scale: Any, key: jax.Array
) -> TrainState:
  """Step 0: ``task.init_params(key)``, the optimizer's initial state, ``loss_scale``, step 0 (int32)."""
  params = task.init_params(key)
  return TrainState(params, optimizer.init(params), loss_scale, jnp.asarray(0, jnp.int32))


def make_train_step(
  task: Task, optimizer: optax.GradientTransformation, policy: precision.Policy
) -> Callable:
  """The step: scaled loss -> gradients (autocast) -> unscale -> skip-or-update -> DLS adjust."""
  loss_fn = precision.autocast(task.loss_fn, policy) if policy.is_mixed else task.loss_fn

  def train_step(state: TrainState, batch: Any) -> tuple[TrainState, jax.Array]:
    ls = state.loss_scale
    scaled, grads = jax.value_and_grad(lambda p: ls.scale(loss_fn(p, batch)))(state.params)
    grads = ls.unscale(grads)
    finite = precision.all_finite(grads)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    params, opt_state, step = precision.select_tree(
      finite, (params, opt_state, state.step + 1), (state.params, state.opt_state, state.step)
    )
    loss = scaled / ls.loss_scale
    add_step_closure(_record, (loss, ls.loss_scale, state.step, finite))
    return TrainState(params, opt_state, ls.adjust(finite), step), loss

  return train_step


_RECORDS: list[dict[str, Any]] = []


def _record(loss: Any, loss_scale: Any, step: Any, finite: Any) -> None:
  _RECORDS.append(
    {"loss": float(loss), "loss_scale": float(loss_scale), "opt_step": int(step), "finite": bool(finite)}
  )


def total_steps(settings: RunSettings, initial_step: int) -> int:
  """Steps this run performs: ``min(num_steps, max_steps - initial_step)`` (Cerebras' rule)."""
  candidates = []
  if settings.num_steps is not None:
    candidates.append(settings.num_steps)
  if settings.max_steps is not None:
    if initial_step > settings.max_steps:
      raise ExecutorError(
        f"Initial global step {initial_step} already exceeds max step {settings.max_steps}."
      )
    candidates.append(settings.max_steps - initial_step)
  if not candidates:
    raise ExecutorError("One of num_epochs, num_steps, or max_steps must be provided (runconfig).")
  steps = min(candidates)
  if steps < 0:
    raise ExecutorError(f"Expected num_steps >= 1, but got {steps}.")
  return steps


def checkpoint_iterations(checkpoint_steps: int, first: int, last: int) -> set[int]:
  """1-based steps in ``(first, last]`` that checkpoint: multiples of N, and always ``last``."""
  if checkpoint_steps <= 0:
    return set()
  marks = {s for s in range(first + 1, last + 1) if s % checkpoint_steps == 0}
  return marks | {last} if last > first else marks


class _Checkpoints:
  def __init__(self, model_dir: Path, max_to_keep: int | None):
    import orbax.checkpoint as ocp

    self._ocp = ocp
    self.manager = ocp.CheckpointManager(
      model_dir.resolve() / "checkpoints",
      options=ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep, enable_async_checkpointing=False, create=True
      ),
      item_handlers={"state": ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()},
    )

  def steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def close(self) -> None:
    """Finish pending work and stop orbax's threads (a run that fails mid-restore leaves none behind)."""
    self.manager.close()

  def save(self, step: int, state: TrainState, meta: dict[str, Any]) -> None:
    ocp = self._ocp
    self.manager.save(
      step,
      args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
      force=True,
    )
    self.manager.wait_until_finished()

  def restore(self, step: int, like: TrainState) -> tuple[TrainState, dict[str, Any]]:
    ocp = self._ocp
    mismatch = _shape_mismatch(self.manager.item_metadata(step)["state"], like)
    if mismatch is not None:  # checked before orbax starts reading: a failed read leaves its threads behind
      raise ExecutorError(
        f"The checkpoint of step {step} in {self.manager.directory} does not fit this model: {mismatch}. The "
        "model keys (sizes, vocab_size, layers) and the optimizer must be the ones the checkpoint was written "
        "with; restore them, or use a new model_dir."
      )
    restored = self.manager.restore(
      step, args=ocp.args.Composite(state=ocp.args.StandardRestore(like), meta=ocp.args.JsonRestore())
    )
    return restored.state, restored.meta


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
  if sorted(have.values()) != sorted(want.values()):  # paths spelled differently: compare the shapes
    return f"the checkpoint holds {len(have)} arrays, the model's state {len(want)}, with different shapes"
  return None


class _Metrics:
  """metrics.jsonl + TensorBoard + Cerebras-style log lines."""

  def __init__(self, model_dir: Path, device: str):
    self.path = model_dir / "metrics.jsonl"
    self.device = device
    try:
      from tensorboardX import SummaryWriter

      self.writer = SummaryWriter(str(model_dir / "tensorboard"))
    except ImportError:  # pragma: no cover - tensorboardX is a dependency
      self.writer = None

  def write(self, record: dict[str, Any], line: str) -> None:
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


def run(
  task: Task,
  settings: RunSettings,
  optimizer: optax.GradientTransformation,
  loss_scale: Any,
  policy: precision.Policy,
) -> dict[str, Any]:
  """Run ``settings.mode``; returns a summary (final step, losses, eval metric, paths)."""
  if settings.mode not in MODES:
    raise ExecutorError(f"mode={settings.mode!r}; allowed: {', '.join(MODES)}")
  cluster.lock_cluster(settings.num_csx, settings.num_workers_per_csx)
  if task.batch_size % settings.num_csx:
    raise ExecutorError(
      f"batch_size {task.batch_size} is not divisible by num_csx={settings.num_csx}: batch_size is the global "
      "batch, split evenly across systems."
    )
  model_dir = Path(settings.model_dir)
  model_dir.mkdir(parents=True, exist_ok=True)
  wafer.enable_compilation_cache(model_dir / "compile_cache")
  key = jax.random.key(settings.seed)
  init = initial_state(task, optimizer, loss_scale, key)
  print(f"Preparing the training data of {task.name}...", flush=True)
  t0 = time.perf_counter()
  data = task.train_data(settings.seed)
  start = data.get_state()
  example_batch = next(data)  # the compile's example; then rewind, so the data is built once
  data.set_state(start)
  step_fn = make_train_step(task, optimizer, policy)
  batch_arg = (1,) if settings.num_csx > 1 else ()
  t1 = time.perf_counter()
  print(f"Data ready in {t1 - t0:.1f} s. Compiling the train step ({policy})...", flush=True)
  compiled = wafer.compile(
      step_fn, init, example_batch, num_csx=settings.num_csx, batch_argnums=batch_arg,
      validate_only=settings.validate_only,
  )  # fmt: skip
  print(f"Compiled in {time.perf_counter() - t1:.1f} s.", flush=True)
  summary: dict[str, Any] = {
    "model_dir": str(model_dir),
    "task": task.name,
    "eval_metric": task.eval_metric_name,
  }
  _write_compile_report(step_fn, init, example_batch, task, settings, model_dir, summary)
  if settings.validate_only or settings.compile_only:
    print(f"{'Validation' if settings.validate_only else 'Compile'} completed successfully ({task.name}).")
    return summary
  checkpoints = _Checkpoints(model_dir, settings.max_checkpoints)
  metrics = _Metrics(model_dir, jax.devices()[0].platform.upper())
  try:
    if settings.mode == "train":
      _train(task, settings, compiled, init, data, checkpoints, metrics, summary)
    elif settings.mode == "eval":
      state, step = _latest(checkpoints, init)
      if not checkpoints.steps():
        print(
          f"Warning: no checkpoint in {model_dir / 'checkpoints'}: evaluating the initial (untrained) weights.",
          flush=True,
        )
      summary["eval"] = _evaluate(task, settings, state.params, step, metrics)
      summary["eval_step"] = step
    elif settings.mode == "eval_all":
      steps = checkpoints.steps()
      if not steps:
        raise ExecutorError(
          "No checkpoints were found for evaluation. Please ensure that the model directory "
          f'"{model_dir}" contains at least one valid checkpoint.'
        )
      summary["eval_all"] = {}
      for step in steps:
        state, _ = checkpoints.restore(step, init)
        summary["eval_all"][step] = _evaluate(task, settings, state.params, step, metrics)
    else:
      if task.eval_data is not None:
        task.eval_data()  # build the eval data now, not in the middle of the training log
      _train_and_eval(task, settings, compiled, init, data, checkpoints, metrics, summary)
  finally:
    metrics.close()
    checkpoints.close()
  return summary


def _latest(checkpoints: _Checkpoints, init: TrainState) -> tuple[TrainState, int]:
  steps = checkpoints.steps()
  if not steps:
    return init, 0
  state, meta = checkpoints.restore(steps[-1], init)
  return state, int(meta["iteration"])


def _train(
  task, settings, compiled, init, data, checkpoints, metrics, summary, resumed=None, run_end=None
) -> TrainState:
  """Train from the latest checkpoint (or ``init``); ``resumed=(state, step)`` continues in-process.

  ``run_end``: the last step of the whole run when this is one segment of train_and_eval.
  """
  state, done = init, 0
  if resumed is not None:
    state, done = resumed
  elif checkpoints.steps():
    state, meta = checkpoints.restore(checkpoints.steps()[-1], init)
    done = int(meta["iteration"])
    try:
      data.set_state(meta["data"])
    except ValueError as error:
      raise ExecutorError(
        f"Cannot resume from the checkpoint of step {done}: {error}. Batch k of a run depends on the batch "
        "size, the number of input workers (num_workers_per_csx x num_csx; workers shard the data), the "
        "shuffle settings and the data; restore the settings the checkpoint was written with, or use a new "
        "model_dir."
      ) from error
    print(f"Resuming from the checkpoint at step {done}.", flush=True)
  last = done + total_steps(settings, done)
  if last == done:
    _nothing_to_train(done)
    summary.update(final_step=done, params=state.params)
    summary.setdefault("losses", [])
    return state
  marks = checkpoint_iterations(settings.checkpoint_steps, done, last)
  log_every = max(1, settings.log_steps)
  progress = _Progress(settings.progress and sys.stderr.isatty(), done, last)
  start_time, start_step = time.perf_counter(), done
  window_time, window_step = start_time, done
  losses = []
  while done < last:
    batch = next(data)
    state, _ = compiled(state, batch)
    done += 1
    is_log = done % log_every == 0 or done == last or (done == 1 and resumed is None)
    if is_log or (settings.activation_steps and done % settings.activation_steps == 0):
      _RECORDS.clear()
      compiled.run_closures(checkpoint=done in marks)  # step closures: log and activation steps
    if is_log:
      rec = _RECORDS[-1]
      now = time.perf_counter()
      rate = (done - window_step) * task.batch_size / max(now - window_time, 1e-9)
      global_rate = (done - start_step) * task.batch_size / max(now - start_time, 1e-9)
      window_time, window_step = now, done
      record = {"step": done, "loss": rec["loss"], "loss_scale": rec["loss_scale"], "optimizer_step": rec["opt_step"],
                "skipped": not rec["finite"], "samples_per_sec": rate, "avg_samples_per_sec": global_rate}  # fmt: skip
      line = (f"| Train Device={metrics.device}, Step={done}, Loss={rec['loss']:.5f}, Rate={rate:.2f} samples/sec, "
              f"GlobalRate={global_rate:.2f} samples/sec")  # fmt: skip
      metrics.write(record, line)
      losses.append((done, rec["loss"]))
      progress.update(done, rec["loss"], rate)
    if done in marks:
      checkpoints.save(done, state, {"iteration": done, "data": data.get_state()})
  progress.close()
  elapsed = time.perf_counter() - start_time
  samples = (done - start_step) * task.batch_size
  if run_end is not None and done < run_end:
    print(
      f"Trained to step {done} of {run_end} ({samples} sample(s) in {elapsed:.2f} seconds); evaluating.",
      flush=True,
    )
  else:
    print(
      f"Training completed successfully! Processed {samples} sample(s) in {elapsed:.2f} seconds.", flush=True
    )
  summary.update(final_step=done, params=state.params)
  summary["losses"] = summary.get("losses", []) + losses
  return state


def _nothing_to_train(done: int) -> None:
  print(
    f"Nothing to train: model_dir already holds the checkpoint of step {done} (max_steps). Raise "
    "runconfig.max_steps to train further, or use another model_dir.",
    flush=True,
  )


def _train_and_eval(task, settings, compiled, init, data, checkpoints, metrics, summary) -> None:
  freq = settings.eval_frequency
  if not isinstance(freq, int) or freq <= 0:
    raise ExecutorError(f"`eval_frequency` must be a positive integer, got {freq}")
  if settings.checkpoint_steps and freq % settings.checkpoint_steps and settings.checkpoint_steps % freq:
    raise ExecutorError(
      f"checkpoint_steps ({settings.checkpoint_steps}) and frequency of evaluation steps ({freq}) must be "
      "multiples of each other."
    )
  _, done = _latest(checkpoints, init)
  end = done + total_steps(settings, done)
  summary["evals"] = []
  if end == done:
    _nothing_to_train(done)
  resumed = None
  while done < end:
    target = min(done + freq, end)
    eval_settings = dataclasses.replace(
      settings, num_steps=target - done, checkpoint_steps=settings.checkpoint_steps or freq
    )
    state = _train(task, eval_settings, compiled, init, data, checkpoints, metrics, summary, resumed, end)
    done = target
    resumed = (state, done)
    summary["evals"].append((done, _evaluate(task, settings, state.params, done, metrics)))


def _evaluate(task: Task, settings: RunSettings, params: Any, step: int, metrics: _Metrics) -> float:
  if task.eval_data is None:
    raise ExecutorError(f"model {task.name!r} has no eval data (eval_input); eval modes need it")
  metric = task.eval_metric or task.loss_fn
  evaluate = jax.jit(metric)
  values = []
  for i, batch in enumerate(task.eval_data()):
    if settings.eval_steps is not None and i >= settings.eval_steps:
      break
    values.append(evaluate(params, batch))
  if not values:
    raise ExecutorError(
      "Iterating the eval data did not return any values: the dataset is too small for the batch size."
    )
  value = float(np.mean(jax.device_get(values)))
  name = task.eval_metric_name
  metrics.write(
    {"step": step, f"eval/{name}": value}, f"Avg Eval {name.capitalize()}: {value:.5f} (step {step})"
  )
  return value


def _write_compile_report(step_fn, state, batch, task, settings, model_dir, summary) -> None:
  try:
    report = wafer.estimate(step_fn, state, batch, batch_size=task.batch_size, num_csx=settings.num_csx)
  except Exception as error:  # the cost model must not stop a run; say why it is missing
    print(f"note: no compile report ({type(error).__name__}: {error})", flush=True)
    return
  report.save(model_dir)
  summary["compile_report"] = str(model_dir / "compile_report.txt")
  print(f"Estimated {report.samples_per_sec:,.1f} samples/s on the wafer ({report.mode}); "
        f"see {model_dir / 'compile_report.txt'}", flush=True)  # fmt: skip


class _Progress:
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


class IndexedBatches:
  """A `BatchSource` from ``batch_of(step)``: its state is the next step, so resuming is exact."""

  def __init__(self, batch_of: Callable[[int], Any]):
    self.batch_of = batch_of
    self.next_step = 0

  def __iter__(self) -> Iterator[Any]:
    return self

  def __next__(self) -> Any:
    batch = self.batch_of(self.next_step)
    self.next_step += 1
    return batch

  def get_state(self) -> dict[str, Any]:
    return {"next_step": self.next_step}

  def set_state(self, state: dict[str, Any]) -> None:
    self.next_step = int(state["next_step"])
