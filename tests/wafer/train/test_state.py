"""One train state: one step counter, the data position inside it, (state, metrics) steps, donation."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import precision
import wafer
from models.mlp import example_run, example_task
from wafer.optim import scale_by_adam
from wafer.train import (
  Checkpoints,
  IndexedBatches,
  Task,
  initial_state,
  make_train_step,
  run,
  schedule_counts,
)


def _skipping_run(model_dir, max_steps=30, optimizer=None):
  """The example with a DLS scale far too large: the first steps overflow float32 and are skipped."""
  task, runconfig, _, _, _ = example_run(
    str(model_dir), max_steps=max_steps, checkpoint_steps=10, log_steps=1
  )
  optimizer = optimizer or optax.sgd(optax.linear_schedule(0.05, 0.0, 100), momentum=0.9)
  loss_scale = precision.DynamicLossScale.create(
    "cbfloat16", initial_loss_scale=2.0**40, max_loss_scale=2.0**40, steps_per_increase=1000
  )
  policy = precision.Policy(compute="cbfloat16", level=1)
  return run(task, runconfig, optimizer, loss_scale, policy, progress=False), (task, optimizer, loss_scale)


def test_one_step_counter_the_schedule_optimizer_and_checkpoint_agree_on(tmp_path, capsys):
  summary, (task, optimizer, loss_scale) = _skipping_run(tmp_path)
  records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  skipped = [r["skipped"] for r in records]
  # the run says how many steps loss scaling skipped (log_steps > 1 would hide them)
  assert f"Loss scaling skipped {sum(skipped)} of steps 1..30" in capsys.readouterr().out
  assert [r["step"] for r in records] == list(range(1, 31)) and 0 < sum(skipped) < 30  # some steps skipped
  # the schedule's t a step uses: steps done before it minus the skipped ones (held on a skip, docs/references.md)
  assert [r["optimizer_step"] for r in records] == [i - sum(skipped[:i]) for i in range(30)]
  checkpoints = Checkpoints(tmp_path, None)
  try:
    like = initial_state(task, optimizer, loss_scale, jax.random.key(0))
    for number in (10, 20, 30):
      state, meta = checkpoints.restore(number, like)
      assert int(state.step) == number  # the checkpoint's number is the state's step
      assert int(state.data_position) == number  # the data position is in the state ...
      assert "next_batch" not in json.dumps(meta)  # ... not in JSON metadata beside it
      counts = [int(c) for c in schedule_counts(state.opt_state)]
      assert counts == [number - int(state.loss_scale.num_skipped_steps)]
      assert counts[0] == number - sum(skipped[:number])
  finally:
    checkpoints.close()
  assert summary["final_step"] == 30


def test_step_returns_state_and_metrics_without_host_callbacks():
  task, optimizer = example_task(), optax.sgd(optax.linear_schedule(0.1, 0.0, 50))
  loss_scale, policy = precision.DynamicLossScale.create("cbfloat16"), precision.Policy(compute="cbfloat16")
  state = initial_state(task, optimizer, loss_scale, jax.random.key(0))
  batch = next(task.train_data(1))
  compiled = wafer.compile(make_train_step(task, optimizer, policy), state, batch, donate_argnums=(0,))
  assert not compiled.has_closures  # metrics come back as outputs, not through a module-level record
  old_leaves = jax.tree.leaves(state)
  new, metrics = compiled(state, batch)
  assert all(leaf.is_deleted() for leaf in old_leaves)  # the state was donated
  assert set(metrics) == {"loss", "loss_scale", "skipped", "optimizer_step"}
  assert int(new.step) == 1 and int(new.data_position) == 1 and int(metrics["optimizer_step"]) == 0
  assert np.isfinite(float(metrics["loss"]))


def test_metrics_are_fetched_only_at_log_steps_and_the_state_is_donated(tmp_path, monkeypatch):
  fetched, compiles = [], []
  real_get, real_compile = jax.device_get, wafer.compile

  def counting_get(x):
    if isinstance(x, dict) and "loss" in x:
      fetched.append(x)
    return real_get(x)

  def recording_compile(*args, **kwargs):
    compiles.append(kwargs)
    return real_compile(*args, **kwargs)

  monkeypatch.setattr(jax, "device_get", counting_get)
  monkeypatch.setattr(wafer, "compile", recording_compile)
  run(*example_run(str(tmp_path), max_steps=25, log_steps=10, checkpoint_steps=0), progress=False)
  assert len(fetched) == 4  # steps 1, 10, 20 and 25
  assert compiles[0]["donate_argnums"] == (0,)


def test_adams_step_counter_agrees_with_the_schedule_and_the_checkpoint(tmp_path):
  """Adam keeps its own bias-correction ``count`` beside the schedule's: both are the state's step minus skips."""
  adam = optax.chain(scale_by_adam(), optax.scale_by_learning_rate(optax.linear_schedule(1e-3, 0.0, 100)))
  summary, (task, optimizer, loss_scale) = _skipping_run(tmp_path, max_steps=20, optimizer=adam)
  skipped = [r["skipped"] for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())]
  assert 0 < sum(skipped) < 20
  checkpoints = Checkpoints(tmp_path, None)
  try:
    like = initial_state(task, optimizer, loss_scale, jax.random.key(0))
    for number in (10, 20):
      state, _ = checkpoints.restore(number, like)
      counts = [int(c) for c in schedule_counts(state.opt_state)]
      assert len(counts) == 2  # Adam's and the schedule's
      assert int(state.step) == number
      assert counts == [number - sum(skipped[:number])] * 2
  finally:
    checkpoints.close()
  assert summary["final_step"] == 20


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_16_bit_parameters_train_through_the_compiled_step(dtype):
  """Unscaled float32 gradients made the momentum state of 16-bit parameters float32, so the compiled
  step refused its own state on the second call (StaticGraphError: ``trace['w'] is float32[4, 1]; the
  compiled step takes bfloat16[4, 1]``). The gradients are now cast to the parameters' dtypes."""

  def batch(k):
    x = jax.random.normal(jax.random.key(k), (8, 4))
    return {"x": x, "y": x.sum(1, keepdims=True)}

  task = Task(
    name="lin16",
    init_params=lambda key: {"w": jax.random.normal(key, (4, 1)).astype(dtype)},
    loss_fn=lambda p, b: jnp.mean((b["x"] @ p["w"].astype(jnp.float32) - b["y"]) ** 2),
    train_data=lambda seed: IndexedBatches(batch),
    batch_size=8,
  )
  optimizer = optax.sgd(0.1, momentum=0.9)
  loss_scale = precision.DynamicLossScale.create("float16")
  state = initial_state(task, optimizer, loss_scale, jax.random.key(0))
  dtypes = [x.dtype for x in jax.tree.leaves((state.params, state.opt_state))]
  step = make_train_step(task, optimizer, precision.Policy(compute="float16"))
  compiled = wafer.compile(step, state, batch(0), donate_argnums=(0,))
  losses = []
  for k in range(4):
    state, metrics = compiled(state, batch(k))
    losses.append(float(metrics["loss"]))
  assert [x.dtype for x in jax.tree.leaves((state.params, state.opt_state))] == dtypes
  assert int(state.step) == 4 and losses[-1] < losses[0]
