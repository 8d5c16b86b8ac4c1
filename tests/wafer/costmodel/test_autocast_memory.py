"""Activation memory does not depend on ``precision.autocast`` (issue 25, item 2).

Autocast's roundings (``precision_round``, the casts it inserts) emulate the format the wafer
computes in; they are not values the wafer stores. So one train step, written as the workloads
write it (a ``lax.scan`` over the layers, or a Python loop with indexed or shared scope names, or
of nested calls), has
the same activation memory, at every level (`wafer.costmodel.streaming.ActivationMemory`: every
activation kept, attention's core recomputed, layers recomputed from their checkpoints), the same
checkpoints and the same recomputable kernels with and without ``autocast`` around its loss, under
every policy (every policy here computes in a 16-bit format; the plain step is costed at 16 bits).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import precision
from tests.wafer.costmodel.helpers import unrolled_layers
from wafer.costmodel import workloads as W
from wafer.costmodel.graph import extract
from wafer.costmodel.streaming import activation_memory

FIELDS = ("full", "attention", "checkpointed", "boundary", "working_set")
POLICIES = ["c=cbfloat16", "c=bfloat16,level=1", "c=bfloat16,level=2", "c=float16,level=0"]


@st.composite
def _configs(draw: st.DrawFn) -> W.TransformerConfig:
  heads = draw(st.sampled_from([2, 4]))
  seq = draw(st.sampled_from([16, 32]))
  adaln = draw(st.booleans())
  return W.TransformerConfig(
    layers=draw(st.integers(2, 3)),
    d_model=heads * draw(st.sampled_from([8, 16])),
    heads=heads,
    kv_heads=draw(st.sampled_from([None, heads // 2])),
    ffn=draw(st.sampled_from([64, 96])),
    vocab=draw(st.sampled_from([32, 100])),
    seq=seq,
    max_positions=seq,
    norm=draw(st.sampled_from(["layernorm", "rmsnorm"])),
    mlp=draw(st.sampled_from(["gelu", "swiglu"])),
    positions=draw(st.sampled_from(["learned", "rotary", "none"])),
    causal=not adaln and draw(st.booleans()),
    tied_embeddings=not adaln and draw(st.booleans()),
    adaln=adaln,
  )


def _step(cfg: W.TransformerConfig, layout: str, policy: precision.Policy | None):
  """The workloads' train step (``layout``: the scan, or a Python loop), its loss under
  ``autocast(policy)`` when a policy is given."""
  run = None if layout == "scan" else unrolled_layers(cfg, layout)

  def loss(params, tokens):
    return W.loss_fn(cfg, params, tokens, layers=run)

  if policy is not None:
    loss = precision.autocast(loss, policy)

  def step(params, opt_state, tokens):
    value, grads = jax.value_and_grad(loss)(params, tokens)
    params, opt_state = W.adamw_update(grads, opt_state, params)
    return params, opt_state, value

  return step


@pytest.mark.slow  # 20 s on the 2-core CI machine (12 generated steps); runs in the slow stage
@settings(max_examples=12, deadline=None)
@given(
  cfg=_configs(),
  layout=st.sampled_from(["scan", "indexed", "shared", "nested"]),
  policy=st.sampled_from(POLICIES),
  ratio=st.sampled_from([1.0, 0.25, 3.0]),
)
def test_autocast_leaves_the_activation_memory_unchanged(cfg, layout, policy, ratio):
  parsed = precision.Policy.parse(policy)
  _, args = W.train_example(cfg, 4)
  plain = extract(_step(cfg, layout, None), args, batch_argnums=(2,), compute_bits=16)
  mixed = extract(_step(cfg, layout, parsed), args, batch_argnums=(2,), compute_bits=16)
  a, b = activation_memory(plain, ratio), activation_memory(mixed, ratio)
  for field in FIELDS:
    assert math.isclose(getattr(a, field), getattr(b, field), rel_tol=1e-9), (
      field,
      getattr(a, field),
      getattr(b, field),
      dataclasses.asdict(a),
      dataclasses.asdict(b),
    )
  assert a.recomputable == b.recomputable
  assert a.levels() == b.levels()


@pytest.mark.parametrize("policy", ["c=cbfloat16,level=0", "c=cbfloat16,level=1", "c=bfloat16,level=2"])
def test_chunked_accumulation_is_costed_as_the_products_it_emulates(policy):
  """Levels 0 and 1 emulate the wafer's accumulation by cutting each contraction into chunks of
  1024 (a d_model of 1280 is zero-padded to two chunks, 2048). That is numerics, not wafer work:
  the estimate has the weights, parameters, FLOPs and activation memory of the plain step (before,
  a padded weight was lost from the parameters: GPT-2 XL counted 83M of its 1.56B, and the padded
  products added 28 % of FLOPs)."""
  import wafer

  cfg = W.TransformerConfig(layers=2, d_model=1280, heads=10, ffn=2560, vocab=256, seq=16, max_positions=16)
  fn, args = W.train_example(cfg, 4)
  parsed = precision.Policy.parse(policy)
  plain = extract(fn, args, batch_argnums=(2,), compute_bits=16)
  mixed = extract(_step(cfg, "scan", parsed), args, batch_argnums=(2,), compute_bits=16)
  params = sum(math.prod(a.shape) for a in jax.tree.leaves(args[0]))
  assert mixed.param_elements == plain.param_elements == params
  assert mixed.flops_per_sample() == pytest.approx(plain.flops_per_sample(), rel=1e-6)
  for field in FIELDS:
    assert getattr(activation_memory(mixed, 1.0), field) == pytest.approx(
      getattr(activation_memory(plain, 1.0), field)
    )
  a = wafer.costmodel.estimate_graph(plain, batch_size=4, mode="weight_streaming")
  b = wafer.costmodel.estimate_graph(mixed, batch_size=4, mode="weight_streaming")
  assert sum(k.weight_bytes for k in b.kernels) == pytest.approx(sum(k.weight_bytes for k in a.kernels))
  assert abs(math.log(b.samples_per_sec / a.samples_per_sec)) <= math.log(1.1)
