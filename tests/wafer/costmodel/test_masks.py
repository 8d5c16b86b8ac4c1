"""Attention masks other than causal: the attention products get the row work their mask keeps.

A mask built from positions (``iota``) and constants alone has a value at trace time; the cost
model evaluates it where it meets the scores and charges each attention product's row work times the
fraction of scores it keeps (`wafer.costmodel.graph.Matmul.kept`, `wafer.costmodel.mesh
.attention_cycles`). Every expected fraction below is computed independently, in NumPy, from the
same mask written with index grids; a causal mask whose value cannot be had keeps the old half.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax

import wafer
from tests.wafer.costmodel.helpers import sds
from wafer.costmodel import CALIBRATION, extract
from wafer.costmodel import walk as walk_module
from wafer.costmodel.hardware import WSE2
from wafer.costmodel.mesh import Machine, kernel_cycles

B, H, D = 2, 2, 16
W = 6  # window / band half-width
BLOCK = 16
PREFIX = 10


def _forms(i, j, lib, w=W, block=BLOCK):
  """Each mask form as a boolean of query positions ``i`` and key positions ``j``: ``lib`` is
  ``jnp`` (the traced mask) or ``np`` (the independent reference)."""
  return {
    "causal_cmp": i >= j,
    "window": (i >= j) & (i - j < w),
    "band_abs": lib.abs(i - j) <= w,
    "band_two": (i - j <= w) & (j - i <= w),
    "block": (i // block) == (j // block),
    "prefix_lm": (i >= j) | (j < PREFIX),
    "everything": i >= j - 10**6,
  }


# written otherwise: jnp.tril; a closed-over NumPy band; a prefix LM concatenated (evaluated by JAX)
OTHER = ("causal_tril", "band_numpy", "prefix_concat")
FORMS = (*_forms(np.zeros((1, 1)), np.zeros((1, 1)), np), *OTHER)


def _reference(form: str, s: int, w: int = W, block: int = BLOCK) -> float:
  """The kept fraction, in NumPy."""
  i, j = np.arange(s)[:, None], np.arange(s)[None, :]
  reference = {"causal_tril": "causal_cmp", "band_numpy": "band_abs", "prefix_concat": "prefix_lm"}
  mask = _forms(i, j, np, w, block)[reference.get(form, form)]
  return float(np.broadcast_to(mask, (s, s)).mean())


def _traced(form: str, s: int, w: int, block: int) -> jax.Array:
  if form == "causal_tril":
    return jnp.tril(jnp.ones((s, s), jnp.bool_))
  if form == "band_numpy":
    return jnp.asarray(np.abs(np.arange(s)[:, None] - np.arange(s)[None, :]) <= w)
  if form == "prefix_concat":
    p = min(PREFIX, s)
    return jnp.concatenate(
      [jnp.ones((s, p), jnp.bool_), jnp.tril(jnp.ones((s, s), jnp.bool_))[:, p:]], axis=1
    )
  return _forms(jnp.arange(s)[:, None], jnp.arange(s)[None, :], jnp, w, block)[form]


def _step(form: str | None, apply: str, s: int, w: int = W, block: int = BLOCK):
  """A train step of one attention layer; the mask applied by ``apply``: ``"select"`` (``jnp.where``),
  ``"bias"`` (``scores + where(mask, 0, -inf)``), ``"hf_bias"`` (Hugging Face's ``select(mask > 0, 0,
  finfo.min)``, the mask as floats) or ``"padded"`` (the mask and the batch's padding, selected);
  ``form=None``: no mask, ``"padding"``: the padding alone."""

  def attend(q, k, v, pad):
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(D)
    if form == "padding":
      scores = jnp.where(pad[:, None, None, :] > 0, scores, -1e9)
    elif form is not None:
      mask = _traced(form, s, w, block)[None, None]
      if apply == "select":
        scores = jnp.where(mask, scores, -1e9)
      elif apply == "bias":
        scores = scores + jnp.where(mask, jnp.float32(0), -jnp.inf)
      elif apply == "hf_bias":
        m = mask.astype(jnp.float32)
        scores = scores + lax.select(m > 0, jnp.zeros(m.shape), jnp.full(m.shape, jnp.finfo(jnp.float32).min))
      else:  # "padded"
        scores = jnp.where(mask & (pad[:, None, None, :] > 0), scores, -1e9)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, -1), v)

  def loss(w, x, pad):
    q, k, v = (jnp.einsum("bsd,dhe->bshe", x, w[n]) for n in "qkv")
    return jnp.mean(jnp.einsum("bshe,hed->bsd", attend(q, k, v, pad), w["o"]) ** 2)

  def step(w, x, pad):
    grads = jax.grad(loss)(w, x, pad)
    return jax.tree.map(lambda p, g: p - 0.1 * g, w, grads)

  return step


def _args(s: int):
  w = {**{n: sds(H * D, H, D) for n in "qkv"}, "o": sds(H, D, H * D)}
  return w, sds(B, s, H * D), sds(B, s, dtype=jnp.int32)


def _graph(form: str | None, apply: str, s: int, w: int = W, block: int = BLOCK):
  return extract(_step(form, apply, s, w, block), _args(s), batch_argnums=(1, 2), compute_bits=16)


def _attention(graph) -> list:
  return [m for k in graph.kernels for m in k.matmuls if not m.weight and m.instances.at_trace > 1]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("apply", ["select", "bias"])
def test_each_attention_product_keeps_the_fraction_its_mask_keeps(form, apply):
  s = 64
  products = _attention(_graph(form, apply, s))
  assert len(products) == 6  # Q K^T, P V and their four backward products
  expected = _reference(form, s)
  assert all(m.kept == pytest.approx(expected, rel=1e-6) for m in products), [m.kept for m in products]
  assert all(m.masked == (expected < 1) for m in products)


def test_the_fractions_are_the_known_ones():
  """Causal (s + 1) / (2 s), a window of W about W / s, a band (2 W + 1) / s less its corners,
  block-diagonal 1 / blocks: the reference itself is right."""
  s = 64
  assert _reference("causal_cmp", s) == _reference("causal_tril", s) == (s + 1) / (2 * s)
  assert _reference("window", s) == pytest.approx((W * s - W * (W - 1) / 2) / s**2)
  assert (
    _reference("band_abs", s)
    == _reference("band_two", s)
    == pytest.approx(((2 * W + 1) * s - W * (W + 1)) / s**2)
  )
  assert _reference("block", s) == BLOCK / s
  assert _reference("everything", s) == 1.0


def _row_cycles(graph, kept: float | None) -> float:
  """Cycles of all kernels on the whole wafer, with the attention products' ``kept`` replaced
  (``None``: as extracted)."""
  machine = Machine(WSE2, CALIBRATION)
  total = 0.0
  for k in graph.kernels:
    mms = [mm if kept is None else dataclasses.replace(mm, kept=kept) for mm in k.matmuls]
    total += kernel_cycles(machine, dataclasses.replace(k, matmuls=mms), 750, 994, 1.0)
  return total


@pytest.mark.parametrize("form", ["causal_tril", "window", "band_two", "block", "prefix_lm"])
def test_the_attention_row_cycles_scale_with_the_kept_fraction(form):
  """The estimate's cycles less those without row work, over the same with every score kept: the
  mask's fraction."""
  s = 1024  # s^2 > the wafer's PEs: the rows are charged one after another
  graph = _graph(form, "select", s)
  as_traced, full, none = (_row_cycles(graph, kept) for kept in (None, 1.0, 0.0))
  assert full > none
  assert (as_traced - none) / (full - none) == pytest.approx(_reference(form, s), rel=1e-6)


def test_a_mask_that_keeps_everything_costs_what_no_mask_costs():
  s = 1024
  step_all, step_none = _step("everything", "select", s), _step(None, "select", s)
  everything, nothing = _graph("everything", "select", s), _graph(None, "select", s)
  assert all(m.kept == 1.0 for m in _attention(everything))
  assert [m.kept for m in _attention(everything)] == [m.kept for m in _attention(nothing)]
  rates = [
    wafer.estimate(f, *_args(s), mode="weight_streaming", batch_argnums=(1, 2)).samples_per_sec
    for f in (step_all, step_none)
  ]
  assert abs(math.log(rates[0] / rates[1])) < math.log(1.01), rates  # (the select itself costs a little)


@pytest.mark.parametrize(
  "a, b",
  [
    (("window", "select"), ("window", "bias")),
    (("band_abs", "select"), ("band_two", "select")),
    (("causal_tril", "select"), ("causal_cmp", "select")),
    (("causal_tril", "bias"), ("causal_cmp", "hf_bias")),
  ],
)
def test_the_same_mask_written_two_ways_gets_the_same_estimate(a, b):
  s = 1024
  # compute rates: this small step's time is mostly the fixed per-step cost (Calibration.step_overhead_s)
  rates = [
    wafer.estimate(
      _step(*x, s), *_args(s), mode="weight_streaming", batch_argnums=(1, 2)
    ).compute_samples_per_sec
    for x in (a, b)
  ]
  assert abs(math.log(rates[0] / rates[1])) < math.log(1.01), rates
  masked = wafer.estimate(_step(None, "select", s), *_args(s), mode="weight_streaming", batch_argnums=(1, 2))
  assert min(rates) > 1.2 * masked.compute_samples_per_sec  # and the mask is worth something


def test_a_padding_mask_alone_keeps_everything():
  """Padding comes from the batch: its value is unknown, every position is assumed kept."""
  assert all(m.kept == 1.0 for m in _attention(_graph("padding", "select", 64)))


@pytest.mark.parametrize("form", ["causal_tril", "window", "block"])
def test_a_mask_and_the_padding_keep_what_the_mask_keeps(form):
  products = _attention(_graph(form, "padded", 64))
  assert len(products) == 6 and all(m.kept == pytest.approx(_reference(form, 64)) for m in products)


@pytest.mark.parametrize(
  "form, apply, fallback",
  [("causal_tril", "select", 0.5), ("window", "bias", 0.5), ("block", "select", 0.5), ("block", "bias", 1.0)],
)
def test_a_mask_too_large_to_evaluate_falls_back_to_its_structure(monkeypatch, form, apply, fallback):
  """Over the value cap: a causal comparison or a constant select keeps half, as before fractions;
  an additive bias from positions that are not ordered is not taken for a mask."""
  monkeypatch.setattr(walk_module, "_VALUE_CAP", 16)
  products = _attention(_graph(form, apply, 64))
  assert len(products) == 6 and all(m.kept == fallback for m in products), [m.kept for m in products]


@settings(max_examples=12, deadline=None)
@given(
  st.sampled_from(["window", "band_abs", "band_two", "block"]),
  st.integers(min_value=8, max_value=96),
  st.integers(min_value=1, max_value=40),
  st.sampled_from(["select", "bias"]),
)
def test_the_fraction_over_generated_lengths_and_widths(form, s, width, apply):
  products = _attention(_graph(form, apply, s, width, width))
  expected = _reference(form, s, width, width)
  assert len(products) == 6
  assert all(m.kept == pytest.approx(expected, rel=1e-6) for m in products), (expected, products[0].kept)
