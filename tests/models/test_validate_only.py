"""``--validate_only`` / ``--compile_only`` check a params file on shapes: no data read, no weights built.

The shapes come from the input section (each data processor's ``example_spec``); the invariant that
keeps them honest is that the real data's first batch has exactly those shapes and dtypes, and a run
whose data disagrees stops with an error naming the feature.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import numpy as np
import pytest

from models.mlp import example_run
from wafer import runner
from wafer.data import processors
from wafer.train import ExecutorError, run

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "models").glob("*/configs/*.yaml"))
FAST = {"params_bert_tiny.yaml", "params_gpt2_tiny.yaml", "params_fc_mnist.yaml", "params_mlp.yaml"}


def _shapes(tree) -> dict:
  return {
    jax.tree_util.keystr(p): (tuple(np.shape(x)), np.dtype(x.dtype))
    for p, x in jax.tree_util.tree_leaves_with_path(tree)
  }


def _task(path: Path, model_dir: Path, *overrides: str):
  plan = runner.load_plan(path, [f"runconfig.model_dir={model_dir}", *overrides])
  return plan.task


@pytest.mark.parametrize(
  "name, overrides",
  [
    ("bert/configs/params_bert_tiny.yaml", ()),
    pytest.param(  # about 4 s each: the other variants are slow
      "bert/configs/params_bert_tiny.yaml",
      (
        "train_input.max_sequence_length=64",
        "train_input.max_predictions_per_seq=11",
        "model.dropout_rate=0.0",
      ),
      marks=pytest.mark.slow,
    ),
    ("gpt2/configs/params_gpt2_tiny.yaml", ()),
    pytest.param(
      "gpt2/configs/params_gpt2_tiny.yaml",
      ("train_input.max_sequence_length=32", "train_input.batch_size=6"),
      marks=pytest.mark.slow,
    ),
    ("fc_mnist/configs/params_fc_mnist.yaml", ()),
  ],
)
def test_declared_batch_shapes_are_the_real_first_batch(tmp_path, name, overrides):
  task = _task(ROOT / "models" / name, tmp_path, *overrides)
  real = next(task.train_data(0))
  assert _shapes(task.batch_spec()) == _shapes(real)


@pytest.mark.parametrize(
  "path", [pytest.param(p, marks=() if p.name in FAST else pytest.mark.slow, id=p.name) for p in CONFIGS]
)
def test_every_shipped_params_file_validates_without_its_data(tmp_path, monkeypatch, path):
  def no_reading(*args, **kwargs):
    raise AssertionError("validate_only read the data")

  monkeypatch.setattr(processors, "_features", no_reading)
  summary = runner.run_params(path, [f"runconfig.model_dir={tmp_path}", "runconfig.validate_only=true"])
  assert (tmp_path / "compile_report.txt").exists() and summary["samples_per_sec_estimate"] > 0
  assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.slow  # over 5 s; .ci/run runs the slow tests
def test_compile_only_of_a_model_whose_data_is_missing(tmp_path):
  path = ROOT / "models" / "gpt2" / "configs" / "params_gpt2_tiny.yaml"
  summary = runner.run_params(
    path,
    [
      f"runconfig.model_dir={tmp_path}",
      "runconfig.compile_only=true",
      f"train_input.data_dir={tmp_path / 'no'}",
    ],
  )
  assert summary["samples_per_sec_estimate"] > 0


def test_a_batch_that_disagrees_with_the_declared_shapes_is_an_error_naming_the_feature(tmp_path):
  task, rc, *rest = example_run(str(tmp_path), max_steps=1)
  real = _shapes(next(task.train_data(0)))
  assert real == {"['label']": ((64,), np.dtype(np.int32)), "['x']": ((64, 32), np.dtype(np.float32))}
  declared = {"x": jax.ShapeDtypeStruct((64, 16), np.float32), "label": jax.ShapeDtypeStruct((64,), np.int32)}
  wrong = dataclasses.replace(task, batch_spec=lambda: declared)
  with pytest.raises(
    ExecutorError, match=r"\['x'\]: the data has \[64, 32\] float32, the config says \[64, 16\]"
  ):
    run(wrong, rc, *rest, progress=False)
  declared["x"] = jax.ShapeDtypeStruct((64, 32), np.float32)
  assert run(wrong, rc, *rest, progress=False)["final_step"] == 1  # declared right: it runs


def test_validate_only_uses_the_declared_shapes_without_building_data(tmp_path):
  task, rc, *rest = example_run(str(tmp_path), max_steps=1, validate_only=True)

  def no_data(seed):
    raise AssertionError("validate_only built the data")

  spec = {"x": jax.ShapeDtypeStruct((64, 32), np.float32), "label": jax.ShapeDtypeStruct((64,), np.int32)}
  checked = dataclasses.replace(task, train_data=no_data, batch_spec=lambda: spec)
  assert run(checked, rc, *rest, progress=False)["samples_per_sec_estimate"] > 0
  with pytest.raises(AssertionError, match="built the data"):  # without a spec, the first batch is read
    run(dataclasses.replace(checked, batch_spec=None), rc, *rest, progress=False)


@pytest.mark.slow  # over 5 s; .ci/run runs the slow tests
def test_the_estimate_on_shapes_equals_the_estimate_on_the_first_batch(tmp_path):
  path = ROOT / "models" / "gpt2" / "configs" / "params_gpt2_tiny.yaml"
  plan = runner.load_plan(path, [f"runconfig.model_dir={tmp_path}", "runconfig.validate_only=true"])
  on_shapes = runner.run_plan(plan, progress=False)["samples_per_sec_estimate"]
  plan.task = dataclasses.replace(plan.task, batch_spec=None)  # the data path: the real first batch
  on_data = runner.run_plan(plan, progress=False)["samples_per_sec_estimate"]
  assert on_shapes == on_data


@pytest.mark.parametrize(
  "model, file", [("gpt2", "params_gpt2_tiny.yaml"), ("bert", "params_bert_tiny.yaml")]
)
def test_sequences_longer_than_the_position_table_are_refused_on_the_declared_shapes(tmp_path, model, file):
  """--validate_only said "Validation completed successfully" for max_position_embeddings=8 and 128-token
  sequences (JAX clamps the positions past the table); only a real run's data check refused it."""
  from models.registry import DataConfigError

  path = ROOT / "models" / model / "configs" / file
  length = _task(path, tmp_path).batch_spec()["input_ids"].shape[1]
  task = _task(path, tmp_path, f"model.max_position_embeddings={length - 1}")
  with pytest.raises(DataConfigError, match=rf"train_input: sequences of {length} tokens exceed "
                     rf"model.max_position_embeddings={length - 1}; lower train_input.max_sequence_length"):  # fmt: skip
    task.batch_spec()
  assert (
    _task(path, tmp_path, f"model.max_position_embeddings={length}").batch_spec()["input_ids"].shape[1]
    == length
  )


def test_fc_mnist_input_size_that_disagrees_with_the_images_is_refused_on_the_declared_shapes(tmp_path):
  """--validate_only model.input_size=100 was a bare "dot_general requires contracting dimensions" TypeError
  at the trace; a real run's data check said it cleanly. Both say the same now, from one check."""
  from models.registry import DataConfigError

  path = ROOT / "models" / "fc_mnist" / "configs" / "params_fc_mnist.yaml"
  message = r"train_input: images have 784 pixels, model.input_size is 100; set model.input_size=784"
  with pytest.raises(DataConfigError, match=message):
    _task(path, tmp_path, "model.input_size=100").batch_spec()
  with pytest.raises(DataConfigError, match=message):  # the run's check on the real data: the same words
    next(_task(path, tmp_path, "model.input_size=100").train_data(0))
  with pytest.raises(DataConfigError, match=message):  # and through the runner, before anything is traced
    runner.run_params(
      path, [f"runconfig.model_dir={tmp_path}", "runconfig.validate_only=true", "model.input_size=100"]
    )
  assert _task(path, tmp_path, "model.input_size=784").batch_spec()["images"].shape[1] == 784
