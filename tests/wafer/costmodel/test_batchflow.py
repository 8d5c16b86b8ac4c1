"""One trace instead of two: the batch axes followed through the step (`wafer.costmodel.batchflow`,
``extract(scaling="dataflow")``, what ``--validate_only`` uses) give the graph the second trace at
twice the batch gives, or the walk says it could not follow them and the step is traced twice."""

from __future__ import annotations

import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wafer.costmodel import graph as G
from wafer.costmodel import workloads
from wafer.costmodel.estimate import estimate

ROOT = Path(__file__).resolve().parents[3]


def _exps_two_traces(fn, args, argnums):
  """Per site: (exponents, per-sample) from the traces at b0 and 2 b0, and the one-trace walker."""
  names = tuple(f"a{i}" for i in range(len(args)))
  b0 = G._batch_size_of(G._abstract(args, names), argnums, names)
  w1, _ = G._trace(fn, G._abstract(args, names), argnums, b0)
  doubled = tuple(G._double_batch(a) if i in argnums else a for i, a in enumerate(G._abstract(args, names)))
  w2, _ = G._trace(fn, doubled, argnums)
  assert len(w1.sites) == len(w2.sites)
  traced = []
  for s, s2 in zip(w1.sites, w2.sites):
    e = tuple(G._exponent(a, b) for a, b in zip(s.measures, s2.measures))
    per_sample = s.in_shapes != s2.in_shapes or s.out_shapes != s2.out_shapes
    traced.append((tuple(1 if x is None else x for x in e), per_sample))
  followed = [(s.batch_exps, s.batch_per_sample) for s in w1.sites]
  return w1, traced, followed


def _graphs_equal(fn, args, argnums):
  a = G.extract(fn, args, batch_argnums=argnums, compute_bits=16, scaling="traced")
  b = G.extract(fn, args, batch_argnums=argnums, compute_bits=16, scaling="dataflow")
  assert a.kernels == b.kernels
  assert (a.exact_scaling, a.param_elements, a.input_bytes_per_sample) == (
    b.exact_scaling,
    b.param_elements,
    b.input_bytes_per_sample,
  )
  return a, b


# -- generated steps: dense layers, flattening and splitting the tokens, attention, a gathered loss --


def _step(depth: int, split: bool, attention: bool, gathered: bool):
  def loss(params, x, labels):
    h = x
    for w in params["w"][:depth]:
      h = jnp.tanh(h @ w)
    if split:  # [b, s, d] -> [b * s, d] -> back
      b, s, d = h.shape
      h = (h.reshape(b * s, d) * 2.0).reshape(b, s, d)
    if attention:
      scores = jnp.einsum("bsd,btd->bst", h, h) / 4.0
      mask = jnp.tril(jnp.ones((h.shape[1], h.shape[1]), bool))
      scores = jnp.where(mask, scores, -1e9)
      h = jnp.einsum("bst,btd->bsd", jax.nn.softmax(scores, -1), h)
    logits = h @ params["out"]
    if gathered:
      logp = jax.nn.log_softmax(logits, -1)
      return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], -1))
    return jnp.mean(logits**2)

  def step(params, x, labels):
    g = jax.grad(loss)(params, x, labels)
    return jax.tree.map(lambda p, d: p - 0.1 * d, params, g)

  return step


@settings(max_examples=12, deadline=None)
@given(
  batch=st.integers(1, 6),
  seq=st.sampled_from([3, 5, 8]),
  depth=st.integers(1, 3),
  split=st.booleans(),
  attention=st.booleans(),
  gathered=st.booleans(),
)
def test_followed_exponents_are_the_two_traces(batch, seq, depth, split, attention, gathered):
  d, v = 8, 11
  params = {
    "w": [jax.ShapeDtypeStruct((d, d), jnp.float32) for _ in range(depth)],
    "out": jax.ShapeDtypeStruct((d, v), jnp.float32),
  }
  args = (
    params,
    jax.ShapeDtypeStruct((batch, seq, d), jnp.float32),
    jax.ShapeDtypeStruct((batch, seq), jnp.int32),
  )
  fn = _step(depth, split, attention, gathered)
  walker, traced, followed = _exps_two_traces(fn, args, (1, 2))
  if walker.batch_unknown is None:  # followed: every site as the second trace says
    assert followed == traced
  _graphs_equal(fn, args, (1, 2))


def test_a_loop_over_samples_is_followed():
  """A scan over the samples: its slices lose the batch axis, its stacked outputs get it back."""

  def step(w, x):
    return jax.lax.map(lambda xi: jnp.tanh(xi @ w), x)

  args = (jax.ShapeDtypeStruct((4, 4), jnp.float32), jax.ShapeDtypeStruct((6, 3, 4), jnp.float32))
  walker, traced, followed = _exps_two_traces(step, args, (1,))
  assert walker.batch_unknown is None
  assert followed == traced
  _graphs_equal(step, args, (1,))


def test_a_while_over_samples_is_traced_twice():
  """A while loop over per-sample data is not followed: the graph is the two traces' (exact)."""

  def step(w, x):
    return jax.lax.while_loop(lambda c: c[1] < 3, lambda c: (jnp.tanh(c[0] @ w), c[1] + 1), (x, 0))[0]

  args = (jax.ShapeDtypeStruct((4, 4), jnp.float32), jax.ShapeDtypeStruct((6, 3, 4), jnp.float32))
  walker, _, _ = _exps_two_traces(step, args, (1,))
  assert walker.batch_unknown is not None
  a, b = _graphs_equal(step, args, (1,))
  assert a.exact_scaling and b.exact_scaling


def test_a_step_that_prints_or_logs_its_batch_costs_what_it_costs_without():
  """``jax.debug.print`` / ``jax.debug.callback`` of a value with the batch axis (an equation with no
  output) was a bare IndexError in the batch-axis walk; host logging is no wafer work."""

  def plain(w, x):
    return w - 1e-3 * jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)

  def printing(w, x):
    jax.debug.print("x {x}", x=x)
    jax.debug.callback(lambda v: None, x)
    return plain(w, x)

  args = (jax.ShapeDtypeStruct((64, 64), jnp.float32), jax.ShapeDtypeStruct((16, 64), jnp.float32))
  walker, traced, followed = _exps_two_traces(printing, args, (1,))
  assert walker.batch_unknown is None and followed == traced
  want, got = estimate(plain, *args), estimate(printing, *args)
  assert got.samples_per_sec == pytest.approx(want.samples_per_sec, rel=1e-9)


def test_unknown_scaling_is_refused():
  with pytest.raises(G.TraceError, match="scaling="):
    G.extract(lambda x: x * 2, (jnp.ones((2, 3)),), batch_argnums=(0,), compute_bits=16, scaling="guess")
  # wafer.estimate's arguments are EstimateErrors, as its docstring says (it was extract's TraceError)
  from wafer.errors import EstimateError

  with pytest.raises(EstimateError, match="scaling='guess'; allowed: 'traced', 'dataflow'"):
    estimate(lambda x: (x * 2).sum(), jnp.ones((2, 3)), scaling="guess")


# -- the shipped configs: the estimate --validate_only writes is the two traces' one --


def _config_step(path: Path, *overrides: str):
  from wafer import runner, train
  from wafer.compile import cheap_sharding_probes

  with tempfile.TemporaryDirectory() as model_dir:
    keys = [f"runconfig.model_dir={model_dir}", "runconfig.validate_only=true", *overrides]
    plan = runner.load_plan(path, keys)
  with cheap_sharding_probes():
    state, batch = train.step_shapes(plan.task, plan.optimizer, plan.loss_scale, plan.seed)
  return jax.jit(train.make_train_step(plan.task, plan.optimizer, plan.policy)), (state, batch), plan


@pytest.mark.parametrize(
  "config",
  [
    "models/gpt2/configs/params_gpt2_tiny.yaml",
    "models/fc_mnist/configs/params_fc_mnist.yaml",
    "models/mlp/configs/params_mlp.yaml",
    "models/bert/configs/params_bert_tiny.yaml",
  ],
)
def test_config_estimate_is_the_two_traces(config):
  from wafer.compile import cheap_sharding_probes

  step, args, plan = _config_step(ROOT / config)
  kwargs = {"batch_size": plan.task.batch_size, "policy": plan.policy}
  with cheap_sharding_probes():
    a = estimate(step, *args, **kwargs)
    b = estimate(step, *args, scaling="dataflow", **kwargs)
  assert a.fits == b.fits
  assert a.to_text() == b.to_text()
  if a.fits:
    assert a.samples_per_sec == b.samples_per_sec


@pytest.mark.parametrize(
  "config, overrides",
  [
    ("models/gpt2/configs/params_gpt2_tiny.yaml", ()),
    ("models/gpt2/configs/params_gpt2_tiny.yaml", ("model.dropout_rate=0.1",)),  # random bits per sample
    ("models/bert/configs/params_bert_tiny.yaml", ()),
    ("models/fc_mnist/configs/params_fc_mnist.yaml", ()),
  ],
)
def test_shipped_models_are_followed(config, overrides):
  """The shipped models are followed in one trace (what makes validation fast), every site as the two
  traces say."""
  from wafer.compile import cheap_sharding_probes

  step, args, _ = _config_step(ROOT / config, *overrides)
  with cheap_sharding_probes():
    walker, traced, followed = _exps_two_traces(step, args, (1,))
  assert walker.batch_unknown is None
  assert followed == traced


@pytest.mark.parametrize("name", ["gpt2_small", "llama_7b", "dit_2b_cs2", "esm2_35m", "bert_large_ws1024"])
def test_workload_estimates_are_the_two_traces(name):
  """The cost model's workloads (layers under ``lax.scan``): followed or traced twice, the same report."""
  w = workloads.WORKLOADS[name]
  a, b = w.estimate(), w.estimate(scaling="dataflow")
  assert a.to_text() == b.to_text()


@pytest.mark.slow
@pytest.mark.parametrize(
  "params",
  [
    "tests/data/modelzoo/Release_2.3.1/gpt2/params_gpt2_xl.yaml",
    "tests/data/modelzoo/Release_2.3.1/gpt3/params_gpt3_20b.yaml",
  ],
)
def test_modelzoo_files_of_the_speed_budget_are_followed(params):
  """Issue 26's validation-speed files: followed in one trace, every site as the two traces say."""
  from wafer.compile import cheap_sharding_probes

  step, args, _ = _config_step(ROOT / params)
  with cheap_sharding_probes():
    walker, traced, followed = _exps_two_traces(step, args, (1,))
  assert walker.batch_unknown is None
  assert followed == traced
