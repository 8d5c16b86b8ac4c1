"""Bit-level rounding of float32 values to a `FloatFormat` (integer jnp ops, one exception below).

Notation for one float32 input ``x`` with bit pattern ``u``:

* ``a = u & 0x7FFFFFFF`` (magnitude bits), ``E = a >> 23`` (float32 biased exponent);
* ``sig = (a & 0x7FFFFF) | (E > 0) << 23``, so ``|x| = sig * 2^(max(E, 1) - 150)``.

Rounding to a format with ``m`` fraction bits and bias ``b`` discards the low ``d`` bits of
``sig`` where

    d = max(23 - m, (151 - b - m) - max(E, 1))

(the first term for the format's normal range, the second for its subnormal range, whose
quantum is ``q = 2^(1 - b - m)``). For ``d <= 23`` the discarded bits are the low ``d`` bits
of ``a`` itself, and adding ``2^d`` to the truncated pattern steps to the next representable
value, carrying into the exponent field exactly when the significand overflows. For
``d >= 24`` the value lies below one quantum: it truncates to 0 and rounds up to ``q``.

The discarded fraction is kept as a 0.32 fixed-point number ``frac32`` in ``[0, 2^32)``
(scaled by ``2^(32 - d)``; for ``d > 32`` rounded to nearest even at 32 bits), and:

* nearest_even: up  iff  ``frac32 > 2^31``, or ``frac32 == 2^31`` and the kept value is odd;
* toward_zero:  never up;
* stochastic:   up  iff  ``frac32 + r >= 2^32`` for a uniform 32-bit ``r``, i.e.
  P(up) = frac32 / 2^32, exactly the discarded fraction whenever ``d <= 32``.

Only integer adds, masks, shifts and compares are used: XLA's algebraic simplifier cannot
fold them away (it does fold float tricks such as ``(x + c) - c``: a float-trick kernel without an
optimization barrier rounded 3,141,687 of 2^24 test values wrong), and CPU flush-to-zero settings
cannot touch them.

One exception, for speed: nearest_even in a format whose subnormal range is finer than its
normal shift (cbfloat16, float16, float8) rounds that range as ``roundeven(|x| / q) * q``:
two multiplications by exact powers of two around XLA's RoundNearestEven, which no
simplification can remove and which cannot round twice. It is used only where ``q/2`` is a
float32 normal, so flush-to-zero touches only inputs that round to 0 anyway. In IEEE formats
that overflow to inf, with the IEEE bias, the normal range, overflow and inf are XLA's
``reduce_precision`` (itself integer operations) and NaN takes the scaled branch
(`_nearest_even_ieee`, 7 operations per value in XLA CPU's fused loop); with float32's
exponent range (bfloat16) ``reduce_precision`` alone rounds every number
(`_nearest_even_float32_range`, 3 operations). The per-element variable shift these replace
costs ~20% more work per value, and the integer path for bfloat16 takes 13 operations.
``integer_only=True`` keeps the pure-integer path; tests and the exhaustive check cover both.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from precision.formats import FloatFormat

MODES = ("nearest_even", "toward_zero", "stochastic")

_SIGN = 0x8000_0000
_ABS = 0x7FFF_FFFF
_INF = 0x7F80_0000
_QNAN = 0x7FC0_0000
_QUIET = 0x0040_0000
_HIDDEN = 0x0080_0000
_FRACTION = 0x007F_FFFF


def float_to_bits(value: float) -> int:
  """float32 bit pattern of a Python float (exact for the format constants used here)."""
  exact = np.float32(value)
  if float(exact) != value:
    raise ValueError(f"{value!r} is not exactly a float32")
  return int(exact.view(np.uint32))


@dataclasses.dataclass(frozen=True)
class Constants:
  """Per-format integer constants of the kernel (Python ints, baked into the graph)."""

  shift_normal: int  # 23 - m: bits discarded in the normal range
  sub_offset: int  # 151 - bias - m: d = max(shift_normal, sub_offset - max(E, 1))
  variable_shift: bool  # whether d can exceed shift_normal (format subnormals finer than float32's)
  tiny_path: bool  # whether inputs below one quantum q need their own rule (a < q)
  max_bits: int  # bit pattern of fmt.max
  min_normal_bits: int  # bit pattern of fmt.min_normal
  quantum_bits: int  # bit pattern of the smallest subnormal q = 2^(1 - bias - m)
  half_quantum_bits: int  # bit pattern of q / 2 (zero when q/2 is not a float32)
  quantum_exponent: int  # log2(q) = 1 - bias - m
  scaled_subnormals: bool  # nearest_even may round the subnormal range as round(|x| / q) * q


@functools.cache
def constants(fmt: FloatFormat) -> Constants:
  m = fmt.mantissa_bits
  shift_normal = 23 - m
  sub_offset = 151 - fmt.bias - m
  largest_d = sub_offset - 1  # reached at E <= 1
  variable = fmt.subnormals and largest_d > shift_normal
  return Constants(
    shift_normal=shift_normal,
    sub_offset=sub_offset,
    variable_shift=variable,
    # d >= 24, or d == 23 for float32 subnormal inputs (q = 2^-126): below one quantum.
    tiny_path=variable and largest_d >= 23,
    max_bits=float_to_bits(fmt.max),
    min_normal_bits=float_to_bits(fmt.min_normal),
    quantum_bits=float_to_bits(2.0 ** (fmt.emin - m)),
    half_quantum_bits=float_to_bits(2.0 ** (fmt.emin - m - 1)) if fmt.emin - m > -149 else 0,
    quantum_exponent=fmt.emin - m,
    # Safe when q/2 and every subnormal result are float32 normals, so that flushing float32
    # subnormals (XLA on CPU does) only touches inputs below q/2, which round to 0 anyway.
    scaled_subnormals=variable and fmt.emin - m >= -125,
  )


def _u32(value: int) -> jax.Array:
  return jnp.uint32(value)


def _nearest_even_at(bits: jax.Array, shift: int) -> jax.Array:
  """Drop the low ``shift`` bits of ``bits`` rounding to nearest even: ``bits + (half - 1) + lsb``
  then mask (ml_dtypes' RoundBitsToNearestEven); the carry flows into the exponent field."""
  keep = _u32(~((1 << shift) - 1) & 0xFFFF_FFFF)
  return (bits + _u32((1 << shift >> 1) - 1) + ((bits >> shift) & _u32(1))) & keep


def _scaled_nearest_even(x: jax.Array, quantum_exponent: int) -> jax.Array:
  """``roundeven(x / q) * q`` for ``q = 2^quantum_exponent``: exact scalings around one exact
  rounding instruction; correct for |x| below the format's min_normal (the subnormal grid)."""
  quanta = lax.round(x * np.float32(2.0**-quantum_exponent), lax.RoundingMethod.TO_NEAREST_EVEN)
  return quanta * np.float32(2.0**quantum_exponent)


def significand(a: jax.Array) -> jax.Array:
  """``sig`` of magnitude bits ``a``: the fraction with the implicit leading 1 of normals."""
  return (a & _u32(_FRACTION)) | jnp.where(a >= _u32(_HIDDEN), _u32(_HIDDEN), _u32(0))


def _kept_shift(a: jax.Array, c: Constants) -> jax.Array | int:
  """``min(d, 23)`` per element (uint32), or a Python int when ``d`` is the same everywhere.

  ``d = clip(sub_offset - max(E, 1), shift_normal, 23)``; elements with ``d >= 24`` (below
  one quantum) are handled apart by the caller.
  """
  if not c.variable_shift:
    return c.shift_normal
  biased = (a >> 23).astype(jnp.int32)
  if c.quantum_bits < _HIDDEN:  # the quantum is a float32 subnormal: E = 0 can reach here
    biased = jnp.maximum(biased, jnp.int32(1))
  d = jnp.clip(jnp.int32(c.sub_offset) - biased, c.shift_normal, 23)
  return d.astype(jnp.uint32)


def round_magnitude(
  a: jax.Array, fmt: FloatFormat, mode: str, rbits: jax.Array | None, integer_only: bool = False
) -> jax.Array:
  """Round magnitude bits ``a`` (finite or inf; NaN handled by the caller) to ``fmt``.

  Returns the magnitude bits of the rounded value before overflow and flush rules.
  ``integer_only`` forces the pure-integer path where a faster scaled one exists.
  """
  c = constants(fmt)
  if mode == "nearest_even" and c.scaled_subnormals and not integer_only:
    # The subnormal range by scaling (see the module docstring), the rest at the constant shift.
    subnormal = _scaled_nearest_even(lax.bitcast_convert_type(a, jnp.float32), c.quantum_exponent)
    normal = _nearest_even_at(a, c.shift_normal)
    return jnp.where(a < _u32(c.min_normal_bits), lax.bitcast_convert_type(subnormal, jnp.uint32), normal)

  d = _kept_shift(a, c)
  if isinstance(d, int) and d == 0:  # every float32 value is representable (float32 itself)
    return a
  step = _u32(1 << d) if isinstance(d, int) else _u32(1) << d
  low_mask = step - _u32(1)
  if mode == "toward_zero":
    rounded = a & ~low_mask
    # Below one quantum q (exactly the elements with d >= 24) everything truncates to 0.
    return jnp.where(a < _u32(c.quantum_bits), _u32(0), rounded) if c.tiny_path else rounded

  if mode == "nearest_even":
    if isinstance(d, int):
      return _nearest_even_at(a, d)
    # _nearest_even_at with a per-element shift. The kept value's last bit at d == 23 is the
    # implicit leading 1, not the exponent field's low bit, hence the OR (bit 23 plays no part
    # for d <= 22; float32 subnormal inputs with d == 23 take the tiny rule below).
    lsb = ((a | _u32(_HIDDEN)) >> d) & _u32(1)
    rounded = (a + (low_mask >> 1) + lsb) & ~low_mask
    if c.tiny_path:
      # Below q the rounding above is wrong, but never above q, and at or above q it never
      # goes below q: so values above q/2 take max(rounded, q), the rest 0 (q/2 ties to 0).
      rounded = jnp.where(a > _u32(c.half_quantum_bits), jnp.maximum(rounded, _u32(c.quantum_bits)), _u32(0))
    return rounded

  if mode != "stochastic":
    raise ValueError(f"unknown rounding mode {mode!r}")
  assert rbits is not None
  low = a & low_mask
  kept = a ^ low
  shift_up = (32 - d) if isinstance(d, int) else (_u32(32) - d)
  frac32 = low << shift_up  # low == 0 when d == 0, so a 32-bit shift only ever shifts zero
  if c.tiny_path:
    # Below one quantum q (a < q): the value sig * 2^-d (in quanta) is the round-up probability.
    tiny = a < _u32(c.quantum_bits)
    biased = a >> 23
    sig = significand(a)
    d_full = jnp.minimum(_u32(c.sub_offset) - jnp.maximum(biased, _u32(1)), _u32(63))
    left = sig << (_u32(32) - jnp.minimum(d_full, _u32(32)))
    # d > 32: keep the fraction to nearest even at 32 bits (gfloat's Stochastic definition).
    s = jnp.clip(d_full, _u32(33), _u32(63)) - _u32(32)
    right = (sig + (_u32(1) << (s - _u32(1))) - _u32(1) + ((sig >> s) & _u32(1))) >> s
    frac32 = jnp.where(tiny, jnp.where(d_full <= 32, left, right), frac32)
    kept = jnp.where(tiny, _u32(0), kept)
    step = jnp.where(tiny, _u32(c.quantum_bits), step)
  up = (frac32 + rbits) < frac32  # carry out of 32 bits: frac32 + r >= 2^32
  return kept + jnp.where(up, step, _u32(0))


def round_bits(
  x: jax.Array, fmt: FloatFormat, mode: str, rbits: jax.Array | None, integer_only: bool = False
) -> jax.Array:
  """float32 ``x`` -> float32 values of ``fmt`` (see the module docstring for the rules).

  Overflow: magnitudes beyond ``fmt.max`` become inf (NaN without infinities), or ``max``
  when saturating or when rounding toward zero a finite input. A NaN input gives the same NaN,
  quieted (sign and payload kept; on GPUs the fast path may give the canonical NaN). Without
  subnormals, results below ``min_normal`` become zero.
  """
  c = constants(fmt)
  fast = mode == "nearest_even" and c.scaled_subnormals and fmt.has_inf and fmt.overflow == "inf"
  ieee_bias = fmt.bias == 2 ** (fmt.exponent_bits - 1) - 1
  if fast and ieee_bias and not integer_only:
    return _nearest_even_ieee(x, fmt)
  float32_range = fmt.exponent_bits == 8 and ieee_bias and fmt.subnormals and fmt.mantissa_bits < 23
  if float32_range and mode == "nearest_even" and fmt.has_inf and fmt.overflow == "inf" and not integer_only:
    return _nearest_even_float32_range(x, fmt)
  u = lax.bitcast_convert_type(x, jnp.uint32)
  a = u & _u32(_ABS)
  rounded = round_magnitude(a, fmt, mode, rbits, integer_only)
  overflowed = rounded > _u32(c.max_bits)
  if fmt.overflow == "saturate":
    on_overflow = _u32(c.max_bits)
  else:
    to_inf = _u32(_INF if fmt.has_inf else _QNAN)
    if mode == "toward_zero":
      on_overflow = jnp.where(a == _u32(_INF), to_inf, _u32(c.max_bits))
    else:
      on_overflow = to_inf
  result = jnp.where(overflowed, on_overflow, rounded)
  if not fmt.subnormals:
    result = jnp.where(result < _u32(c.min_normal_bits), _u32(0), result)
  result = jnp.where(a > _u32(_INF), a | _u32(_QUIET), result)  # NaN: the input's, quieted
  return lax.bitcast_convert_type(result | (u ^ a), jnp.float32)


def _nearest_even_ieee(x: jax.Array, fmt: FloatFormat) -> jax.Array:
  """Nearest-even rounding for IEEE-like formats that overflow to inf (cbfloat16, float16, e5m2).

  The same results as the general path in fewer operations (7 per value in XLA CPU's fused
  loop: abs, compare, select, reduce-precision, and multiply, round, multiply; see
  benchmarks/rounding.py), which also keeps compile times low where autocast inserts
  thousands of roundings:

  * ``|x| >= min_normal`` (normal range, overflow, inf): XLA's ``reduce_precision(x, e, m)``,
    round to nearest even at ``m`` bits with the format's exponent range (the bias is the
    IEEE one, checked by the caller), which overflows to +-inf exactly from
    ``max + ulp(max)/2`` on (ties included: ``max`` is odd) and keeps inf;
  * otherwise, and for NaN (every comparison with NaN is false): ``roundeven(x / q) * q`` by
    exact powers of two (see the module docstring), which is the subnormal grid and, for a
    NaN, the quieted input NaN on CPUs (GPUs may return their canonical NaN; `encode` takes
    the sign from the input, so stored codes do not depend on the platform).

  The comparison is on floats: a float32 subnormal input that a flush-to-zero setting reads
  as 0 takes the scaled branch, where it rounds to 0 as it should (``q/2`` is a normal).
  """
  normal = lax.reduce_precision(x, exponent_bits=fmt.exponent_bits, mantissa_bits=fmt.mantissa_bits)
  scaled = _scaled_nearest_even(x, constants(fmt).quantum_exponent)
  return jnp.where(jnp.abs(x) >= np.float32(fmt.min_normal), normal, scaled)


def _nearest_even_float32_range(x: jax.Array, fmt: FloatFormat) -> jax.Array:
  """Nearest-even rounding for IEEE formats with float32's exponent range (bfloat16): 3 ops.

  XLA's ``reduce_precision(x, 8, m)`` rounds the bit pattern to nearest even at ``m`` bits
  (integer operations, so float32 subnormal inputs round like any other: the format's
  subnormals are float32's at ``m`` bits) and overflows to inf from ``max + ulp(max)/2`` on.
  It returns a NaN input unchanged, so NaNs take ``x * 2``: the input NaN, quieted (on CPUs;
  GPUs may give their canonical NaN, as in `_nearest_even_ieee`).
  """
  normal = lax.reduce_precision(x, exponent_bits=8, mantissa_bits=fmt.mantissa_bits)
  return jnp.where(x == x, normal, x * np.float32(2))  # x == x is False exactly for NaN


# ---- random bits for stochastic rounding ----


def _mix32(h: jax.Array) -> jax.Array:
  """lowbias32 (C. Wellons, 2018): a bijective uint32 hash with near-ideal avalanche."""
  h = h ^ (h >> 16)
  h = h * _u32(0x7FEB352D)
  h = h ^ (h >> 15)
  h = h * _u32(0x846CA68B)
  return h ^ (h >> 16)


def counter_bits(shape: tuple[int, ...], seed: jax.Array) -> jax.Array:
  """Uniform uint32 words for ``shape`` from a counter-based generator keyed by ``seed``.

  ``seed`` is uint32[2] (drawn from a JAX PRNG key). Word ``i`` (row-major index) is
  ``mix(mix(i + seed[0]) ^ seed[1])`` with the bijective ``mix`` = lowbias32; for a fixed
  seed the map from counters to words is a permutation of the 2^32 words, so each word is
  exactly uniform over the counter space. It fuses into the rounding loop, which is why it
  runs several times faster than drawing the words with ``jax.random.bits``.
  """
  size = 1
  for n in shape:
    size *= n
  counter = lax.iota(jnp.uint32, size).reshape(shape)
  return _mix32(_mix32(counter + seed[0]) ^ seed[1])


def derive_bits(rbits: jax.Array) -> jax.Array:
  """An independent-looking stream from given words (used for the cotangent's rounding)."""
  return _mix32(rbits ^ _u32(0x5BD1E995))


def derive_seed(seed: jax.Array) -> jax.Array:
  return _mix32(seed ^ jnp.asarray([0x68E31DA4, 0xB5297A4D], jnp.uint32))
