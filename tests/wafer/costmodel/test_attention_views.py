"""The activation memory of attention does not depend on how a step writes what the compiler is
free to rewrite (`wafer.costmodel.graph`, `wafer.costmodel.streaming`):

* **how the padding mask is broadcast.** A key mask ``bool[b, 1, 1, s]`` broadcast by ``where``,
  one broadcast to ``[b, 1, s, s]`` before the layers, or to ``[b, h, s, s]`` (every head) all
  hold ``b s`` values: a view is kept as the value it views, so no layer boundary carries an
  ``h s^2`` mask (BERT-large at MSL 10k "did not fit" at micro-batch 1 because of it);
* **the precision policy.** Under `precision.autocast` a 16-bit product is a platform-dependent
  call (native on GPUs), whose result is the product's: attention's core (the scores and the
  softmax, recomputed by the fused kernel's backward) is recognised as in the float32 step;
* **a constant returned by a call** (``jnp.where``'s broadcast fill value, a linearized ``jit``'s
  residual) is not per-sample data entering a kernel.
"""

from __future__ import annotations

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


def _step(mask_style: str, *, layers: int, d: int, heads: int, seq: int, scan: bool, policy: str | None):
  """A train step of a post-LN-free encoder with a per-sample padding mask written ``mask_style``."""
  dh = d // heads

  def layer(x, p, mask):
    b = x.shape[0]
    q, k, v = ((x @ p[n]).reshape(b, seq, heads, dh) for n in ("q", "k", "v"))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(dh))
    probs = jax.nn.softmax(jnp.where(mask, scores, jnp.float32(-1e4)), axis=-1)
    x = x + jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, seq, d) @ p["o"]
    return x + jax.nn.gelu(x @ p["f1"]) @ p["f2"]

  def loss(params, batch):
    keep = batch["attention_mask"].astype(jnp.bool_)
    b = keep.shape[0]
    mask = keep[:, None, None, :]
    if mask_style == "query_key":
      mask = jnp.broadcast_to(mask, (b, 1, seq, seq))
    elif mask_style == "heads":
      mask = jnp.broadcast_to(mask, (b, heads, seq, seq))
    x = params["embed"][batch["input_ids"]]
    if scan:
      x, _ = jax.lax.scan(lambda h, p: (layer(h, p, mask), None), x, params["layers"])
    else:
      for i in range(layers):
        with jax.named_scope(f"layer_{i}"):
          x = layer(x, jax.tree.map(lambda a, i=i: a[i], params["layers"]), mask)
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
def _memory(mask_style: str, layers: int, heads: int, seq: int, scan: bool, policy: str | None):
  step, params = _step(mask_style, layers=layers, d=32, heads=heads, seq=seq, scan=scan, policy=policy)
  b = 4
  batch = {"input_ids": S((b, seq), jnp.int32), "attention_mask": S((b, seq), jnp.int32)}
  graph = extract(step, (params, batch), batch_argnums=(1,), compute_bits=16, scaling="dataflow")
  return graph, activation_memory(graph, 1.0)


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
