"""Independent float64 NumPy reference ("oracle") for small binary float formats.

A format has 1 sign bit, ``e`` exponent bits, ``m`` stored fraction bits and an
integer ``bias``; ``emin = 1 - bias``.  ``specials`` is ``"ieee"`` (all-ones
exponent reserved for inf/NaN) or ``"finite_only"`` (no infinities, only the
all-ones code is NaN).

Method (everything is done on float64 copies of the float32 inputs; float64
holds every float32 value exactly, float32 subnormals included, and every
operation below is exact):

1. For a finite non-zero magnitude ``a``, ``np.frexp`` gives ``a = r * 2**p``
   with ``r`` in [0.5, 1), so ``floor(log2 a) = p - 1``.
2. The quantum (grid spacing) is ``2**(k - m)`` where ``k = max(p - 1, emin)``
   with subnormals and ``k = p - 1`` without (unbounded exponent range below).
3. ``a`` is scaled by ``2**(m - k)`` with ``np.ldexp`` (exact: power-of-two
   scaling of a 24-bit significand that stays well inside float64's range),
   which puts the kept bits in the integer part.  ``np.rint`` (round half to
   even, exact in float64 for these magnitudes) implements roundTiesToEven and
   ``np.floor`` implements truncation; the result is scaled back with
   ``np.ldexp``.  A carry into the next binade simply gives the next power of
   two, which is on the grid.
4. Without subnormals, a rounded magnitude below ``2**emin`` is flushed to
   zero.  A rounded magnitude above the format's ``max`` is resolved by the
   ``overflow`` policy (``"saturate"`` -> max; ``"inf"`` -> max for
   ``toward_zero``, otherwise inf (ieee) or NaN (finite_only)).
5. NaN stays NaN, zeros keep their sign, infinities follow the overflow policy,
   and the sign of the input is reattached with ``np.copysign``.

Encoding re-derives exponent and fraction fields from the rounded float64
value with ``np.frexp``/``np.ldexp``; decoding evaluates the field formula in
float64.  No float32 bit patterns are manipulated anywhere.
"""

from __future__ import annotations

import numpy as np

_CHUNK = 1 << 20

_MODES = ("nearest_even", "toward_zero")
_SPECIALS = ("ieee", "finite_only")
_OVERFLOWS = ("saturate", "inf")


def _check(exponent_bits: int, mantissa_bits: int, specials: str) -> None:
  if not 1 <= exponent_bits <= 11:
    raise ValueError(f"bad exponent_bits {exponent_bits}")
  if not 1 <= mantissa_bits <= 52:
    raise ValueError(f"bad mantissa_bits {mantissa_bits}")
  if specials not in _SPECIALS:
    raise ValueError(f"bad specials {specials!r}")


def _e_top(exponent_bits: int, specials: str) -> int:
  """Largest exponent code holding finite normal values."""
  return (1 << exponent_bits) - (2 if specials == "ieee" else 1)


def format_max(exponent_bits: int, mantissa_bits: int, bias: int, specials: str) -> float:
  """Largest finite magnitude of the format (float64)."""
  _check(exponent_bits, mantissa_bits, specials)
  e_top = _e_top(exponent_bits, specials)
  m = mantissa_bits
  if specials == "ieee":
    significand = 2.0 - 2.0**-m
  else:
    significand = 2.0 - 2.0 ** (1 - m)
  return float(np.ldexp(significand, e_top - bias))


def _round_magnitude(a: np.ndarray, mantissa_bits: int, emin: int, subnormals: bool, mode: str) -> np.ndarray:
  """Rounds finite positive float64 magnitudes ``a`` to the grid (no upper limit)."""
  _, p = np.frexp(a)
  k = p.astype(np.int64) - 1  # floor(log2 a)
  if subnormals:
    k = np.maximum(k, emin)
  shift = k - mantissa_bits  # log2 of the quantum
  scaled = np.ldexp(a, (-shift).astype(np.int32))
  if mode == "nearest_even":
    q = np.rint(scaled)
  else:
    q = np.floor(scaled)
  r = np.ldexp(q, shift.astype(np.int32))
  if not subnormals:
    r = np.where(r < np.ldexp(1.0, emin), 0.0, r)
  return r


def _round_f64(
  x64: np.ndarray,
  exponent_bits: int,
  mantissa_bits: int,
  bias: int,
  subnormals: bool,
  specials: str,
  overflow: str,
  mode: str,
) -> np.ndarray:
  """Rounds a float64 array (holding float32 values); returns float64 results."""
  emin = 1 - bias
  vmax = format_max(exponent_bits, mantissa_bits, bias, specials)
  a = np.abs(x64)
  finite_nz = np.isfinite(a) & (a != 0)
  out_mag = np.zeros_like(a)
  if np.any(finite_nz):
    out_mag[finite_nz] = _round_magnitude(a[finite_nz], mantissa_bits, emin, subnormals, mode)

  # Value used when the magnitude is too large (finite overflow) / infinite input.
  if overflow == "saturate" or mode == "toward_zero":
    over_val = vmax
  else:
    over_val = np.inf if specials == "ieee" else np.nan
  if overflow == "saturate":
    inf_val = vmax
  else:
    inf_val = np.inf if specials == "ieee" else np.nan

  over = finite_nz & (out_mag > vmax)
  out_mag = np.where(over, over_val, out_mag)
  out_mag = np.where(np.isinf(a), inf_val, out_mag)
  out_mag = np.where(np.isnan(a), np.nan, out_mag)
  return np.copysign(out_mag, x64)


def oracle_round(
  x: np.ndarray,
  exponent_bits: int,
  mantissa_bits: int,
  bias: int,
  subnormals: bool,
  specials: str,
  overflow: str,
  mode: str,
) -> np.ndarray:
  """Rounds float32 ``x`` (any shape) to the format; returns float32 of the same shape."""
  _check(exponent_bits, mantissa_bits, specials)
  if mode not in _MODES:
    raise ValueError(f"bad mode {mode!r}")
  if overflow not in _OVERFLOWS:
    raise ValueError(f"bad overflow {overflow!r}")
  x = np.asarray(x, dtype=np.float32)
  flat = x.reshape(-1)
  out = np.empty(flat.shape, dtype=np.float32)
  for start in range(0, flat.size, _CHUNK):
    with np.errstate(invalid="ignore"):  # signalling NaN inputs
      x64 = flat[start : start + _CHUNK].astype(np.float64)
    r = _round_f64(x64, exponent_bits, mantissa_bits, bias, subnormals, specials, overflow, mode)
    out[start : start + _CHUNK] = r.astype(np.float32)
  return out.reshape(x.shape)


def _code_dtype(exponent_bits: int, mantissa_bits: int) -> type:
  total = 1 + exponent_bits + mantissa_bits
  if total <= 8:
    return np.uint8
  if total <= 16:
    return np.uint16
  if total <= 32:
    return np.uint32
  return np.uint64


def oracle_encode(
  x: np.ndarray,
  exponent_bits: int,
  mantissa_bits: int,
  bias: int,
  subnormals: bool,
  specials: str,
  overflow: str,
) -> np.ndarray:
  """Rounds float32 ``x`` (nearest_even) and returns the integer codes of the format."""
  _check(exponent_bits, mantissa_bits, specials)
  if overflow not in _OVERFLOWS:
    raise ValueError(f"bad overflow {overflow!r}")
  e, m = exponent_bits, mantissa_bits
  emin = 1 - bias
  all_ones_e = (1 << e) - 1
  sign_bit = 1 << (e + m)
  if specials == "ieee":
    nan_code = (all_ones_e << m) | (1 << (m - 1))
  else:
    nan_code = (all_ones_e << m) | ((1 << m) - 1)
  inf_code = all_ones_e << m

  x = np.asarray(x, dtype=np.float32)
  flat = x.reshape(-1)
  out = np.empty(flat.shape, dtype=_code_dtype(e, m))
  for start in range(0, flat.size, _CHUNK):
    with np.errstate(invalid="ignore"):  # signalling NaN inputs
      x64 = flat[start : start + _CHUNK].astype(np.float64)
    r = _round_f64(x64, e, m, bias, subnormals, specials, overflow, "nearest_even")
    v = np.abs(r)
    code = np.zeros(v.shape, dtype=np.int64)

    normal = np.isfinite(v) & (v >= np.ldexp(1.0, emin))
    if np.any(normal):
      vn = v[normal]
      _, p = np.frexp(vn)
      ex = p.astype(np.int64) - 1  # floor(log2 v)
      frac = (np.ldexp(vn, (-ex).astype(np.int32)) - 1.0) * float(1 << m)
      fi = frac.astype(np.int64)
      assert np.all(fi == frac), "non-integral fraction field"
      code[normal] = ((ex + bias) << m) | fi

    sub = np.isfinite(v) & (v > 0) & ~normal
    if np.any(sub):
      frac = np.ldexp(v[sub], m - emin)
      fi = frac.astype(np.int64)
      assert np.all(fi == frac), "non-integral subnormal fraction field"
      code[sub] = fi

    code[np.isinf(v)] = inf_code
    code[np.isnan(v)] = nan_code
    code |= np.where(np.signbit(r), sign_bit, 0)
    out[start : start + _CHUNK] = code.astype(out.dtype)
  return out.reshape(x.shape)


def oracle_decode(
  codes: np.ndarray, exponent_bits: int, mantissa_bits: int, bias: int, subnormals: bool, specials: str
) -> np.ndarray:
  """Decodes integer codes of the format into float32 values (same shape)."""
  _check(exponent_bits, mantissa_bits, specials)
  e, m = exponent_bits, mantissa_bits
  emin = 1 - bias
  all_ones_e = (1 << e) - 1
  all_ones_f = (1 << m) - 1
  c = np.asarray(codes).astype(np.int64)
  s = (c >> (e + m)) & 1
  ex = (c >> m) & all_ones_e
  f = c & all_ones_f
  ff = f.astype(np.float64)

  normal_val = np.ldexp(1.0 + ff / float(1 << m), (ex - bias).astype(np.int32))
  if subnormals:
    sub_val = np.ldexp(ff, emin - m)
  else:
    sub_val = np.zeros_like(ff)
  mag = np.where(ex == 0, sub_val, normal_val)
  if specials == "ieee":
    top = ex == all_ones_e
    mag = np.where(top & (f == 0), np.inf, mag)
    mag = np.where(top & (f != 0), np.nan, mag)
  else:
    mag = np.where((ex == all_ones_e) & (f == all_ones_f), np.nan, mag)
  val = np.where(s == 1, -1.0, 1.0)
  return np.copysign(mag, val).astype(np.float32)


if __name__ == "__main__":
  import time

  import ml_dtypes

  def _mismatches(got: np.ndarray, want: np.ndarray) -> int:
    got = np.asarray(got, dtype=np.float32)
    want = np.asarray(want, dtype=np.float32)
    both_nan = np.isnan(got) & np.isnan(want)
    same_bits = got.view(np.uint32) == want.view(np.uint32)
    return int(np.count_nonzero(~(both_nan | same_bits)))

  rng = np.random.default_rng(0)
  n = 400_000
  # Random bit patterns: every exponent (subnormals, inf, NaN included) with uniform
  # fractions, plus values with few random low bits to hit ties often.
  bits = rng.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32)
  tie_bits = bits & np.uint32(0xFFFF0000) | (rng.integers(0, 4, size=n, dtype=np.uint32) << 14)
  small = rng.uniform(-600.0, 600.0, size=n).astype(np.float32)
  specials_in = np.array(
    [
      0.0,
      -0.0,
      np.inf,
      -np.inf,
      np.nan,
      -np.nan,
      448.0,
      464.0,
      465.0,
      -480.0,
      65504.0,
      65519.99,
      65520.0,
      2.0**-24,
      2.0**-25,
      2.0**-26,
      3.0 * 2.0**-26,
      2.0**-133,
      2.0**-134,
      2.0**-149,
    ],
    dtype=np.float32,
  )
  x = np.concatenate([bits.view(np.float32), tie_bits.view(np.float32), small, specials_in])

  cases = [
    ("bfloat16", (8, 7, 127, True, "ieee", "inf"), ml_dtypes.bfloat16),
    ("float16", (5, 10, 15, True, "ieee", "inf"), np.float16),
    ("float8_e4m3fn", (4, 3, 7, True, "finite_only", "inf"), ml_dtypes.float8_e4m3fn),
    ("float8_e5m2", (5, 2, 15, True, "ieee", "inf"), ml_dtypes.float8_e5m2),
  ]
  for name, fmt, dt in cases:
    e_, m_, b_, sub_, sp_, ov_ = fmt
    t0 = time.perf_counter()
    got = oracle_round(x, e_, m_, b_, sub_, sp_, ov_, "nearest_even")
    dt_s = time.perf_counter() - t0
    with np.errstate(invalid="ignore", over="ignore"):
      want = x.astype(dt).astype(np.float32)
    print(f"round {name:14s}: {_mismatches(got, want)} mismatches / {x.size} ({dt_s:.2f}s)")

    codes = oracle_encode(x, e_, m_, b_, sub_, sp_, ov_)
    with np.errstate(invalid="ignore", over="ignore"):
      want_codes = x.astype(dt).view(codes.dtype)
    nan_mask = np.isnan(got)
    code_bad = int(np.count_nonzero((codes != want_codes) & ~nan_mask))
    print(f"encode {name:13s}: {code_bad} mismatches on non-NaN values")

    all_codes = np.arange(1 << (1 + e_ + m_), dtype=np.uint32).astype(codes.dtype)
    dec = oracle_decode(all_codes, e_, m_, b_, sub_, sp_)
    want_dec = all_codes.view(dt).astype(np.float32)
    print(f"decode {name:13s}: {_mismatches(dec, want_dec)} mismatches / {all_codes.size} codes")
    finite = np.isfinite(dec)
    re = oracle_encode(dec[finite], e_, m_, b_, sub_, sp_, ov_)
    print(f"re-encode {name:10s}: {int(np.count_nonzero(re != all_codes[finite]))} mismatches")

  # Second, independent method for small formats: enumerate the positive grid
  # (codes in order, extended by one step above max) and round by searching it.
  def _grid_round(
    x: np.ndarray, e_: int, m_: int, b_: int, sub_: bool, sp_: str, ov_: str, mode_: str
  ) -> np.ndarray:
    emin_ = 1 - b_
    n_codes = (1 << (e_ + m_)) + 1  # every positive code plus one beyond
    codes_ = np.arange(n_codes, dtype=np.int64)
    ex_, f_ = codes_ >> m_, codes_ & ((1 << m_) - 1)
    grid = np.where(
      ex_ == 0, f_ * 2.0 ** (emin_ - m_), (1.0 + f_ / 2.0**m_) * 2.0 ** (ex_ - b_).astype(np.float64)
    )
    vmax_ = format_max(e_, m_, b_, sp_)
    last = int(np.searchsorted(grid, vmax_)) + 1  # grid[:last+1] includes one step above max
    grid, codes_ = grid[: last + 1], codes_[: last + 1]
    with np.errstate(invalid="ignore"):
      x64 = x.astype(np.float64)
    a = np.abs(x64)
    res = np.full(a.shape, np.nan)
    fin = np.isfinite(a)
    af = a[fin]
    hi_i = np.clip(np.searchsorted(grid, af, side="right"), 1, len(grid) - 1)
    lo_i = hi_i - 1
    lo, hi = grid[lo_i], grid[hi_i]
    if mode_ == "toward_zero":
      r = np.where(af >= hi, hi, lo)
    else:
      dlo, dhi = af - lo, hi - af
      even_hi = (codes_[hi_i] & 1) == 0
      r = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(even_hi, hi, lo)))
      r = np.where(af >= hi, hi, r)
    beyond = grid[-1] + (grid[-1] - grid[-2])
    r = np.where(af >= beyond, np.inf, r)  # far above: certainly overflowed
    if not sub_:
      small = af < 2.0**emin_
      thresh = 2.0**emin_ - 2.0 ** (emin_ - 2 - m_)
      up = (af >= thresh) if mode_ == "nearest_even" else np.zeros_like(small)
      r = np.where(small, np.where(up, 2.0**emin_, 0.0), r)
    over = r > vmax_
    if ov_ == "saturate" or mode_ == "toward_zero":
      r = np.where(over, vmax_, r)
    else:
      r = np.where(over, np.inf if sp_ == "ieee" else np.nan, r)
    res[fin] = r
    res[np.isinf(a)] = vmax_ if ov_ == "saturate" else (np.inf if sp_ == "ieee" else np.nan)
    return np.copysign(res, x64).astype(np.float32)

  def _probe_values(e_: int, m_: int, b_: int, sp_: str) -> np.ndarray:
    all_c = np.arange(1 << (e_ + m_), dtype=np.uint32)
    g = oracle_decode(all_c, e_, m_, b_, True, sp_).astype(np.float64)
    g = np.sort(g[np.isfinite(g)])
    g = np.append(g, 2 * g[-1] - g[-2])
    mids = (g[:-1] + g[1:]) / 2
    emin_ = 1 - b_
    ftz_edge = [2.0**emin_ * (1 - 2.0 ** (-m_ - k)) for k in (1, 2, 3)]  # flush-to-zero edge
    pts = np.concatenate([g, mids, g / 2, g * 0.75, mids * 0.5, ftz_edge]).astype(np.float32)
    pts = np.concatenate([pts, np.nextafter(pts, np.float32(np.inf)), np.nextafter(pts, np.float32(-np.inf))])
    lg = rng.uniform(-b_ - m_ - 5, 2**e_ - b_ + 2, size=50_000)
    rnd = (2.0**lg).astype(np.float32)
    v = np.concatenate([pts, rnd, np.float32([np.inf, np.nan, 2.0**-149, 1e38])])
    return np.concatenate([v, -v])

  total_bad = 0
  for fmt in [
    (4, 3, 7, "finite_only"),
    (5, 2, 15, "ieee"),
    (3, 2, 3, "ieee"),
    (2, 1, 1, "ieee"),
    (3, 4, 2, "finite_only"),
    (5, 10, 15, "ieee"),
    (6, 9, 31, "ieee"),
    (4, 3, 11, "ieee"),
  ]:
    e_, m_, b_, sp_ = fmt
    xs = _probe_values(e_, m_, b_, sp_)
    for sub_ in (True, False):
      for ov_ in ("saturate", "inf"):
        for mode_ in ("nearest_even", "toward_zero"):
          got = oracle_round(xs, e_, m_, b_, sub_, sp_, ov_, mode_)
          want = _grid_round(xs, e_, m_, b_, sub_, sp_, ov_, mode_)
          total_bad += _mismatches(got, want)
  print(f"grid cross-check (8 formats x subnormals x overflow x mode): {total_bad} mismatches")

  # NaN codes and signs.
  nan_in = np.float32([np.nan, -np.nan])
  print("bf16 NaN codes:", [hex(c) for c in oracle_encode(nan_in, 8, 7, 127, True, "ieee", "inf")])
  print("f16 NaN codes:", [hex(c) for c in oracle_encode(nan_in, 5, 10, 15, True, "ieee", "inf")])
  print(
    "e4m3fn NaN/overflow codes:",
    [
      hex(c)
      for c in oracle_encode(
        np.float32([np.nan, -np.nan, 500.0, -np.inf]), 4, 3, 7, True, "finite_only", "inf"
      )
    ],
  )
  print(
    "e4m3fn saturate 500, -inf:",
    oracle_round(np.float32([500.0, -np.inf]), 4, 3, 7, True, "finite_only", "saturate", "nearest_even"),
  )
