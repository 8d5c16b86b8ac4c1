"""cbfloat16 (and its configurable variants) against gfloat and the independent float64 oracle.

gfloat's FormatInfo is configured for the same 1-6-9 layout (bias 31, subnormals, inf/NaN at
exponent 63). Stochastic rounding is compared bit for bit given the same 32 random bits per
value: gfloat's ``RoundMode.Stochastic`` with ``srnumbits=32`` rounds up iff
``frac * 2^32 + r >= 2^32``, the rule our kernel implements.
"""

import functools

import gfloat
import jax
import numpy as np
import pytest

import precision
from tests import oracle
from tests import values as V

CB16 = precision.cbfloat16


def gfloat_info(fmt: precision.FloatFormat) -> gfloat.FormatInfo:
  assert fmt.specials == "ieee" and fmt.subnormals
  return gfloat.FormatInfo(
      fmt.name, k=fmt.bits, precision=fmt.mantissa_bits + 1, bias=fmt.bias, is_signed=True,
      domain=gfloat.Domain.Extended, has_nz=True, num_high_nans=2**fmt.mantissa_bits - 1,
      has_subnormals=True, is_twos_complement=False,
  )


GFLOAT_MODES = {"nearest_even": gfloat.RoundMode.TiesToEven, "toward_zero": gfloat.RoundMode.TowardZero}


def gfloat_round(x, fmt, mode, rbits=None):
  sat = fmt.overflow == "saturate"
  with np.errstate(all="ignore"):
    if mode == "stochastic":
      out = gfloat.round_ndarray(
          gfloat_info(fmt), x, gfloat.RoundMode.Stochastic, sat=sat, srbits=rbits.astype(np.int64), srnumbits=32
      )
    else:
      out = gfloat.round_ndarray(gfloat_info(fmt), x, GFLOAT_MODES[mode], sat=sat)
  return np.asarray(out).astype(np.float32)


def oracle_round(x, fmt, mode):
  return oracle.oracle_round(
      x, fmt.exponent_bits, fmt.mantissa_bits, fmt.bias, fmt.subnormals, fmt.specials, fmt.overflow, mode
  )


@functools.cache
def value_set(kind: str) -> np.ndarray:
  if kind == "codes_midpoints_neighbours":
    return V.exhaustive_candidates(CB16)
  if kind == "random_patterns":
    return V.random_patterns(2**20, seed=16)
  if kind == "random_in_range":  # N(0,1) * 2^U(-45, 40): the subnormal, normal and overflow ranges
    rng = np.random.default_rng(1609)
    return (rng.standard_normal(2**20) * 2.0 ** rng.uniform(-45, 40, 2**20)).astype(np.float32)
  if kind == "specials":
    return V.special_values(CB16)
  raise KeyError(kind)


SETS = ["codes_midpoints_neighbours", "random_patterns", "random_in_range", "specials"]


@pytest.mark.parametrize("mode", ["nearest_even", "toward_zero"])
@pytest.mark.parametrize("kind", SETS)
def test_round_matches_gfloat_and_oracle(kind, mode):
  x = value_set(kind)
  expected = gfloat_round(x, CB16, mode)
  V.assert_same_floats(oracle_round(x, CB16, mode), expected, "oracle vs gfloat")  # the references agree
  for got in V.round_both_ways(x, CB16, mode):
    V.assert_same_floats(got, expected, f"cbfloat16 {mode} on {kind}")


@pytest.mark.parametrize("kind", SETS)
def test_stochastic_matches_gfloat_given_the_same_random_bits(kind):
  x = value_set(kind)
  rbits = np.random.default_rng(7).integers(0, 2**32, x.shape, dtype=np.uint64).astype(np.uint32)
  expected = gfloat_round(x, CB16, "stochastic", rbits=rbits)
  for got in V.round_both_ways(x, CB16, "stochastic", rbits=jax.numpy.asarray(rbits)):
    V.assert_same_floats(got, expected, f"cbfloat16 stochastic on {kind}")
  # Rounding really happened both ways: some values went up, some down, some unchanged.
  changed = got != np.asarray(precision.round(x, CB16, "toward_zero"))
  assert 0 < changed.sum() < x.size


def test_decode_every_code():
  codes = V.all_codes(CB16)
  got = precision.decode(codes, CB16)
  with np.errstate(all="ignore"):
    from_gfloat = gfloat.decode_ndarray(gfloat_info(CB16), codes.astype(np.int64)).astype(np.float32)
  from_oracle = oracle.oracle_decode(codes, 6, 9, 31, True, "ieee")
  V.assert_same_floats(got, from_gfloat, "decode vs gfloat")
  V.assert_same_floats(got, from_oracle, "decode vs oracle")
  np.testing.assert_array_equal(np.signbit(got), codes >= 0x8000)
  assert np.isnan(got).sum() == 2 * (2**9 - 1) and np.isinf(got).sum() == 2


@pytest.mark.parametrize("kind", SETS)
def test_encode_matches_oracle_and_gfloat(kind):
  x = value_set(kind)
  codes = np.asarray(precision.encode(x, CB16))
  assert codes.dtype == np.uint16
  np.testing.assert_array_equal(codes, oracle.oracle_encode(x, 6, 9, 31, True, "ieee", "inf"))
  finite = ~np.isnan(x)
  with np.errstate(all="ignore"):
    rounded = gfloat_round(x[finite], CB16, "nearest_even")
    expected = gfloat.encode_ndarray(gfloat_info(CB16), rounded.astype(np.float64))
  np.testing.assert_array_equal(codes[finite], np.asarray(expected).astype(np.uint16))
  # decode(encode(x)) is round(x): nothing is lost by storing in 16 bits
  V.assert_same_floats(precision.decode(codes, CB16), precision.round(x, CB16), "decode(encode(x))")


VARIANTS = {
    "saturate": CB16.replace(overflow="saturate"),
    "bias30": CB16.replace(bias=30),
    "no_subnormals": CB16.replace(subnormals=False),
    "finite_only": CB16.replace(specials="finite_only"),
}


@pytest.mark.parametrize("mode", ["nearest_even", "toward_zero"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_inferred_parts_are_configurable(variant, mode):
  fmt = VARIANTS[variant]
  x = np.concatenate([V.exhaustive_candidates(fmt), value_set("random_in_range"), V.special_values(fmt)])
  expected = oracle_round(x, fmt, mode)
  if fmt.subnormals and fmt.specials == "ieee":
    V.assert_same_floats(gfloat_round(x, fmt, mode), expected, "gfloat vs oracle")
  for got in V.round_both_ways(x, fmt, mode):
    V.assert_same_floats(got, expected, f"{fmt.name} {mode}")
  np.testing.assert_array_equal(
      np.asarray(precision.encode(x, fmt)),
      oracle.oracle_encode(x, 6, 9, fmt.bias, fmt.subnormals, fmt.specials, fmt.overflow),
  )
  # The variant changes results somewhere (it is not silently the default format).
  assert (V.bits_of(np.asarray(precision.round(x, CB16, mode))) != V.bits_of(got)).any()


def test_no_subnormals_matches_xla_reduce_precision():
  # XLA's ReducePrecision rounds at normal precision and flushes results below min_normal.
  fmt = VARIANTS["no_subnormals"]
  x = np.concatenate([V.exhaustive_candidates(fmt), value_set("random_in_range"), value_set("random_patterns")])
  expected = np.asarray(jax.jit(lambda v: jax.lax.reduce_precision(v, 6, 9))(x))
  V.assert_same_floats(precision.round(x, fmt), expected, "round vs lax.reduce_precision(6, 9)")


CUSTOM = [
    precision.FloatFormat("e3m4", 3, 4),
    precision.FloatFormat("e4m3_ieee", 4, 3),
    precision.FloatFormat("e5m7", 5, 7),
    precision.FloatFormat("e8m3", 8, 3),  # subnormal quantum 2^-129 is itself a float32 subnormal
    precision.FloatFormat("e7m12_sat", 7, 12, overflow="saturate"),
    precision.FloatFormat("e8m10_nosub", 8, 10, subnormals=False),
    precision.FloatFormat("e2m1_fn", 2, 1, specials="finite_only"),
]


@pytest.mark.parametrize("mode", ["nearest_even", "toward_zero"])
@pytest.mark.parametrize("fmt", list(precision.formats.PREDEFINED) + CUSTOM, ids=lambda f: f.name)
def test_every_format_matches_the_oracle(fmt, mode):
  x = np.concatenate([V.random_patterns(2**18, seed=fmt.bits), V.special_values(fmt)])
  if fmt.bits <= 16:
    x = np.concatenate([x, V.exhaustive_candidates(fmt)])
  expected = oracle_round(x, fmt, mode)
  V.assert_same_floats(precision.round(x, fmt, mode), expected, f"{fmt.name} {mode}")
  if mode == "nearest_even":
    oracle_codes = oracle.oracle_encode(
        x, fmt.exponent_bits, fmt.mantissa_bits, fmt.bias, fmt.subnormals, fmt.specials, fmt.overflow
    )
    np.testing.assert_array_equal(np.asarray(precision.encode(x, fmt)), oracle_codes)
    if fmt.bits <= 16:
      codes = V.all_codes(fmt)
      expected_values = oracle.oracle_decode(
          codes, fmt.exponent_bits, fmt.mantissa_bits, fmt.bias, fmt.subnormals, fmt.specials
      )
      V.assert_same_floats(precision.decode(codes, fmt), expected_values, f"decode {fmt.name}")
