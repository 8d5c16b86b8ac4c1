"""The activation memory of attention does not depend on how a step writes what the compiler is
free to rewrite (`wafer.costmodel.graph`, `wafer.costmodel.streaming`):

* **how the padding mask is broadcast.** A key mask ``bool[b, 1, 1, s]`` broadcast by ``where``,
  one broadcast to ``[b, 1, s, s]`` before the layers, or to ``[b, h, s, s]`` (every head) all
  hold ``b s`` values: a view is kept as the value it views, so no layer boundary carries an
  ``h s^2`` mask (BERT-large at MSL 10k "did not fit" at micro-batch 1 because of it);
* **the precision policy.** Under `precision.autocast` a 16-bit product is a platform-dependent
  call (native on GPUs), whose result is the product's: attention's core (the scores and the
  softmax, recomputed by the fused kernel's backward) is recognised as in the float32 step;
* **random bits**, made from their key where they are used (a dropout mask is regenerated from its
  seed): only the key enters a kernel;
* **a constant returned by a call** (``jnp.where``'s broadcast fill value, a linearized ``jit``'s
  residual) is not per-sample data entering a kernel.
"""

from __future__ import annotations

import collections
import functools

import jax
import jax.numpy as jnp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import precision
from wafer.costmodel.graph import extract
from wafer.costmodel.streaming import activation_memory

S = jax.ShapeDtypeStruct
MASKS = ("key", "query_key", "heads")


def _step(
  mask_style: str,
  *,
  layers: int,
  d: int,
  heads: int,
  seq: int,
  scan: bool,
  policy: str | None,
  dropout: bool = False,
):
  """A train step of an encoder with a per-sample padding mask written ``mask_style`` (``"none"``: no
  mask)."""
  dh = d // heads

  def layer(x, p, mask, key):
    b = x.shape[0]
    q, k, v = ((x @ p[n]).reshape(b, seq, heads, dh) for n in ("q", "k", "v"))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(dh))
    probs = jax.nn.softmax(jnp.where(mask, scores, jnp.float32(-1e4)), axis=-1)
    if key is not None:  # attention dropout, from the batch's key
      probs = jnp.where(jax.random.bernoulli(key, 0.9, probs.shape), probs / 0.9, 0.0)
    x = x + jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, seq, d) @ p["o"]
    return x + jax.nn.gelu(x @ p["f1"]) @ p["f2"]

  def loss(params, batch):
    keep = batch["attention_mask"].astype(jnp.bool_)
    b = keep.shape[0]
    mask = keep[:, None, None, :] if mask_style != "none" else True
    if mask_style == "query_key":
      mask = jnp.broadcast_to(mask, (b, 1, seq, seq))
    elif mask_style == "heads":
      mask = jnp.broadcast_to(mask, (b, heads, seq, seq))
    # one key per layer, as the reference models fork theirs (a key shared by every iteration of a
    # scan makes loop-invariant bits, which JAX's partial evaluation hoists out of the loop)
    keys = jax.random.split(jax.random.wrap_key_data(batch["dropout_key"][0]), layers) if dropout else None
    x = params["embed"][batch["input_ids"]]
    if scan:

      def body(h, xs):
        p, key = xs
        with jax.named_scope("layer"):  # (as `models.common.run_layers` names its scan's body)
          return layer(h, p, mask, key), None

      x, _ = jax.lax.scan(body, x, (params["layers"], keys))
    else:
      for i in range(layers):
        with jax.named_scope(f"layer_{i}"):
          p = jax.tree.map(lambda a, i=i: a[i], params["layers"])
          x = layer(x, p, mask, None if keys is None else keys[i])
    logits = x @ params["embed"].T
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), batch["input_ids"][..., None], -1))

  if policy is not None:
    loss = precision.autocast(loss, policy)

  def step(params, batch):
    grads = jax.grad(loss)(params, batch)
    return jax.tree.map(lambda w, g: w - 0.01 * g, params, grads)

  f = jnp.float32
  shapes = {"q": (d, d), "k": (d, d), "v": (d, d), "o": (d, d), "f1": (d, 4 * d), "f2": (4 * d, d)}
  params = {
    "embed": S((97, d), f),
    "layers": {n: S((layers, *shape), f) for n, shape in shapes.items()},
  }
  return step, params


@functools.cache
def _memory(
  mask_style: str, layers: int, heads: int, seq: int, scan: bool, policy: str | None, dropout: bool = False
):
  step, params = _step(
    mask_style, layers=layers, d=32, heads=heads, seq=seq, scan=scan, policy=policy, dropout=dropout
  )
  b = 4
  batch = {"input_ids": S((b, seq), jnp.int32), "attention_mask": S((b, seq), jnp.int32)}
  if dropout:
    batch["dropout_key"] = S((b, 2), jnp.uint32)
  graph = extract(step, (params, batch), batch_argnums=(1,), compute_bits=16, scaling="dataflow")
  return graph, activation_memory(graph, 1.0)


def _entering(
  style: str, layers: int, heads: int, seq: int, scan: bool, policy: str | None, dropout: bool = False
) -> list:
  """(kernel, elements) of every value entering a kernel from another."""
  graph = _memory(style, layers, heads, seq, scan, policy, dropout)[0]
  return sorted((k.name, e) for k in graph.kernels for e, _, _ in k.act_in.values())


FIELDS = ("full", "checkpointed", "boundary", "working_set", "attention")


@settings(max_examples=8, deadline=None)
@given(
  layers=st.integers(1, 3),
  heads=st.sampled_from([2, 4]),
  seq=st.sampled_from([32, 64]),
  scan=st.booleans(),
  policy=st.sampled_from([None, "c=bf16"]),
)
def test_the_way_the_mask_is_broadcast_does_not_change_the_memory(layers, heads, seq, scan, policy):
  mems = [_memory(style, layers, heads, seq, scan, policy)[1] for style in MASKS]
  for field in FIELDS:
    values = [getattr(m, field) for m in mems]
    assert values == pytest.approx([values[0]] * len(values), rel=1e-9), (field, dict(zip(MASKS, values)))
  # and the same values enter each kernel: no boundary carries an h s^2 mask
  entering = [
    sorted(
      (k.name, e)
      for k in _memory(style, layers, heads, seq, scan, policy)[0].kernels
      for e, _, _ in k.act_in.values()
    )
    for style in MASKS
  ]
  assert entering[1] == entering[0] and entering[2] == entering[0]
  # ... and the mask is there, as its b s values: against the same step without a mask, the only
  # difference is b s values entering the kernels that read it
  b = 4
  plain = collections.Counter(_entering("none", layers, heads, seq, scan, policy))
  masked = collections.Counter(entering[2])
  assert not plain - masked
  assert {e for _, e in masked - plain} == {float(b * seq)}, masked - plain


@pytest.mark.parametrize("policy", ["c=bf16", "c=cb16", "c=f16"])
@pytest.mark.parametrize("scan", [False, True])
def test_autocast_keeps_attentions_core_recognised(policy, scan):
  """The attention core's bytes and the memory of each recomputation level are the float32
  step's (the saved values are counted at the compute width either way)."""
  graph32, mem32 = _memory("key", 2, 4, 64, scan, None)
  graph16, mem16 = _memory("key", 2, 4, 64, scan, policy)

  def core(graph):
    return sum(k.count * k.saved_bytes(1.0, core=True) for k in graph.kernels)

  assert core(graph32) > 0 and core(graph16) == pytest.approx(core(graph32), rel=1e-9)
  assert mem16.attention < mem16.full
  for field in FIELDS:
    assert getattr(mem16, field) == pytest.approx(getattr(mem32, field), rel=1e-9), field


@settings(max_examples=6, deadline=None)
@given(layers=st.integers(1, 3), scan=st.booleans(), policy=st.sampled_from([None, "c=bf16"]))
def test_random_bits_are_made_where_they_are_used(layers, scan, policy):
  """A dropout mask is made from its key in the kernel that applies it: the only values that enter
  a kernel because of dropout are the key's (no h s^2 bits cross a layer boundary: BERT-large at
  MSL 10k with attention dropout needed 93 GB of such "boundaries" at micro-batch 1)."""
  plain = collections.Counter(_entering("key", layers, 4, 64, scan, policy))
  dropped = collections.Counter(_entering("key", layers, 4, 64, scan, policy, dropout=True))
  assert not plain - dropped
  assert all(e <= 2 * 4 for _, e in dropped - plain), dropped - plain  # key data: uint32[b, 2]
