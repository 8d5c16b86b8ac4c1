"""Helpers for bit-exact numerical tests of low-precision code.

Used by this project's tests and benchmarks, and usable in yours: NaN-aware bitwise float
comparison, the ml_dtypes / NumPy dtype of a predefined format, and the gfloat description of
a format (gfloat, a dev dependency, is imported only when that is asked for).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import jax
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


def _is_tree(x: Any) -> bool:
  """A container of arrays rather than one array-like: a mapping (a dict of gradients, Flax's
  ``FrozenDict``, a Transformers ``ModelOutput``), or a list or tuple NumPy cannot read as one real
  array (``(loss, grads)``). NumPy reads a mapping as its keys, so ``FrozenDict({"0": w})`` would
  otherwise be the number 0."""
  if isinstance(x, Mapping):
    return True
  if not isinstance(x, (list, tuple)):
    return False
  try:
    return np.asarray(x).dtype.kind not in "biuf"
  except (ValueError, TypeError):  # ragged: arrays of different shapes
    return True


def _plain(x: Any) -> Any:
  """``x`` with every mapping JAX takes for a leaf (a ``dict`` subclass it does not know,
  ``MappingProxyType``, ``UserDict``) as a ``dict``, so that it flattens into its values."""
  if isinstance(x, Mapping) and jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(x)):
    return {k: _plain(v) for k, v in x.items()}
  if not _is_tree(x):
    return x
  return jax.tree_util.tree_map(lambda leaf: _plain(leaf) if isinstance(leaf, Mapping) else leaf, x)


def _tree_pairs(actual: Any, expected: Any, context: str) -> Iterator[tuple[str, Any, Any]] | None:
  """``(context + key path, actual leaf, expected leaf)`` for two pytrees of one structure; None when
  neither is a pytree. Structures that differ are an AssertionError naming both."""
  if not (_is_tree(actual) or _is_tree(expected)):
    return None
  actual, expected = _plain(actual), _plain(expected)
  # None is a leaf here (JAX's trees drop it): {"a": x, "b": None} is not {"a": x}
  is_none = lambda v: v is None
  flat_a, tree_a = jax.tree_util.tree_flatten_with_path(actual, is_leaf=is_none)
  flat_e, tree_e = jax.tree_util.tree_flatten_with_path(expected, is_leaf=is_none)
  # compared by key paths, not container types: a FrozenDict matches the dict with its keys
  paths_a = [jax.tree_util.keystr(p) for p, _ in flat_a]
  paths_e = [jax.tree_util.keystr(p) for p, _ in flat_e]
  if paths_a != paths_e:
    prefix = f"{context}: " if context else ""
    only_a = sorted(set(paths_a) - set(paths_e))[:5]
    only_e = sorted(set(paths_e) - set(paths_a))[:5]
    raise AssertionError(
      f"{prefix}pytree structures differ: actual {tree_a}, expected {tree_e} "
      f"(leaves only in actual: {only_a or 'none'}; only in expected: {only_e or 'none'})"
    )
  for path, (_, a), (_, e) in zip(paths_a, flat_a, flat_e):
    if (a is None) != (e is None):
      prefix = f"{context}{path}: " if context or path else ""
      raise AssertionError(
        f"{prefix}actual is {'None' if a is None else 'an array'}, expected {'None' if e is None else 'an array'}"
      )
  return (
    (f"{context}{path}", a, e) for path, (_, a), (_, e) in zip(paths_a, flat_a, flat_e) if a is not None
  )


def _no_tree(what: str, x: Any, fn: str) -> None:
  if _is_tree(x):
    raise TypeError(
      f"{fn}: {what} is a {type(x).__name__} (a pytree), not one array; compare leaf by leaf: "
      f"jax.tree.map(lambda a, e: {fn}(a, e, ...), actual, expected), or use assert_close / "
      "assert_same_floats, which take pytrees"
    )


def same_floats(actual: Any, expected: Any) -> np.ndarray:
  """Elementwise: equal bit patterns, or both NaN (so -0.0 differs from 0.0).

  Compared as float32, or as float64 when either side is float64 (nothing is narrowed).
  """
  _no_tree("actual", actual, "same_floats")
  _no_tree("expected", expected, "same_floats")
  actual, expected, bits = _as_common_float(actual, expected)
  return (actual.view(bits) == expected.view(bits)) | (np.isnan(actual) & np.isnan(expected))


def _as_common_float(actual: Any, expected: Any) -> tuple[np.ndarray, np.ndarray, Any]:
  """Both as float32, or both as float64 when either is float64 (never narrowed: a float64
  that is not a float32 value differs from every float32), and the matching uint dtype.

  Integers and booleans on both sides are compared exactly (as int64: float32 holds integers
  only up to 2^24, so 16777217 and 16777216, or two uint32 bit patterns, would compare equal);
  an integer against a float is compared in float64. Complex values are compared as their real
  and imaginary parts (a new last axis of 2); PRNG keys as their key data."""
  actual, expected = _plain_array(actual), _plain_array(expected)
  kinds = {actual.dtype.kind, expected.dtype.kind}
  if kinds <= set("biu"):
    return actual.astype(np.int64), expected.astype(np.int64), np.int64
  if "c" in kinds:
    wide = np.float64 in (actual.real.dtype, expected.real.dtype) or not kinds <= set("cf")
    dtype, bits = (np.float64, np.uint64) if wide else (np.float32, np.uint32)
    parts = lambda z: np.stack([np.real(z), np.imag(z)], axis=-1).astype(dtype)  # noqa: E731
    return parts(actual), parts(expected), bits
  wide = np.float64 in (actual.dtype, expected.dtype) or not kinds <= set("f")
  dtype, bits = (np.float64, np.uint64) if wide else (np.float32, np.uint32)
  return actual.astype(dtype), expected.astype(dtype), bits


def _plain_array(x: Any) -> np.ndarray:
  if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    x = jax.random.key_data(x)
  return np.asarray(x)


def assert_same_floats(actual: Any, expected: Any, context: str = "") -> None:
  """Raise AssertionError naming the first differing elements unless `same_floats` holds everywhere.

  Pytrees (a dict or ``FrozenDict`` of gradients, ``(loss, grads)``) are compared leaf by leaf, the
  message naming the leaf's key path; their structures must be equal.
  """
  pairs = _tree_pairs(actual, expected, context)
  if pairs is not None:
    for where, a, e in pairs:
      assert_same_floats(a, e, where)
    return
  actual, expected, bits = _as_common_float(actual, expected)
  if actual.shape != expected.shape:
    raise AssertionError(
      f"{context + ': ' if context else ''}shapes differ: {actual.shape} vs {expected.shape}"
    )
  same = same_floats(actual, expected)
  if not same.all():
    bits_a, bits_e = actual.view(bits), expected.view(bits)
    width = 2 * actual.dtype.itemsize
    detail = ", ".join(
      f"#{i}: got {actual.flat[i]!r} (0x{bits_a.flat[i]:0{width}x}), want {expected.flat[i]!r} "
      f"(0x{bits_e.flat[i]:0{width}x})"
      for i in np.flatnonzero(~same)[:5]
    )
    raise AssertionError(
      f"{context + ': ' if context else ''}{(~same).sum()} of {same.size} differ; {detail}"
    )


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


# ---- accuracy within a number of ulps ----


def _float64(x: Any, what: str) -> np.ndarray:
  x = np.asarray(x)
  if np.iscomplexobj(x):
    raise TypeError(f"{what}: complex values ({x.dtype}); compare the real and imaginary parts separately")
  if x.dtype == object or x.dtype.kind in "SUM":
    raise TypeError(f"{what}: {x.dtype} values; give real numbers (float, int or bool arrays)")
  with np.errstate(invalid="ignore"):  # a signaling NaN (e.g. a decoded bit pattern) raises the flag
    return x.astype(np.float64)


def _ulp_at(expected: np.ndarray, fmt: FloatFormat) -> np.ndarray:
  """``fmt.ulp`` at float64 ``expected`` values, as float64 (NaN at inf and NaN).

  ``fmt.ulp`` reads float32 values, so ``expected`` is first narrowed *toward zero*: a float32
  ``t`` with ``|t| <= |x|`` keeps ``floor(log2|x|)`` (``2^floor(log2|x|)`` is a float32 between
  ``t`` and ``x``), which is all the spacing depends on. Nearest rounding would move
  ``2^k - tiny`` up to the next binade and double its ulp. Magnitudes beyond float32 become
  float32's max, and those below ``2^-149`` zero; both are clipped to the format's exponent
  range by ``fmt.ulp`` as the exact values would be.
  """
  with np.errstate(over="ignore"):
    narrowed = expected.astype(np.float32)
  away = np.abs(narrowed.astype(np.float64)) > np.abs(expected)
  narrowed = np.where(away, np.nextafter(narrowed, np.float32(0)), narrowed)
  return np.asarray(fmt.ulp(narrowed.ravel()), np.float64).reshape(expected.shape)


def ulp_distance(
  actual: Any, expected: Any, fmt: FloatFormat | str, *, check_zero_sign: bool = True
) -> np.ndarray:
  """Elementwise ``|actual - expected| / ulp(expected)`` in float64, with fixed rules for specials.

  ``ulp(expected)`` is ``fmt``'s spacing at the expected value, ``fmt.ulp``:
  ``2^(clip(floor(log2|e|), emin, emax) - m)``. Below the smallest normal it is the subnormal
  spacing ``2^(emin - m)`` (also at zero, and also for formats without subnormals); beyond
  ``fmt.max`` it is the spacing of the top binade. The difference and the division are done in
  float64: exact for float32 inputs of similar magnitude, and float64 references keep their
  precision (nothing is rounded to float32 or to ``fmt``).

  Special values give a distance of 0 (a match) or ``inf`` (a mismatch no tolerance accepts):

  * NaN matches NaN (any payload, any sign) and nothing else;
  * ``+inf`` and ``-inf`` match only themselves: a finite value where an infinity is expected,
    or an infinity where a finite value (even one beyond ``fmt.max``) is expected, is a mismatch;
  * ``-0.0`` against ``+0.0`` is a mismatch unless ``check_zero_sign=False``; a zero against a
    non-zero value is an ordinary finite distance.

  Args:
    actual, expected: real array-likes of the same shape (NumPy, JAX, lists; any float dtype).
    fmt: a `precision.FloatFormat` or a format name (``"cbfloat16"``, ``"bf16"``, ...).
    check_zero_sign: whether zeros of different sign differ.

  Returns:
    A float64 NumPy array of ``expected``'s shape.

  Raises:
    ValueError: the shapes differ (nothing is broadcast).
    TypeError: complex or non-numeric values.

  >>> ulp_distance([1.0 + 2**-9, 1.0, 3.0], [1.0, 1.0 + 2**-10, 2.0], "cbfloat16")  # ulp(1) = 2^-9
  array([  1. ,   0.5, 256. ])
  >>> ulp_distance([float("nan"), -0.0, float("inf")], [float("nan"), 0.0, 1e30], "bfloat16")
  array([ 0., inf, inf])
  """
  fmt = get_format(fmt)
  _no_tree("actual", actual, "ulp_distance")
  _no_tree("expected", expected, "ulp_distance")
  a = _float64(actual, "actual")
  e = _float64(expected, "expected")
  if a.shape != e.shape:
    raise ValueError(f"shapes differ: actual {a.shape}, expected {e.shape}; nothing is broadcast")
  with np.errstate(invalid="ignore", over="ignore"):
    dist = np.abs(a - e) / _ulp_at(e, fmt)
  a_nan, e_nan = np.isnan(a), np.isnan(e)
  dist = np.where(a_nan | e_nan, np.where(a_nan & e_nan, 0.0, np.inf), dist)
  dist = np.where(np.isinf(e), np.where(a == e, 0.0, np.inf), dist)
  if check_zero_sign:
    both_zero = (a == 0) & (e == 0)
    dist = np.where(both_zero & (np.signbit(a) != np.signbit(e)), np.inf, dist)
  return dist


def _mismatch(i: tuple[int, ...], a: float, e: float, d: float, ulp: float, fmt: FloatFormat) -> str:
  where = f"at index {i}: actual {a!r}, expected {e!r}"
  if np.isnan(a) or np.isnan(e):
    return f"{where} (NaN matches only NaN)"
  if np.isinf(e):
    return f"{where} (an infinity matches only the same infinity)"
  if np.isinf(a):
    return f"{where} (an infinity where a finite value was expected)"
  if d == np.inf and a == 0 and e == 0:
    return f"{where} (zeros of different sign; pass check_zero_sign=False to accept)"
  return f"{d:.6g} ulp {where}, ulp of {fmt.name} at expected {ulp!r}"


def assert_close(
  actual: Any,
  expected: Any,
  fmt: FloatFormat | str,
  *,
  ulps: float,
  check_zero_sign: bool = True,
  context: str = "",
) -> None:
  """Fail unless ``actual`` is within ``ulps`` units of ``fmt``'s ulp at ``expected``, everywhere.

  The distance of each element is `ulp_distance` (read it for the rules: the ulp at the expected
  value within ``fmt``'s exponent range; NaN matches only NaN; infinities match only themselves;
  ``-0.0`` against ``+0.0`` fails unless ``check_zero_sign=False``). Each element must satisfy
  ``distance <= ulps``: ``ulps=0`` asks for equal values, ``ulps=0.5`` is the bound of one
  correct rounding of ``expected`` to ``fmt``, ``ulps=float("inf")`` checks only the special
  values (a distance of ``inf`` always fails). Pytrees (a dict or ``FrozenDict`` of gradients,
  ``(loss, grads)``, a model's output dataclass) are compared leaf by leaf; a failure names the worst
  failing leaf's key path (``['h']['0']['kernel']: ...``) and then the other failing leaves, and
  structures must be equal (compared by key paths: a ``FrozenDict`` matches a dict, a list a tuple).

  Raises:
    AssertionError: naming how many elements fail, then the worst distance, its index, the two
      values and the ulp there, and up to four further failures, worst first. Shapes must be
      equal (nothing is broadcast).
    ValueError: ``ulps`` is negative or NaN.

  >>> import numpy as np, precision
  >>> x = np.float32([1.0, 2.0, 3.0])
  >>> y = x * np.float32(1.001)
  >>> assert_close(precision.round(y, "cbfloat16"), y, "cbfloat16", ulps=0.5)  # one rounding
  >>> assert_close(x + np.float32(2**-8), x, "cbfloat16", ulps=1)
  Traceback (most recent call last):
  AssertionError: 1 of 3 elements differ by more than 1 ulp of cbfloat16; worst: 2 ulp at index (0,): actual 1.00390625, expected 1.0, ulp of cbfloat16 at expected 0.001953125
  """
  __tracebackhide__ = True  # pytest shows the caller's line, not this function's body
  fmt = get_format(fmt)
  if getattr(ulps, "shape", None) == () and not isinstance(ulps, (bool, np.bool_)):  # a 0-d array: a number
    dtype = getattr(ulps, "dtype", None)
    if dtype is not None and (np.issubdtype(dtype, np.integer) or np.issubdtype(dtype, np.floating)):
      ulps = float(ulps)
  if isinstance(ulps, (bool, np.bool_)) or not isinstance(ulps, (int, float, np.integer, np.floating)):
    raise TypeError(f"assert_close: ulps={ulps!r}; allowed: a number >= 0 (e.g. ulps=0.5, one rounding)")
  if not ulps >= 0:
    raise ValueError(f"assert_close: ulps={ulps!r}; allowed: a number >= 0 (e.g. ulps=0.5, one rounding)")
  pairs = _tree_pairs(actual, expected, context)
  if pairs is not None:  # leaf by leaf, each message naming its key path; the worst leaf first
    failed: list[tuple[float, str, str]] = []
    for where, a, e in pairs:
      try:
        assert_close(a, e, fmt, ulps=ulps, check_zero_sign=check_zero_sign, context=where)
      except AssertionError as err:
        failed.append((getattr(err, "worst_ulps", math.inf), where, str(err)))
    if failed:
      failed.sort(key=lambda f: -f[0])  # (stable: leaves of equal distance stay in key order)
      message = failed[0][2]
      if len(failed) > 1:
        others = ", ".join(where for _, where, _ in failed[1:6]) + (", ..." if len(failed) > 6 else "")
        message += f"\n  {len(failed) - 1} other leaf(s) fail too, worst first: {others}"
      error = AssertionError(message)
      error.worst_ulps = failed[0][0]  # type: ignore[attr-defined]
      raise error
    return
  prefix = f"{context}: " if context else ""
  try:
    dist = ulp_distance(actual, expected, fmt, check_zero_sign=check_zero_sign)
  except ValueError as err:  # shapes: a failed comparison, not a usage error
    raise AssertionError(f"{prefix}{err}") from None
  bad = np.flatnonzero(~(dist <= ulps) | (dist == np.inf))  # inf fails even with ulps=inf
  if bad.size == 0:
    return
  a = _float64(actual, "actual")
  e = _float64(expected, "expected")
  ulp = _ulp_at(e, fmt)
  order = bad[np.argsort(-dist.flat[bad], kind="stable")]  # worst first; ties in index order
  lines = [
    _mismatch(
      tuple(int(j) for j in np.unravel_index(k, dist.shape)),
      float(a.flat[k]),
      float(e.flat[k]),
      float(dist.flat[k]),
      float(ulp.flat[k]),
      fmt,
    )
    for k in order[:5]
  ]
  head = f"{prefix}{bad.size} of {dist.size} elements differ by more than {ulps:g} ulp of {fmt.name}; worst: {lines[0]}"
  error = AssertionError("\n  ".join([head, *lines[1:]]))
  error.worst_ulps = float(dist.flat[order[0]])  # type: ignore[attr-defined]  (a pytree's worst leaf first)
  raise error
