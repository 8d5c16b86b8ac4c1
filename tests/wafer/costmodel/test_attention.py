"""The attention-row term of the mesh model (`wafer.costmodel.mesh.attention_cycles`): its invariants
over generated shapes, and what it does to whole transformer steps."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import pytest
from hypothesis import given
from hypothesis import strategies as st

import wafer
from tests.wafer.costmodel.helpers import sds
from wafer.costmodel import CALIBRATION, extract
from wafer.costmodel.hardware import WSE2, WSE3
from wafer.costmodel.mesh import Machine, attention_cycles
from wafer.costmodel.workloads import WORKLOADS, TransformerConfig

W2, W3 = Machine(WSE2, CALIBRATION), Machine(WSE3, CALIBRATION)
RECT = (750, 994)
P = RECT[0] * RECT[1]

seqs = st.integers(min_value=8, max_value=8192)
heads = st.integers(min_value=1, max_value=256)
widths = st.sampled_from([16, 24, 32, 64, 80, 128, 256])


def _cycles(machine, inst, s, dh, kept=1.0, rect=RECT, bits=16):
  return attention_cycles(machine, inst, s, dh, s, kept, *rect, bits)


kepts = st.floats(min_value=1e-3, max_value=1.0)


@given(seqs, widths, heads, kepts)
def test_linear_in_the_instances(s, dh, inst, kept):
  one = _cycles(W2, 1, s, dh, kept)
  assert _cycles(W2, inst, s, dh, kept) == pytest.approx(inst * one, rel=1e-12)


@given(seqs, widths, heads, kepts)
def test_the_row_work_scales_with_the_fraction_a_mask_keeps(s, dh, inst, kept):
  assert _cycles(W2, inst, s, dh, kept) == pytest.approx(_cycles(W2, inst, s, dh) * kept, rel=1e-12)


@given(seqs, widths, heads)
def test_the_8_wide_wse3_takes_half_the_cycles_of_the_4_wide_wse2(s, dh, inst):
  assert _cycles(W3, inst, s, dh) == pytest.approx(_cycles(W2, inst, s, dh) / 2, rel=1e-12)


@given(seqs, widths, heads)
def test_the_product_orientation_does_not_matter(s, dh, inst):
  # Q K^T ([s x dh] @ [dh x s]) and P V ([s x s] @ [s x dh]) have the same score matrix
  qk = attention_cycles(W2, inst, s, dh, s, 1.0, *RECT, 16)
  pv = attention_cycles(W2, inst, s, s, dh, 1.0, *RECT, 16)
  assert qk == pytest.approx(pv, rel=1e-12)


@given(st.integers(min_value=math.isqrt(P) + 1, max_value=8192), widths, widths, heads)
def test_long_sequences_cost_a_fixed_time_per_row_whatever_the_head_width(s, dh1, dh2, inst):
  a, b = _cycles(W2, inst, s, dh1), _cycles(W2, inst, s, dh2)
  assert a == pytest.approx(b, rel=1e-12)
  assert a == pytest.approx(CALIBRATION.attention_row_cycles * inst * s, rel=1e-12)


@given(seqs, seqs, widths, heads)
def test_monotone_and_continuous_in_the_sequence_length(s1, s2, dh, inst):
  lo, hi = sorted((s1, s2))
  assert _cycles(W2, inst, lo, dh) <= _cycles(W2, inst, hi, dh) * (1 + 1e-12)
  # no cliff where instances stop fitting side by side: one more token changes the cost by < 1 %
  around = math.isqrt(P)
  for s in (around - 1, around, around + 1):
    assert _cycles(W2, inst, s + 1, dh) / _cycles(W2, inst, s, dh) < 1.01


@given(seqs, widths, heads, st.integers(min_value=2, max_value=64))
def test_a_smaller_rectangle_is_never_faster(s, dh, inst, shrink):
  small = (max(1, RECT[0] // shrink), max(1, RECT[1] // shrink))
  assert _cycles(W2, inst, s, dh, rect=small) >= _cycles(W2, inst, s, dh) * (1 - 1e-12)


def test_it_fits_both_gpt2_and_esm2_with_one_constant():
  """The evidence for the form: per (sample, head, layer), GPT-2 small (2048 causal tokens, heads of
  64) and ESM-2 35M (1026 tokens, heads of 24) get the same row work, as their measured runs need;
  a cost per score element would give GPT-2 twice ESM-2's."""
  gpt2, esm2 = WORKLOADS["gpt2_small"].config, WORKLOADS["esm2_35m"].config
  causal = lambda cfg: (cfg.seq + 1) / (2 * cfg.seq) if cfg.causal else 1.0  # noqa: E731
  per_gpt2 = _cycles(W2, 1, gpt2.seq, gpt2.head_dim, causal(gpt2))
  per_esm2 = _cycles(W2, 1, esm2.seq, esm2.head_dim, causal(esm2))
  assert per_gpt2 / per_esm2 == pytest.approx(1.0, abs=0.01)
  per_score = (gpt2.seq**2 / 2) / esm2.seq**2
  assert per_score == pytest.approx(2.0, abs=0.01)


def test_short_sequences_run_side_by_side_and_cost_almost_nothing():
  bert = WORKLOADS["bert_large_ws512"].config
  short = _cycles(W2, 1, bert.seq, bert.head_dim)
  serial = CALIBRATION.attention_row_cycles * bert.seq  # one instance alone on the wafer
  # P / s^2 = 45.5 instances side by side on a CS-2
  assert short == pytest.approx(serial * bert.seq**2 / P, rel=1e-12)
  assert short < serial / 40


# ----------------------------------------------------------------- the causal mask, however written

B, S, H, D = 4, 1024, 8, 32  # S^2 > the wafer's PEs: the row term is a large part of the estimate


def _attention_step(kind: str, causal: bool):
  """A train step of one attention layer, written three ways: einsum with heads last, matmuls with
  heads first, and `jax.nn.dot_product_attention`; no named scopes, so kernels form by op pattern."""

  def attend(q, k, v):
    tril = jnp.tril(jnp.ones((S, S), bool))
    if kind == "einsum":
      s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(D)
      s = jnp.where(tril[None, None], s, -1e9) if causal else s
      return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1), v)
    if kind == "heads_first":
      qt, kt, vt = (jnp.transpose(t, (0, 2, 1, 3)) for t in (q, k, v))
      s = (qt @ jnp.swapaxes(kt, -1, -2)) / math.sqrt(D)
      s = jnp.where(tril, s, -1e9) if causal else s
      return jnp.transpose(jax.nn.softmax(s, -1) @ vt, (0, 2, 1, 3))
    return jax.nn.dot_product_attention(q, k, v, is_causal=causal)

  def loss(w, x):
    q, k, v = (jnp.einsum("bsd,dhe->bshe", x, w[n]) for n in "qkv")
    return jnp.mean(jnp.einsum("bshe,hed->bsd", attend(q, k, v), w["o"]) ** 2)

  def step(w, x):
    grads = jax.grad(loss)(w, x)
    return jax.tree.map(lambda p, g: p - 0.1 * g, w, grads)

  return step


ATTENTION_ARGS = ({**{n: sds(H * D, H, D) for n in "qkv"}, "o": sds(H, D, H * D)}, sds(B, S, H * D))
KINDS = ("einsum", "heads_first", "dot_product_attention")


@pytest.mark.parametrize("kind", KINDS)
def test_the_causal_mask_keeps_its_triangle_in_all_six_attention_products(kind):
  graph = extract(_attention_step(kind, True), ATTENTION_ARGS, batch_argnums=(1,), compute_bits=16)
  attention = [m for k in graph.kernels for m in k.matmuls if not m.weight and m.instances.at_trace > 1]
  assert len(attention) == 6  # Q K^T and P V, and their four backward products
  assert all(m.kept == pytest.approx((S + 1) / (2 * S)) for m in attention), [m.kept for m in attention]
  plain = extract(_attention_step(kind, False), ATTENTION_ARGS, batch_argnums=(1,), compute_bits=16)
  assert not any(m.masked for k in plain.kernels for m in k.matmuls)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_written_three_ways_gets_the_same_estimate(causal):
  reports = [
    wafer.estimate(_attention_step(kind, causal), *ATTENTION_ARGS, mode="weight_streaming") for kind in KINDS
  ]
  rates = [r.samples_per_sec for r in reports]
  assert max(rates) / min(rates) < 1.01, rates
  if causal:  # and the mask is worth something: faster than the same layer without it (compute
    # only: this tiny step's time is mostly the fixed per-step cost, Calibration.step_overhead_s)
    plain = wafer.estimate(_attention_step("einsum", False), *ATTENTION_ARGS, mode="weight_streaming")
    assert min(r.compute_samples_per_sec for r in reports) > 1.2 * plain.compute_samples_per_sec


def test_the_mask_is_found_across_the_scan_of_a_layer_stack():
  """The backward pass reads the forward's probabilities as a loop residual: the data flow crosses
  the scan boundary, so the product that reads them (``P^T dO``) is masked too."""
  cfg = TransformerConfig(layers=3, d_model=128, heads=4, ffn=256, vocab=100, seq=S)
  fn, args = dataclasses.replace(WORKLOADS["gpt2_small"], config=cfg, batch_size=2).example()
  graph = extract(fn, args, batch_argnums=(len(args) - 1,), compute_bits=16)
  attention = [m for k in graph.kernels for m in k.matmuls if not m.weight and m.instances.at_trace > 1]
  assert len(attention) == 6 and all(m.kept == pytest.approx((S + 1) / (2 * S)) for m in attention)
