"""Damaged checkpoints: reported (step and path), skipped, nothing deleted; the run resumes from the one before."""

import jax
import numpy as np
import pytest

from models.mlp import example_run
from wafer.train import ExecutorError, run


def _run(model_dir, **overrides):
  return run(*example_run(str(model_dir), **overrides), progress=False)


def _truncate_arrays(step_dir):
  """Cut every array data file of a checkpoint to half its size (what a full disk or a crash leaves)."""
  files = [p for p in step_dir.rglob("*") if p.is_file() and p.parent.name == "d"]
  assert files
  for p in files:
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
  return files


@pytest.mark.slow  # over 5 s; .ci/run runs the slow tests
def test_a_damaged_latest_checkpoint_is_reported_and_skipped(tmp_path, capsys):
  whole = _run(tmp_path / "whole", max_steps=30, checkpoint_steps=10, log_steps=10)
  _run(tmp_path / "parts", max_steps=20, checkpoint_steps=10, log_steps=10)
  checkpoints = tmp_path / "parts" / "checkpoints"
  _truncate_arrays(checkpoints / "20")
  capsys.readouterr()
  resumed = _run(tmp_path / "parts", max_steps=30, checkpoint_steps=10, log_steps=10)
  out = capsys.readouterr().out
  warning = [line for line in out.splitlines() if "cannot be read" in line]
  assert len(warning) == 1 and "step 20" in warning[0] and str(checkpoints / "20") in warning[0]
  assert "Resuming from the checkpoint at step 10." in out
  assert resumed["final_step"] == 30
  for a, b in zip(jax.tree.leaves(whole["params"]), jax.tree.leaves(resumed["params"])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # same as a run never damaged
  assert (checkpoints / "20.unreadable").is_dir()  # nothing deleted: the damaged one is kept aside
  assert {p.name for p in checkpoints.iterdir() if p.name.isdigit()} == {"10", "20", "30"}
  evals = _run(tmp_path / "parts", mode="eval_all")["eval_all"]
  assert sorted(evals) == [10, 20, 30]


def test_eval_all_skips_a_damaged_checkpoint_and_none_readable_is_an_error(tmp_path, capsys):
  _run(tmp_path, max_steps=20, checkpoint_steps=10, log_steps=10)
  _truncate_arrays(tmp_path / "checkpoints" / "10")
  evals = _run(tmp_path, mode="eval_all")["eval_all"]
  assert sorted(evals) == [20] and "checkpoint of step 10" in capsys.readouterr().out
  _truncate_arrays(tmp_path / "checkpoints" / "20")
  with pytest.raises(ExecutorError, match=r"None of the checkpoints in .* \(steps 10, 20\) can be read"):
    _run(tmp_path, max_steps=30)
  with pytest.raises(ExecutorError, match=r"None of the checkpoints in .* \(steps 10, 20\) can be read"):
    _run(tmp_path, mode="eval_all")  # evaluated nothing: an error, not a success
  assert (tmp_path / "checkpoints" / "10").is_dir() and (tmp_path / "checkpoints" / "20").is_dir()


def test_a_resume_with_the_other_loss_scale_type_says_the_counts_differ_and_why(tmp_path):
  """Swapping DynamicLossScale for StaticLossScale was "the checkpoint holds 18 arrays, the model's state
  15, with different shapes": the counts differ, not the shapes, and the loss scale's type is the cause."""
  import precision

  _run(tmp_path, max_steps=2, checkpoint_steps=2)
  task, rc, optimizer, loss_scale, policy = example_run(str(tmp_path), max_steps=4)
  assert isinstance(loss_scale, precision.DynamicLossScale)
  with pytest.raises(ExecutorError) as caught:
    run(task, rc, optimizer, precision.StaticLossScale.create(1.0), policy, progress=False)
  message = str(caught.value)
  assert (
    "the checkpoint holds 18 arrays, the model's state 15; the loss scale was dynamic when the " in message
  )
  assert "is static now (optimizer.loss_scaling_factor" in message and "different shapes" not in message
  assert "arrays only in the checkpoint: loss_scale/num_skipped_steps" in message


def test_arrays_of_other_shapes_under_other_paths_are_called_so():
  from wafer.train.checkpoint import _shape_mismatch

  saved = {"params": {"a": np.zeros(2)}}
  assert _shape_mismatch(saved, {"params": {"b": np.zeros(3)}}) == (
    "the checkpoint and the model's state hold 1 array each, of different shapes; arrays only in the checkpoint: "
    "params/a; arrays only in this run's state: params/b"
  )
