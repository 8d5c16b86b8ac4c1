"""`precision` on models written the way Hugging Face's Flax ports write them.

`transformers`' Flax models (FlaxGPT2, FlaxLlama, FlaxBart, ...) are flax.linen modules with habits
of their own, reproduced here without importing `transformers`: parameters in a ``FrozenDict``
whose layers are keyed ``"0"``, ``"1"``...; the causal mask built in ``setup`` from ``iota``
(``nn.make_causal_mask``), combined with the batch's padding mask (``nn.combine_masks``) and added
to the scores as ``lax.select(mask > 0, full(0), full(jnp.finfo(dtype).min))``; einsum attention
(``nn.dot_product_attention_weights``); ``nn.Dropout(deterministic=...)``; the position table read
at ``position_ids = broadcast_to(arange(s), (b, s))``; a tied LM head (``wte.attend``).
"""

from __future__ import annotations

import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.core import freeze
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax

import precision
from precision.testing import assert_close, assert_same_floats, same_floats, ulp_distance
from tests.devices import true_float32
from tests.tolerances import AUTOCAST_TRANSFORMER

B, S, D, HEADS, VOCAB = 2, 8, 32, 2, 40


pytestmark = pytest.mark.usefixtures(
  "standard_promotion"
)  # Hugging Face's int and bool masks (tests/conftest.py)


class Attention(nn.Module):
  """`FlaxGPT2Attention`: the mask is an additive bias of ``finfo(float32).min``."""

  @nn.compact
  def __call__(self, x: jax.Array, attention_mask: jax.Array, deterministic: bool) -> jax.Array:
    b, s, _ = x.shape
    causal = nn.make_causal_mask(jnp.ones((1, 16), dtype="bool"), dtype="bool")[:, :, :s, :s]
    causal = jnp.broadcast_to(causal, (b, 1, s, s))
    padding = jnp.broadcast_to(jnp.expand_dims(attention_mask, axis=(-3, -2)), causal.shape)
    mask = nn.combine_masks(padding, causal)
    bias = lax.select(mask > 0, jnp.full(mask.shape, 0.0), jnp.full(mask.shape, jnp.finfo(jnp.float32).min))
    q, k, v = jnp.split(nn.Dense(3 * D, name="c_attn")(x), 3, axis=2)
    q, k, v = (t.reshape((b, s, HEADS, D // HEADS)) for t in (q, k, v))
    w = nn.dot_product_attention_weights(q, k, bias=bias, dropout_rate=0.1, deterministic=deterministic)
    out = jnp.einsum("...hqk,...khd->...qhd", w, v).reshape((b, s, D))
    return nn.Dropout(rate=0.1)(nn.Dense(D, name="c_proj")(out), deterministic=deterministic)


class LM(nn.Module):
  """`FlaxGPT2LMHeadModule`'s shape, two blocks keyed ``"0"`` and ``"1"``."""

  @nn.compact
  def __call__(self, ids: jax.Array, attention_mask: jax.Array, deterministic: bool = True) -> jax.Array:
    b, s = ids.shape
    wte = nn.Embed(VOCAB, D, name="wte")
    x = wte(ids) + nn.Embed(16, D, name="wpe")(jnp.broadcast_to(jnp.arange(s)[None, :], (b, s)))
    for i in range(2):
      x = x + Attention(name=str(i))(nn.LayerNorm(name=f"ln_{i}")(x), attention_mask, deterministic)
    return wte.attend(nn.LayerNorm(name="ln_f")(x))


MODEL = LM()


def loss(params, ids, attention_mask, labels):
  logits = MODEL.apply({"params": params}, ids, attention_mask)
  return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, labels))


def _batch(left_padding: int = 3):
  ids = jax.random.randint(jax.random.key(1), (B, S), 0, VOCAB, jnp.int32)
  mask = jnp.ones((B, S), jnp.int32).at[0, :left_padding].set(0)  # left padding, as for generation
  return ids, mask, jnp.roll(ids, -1, axis=1)


def _params():
  ids, mask, _ = _batch()
  return freeze(MODEL.init(jax.random.key(0), ids, mask)["params"])


POLICIES = [  # level 2 rounds the attention scores (the rule at work); cbfloat16 level 0 as a control
  pytest.param(
    precision.Policy(compute=fmt, level=level),
    id=f"{fmt}-L{level}",
    marks=() if (fmt, level) == ("cbfloat16", 2) else pytest.mark.slow,
  )
  for fmt, level in (("cbfloat16", 0), ("cbfloat16", 2), ("bfloat16", 2), ("float16", 2))
] + [  # modelzoo's override: the attention softmax in cbfloat16 at level 1 as well
  pytest.param(
    precision.Policy.from_config(mixed_precision=True, fp16_type="cbfloat16", precision_opt_level=1),
    id="from_config-cbfloat16-L1",
  )
]


@pytest.mark.parametrize("policy", POLICIES)
def test_a_left_padded_batch_stays_finite_with_the_mask_bias_in_16_bits(policy):
  """A left-padded query sees no key at all: every score of its row gets ``finfo(float32).min``.
  In float32 the row is uniform; rounded to a 16-bit format that bias was -inf, and the softmax
  of a row of -inf is NaN (``inf - inf``): the loss and every gradient were NaN at level 2 and
  with the cbfloat16 override. The bias is the compute format's lowest number instead."""
  params, batch = _params(), _batch()
  ref_loss, ref_grads = jax.jit(jax.value_and_grad(loss))(params, *batch)
  mixed_loss, mixed_grads = jax.jit(precision.autocast(jax.value_and_grad(loss), policy))(params, *batch)
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(mixed_grads))
  tol = AUTOCAST_TRANSFORMER[policy.compute.name]
  assert abs(float(mixed_loss) - float(ref_loss)) <= tol.loss_rtol * abs(float(ref_loss))
  flat_m, flat_r = (
    np.concatenate([np.ravel(g) for g in jax.tree.leaves(t)]) for t in (mixed_grads, ref_grads)
  )
  assert np.linalg.norm(flat_m - flat_r) <= tol.grad_rtol * np.linalg.norm(flat_r)
  assert not np.array_equal(flat_m, flat_r)  # and rounding happened


@pytest.mark.slow  # over 7 s on the 2-core CI machine; runs in the slow stage
@pytest.mark.parametrize("level", [0, 1, 2])
def test_the_float32_policy_is_the_identity_under_jit_and_vmap(level):
  """Values and gradients bit for bit, FrozenDict and all (compared leaf by leaf)."""
  params, batch = _params(), _batch()
  f32 = precision.Policy(compute="float32", level=level)
  vg = jax.value_and_grad(loss)
  # The float32 policy is the function with true float32 products (tests/devices.py; TF32 on GPUs).
  want = jax.jit(true_float32(vg))(params, *batch)
  assert_same_floats(jax.jit(precision.autocast(vg, f32))(params, *batch), want)
  one = lambda p, *xs: loss(p, *(x[None] for x in xs))  # noqa: E731
  per_example = jax.vmap(precision.autocast(one, f32), in_axes=(None, 0, 0, 0))(params, *batch)
  assert_same_floats(per_example, true_float32(jax.vmap(one, in_axes=(None, 0, 0, 0)))(params, *batch))


def test_a_comparison_with_finfo_max_keeps_float32s_number():
  """The rule is for a value the program computes with (the mask bias), not for a test of float32
  values: an overflow count or a clip at ``+-finfo(float32).max`` keeps its meaning."""
  big = jnp.finfo(jnp.float32).max

  def f(x):
    return jnp.sum(jnp.abs(x) > big * 0.5), jnp.sum(jnp.abs(x) >= big), jnp.clip(x, -big, big)

  x = jnp.float32([3.0e38, -3.395e38, 1.0])
  policy = precision.Policy(compute="bfloat16", level=2)
  counts_over, counts_max, clipped = jax.jit(precision.autocast(f, policy))(x)
  assert int(counts_over) == 2 and int(counts_max) == 0  # 3.395e38 < float32's max
  assert np.isfinite(clipped).all()


def test_the_numerics_report_of_a_left_padded_batch_is_finite():
  """The report's policy run is the autocast run (finite now), and its float32 shadow reads the mask
  bias as the policy run does: the bias is not reported as an error."""
  params, batch = _params(), _batch()
  policy = precision.Policy(compute="cbfloat16", level=2)
  report = precision.numerics_report(loss, policy, params, *batch)
  assert np.isfinite(report.outputs)
  assert_same_floats(report.outputs, jax.jit(precision.autocast(loss, policy))(params, *batch))
  scores_plus_bias = [r for r in report.rows if r.primitive == "add" and r.scope in ("LM/0", "LM/1")]
  assert len(scores_plus_bias) == 2
  assert all(r.sqnr_db > 20 for r in scores_plus_bias), [(r.source, r.sqnr_db) for r in scores_plus_bias]


# ---- precision.testing on parameter trees ----

layer_trees = st.integers(1, 4).map(
  lambda n: freeze({"h": {str(i): {"kernel": np.full((2, 3), i + 1.0, np.float32)} for i in range(n)}})
)


@settings(max_examples=20)
@given(layer_trees, st.data())
def test_a_changed_leaf_of_a_frozendict_fails_and_is_named(tree, data):
  """NumPy reads a mapping as its keys: ``np.asarray(FrozenDict({"0": w, "1": w}))`` is the strings
  "0", "1", so `assert_same_floats` compared the layer names as the numbers 0 and 1 and passed
  whatever the weights. Trees are compared leaf by leaf, the failure naming the leaf."""
  layer = data.draw(st.sampled_from(sorted(tree["h"])))
  changed = tree.copy({"h": tree["h"].copy({layer: {"kernel": tree["h"][layer]["kernel"] + 1.0}})})
  assert_same_floats(tree, tree)
  assert_close(tree, tree, "cbfloat16", ulps=0)
  with pytest.raises(AssertionError, match=rf"\['h'\]\['{layer}'\]\['kernel'\]"):
    assert_same_floats(changed, tree)
  with pytest.raises(AssertionError, match=rf"\['h'\]\['{layer}'\]\['kernel'\]: 6 of 6 elements differ"):
    assert_close(changed, tree, "cbfloat16", ulps=1)


class Subclass(dict):
  """A dict subclass JAX does not know: one leaf to JAX (flattening it recursed forever)."""


def test_trees_of_different_structure_fail_and_single_array_helpers_refuse_a_tree():
  tree = freeze({"h": {"0": np.ones(3, np.float32)}})
  with pytest.raises(AssertionError, match="pytree structures differ"):
    assert_same_floats(tree, freeze({"h": {"1": np.ones(3, np.float32)}}))
  with pytest.raises(AssertionError, match="pytree structures differ"):
    assert_close((np.float32(1), tree), np.float32(1), "bf16", ulps=1)
  for fn in (same_floats, lambda a, e: ulp_distance(a, e, "bf16")):
    with pytest.raises(TypeError, match="a pytree"):
      fn(tree, tree)
  # a FrozenDict matches a dict with the same keys; mappings JAX takes for leaves are read as dicts
  assert_same_floats(tree, {"h": {"0": np.ones(3, np.float32)}})
  assert_close(types.MappingProxyType({"h": {"0": np.ones(3)}}), tree, "bf16", ulps=0)
  with pytest.raises(AssertionError, match=r"\['h'\]\['0'\]"):
    assert_same_floats(Subclass(h=Subclass({"0": np.zeros(3, np.float32)})), tree)
  # arrays and lists of numbers are one array, as before
  assert_close([1.0, 2.0], np.float32([1.0, 2.0]), "bf16", ulps=0)
  assert same_floats([np.float32(1), np.float32(2)], np.float32([1, 2])).all()
