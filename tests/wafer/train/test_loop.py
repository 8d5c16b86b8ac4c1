"""The run loop: counters, metrics, checkpoints, resume (also after SIGKILL), modes, errors."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import precision
from models.mlp import example_run
from tests.devices import needs_devices
from tests.processes import child_env
from wafer.config import ConfigError, RunConfig
from wafer.train import ExecutorError, IndexedBatches, Task, checkpoint_iterations, run, steps_to_run

ROOT = Path(__file__).resolve().parents[3]


def _run(model_dir, **overrides):
  return run(*example_run(str(model_dir), **overrides), progress=False)


def _records(model_dir):
  return [json.loads(line) for line in (Path(model_dir) / "metrics.jsonl").read_text().splitlines()]


def _same_params(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_counters():
  assert steps_to_run(RunConfig(num_steps=10), 0) == 10
  assert steps_to_run(RunConfig(max_steps=10), 4) == 6
  assert steps_to_run(RunConfig(num_steps=10, max_steps=12), 4) == 8
  assert checkpoint_iterations(4, 0, 10) == {4, 8, 10}
  assert checkpoint_iterations(4, 8, 10) == {10}
  assert checkpoint_iterations(0, 0, 10) == set()
  with pytest.raises(ConfigError, match="One of num_epochs, num_steps, or max_steps must be provided"):
    steps_to_run(RunConfig(), 0)
  with pytest.raises(ConfigError, match="Initial global step 12 already exceeds max step 10"):
    steps_to_run(RunConfig(max_steps=10), 12)
  assert steps_to_run(RunConfig(max_steps=10), 10) == 0  # a finished run: nothing to do


def test_train_writes_metrics_checkpoints_and_the_loss_falls(tmp_path, capsys):
  summary = _run(tmp_path, max_steps=60, log_steps=10, checkpoint_steps=25)
  records = _records(tmp_path)
  assert [r["step"] for r in records] == [1, 10, 20, 30, 40, 50, 60]  # step 1 of a fresh run, then every 10
  assert all({"step", "loss", "loss_scale", "samples_per_sec"} <= set(r) for r in records)
  assert records[-1]["loss"] < 0.7 * records[0]["loss"]
  assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()) == [25, 50, 60]
  assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
  assert (tmp_path / "compile_report.txt").read_text().startswith("Estimated Overall Performance")
  out = capsys.readouterr().out
  device = jax.devices()[0].platform.upper()  # CPU, or GPU under JAX_PLATFORMS=cuda,cpu
  assert f"| Train Device={device}, Step=60, Loss=" in out and "samples/sec, GlobalRate=" in out
  assert "Training completed successfully!" in out
  assert summary["final_step"] == 60


def test_resume_continues_bit_for_bit(tmp_path, capsys):
  whole = _run(tmp_path / "whole", max_steps=40, checkpoint_steps=10, log_steps=10)
  _run(tmp_path / "parts", max_steps=25, checkpoint_steps=10, log_steps=5)
  resumed = _run(tmp_path / "parts", max_steps=40, checkpoint_steps=10, log_steps=10)
  assert resumed["final_step"] == 40
  _same_params(resumed["params"], whole["params"])
  again = _run(tmp_path / "parts", max_steps=40, checkpoint_steps=10, log_steps=10)  # already done
  assert again["final_step"] == 40 and again["losses"] == []
  _same_params(again["params"], whole["params"])
  capsys.readouterr()
  with pytest.raises(ConfigError, match="Initial global step 40 already exceeds max step 30"):
    _run(tmp_path / "parts", max_steps=30, checkpoint_steps=10, log_steps=10)
  assert "Resuming from" not in capsys.readouterr().out  # refused, not resumed


@pytest.mark.slow  # a whole second run; .ci/run runs it
def test_sigkill_and_restart_end_with_identical_parameters(tmp_path):
  script = str(ROOT / "tests" / "scripts" / "run_example.py")
  env = child_env()
  steps = 200
  subprocess.run([sys.executable, script, str(tmp_path / "whole"), str(steps), str(tmp_path / "whole.npz")],
                 check=True, env=env, capture_output=True, timeout=300)  # fmt: skip
  victim = subprocess.Popen([sys.executable, script, str(tmp_path / "killed"), str(steps), str(tmp_path / "x.npz")],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
  checkpoints = tmp_path / "killed" / "checkpoints"
  deadline = time.time() + 120
  while time.time() < deadline and not (
    checkpoints.exists() and len([p for p in checkpoints.iterdir()]) >= 3
  ):
    time.sleep(0.05)
  victim.send_signal(signal.SIGKILL)
  victim.wait()
  assert not (tmp_path / "x.npz").exists()  # it really died before finishing
  subprocess.run([sys.executable, script, str(tmp_path / "killed"), str(steps), str(tmp_path / "killed.npz")],
                 check=True, env=env, capture_output=True, timeout=300)  # fmt: skip
  assert any((tmp_path / "killed" / "compile_cache").iterdir())  # compiled artifacts persisted for reruns
  from wafer.train import read_metrics

  steps = [r["step"] for r in read_metrics(tmp_path / "killed" / "metrics.jsonl")]
  assert (
    steps == sorted(set(steps)) == [r["step"] for r in read_metrics(tmp_path / "whole" / "metrics.jsonl")]
  )
  whole, killed = np.load(tmp_path / "whole.npz"), np.load(tmp_path / "killed.npz")
  assert sorted(whole.files) == sorted(killed.files)
  for name in whole.files:
    np.testing.assert_array_equal(whole[name], killed[name])


@pytest.mark.slow  # over 5 s; .ci/run runs the slow tests
def test_eval_modes(tmp_path, capsys):
  with pytest.raises(ExecutorError, match="mode eval_all: no checkpoint in .*checkpoints: train first"):
    _run(tmp_path, mode="eval_all")
  _run(tmp_path, max_steps=20, checkpoint_steps=10, log_steps=10)
  summary = _run(tmp_path, mode="eval_all")
  assert sorted(summary["eval_all"]) == [10, 20] and all(0 <= v <= 1 for v in summary["eval_all"].values())
  single = _run(tmp_path, mode="eval")
  assert single["eval"] == summary["eval_all"][20]
  assert "Avg Eval Accuracy:" in capsys.readouterr().out
  both = _run(
    tmp_path / "tae",
    mode="train_and_eval",
    max_steps=20,
    eval_frequency=10,
    checkpoint_steps=10,
    log_steps=10,
  )
  assert [step for step, _ in both["evals"]] == [10, 20]
  # GlobalRate counts from the run's first step, not from the last evaluation (where it equalled Rate)
  last = [r for r in _records(tmp_path / "tae") if "loss" in r][-1]
  assert last["step"] == 20 and last["avg_samples_per_sec"] != last["samples_per_sec"]
  # the final line counts both stretches between evaluations, each stretch line its own
  batch = example_run(str(tmp_path / "x"))[0].batch_size
  out = capsys.readouterr().out
  assert f"Trained to step 10 of 20 ({10 * batch} sample(s)" in out
  assert f"Training completed successfully! Processed {20 * batch} sample(s)" in out
  with pytest.raises(ExecutorError, match="must be multiples of each other"):
    _run(tmp_path / "bad", mode="train_and_eval", max_steps=20, eval_frequency=10, checkpoint_steps=3)


def test_validate_and_compile_only(tmp_path, capsys):
  _run(tmp_path / "v", max_steps=10, validate_only=True)
  _run(tmp_path / "c", max_steps=10, compile_only=True)
  out = capsys.readouterr().out
  assert "Validation completed successfully" in out and "Compile completed successfully" in out
  assert not (tmp_path / "c" / "metrics.jsonl").exists()
  assert (tmp_path / "c" / "compile_report.txt").exists()


def test_num_csx_runs_data_parallel_and_changes_nothing_process_wide(tmp_path):
  needs_devices(2)  # num_csx=2 takes 2 devices of the default backend (one GPU has one)
  names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs", "jax_enable_x64")
  before = {name: getattr(jax.config, name) for name in names}
  one = _run(tmp_path / "one", max_steps=10, log_steps=5)
  two = _run(tmp_path / "two", max_steps=10, log_steps=5, num_csx=2)
  for a, b in zip(jax.tree.leaves(one["params"]), jax.tree.leaves(two["params"])):
    np.testing.assert_allclose(
      np.asarray(a), np.asarray(b), rtol=2e-2, atol=2e-3
    )  # cbfloat16 sums in another order
  again = _run(tmp_path / "three", max_steps=10, log_steps=5)  # another num_csx in the same process: allowed
  _same_params(again["params"], one["params"])
  assert {name: getattr(jax.config, name) for name in names} == before  # run() left JAX's settings alone
  task, runconfig, *rest = example_run(str(tmp_path / "four"))
  with pytest.raises(ExecutorError, match="mode='fit'; allowed"):
    run(task, runconfig.model_copy(update={"mode": "fit"}), *rest, progress=False)


def _closure_run(model_dir, **runconfig):
  """A tiny float32 run whose loss calls a step closure and a checkpoint closure with the step's number."""
  import jax.numpy as jnp
  import optax

  import precision
  import wafer
  from wafer.train import IndexedBatches, Task

  seen = {"step": [], "checkpoint": []}

  @wafer.step_closure
  def at_step(k):
    seen["step"].append(int(k))

  @wafer.checkpoint_closure
  def at_checkpoint(k):
    seen["checkpoint"].append(int(k))

  def loss(params, batch):
    at_step(batch["k"][0])
    at_checkpoint(batch["k"][0])
    return jnp.mean((batch["x"] @ params["w"]) ** 2)

  task = Task(
    name="closures",
    init_params=lambda key: {"w": jax.random.normal(key, (4, 1))},
    loss_fn=loss,
    train_data=lambda seed: IndexedBatches(
      lambda k: {"x": np.ones((2, 4), np.float32), "k": np.full((2,), k + 1, np.int32)}
    ),
    batch_size=2,
  )
  rc = RunConfig.model_validate({"model_dir": str(model_dir), **runconfig})
  run(task, rc, optax.sgd(0.01), precision.StaticLossScale.create(1.0), precision.Policy(compute="float32"),
      progress=False)  # fmt: skip
  return seen


def test_checkpoint_closures_run_at_every_checkpoint_step_and_step_closures_only_at_theirs(tmp_path):
  seen = _closure_run(tmp_path, max_steps=12, log_steps=4, checkpoint_steps=6)
  assert seen["checkpoint"] == [6, 12]  # step 6 is neither a log nor an activation step
  assert seen["step"] == [1, 4, 8, 12]  # log steps only: not the checkpoint step 6


def _nan_run(model_dir, loss_scale, **runconfig):
  """A tiny float32 run whose every batch holds a NaN: its loss and gradients are NaN at every step."""
  import jax.numpy as jnp
  import optax

  import precision
  from wafer.train import IndexedBatches, Task

  task = Task(
    name="nan",
    init_params=lambda key: {"w": jax.random.normal(key, (4, 1))},
    loss_fn=lambda p, b: jnp.mean((b["x"] @ p["w"]) ** 2),
    train_data=lambda seed: IndexedBatches(lambda k: {"x": np.full((2, 4), np.nan, np.float32)}),
    batch_size=2,
  )
  rc = RunConfig.model_validate({"model_dir": str(model_dir), **runconfig})
  return run(task, rc, optax.sgd(0.01), loss_scale, precision.Policy(compute="float32"), progress=False)


def test_a_nan_loss_stops_the_run_naming_the_step_and_metrics_stay_strict_json(tmp_path, capsys):
  import precision
  from wafer.train import read_metrics

  with pytest.raises(
    ExecutorError, match=r"Step 1: the loss is NaN \(runconfig.check_loss_values is true.*learning_rate"
  ):
    _nan_run(tmp_path, precision.StaticLossScale.create(1.0), max_steps=6, log_steps=1, checkpoint_steps=3)
  assert not (
    tmp_path / "checkpoints" / "3"
  ).exists()  # stopped at the step it was found, nothing saved after
  line = (tmp_path / "metrics.jsonl").read_text().splitlines()[0]
  json.loads(line, parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))  # null, not a bare NaN
  assert json.loads(line)["loss"] is None and np.isnan(read_metrics(tmp_path / "metrics.jsonl")[0]["loss"])


def test_without_check_loss_values_a_run_whose_every_step_was_skipped_says_so(tmp_path, capsys):
  import precision

  for name, scale in [
    ("dls", precision.DynamicLossScale.create("float16")),
    ("static", precision.StaticLossScale.create(1.0)),
  ]:
    summary = _nan_run(tmp_path / name, scale, max_steps=6, log_steps=2, check_loss_values=False)
    assert summary.final_step == 6
    out = capsys.readouterr().out
    assert "Training completed successfully!" in out
    assert "of steps 1..6 was skipped: the gradients were not finite" in out, name
    # the advice fits the run: dynamic scaling on is not told to turn it on
    assert ("use dynamic loss scaling" in out) == (name == "static"), name
    assert ("Dynamic loss scaling halves its scale at each skip" in out) == (name == "dls"), name


def test_train_and_eval_resumed_evaluates_at_the_steps_of_an_uninterrupted_run(tmp_path):
  settings = {"mode": "train_and_eval", "eval_frequency": 10, "checkpoint_steps": 5, "log_steps": 5}
  first = _run(tmp_path, max_steps=15, **settings)
  assert [step for step, _ in first["evals"]] == [10, 15]  # every 10 steps and the final one
  resumed = _run(tmp_path, max_steps=30, **settings)  # resumes from the checkpoint of step 15
  assert [step for step, _ in resumed["evals"]] == [20, 30]  # not 25: counted from step 0


def test_train_and_eval_by_epochs_without_eval_frequency_evaluates_after_every_epoch(tmp_path):
  summary = _run(
    tmp_path, mode="train_and_eval", max_steps=None, num_epochs=2, steps_per_epoch=5, log_steps=5
  )
  assert [step for step, _ in summary["evals"]] == [5, 10]  # modelzoo: the epoch is the eval interval


def _checkpoints(model_dir):
  folder = Path(model_dir) / "checkpoints"
  return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.exists() else []


def test_train_and_eval_checkpoints_at_checkpoint_steps_not_at_every_evaluation(tmp_path):
  settings = {"mode": "train_and_eval", "max_steps": 40, "eval_frequency": 10, "log_steps": 10}
  _run(tmp_path / "n20", checkpoint_steps=20, **settings)
  assert _checkpoints(tmp_path / "n20") == [20, 40]  # N, 2N, ... and the final step (it wrote 10, 20, 30, 40)
  _run(
    tmp_path / "n0",
    checkpoint_steps=0,
    max_steps=20,
    **{k: v for k, v in settings.items() if k != "max_steps"},
  )
  assert _checkpoints(tmp_path / "n0") == []  # 0: none, as in train mode and modelzoo (it wrote 10, 20)


def test_a_train_run_without_checkpoint_steps_says_it_kept_nothing_and_its_rerun_says_why_it_starts_at_0(
  tmp_path, capsys
):
  _run(tmp_path, max_steps=4, checkpoint_steps=None, log_steps=2)
  out = capsys.readouterr().out
  assert (
    _checkpoints(tmp_path) == [] and "runconfig.checkpoint_steps is unset (or 0), so no checkpoint" in out
  )
  _run(tmp_path, max_steps=6, checkpoint_steps=None, log_steps=2)
  out = capsys.readouterr().out
  assert "checkpoint of step 0" not in out  # there is none
  assert "held 3 record(s) of an earlier run (steps 1..4) that left no checkpoint" in out


def test_a_nan_loss_seen_at_a_log_step_does_not_vouch_for_a_checkpoint_after_the_last_finite_one(tmp_path):
  """The loss is read at log steps: a NaN from step 3, seen at step 10 with checkpoints every 5 steps,
  may already be in checkpoint 5; the error must not say it was written before the divergence."""
  task = Task(
    name="nan",
    init_params=lambda key: {"w": jax.random.normal(key, (4, 1))},
    loss_fn=lambda p, b: jnp.mean((b["x"] @ p["w"]) ** 2),
    train_data=lambda seed: IndexedBatches(
      lambda k: {"x": np.full((2, 4), np.nan if k >= 2 else 1.0, np.float32)}
    ),
    batch_size=2,
  )
  rc = RunConfig.model_validate(
    {"model_dir": str(tmp_path), "max_steps": 20, "log_steps": 10, "checkpoint_steps": 5}
  )
  with pytest.raises(ExecutorError) as error:
    run(task, rc, optax.sgd(0.01), precision.StaticLossScale.create(1.0), precision.Policy(compute="float32"),
        progress=False)  # fmt: skip
  message = str(error.value)
  assert message.startswith("Step 10: the loss is NaN") and "was written before it" not in message
  assert (
    "the newest checkpoint, step 5, was written after the last loss seen finite (none was logged" in message
  )
