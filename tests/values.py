"""Test inputs and comparison helpers shared by the rounding tests."""

from __future__ import annotations

import jax
import numpy as np

import precision
from precision import _kernel
from precision.testing import assert_same_floats as assert_same_floats  # re-exported for tests


def bits_of(x: np.ndarray) -> np.ndarray:
  return np.asarray(x, np.float32).view(np.uint32)


def overflow_threshold(fmt: precision.FloatFormat) -> float:
  """max + half its ulp: the tie between max and the next step. Nearest rounding overflows from
  here on in IEEE formats (max is odd); in finite_only formats only above it (max is even)."""
  return fmt.max + 2.0 ** (fmt.emax - fmt.mantissa_bits - 1)


def all_codes(fmt: precision.FloatFormat) -> np.ndarray:
  dtype = np.uint8 if fmt.bits <= 8 else np.uint16
  return np.arange(2**fmt.bits, dtype=np.uint32).astype(dtype)


def neighbours(x: np.ndarray) -> np.ndarray:
  """The float32 values adjacent to each of ``x`` (both sides)."""
  x = np.asarray(x, np.float32)
  with np.errstate(over="ignore"):
    return np.concatenate([np.nextafter(x, np.float32(np.inf)), np.nextafter(x, np.float32(-np.inf))])


def exhaustive_candidates(fmt: precision.FloatFormat) -> np.ndarray:
  """Every value of ``fmt`` (decoded from every code), the midpoints between consecutive
  values, and the float32 neighbours of all of those; both signs."""
  with np.errstate(invalid="ignore"):
    values = np.asarray(precision.decode(all_codes(fmt), fmt), np.float64)
  finite = np.unique(np.abs(values[np.isfinite(values)]))  # sorted, non-negative
  midpoints = (finite[:-1] + finite[1:]) / 2  # need m + 2 significant bits: exact in float32
  top = np.array([overflow_threshold(fmt)])
  base = np.concatenate([finite, midpoints, top]).astype(np.float32)
  assert (base.astype(np.float64) == np.concatenate([finite, midpoints, top])).all()
  points = np.concatenate([base, neighbours(base)])
  return np.concatenate([points, -points])


def random_patterns(n: int, seed: int = 0) -> np.ndarray:
  """``n`` float32 values with uniformly random bit patterns: every exponent, NaN and inf."""
  rng = np.random.default_rng(seed)
  return rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)


def special_values(fmt: precision.FloatFormat) -> np.ndarray:
  half_sub = fmt.min_subnormal / 2
  largest_subnormal = fmt.min_normal - fmt.min_subnormal
  threshold = overflow_threshold(fmt)
  f32 = np.finfo(np.float32)
  with np.errstate(over="ignore"):  # float32's own threshold is beyond float32: it becomes inf
    base = np.array(
      [
        0.0,
        np.inf,
        fmt.max,
        threshold,
        fmt.min_normal,
        fmt.min_subnormal,
        half_sub,
        largest_subnormal,
        1.0,
        f32.max,
        f32.smallest_subnormal,
        f32.smallest_normal,
      ],
      np.float32,
    )
  nans = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF, 0x7F803FFF], np.uint32)
  values = np.concatenate([base, neighbours(base)])
  return np.concatenate([values, -values, nans.view(np.float32)])


def round_both_ways(x: np.ndarray, fmt, mode: str = "nearest_even", **kwargs) -> list[np.ndarray]:
  """`precision.round` eagerly and inside an outer ``jax.jit`` (anti-folding check), and the
  kernel's pure-integer path (which the public API uses for other formats and modes)."""
  fmt = precision.get_format(fmt)
  eager = np.asarray(precision.round(x, fmt, mode, **kwargs))
  jitted = np.asarray(jax.jit(lambda v: precision.round(v, fmt, mode, **kwargs))(x))
  rbits = kwargs.get("rbits")
  integer_only = np.asarray(jax.jit(lambda v: _kernel.round_bits(v, fmt, mode, rbits, integer_only=True))(x))
  return [eager, jitted, integer_only]
