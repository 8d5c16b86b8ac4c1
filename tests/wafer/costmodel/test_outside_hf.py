"""The estimate of transformers written the way Hugging Face's Flax ports write them.

`transformers`' Flax models (FlaxGPT2, FlaxLlama, FlaxBart, FlaxT5...) are flax.linen modules with
habits of their own: the causal mask is built in ``setup`` from ``iota`` over all
``max_position_embeddings`` (``nn.make_causal_mask``), sliced to the sequence, combined with the
batch's padding mask (``nn.combine_masks``: a logical ``and``, cast to float32) and *added* to the
scores as a bias, ``lax.select(mask > 0, full(0), full(finfo(dtype).min))``; the position table is
looked up at ``position_ids = broadcast_to(arange(s), (b, s))``; parameters come as a ``FrozenDict``;
dropout is ``nn.Dropout(deterministic=...)``. The model below writes GPT-2 that way (no import of
`transformers`), and the checks are the invariants the estimate owes any step: a causal mask is
found however it is applied (select or additive bias, a ``jnp`` or a NumPy triangle), nothing that
is not causal (padding, a learned bias, T5's relative-position bias) is taken for one, and a table
read at broadcast positions is one table, whatever the batch. Shapes are abstract; nothing is
computed.
"""

from __future__ import annotations

import math

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

import wafer
from tests.wafer.costmodel.helpers import sds
from wafer.costmodel import extract

MASKS = ("hf_additive", "hf_flax_mask", "where_bias", "numpy_triu", "select_tril")
NOT_CAUSAL = ("none", "padding_additive", "learned_bias", "relative_bias")


pytestmark = pytest.mark.usefixtures(
  "standard_promotion"
)  # Hugging Face's int and bool masks (tests/conftest.py)


class Attention(nn.Module):
  """GPT-2's self-attention as `FlaxGPT2Attention` writes it, with the mask written ``mask`` ways."""

  d: int
  heads: int
  max_positions: int
  mask: str

  def setup(self) -> None:
    self.c_attn = nn.Dense(3 * self.d)
    self.c_proj = nn.Dense(self.d)
    self.resid_dropout = nn.Dropout(rate=0.1)
    self.causal_mask = nn.make_causal_mask(jnp.ones((1, self.max_positions), dtype="bool"), dtype="bool")
    if self.mask == "learned_bias":
      self.bias = self.param(
        "bias", nn.initializers.zeros, (self.heads, self.max_positions, self.max_positions)
      )
    if self.mask in ("relative_bias", "causal_relative_bias"):
      self.relative_attention_bias = nn.Embed(32, self.heads)

  def _relative_bias(self, s: int) -> jax.Array:
    """T5's bidirectional relative-position bias (`FlaxT5Attention.compute_bias`): buckets of
    ``memory - context`` positions, one learned value per bucket and head."""
    relative = jnp.arange(s, dtype="i4")[None, :] - jnp.arange(s, dtype="i4")[:, None]
    buckets = (relative > 0).astype("i4") * 16
    relative = jnp.abs(relative)
    is_small = relative < 8
    large = 8 + (jnp.log(relative.astype(jnp.float32) / 8) / math.log(128 / 8) * 8).astype("i4")
    buckets = buckets + jnp.where(is_small, relative, jnp.minimum(large, 15))
    return self.relative_attention_bias(buckets).transpose((2, 0, 1))[None]

  def __call__(self, x: jax.Array, attention_mask: jax.Array, deterministic: bool) -> jax.Array:
    b, s, _ = x.shape
    q, k, v = jnp.split(self.c_attn(x), 3, axis=2)
    q, k, v = (t.reshape((b, s, self.heads, self.d // self.heads)) for t in (q, k, v))
    causal = jnp.broadcast_to(self.causal_mask[:, :, :s, :s], (b, 1, s, s))
    padding = jnp.broadcast_to(jnp.expand_dims(attention_mask, axis=(-3, -2)), causal.shape)
    fmin = jnp.finfo(jnp.float32).min
    bias, mask = None, None
    if self.mask == "hf_additive":  # FlaxGPT2Attention, FlaxLlamaAttention, FlaxBartAttention
      combined = nn.combine_masks(padding, causal)
      bias = lax.select(combined > 0, jnp.full(combined.shape, 0.0), jnp.full(combined.shape, fmin))
    elif self.mask == "hf_flax_mask":  # the combined mask handed to flax as ``mask=``
      mask = nn.combine_masks(padding, causal, dtype=jnp.bool_)
    elif self.mask == "where_bias":
      tril = jnp.tril(jnp.ones((s, s), jnp.bool_))
      bias = jnp.broadcast_to(jnp.where(tril, jnp.float32(0), -jnp.inf), (b, 1, s, s))
    elif self.mask == "numpy_triu":  # a PyTorch port's ``triu(full(-inf), 1)``, closed over
      bias = jnp.broadcast_to(np.triu(np.full((s, s), -np.inf, np.float32), 1), (b, 1, s, s))
    elif self.mask == "select_tril":
      mask = jnp.broadcast_to(jnp.tril(jnp.ones((s, s), jnp.bool_)), (b, 1, s, s))
    elif self.mask == "padding_additive":  # FlaxBertSelfAttention: from the batch only
      bias = lax.select(padding > 0, jnp.full(padding.shape, 0.0), jnp.full(padding.shape, fmin))
    elif self.mask == "learned_bias":
      bias = jnp.broadcast_to(self.bias[None, :, :s, :s], (b, self.heads, s, s))
    elif self.mask == "band_bias":  # bidirectional local attention (ModernBERT, Longformer): |i - j| <= w
      near = jnp.abs(jnp.arange(s)[:, None] - jnp.arange(s)[None, :]) <= 4
      bias = jnp.broadcast_to(jnp.where(near, jnp.float32(0), fmin), (b, 1, s, s))
    elif self.mask == "relative_bias":
      bias = jnp.broadcast_to(self._relative_bias(s), (b, self.heads, s, s))
    elif self.mask == "causal_relative_bias":  # T5's decoder: position_bias + the causal mask's bias
      combined = nn.combine_masks(padding, causal)
      bias = self._relative_bias(s) + lax.select(
        combined > 0, jnp.full(combined.shape, 0.0), jnp.full(combined.shape, -1e10)
      )
    weights = nn.dot_product_attention_weights(
      q, k, bias=bias, mask=mask, dropout_rng=None, dropout_rate=0.1, deterministic=deterministic
    )
    out = jnp.einsum("...hqk,...khd->...qhd", weights, v).reshape((b, s, self.d))
    return self.resid_dropout(self.c_proj(out), deterministic=deterministic)


class Block(nn.Module):
  d: int
  heads: int
  max_positions: int
  mask: str

  @nn.compact
  def __call__(self, x: jax.Array, attention_mask: jax.Array, deterministic: bool) -> jax.Array:
    x = x + Attention(self.d, self.heads, self.max_positions, self.mask, name="attn")(
      nn.LayerNorm(name="ln_1")(x), attention_mask, deterministic
    )
    h = nn.gelu(nn.Dense(4 * self.d, name="c_fc")(nn.LayerNorm(name="ln_2")(x)), approximate=True)
    return x + nn.Dense(self.d, name="c_proj")(h)


class Blocks(nn.Module):
  """`FlaxGPT2BlockCollection` / `FlaxBertLayerCollection`: the layers, named ``"0"``, ``"1"``...,
  each under ``nn.remat`` with gradient checkpointing (``FlaxBertCheckpointLayer``)."""

  layers: int
  d: int
  heads: int
  max_positions: int
  mask: str
  remat: bool

  @nn.compact
  def __call__(self, x: jax.Array, attention_mask: jax.Array, deterministic: bool) -> jax.Array:
    block = nn.remat(Block, static_argnums=(3,)) if self.remat else Block
    masks = self.mask.split(",")  # one for all layers, or one per layer
    for i in range(self.layers):
      x = block(self.d, self.heads, self.max_positions, masks[i % len(masks)], name=str(i))(
        x, attention_mask, deterministic
      )
    return x


class LM(nn.Module):
  """`FlaxGPT2LMHeadModule`'s shape: ``wte``, ``wpe`` read at broadcast ``position_ids``, blocks, a
  tied LM head."""

  layers: int
  d: int
  heads: int
  vocab: int
  max_positions: int
  mask: str
  positions: str = "broadcast_ids"
  remat: bool = False

  @nn.compact
  def __call__(self, ids: jax.Array, attention_mask: jax.Array, deterministic: bool = True) -> jax.Array:
    b, s = ids.shape
    wte = nn.Embed(self.vocab, self.d, name="wte")
    wpe = nn.Embed(self.max_positions, self.d, name="wpe")
    if self.positions == "broadcast_ids":  # FlaxGPT2Model: position_ids = broadcast_to(arange(s), (b, s))
      pos = wpe(jnp.broadcast_to(jnp.arange(s)[None, :], (b, s)))
    else:
      pos = wpe.embedding[None, :s]
    x = nn.Dropout(rate=0.1)(wte(ids.astype("i4")) + pos, deterministic=deterministic)
    x = Blocks(self.layers, self.d, self.heads, self.max_positions, self.mask, self.remat, name="h")(
      x, attention_mask, deterministic
    )
    return wte.attend(nn.LayerNorm(name="ln_f")(x))


def _step(model: LM):
  """A train step as a user writes one for a Hugging Face model: FrozenDict params, AdamW, a batch
  of ids, attention mask and labels."""
  tx = optax.adamw(1e-3)

  def step(params, opt_state, ids, attention_mask, labels):
    def loss(p):
      logits = model.apply({"params": p}, ids, attention_mask)
      return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, labels))

    value, grads = jax.value_and_grad(loss)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value

  return step, tx


def _args(model: LM, batch: int, seq: int):
  ids = sds(batch, seq, dtype=jnp.int32)
  params = freeze(jax.eval_shape(lambda i: model.init(jax.random.key(0), i, i)["params"], ids))
  step, tx = _step(model)
  return step, (params, jax.eval_shape(tx.init, params), ids, ids, ids)


def _attention_products(model: LM, batch: int, seq: int) -> list:
  step, args = _args(model, batch, seq)
  graph = extract(step, args, batch_argnums=(2, 3, 4), compute_bits=16)
  # (every layer's: a folded loop's kernel holds one layer's products, ``count`` times)
  return [
    m
    for k in graph.kernels
    for _ in range(k.count)
    for m in k.matmuls
    if not m.weight and m.instances.at_trace > 1
  ]


@pytest.mark.parametrize("mask", MASKS)
def test_a_causal_mask_is_found_however_it_is_applied(mask):
  products = _attention_products(LM(2, 32, 2, 50, 64, mask), 2, 16)
  assert len(products) == 12  # two layers of Q K^T, P V and their four backward products
  kept = float(np.tri(16, 16).mean())  # (s + 1) / (2 s) of the scores
  assert all(m.kept == pytest.approx(kept) for m in products), [m.kept for m in products]


@pytest.mark.parametrize("mask", NOT_CAUSAL)
def test_nothing_else_is_taken_for_a_causal_mask(mask):
  products = _attention_products(LM(2, 32, 2, 50, 64, mask), 2, 16)
  assert len(products) == 12
  assert not any(m.masked for m in products)


def test_a_band_keeps_its_band():
  """Bidirectional local attention (``abs(i - j) <= 4`` as a bias): not causal, and not full."""
  products = _attention_products(LM(2, 32, 2, 50, 64, "band_bias"), 2, 16)
  band = np.abs(np.arange(16)[:, None] - np.arange(16)[None, :]) <= 4
  assert len(products) == 12 and all(m.kept == pytest.approx(band.mean()) for m in products)


def test_a_masked_layer_does_not_mask_the_others_through_the_optimizer():
  """T5: a bidirectional layer (the encoder) and a causal one (the decoder), each with a learned
  relative-position bias. The causal layer's bias gradient reaches AdamW, whose step count every
  other parameter's update reads; the mask must not follow that path into the bidirectional layer."""
  step, args = _args(LM(2, 32, 2, 50, 64, "relative_bias,causal_relative_bias"), 2, 16)
  graph = extract(step, args, batch_argnums=(2, 3, 4), compute_bits=16)
  by_layer = {
    layer: [
      m.masked
      for k in graph.kernels
      if f"/{layer}/" in k.name + "/"
      for m in k.matmuls
      if not m.weight and m.instances.at_trace > 1
    ]
    for layer in ("0", "1")
  }
  assert by_layer["0"] == [False] * 6 and by_layer["1"] == [True] * 6, by_layer
  kept = [m.kept for k in graph.kernels if "/1/" in k.name + "/" for m in k.matmuls if m.masked]
  assert kept == pytest.approx([np.tri(16, 16).mean()] * 6)  # the learned bias does not hide the mask


@settings(max_examples=6)
@given(
  st.sampled_from(MASKS),
  st.integers(1, 3),
  st.sampled_from([(32, 2), (48, 3), (64, 8)]),
  st.sampled_from([8, 24, 64]),
)
def test_the_mask_is_found_over_generated_shapes(mask, batch, width_heads, seq):
  d, heads = width_heads
  products = _attention_products(LM(1, d, heads, 40, 64, mask), batch, seq)
  assert len(products) == 6 and all(m.masked for m in products)


S = 1024  # S^2 > the wafer's PEs: the attention rows are a large part of the estimate


@pytest.mark.parametrize("mode", ["weight_streaming", pytest.param("pipeline", marks=pytest.mark.slow)])
def test_the_additive_mask_gets_the_estimate_of_the_select_mask(mode):
  """The same causal GPT-2 step with the mask added as a bias (Hugging Face) or selected (``jnp.where``)
  is the same computation: the same estimate; and the mask is worth something."""
  rates = {}
  for mask in ("hf_additive", "select_tril", "none"):
    step, args = _args(LM(2, 128, 2, 100, S, mask), 4, S)
    # compute rates: this small step's time is mostly the fixed per-step cost (Calibration.step_overhead_s)
    rates[mask] = wafer.estimate(step, *args, mode=mode).compute_samples_per_sec
  assert abs(math.log(rates["hf_additive"] / rates["select_tril"])) < math.log(1.02), rates
  assert rates["hf_additive"] > 1.1 * rates["none"], rates


def _param_elements(positions: str, batch: int, seq: int) -> int:
  step, args = _args(LM(2, 32, 2, 50, 64, "hf_additive", positions), batch, seq)
  return extract(step, args, batch_argnums=(2, 3, 4), compute_bits=16).param_elements


@pytest.mark.parametrize("batch", [1, 2, 8])
def test_a_table_read_at_broadcast_positions_is_one_table(batch):
  """``wpe(broadcast_to(arange(s), (b, s)))`` reads the position table, not a ``b x s x d`` parameter:
  at ``s = max_positions`` the parameter count is the model's, as with ``wpe.embedding[None, :s]``,
  and at a shorter sequence it does not grow with the batch."""
  step, args = _args(LM(2, 32, 2, 50, 64, "hf_additive"), batch, 64)
  n_params = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(args[0]))
  assert _param_elements("broadcast_ids", batch, 64) == n_params == _param_elements("slice", batch, 64)
  assert _param_elements("broadcast_ids", batch, 16) == _param_elements("broadcast_ids", 1, 16)


def test_gradient_checkpointing_keeps_the_layers_kernels():
  """Hugging Face's gradient checkpointing wraps each layer of a layer collection in ``nn.remat``; its
  backward pass is named ``transpose(jvp(LM/h))/jvp(LM/h)/0/...``: the layers' kernels, not a second
  set named ``LM/h/LM/h/0/...`` that costs every layer's backward as a layer of its own."""
  names, rates = {}, {}
  for remat in (False, True):
    step, args = _args(LM(2, 64, 2, 50, 64, "hf_additive", remat=remat), 4, 64)
    report = wafer.estimate(step, *args, mode="weight_streaming")
    names[remat], rates[remat] = [row.name for row in report.kernels], report.samples_per_sec
  assert names[True] == names[False]
  assert 0.75 < rates[True] / rates[False] < 1.0, rates  # the recomputed forward costs, not more
