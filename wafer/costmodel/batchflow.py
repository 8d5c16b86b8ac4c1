"""Which axes of each value carry the batch, followed through a jaxpr from the batch arguments.

A value's *batch axes* are the axes whose size is the batch (or a multiple of it: the tokens of a
flattened ``[batch * seq, d]``). They tell how each size of an equation grows with the batch from
one trace (`wafer.costmodel.graph.extract` with ``scaling="dataflow"``): a size is ``b0 ** n`` times
a constant where ``n`` is the number of batch axes among the axes it multiplies.

`out_axes` gives the batch axes of an equation's outputs from those of its inputs, or raises
`Unknown` where the equation mixes the batch in a way it does not follow (the caller then traces
the step a second time at twice the batch and compares, which is exact). A reshape that splits an
axis carrying the batch gives the batch to the block's leading axis (``[b * s] -> [b, s]``), the
layout of every batch-first step.

>>> import jax, jax.numpy as jnp
>>> eqn = jax.make_jaxpr(lambda x: x.reshape(4, 3, 2))(jnp.zeros((12, 2))).eqns[0]
>>> sorted(out_axes(eqn, [frozenset({0})])[0])
[0]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from precision import _jax_compat as compat

__all__ = ("Unknown", "out_axes")

Axes = frozenset[int]
_NONE: Axes = frozenset()

# reductions whose ``axes`` parameter names the reduced axes (the output drops them)
_REDUCE_AXES = (
  "reduce_sum",
  "reduce_max",
  "reduce_min",
  "reduce_prod",
  "reduce_and",
  "reduce_or",
  "reduce_xor",
  "argmax",
  "argmin",
  "reduce_precision",
)
# same rank as the first operand, each axis its own (the size of a sliced or padded batch axis is
# checked below)
_SAME_RANK = (
  "slice",
  "dynamic_slice",
  "pad",
  "rev",
  "cumsum",
  "cumprod",
  "cummax",
  "cummin",
  "cumlogsumexp",
  "sort",
  "dynamic_update_slice",
  "concatenate",
  "clamp",
  "top_k",
)


class Unknown(Exception):
  """An equation whose outputs' batch axes `out_axes` cannot tell."""


def _shape(v: Any) -> tuple[int, ...]:
  return tuple(getattr(getattr(v, "aval", None), "shape", ()) or ())


def _reshape(before: tuple[int, ...], after: tuple[int, ...], axes: Axes) -> Axes:
  """Batch axes through a reshape: the input and output axes are matched in blocks of equal
  product; a block with a batch axis gives it to its leading output axis of size > 1."""
  out: set[int] = set()
  i = j = 0
  while i < len(before) or j < len(after):
    bi, bj = [i], [j]
    pi = before[i] if i < len(before) else 1
    pj = after[j] if j < len(after) else 1
    i, j = i + 1, j + 1
    while pi != pj:
      if pi < pj and i < len(before):
        bi.append(i)
        pi *= before[i]
        i += 1
      elif j < len(after):
        bj.append(j)
        pj *= after[j]
        j += 1
      else:
        raise Unknown("reshape sizes do not match")
    batched = sum(1 for a in bi if a in axes and a < len(before))
    if batched > 1:
      raise Unknown("a reshape merges two batch axes")
    if batched:
      dst = [d for d in bj if d < len(after) and after[d] != 1]
      if not dst:
        raise Unknown("a reshape drops a batch axis")
      out.add(dst[0])
  return frozenset(out)


def out_axes(eqn: Any, ins: Sequence[Axes | None], batch: int | None = None) -> list[Axes]:
  """The batch axes of each output of ``eqn`` (a primitive, not a call) given those of its inputs
  (None: a literal or a value with none); ``batch`` is the traced batch ``b0``.

  A value built without the batch is taken to have none, but where it is built to per-sample shape:
  a broadcast whose new (or grown from 1) leading axis has ``b0`` entries (a mask broadcast over the
  samples; the backward of a mean spreads the scalar cotangent over them), an ``iota`` or random bits of
  shape ``[b0, ...]`` (positions, a dropout mask) or a flat value reshaped to ``[b0, ...]``
  carries the batch on axis 0. An element-wise operand that spans an
  axis the others carry the batch on, without it, raises `Unknown` (a value built to per-sample
  shape some other way).
  """
  ins = [a or _NONE for a in ins]
  outs = eqn.outvars
  prim = eqn.primitive.name
  p = eqn.params
  if not outs:  # an effect with no result (jax.debug.print or callback of the batch): nothing to follow
    return []
  if prim == "broadcast_in_dim":
    dims = p["broadcast_dimensions"]
    res = {dims[a] for a in ins[0]}
    shape, src = _shape(outs[0]), _shape(eqn.invars[0])
    grown = 0 not in dims or src[list(dims).index(0)] == 1  # axis 0 new, or from an axis of size 1
    if not ins[0] and batch is not None and shape and shape[0] == batch and grown:
      res.add(0)
    return [frozenset(res)] + [_NONE] * (len(outs) - 1)
  in_shapes = [_shape(v) for v in eqn.invars]
  out_shapes = [_shape(v) for v in outs]
  if not any(ins):
    if batch is not None and out_shapes and out_shapes[0][:1] == (batch,):
      if prim in ("iota", "random_bits", "rng_bit_generator", "rng_uniform"):  # positions, random bits
        return [frozenset({0})]
      if prim == "reshape" and in_shapes[0][:1] != (batch,):  # flat values shaped to [b0, ...]
        return [frozenset({0})]
    return [_NONE for _ in outs]
  if prim == "reshape":
    return [_reshape(in_shapes[0], out_shapes[0], ins[0])]
  if prim == "transpose":
    perm = list(p["permutation"])
    return [frozenset(perm.index(a) for a in ins[0])]
  if prim == "squeeze":
    gone = {d % len(in_shapes[0]) for d in p["dimensions"]}
    keep = [d for d in range(len(in_shapes[0])) if d not in gone]
    return [frozenset(keep.index(a) for a in ins[0] if a in keep)]
  if prim == "expand_dims":
    raise Unknown(prim)
  if prim in _REDUCE_AXES:
    red = set(p.get("axes", ()) or ())
    if prim == "reduce_precision":
      return [ins[0]]
    keep = [d for d in range(len(in_shapes[0])) if d not in red]
    return [frozenset(keep.index(a) for a in ins[0] if a in keep) for _ in outs]
  if prim in ("dot_general", "ragged_dot_general", "ragged_dot"):
    (lc, rc), (lb, rb), group, ragged, _ = compat.dot_numbers(eqn)
    lhs, rhs = in_shapes[0], in_shapes[1]
    lfree = [d for d in range(len(lhs)) if d not in lc and d not in lb]
    rfree = [d for d in range(len(rhs)) if d not in rc and d not in rb and d not in group]
    res: set[int] = set()
    if prim != "dot_general" and any(d in lc for d in ragged):
      # the groups' sums (a weight gradient): the output leads with the group axis
      if any(a in lb for a in ins[0]) or any(a in rb for a in ins[1]):
        raise Unknown("a ragged product over a batch axis")
      return [frozenset()]
    for pos, (dl, dr) in enumerate(zip(lb, rb)):
      if dl in ins[0] or dr in ins[1]:
        res.add(pos)
    res.update(len(lb) + i for i, d in enumerate(lfree) if d in ins[0])
    res.update(len(lb) + len(lfree) + i for i, d in enumerate(rfree) if d in ins[1])
    return [frozenset(res)]
  if prim == "gather":
    # output axes: the indices' axes but the last (the index vector) where offset_dims is not, the
    # operand's axes that are neither collapsed nor batching axes at offset_dims
    dn = p["dimension_numbers"]
    operand, idx, out = in_shapes[0], in_shapes[1], out_shapes[0]
    offset = list(dn.offset_dims)
    batch_out = [d for d in range(len(out)) if d not in offset]
    if len(batch_out) != len(idx) - 1:
      raise Unknown("gather dimensions")
    res = {batch_out[a] for a in ins[1] if a < len(idx) - 1}
    op_batching = list(getattr(dn, "operand_batching_dims", ()) or ())
    idx_batching = list(getattr(dn, "start_indices_batching_dims", ()) or ())
    kept = [d for d in range(len(operand)) if d not in dn.collapsed_slice_dims and d not in op_batching]
    slice_sizes = p["slice_sizes"]
    for a in ins[0]:
      if a in op_batching:
        res.add(batch_out[idx_batching[op_batching.index(a)]])
      elif a in kept and slice_sizes[a] == operand[a]:
        res.add(offset[kept.index(a)])
      else:
        raise Unknown("a gather that slices the batch")
    return [frozenset(res)]
  if prim.startswith("scatter"):
    # the updates' window axes are the operand's axes that are neither inserted nor batching axes;
    # their other axes follow the indices' (all but the last): along a batching axis they are the
    # operand's, else they are summed into it (an embedding's gradient has no batch axis)
    dn = p["dimension_numbers"]
    operand, idx, upd = in_shapes[0], in_shapes[1], in_shapes[2]
    res = set(ins[0])
    window = list(dn.update_window_dims)
    op_batching = list(getattr(dn, "operand_batching_dims", ()) or ())
    idx_batching = list(getattr(dn, "scatter_indices_batching_dims", ()) or ())
    kept = [d for d in range(len(operand)) if d not in dn.inserted_window_dims and d not in op_batching]
    scatter_axes = [d for d in range(len(upd)) if d not in window]
    if len(scatter_axes) != len(idx) - 1 or len(kept) != len(window):
      raise Unknown("scatter dimensions")
    for u in ins[2]:
      if u in window:
        o = kept[window.index(u)]
        if upd[u] != operand[o]:
          raise Unknown("a scatter into part of a batch axis")
        res.add(o)
      elif scatter_axes.index(u) in idx_batching:
        res.add(op_batching[idx_batching.index(scatter_axes.index(u))])
    for i in ins[1]:
      if i < len(idx) - 1 and i in idx_batching:
        res.add(op_batching[idx_batching.index(i)])
    return [frozenset(res)]
  if prim in ("iota", "rng_bit_generator", "random_bits", "random_seed", "random_wrap", "random_unwrap"):
    if prim in ("random_wrap", "random_unwrap", "random_bits") and any(ins):
      raise Unknown(prim)
    return [_NONE for _ in outs]
  if prim in _SAME_RANK:
    first = in_shapes[0]
    axes = set(ins[0])
    if prim in ("dynamic_update_slice",) and ins[1] and not ins[0]:
      raise Unknown(prim)
    if prim in ("concatenate", "clamp"):
      for a, sh in zip(ins, in_shapes):
        if len(sh) == len(out_shapes[0]):
          axes |= a
      if prim == "concatenate" and p["dimension"] in axes:
        raise Unknown("a concatenation along the batch")
    if prim == "slice":  # one sample taken (``x[0]``, a key of the first sample): no batch axis left
      axes -= {a for a in axes if a < len(out_shapes[0]) and out_shapes[0][a] == 1}
    for a in axes:
      if a >= len(out_shapes[0]) or out_shapes[0][a] != first[a]:
        raise Unknown(
          f"{prim} changes the size of a batch axis ({first} -> {out_shapes[0]}, axes {sorted(axes)})"
        )
    return [frozenset(axes) for _ in outs]
  # element-wise (operands of the output's rank, broadcast along axes of size 1): the union of the
  # operands' batch axes
  # every operand that spans an axis (is not broadcast along it) must agree on whether it is the batch:
  # a value of per-sample shape built without the batch (it is not followed) is caught here
  out = out_shapes[0]
  if all(sh == out for sh in out_shapes):
    res = set()
    for a, sh in zip(ins, in_shapes):
      if a and (len(sh) != len(out) or any(sh[d] != out[d] for d in a)):
        raise Unknown(f"{prim} of shapes {in_shapes}")
      res |= a
    for a, sh in zip(ins, in_shapes):
      if len(sh) == len(out) and any(
        sh[d] == out[d] != 1 and (d in a) != (d in res) for d in range(len(out))
      ):
        raise Unknown(f"{prim}: an operand of per-sample shape whose batch axis was not followed")
    return [frozenset(res) for _ in outs]
  raise Unknown(f"{prim} of shapes {in_shapes} -> {out_shapes}")
