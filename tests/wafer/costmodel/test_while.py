"""A ``while_loop`` that counts an integer up to a bound of known value runs that many iterations
(the probe's 8-layer loop was costed as one layer, 8x too fast); any other ``while`` is one
iteration, with a note. Written as a ``lax.scan``, the same forward pass gets the same estimate."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wafer
from tests.wafer.costmodel.helpers import sds

KNOWN = "while loops that count an integer up to a known bound run that many iterations"
UNKNOWN = "while loops (unknown trip count) are counted as one iteration"


def _scan(p, x):
  h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, p)
  return jnp.mean(h**2)


def _while(start: int):
  def f(p, x):
    def body(c):
      i, h = c
      return i + 1, jnp.tanh(h @ p[i])

    _, h = jax.lax.while_loop(lambda c: c[0] < p.shape[0], body, (start, x))
    return jnp.mean(h**2)

  return f


@settings(max_examples=5, deadline=None)
@given(layers=st.integers(1, 9), d=st.sampled_from([16, 64]))
def test_a_counted_while_loop_is_costed_as_its_scan(layers, d):
  p, x = sds(layers, d, d), sds(8, d)
  scan = wafer.estimate(_scan, p, x, mode="weight_streaming")
  loop = wafer.estimate(_while(0), p, x, mode="weight_streaming")
  assert loop.flops_per_sample == pytest.approx(scan.flops_per_sample, rel=1e-9)
  assert loop.samples_per_sec == pytest.approx(scan.samples_per_sec, rel=1e-6)
  assert any(KNOWN in n for n in loop.notes)


def test_a_loop_starting_later_runs_fewer_iterations():
  p, x = sds(8, 32, 32), sds(8, 32)
  full = wafer.estimate(_while(0), p, x, mode="weight_streaming")
  late = wafer.estimate(_while(6), p, x, mode="weight_streaming")
  assert late.flops_per_sample == pytest.approx(full.flops_per_sample * 2 / 8, rel=1e-9)


def test_a_loop_bounded_by_data_stays_one_iteration_with_a_note():
  def f(p, x):
    def body(c):
      i, h = c
      return i + 1, jnp.tanh(h @ p[0])

    _, h = jax.lax.while_loop(lambda c: jnp.logical_and(c[0] < 8, jnp.mean(c[1]) > 0), body, (0, x))
    return jnp.mean(h**2)

  r = wafer.estimate(f, sds(1, 32, 32), sds(8, 32), mode="weight_streaming", batch_argnums=1)
  assert any(UNKNOWN in n for n in r.notes)
