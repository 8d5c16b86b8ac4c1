"""Eval under the training discipline: the policy, one compile through `wafer.compile`, num_csx sharding."""

import dataclasses

import jax
import numpy as np
import pytest

import precision
import wafer
from models.mlp import example_run
from tests.devices import needs_devices
from wafer.train import run


def _job(model_dir, policy=None, **overrides):
  """The example job with its loss as the eval metric (accuracy barely moves with the format)."""
  task, runconfig, optimizer, loss_scale, default = example_run(str(model_dir), **overrides)
  task = dataclasses.replace(task, eval_metric=None, eval_metric_name="loss")
  return task, runconfig, optimizer, loss_scale, policy or default


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  model_dir = tmp_path_factory.mktemp("trained")
  summary = run(*_job(model_dir, max_steps=20, checkpoint_steps=10, log_steps=10), progress=False)
  return model_dir, summary["params"]


def test_eval_runs_under_the_policy_and_float32_is_plain_float32(trained):
  model_dir, params = trained
  mixed = run(*_job(model_dir, mode="eval"), progress=False)["eval"]
  f32 = run(*_job(model_dir, precision.Policy(compute="float32"), mode="eval"), progress=False)["eval"]
  assert mixed != f32  # cbfloat16 rounding changed the eval loss
  task = _job(model_dir)[0]
  plain = float(np.mean(jax.device_get([jax.jit(task.loss_fn)(params, b) for b in task.eval_data()])))
  assert f32 == plain
  assert abs(mixed - f32) < 0.05 * f32  # the same model, rounded: close, not equal


def test_eval_is_compiled_once_through_wafer_compile_in_every_mode(trained, tmp_path, monkeypatch):
  model_dir, _ = trained
  calls = []
  real = wafer.compile

  def recording(fn, *args, **kwargs):
    calls.append(fn)
    return real(fn, *args, **kwargs)

  monkeypatch.setattr(wafer, "compile", recording)
  evals = run(*_job(model_dir, mode="eval_all"), progress=False)["eval_all"]
  assert sorted(evals) == [10, 20] and len(calls) == 1  # the eval step, once; no train step in an eval mode
  calls.clear()
  both = run(*_job(tmp_path, mode="train_and_eval", max_steps=20, eval_frequency=10), progress=False)
  assert [s for s, _ in both["evals"]] == [10, 20] and len(calls) == 2


@pytest.mark.parametrize("mode", ["eval", "eval_all"])
def test_eval_modes_read_no_training_data(trained, mode, capsys):
  """As modelzoo's eval modes: only eval_input is read, so a run with no training data at hand (a
  train_input data_dir of another machine) evaluates; the train step is not compiled."""
  model_dir, _ = trained
  task, *rest = _job(model_dir, mode=mode)

  def no_training_data(seed):
    raise AssertionError("an eval mode read the training data")

  summary = run(dataclasses.replace(task, train_data=no_training_data), *rest, progress=False)
  assert summary["eval_step"] == 20 if mode == "eval" else sorted(summary["eval_all"]) == [10, 20]
  assert "training data is not read" in capsys.readouterr().out


def test_eval_is_sharded_over_num_csx(trained, monkeypatch):
  needs_devices(2)  # num_csx=2 takes 2 devices of the default backend (one GPU has one)
  model_dir, _ = trained
  one = run(*_job(model_dir, precision.Policy(compute="float32"), mode="eval"), progress=False)["eval"]
  compiled = []
  real = wafer.compile
  monkeypatch.setattr(wafer, "compile", lambda *a, **k: compiled.append(real(*a, **k)) or compiled[-1])
  two = run(*_job(model_dir, precision.Policy(compute="float32"), mode="eval", num_csx=2), progress=False)
  assert two["eval"] == pytest.approx(one, rel=1e-6)
  eval_step = compiled[-1].compiled
  batch_shardings = jax.tree.leaves(eval_step.input_shardings[0][1])
  assert batch_shardings and all(len(s.device_set) == 2 for s in batch_shardings)  # the batch split over 2


def test_eval_steps_beyond_the_eval_data_says_how_many_batches_were_evaluated(trained, capsys):
  """eval_steps=10 on 4 eval batches evaluated 4 without a word; the warning comes once per run."""
  model_dir, _ = trained
  batches = sum(1 for _ in _job(model_dir)[0].eval_data())
  capsys.readouterr()
  evals = run(*_job(model_dir, mode="eval_all", eval_steps=batches + 6), progress=False)["eval_all"]
  out = capsys.readouterr().out
  want = (
    f"Warning: runconfig.eval_steps is {batches + 6}, but the eval data has only {batches} batches: evaluated "
    f"those {batches} (one pass over the eval data)"
  )
  assert out.count(want) == 1 and len(evals) == 2  # two evals, one warning


@pytest.mark.slow  # one more eval run
def test_eval_steps_within_the_eval_data_says_nothing(trained, capsys):
  model_dir, _ = trained
  batches = sum(1 for _ in _job(model_dir)[0].eval_data())
  capsys.readouterr()
  run(*_job(model_dir, mode="eval", eval_steps=batches), progress=False)
  assert "eval_steps" not in capsys.readouterr().out


@pytest.mark.parametrize("mode", ["eval", "eval_all"])
def test_eval_in_a_format_without_the_checkpoints_loss_scale_says_so_and_how_to_evaluate(
  tmp_path, capsys, mode
):
  """A cbfloat16 checkpoint (dynamic loss scaling) evaluated with model.fp16_type=bfloat16 (no loss scaling)
  was refused as "the checkpoint holds 19 arrays, the model's state 16": nothing said that only the loss
  scale's state differs, which eval does not use, or how to evaluate."""
  from models.mlp import CONFIG
  from wafer import cli

  md = str(tmp_path / "md")
  train = ["run", "--params", str(CONFIG), "--model_dir", md, "runconfig.max_steps=1"]
  assert cli.main([*train, "runconfig.checkpoint_steps=1"]) == 0
  capsys.readouterr()
  assert (
    cli.main(["run", "--params", str(CONFIG), "--model_dir", md, "--mode", mode, "model.fp16_type=bfloat16"])
    == 1
  )
  err = capsys.readouterr().err
  assert "only its loss-scale state differs" in err and "arrays only in the checkpoint: loss_scale/" in err
  assert (
    "Eval does not use the loss-scale state" in err
    and "float16 with its optimizer.loss_scaling_factor" in err
  )
  assert (
    cli.main(["run", "--params", str(CONFIG), "--model_dir", md, "--mode", mode, "model.fp16_type=float16"])
    == 0
  )


def test_repeated_evals_of_one_checkpoint_are_told_apart_in_metrics_jsonl(tmp_path):
  """Two --mode eval runs of one checkpoint appended two records of one step with different values and
  nothing else: each now says the mode that made it and the batches it averaged."""
  from wafer.train import read_metrics

  run(*_job(tmp_path, max_steps=2, checkpoint_steps=2, log_steps=1), progress=False)
  run(*_job(tmp_path, mode="eval", eval_steps=1), progress=False)
  run(*_job(tmp_path, mode="eval_all", eval_steps=2), progress=False)
  evals = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "eval/loss" in r]
  assert [(r["step"], r["eval_mode"], r["eval_batches"]) for r in evals] == [
    (2, "eval", 1),
    (2, "eval_all", 2),
  ]


def test_eval_marks_are_not_charted_in_tensorboard(tmp_path, monkeypatch):
  """eval_batches, a number, became a TensorBoard chart of its own beside eval/loss (review)."""
  import tensorboardX

  from wafer.train.metrics import Metrics, eval_marks

  charted = []
  monkeypatch.setattr(
    tensorboardX.SummaryWriter, "add_scalar", lambda self, tag, *a, **k: charted.append(tag)
  )
  metrics = Metrics(tmp_path, "CPU")
  metrics.write({"step": 3, "eval/loss": 1.5, **eval_marks("eval", 4)}, "eval line")
  metrics.close()
  assert charted == ["eval/loss"]
