"""``--validate_only`` is fast (shapes only, no XLA compile, cheap sharding probes) and still checks everything.

The speed-up of issue 26 item 4 is `wafer.compile.cheap_sharding_probes`: JAX 0.10's ``tracer.sharding``
error walked every equation traced so far, and flax.nnx probes it at every RNG draw, so tracing GPT-2 XL was
quadratic. These tests hold the two halves of the bargain: the probe no longer walks the graph (and the
traced graph is the same), and a broken config or step is still refused by ``--validate_only``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

import wafer
from models.mlp import example_run
from wafer import cli, runner, train
from wafer.compile import cheap_sharding_probes
from wafer.costmodel.estimate import run_inputs
from wafer.errors import StaticGraphError

ROOT = Path(__file__).resolve().parents[2]
GPT2_TINY = ROOT / "models" / "gpt2" / "configs" / "params_gpt2_tiny.yaml"


def _origin_walks(monkeypatch) -> list[int]:
  """Count the calls of the traced value's origin message (the walk over every equation traced so far)."""
  calls: list[int] = []
  box = {}

  def find_class(x):
    box["cls"] = type(x)
    return x

  jax.make_jaxpr(find_class)(1.0)
  cls = box["cls"]
  if not hasattr(cls, "_origin_msg"):
    pytest.skip(f"this JAX's {cls.__name__} has no _origin_msg")
  original = cls._origin_msg

  def counted(self):
    calls.append(1)
    return original(self)

  monkeypatch.setattr(cls, "_origin_msg", counted)
  return calls


def _probe(x):
  assert getattr(x, "sharding", None) is None and not hasattr(x, "sharding")
  return x + 1


def test_the_sharding_probe_does_not_walk_the_graph_inside_and_does_outside(monkeypatch):
  calls = _origin_walks(monkeypatch)
  with cheap_sharding_probes():
    jax.make_jaxpr(lambda x: _probe(x))(1.0)  # a new function each time: no trace cache
  assert calls == []
  jax.make_jaxpr(lambda x: _probe(x))(1.0)
  walks_outside = "_origin_msg" in jax.core.Tracer.sharding.fget.__code__.co_names
  assert len(calls) == (2 if walks_outside else 0)  # getattr and hasattr: the quadratic walk this avoids


@settings(max_examples=10, deadline=None)
@given(depth=st.integers(1, 3), fail=st.booleans())
def test_the_original_property_comes_back_nested_and_after_an_error(depth, fail):
  original = jax.core.Tracer.__dict__["sharding"]

  def enter(n):
    if n == 0:
      assert jax.core.Tracer.__dict__["sharding"] is not original
      if fail:
        raise RuntimeError("inside")
      return
    with cheap_sharding_probes():
      enter(n - 1)
    assert jax.core.Tracer.__dict__["sharding"] is (original if n == depth else jax.core.Tracer.sharding)

  try:
    enter(depth)
  except RuntimeError:
    assert fail
  assert jax.core.Tracer.__dict__["sharding"] is original


def test_flax_nnx_initialisers_under_eval_shape_do_not_walk_the_graph(monkeypatch):
  calls = _origin_walks(monkeypatch)

  def build():
    rngs = nnx.Rngs(0)
    return [nnx.Linear(4, 4, rngs=rngs) for _ in range(8)]

  with cheap_sharding_probes():
    nnx.eval_shape(build)
  assert calls == []
  nnx.eval_shape(build)  # without: a walk per RNG draw (8 kernels), on a JAX whose probe walks
  walks_outside = "_origin_msg" in jax.core.Tracer.sharding.fget.__code__.co_names
  assert len(calls) >= 8 if walks_outside else calls == []


def test_the_traced_step_is_the_same_with_cheap_probes(tmp_path):
  plan = runner.load_plan(GPT2_TINY, [f"runconfig.model_dir={tmp_path}", "runconfig.validate_only=true"])
  state, batch = train.step_shapes(plan.task, plan.optimizer, plan.loss_scale, plan.seed)
  step = train.make_train_step(plan.task, plan.optimizer, plan.policy)
  plain = str(jax.make_jaxpr(step)(state, batch))
  with cheap_sharding_probes():
    fast = str(jax.make_jaxpr(step)(state, batch))
  assert fast == plain


def test_validate_only_lowers_but_never_compiles(tmp_path, monkeypatch, capsys):
  lowered = []
  lower = jax.stages.Traced.lower

  def counted_lower(self, *args, **kwargs):
    lowered.append(1)
    return lower(self, *args, **kwargs)

  def no_compile(self, *args, **kwargs):
    raise AssertionError("validate_only compiled the step")

  monkeypatch.setattr(jax.stages.Traced, "lower", counted_lower)
  monkeypatch.setattr(jax.stages.Lowered, "compile", no_compile)
  rc = cli.main(["run", "--params", str(GPT2_TINY), "--validate_only", "--model_dir", str(tmp_path)])
  out = capsys.readouterr().out
  assert rc == 0, out
  assert lowered and "Validation completed successfully" in out
  assert "Estimating the rate on the wafer" in out and (tmp_path / "compile_report.txt").exists()


def test_validate_only_says_on_the_console_which_sequence_length_it_assumed(tmp_path, capsys):
  """A file without ``max_sequence_length`` is estimated at ``max_position_embeddings`` tokens (modelzoo's
  data fixes the length): the console line says so, not only compile_report.txt."""
  unset = ["train_input.max_sequence_length=null", "eval_input.max_sequence_length=null"]
  rc = cli.main(["run", "--params", str(GPT2_TINY), "--validate_only", "--model_dir", str(tmp_path), *unset])
  out = capsys.readouterr().out
  assert rc == 0, out
  line = next(line for line in out.splitlines() if line.startswith("Estimated "))
  assert "-token sequences (train_input.max_sequence_length not set: model.max_position_embeddings = " in line
  rc = cli.main(["run", "--params", str(GPT2_TINY), "--validate_only", "--model_dir", str(tmp_path / "b")])
  stated = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("Estimated "))
  assert rc == 0 and "-token sequences" not in stated


# ------------------------------------------------------------------ what validate_only must still refuse


@pytest.mark.parametrize(
  "override, message",
  [
    ("runconfig.num_csx=3", "num_csx"),  # the global batch (16) does not split over 3 systems
    ("model.num_heads=3", "num_heads=3 does not divide hidden_size=128"),
    ("model.max_position_embeddings=8", "exceed model.max_position_embeddings=8"),
  ],
)
def test_validate_only_still_refuses_a_broken_config(tmp_path, capsys, override, message):
  rc = cli.main(
    ["run", "--params", str(GPT2_TINY), "--validate_only", "--model_dir", str(tmp_path), override]
  )
  captured = capsys.readouterr()
  assert rc == 1 and message in captured.err, captured.err
  assert "Validation completed" not in captured.out


def _mismatched_matmul(params, batch):
  w = jax.tree.leaves(params)[0]
  return jnp.sum(batch["x"] @ jnp.ones((w.shape[0] + 1, 3), jnp.float32))  # one row too many


def _branch_on_a_value(params, batch):
  loss = jnp.mean(batch["x"])
  if loss > 0:  # Python control flow on a traced value
    return loss
  return -loss


@pytest.mark.parametrize(
  "loss_fn, error, match",
  [
    (_mismatched_matmul, TypeError, "dot_general"),
    (_branch_on_a_value, StaticGraphError, "Python control flow on a traced value"),
  ],
)
def test_validate_only_still_refuses_a_broken_step(tmp_path, capsys, loss_fn, error, match):
  task, rc, *rest = example_run(str(tmp_path), max_steps=1, validate_only=True)
  broken = dataclasses.replace(task, loss_fn=loss_fn)
  with pytest.raises(error, match=match):
    wafer.train.run(broken, rc, *rest, progress=False)
  assert "Validation completed" not in capsys.readouterr().out


def test_validate_only_traces_the_step_once_for_the_check_and_the_estimate(tmp_path):
  """The check and the estimate's trace at the run's batch share one trace (jax.jit's cache); the estimate
  follows the batch through it (`wafer.costmodel.batchflow`) and does not trace again at twice the batch."""
  task, rc, *rest = example_run(str(tmp_path), max_steps=1, validate_only=True)
  batches = []

  def counted(params, batch):
    batches.append(jax.tree.leaves(batch)[0].shape[0])
    return task.loss_fn(params, batch)

  summary = wafer.train.run(dataclasses.replace(task, loss_fn=counted), rc, *rest, progress=False)
  assert batches == [task.batch_size]
  assert summary["samples_per_sec_estimate"] > 0


def test_the_validate_only_estimate_is_the_estimate_of_the_step(tmp_path):
  plan = runner.load_plan(GPT2_TINY, [f"runconfig.model_dir={tmp_path}", "runconfig.validate_only=true"])
  summary = runner.run_plan(plan, progress=False)
  state, batch = train.step_shapes(plan.task, plan.optimizer, plan.loss_scale, plan.seed)
  step = train.make_train_step(plan.task, plan.optimizer, plan.policy)
  report = wafer.estimate(
    step,
    state,
    batch,
    batch_size=plan.task.batch_size,
    num_csx=1,
    policy=plan.policy,
    **run_inputs(plan.params),
  )
  assert summary["samples_per_sec_estimate"] == report.samples_per_sec
  assert (tmp_path / "compile_report.txt").read_text() == report.to_text()


def test_the_whole_validate_path_never_walks_the_graph_for_a_sharding_probe(tmp_path, monkeypatch):
  """Loading (the model's template), the state's shapes, the step's trace and the estimate's traces: with
  dropout, every RNG draw of flax.nnx probes tracer.sharding."""
  calls = _origin_walks(monkeypatch)
  overrides = [f"runconfig.model_dir={tmp_path}", "runconfig.validate_only=true", "model.dropout_rate=0.1"]
  plan = runner.load_plan(GPT2_TINY, overrides)
  summary = runner.run_plan(plan, progress=False)
  assert summary["samples_per_sec_estimate"] > 0 and calls == []
