"""bfloat16, float16, float8_e4m3fn, float8_e5m2: round/encode/decode equal ml_dtypes casts bit for bit.

float16's reference is NumPy's float16 (ml_dtypes has none). One documented difference: NumPy
keeps NaN payloads when casting to float16, while we (like ml_dtypes for its formats) encode every
NaN as the quiet NaN with the input's sign; NaN inputs are compared on that rule.
"""

import numpy as np
import pytest

import precision
from precision.testing import reference_dtype
from tests import values as V

FORMATS = ["bfloat16", "float16", "float8_e4m3fn", "float8_e5m2"]
REFERENCE_DTYPES = {name: reference_dtype(name) for name in FORMATS}


def reference_cast(x: np.ndarray, name: str) -> np.ndarray:
  with np.errstate(all="ignore"):
    return np.asarray(x, np.float32).astype(REFERENCE_DTYPES[name])


def storage(name: str):
  return np.uint16 if precision.get_format(name).bits == 16 else np.uint8


def check_round_and_encode(x: np.ndarray, name: str) -> None:
  fmt = precision.get_format(name)
  expected = reference_cast(x, name)
  with np.errstate(invalid="ignore"):
    expected_values = expected.astype(np.float32)
  for got in V.round_both_ways(x, fmt):
    V.assert_same_floats(got, expected_values, f"round to {name}")
  codes = np.asarray(precision.encode(x, fmt))
  assert codes.dtype == storage(name)
  expected_codes = expected.view(storage(name)).copy()
  nan = np.isnan(x)
  quiet = ((2**fmt.exponent_bits - 1) << fmt.mantissa_bits) | (1 << (fmt.mantissa_bits - 1))
  if not fmt.has_inf:
    quiet = 2 ** (fmt.bits - 1) - 1
  sign = (V.bits_of(x[nan]) >> 31).astype(np.uint32) << (fmt.bits - 1)
  expected_codes[nan] = (sign | quiet).astype(storage(name))
  if name != "float16":  # ml_dtypes itself encodes NaN this way: the override changes nothing
    np.testing.assert_array_equal(expected_codes, expected.view(storage(name)))
  np.testing.assert_array_equal(codes, expected_codes, err_msg=f"encode to {name}")


@pytest.mark.parametrize("name", FORMATS)
def test_decode_every_code(name):
  fmt = precision.get_format(name)
  codes = V.all_codes(fmt)
  with np.errstate(invalid="ignore"):
    expected = codes.view(REFERENCE_DTYPES[name]).astype(np.float32)
  got = precision.decode(codes, fmt)
  assert isinstance(got, np.ndarray) and got.dtype == np.float32
  if fmt.bits == 16:  # ml_dtypes and NumPy keep 16-bit NaN payloads, and so do we
    np.testing.assert_array_equal(V.bits_of(got), V.bits_of(expected))
  else:  # ml_dtypes quiets float8 NaNs on decode; we keep e5m2 payloads: compare NaN-ness and sign
    V.assert_same_floats(got, expected, f"decode {name}")
    np.testing.assert_array_equal(np.signbit(got), np.signbit(expected))


@pytest.mark.parametrize("name", FORMATS)
def test_every_value_midpoint_and_neighbour(name):
  x = V.exhaustive_candidates(precision.get_format(name))
  assert x.size > 6 * 2 ** (precision.get_format(name).bits - 2)
  check_round_and_encode(x, name)


@pytest.mark.parametrize("name", FORMATS)
def test_a_million_random_patterns(name):
  x = V.random_patterns(2**20, seed=sum(map(ord, name)))
  exponents = (V.bits_of(x) >> 23) & 0xFF
  assert np.unique(exponents).size == 256  # every float32 exponent, inf/NaN included
  check_round_and_encode(x, name)


@pytest.mark.parametrize("name", FORMATS)
def test_special_values(name):
  fmt = precision.get_format(name)
  x = V.special_values(fmt)
  check_round_and_encode(x, name)
  # Spelled out, independent of the reference:
  r = np.asarray(
    precision.round(np.array([0.0, -0.0, fmt.max, -fmt.max, fmt.min_subnormal / 2], np.float32), fmt)
  )
  assert list(V.bits_of(r[:2])) == [0, 0x8000_0000]
  assert r[2] == fmt.max and r[3] == -fmt.max and r[4] == 0.0
  above = np.nextafter(np.float32(V.overflow_threshold(fmt)), np.float32(0))
  assert np.asarray(precision.round(above, fmt)) == fmt.max  # just below the threshold: no overflow


def test_e4m3fn_overflow_tie_rounds_to_even_max():
  # 464 lies half-way between 448 (fraction 110, the largest finite) and the NaN code.
  r = np.asarray(precision.round(np.array([464.0, 465.0, np.inf], np.float32), precision.float8_e4m3fn))
  assert r[0] == 448.0 and np.isnan(r[1]) and np.isnan(r[2])
