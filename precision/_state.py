"""The pass's state: what it knows of each value (`Tag`), the lattice of those states, and the
`Pass` (policy, rounding helpers, counters) that every part of the interpreter shares."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from precision import rounding as _rounding
from precision.cast_report import CastLog
from precision.formats import FloatFormat, float32
from precision.policy import RULE_CLASSES, Policy, PolicyError

ROUNDED, FLOAT32, RAW = "rounded", "float32", "raw"
CONST, CONST_ROUNDED = "constant", "constant_rounded"  # constants: not / exactly representable
CONSTANTS = (CONST, CONST_ROUNDED)
FLOAT32_SCOPE = "precision.float32_region"
NESTED_SCOPE = "precision.autocast_region"


class Tag(NamedTuple):
  """What the pass knows about a float32 value (None for other dtypes)."""

  state: str  # ROUNDED, FLOAT32, RAW, CONST or CONST_ROUNDED
  attention: bool = False


RAW_TAG = Tag(RAW)


class Pass:
  """Policy, counters and caches of one run of the pass."""

  def __init__(
    self,
    policy: Policy,
    log: CastLog | None = None,
    score_dots: set[int] | None = None,
    observer: Callable[..., None] | None = None,
  ):
    self.policy = policy
    self.observer = observer  # tests: called with (eqn, inputs, input tags, outputs, output tags)
    self.fmt: FloatFormat = policy.compute
    # compute="float32" is the identity: every class is kept float32 (no chunking either).
    self.rules = policy.rule_table if policy.is_mixed else dict.fromkeys(RULE_CLASSES, "float32")
    self.block = policy.accumulation_block
    self.log = CastLog() if log is None else log
    self.score_dots: set[int] = set() if score_dots is None else score_dots  # id(eqn) of score products
    self.analysed: set[int] = set()  # id(jaxpr) already searched for attention
    # Stochastic rounding: the classes (none for a float32 policy), the key of this pass's
    # stream (set by `autocast`'s caller through ``rounding_key=``) and the next site index.
    self.stochastic: frozenset[str] = frozenset(policy.stochastic if policy.is_mixed else ())
    self.key: jax.Array | None = None
    self.sites = 0
    # what a literal +-finfo(float32).max that reaches attention scores stands for (`_extremes`): the
    # compute format's largest number where the attention scores, which a mask bias joins, are rounded
    self.extreme: float = self.fmt.max if self.rules["attention_softmax"] == "round" else float32.max
    # id(equation with such a literal) -> ids of the score-product candidates its result meets
    self.extreme_meets: dict[int, set[int]] = {}
    # integer values made of random bits (``random_bits`` and integer ops on them), by id, each kept
    # alive beside its id: a float32 bitcast from them is a random draw (`precision._interpreter`)
    self.random_bits: dict[int, Any] = {}
    self.random_outputs: tuple[int, ...] = ()  # the last interpreted jaxpr's results that are random bits
    # the rounded matrix-product operands of the jaxpr being interpreted (variable -> rounded value),
    # set by `interpret` before a higher-order primitive's handler runs: a body shares them (`hoist`)
    self.memo: dict[Any, jax.Array] = {}

  def child(self) -> Pass:
    """A pass for a sub-jaxpr; its rounding stream is a fresh site of this one's."""
    child = Pass(self.policy, CastLog(), self.score_dots, self.observer)
    child.analysed = self.analysed
    child.extreme = self.extreme
    child.extreme_meets = self.extreme_meets
    child.random_bits = self.random_bits
    if self.stochastic and self.key is not None:
      child.key = self.site_key()
    return child

  def site_key(self) -> jax.Array:
    """The key of the next rounding site: ``fold_in(key, site index)`` (trace order)."""
    if self.key is None:
      raise PolicyError(
        f"policy {str(self.policy)!r} rounds {'+'.join(sorted(self.stochastic))} stochastically, but no "
        "rounding key reached the pass: call the autocast function with rounding_key=<a PRNG key> "
        "(numerics_report does not take one: use a policy without stochastic= there)."
      )
    site, self.sites = self.sites, self.sites + 1
    return jax.random.fold_in(self.key, site)

  def round_class(self, x: jax.Array, rule_class: str) -> jax.Array:
    """``x`` rounded to the compute format for an equation of ``rule_class``: stochastically
    (one fresh site) if the policy says so, else to nearest even."""
    if rule_class not in self.stochastic:
      return self.round(x)
    return _rounding.round_stochastic_linear(x, self.fmt, self.site_key())

  def round_result(self, x: jax.Array, rule_class: str) -> jax.Array | Deferred:
    """The rounding of an equation's result: as `round_class`, except that a nearest-even one
    is returned `Deferred`, bound by `interpret` once its consumer is known (see
    `_rounds_cotangent`)."""
    if rule_class in self.stochastic or not SKIP_ROUNDED_COTANGENTS:
      return self.round_class(x, rule_class)
    return Deferred(x)

  def round_to(self, x: jax.Array, fmt: FloatFormat, primitive: str | None = None) -> jax.Array:
    if fmt == float32:
      return x
    if primitive is not None:
      self.log.record(primitive, "output", rounded=numel(x))
    return _rounding.round_p.bind(x, fmt=fmt, mode="nearest_even")

  def round(self, x: jax.Array) -> jax.Array:
    return self.round_to(x, self.fmt)


class Deferred(NamedTuple):
  """A nearest-even rounding of ``value`` to the compute format, not bound yet."""

  value: jax.Array

  def bind(self, p: Pass, cotangent_rounded: bool = False) -> jax.Array:
    params = {"ct_rounded": True} if cotangent_rounded else {}
    return _rounding.round_p.bind(self.value, fmt=p.fmt, mode="nearest_even", **params)


# A rounding whose cotangent is provably already rounded keeps ``ct_rounded=True`` (its
# transpose passes the cotangent on unchanged; see `_rounds_cotangent`). A switch for tests,
# which check that the results do not depend on it.
SKIP_ROUNDED_COTANGENTS = True


def is_f32(aval: Any) -> bool:
  return getattr(aval, "dtype", None) == jnp.float32


def numel(x: Any) -> int:
  return math.prod(getattr(x, "shape", ()))


# The states form a lattice: CONST_ROUNDED < ROUNDED < RAW and CONST_ROUNDED < CONST < FLOAT32 < RAW.
_JOIN = {
  frozenset((ROUNDED, CONST_ROUNDED)): ROUNDED,
  frozenset((CONST, CONST_ROUNDED)): CONST,
  frozenset((FLOAT32, CONST)): FLOAT32,
  frozenset((FLOAT32, CONST_ROUNDED)): FLOAT32,
}


def join(a: Tag | None, b: Tag | None) -> Tag | None:
  if a is None or b is None:
    return a if b is None else b
  state = a.state if a.state == b.state else _JOIN.get(frozenset((a.state, b.state)), RAW)
  return Tag(state, a.attention or b.attention)


def join_all(tags: Sequence[Tag | None]) -> Tag:
  present = [t for t in tags if t is not None]
  if not present:
    return RAW_TAG
  return functools.reduce(join, present)  # type: ignore[return-value]


def region_of(name_stack: Any) -> str | None:
  text = str(name_stack)
  if FLOAT32_SCOPE in text:
    return "float32_region"
  if NESTED_SCOPE in text:
    return "nested_autocast"
  return None


def join_all_opt(tags: Sequence[Tag | None]) -> Tag | None:
  return None if all(t is None for t in tags) else join_all(tags)


# Handlers of higher-order primitives (name -> handler(p, eqn, values, tags) -> (outs, tags)),
# registered by `precision._control_flow` when it is imported.
HIGHER_ORDER: dict[str, Callable[..., tuple[list, list]]] = {}
