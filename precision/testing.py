"""Helpers for bit-exact numerical tests of low-precision code.

Used by this project's tests and benchmarks, and usable in yours: NaN-aware bitwise float
comparison, the ml_dtypes / NumPy dtype of a predefined format, and the gfloat description of
a format (gfloat, a dev dependency, is imported only when that is asked for).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from precision.formats import FloatFormat, get_format

_REFERENCE_DTYPES = {
  "float32": np.float32,
  "bfloat16": ml_dtypes.bfloat16,
  "float16": np.float16,
  "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
  "float8_e5m2": ml_dtypes.float8_e5m2,
}


def same_floats(actual: Any, expected: Any) -> np.ndarray:
  """Elementwise: equal bit patterns, or both NaN (so -0.0 differs from 0.0).

  Compared as float32, or as float64 when either side is float64 (nothing is narrowed).
  """
  actual, expected, bits = _as_common_float(actual, expected)
  return (actual.view(bits) == expected.view(bits)) | (np.isnan(actual) & np.isnan(expected))


def _as_common_float(actual: Any, expected: Any) -> tuple[np.ndarray, np.ndarray, Any]:
  """Both as float32, or both as float64 when either is float64 (never narrowed: a float64
  that is not a float32 value differs from every float32), and the matching uint dtype."""
  actual, expected = np.asarray(actual), np.asarray(expected)
  wide = np.float64 in (actual.dtype, expected.dtype)
  dtype, bits = (np.float64, np.uint64) if wide else (np.float32, np.uint32)
  return actual.astype(dtype), expected.astype(dtype), bits


def assert_same_floats(actual: Any, expected: Any, context: str = "") -> None:
  """Raise AssertionError naming the first differing elements unless `same_floats` holds everywhere."""
  actual, expected, bits = _as_common_float(actual, expected)
  if actual.shape != expected.shape:
    raise AssertionError(f"{context}: shapes differ: {actual.shape} vs {expected.shape}")
  same = same_floats(actual, expected)
  if not same.all():
    bits_a, bits_e = actual.view(bits), expected.view(bits)
    width = 2 * actual.dtype.itemsize
    detail = ", ".join(
      f"#{i}: got {actual.flat[i]!r} (0x{bits_a.flat[i]:0{width}x}), want {expected.flat[i]!r} "
      f"(0x{bits_e.flat[i]:0{width}x})"
      for i in np.flatnonzero(~same)[:5]
    )
    raise AssertionError(f"{context}: {(~same).sum()} of {same.size} differ; {detail}")


def reference_dtype(fmt: FloatFormat | str) -> Any:
  """The NumPy / ml_dtypes dtype of a predefined format (``None`` for other formats)."""
  fmt = get_format(fmt)
  dtype = _REFERENCE_DTYPES.get(fmt.name)
  return dtype if dtype is not None and get_format(fmt.name) == fmt else None


def gfloat_format_info(fmt: FloatFormat | str) -> Any:
  """gfloat's ``FormatInfo`` for an IEEE-like format with subnormals (e.g. cbfloat16)."""
  import gfloat  # dev dependency

  fmt = get_format(fmt)
  if fmt.specials != "ieee" or not fmt.subnormals:
    raise ValueError(f"{fmt.name}: only IEEE-like formats with subnormals map to gfloat here")
  return gfloat.FormatInfo(
    fmt.name,
    k=fmt.bits,
    precision=fmt.mantissa_bits + 1,
    bias=fmt.bias,
    is_signed=True,
    domain=gfloat.Domain.Extended,
    has_nz=True,
    num_high_nans=2**fmt.mantissa_bits - 1,
    has_subnormals=True,
    is_twos_complement=False,
  )
