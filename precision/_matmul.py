"""Matrix products under a policy: operands rounded, products bound at the precision that
keeps them exact, and the chunked (``mixed_accumulate``) sums of levels 0 and 1."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from precision import _jax_compat as compat
from precision import rounding as _rounding
from precision._state import (
  CONST_ROUNDED,
  FLOAT32,
  RAW_TAG,
  ROUNDED,
  Pass,
  Tag,
  is_f32,
  numel,
)

# ---- matrix products ----


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
  chunked = _mixed_product(p, eqn, operands, rule_class) if treatment == "mixed_accumulate" else None
  if chunked is None:
    out = p.round_result(compat.bind(eqn, operands, **dot_precision(eqn, ROUNDED_OPERANDS))[0], rule_class)
    rounded += numel(out_aval)
  else:
    out, n = chunked
    rounded += (2 * n - 1) * numel(out_aval)
  p.log.record(name, rule_class, rounded=rounded)
  return [out], [Tag(ROUNDED, score)]


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


def dot_precision(eqn: Any, precision: tuple) -> dict[str, Any]:
  """Parameter update giving a matrix product ``precision`` (none for products without one)."""
  return {"precision": precision} if "precision" in eqn.params else {}


def _mixed_product(p: Pass, eqn: Any, operands: list[Any], rule_class: str) -> tuple[jax.Array, int] | None:
  """(chunked result, chunk count), or None when the product has a single chunk.

  ``result = r(...r(r(s_0) + r(s_1)) + ... + r(s_{n-1}))``, ``s_i`` the float32 sum of chunk
  ``i``'s products and ``r`` rounding to the compute format: one product that computes every
  ``s_i`` (a batched dot_general, or a grouped convolution), then an ordered reduction.
  """
  if eqn.primitive.name == "dot_general":
    chunks = _dot_chunking(eqn, p.block)
    if chunks is None:
      return None
    return _ordered_sum(p, _dot_chunk_sums(operands, eqn.params, chunks), rule_class), chunks[2]
  if eqn.primitive.name == "conv_general_dilated":
    partial = _conv_chunk_sums(operands, eqn.params, p.block)
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


def _dot_chunk_sums(operands: list[Any], params: dict, chunks: tuple[int, int, int]) -> jax.Array:
  """float32 sums of each chunk of a dot_general's contraction, stacked on a leading axis.

  The chunk axis becomes a leading batch axis of one batched dot_general (zero padding
  completes the last chunk exactly).
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
  return jax.lax.dot_general(
    lhs,
    rhs,
    ((new_lc, new_rc), (new_lb, new_rb)),
    precision=ROUNDED_OPERANDS,
    preferred_element_type=jnp.float32,
  )


def _conv_chunk_sums(operands: list[Any], params: dict, block: int) -> jax.Array | None:
  """float32 sums of each chunk of a convolution's contraction, stacked on a leading axis.

  The contraction of output feature ``o`` of group ``g`` is ``cg`` input channels x the
  kernel window (``K`` taps). Chunks are runs of ``c = max(1, block // K)`` input channels:
  the ``n`` chunks of each group become ``n`` groups of one grouped convolution (input
  channels zero-padded to ``n * c``), whose output features are then split by chunk.
  None when there is a single chunk or ``batch_group_count > 1``.
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
  out = jax.lax.conv_general_dilated(
    x,
    rhs_c,
    window_strides=params["window_strides"],
    padding=params["padding"],
    lhs_dilation=params["lhs_dilation"],
    rhs_dilation=params["rhs_dilation"],
    dimension_numbers=jax.lax.ConvDimensionNumbers(dn.lhs_spec, canonical_rhs, dn.out_spec),
    feature_group_count=groups * count,
    precision=ROUNDED_OPERANDS,
    preferred_element_type=jnp.float32,
  )
  # Output features (G, n, og) -> a leading chunk axis, features (G*og) back in place.
  of = dn.out_spec[1]
  y = jnp.moveaxis(out, of, 0)
  y = jnp.moveaxis(y.reshape((groups, count, og) + y.shape[1:]), 1, 0)
  y = y.reshape((count, groups * og) + y.shape[3:])
  return jnp.moveaxis(y, 1, of + 1)
