"""Property-based checks (hypothesis) of round for every predefined format and mode."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import precision
from tests.tolerances import sr_mean_bound
from tests.values import examples

FORMATS = [f.name for f in precision.formats.PREDEFINED if f.name != "float32"]
DETERMINISTIC = ["nearest_even", "toward_zero"]
floats32 = st.floats(width=32, allow_nan=False)


def rnd(x, fmt, mode="nearest_even"):
  return np.asarray(precision.round(np.asarray(x, np.float32), fmt, mode))


@pytest.mark.parametrize("mode", DETERMINISTIC)
@pytest.mark.parametrize("fmt", FORMATS)
@given(xs=st.lists(floats32, min_size=1, max_size=64))
def test_idempotent(fmt, mode, xs):
  once = rnd(xs, fmt, mode)
  np.testing.assert_array_equal(rnd(once, fmt, mode).view(np.uint32), once.view(np.uint32))


@pytest.mark.parametrize("mode", DETERMINISTIC)
@pytest.mark.parametrize("fmt", FORMATS)
@given(a=floats32, b=floats32)
def test_monotone(fmt, mode, a, b):
  lo, hi = sorted([a, b])
  r = rnd([lo, hi], fmt, mode)
  assert not (r[0] > r[1])  # NaN never appears for finite inputs except e4m3fn overflow
  if not np.isnan(r).any():
    assert r[0] <= r[1]


@pytest.mark.parametrize("mode", DETERMINISTIC)
@pytest.mark.parametrize("fmt", FORMATS)
@given(xs=st.lists(floats32, min_size=1, max_size=64))
def test_sign_symmetric(fmt, mode, xs):
  x = np.asarray(xs, np.float32)
  np.testing.assert_array_equal(rnd(-x, fmt, mode).view(np.uint32), (-rnd(x, fmt, mode)).view(np.uint32))


@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=examples(50))  # 64 codes each: 3,200 values a format
@given(codes=st.lists(st.integers(0, 2**16 - 1), min_size=1, max_size=64), seed=st.integers(0, 2**31))
def test_representable_values_unchanged(fmt, codes, seed):
  f = precision.get_format(fmt)
  values = np.asarray(precision.decode(np.asarray(codes) % 2**f.bits, f))
  values = values[~np.isnan(values)]
  for mode in ("nearest_even", "toward_zero"):
    np.testing.assert_array_equal(rnd(values, f, mode).view(np.uint32), values.view(np.uint32))
  stochastic = np.asarray(precision.round(values, f, "stochastic", key=jax.random.key(seed)))
  np.testing.assert_array_equal(stochastic.view(np.uint32), values.view(np.uint32))


@pytest.mark.parametrize("fmt", ["cbfloat16", "bfloat16", "float16", "float8_e4m3fn"])
@given(x=st.floats(width=32, min_value=-1e4, max_value=1e4, allow_subnormal=True), seed=st.integers(0, 2**31))
def test_stochastic_rounding_is_unbiased(fmt, x, seed):
  """The mean of n stochastic roundings of x is x within the bound of `sr_mean_bound`.

  Each rounding gives lo = toward_zero(x) or the next value away from zero, lo +- step with
  step = ulp(lo), up with probability p = |x - lo| / step.
  """
  n = 1 << 16
  f = precision.get_format(fmt)
  x32 = np.float32(x)
  assume(abs(float(x32)) <= f.max)
  lo = float(rnd(x32, f, "toward_zero"))
  step = float(f.ulp(np.float32(lo)))
  p = abs(float(x32) - lo) / step
  draws = np.asarray(
    precision.round(jnp.full((n,), x32), f, "stochastic", key=jax.random.key(seed)), np.float64
  )
  assert set(np.unique(draws).tolist()) <= {lo, lo + np.copysign(step, float(x32))}
  assert abs(draws.mean() - float(x32)) <= sr_mean_bound(step, p, n)


def test_stochastic_rounding_probability_is_exact_given_the_bits():
  # With all 2^16 values of the top 16 random bits (low 16 bits zero), a value whose discarded
  # fraction is k / 2^14 (cbfloat16 keeps 9 of 23 fraction bits) rounds up exactly k*4 times.
  x = np.float32(1.0 + 5 * 2.0**-23)  # k = 5 (in units of 2^-14 of a step)
  rbits = np.arange(2**16, dtype=np.uint32) << 16
  r = np.asarray(precision.round(np.full(2**16, x), "cb16", "stochastic", rbits=jnp.asarray(rbits)))
  assert (r > 1.0).sum() == 5 * 4
