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
from precision.testing import gfloat_format_info
from tests import oracle
from tests import values as V

CB16 = precision.cbfloat16


gfloat_info = gfloat_format_info


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


SR_FORMATS = [
  CB16,
  precision.bfloat16,
  precision.float16,
  CB16.replace(overflow="saturate"),
  CB16.replace(bias=30),
]


@pytest.mark.parametrize("fmt", SR_FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("kind", SETS)
def test_stochastic_matches_gfloat_given_the_same_random_bits(kind, fmt):
  x = value_set(kind) if fmt == CB16 else np.concatenate([V.exhaustive_candidates(fmt), value_set(kind)])
  rbits = np.random.default_rng(7).integers(0, 2**32, x.shape, dtype=np.uint64).astype(np.uint32)
  expected = gfloat_round(x, fmt, "stochastic", rbits=rbits)
  for got in V.round_both_ways(x, fmt, "stochastic", rbits=jax.numpy.asarray(rbits)):
    V.assert_same_floats(got, expected, f"{fmt.name} stochastic on {kind}")
  # Rounding really happened both ways: some values went up, some down, some unchanged.
  changed = got != np.asarray(precision.round(x, fmt, "toward_zero"))
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
  x = np.concatenate(
    [V.exhaustive_candidates(fmt), value_set("random_in_range"), value_set("random_patterns")]
  )
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
  precision.FloatFormat("e7m10_q126", 7, 10, bias=117),  # bias + m == 127: q is float32's 2^-126
  precision.FloatFormat("e8m22", 8, 22),  # q = 2^-148
  precision.FloatFormat("e5m6_bias2", 5, 6, bias=2),  # large values, q = 2^-7
]


@pytest.mark.parametrize("mode", ["nearest_even", "toward_zero"])
@pytest.mark.parametrize("fmt", list(precision.formats.PREDEFINED) + CUSTOM, ids=lambda f: f.name)
def test_every_format_matches_the_oracle(fmt, mode):
  x = np.concatenate([V.random_patterns(2**18, seed=fmt.bits), V.special_values(fmt)])
  if fmt.bits <= 16:
    x = np.concatenate([x, V.exhaustive_candidates(fmt)])
  expected = oracle_round(x, fmt, mode)
  for got in V.round_both_ways(x, fmt, mode):
    V.assert_same_floats(got, expected, f"{fmt.name} {mode}")
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


@pytest.mark.parametrize("fmt", [CB16, precision.bfloat16, precision.float8_e4m3fn], ids=lambda f: f.name)
def test_float64_inputs_are_rounded_once(fmt):
  """Python floats and NumPy float64 arrays are narrowed without double rounding."""
  rng = np.random.default_rng(64)
  x32 = V.exhaustive_candidates(fmt).astype(np.float64)
  # float64 values just above/below float32 midpoints of the format: double rounding traps.
  nudged = np.concatenate([x32 * (1 + 2.0**-40), x32 * (1 - 2.0**-40), x32 + 2.0**-1070])
  wide = np.concatenate([nudged, rng.standard_normal(2**16) * 2.0 ** rng.uniform(-45, 40, 2**16)])
  expected = oracle._round_f64(
    wide,
    fmt.exponent_bits,
    fmt.mantissa_bits,
    fmt.bias,
    fmt.subnormals,
    fmt.specials,
    fmt.overflow,
    "nearest_even",
  ).astype(np.float32)
  V.assert_same_floats(precision.round(wide, fmt), expected, f"{fmt.name} from float64")
  naive = np.asarray(precision.round(wide.astype(np.float32), fmt))
  assert (V.bits_of(naive) != V.bits_of(expected)).any()  # the trap is real: naive narrowing errs
  assert float(precision.round(1 + 2.0**-10 + 2.0**-30, "cb16")) == 1 + 2.0**-9


def test_python_integers_are_numbers_and_integer_arrays_are_refused():
  """``round(3, f)`` took a Python int but ``round([1, 2], f)`` refused the list (a probe): Python
  numbers, scalars or lists, are values (formats.md); a NumPy or JAX integer array is refused, as
  it would be silently converted."""
  ints = [1, 2, 3, 1025, 2**40 + 2**31, -7]
  V.assert_same_floats(precision.round(ints, CB16), precision.round(np.array(ints, np.float64), CB16), "ints")
  assert float(precision.round(1025, CB16)) == 1024.0  # a tie at 10 significant bits: to even
  for array in (np.array([1, 2]), jax.numpy.array([1, 2]), [True, False]):
    with pytest.raises(TypeError, match="takes floating-point values"):
      precision.round(array, CB16)
