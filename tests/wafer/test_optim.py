"""Optimizers from the YAML against float64 references written here, clipping, weight decay, loss
scaling and the conditional (skipped) update (``docs/references.md``, "Dynamic loss scaling")."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from precision.loss_scale import DynamicLossScale, StaticLossScale
from tests.samples import bert_base_optimizer
from wafer.config import build_optimizer
from wafer.errors import OptimizerError
from wafer.optim import apply_gradients, decays, unscale_gradients

P0 = {"a": np.array([0.5, -1.0, 2.0]), "b": np.array([[0.25, -0.75], [1.5, 0.1]])}
G0 = {"a": np.array([0.1, -0.3, 0.2]), "b": np.array([[0.05, 0.4], [-0.2, 0.3]])}
G1 = {"a": np.array([-0.2, 0.1, 0.5]), "b": np.array([[0.3, -0.1], [0.2, 0.05]])}


def f32(tree):
  return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), tree)


def run(section, grads_seq, half="float32"):
  """Apply ``grads_seq`` (gradients of the unscaled loss) through build_optimizer + apply_gradients."""
  tx, ls = build_optimizer(section, half_dtype=half)
  params, state, step = f32(P0), tx.init(f32(P0)), jnp.zeros((), jnp.int32)
  fn = jax.jit(apply_gradients, static_argnums=0)
  for g in grads_seq:
    params, state, ls, step, _ = fn(tx, params, state, ls, step, ls.scale(f32(g)))
  return jax.tree.map(np.asarray, params), state, ls, step


def ref_adam(grads_seq, lr, b1, b2, eps, wd=0.0, decoupled=False, lamb=False, clip=None):
  p = {k: v.copy() for k, v in P0.items()}
  m = {k: np.zeros_like(v) for k, v in P0.items()}
  v = {k: np.zeros_like(x) for k, x in P0.items()}
  lrs = lr if isinstance(lr, list) else [lr] * len(grads_seq)
  for k, (lr_k, g) in enumerate(zip(lrs, grads_seq), start=1):
    g = {n: x.copy() for n, x in g.items()}
    if clip is not None:
      norm = np.sqrt(sum(np.sum(x * x) for x in g.values()))
      g = {n: x * min(1.0, clip / (norm + 1e-6)) for n, x in g.items()}
    for n in p:
      gn = g[n] + (wd * p[n] if not decoupled else 0)
      m[n] = b1 * m[n] + (1 - b1) * gn
      v[n] = b2 * v[n] + (1 - b2) * gn * gn
      u = (m[n] / (1 - b1**k)) / (np.sqrt(v[n] / (1 - b2**k)) + eps)
      if decoupled:
        u = u + wd * p[n]
      if lamb:
        pn, un = np.linalg.norm(p[n]), np.linalg.norm(u)
        u = u * (pn / un if pn > 0 and un > 0 else 1.0)
      p[n] = p[n] - lr_k * u
  return p


def ref_sgd(grads_seq, lrs, momentum=0.0, wd=0.0, value_clip=None):
  p = {k: v.copy() for k, v in P0.items()}
  buf = {k: np.zeros_like(v) for k, v in P0.items()}
  for lr, g in zip(lrs, grads_seq):
    for n in p:
      gn = g[n] if value_clip is None else np.clip(g[n], -value_clip, value_clip)
      gn = gn + wd * p[n]
      buf[n] = momentum * buf[n] + gn
      p[n] = p[n] - lr * buf[n]
  return p


def close(got, want, rtol=2e-6):
  for n in want:
    np.testing.assert_allclose(got[n], want[n], rtol=rtol, atol=1e-7)


def test_sgd_with_value_clip_and_coupled_weight_decay() -> None:
  sec = {"optimizer_type": "SGD", "learning_rate": 0.1, "weight_decay": 0.01, "max_gradient_value": 0.25}
  got, *_ = run(sec, [G0, G1])
  close(got, ref_sgd([G0, G1], [0.1, 0.1], wd=0.01, value_clip=0.25))


def test_momentum_with_linear_schedule() -> None:
  lr = {"scheduler": "Linear", "initial_learning_rate": 0.2, "end_learning_rate": 0.0, "total_iters": 4}
  got, *_ = run({"optimizer_type": "momentum", "learning_rate": lr, "momentum": 0.8}, [G0, G1, G0])
  close(got, ref_sgd([G0, G1, G0], [0.2, 0.15, 0.1], momentum=0.8))


@pytest.mark.parametrize("kind", ["adam", "AdamW", "lamb"])
def test_adam_family_two_steps_with_clipping_and_weight_decay(kind: str) -> None:
  sec = {
    "optimizer_type": kind,
    "learning_rate": 0.01,
    "betas": [0.9, 0.95],
    "eps": 1e-8,
    "weight_decay": 0.1,
    "max_gradient_norm": 0.3,
  }
  got, *_ = run(sec, [G0, G1])
  want = ref_adam(
    [G0, G1], 0.01, 0.9, 0.95, 1e-8, wd=0.1, decoupled=kind.lower() != "adam", lamb=kind == "lamb", clip=0.3
  )
  close(got, want, rtol=1e-5)


@pytest.mark.parametrize("kind,reference", [("adamw", optax.adamw), ("lamb", optax.lamb)])
def test_matches_optax_under_standard_promotion(kind, reference) -> None:
  got, *_ = run(
    {
      "optimizer_type": kind,
      "learning_rate": 1e-2,
      "weight_decay": 0.05,
      "eps": 1e-7,
      "beta1": 0.8,
      "beta2": 0.99,
    },
    [G0, G1, G0],
  )
  with jax.numpy_dtype_promotion("standard"):
    tx = reference(1e-2, b1=0.8, b2=0.99, eps=1e-7, weight_decay=0.05)
    params = f32(P0)
    state = tx.init(params)
    for g in [G0, G1, G0]:
      updates, state = tx.update(f32(g), state, params)
      params = optax.apply_updates(params, updates)
  close(got, jax.tree.map(np.asarray, params), rtol=2e-6)


def test_skipped_step_keeps_params_and_state_advances_the_step_and_dls_backs_off() -> None:
  """The global step counts every step, skipped or not (as ``wafer run``'s); the schedule's count is
  held (it held the step too, unlike the train step of ``wafer run``)."""
  lr = {"scheduler": "Linear", "initial_learning_rate": 0.3, "end_learning_rate": 0.0, "total_iters": 3}
  tx, ls = build_optimizer(
    {
      "optimizer_type": "adamw",
      "learning_rate": lr,
      "loss_scaling_factor": "dynamic",
      "initial_loss_scale": 1024.0,
      "steps_per_increase": 2,
    },
    half_dtype="float16",
  )
  assert isinstance(ls, DynamicLossScale) and float(ls.loss_scale) == 1024.0
  params, state, step = f32(P0), tx.init(f32(P0)), jnp.zeros((), jnp.int32)
  fn = jax.jit(apply_gradients, static_argnums=0)
  p1, s1, ls1, step1, ok = fn(tx, params, state, ls, step, ls.scale(f32(G0)))
  assert bool(ok) and int(step1) == 1
  bad = {"a": jnp.array([jnp.inf, 0.0, 0.0], jnp.float32), "b": f32(G1["b"])}
  p2, s2, ls2, step2, ok2 = fn(tx, p1, s1, ls1, step1, bad)
  assert not bool(ok2) and int(step2) == 2
  for x, y in zip(jax.tree.leaves((p1, s1)), jax.tree.leaves((p2, s2))):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert float(ls2.loss_scale) == 512.0 and int(ls2.num_skipped_steps) == 1
  # the schedule was held: the next applied step uses lr(1), as if the overflow never happened
  p3, s3, ls3, step3, _ = fn(tx, p2, s2, ls2, step2, ls2.scale(f32(G1)))
  clean = run({"optimizer_type": "adamw", "learning_rate": lr}, [G0, G1])[0]
  close(jax.tree.map(np.asarray, p3), clean, rtol=1e-6)
  close(clean, ref_adam([G0, G1], [0.3, 0.2], 0.9, 0.999, 1e-6), rtol=1e-5)
  assert int(step3) == 3 and int(s3[-1].count) == 2  # the schedule's count: applied steps only
  # DLS growth: after steps_per_increase + 1 = 3 clean steps since the back-off, the scale doubles
  p, s, lsx, st = p3, s3, ls3, step3
  scales = []
  for g in [G0, G1]:
    p, s, lsx, st, _ = fn(tx, p, s, lsx, st, lsx.scale(f32(g)))
    scales.append(float(lsx.loss_scale))
  assert scales == [512.0, 1024.0] and int(lsx.steps_since_rescale) == 0


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_16_bit_params_get_gradients_of_their_dtype_and_keep_their_state_dtype(dtype) -> None:
  """Unscaling gives float32 gradients; cast back to each parameter's dtype, the optimizer state of
  16-bit parameters stays 16-bit (a float32 one made a compiled step's second call fail)."""
  params = {"w": jnp.ones(3, dtype), "b": jnp.zeros((), jnp.float32)}
  ls = DynamicLossScale.create("float16", initial_loss_scale=8.0)
  grads = ls.scale({"w": jnp.full(3, 0.5, dtype), "b": jnp.float32(0.25)})
  unscaled = unscale_gradients(ls, grads, params)
  assert {k: v.dtype for k, v in unscaled.items()} == {"w": jnp.dtype(dtype), "b": jnp.dtype(jnp.float32)}
  assert unscaled["w"].tolist() == [0.5] * 3 and float(unscaled["b"]) == 0.25
  tx = optax.sgd(0.1, momentum=0.9)
  state = tx.init(params)
  result = jax.jit(apply_gradients, static_argnums=0)(tx, params, state, ls, jnp.int32(0), grads)
  dtypes = lambda tree: [x.dtype for x in jax.tree.leaves(tree)]
  assert dtypes(result.opt_state) == dtypes(state) and dtypes(result.params) == dtypes(params)


def test_a_float16_gradient_beyond_its_range_skips_the_step() -> None:
  """The finiteness test sees the gradients the update uses: 1e5 is finite in float32, inf in float16."""
  params = {"w": jnp.ones(2, jnp.float16)}
  ls = StaticLossScale.create(1.0)
  tx = optax.sgd(0.1)
  result = apply_gradients(
    tx, params, tx.init(params), ls, jnp.int32(0), {"w": jnp.full(2, 1e5, jnp.float32)}
  )
  assert not bool(result.grads_finite) and result.params["w"].tolist() == [1.0, 1.0] and int(result.step) == 1


def test_an_integer_parameter_is_refused_by_name() -> None:
  """``jax.grad(..., allow_int=True)`` gives a float0 gradient for an integer parameter: casting it to the
  parameter's dtype was ``ValueError: invalid literal for int() with base 10: b''``."""
  ls = DynamicLossScale.create("float16")
  params = {"w": jnp.ones(3), "n": jnp.int32(2)}
  grads = jax.grad(lambda p: ls.scale(jnp.sum(p["w"]) * p["n"].astype(jnp.float32)), allow_int=True)(params)
  tx = optax.sgd(0.1)
  with pytest.raises(
    ValueError, match=r"params\['n'\] is an int32 array \(its gradient is float0\).*Fix: keep"
  ):
    apply_gradients(tx, params, tx.init(params), ls, jnp.int32(0), grads)


def test_loss_scaling_choices() -> None:
  base = {"optimizer_type": "sgd", "learning_rate": 0.1}
  _, ls = build_optimizer({**base, "loss_scaling_factor": "dynamic"}, half_dtype="bfloat16")
  assert isinstance(ls, StaticLossScale) and float(ls.loss_scale) == 1.0
  _, ls = build_optimizer({**base, "loss_scaling_factor": "dynamic"}, half_dtype="cbfloat16")
  assert isinstance(ls, DynamicLossScale) and float(ls.loss_scale) == 2.0**31
  _, ls = build_optimizer({**base, "loss_scaling_factor": 128.0}, half_dtype="float16")
  assert isinstance(ls, StaticLossScale) and float(ls.loss_scale) == 128.0
  _, ls = build_optimizer({**base, "loss_scaling_factor": None}, half_dtype="float16")
  assert float(ls.loss_scale) == 1.0


def test_bert_base_optimizer_section_builds_and_steps() -> None:
  sec = bert_base_optimizer()
  assert sec["learning_rate"][0]["total_iters"] == 3200 and sec["learning_rate"][1]["total_iters"] == 77600
  got, _, ls, step = run(sec, [G0, G1], half="cbfloat16")
  # step 0 uses lr(0) = 0, step 1 uses lr(1) = peak / 3200
  want = ref_adam(
    [G0, G1], [0.0, 0.0001767766952966369 / 3200], 0.9, 0.999, 1e-6, wd=0.01, decoupled=True, clip=1.0
  )
  assert int(step) == 2 and float(ls.loss_scale) == 2.0**31
  close(got, want)


ERRORS = [
  (
    {"optimizer_type": "adamw", "learning_rate": 0.1, "max_gradient_norm": 1.0, "max_gradient_value": 0.5},
    r"Gradients can be clipped by norm\(=1.0\) or by value\(=0.5\), but not both",
  ),
  (
    {"optimizer_type": "adamm", "learning_rate": 0.1},
    r"optimizer\.optimizer_type: unknown optimizer 'adamm'; did you mean 'Adam'\?",
  ),
  (
    {"optimizer_type": "sgd", "learning_rate": 0.1, "weight_decai": 0.1},
    r"optimizer\.weight_decai: unknown key 'weight_decai'; did you mean 'weight_decay'\?",
  ),
  (
    {"optimizer_type": "sgd", "learning_rate": 0.1, "loss_scaling_factor": "auto"},
    r"must be a float, None, or 'dynamic'",
  ),
  (
    {"optimizer_type": "sgd", "learning_rate": 0.1, "max_gradient_norm": 0.0},
    r"optimizer\.max_gradient_norm: must be greater than 0 \(got 0\.0\)",
  ),
  (
    {"optimizer_type": "adam", "learning_rate": 0.1, "betas": [0.9, 1.5]},
    r"optimizer\.betas\[1\]: must be less than 1 \(got 1\.5\)",
  ),
  (
    {"optimizer_type": "sgd", "learning_rate": {"scheduler": "Linear", "initial_learning_rate": 1.0}},
    r"optimizer\.learning_rate: LinearLR: missing required key",
  ),
]


@pytest.mark.parametrize("section,message", ERRORS)
def test_errors(section, message: str) -> None:
  with pytest.raises(ValueError, match=message):
    build_optimizer(section, half_dtype="float16")


def test_cbfloat16_requires_dynamic_loss_scaling() -> None:
  with pytest.raises(OptimizerError, match="cbfloat16 requires dynamic loss scaling"):
    build_optimizer(
      {"optimizer_type": "sgd", "learning_rate": 0.1, "loss_scaling_factor": 1.0}, half_dtype="cbfloat16"
    )


# ---------------------------------------------------------------- which parameters decay (modelzoo's rule)

_NAMES = st.sampled_from(["kernel", "bias", "scale", "embedding", "attention_norm", "mlm_bias", "query", "w"])


@settings(max_examples=15, deadline=None)
@given(
  st.dictionaries(
    _NAMES, st.dictionaries(_NAMES, st.just(1.0), min_size=1, max_size=3), min_size=1, max_size=4
  ),
  st.sampled_from(["SGD", "Adam", "AdamW", "Lamb"]),
)
def test_weight_decay_skips_biases_and_normalization_gains_as_modelzoo(tree, optimizer):
  """Modelzoo (``common/optim_utils.py`` ``_should_apply_weight_decay``, every release): no decay for a
  parameter whose name contains ``bias`` or that belongs to a normalization layer (Flax: ``scale``).
  With zero gradients the only change is the decay: a leaf moves exactly when the rule says it decays."""
  params = jax.tree.map(lambda v: jnp.full((3,), 2.0, jnp.float32), tree)
  tx, _ = build_optimizer(
    {"optimizer_type": optimizer, "learning_rate": 0.1, "weight_decay": 0.5}, half_dtype="float32"
  )
  zeros = jax.tree.map(jnp.zeros_like, params)
  updates, _ = tx.update(zeros, tx.init(params), params)
  for path, u in jax.tree_util.tree_leaves_with_path(updates):
    names = [k.key for k in path]
    should = not any("bias" in n for n in names) and names[-1] != "scale"
    assert should == decays(path)
    moved = bool(np.any(np.asarray(u) != 0))
    assert moved == should, (names, optimizer)
    if should and optimizer in ("SGD", "AdamW"):  # lr * wd * p: SGD couples it, AdamW decouples it
      np.testing.assert_allclose(np.asarray(u), -0.1 * 0.5 * 2.0, rtol=1e-6)


def test_the_reference_models_decay_their_kernels_and_embeddings_only():
  from models.zoo import functional
  from wafer import registry
  from wafer.config import load_params

  registry.load_plugins()
  params = load_params("models/gpt2/configs/params_gpt2_tiny.yaml")
  shapes = jax.eval_shape(functional(params.model)[0], jax.random.key(0))
  decayed = {
    jax.tree_util.keystr(path).split("'")[-2]
    for path, _ in jax.tree_util.tree_leaves_with_path(shapes)
    if decays(path)
  }
  assert decayed == {"kernel", "embedding"}


def test_apply_gradients_runs_eagerly_on_numpy_float64_parameters():
  """NumPy float64 parameters are float32 to JAX; select_tree's dtype check compared the raw dtypes and
  refused them outside jit (review), though jnp.where returns the state's dtype there."""
  from wafer.optim import apply_gradients

  params = {"w": np.array([0.5, -1.0])}
  tx = optax.sgd(0.1)
  result = apply_gradients(
    tx, params, tx.init(params), StaticLossScale.create(1.0), 0, {"w": np.array([0.1, 0.2])}
  )
  np.testing.assert_allclose(np.asarray(result.params["w"]), [0.49, -1.02], rtol=1e-6)
  assert int(result.step) == 1
