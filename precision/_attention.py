"""Attention, recognised by structure: which ``dot_general`` equations are score products
(module docstring of `precision.autocast`, op class ``attention_matmul``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from precision import _jax_compat as compat
from precision._op_classes import PRIMITIVE_CLASSES
from precision.formats import float32

# ---- attention: recognised by structure ----


class _Facts(NamedTuple):
  """Per variable: score-product candidates it is derived from (``dots``), and those of
  which it is an ``exp``, a sum of an ``exp``, or a softmax; and the equations with a literal
  ``+-finfo(float32).max`` it is derived from without a matrix product between (``extremes``)."""

  dots: frozenset = frozenset()
  exps: frozenset = frozenset()
  sums: frozenset = frozenset()
  softmax: frozenset = frozenset()
  extremes: frozenset = frozenset()


_NO_FACTS = _Facts()
_KEEP_ALL = ("data_movement", "cast", "exact", "control_flow")


# A comparison or a clamp with float32's largest number tests a float32 value (an overflow count,
# ``clip(x, -finfo.max, finfo.max)``): its literal keeps its value.
_NOT_EXTREMES = frozenset({"lt", "le", "gt", "ge", "eq", "ne", "max", "min", "clamp"})


def extreme_literal(eqn: Any) -> bool:
  """Whether ``eqn`` has a literal ``+-finfo(float32).max`` that the interpreter may swap for the
  compute format's (not in a comparison, ``max``, ``min`` or ``clamp``: `_NOT_EXTREMES`)."""
  return eqn.primitive.name not in _NOT_EXTREMES and any(extreme_atom(atom) for atom in eqn.invars)


def extreme_atom(atom: Any) -> bool:
  """Whether ``atom`` is a 0-d float32 literal ``+-finfo(float32).max``."""
  return (
    isinstance(atom, compat.Literal)
    and getattr(atom.aval, "dtype", None) == np.float32
    and np.ndim(atom.val) == 0
    and abs(float(atom.val)) == float32.max
  )


def _union(facts: Sequence[_Facts]) -> _Facts:
  if not facts:
    return _NO_FACTS
  return _Facts(*(frozenset().union(*(getattr(f, k) for f in facts)) for k in _Facts._fields))


def find_attention(
  jaxpr: compat.Jaxpr,
  in_facts: Sequence[_Facts | None],
  found: set[int],
  seen: set[int],
  meets: dict[int, set[int]] | None = None,
) -> list:
  """Forward data flow over ``jaxpr`` (and the jaxprs inside it): adds to ``found`` the
  ids of the score products (module docstring) and returns the output variables' facts.

  ``meets`` (if given) maps the id of each equation with a literal ``+-finfo(float32).max``
  (`extreme_literal`) whose result reaches an equation that also reads a score-product
  candidate's result (a mask bias added to the scores or selected into them) to those
  candidates' ids: the interpreter swaps the literal where one of them is a score product."""
  seen.add(id(jaxpr))
  meets = {} if meets is None else meets
  env: dict[Any, _Facts] = {}

  def get(atom: Any) -> _Facts:
    return _NO_FACTS if isinstance(atom, compat.Literal) else env.get(atom, _NO_FACTS)

  for var, facts in zip(jaxpr.invars, in_facts):
    env[var] = facts or _NO_FACTS
  for eqn in jaxpr.eqns:
    ins = [get(a) for a in eqn.invars]
    if extreme_literal(eqn):  # the literal is derived from this equation (a jit's body reads it too)
      own = frozenset((id(eqn),))
      ins = [f._replace(extremes=own) if extreme_atom(a) else f for a, f in zip(eqn.invars, ins)]
    name = eqn.primitive.name
    outs = _sub_jaxpr_facts(eqn, ins, found, seen, meets)
    if outs is None:
      merged = _union(ins)
      op_class = PRIMITIVE_CLASSES.get(name, "unknown")
      extremes = merged.extremes
      if op_class != "matmul" and merged.dots:
        for site in extremes:  # a bias meets the scores (or the literal is in an equation on them)
          meets.setdefault(site, set()).update(merged.dots)
      if name == "dot_general":
        for facts in ins:
          found.update(facts.softmax)
        out = _Facts(dots=frozenset((id(eqn),)))
      elif op_class == "matmul":
        out = _NO_FACTS
      elif name == "exp":
        out = _Facts(dots=merged.dots, exps=merged.dots, extremes=extremes)
      elif name == "reduce_sum":
        out = _Facts(dots=merged.dots, sums=merged.exps, extremes=extremes)
      elif name == "div" and len(ins) == 2:
        softmax = (ins[0].exps & ins[1].sums) | ins[0].softmax
        out = _Facts(dots=merged.dots, softmax=softmax, extremes=extremes)
      elif name == "mul":
        out = _Facts(dots=merged.dots, softmax=merged.softmax, extremes=extremes)
      elif op_class in _KEEP_ALL:
        out = merged._replace(extremes=extremes)
      else:
        out = _Facts(dots=merged.dots, extremes=extremes)
      outs = [out] * len(eqn.outvars)
    for var, facts in zip(eqn.outvars, outs):
      env[var] = facts
  return [get(a) for a in jaxpr.outvars]


def _sub_jaxpr_facts(
  eqn: Any, ins: list[_Facts], found: set[int], seen: set[int], meets: dict[int, set[int]] | None = None
) -> list | None:
  """Facts of a higher-order equation's outputs, from its body; None for other equations."""
  params, name = eqn.params, eqn.primitive.name

  def run(closed: Any, facts: Sequence[_Facts]) -> list:
    jaxpr, _ = compat.split_closed(closed)
    padded = [_NO_FACTS] * (len(jaxpr.invars) - len(facts)) + list(facts)
    return find_attention(jaxpr, padded, found, seen, meets)

  calls = ("jit", "pjit", "remat2", "checkpoint", "shard_map", "custom_jvp_call", "custom_vjp_call")
  if name in calls or name in compat.CALL_PRIMITIVES:
    return run(compat.call_jaxpr(eqn), ins)
  if name == "cond":
    results = [run(b, ins[1:]) for b in compat.cond_branches(params)]
    return [_union(list(fs)) for fs in zip(*results)]
  if name == "scan":
    n_consts, n_carry = compat.scan_counts(params)
    carry = ins[n_consts : n_consts + n_carry]
    for _ in range(2):  # the carry's facts after one and two iterations
      outs = run(compat.scan_body(params), ins[:n_consts] + carry + ins[n_consts + n_carry :])
      carry = [_union([a, b]) for a, b in zip(carry, outs[:n_carry])]
    return carry + outs[n_carry:]
  if name == "while":
    nc, nb = compat.while_counts(params)
    carry = ins[nc + nb :]
    for _ in range(2):
      carry = [_union([a, b]) for a, b in zip(carry, run(params["body_jaxpr"], ins[nc : nc + nb] + carry))]
    return carry
  return None
