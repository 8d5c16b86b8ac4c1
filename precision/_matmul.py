"""Matrix products under a policy: operands rounded, products bound at the precision that
keeps them exact, and the chunked (``mixed_accumulate``) sums of levels 0 and 1."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from precision import _jax_compat as compat
from precision import formats as _formats
from precision import rounding as _rounding
from precision._attention import find_attention
from precision._op_classes import PRIMITIVE_CLASSES
from precision._state import (
  CONST_ROUNDED,
  FLOAT32,
  RAW_TAG,
  ROUNDED,
  Pass,
  Tag,
  is_f32,
  numel,
  region_of,
)

# ---- matrix products ----

# True inside `precision.whole_products`: products are bound whole, their accumulation not emulated.
# A JAX user context: part of the tracing caches' key, so a function jit traced outside is traced again.
WHOLE = jax.make_user_context(default_value=False)


def matmul(
  p: Pass, eqn: Any, values: list[Any], tags: list[Tag | None], memo: dict[Any, jax.Array]
) -> tuple[list, list]:
  name = eqn.primitive.name
  out_aval = eqn.outvars[0].aval
  score = id(eqn) in p.score_dots
  attention = score or any(t is not None and t.attention for t in tags[:2])
  rule_class = "attention_matmul" if attention else "matmul"
  treatment = p.rules[rule_class]
  operand_count = 2
  values, tags = _promote_narrow_operand(eqn, values, tags, operand_count)
  if any(t is None for t in tags[:operand_count]) or treatment == "float32":
    if treatment == "float32" and all(t is not None for t in tags[:operand_count]):
      outs = compat.bind(eqn, values, **dot_precision(eqn, TRUE_FLOAT32))
      p.log.record(name, rule_class, kept_float32=numel(out_aval))
      return outs, [Tag(FLOAT32, score)]
    outs = compat.bind(eqn, values)
    p.log.record(name, rule_class, untouched=numel(out_aval))
    return outs, [RAW_TAG if is_f32(out_aval) else None]
  rounded = 0
  operands = list(values)
  for i, (atom, tag) in enumerate(zip(eqn.invars[:operand_count], tags[:operand_count])):
    if tag.state in (ROUNDED, CONST_ROUNDED):
      continue
    if isinstance(atom, compat.Var) and atom in memo:
      operands[i] = memo[atom]
      continue
    operands[i] = p.round_class(values[i], rule_class)
    rounded += numel(values[i])
    if isinstance(atom, compat.Var):
      memo[atom] = operands[i]
  chunked = (
    _mixed_product(p, eqn, operands, rule_class)
    if treatment == "mixed_accumulate" and not WHOLE.value
    else None
  )
  if chunked is None:
    native = _native_dtype(p) if name in ("dot_general", "conv_general_dilated") else None

    # The closure keeps no operand: the custom JVP's rule outlives this trace (a jvp_jaxpr_fun
    # parameter), and a captured tracer would leak out of it.
    extra = tuple(operands[2:])

    def product(lhs: Any, rhs: Any, precision: tuple) -> jax.Array:
      f32 = {"preferred_element_type": np.dtype(np.float32)} if lhs.dtype != jnp.float32 else {}
      return compat.bind(eqn, [lhs, rhs, *extra], **dot_precision(eqn, precision), **f32)[0]

    tangents = _matrix_product(eqn)
    out = p.round_result(_rounded_product(product, operands[0], operands[1], native, tangents), rule_class)
    rounded += numel(out_aval)
  else:
    out, n = chunked
    rounded += (2 * n - 1) * numel(out_aval)
  p.log.record(name, rule_class, rounded=rounded)
  return [out], [Tag(ROUNDED, score)]


def hoist(
  p: Pass,
  jaxpr: compat.Jaxpr,
  n_consts: int,
  atoms: Sequence[Any],
  values: Sequence[Any],
  tags: Sequence[Tag | None],
  positions: Sequence[int] | None = None,
) -> dict[int, jax.Array]:
  """The arguments a body (``jaxpr``, binding ``n_consts`` constants, then arguments given by the
  caller's ``atoms``, ``values`` and ``tags``) rounds as matrix-product operands, rounded here, in
  the caller: position -> rounded value, for `interpret`'s ``rounded=``.

  A matrix product rounds a float32 operand once per jaxpr (``memo``: a weight used by two layers
  of one function is rounded once). A jit, checkpoint, scan or cond body is a jaxpr of its own, so
  without this a weight used by two jitted layers (or every iteration of a scan over layers) was
  rounded once per body: the forward the same, but under ``jax.grad(autocast(f))`` each rounding
  rounds its own cotangent, so the weight's gradient was a float32 sum of rounded parts where the
  same network written without the boundary had the rounded sum. Rounded here, the caller's
  rounding of the value is shared (the caller's `Pass.memo`), and the gradient is the same either
  way (bit for bit for two uses; the summation order of more may differ by a float32 ulp before
  the rounding).

  Only direct operands of a product of two float32 values (of this jaxpr, not of nested ones),
  not rounded already, each rounded under its product's class; ``positions`` limits the candidates
  (a scan's constants). A product the policy keeps float32 (a float32 policy or rule), one in a
  float32 region or a nested autocast, and every product under a policy whose ``matmul`` and
  ``attention_matmul`` differ in stochastic rounding are left to the body."""
  if not p.policy.is_mixed or ("matmul" in p.stochastic) != ("attention_matmul" in p.stochastic):
    return {}
  if id(jaxpr) not in p.analysed:
    find_attention(jaxpr, [None] * len(jaxpr.invars), p.score_dots, p.analysed, p.extreme_meets)
  args = compat.binders(jaxpr)[n_consts:]
  index = {var: i for i, var in enumerate(args)}
  allowed = set(range(len(args)) if positions is None else positions)
  wanted: dict[int, tuple[str, str]] = {}
  for eqn in jaxpr.eqns:
    if PRIMITIVE_CLASSES.get(eqn.primitive.name) != "matmul" or region_of(compat.name_stack(eqn)) is not None:
      continue  # (a float32 region or a nested autocast binds its products as written)
    rule_class = "attention_matmul" if id(eqn) in p.score_dots else "matmul"
    if p.rules[rule_class] == "float32":
      continue  # a product the policy keeps float32 (a rule override) rounds no operand
    operands = eqn.invars[:2]
    if not all(is_f32(a.aval) for a in operands):
      continue
    for atom in operands:
      if isinstance(atom, compat.Var) and index.get(atom) in allowed:
        wanted.setdefault(index[atom], (eqn.primitive.name, rule_class))
  out: dict[int, jax.Array] = {}
  for i, (name, rule_class) in sorted(wanted.items()):
    tag, atom = tags[i], atoms[i]
    if tag is None or tag.state in (ROUNDED, CONST_ROUNDED):
      continue
    if isinstance(atom, compat.Var) and atom in p.memo:
      out[i] = p.memo[atom]
      continue
    out[i] = p.round_class(values[i], rule_class)
    # the elements are the body's product's operand: counted under its primitive, not as an equation
    p.log.record(name, rule_class, rounded=numel(values[i]), equations=0)
    if isinstance(atom, compat.Var):
      p.memo[atom] = out[i]
  return out


def _promote_narrow_operand(
  eqn: Any, values: list[Any], tags: list[Tag | None], count: int
) -> tuple[list[Any], list[Tag | None]]:
  """A product of a float32 value and a narrower float (bfloat16 or float16 data fed to a float32
  model: JAX binds ``dot_general(bf16, f32, preferred_element_type=f32)``, no convert) with a float32
  result: the narrow operand as the float32 value it holds exactly, to be rounded like any other, so
  the float32 operand and the result follow the policy too (they escaped it, silently). Other
  products are returned as they are: two narrow operands are the program's own 16-bit product."""
  head = tags[:count]
  if not is_f32(eqn.outvars[0].aval) or all(t is None for t in head) or all(t is not None for t in head):
    return values, tags
  narrow = [
    t is None and jnp.issubdtype(jnp.result_type(v), jnp.floating) and jnp.result_type(v).itemsize < 4
    for v, t in zip(values[:count], head)
  ]
  if not all(n or t is not None for n, t in zip(narrow, head)):
    return values, tags
  values = [v.astype(jnp.float32) if i < count and narrow[i] else v for i, v in enumerate(values)]
  tags = [RAW_TAG if i < count and narrow[i] else t for i, t in enumerate(tags)]
  return values, tags


# The precision config of the products autocast binds (``precision=`` of dot_general and
# convolutions). On CPUs every config computes true float32 products: results do not depend
# on it. On NVIDIA GPUs (Ampere and later) HIGH runs TF32 tensor cores (operands rounded to
# 1-8-10, float32 accumulation) and HIGHEST true float32 without tensor cores. Every value of
# cbfloat16, bfloat16 and float16 (at most 10 fraction bits, exponents within float32's) is
# exact in TF32, so on rounded operands TF32 computes each product exactly: the emulation runs
# at the tensor-core rate. Products the policy keeps float32 get HIGHEST (true float32, as
# the wafer's fp32). On TPUs HIGH is three bfloat16 passes, exact only for 8-bit significands.
ROUNDED_OPERANDS = (jax.lax.Precision.HIGH, jax.lax.Precision.HIGH)
TRUE_FLOAT32 = (jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST)
# Native tensor cores (`_native_dtype`, `_rounded_product`): on GPUs a product of two rounded
# operands whose values a native 16-bit dtype holds exactly (compute bfloat16 or float16, and
# the float8 formats, which bfloat16 holds) runs on that dtype, float32 accumulation. The
# operands are the same numbers, so every product is the same; only the float32 summation
# order inside the GPU library may differ, as between any two GEMM algorithms. Platforms
# where the native branch is taken; elsewhere (CPUs, TPUs) the TF32 binding above, bit for
# bit today's program. ``Policy(products="tf32")`` keeps TF32 everywhere.
NATIVE_PLATFORMS = ("cuda", "rocm")
NATIVE_OPERANDS = (jax.lax.Precision.DEFAULT, jax.lax.Precision.DEFAULT)  # explicit: not the config's default
# The tangent (and so backward) products of native formats: float32 arrays holding values of
# the native dtype, read as that dtype by the GEMM, float32 accumulation and result. bfloat16
# only: XLA GPU (JAX 0.11.2, H100) refuses ``F16_F16_F32`` where it rewrites a small or
# matrix-vector dot as a multiply and a reduction ("Unsupported dot precision algorithm: 4",
# its algebraic simplifier handles the unset, BF16_BF16_F32*, TF32_TF32_F32* and F32_F32_F32
# algorithms), so float16's backward products stay TF32 (exact for float16 values too).
NATIVE_ALGORITHMS = {np.dtype(jnp.bfloat16): jax.lax.DotAlgorithmPreset.BF16_BF16_F32}


def _native_dtype(p: Pass) -> Any:
  """The native dtype on which products of ``p``'s rounded operands run on a GPU, or None (TF32).

  The first of bfloat16, float16 that holds every value of the compute format exactly: at
  most its fraction bits, at most its largest value and no finer quantum than its smallest
  subnormal. bfloat16 for bfloat16 and the float8 formats (e4m3fn, e5m2: exact in bfloat16,
  and bfloat16 tensor cores exist on every GPU with TF32, while XLA takes float8 GEMMs only
  in scaled patterns on Hopper and later), float16 for float16; None for cbfloat16 (9
  fraction bits and 6 exponent bits fit neither) and for ``Policy(products="tf32")``.
  """
  if getattr(p.policy, "products", "native") != "native" or not p.policy.is_mixed:
    return None
  fmt = p.fmt
  for dtype, native in ((jnp.bfloat16, _formats.bfloat16), (jnp.float16, _formats.float16)):
    quantum, native_quantum = fmt.emin - fmt.mantissa_bits, native.emin - native.mantissa_bits
    if fmt.mantissa_bits <= native.mantissa_bits and fmt.max <= native.max and quantum >= native_quantum:
      return dtype
  return None


def _rounded_product(
  product: Callable[..., jax.Array], lhs: Any, rhs: Any, native: Any, native_tangents: bool = False
) -> jax.Array:
  """``product(lhs, rhs, precision)`` of two rounded operands: TF32-eligible (`ROUNDED_OPERANDS`),
  or, with a ``native`` dtype, on that dtype's tensor cores on GPUs (`NATIVE_PLATFORMS`).

  The native form is ``platform_dependent``: lowered for a CPU it is exactly the TF32 binding
  (XLA CPU sums bfloat16 operands in another order, so converting there would change bits).
  Its derivative is a custom JVP whose tangent products keep float32 operands and results:
  converting a cotangent to the native dtype would, under JAX's transpose of that conversion,
  round the *result* of each backward product to it too, before the operand rounding's own
  transpose rounds it (twice for float8 formats, and before a sum with other cotangents).

  ``native_tangents`` (matrix-matrix ``dot_general`` products, `_matrix_product`): the tangent
  products are bound with the algorithm preset of the native dtype where it has one
  (`NATIVE_ALGORITHMS`, bfloat16: float32 operands and result, the operands read as bfloat16,
  float32 accumulation) on GPUs, TF32 elsewhere. Their transposes, the backward products of ``jax.grad(autocast(f))``, keep the preset: products of a
  cotangent and a rounded operand, on the native tensor cores. Exact there too: every cotangent
  reaching a rounded product is a value of the compute format, because the product's result is
  rounded at once and that rounding's transpose rounds its cotangent (or, where ``ct_rounded``
  skips it, the cotangent is proven rounded already; `precision.rounding.round_p`). Convolutions,
  matrix-vector products and float16 keep TF32 tangent products."""

  def tf32(a: Any, b: Any) -> jax.Array:
    return product(a, b, ROUNDED_OPERANDS)

  if native is None:
    return tf32(lhs, rhs)

  def tensor_cores(a: Any, b: Any) -> jax.Array:
    return product(a.astype(native), b.astype(native), NATIVE_OPERANDS)

  algorithm = NATIVE_ALGORITHMS.get(np.dtype(native)) if native_tangents else None

  def linear(a: Any, b: Any) -> jax.Array:
    """A tangent product (one operand a tangent, linear in it): float32 in and out."""
    if algorithm is None:
      return tf32(a, b)
    branches = dict.fromkeys(NATIVE_PLATFORMS, lambda a, b: product(a, b, algorithm))
    return jax.lax.platform_dependent(a, b, **branches, default=tf32)

  @jax.custom_jvp
  def rounded(a: Any, b: Any) -> jax.Array:
    branches = dict.fromkeys(NATIVE_PLATFORMS, tensor_cores)
    return jax.lax.platform_dependent(a, b, **branches, default=tf32)

  def rounded_jvp(primals: Any, tangents: Any) -> tuple[jax.Array, jax.Array]:
    (a, b), (da, db) = primals, tangents
    out = rounded(a, b)
    terms = [linear(da, b)] if not isinstance(da, compat.SymbolicZero) else []  # dot_general's own JVP
    terms += [linear(a, db)] if not isinstance(db, compat.SymbolicZero) else []
    return out, functools.reduce(jnp.add, terms) if terms else jnp.zeros_like(out)

  rounded.defjvp(rounded_jvp, symbolic_zeros=True)
  return rounded(lhs, rhs)


def _matrix_product(eqn: Any) -> bool:
  """Whether ``eqn`` is a ``dot_general`` whose transposes are matrix-matrix products too: a
  contraction, and a free (neither contracted nor batch) axis on each side. The transpose for
  one operand contracts over the other's free axes. Matrix-vector and outer products keep TF32
  tangents (XLA GPU rewrites such dots as multiplies and reductions, a path where not every
  algorithm preset is accepted); so do convolutions (their ``precision`` takes no algorithm)."""
  if eqn.primitive.name != "dot_general":
    return False
  (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
  lhs, rhs = (v.aval for v in eqn.invars[:2])
  return bool(lc) and lhs.ndim > len(lc) + len(lb) and rhs.ndim > len(rc) + len(rb)


def dot_precision(eqn: Any, precision: tuple) -> dict[str, Any]:
  """Parameter update giving a matrix product ``precision`` (none for products without one)."""
  return {"precision": precision} if "precision" in eqn.params else {}


def _mixed_product(p: Pass, eqn: Any, operands: list[Any], rule_class: str) -> tuple[jax.Array, int] | None:
  """(chunked result, chunk count), or None when the product has a single chunk.

  ``result = r(...r(r(s_0) + r(s_1)) + ... + r(s_{n-1}))``, ``s_i`` the float32 sum of chunk
  ``i``'s products and ``r`` rounding to the compute format: one product that computes every
  ``s_i`` (a batched dot_general, or a grouped convolution), then an ordered reduction.
  """
  native = _native_dtype(p)
  if eqn.primitive.name == "dot_general":
    chunks = _dot_chunking(eqn, p.block)
    if chunks is None:
      return None
    return _ordered_sum(
      p, _dot_chunk_sums(operands, eqn.params, chunks, native, _matrix_product(eqn)), rule_class
    ), chunks[2]
  if eqn.primitive.name == "conv_general_dilated":
    partial = _conv_chunk_sums(operands, eqn.params, p.block, native)
    return None if partial is None else (_ordered_sum(p, partial, rule_class), partial.shape[0])
  return None


def _ordered_sum(p: Pass, partial: jax.Array, rule_class: str) -> jax.Array:
  """``r(...r(r(s_0) + r(s_1)) + ...)`` over the leading axis: one rounding of every chunk sum,
  then a scan that adds them in order (a constant number of equations for any chunk count).

  Stochastic: the chunk sums are one site; the additions are one more site, whose key is
  folded with the addition's index (fresh bits for each addition)."""
  chunk_sums = p.round_class(partial, rule_class)
  if rule_class not in p.stochastic:

    def add(total: jax.Array, chunk: jax.Array) -> tuple[jax.Array, None]:
      return p.round(total + chunk), None

    total, _ = jax.lax.scan(add, chunk_sums[0], chunk_sums[1:])
    return total
  key = p.site_key()

  def add_stochastic(total: jax.Array, xs: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, None]:
    chunk, i = xs
    return _rounding.round_stochastic_linear(total + chunk, p.fmt, jax.random.fold_in(key, i)), None

  steps = jnp.arange(partial.shape[0] - 1, dtype=jnp.uint32)
  total, _ = jax.lax.scan(add_stochastic, chunk_sums[0], (chunk_sums[1:], steps))
  return total


def _dot_chunking(eqn: Any, block: int) -> tuple[int, int, int] | None:
  """(contracted axis index in the lhs contracting list, chunk length, chunk count) or None.

  The contraction is split along its longest axis into chunks of ``block // (product of the
  other contracted axes)`` (at least 1) elements; None when that leaves a single chunk.
  """
  (lhs_contract, _), _ = eqn.params["dimension_numbers"]
  if not lhs_contract:
    return None
  lhs_shape = eqn.invars[0].aval.shape
  sizes = [lhs_shape[d] for d in lhs_contract]
  if 0 in sizes:  # an empty contraction: zeros, nothing to chunk
    return None
  j = int(np.argmax(sizes))
  others = math.prod(sizes) // sizes[j]
  length = max(1, block // others)
  count = -(-sizes[j] // length)
  return None if count <= 1 else (j, length, count)


def _pad_axis(x: jax.Array, axis: int, size: int) -> jax.Array:
  """``x`` with zeros appended along ``axis`` up to ``size`` (exact: zero products add nothing)."""
  pad = size - x.shape[axis]
  if not pad:
    return x
  widths = [(0, 0, 0)] * x.ndim
  widths[axis] = (0, pad, 0)
  return jax.lax.pad(x, jnp.float32(0), widths)


def _dot_chunk_sums(
  operands: list[Any],
  params: dict,
  chunks: tuple[int, int, int],
  native: Any = None,
  native_tangents: bool = False,
) -> jax.Array:
  """float32 sums of each chunk of a dot_general's contraction, stacked on a leading axis.

  The chunk axis becomes a leading batch axis of one batched dot_general (zero padding
  completes the last chunk exactly), bound by `_rounded_product` (``native``: its dtype;
  ``native_tangents``: a matrix product, `_matrix_product`).
  """
  j, length, count = chunks
  (lc, rc), (lb, rb) = params["dimension_numbers"]
  lhs, rhs = operands
  la, ra = lc[j], rc[j]

  def split(x: jax.Array, axis: int) -> jax.Array:
    x = _pad_axis(x, axis, count * length)
    return x.reshape(x.shape[:axis] + (count, length) + x.shape[axis + 1 :])

  def shift(dims: Sequence[int], axis: int) -> tuple[int, ...]:
    return tuple(d + 1 if d > axis else d for d in dims)

  lhs, rhs = split(lhs, la), split(rhs, ra)
  # After the split, the chunk index sits at the old axis and the within-chunk index at +1.
  new_lc = tuple(d + 1 if d == la else d for d in shift(lc, la))
  new_rc = tuple(d + 1 if d == ra else d for d in shift(rc, ra))
  new_lb = (la,) + shift(lb, la)
  new_rb = (ra,) + shift(rb, ra)

  def product(a: Any, b: Any, precision: tuple) -> jax.Array:
    dims = ((new_lc, new_rc), (new_lb, new_rb))
    return jax.lax.dot_general(a, b, dims, precision=precision, preferred_element_type=jnp.float32)

  return _rounded_product(product, lhs, rhs, native, native_tangents)


def _conv_chunk_sums(operands: list[Any], params: dict, block: int, native: Any = None) -> jax.Array | None:
  """float32 sums of each chunk of a convolution's contraction, stacked on a leading axis.

  The contraction of output feature ``o`` of group ``g`` is ``cg`` input channels x the
  kernel window (``K`` taps). Chunks are runs of ``c = max(1, block // K)`` input channels:
  the ``n`` chunks of each group become ``n`` groups of one grouped convolution (input
  channels zero-padded to ``n * c``), whose output features are then split by chunk.
  None when there is a single chunk or ``batch_group_count > 1``. The grouped convolution is
  bound by `_rounded_product` (``native``: its dtype).
  """
  if params["batch_group_count"] != 1:
    return None
  lhs, rhs = operands
  dn = params["dimension_numbers"]
  groups = params["feature_group_count"]
  rhs_c = jnp.transpose(rhs, dn.rhs_spec)  # canonical (out, in, *window)
  out_features, cg, window = rhs_c.shape[0], rhs_c.shape[1], rhs_c.shape[2:]
  length = max(1, block // max(1, math.prod(window)))
  count = -(-cg // length)
  if count <= 1:
    return None
  og = out_features // groups
  # Kernel: (G*og, n*c, *W) -> (G, og, n, c, *W) -> (G, n, og, c, *W) -> (G*n*og, c, *W).
  rhs_c = _pad_axis(rhs_c, 1, count * length).reshape((groups, og, count, length) + window)
  rhs_c = jnp.moveaxis(rhs_c, 2, 1).reshape((groups * count * og, length) + window)
  # Input features: (G*cg) -> (G, n*c) -> G*n*c, in the lhs layout.
  feature = dn.lhs_spec[1]
  x = jnp.moveaxis(lhs, feature, -1)
  x = _pad_axis(x.reshape(x.shape[:-1] + (groups, cg)), x.ndim, count * length)
  x = jnp.moveaxis(x.reshape(x.shape[:-2] + (groups * count * length,)), -1, feature)
  canonical_rhs = tuple(range(rhs_c.ndim))

  def product(a: Any, b: Any, precision: tuple) -> jax.Array:
    return jax.lax.conv_general_dilated(
      a,
      b,
      window_strides=params["window_strides"],
      padding=params["padding"],
      lhs_dilation=params["lhs_dilation"],
      rhs_dilation=params["rhs_dilation"],
      dimension_numbers=jax.lax.ConvDimensionNumbers(dn.lhs_spec, canonical_rhs, dn.out_spec),
      feature_group_count=groups * count,
      precision=precision,
      preferred_element_type=jnp.float32,
    )

  out = _rounded_product(product, x, rhs_c, native)
  # Output features (G, n, og) -> a leading chunk axis, features (G*og) back in place.
  of = dn.out_spec[1]
  y = jnp.moveaxis(out, of, 0)
  y = jnp.moveaxis(y.reshape((groups, count, og) + y.shape[1:]), 1, 0)
  y = y.reshape((count, groups * og) + y.shape[3:])
  return jnp.moveaxis(y, 1, of + 1)
