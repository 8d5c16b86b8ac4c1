"""Test inputs and comparison helpers shared by the rounding tests."""

from __future__ import annotations

from typing import Any, NamedTuple

import hypothesis
import jax
import numpy as np

import precision
from precision import _kernel
from precision.testing import assert_same_floats as assert_same_floats  # re-exported for tests
from precision.testing import same_floats


def examples(n: int) -> int:
  """A test's own ``max_examples``, scaled with the loaded hypothesis profile: ``n`` under ``ci``
  and ``dev`` (200 examples), 8n under ``thorough`` (1600)."""
  return max(1, n * hypothesis.settings.default.max_examples // 200)


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


# ---- equality up to XLA's fusion (docs/invariants.md) ----

# Float ops that XLA evaluates as one correctly rounded IEEE operation (or an exact one), fused or
# not: the same inputs give the same bits under jit, vmap and scan, on every CPU and GPU. The
# pass's rounding after each keeps LLVM from contracting two of them into an FMA.
CORRECTLY_ROUNDED = frozenset(
  ("add", "sub", "mul", "div", "neg", "abs", "max", "min", "integer_pow", "select_n", "sign", "clamp")
)


class Exposure(NamedTuple):
  """What XLA's compilation may change in one autocast program (`fusion_exposure`)."""

  outputs: tuple[str | None, ...]  # each flat output's state: "rounded", "float32", "raw", ...
  float32: bool  # some value is computed in float32 beyond one IEEE op (kept-float32, a sum)
  flips: bool  # some rounding takes such a value: it may flip by one compute-format ulp


def fusion_exposure(fn: Any, policy: precision.Policy | str, *args: Any) -> Exposure:
  """The states the pass gives ``fn``'s outputs, and whether the program has fusion-sensitive
  float32 values, and roundings of them, in evaluation order (conservative: a rounding after
  any such value counts). Read from the pass's observer, as
  ``test_rounded_values_are_representable_and_float32_values_are_float32`` does."""
  from precision import _interpreter, _jax_compat, _state, _tracing
  from precision._op_classes import PRIMITIVE_CLASSES

  policy = precision.Policy.parse(policy) if isinstance(policy, str) else policy
  tags: dict[Any, Any] = {}
  seen = {"float32": False, "flips": False}

  def observe(eqn, inputs, in_tags, outs, out_tags):
    name = eqn.primitive.name
    op_class = PRIMITIVE_CLASSES.get(name)
    states = {t.state for t in out_tags if t is not None}
    inexact = op_class in ("matmul", "reduction", "transcendental") or (
      op_class == "elementwise" and name not in CORRECTLY_ROUNDED
    )
    if "rounded" in states and (seen["float32"] or inexact):
      seen["flips"] = True
    if "float32" in states or (inexact and states):
      seen["float32"] = True
    tags.update(zip(eqn.outvars, out_tags))

  closed, _, flat = _tracing.trace_fn(fn, _tracing.Statics.of(fn, (), ()), args, {})
  # abstractly: the tags are all it needs, and evaluating op by op would cost seconds
  jax.eval_shape(lambda *v: _interpreter.run(_state.Pass(policy, observer=observe), closed, v), *flat)
  jaxpr, _ = _jax_compat.split_closed(closed)
  invars = set(jaxpr.invars)
  outputs = tuple(
    "raw" if v in invars else (tags[v].state if tags.get(v) is not None else None) for v in jaxpr.outvars
  )
  if policy.output == policy.compute != precision.float32:  # every float32 output is rounded
    outputs = tuple("rounded" if s is not None else s for s in outputs)
  return Exposure(outputs, seen["float32"], seen["flips"])


def assert_equal_up_to_fusion(
  actual: Any,
  expected: Any,
  fmt: Any,
  exposure: Exposure,
  tolerance: Any,
  context: str = "",
  *,
  continuous: bool = True,
) -> None:
  """Two evaluations of one autocast program that differ only in XLA's compilation (jit/eager,
  vmap, scan/unrolled), as `docs/invariants.md` states:

  * a rounded output is a value of ``fmt`` on both sides (bit-exact, always);
  * with no fusion-sensitive float32 value in the program (``exposure.float32`` false), bit for bit;
  * else, without a rounding of such a value (``exposure.flips`` false): rounded and raw outputs
    bit for bit, kept-float32 outputs within ``tolerance.float32_ulps`` float32 ulps of the
    output's scale (its largest magnitude);
  * else every output within ``tolerance.flip_ulps`` ulps of ``fmt`` at its scale (plus the
    float32 bound), if the program is ``continuous``; a discontinuous one (a comparison, argmax,
    sort, a cond on a value) may jump after a flipped rounding: only the first point is checked.

  Integer outputs are compared exactly unless the program has fusion-sensitive float32 values
  (an ``argmax`` follows them); 16-bit float outputs (code the pass leaves alone, which XLA
  computes in float32 and rounds) within ``tolerance.flip_ulps`` ulps of their format.
  ``actual`` and ``expected`` are pytrees of ``exposure.outputs``' flat outputs, in order.
  """
  __tracebackhide__ = True
  fmt = precision.get_format(fmt)
  f32 = precision.get_format("float32")
  flat_a, flat_e = jax.tree.leaves(actual), jax.tree.leaves(expected)
  assert len(flat_a) == len(flat_e) == len(exposure.outputs), (len(flat_a), len(flat_e), exposure)
  for i, (a, e, state) in enumerate(zip(flat_a, flat_e, exposure.outputs)):
    where = f"{context} output {i} ({state})"
    a, e = np.asarray(a), np.asarray(e)
    assert a.dtype == e.dtype, f"{where}: dtypes differ: {a.dtype} vs {e.dtype}"
    if a.dtype.kind in "biu":  # an argmax of a float32 value that differs may differ
      if not exposure.float32:
        assert_same_floats(a, e, where)
      continue
    if a.dtype != np.float32:  # 16-bit code the pass leaves alone: XLA computes it in float32
      low = precision.get_format(a.dtype.name)  # and rounds it: one flip, carried on
      scale = np.float32(np.max(np.abs(e[np.isfinite(e)]), initial=0.0))
      with np.errstate(invalid="ignore"):
        diff = np.abs(a.astype(np.float64) - e.astype(np.float64))
      ok = (diff <= tolerance.flip_ulps * float(low.ulp(scale))) | same_floats(a, e)
      assert ok.all(), f"{where}: {(~ok).sum()} of {ok.size} differ by more than {tolerance.flip_ulps} ulps"
      continue
    if state == "rounded":
      for side, v in (("actual", a), ("expected", e)):
        assert_same_floats(precision.round(v, fmt), v, f"{where}: {side} is not a {fmt.name} value")
    if not exposure.float32 or (not exposure.flips and state != "float32"):
      assert_same_floats(a, e, where)
      continue
    if exposure.flips and not continuous:
      continue
    finite = np.abs(e[np.isfinite(e)])
    scale = np.float32(finite.max() if finite.size else 0.0)
    bound = tolerance.float32_ulps * float(f32.ulp(scale))
    if exposure.flips:
      bound += tolerance.flip_ulps * float(fmt.ulp(scale))
    with np.errstate(invalid="ignore"):
      diff = np.abs(a.astype(np.float64) - e.astype(np.float64))
    nan_a, nan_e = np.isnan(a), np.isnan(e)
    ok = np.where(nan_a | nan_e, nan_a & nan_e, (diff <= bound) | (a == e))
    if not ok.all():
      k = np.flatnonzero(~ok)
      raise AssertionError(
        f"{where}: {k.size} of {ok.size} differ by more than {bound!r} (scale {scale!r}, "
        f"flips={exposure.flips}); first: #{k[0]}: {a.flat[k[0]]!r} vs {e.flat[k[0]]!r}"
      )
