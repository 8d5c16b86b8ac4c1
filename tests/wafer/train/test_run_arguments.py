"""`wafer.train.run` refuses arguments it cannot use, naming them, before any work: a wrong type
(which failed later as a bare AttributeError from inside wafer) or a `Task.batch_size` that is not
the data's (which made every logged sample count and rate wrong, silently)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import precision
from wafer.config import RunConfig
from wafer.errors import ExecutorError
from wafer.train import IndexedBatches, Task, run


def _task(rows: int = 4, batch_size: int = 4) -> Task:
  def batch(k):
    x = np.random.default_rng(k).standard_normal((rows, 8)).astype(np.float32)
    return {"x": x, "y": x[:, :1] * 2}

  return Task(
    name="linear",
    init_params=lambda key: {"w": jax.random.normal(key, (8, 1)) * 0.1},
    loss_fn=lambda p, b: jnp.mean((b["x"] @ p["w"] - b["y"]) ** 2),
    train_data=lambda seed: IndexedBatches(batch),
    batch_size=batch_size,
  )


def _rc(tmp_path) -> RunConfig:
  return RunConfig.model_validate({"model_dir": str(tmp_path / "md"), "max_steps": 2, "checkpoint_steps": 0})


def _args(tmp_path) -> dict:
  return {
    "task": _task(),
    "runtime": _rc(tmp_path),
    "optimizer": optax.sgd(0.01),
    "loss_scale": precision.DynamicLossScale.create("cbfloat16"),
    "policy": precision.Policy(compute="cbfloat16"),
  }


@pytest.mark.parametrize(
  ("name", "value", "message"),
  [
    ("task", {"name": "linear"}, "task is a dict; it must be a wafer.train.Task"),
    ("runtime", {"max_steps": 2}, "runconfig is a dict; it must be a wafer.config.RunConfig"),
    ("optimizer", "sgd", "optimizer is a str; it must be an optax.GradientTransformation"),
    ("loss_scale", 128.0, "loss_scale is 128.0; it must be a precision.DynamicLossScale"),
    ("policy", "cbfloat16", "policy is 'cbfloat16'; it must be a precision.Policy"),
  ],
)
def test_a_wrong_argument_type_is_named_before_any_work(tmp_path, name, value, message):
  args = _args(tmp_path) | {name: value}
  with pytest.raises(TypeError, match=f"wafer.train.run: .*{message}"):
    run(**args, progress=False)
  assert not (tmp_path / "md").exists()  # nothing was prepared


def test_a_batch_size_that_is_not_the_datas_is_refused(tmp_path):
  args = _args(tmp_path) | {"task": _task(rows=4, batch_size=8)}
  with pytest.raises(ExecutorError, match=r"Task.batch_size is 8 here, but .*\['x'\] has shape \[4, 8\]"):
    run(**args, progress=False)
  summary = run(**_args(tmp_path), progress=False)  # the same data with batch_size 4 trains
  assert summary.final_step == 2


@pytest.mark.parametrize("batch_size", [0, -3, 2.5, True, "8"])
def test_task_batch_size_is_a_positive_int(batch_size):
  with pytest.raises(ExecutorError, match="Task.batch_size=.*allowed: an int >= 1"):
    _task(batch_size=batch_size)


def test_train_data_that_is_not_a_function_of_the_seed_is_named_before_any_work(tmp_path):
  source = IndexedBatches(lambda k: {"x": np.zeros((4, 8), np.float32), "y": np.zeros((4, 1), np.float32)})
  args = _args(tmp_path) | {"task": dataclasses.replace(_task(), train_data=source)}
  with pytest.raises(TypeError, match=r"Task.train_data is an IndexedBatches; it must be a function of the seed "
                     r"returning a wafer.train.BatchSource .*\(lambda seed: IndexedBatches\(batch_of\)\)"):  # fmt: skip
    run(**args, progress=False)
  assert not (tmp_path / "md").exists()  # nothing was prepared


def test_train_data_returning_a_plain_iterator_is_refused_saying_what_is_allowed(tmp_path):
  batches = [{"x": np.zeros((4, 8), np.float32), "y": np.zeros((4, 1), np.float32)}] * 3
  args = _args(tmp_path) | {"task": dataclasses.replace(_task(), train_data=lambda seed: iter(batches))}
  with pytest.raises(ExecutorError, match=r"Task.train_data\(seed\) returned a list_iterator; it must be a function "
                     r"of the seed returning a wafer.train.BatchSource .*IndexedBatches"):  # fmt: skip
    run(**args, progress=False)


def test_a_batch_source_class_of_the_seed_is_a_function_of_the_seed(tmp_path):
  """A class whose constructor takes the seed returns a BatchSource: it is not refused as a source."""

  class Source:
    def __init__(self, seed):
      self.k = 0

    def __next__(self):
      self.k += 1
      return {"x": np.zeros((4, 8), np.float32), "y": np.zeros((4, 1), np.float32)}

    def get_state(self):
      return {"next_batch": self.k}

    def set_state(self, state):
      self.k = state["next_batch"]

  args = _args(tmp_path) | {"task": dataclasses.replace(_task(), train_data=Source)}
  assert run(**args, progress=False).final_step == 2


def test_an_explicit_precision_opt_level_the_policy_does_not_have_is_refused(tmp_path):
  """RunConfig(precision_opt_level=0) with a level-1 Policy compiled at level 1, silently."""
  rc = RunConfig.model_validate({"model_dir": str(tmp_path / "md"), "max_steps": 2, "precision_opt_level": 0})
  args = _args(tmp_path) | {"runtime": rc}
  with pytest.raises(
    ExecutorError, match=r"runconfig.precision_opt_level is 0 but the policy \(.*level=1\) is at level 1.*Fix"
  ):
    run(**args, progress=False)
  assert not (tmp_path / "md").exists()  # nothing was prepared
  # agreeing levels run; so does a float32 policy (it rounds nothing at any level)
  for policy in (precision.Policy("cbfloat16", level=0), precision.Policy("float32")):
    assert run(**args | {"policy": policy}, progress=False).final_step == 2
  # left unset, the policy's level holds
  assert (
    run(**_args(tmp_path) | {"policy": precision.Policy("cbfloat16", level=2)}, progress=False).final_step
    == 2
  )


def test_wafer_runs_policy_has_the_level_its_runconfig_sets():
  """``wafer run`` builds both from one params file: an explicit level is the policy's level."""
  from models import mlp
  from wafer import registry
  from wafer.config import load_params

  registry.load_plugins()
  runtime = load_params(mlp.CONFIG, ["runconfig.precision_opt_level=0"]).build()
  assert "precision_opt_level" in runtime.runconfig.model_fields_set
  assert runtime.runconfig.precision_opt_level == runtime.policy.level == 0 and runtime.policy.is_mixed
