"""The interpreter of `autocast`: evaluates a jaxpr equation by equation, applying the policy's
rules (module docstring of `precision.autocast`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from precision import _jax_compat as compat
from precision import _state
from precision._attention import extreme_atom, extreme_literal, find_attention
from precision._matmul import matmul
from precision._op_classes import PRIMITIVE_CLASSES
from precision._state import (
  CONST,
  CONST_ROUNDED,
  CONSTANTS,
  FLOAT32,
  HIGHER_ORDER,
  RAW_TAG,
  ROUNDED,
  Deferred,
  Pass,
  Tag,
  is_f32,
  join_all,
  numel,
  region_of,
)
from precision.formats import FloatFormat, float32

_PASS_COTANGENT = frozenset(("add", "sub", "add_any"))  # transpose: the cotangent, +-, same shape
_COMMUTING = frozenset(
  ("reshape", "squeeze", "expand_dims", "transpose", "rev", "copy", "copy_p", "convert_element_type")
)


def _representable(value: float, fmt: FloatFormat) -> bool:
  """Whether a float32 scalar is exactly a value of ``fmt``: rounding it to ``fmt`` gives it back
  (host arithmetic, exact).

  Zeros and NaN are. An infinity is only where the format has one and rounding keeps it
  (``overflow="inf"``: a saturating format rounds it to ``+-max``, one without infinities to NaN);
  a magnitude below ``min_normal`` only where the format has subnormals (else it is flushed to zero).
  """
  if value == 0 or math.isnan(value):
    return True
  if math.isinf(value):
    return fmt.has_inf and fmt.overflow == "inf"
  if abs(value) < fmt.min_normal and not fmt.subnormals:
    return False
  exponent = math.frexp(abs(value))[1] - 1
  quantum = max(exponent, fmt.emin) - fmt.mantissa_bits
  return abs(value) <= fmt.max and (value / 2.0**quantum).is_integer()


def _literal_tag(p: Pass, literal: Any) -> Tag | None:
  if not is_f32(literal.aval):
    return None
  value = np.asarray(literal.val)
  if value.ndim == 0 and _representable(float(value), p.fmt):
    return Tag(CONST_ROUNDED)
  return Tag(CONST)


def run(p: Pass, closed: Any, flat: Sequence[Any], rounded_outputs: int | None = None) -> list[Any]:
  """Interpret the closed jaxpr ``closed`` on ``flat``; float32 outputs (the first
  ``rounded_outputs`` of them, all if None) are rounded to the policy's output format."""
  jaxpr, consts = compat.split_closed(closed)
  tags = [RAW_TAG if is_f32(v.aval) else None for v in jaxpr.invars]
  outs, out_tags = interpret(p, jaxpr, consts, list(flat), tags)
  outs = [compat.plain_scalar(o) for o in outs]  # a Python number the function returned
  if p.policy.output == float32:
    return outs
  # An output already rounded to the output format (it is the compute format) is not rounded again.
  done = (ROUNDED, CONST_ROUNDED) if p.policy.output == p.fmt and p.policy.is_mixed else ()
  n = len(outs) if rounded_outputs is None else rounded_outputs
  return [
    p.round_to(o, p.policy.output, "<output>")
    if i < n and is_f32(jax.typeof(o)) and (t is None or t.state not in done)
    else o
    for i, (o, t) in enumerate(zip(outs, out_tags))
  ]


def interpret(
  p: Pass,
  jaxpr: compat.Jaxpr,
  consts: Sequence[Any],
  args: Sequence[Any],
  tags: Sequence[Tag | None],
  rounded: Mapping[int, Any] | None = None,
) -> tuple[list[Any], list[Tag | None]]:
  """Evaluate ``jaxpr`` on ``consts`` and ``args`` at the current trace, applying the policy's rules.

  ``consts`` and ``args`` bind the jaxpr's inputs by position (`compat.binders`: its constvars,
  then its invars; from JAX 0.11 a traced jaxpr's constants are leading invars). ``tags`` are
  the tags of ``args``; constants are raw values. ``rounded`` maps positions of ``args`` to their
  values rounded as matrix-product operands by the caller (`precision._matmul.hoist`): a product
  of the body uses them instead of rounding the argument again."""
  if id(jaxpr) not in p.analysed:
    find_attention(jaxpr, [None] * len(jaxpr.invars), p.score_dots, p.analysed, p.extreme_meets)
  env: dict[Any, tuple[Any, Tag | None]] = {}
  memo: dict[Any, jax.Array] = {}  # var -> its rounded value (round each weight once)

  def read(atom: Any) -> tuple[Any, Tag | None]:
    if isinstance(atom, compat.Literal):
      return atom.val, _literal_tag(p, atom)
    return env[atom]

  variables = compat.binders(jaxpr)
  values_in = [*consts, *args]
  if len(variables) != len(values_in):
    raise AssertionError(f"autocast: {len(values_in)} values for a jaxpr of {len(variables)} inputs")
  tags_in = [RAW_TAG] * len(consts) + list(tags)
  for var, value, tag in zip(variables, values_in, tags_in):
    env[var] = (value, tag if is_f32(var.aval) else None)
  for position, value in (rounded or {}).items():
    memo[variables[len(consts) + position]] = value
  single = _single_uses(jaxpr) if _state.SKIP_ROUNDED_COTANGENTS and p.observer is None else {}
  known_bits = set(p.random_bits)
  p.random_outputs = ()
  try:
    outs, out_tags = _interpret_eqns(p, jaxpr, env, memo, single, read)
    # which results are random bits: a caller registers its own values there (`random_results`)
    p.random_outputs = tuple(i for i, v in enumerate(outs) if id(v) in p.random_bits)
    return outs, out_tags
  finally:  # this jaxpr's random bits are its trace's values: kept no longer (no tracer outlives it)
    for key in set(p.random_bits) - known_bits:
      del p.random_bits[key]


def random_results(p: Pass, outs: Sequence[Any], positions: Sequence[int]) -> None:
  """Register ``outs[i]`` (a call's results, in the caller's trace) as random bits for each of the
  ``positions`` its body returned random bits at (``p.random_outputs`` after that body's `interpret`):
  bits a jitted helper returns stay data where the caller makes floats of them."""
  p.random_bits.update((id(outs[i]), outs[i]) for i in positions if i < len(outs))


def _interpret_eqns(
  p: Pass, jaxpr: compat.Jaxpr, env: dict, memo: dict, single: dict, read: Any
) -> tuple[list[Any], list[Tag | None]]:
  for eqn in jaxpr.eqns:
    pairs = [read(atom) for atom in eqn.invars]
    values = [v for v, _ in pairs]
    in_tags = [t for _, t in pairs]
    if _commutes(eqn, values) and single.get(eqn.outvars[0]) is not None:
      # A move of a rounding's only result on to a consumer that may pass a rounded cotangent
      # back: round(move(x)) == move(round(x)) bit for bit (and the same element count), so
      # the move is bound on the unrounded value and the rounding stays deferred.
      outs, out_tags = _apply(p, eqn, [values[0].value], in_tags, memo)
      env[eqn.outvars[0]] = (Deferred(outs[0]), out_tags[0])
      continue
    for i, value in enumerate(values):
      if isinstance(value, Deferred):  # this equation is the value's only consumer
        values[i] = value.bind(p, _rounds_cotangent(p, eqn, i, in_tags))
    with compat.eqn_context(eqn), eqn.ctx.manager:
      region = region_of(compat.name_stack(eqn))  # this jaxpr's own scopes, not the caller's
      if region is None:
        values, in_tags = _extremes(p, eqn, values, in_tags)
        outs, out_tags = _apply(p, eqn, values, in_tags, memo)
      else:
        outs, out_tags = _in_region(p, eqn, values, region)
    outs = [
      value.bind(p) if isinstance(value, Deferred) and single.get(var) is None else value
      for var, value in zip(eqn.outvars, outs)
    ]
    if p.observer is not None:
      p.observer(eqn, values, in_tags, outs, out_tags)
    for var, value, tag in zip(eqn.outvars, outs, out_tags):
      env[var] = (value, tag)
  results = [read(atom) for atom in jaxpr.outvars]
  return [v for v, _ in results], [t for _, t in results]


def _extremes(
  p: Pass, eqn: Any, values: list[Any], tags: list[Tag | None]
) -> tuple[list[Any], list[Tag | None]]:
  """Literals ``+-finfo(float32).max`` of attention masks become ``+-p.extreme``, the compute
  format's largest number.

  Code writes ``jnp.finfo(dtype).min`` for "the lowest number of the working dtype": Hugging Face's
  attention bias ``select(mask > 0, full(0), full(finfo(dtype).min))``, flax's ``big_neg``. Where the
  policy rounds the attention scores (``attention_softmax="round"``: level 2, modelzoo's cbfloat16
  override), that dtype is the compute format, and with its largest number the program computes what
  it computes with the format as its dtype. Kept as float32's, the rounding of ``scores + bias`` is an
  infinity, and a row of scores masked everywhere (the query at a left-padded position) gives
  ``inf - inf``: NaN where float32 gives a uniform row. Where the scores stay float32 (and under a
  float32 policy) nothing changes: there float32's number is the working dtype's, and a smaller one
  (float16's 65504) would not absorb the scores it is added to.

  Only a literal whose equation's result reaches the scores of a recognised attention before any
  matrix product (``p.extreme_meets``, found by `find_attention`: the bias is added to the scores
  or selected into them) is swapped: anywhere else (``min(where(x > 0, exp(x), finfo.max))``) the
  program means float32's number, and the format's max would be a value that appears nowhere.
  Comparisons, ``max``, ``min`` and ``clamp`` keep the literal (`extreme_literal`).
  """
  if p.extreme == float32.max or not extreme_literal(eqn):
    return values, tags
  if not p.extreme_meets.get(id(eqn), set()) & p.score_dots:
    return values, tags
  values, tags = list(values), list(tags)
  for i, atom in enumerate(eqn.invars):
    if extreme_atom(atom):
      new = math.copysign(p.extreme, float(atom.val))
      values[i] = np.asarray(new, np.float32) if isinstance(atom.val, (np.ndarray, np.generic)) else new
      tags[i] = Tag(CONST_ROUNDED)
  return values, tags


def _single_uses(jaxpr: compat.Jaxpr) -> dict[Any, Any]:
  """Variables read exactly once, by an equation that may pass a rounded cotangent back
  (`_PASS_COTANGENT`, ``reduce_sum``), and not results of ``jaxpr``: variable -> equation."""
  uses: dict[Any, list[Any]] = {}
  for eqn in jaxpr.eqns:
    for atom in eqn.invars:
      if isinstance(atom, compat.Var):
        uses.setdefault(atom, []).append(eqn)
  for atom in jaxpr.outvars:
    if isinstance(atom, compat.Var):
      uses.setdefault(atom, []).extend((None, None))
  candidates = (*_PASS_COTANGENT, "reduce_sum", *_COMMUTING)
  return {v: e[0] for v, e in uses.items() if len(e) == 1 and e[0].primitive.name in candidates}


def _commutes(eqn: Any, values: list[Any]) -> bool:
  """Whether ``eqn`` moves a deferred rounding's value without changing any element or the
  element count (a reshape, transpose, reversal, copy or float32 -> float32 conversion)."""
  if eqn.primitive.name not in _COMMUTING or len(values) != 1 or not isinstance(values[0], Deferred):
    return False
  return is_f32(eqn.invars[0].aval) and is_f32(eqn.outvars[0].aval)


def _rounds_cotangent(p: Pass, eqn: Any, position: int, tags: list[Tag | None]) -> bool:
  """Whether, under reverse-mode differentiation of the pass's program, the cotangent that
  ``eqn`` (the only consumer of its operand ``position``, a value the pass rounds to nearest)
  sends back to that operand is already a value of the compute format.

  True when ``eqn`` is an ``add``, ``sub`` or ``add_any`` whose operand has the result's
  shape (the cotangent of the operand is the result's, up to sign) or a ``reduce_sum`` (a
  broadcast of it), and the pass rounds ``eqn``'s result to nearest even (same rule as
  `_value_op`): the cotangent of that rounding is rounded by its transpose. Rounding it again
  would change nothing (nearest-even rounding is idempotent, NaN and signed zeros included),
  so the operand's rounding binds ``ct_rounded=True`` and its transpose passes it on: a
  cotangent is rounded once, not twice. Anything else (products, other ops, several consumers,
  results of the jaxpr, float32 regions) answers False.
  """
  name = eqn.primitive.name
  if region_of(eqn.source_info.name_stack) is not None or len(eqn.outvars) != 1:
    return False
  if name in _PASS_COTANGENT and eqn.invars[position].aval.shape != eqn.outvars[0].aval.shape:
    return False
  op_class = PRIMITIVE_CLASSES.get(name, "unknown")
  treatment, rule_class = _value_treatment(p, op_class, [t for t in tags if t is not None])
  return treatment == "round" and rule_class not in p.stochastic


def _in_region(p: Pass, eqn: Any, values: list[Any], region: str) -> tuple[list, list]:
  """An equation of a float32 region or of a nested autocast: bound exactly as written."""
  outs = compat.bind(eqn, values)
  avals = [v.aval for v in eqn.outvars]
  size = sum(numel(a) for a in avals if is_f32(a))
  if region == "float32_region":
    p.log.record(eqn.primitive.name, region, kept_float32=size)
    return outs, [Tag(FLOAT32) if is_f32(a) else None for a in avals]
  p.log.record(eqn.primitive.name, region, untouched=size)
  return outs, [RAW_TAG if is_f32(a) else None for a in avals]


def _apply(
  p: Pass, eqn: Any, values: list[Any], tags: list[Tag | None], memo: dict[Any, jax.Array]
) -> tuple[list[Any], list[Tag | None]]:
  name = eqn.primitive.name
  handler = HIGHER_ORDER.get(name)
  if handler is not None:
    outer, p.memo = p.memo, memo  # the operands this jaxpr rounded, which a body shares (`hoist`)
    try:
      return handler(p, eqn, values, tags)
    finally:
      p.memo = outer  # no tracer of a finished trace stays referenced
  if compat.is_higher_order(eqn):  # never a silent float32 pass-through of a body
    raise compat.unhandled(eqn, "precision.autocast")
  out_avals = [v.aval for v in eqn.outvars]
  op_class = PRIMITIVE_CLASSES.get(name, "unknown")
  if not any(is_f32(a) for a in out_avals):
    outs = compat.bind(eqn, values)
    if name in _RANDOM_BITS or any(id(v) in p.random_bits for v in values):  # bits and their integer ops
      p.random_bits.update((id(o), o) for o in outs)
    if op_class == "cast":
      region = "cast"
    elif any(jnp.issubdtype(a.dtype, jnp.inexact) for a in out_avals if hasattr(a, "dtype")):
      region = "other_float"  # float64 (x64), complex, or 16-bit values the program computes itself
    else:
      region = "integer"
    p.log.record(name, region, untouched=sum(numel(a) for a in out_avals))
    return outs, [None] * len(outs)
  if op_class == "matmul":
    return matmul(p, eqn, values, tags, memo)
  if op_class in ("elementwise", "transcendental", "reduction", "exact"):
    return _value_op(p, eqn, values, tags, op_class)
  outs = compat.bind(eqn, values)
  size = sum(numel(a) for a in out_avals)
  if op_class == "data_movement":
    tag = join_all(tags)
    p.log.record(name, op_class, untouched=size)
    return outs, [tag if is_f32(a) else None for a in out_avals]
  if op_class == "cast":
    same = name == "convert_element_type" and len(tags) == 1 and tags[0] is not None
    tag = tags[0] if same else RAW_TAG
    if name == "bitcast_convert_type" and id(values[0]) in p.random_bits:
      # a float32 built from random bits (jax.random's samplers: bits into [1, 2), then ``- 1`` and a
      # scale): a draw, kept float32 through the elementwise arithmetic with constants that finishes
      # it (`_value_treatment`); rounding that arithmetic turned uniforms just below 1 into 1.0, and
      # normals, Gumbel and exponential draws built on them into inf. Bits of a computed float (a
      # user's mantissa trick) are not random: their float is raw, rounded as before.
      tag = Tag(FLOAT32)
    if name == "precision_round" and eqn.params["fmt"] == p.fmt and eqn.params["mode"] == "nearest_even":
      tag = Tag(ROUNDED, tags[0].attention if tags[0] else False)
    p.log.record(name, op_class, untouched=size)
    return outs, [tag if is_f32(a) else None for a in out_avals]
  p.log.record(name, "unknown", untouched=size)
  return outs, [RAW_TAG if is_f32(a) else None for a in out_avals]


_RANDOM_BITS = frozenset({"random_bits", "threefry2x32"})
"""Primitives whose integer results are random bits (a new-style key's ``random_bits``; the threefry
hash of raw uint32 keys)."""


def _value_op(
  p: Pass, eqn: Any, values: list[Any], tags: list[Tag | None], op_class: str
) -> tuple[list, list]:
  """Elementwise, transcendental, reduction and exact ops: round or keep the result."""
  name = eqn.primitive.name
  out_avals = [v.aval for v in eqn.outvars]
  size = sum(numel(a) for a in out_avals if is_f32(a))
  floats = [t for t in tags if t is not None] + _other_dtype_values(eqn, op_class)
  if op_class == "exact" and any(_is_complex(a.aval) for a in eqn.invars):
    op_class = "elementwise"  # abs of a complex value computes its modulus: not one of its inputs' values
  attention = any(t.attention for t in floats)
  outs = compat.bind(eqn, values)

  def tagged(state: str) -> list[Tag | None]:
    return [Tag(state, attention) if is_f32(a) else None for a in out_avals]

  treatment, rule_class = _value_treatment(p, op_class, floats)
  if treatment == "constant":  # computed from constants only: a constant
    p.log.record(name, "constant", untouched=size)
    exact = op_class == "exact" and all(t.state == CONST_ROUNDED for t in floats)
    return outs, tagged(CONST_ROUNDED if exact and floats else CONST)
  if treatment == "exact":  # the result is one of the inputs' values: never rounded
    p.log.record(name, op_class, untouched=size)
    return outs, tagged(join_all(floats).state)
  if treatment == "round":
    p.log.record(name, rule_class, rounded=size)
    outs = [p.round_result(o, rule_class) if is_f32(a) else o for o, a in zip(outs, out_avals)]
    return outs, tagged(ROUNDED)
  p.log.record(name, rule_class, kept_float32=size)
  return outs, tagged(FLOAT32)


def _other_dtype_values(eqn: Any, op_class: str) -> list[Tag]:
  """A raw tag per input of ``eqn`` that is a value of another dtype than float32 (complex, integer,
  bool, 16-bit: an argument, or a result computed from one; not a literal).

  The pass keeps no state for such values, so a float32 result computed from one (``abs`` of a
  complex value, ``pow`` with an integer exponent array, a ``scatter_add`` at integer indices) is
  a value, rounded like any other, not a constant. Integer and bool inputs of an exact op only
  select or order its float32 inputs (``select_n``'s predicate, ``sort``'s keys): its result is
  still one of those inputs' values, so they add nothing.
  """
  tags = []
  for atom in eqn.invars:
    if isinstance(atom, compat.Literal) or is_f32(atom.aval) or getattr(atom.aval, "dtype", None) is None:
      continue
    if op_class == "exact" and not jnp.issubdtype(atom.aval.dtype, jnp.inexact):
      continue
    tags.append(RAW_TAG)
  return tags


def _is_complex(aval: Any) -> bool:
  dtype = getattr(aval, "dtype", None)
  return dtype is not None and jnp.issubdtype(dtype, jnp.complexfloating)


def _value_treatment(p: Pass, op_class: str, floats: list[Tag]) -> tuple[str, str]:
  """(treatment, rule class) of a value op whose float32 inputs have tags ``floats``:
  ``"constant"``, ``"exact"``, ``"round"`` or ``"float32"``."""
  if all(t.state in CONSTANTS for t in floats):
    return "constant", op_class
  if op_class == "exact":
    return "exact", op_class
  attention = any(t.attention for t in floats)
  if op_class == "elementwise" and all(t.state in (FLOAT32, *CONSTANTS) for t in floats):
    # (reported in its class: scores divided by sqrt(d) at level 0 or 1 are attention_softmax work)
    return "float32", "attention_softmax" if attention else op_class
  if op_class not in ("elementwise", "transcendental", "reduction"):
    return "unknown", op_class
  rule_class = "attention_softmax" if attention else op_class
  return ("round" if p.rules[rule_class] == "round" else "float32"), rule_class
