"""Roundings survive XLA's fusion and excess precision, on the default backend (CPU or GPU).

XLA may compute a value in more precision than its program asks for (``xla_allow_excess_precision``,
on by default): its GPU compiler removes ``f32 -> bf16 -> f32`` convert pairs. A rounding built on
such a pair would silently not round inside a fused jit program on a GPU. `precision.round`
(and so `autocast`) rounds with integer bit operations and ``reduce_precision``, which XLA keeps;
these tests run the fused programs on whatever backend is the default and lower them for CUDA
too, where no 16-bit conversion may appear.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import precision
from precision.testing import assert_same_floats

FORMATS = ["bfloat16", "float16", "cbfloat16", "float8_e4m3fn", "float8_e5m2"]


def _inputs(seed: int = 0) -> jax.Array:
  rng = np.random.default_rng(seed)
  x = rng.standard_normal(4096) * 2.0 ** rng.uniform(-30, 20, 4096)
  return jnp.asarray(x.astype(np.float32))


def _chain(x):
  """Elementwise ops around the roundings autocast inserts, one fusion for XLA; the exact ops at
  the end (neg, max, a reshape) keep a rounded value's state, so they are not rounded again."""
  y = jnp.tanh(x * 1.7 + 0.3) * x - 0.25
  z = y * y + x
  return -jnp.maximum(z, y).reshape(64, 64)


def _representable(value: jax.Array, fmt: str) -> None:
  assert_same_floats(precision.round(value, fmt), value, f"not a {fmt} value")


@pytest.mark.parametrize("fmt", FORMATS)
def test_autocast_output_of_a_fused_program_is_representable(fmt):
  x = _inputs()
  auto = precision.autocast(_chain, f"c={fmt}")
  # the input's ops fuse with the first rounding (v * 0.5 is exact: a fused multiply-add is the same)
  program = jax.jit(lambda v: auto(v * 0.5 + 0.125))
  got = program(x)
  _representable(got, fmt)
  assert_same_floats(got, auto(x * 0.5 + 0.125))  # the same values op by op (eagerly)
  assert not np.array_equal(np.asarray(got), np.asarray(jax.jit(_chain)(x * 0.5 + 0.125)))  # it rounded


@pytest.mark.parametrize("fmt", ["bfloat16", "float16", "cbfloat16"])
def test_round_inside_a_fused_chain_still_rounds(fmt):
  x = _inputs(1)

  @jax.jit
  def fused(v):
    # elementwise before and after: one fusion (v * 2 is exact, so a fused multiply-add changes nothing)
    r = precision.round(v * 2.0 + 0.5, fmt)
    return r, r * 2.0 - r  # r * 2 - r == r exactly (no overflow for these inputs)

  rounded, again = fused(x)
  _representable(rounded, fmt)
  _representable(again, fmt)
  assert_same_floats(rounded, precision.round(x * 2.0 + 0.5, fmt))


_SIXTEEN_BIT = re.compile(r"tensor<(?:[\dx]*x)?(bf16|f16|f8\w*)>")  # scalars too (the CPU map body)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("platform", ["cpu", "cuda"])
def test_roundings_lower_without_16_bit_conversions(fmt, platform):
  """What XLA sees: no value passes through a 16-bit dtype, so no convert pair can be removed
  (lowered for CUDA without a GPU: ``trace(...).lower(lowering_platforms=...)``)."""
  x = _inputs()
  for fn in (
    lambda v: precision.round(v, fmt),
    lambda v: precision.round(v, fmt, "toward_zero"),
    precision.autocast(_chain, f"c={fmt},o={fmt}"),
  ):
    text = jax.jit(fn).trace(x).lower(lowering_platforms=(platform,)).as_text()
    assert not _SIXTEEN_BIT.search(text), _SIXTEEN_BIT.search(text).group(0)
