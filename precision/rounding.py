"""Public rounding API: `round`, `encode`, `decode`.

All three are pure jnp bit operations (see `precision._kernel`): they run eagerly, under
``jax.jit``, ``jax.vmap`` and ``jax.grad``, on CPU and GPU, and `encode` / `decode` also
take and return NumPy arrays.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from precision import _kernel
from precision._jax_compat import Primitive, ShapedArray, ad, batching, mlir
from precision._kernel import MODES
from precision.formats import FloatFormat, get_format

RoundingMode = Literal["nearest_even", "toward_zero", "stochastic"]
GradMode = Literal["cast", "straight_through"]
_GRAD_MODES = ("cast", "straight_through")


def round(
  x: Any,
  fmt: FloatFormat | str,
  mode: RoundingMode = "nearest_even",
  key: jax.Array | None = None,
  *,
  rbits: jax.Array | None = None,
  grad: GradMode = "cast",
) -> jax.Array:
  """Round ``x`` to the nearest values of ``fmt``; returns float32 of ``x``'s shape.

  Every non-NaN output is exactly representable in ``fmt``: ``encode(round(x, f), f)`` loses
  nothing. Differentiable like a dtype cast (see ``grad``); forward mode is supported for
  the deterministic modes with ``grad="cast"``.

  Args:
    x: a float32 (or narrower) JAX array; or a Python number, list or NumPy array, float64
      included, which is narrowed to float32 without double rounding; any shape.
    fmt: a `FloatFormat` or a name such as ``"cbfloat16"``, ``"cb16"``, ``"bf16"``.
    mode:
      ``"nearest_even"``: IEEE 754 roundTiesToEven (what ml_dtypes and XLA casts do).
      ``"toward_zero"``: truncation; a finite input never overflows to inf.
      ``"stochastic"``: rounds up with probability equal to the discarded fraction of a
      step, so ``E[round(x)] = x`` exactly whenever the discarded part has at most 32 bits
      (every input above ``2^-8 * min_subnormal``; below that the bias is under
      ``2^-33 * min_subnormal``) and the result stays finite (overflow, saturation and the
      flush of formats without subnormals are not unbiased). Needs ``key`` or ``rbits``.
    key: a JAX PRNG key (``jax.random.key`` or ``PRNGKey``) for stochastic rounding. Two
      words drawn from it key a fused counter-based generator (`_kernel.counter_bits`), so
      equal keys give equal results. Under ``vmap`` with an unbatched key every batch
      element gets the same random words, as with ``jax.random``.
    rbits: instead of ``key``, uint32 random words of ``x``'s shape (e.g. from
      ``jax.random.bits`` to use JAX's own generator): rounds up iff ``frac32 + rbits >= 2^32``.
    grad: gradient rule. ``"cast"`` (default) is the rule of a dtype cast: the cotangent is
      rounded to ``fmt`` with the same mode (stochastic: an independent stream derived from
      the forward one); deterministic modes are then the linear primitive
      ``precision_round``, which also supports forward mode (``jax.jvp``: the tangent is
      rounded). ``"straight_through"`` passes the cotangent unchanged.

  Overflow follows ``fmt.overflow``; a NaN gives the same NaN, quieted (on GPUs the
  nearest_even fast path may give the canonical NaN); signed zeros keep their sign.

  Raises:
    FormatError: unknown format name.
    ValueError: unknown mode or grad rule, or a key/rbits given where it is not used.
    TypeError: ``x`` is not a float32-representable float (float64, integer arrays).
  """
  fmt = get_format(fmt)
  mode = _check_choice("mode", mode, MODES)
  grad = _check_choice("grad", grad, _GRAD_MODES)
  x = _as_float32(x, fmt, "round", mode)
  noise = _noise(x, mode, key, rbits)
  if mode != "stochastic" and grad == "cast":
    return round_p.bind(x, fmt=fmt, mode=mode)
  return _round_with_vjp(x, noise, fmt, mode, grad)


def encode(x: Any, fmt: FloatFormat | str) -> Any:
  """Round ``x`` to nearest even in ``fmt`` and return the format's bit patterns.

  Returns uint8 codes for formats of up to 8 bits, uint16 up to 16 and uint32 above, laid
  out as ``sign | exponent | fraction``. NaN encodes as the format's quiet NaN with the
  input's sign (``S.1..1.10..0``; ``S.1..1.1..1`` without infinities), as ml_dtypes does.
  A NumPy input gives a NumPy result; a JAX input (or tracer) gives a JAX array.
  To store a stochastically rounded value, round first: ``encode(round(x, f, "stochastic",
  key=k), f)`` is exact.
  """
  fmt = get_format(fmt)
  return _mirror_input_kind(x, _encode_jit(_as_float32(x, fmt, "encode"), fmt))


def decode(bits: Any, fmt: FloatFormat | str) -> Any:
  """float32 values of bit patterns ``bits`` of ``fmt`` (the inverse of `encode`).

  Bits above the format's width are ignored. NaN payloads survive in IEEE-like formats (for
  bfloat16 and float16 this is bit-exact with ml_dtypes/NumPy up-casts; ml_dtypes quiets
  float8 NaNs); a format without infinities decodes its NaN code to the quiet NaN. Without
  subnormals, codes with exponent 0 decode to signed zero.
  """
  fmt = get_format(fmt)
  array = bits if isinstance(bits, jax.Array) else np.asarray(bits)
  if not jnp.issubdtype(array.dtype, jnp.integer):
    raise TypeError(
      f"decode takes integer bit patterns (uint8/uint16/uint32); got dtype {array.dtype}. "
      "To round floats, use precision.round or precision.encode."
    )
  return _mirror_input_kind(bits, _decode_jit(jnp.asarray(array).astype(jnp.uint32), fmt))


# ---- implementation ----


def _check_choice(what: str, value: str, allowed: tuple[str, ...]) -> str:
  if value not in allowed:
    raise ValueError(f"{what}={value!r} is not one of {', '.join(repr(a) for a in allowed)}")
  return value


def _as_float32(x: Any, fmt: FloatFormat, fn: str, mode: str = "nearest_even") -> jax.Array:
  """``x`` as float32 without double rounding.

  JAX arrays must already be float32 or narrower. Python numbers, lists and NumPy float64
  arrays are narrowed on the host with round-to-odd (truncate, then set the last bit if
  anything was lost), after which rounding to a format of p <= 22 significant bits is the
  correct rounding of the float64 value (p + 2 <= 24; Boldo and Melquiond, 2008). A format
  with 22 fraction bits (p = 23) is rounded on the host instead (`_host_round`; stochastic
  rounding keeps round-to-odd, whose last bit stands for everything below float32).
  """
  if isinstance(x, jax.Array):  # tracers included
    if not jnp.issubdtype(x.dtype, jnp.floating):
      raise TypeError(
        f"{fn} takes floating-point values; got dtype {x.dtype}. Convert with .astype(float32)."
      )
    if jnp.finfo(x.dtype).bits > 32:
      raise TypeError(
        f"{fn} takes float32 (or narrower) JAX arrays; got {x.dtype}. Pass a NumPy array (narrowed "
        "without double rounding) or convert explicitly."
      )
    return x.astype(jnp.float32)
  array = np.asarray(x)
  floating = jnp.issubdtype(array.dtype, jnp.floating)
  # Python numbers (``3``, ``[1, 2]``) are values; a NumPy integer array is refused, as a JAX one is
  python = not isinstance(x, (np.ndarray, np.generic))
  integer_value = jnp.issubdtype(array.dtype, jnp.integer) and (array.ndim == 0 or python)
  if array.dtype == np.bool_ or not (floating or integer_value):
    raise TypeError(
      f"{fn} takes floating-point values; got dtype {array.dtype}. Convert with .astype(float32)."
    )
  if floating and jnp.finfo(array.dtype).bits <= 32:
    return jnp.asarray(array.astype(np.float32))  # exact
  wide = array.astype(np.float64)
  if fmt.mantissa_bits == 23:  # float32 itself: one rounding
    with np.errstate(over="ignore"):
      return jnp.asarray(wide.astype(np.float32))
  if fmt.mantissa_bits == 22 and mode != "stochastic":  # round-to-odd needs p + 2 <= 24
    return jnp.asarray(_host_round(wide, fmt, mode))
  return jnp.asarray(_narrow_to_odd(wide))


def _host_round(wide: np.ndarray, fmt: FloatFormat, mode: str) -> np.ndarray:
  """float64 values rounded once to ``fmt``'s precision on the host (exact float64 arithmetic:
  scaling by powers of two, then NumPy's half-to-even ``rint`` or ``trunc``), as float32.

  The result has at most ``m + 1`` significant bits, so it is a float32 value (or overflows
  to inf), and the kernel's rounding afterwards only applies range rules: overflow,
  saturation, the flush of formats without subnormals.
  """
  with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
    magnitude = np.abs(wide)
    exponent = np.floor(np.log2(np.where(magnitude > 0, magnitude, 1.0)))
    if fmt.subnormals:
      exponent = np.maximum(exponent, fmt.emin)
    quantum = np.exp2(exponent - fmt.mantissa_bits)
    step = np.rint if mode == "nearest_even" else np.trunc
    rounded = np.where(np.isfinite(wide), step(wide / quantum) * quantum, wide)
    return rounded.astype(np.float32)


def _narrow_to_odd(wide: np.ndarray) -> np.ndarray:
  """float64 -> float32 rounding to odd: toward zero, then the last bit set if inexact."""
  with np.errstate(over="ignore", invalid="ignore"):
    nearest = wide.astype(np.float32)
    back = nearest.astype(np.float64)
  bits = np.array(nearest, np.float32).view(np.uint32)
  inexact = (back != wide) & ~np.isnan(wide)
  bits = np.where(inexact & (np.abs(back) > np.abs(wide)), bits - np.uint32(1), bits)  # toward zero
  bits = np.where(inexact, bits | np.uint32(1), bits)
  return bits.astype(np.uint32).view(np.float32)


def _noise(x: jax.Array, mode: str, key: Any, rbits: Any) -> tuple[jax.Array | None, jax.Array | None]:
  """(seed uint32[2], None), (None, rbits) or (None, None)."""
  if mode != "stochastic":
    if key is not None or rbits is not None:
      raise ValueError(f"mode={mode!r} is deterministic: key and rbits are only for mode='stochastic'")
    return None, None
  if (key is None) == (rbits is None):
    raise ValueError(
      "mode='stochastic' needs exactly one of key=jax.random.key(seed) or rbits=<uint32 array "
      f"of shape {x.shape}>"
    )
  if rbits is not None:
    rbits = jnp.asarray(rbits)
    if rbits.dtype != jnp.uint32 or rbits.shape != x.shape:
      raise ValueError(f"rbits must be uint32 of shape {x.shape}; got {rbits.dtype}{list(rbits.shape)}")
    return None, rbits
  key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
  typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
  if (typed and key.shape != ()) or (not typed and (key.dtype != jnp.uint32 or key.shape != (2,))):
    raise ValueError(
      f"key must be one PRNG key (jax.random.key(0) or jax.random.PRNGKey(0)); got {key.dtype}{list(key.shape)}. "
      "Split batched keys first, or vmap over them."
    )
  return jax.random.bits(key, (2,), jnp.uint32), None


@functools.partial(jax.jit, static_argnames=("fmt", "mode"))
def _round_jit(x: jax.Array, noise: tuple, fmt: FloatFormat, mode: str) -> jax.Array:
  seed, rbits = noise
  if mode == "stochastic" and rbits is None:
    rbits = _kernel.counter_bits(x.shape, seed)
  return _kernel.round_bits(x, fmt, mode, rbits)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _round_with_vjp(x: jax.Array, noise: tuple, fmt: FloatFormat, mode: str, grad: str) -> jax.Array:
  return _round_jit(x, noise, fmt, mode)


def _round_fwd(x, noise, fmt, mode, grad):
  # Through the custom VJP, so that an outer derivative (grad of grad) sees this rounding as a
  # cast too, instead of differentiating the kernel's bit operations.
  return _round_with_vjp(x, noise, fmt, mode, grad), noise


def _round_bwd(fmt, mode, grad, noise, g):
  no_cotangent = (None, None)
  if grad == "straight_through":
    return g, no_cotangent
  seed, rbits = noise
  backward_noise = (
    None if seed is None else _kernel.derive_seed(seed),
    None if rbits is None else _kernel.derive_bits(rbits),
  )
  # Through the custom VJP again, so that higher derivatives keep cast semantics too.
  return _round_with_vjp(g, backward_noise, fmt, mode, grad), no_cotangent


_round_with_vjp.defvjp(_round_fwd, _round_bwd)


# Deterministic rounding with the cast rule is a primitive of its own, ``precision_round``:
# like ``convert_element_type`` it is declared linear, its JVP rounds the tangent and its
# transpose rounds the cotangent. So it works in forward mode, inside custom_jvp rules and
# under linearize, and a jaxpr shows one equation per rounding (the cost model and the cast
# report count them). It lowers to the kernel: inlined, or on CPU inside one HLO ``map``.
#
# ``ct_rounded=True`` (set only by `precision.autocast`, where its jaxpr rule proves it) says
# that every cotangent reaching this rounding is already a value of ``fmt``: the transpose
# then passes the cotangent on unchanged, which equals rounding it (nearest-even rounding is
# idempotent, NaN and signed zeros included). The JVP still rounds the tangent.
round_p = Primitive("precision_round")
round_p.def_impl(lambda x, *, fmt, mode, ct_rounded=False: _round_jit(x, (None, None), fmt, mode))
round_p.def_abstract_eval(lambda x, *, fmt, mode, ct_rounded=False: x)
# Through the jitted kernel: its lowering is one private function per format, mode and shape,
# which JAX caches and XLA inlines. On CPU, one ``map`` instead (`_round_map_lowering`).
_round_inline_lowering = mlir.lower_fun(
  lambda x, *, fmt, mode, ct_rounded=False: _round_jit(x, (None, None), fmt, mode), False
)
mlir.register_lowering(round_p, _round_inline_lowering)


def _round_map_lowering(
  ctx: mlir.LoweringRuleContext, x: Any, *, fmt: FloatFormat, mode: str, ct_rounded: bool = False
) -> list[Any]:
  """``precision_round`` on CPU: one HLO ``map`` whose body is the kernel on a scalar.

  Inlined (the generic lowering), a rounding is a handful of cheap elementwise instructions
  that XLA CPU's fusion copies into every fusion that reads the rounded value (a base-size
  train step runs 1168 roundings for 900 rounding sites). A ``map`` is one instruction that
  XLA's fusion treats as expensive: it still fuses into a sole consumer, but a value read
  by several is computed once and stored. The body is the same kernel, so the same
  operations run on every element: results are identical bit for bit (tests compare both
  lowerings, NaN payloads included). Values that are not float32 keep the inlined kernel.
  """
  if ctx.avals_in[0].dtype != jnp.float32:
    return _round_inline_lowering(ctx, x, fmt=fmt, mode=mode, ct_rounded=ct_rounded)
  ir = mlir.ir
  op = ir.Operation.create(
    "stablehlo.map",
    results=[x.type],
    operands=[x],
    attributes={"dimensions": mlir.dense_int_array(list(range(ctx.avals_in[0].ndim)))},
    regions=1,
  )
  scalar = ShapedArray((), jnp.float32)
  block = op.regions[0].blocks.append(ir.RankedTensorType.get([], ir.F32Type.get()))
  with ir.InsertionPoint(block):
    body = mlir.lower_fun(lambda v: _kernel.round_bits(v, fmt, mode, None), multiple_results=False)
    outs = body(ctx.replace(avals_in=[scalar], avals_out=[scalar]), block.arguments[0])
    ir.Operation.create("stablehlo.return", operands=list(outs))
  return list(op.results)


# The map is built with JAX's MLIR bindings; a JAX without the pieces it uses keeps the inlined
# kernel everywhere (the same bits, only XLA's fusion differs).
if all(hasattr(mlir, name) for name in ("dense_int_array", "LoweringRuleContext")) and hasattr(
  mlir.ir.Operation, "create"
):
  mlir.register_lowering(round_p, _round_map_lowering, platform="cpu")


def _round_transpose(ct: Any, x: Any, *, fmt: FloatFormat, mode: str, ct_rounded: bool = False) -> list[Any]:
  if ct_rounded or type(ct) is ad.Zero:
    return [ct]
  return [round_p.bind(ct, fmt=fmt, mode=mode)]


ad.deflinear2(round_p, _round_transpose)
batching.defvectorized(round_p)


# Stochastic rounding given its random words, as a primitive linear in ``x``:
# ``precision_round_bits(x, rbits)``. `precision.autocast` inserts it (bits from
# `_kernel.counter_bits`), because a rounding inside a ``custom_jvp`` rule (softmax,
# logaddexp) must be transposable and a ``custom_vjp`` is not. Its JVP and transpose round the
# tangent / cotangent stochastically with `_kernel.derive_bits` of the same words (the rule of
# `round`'s ``grad="cast"``). Elementwise in both operands, so ``vmap`` broadcasts them.
round_bits_p = Primitive("precision_round_bits")
round_bits_p.def_impl(lambda x, rbits, *, fmt: _kernel.round_bits(x, fmt, "stochastic", rbits))
round_bits_p.def_abstract_eval(lambda x, rbits, *, fmt: x)
mlir.register_lowering(
  round_bits_p,
  mlir.lower_fun(lambda x, rbits, *, fmt: _kernel.round_bits(x, fmt, "stochastic", rbits), False),
)


def _round_bits_jvp(primals: Any, tangents: Any, *, fmt: FloatFormat) -> tuple[Any, Any]:
  x, rbits = primals
  tx, _ = tangents
  out = round_bits_p.bind(x, rbits, fmt=fmt)
  if type(tx) is ad.Zero:
    return out, ad.Zero.from_primal_value(out)
  return out, round_bits_p.bind(tx, _kernel.derive_bits(rbits), fmt=fmt)


def _round_bits_transpose(ct: Any, x: Any, rbits: Any, *, fmt: FloatFormat) -> list[Any]:
  if type(ct) is ad.Zero:
    return [ad.Zero(x.aval) if ad.is_undefined_primal(x) else None, None]
  return [round_bits_p.bind(ct, _kernel.derive_bits(rbits), fmt=fmt), None]


def _round_bits_batch(args: Any, dims: Any, *, fmt: FloatFormat) -> tuple[Any, int]:
  x, rbits = args
  size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)

  def front(a: Any, d: int | None) -> Any:
    return jnp.broadcast_to(a, (size, *a.shape)) if d is None else jnp.moveaxis(a, d, 0)

  x, rbits = front(x, dims[0]), front(rbits, dims[1])
  return round_bits_p.bind(x, rbits, fmt=fmt), 0


ad.primitive_jvps[round_bits_p] = _round_bits_jvp
ad.primitive_transposes[round_bits_p] = _round_bits_transpose
batching.primitive_batchers[round_bits_p] = _round_bits_batch


def round_stochastic_linear(x: jax.Array, fmt: FloatFormat, key: jax.Array) -> jax.Array:
  """Stochastic rounding of float32 ``x`` keyed by ``key``, as `round_bits_p` (transposable).

  The same words as ``round(x, fmt, "stochastic", key=key)``: two words drawn from ``key`` seed
  `_kernel.counter_bits`; so the forward values are equal bit for bit."""
  seed = jax.random.bits(key, (2,), jnp.uint32)
  return round_bits_p.bind(x, _kernel.counter_bits(x.shape, seed), fmt=fmt)


def _storage_dtype(fmt: FloatFormat) -> jnp.dtype:
  return jnp.uint8 if fmt.bits <= 8 else jnp.uint16 if fmt.bits <= 16 else jnp.uint32


@functools.partial(jax.jit, static_argnames=("fmt",))
def _encode_jit(x: jax.Array, fmt: FloatFormat) -> jax.Array:
  c = _kernel.constants(fmt)
  m = fmt.mantissa_bits
  u32 = jnp.uint32
  u = jax.lax.bitcast_convert_type(_kernel.round_bits(x, fmt, "nearest_even", None), u32)
  a = u & u32(0x7FFF_FFFF)
  rebias = ((fmt.bias - 127) << m) & 0xFFFF_FFFF  # modular: (a >> s) - ((127 - bias) << m)
  magnitude = (a >> c.shift_normal) + u32(rebias)
  below_normal = a < u32(c.min_normal_bits)
  if fmt.subnormals:  # the exact quanta count sig >> d (d <= 23 for every rounded value)
    subnormal = _kernel.significand(a) >> _kernel._kept_shift(a, c)
  else:
    subnormal = u32(0)
  magnitude = jnp.where(below_normal, subnormal, magnitude)
  top = (2**fmt.exponent_bits - 1) << m
  if fmt.has_inf:
    magnitude = jnp.where(a == u32(0x7F80_0000), u32(top), magnitude)
    nan_code = top | (1 << (m - 1))
  else:
    nan_code = (1 << (fmt.bits - 1)) - 1
  magnitude = jnp.where(a > u32(0x7F80_0000), u32(nan_code), magnitude)
  sign = jax.lax.bitcast_convert_type(x, u32) >> 31  # rounding keeps the sign; NaN's too
  code = (sign << (fmt.bits - 1)) | magnitude
  return code.astype(_storage_dtype(fmt))


@functools.partial(jax.jit, static_argnames=("fmt",))
def _decode_jit(code: jax.Array, fmt: FloatFormat) -> jax.Array:
  u32 = jnp.uint32
  m, bits = fmt.mantissa_bits, fmt.bits
  shift = 23 - m
  code = code & u32((1 << bits) - 1)
  sign = (code >> (bits - 1)) << 31
  magnitude = code & u32((1 << (bits - 1)) - 1)
  exponent = magnitude >> m
  fraction = magnitude & u32((1 << m) - 1)
  rebias = ((127 - fmt.bias) << 23) & 0xFFFF_FFFF
  value = (magnitude << shift) + u32(rebias)  # normal codes
  if fmt.subnormals:
    # fraction * 2^q with q = emin - m: normalise with the leading-one position p.
    q = fmt.emin - m
    p = u32(31) - jax.lax.clz(fraction)
    lead = q + p.astype(jnp.int32)
    as_normal = ((lead + 127).astype(u32) << 23) | ((fraction << (u32(23) - p)) & u32(0x007F_FFFF))
    as_f32_subnormal = fraction << u32(q + 149)
    subnormal = jnp.where(lead >= -126, as_normal, as_f32_subnormal)
    subnormal = jnp.where(fraction == 0, u32(0), subnormal)
  else:
    subnormal = u32(0)
  value = jnp.where(exponent == 0, subnormal, value)
  top = 2**fmt.exponent_bits - 1
  if fmt.has_inf:
    value = jnp.where(exponent == top, u32(0x7F80_0000) | (fraction << shift), value)
  else:
    value = jnp.where(magnitude == u32((1 << (bits - 1)) - 1), u32(0x7FC0_0000), value)
  return jax.lax.bitcast_convert_type(value | sign, jnp.float32)


def _mirror_input_kind(original: Any, result: jax.Array) -> Any:
  """NumPy in, NumPy out; JAX arrays and tracers stay JAX."""
  if isinstance(original, jax.Array):
    return result
  return np.asarray(result)
