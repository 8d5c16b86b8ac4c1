"""Walking a jaxpr into *sites*: the leaf equations with their scopes, loop multiplicity and costs.

Used by `wafer.costmodel.graph`. The walk recurses through ``jit``/``pjit``, ``closed_call``,
``custom_jvp``/``custom_vjp``, ``remat``, ``shard_map`` (times the mesh size), ``scan`` (times its
length), ``while`` (the body once) and ``cond`` (the most expensive branch), tracks which values are
parameters (through view ops such as transposes and casts) and which depend on the batch, and
classifies each leaf equation: matrix product, element-wise, transcendental, reduction, cast,
data movement, or no work (integer arithmetic, reshapes). It also follows position indices (``iota``) to
the comparisons that make a triangular (causal) mask, and that mask through logical ops, casts and
``select`` to where it meets per-sample data. A mask made from positions and constants alone has a
value at trace time: where it meets per-sample data, the walk evaluates it (`Walker._kept`) and
records the fraction of entries it keeps (`Site.kept`: (s + 1) / (2 s) for causal, about w / s for a
window of w); a causal mask whose value it cannot evaluate keeps half. A call that bitcasts a float
to an integer and back (a *fake cast*, another library's emulated format) is one cast. The roundings
of `precision` (``precision_round``, ``precision_round_bits``: what `precision.autocast` inserts, and
`precision.round`) are views that cost nothing: they emulate the format the wafer computes in, so a
step under autocast gets the estimate of the same step in its compute format.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from precision import _jax_compat as compat
from wafer.costmodel import batchflow

__all__ = ("Site", "Walker", "classify")

# fmt: off
_FREE = frozenset({
    "reshape", "squeeze", "expand_dims", "broadcast_in_dim", "stop_gradient", "bitcast_convert_type",
    "sharding_constraint", "pvary", "optimization_barrier", "iota", "copy_p", "device_put", "name",
    "mesh_cast", "reshard", "unreduced_psum", "create_token", "axis_index", "xla_metadata_value",
    "host_local_array_to_global_array", "global_array_to_host_local_array", "relayout",
    "with_memory_space_constraint",
})
_TRANSCENDENTAL = frozenset({
    "exp", "exp2", "log", "log2", "log1p", "expm1", "tanh", "logistic", "erf", "erfc", "erf_inv", "sin", "cos",
    "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh", "asinh", "acosh", "atanh", "sqrt", "rsqrt",
    "cbrt", "div", "pow", "lgamma", "digamma", "igamma", "igammac", "bessel_i0e", "bessel_i1e",
})
_REDUCE = frozenset({
    "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "argmax", "argmin", "cumsum", "cummax",
    "cummin", "cumprod", "cumlogsumexp", "reduce_and", "reduce_or", "reduce_xor", "psum", "pmax", "pmin",
})
_MOVE = frozenset({
    "transpose", "concatenate", "pad", "slice", "dynamic_slice", "dynamic_update_slice", "gather",
    "scatter", "scatter-add", "scatter_add", "scatter-mul", "scatter_mul", "scatter-min", "scatter-max",
    "select_and_scatter_add", "select_and_gather_add", "sort", "rev", "copy", "split", "all_gather",
    "all_to_all", "ppermute", "reduce_scatter", "top_k", "stack", "unstack",
})
# View-like ops: a parameter seen through them is still the same parameter (same root).
_VIEW = frozenset({
    # (``pad``: a weight zero-padded to whole chunks, as autocast's chunked accumulation does)
    "pad", "transpose", "reshape", "convert_element_type", "broadcast_in_dim", "squeeze", "expand_dims", "copy",
    "copy_p", "bitcast_convert_type", "reduce_precision", "precision_round", "precision_round_bits",
    "sharding_constraint", "pvary", "stop_gradient", "xla_metadata_value",
})
# Slices of a parameter that are parameters themselves (``stacked[i]`` in an unrolled loop).
_SLICE = frozenset({"slice", "dynamic_slice", "gather", "index_in_dim", "squeeze", "unstack"})
# Data movement that joins parameters into one (``jnp.stack`` of the layers' weights inside the step,
# then a ``lax.scan`` over them, as ``models/common.py``'s ``run_layers``): the result is a parameter.
_JOIN = frozenset({"concatenate", "stack"})
# Ops that keep the axes a value varies along (a position index, a mask) where they are.
_SAME_AXES = frozenset({
    "slice", "dynamic_slice", "convert_element_type", "copy", "copy_p", "neg", "rev", "reduce_precision",
    "precision_round", "sharding_constraint", "pvary", "stop_gradient", "optimization_barrier",
})
_INDEX_ARITH = frozenset({"add", "sub", "mul", "max", "min", "rem", "div", "neg", "abs"})
_ORDER = frozenset({"lt", "le", "gt", "ge"})  # i >= j on two position indices: a triangle
_INDEX_SELECT = frozenset({"eq", "ne", "select_n", "clamp", "and", "or", "not"})  # (jnp.take's wrap)
_LOGICAL = frozenset({"and", "or", "not"})
# Random numbers: made from a key where they are used (a dropout mask is regenerated from its seed),
# so a value derived from a key alone holds no more than the key (`Walker.elements`).
_RANDOM = frozenset({
  "random_bits", "random_seed", "random_wrap", "random_unwrap", "random_fold_in", "random_split",
  "threefry2x32", "rng_bit_generator", "rng_uniform",
})
# Where a mask meets the scores: ``scores + bias`` (an additive mask), ``scores * mask``.
_APPLY = frozenset({"add", "sub", "mul", "add_any"})
# Not evaluated at trace time even on constant operands: random bits, products, collectives, effects.
_NOT_EVALUATED = compat.PRODUCT_PRIMITIVES | frozenset({
  "random_bits", "random_seed", "random_wrap", "random_unwrap",
  "random_fold_in", "random_split", "threefry2x32", "rng_bit_generator", "rng_uniform", "psum", "pmax",
  "pmin", "all_gather", "all_to_all", "ppermute", "reduce_scatter", "axis_index", "create_token",
  "debug_callback", "pure_callback", "io_callback", "infeed", "outfeed", "name",
})
_NUMPY_UNARY = {
  "neg": np.negative, "abs": np.abs, "sign": np.sign, "not": np.invert, "floor": np.floor, "ceil": np.ceil,
  "exp": np.exp, "exp2": np.exp2, "log": np.log, "log1p": np.log1p, "sqrt": np.sqrt, "sin": np.sin,
  "cos": np.cos, "tanh": np.tanh, "square": np.square, "is_finite": np.isfinite,
  "rsqrt": lambda x: 1 / np.sqrt(x), "one_minus_square": lambda x: 1 - np.square(x), "log2": np.log2,
}
_NUMPY_BINARY = {
  "add": np.add, "add_any": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum,
  "min": np.minimum, "rem": np.fmod, "pow": np.power, "and": np.bitwise_and, "or": np.bitwise_or,
  "xor": np.bitwise_xor, "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
  "gt": np.greater, "ge": np.greater_equal, "shift_left": np.left_shift,
  "shift_right_arithmetic": np.right_shift,
}
_NUMPY_SAME = frozenset({
  "copy", "copy_p", "pvary", "sharding_constraint", "optimization_barrier", "reduce_precision",
  "stop_gradient", "convert_element_type",
})
# fmt: on
# A mask's value is evaluated up to this many elements (a 4096 x 4096 mask); a larger one is costed by
# its structure alone (half, where causal).
_VALUE_CAP = 1 << 24
_REMOVED = -1e4  # a bias at or below this removes a score: finfo.min, -inf, -1e9, BERT's -10000.0
# Names JAX itself pushes on the name stack: not the user's scopes. ``jax.checkpoint`` runs the
# recomputed forward of every rematerialized block under ``rematted_computation``; kept, it would
# gather the recomputation of all layers into one kernel.
_JAX_SCOPES = frozenset({"rematted_computation"})


@dataclasses.dataclass
class Site:
  """One leaf equation in context. The walk yields sites in the same order for any batch size, so the
  sites of two traces can be compared one to one."""

  kind: str  # matmul, vector, transcendental, reduce, move, cast
  scopes: tuple[str, ...]
  transposed: bool
  mult: int
  in_keys: tuple[int, ...]
  out_keys: tuple[int, ...]
  measures: tuple[float, ...]  # matmul: (instances, m, k, n); move: (bytes,); else (elements,)
  in_shapes: tuple[tuple[int, ...], ...]  # aligned with in_keys
  out_shapes: tuple[tuple[int, ...], ...]  # aligned with out_keys
  bits: int  # dtype bits of the data
  weight_roots: tuple[int, ...] = ()  # roots of parameter operands
  ops: float = 1.0  # vector ops per element (integer_pow)
  # the fraction of the output's entries a mask applied here keeps (1.0: none applied): a select by
  # a constant predicate, a sum with a constant bias, a product with a constant 0/1 mask, evaluated
  # where the mask's value is known (`Walker._kept`); 0.5 for a causal one whose value is not (a
  # triangular comparison of positions, `Walker._mask_flow`, or a constant predicate it cannot read)
  kept: float = 1.0
  # the batch's exponent in each of ``measures`` and whether the site touches per-sample data, found
  # by following the batch axes from the arguments (`wafer.costmodel.batchflow`); None where the walk
  # could not follow them (`Walker.batch_unknown`)
  batch_exps: tuple[int, ...] | None = None
  batch_per_sample: bool = False
  # a forward pass the step recomputes in its backward (``jax.checkpoint``, ``nn.remat``): time, but
  # not model FLOPs
  recomputed: bool = False

  @property
  def masked(self) -> bool:
    """Whether a mask applied here keeps only part of the output."""
    return self.kept < 1.0


class Walker:
  """Walks a closed jaxpr into `Site`s, tracking parameter roots through view ops."""

  def __init__(self, n_invars: int, param_invars: Sequence[bool], batch: int | None = None):
    self.sites: list[Site] = []
    self.batch = batch  # the traced batch b0 (`batchflow.out_axes`)
    self.next_key = 0
    self.root: dict[int, int] = {}  # key -> root key of a parameter
    self.origin: dict[int, int] = {}  # root key -> the argument's array it was sliced from (itself if none)
    # root key of a parameter the step joined from others (`_JOIN`) -> the roots it holds, so that
    # its elements and theirs are counted once (`wafer.costmodel.graph.extract`)
    self.parts: dict[int, frozenset[int]] = {}
    # key -> elements of the parameter it holds: a broadcast (a bias added to every token) reads no
    # more of the parameter than its input (`wafer.costmodel.graph._root_elements`)
    self.param_size: dict[int, int] = {}
    # key -> how many distinct values of its parameter the loops around it hold: the product of the
    # lengths of the loops that slice it per iteration (a scan's ``xs``, a slice inside a loop body);
    # absent: 1, one array. A weight a loop closes over (an RNN's, a layer shared ALBERT-style) is
    # the same array in every iteration: one parameter, streamed once (`wafer.costmodel.graph._root_elements`)
    self.distinct: dict[int, int] = {}
    self.data: set[int] = set()  # keys that depend on the batch arguments
    self.notes: set[str] = set()
    self.alias: dict[int, int] = {}  # output of a no-cost op (reshape...) -> its data input
    # a value some view reads (`alias`'s targets) -> its own element count: a broadcast of it (an
    # attention mask broadcast to every head and query) holds no more data than it
    # (a value some non-view integer work derives from counts as many as the largest derivation)
    self.elements: dict[int, int] = {}
    self.random: set[int] = set()  # values random bits are made from (`_RANDOM`): keys, seeds
    # a key made at a scan boundary (an iteration's slice of ``xs``, an output of the loop) -> the
    # key its values come from: the data flow across loops (`wafer.costmodel.graph._masked_products`)
    self.flow: dict[int, int] = {}
    # key -> axes a position index varies along (values computed from ``iota`` and literals alone)
    self.index: dict[int, frozenset[int]] = {}
    # keys holding a causal mask or a value made from one alone (the bias ``where(tril, 0, -inf)``);
    # a mask combined with per-sample padding (``and``) is still causal
    self.causal: set[int] = set()
    # position values symmetric in their axes (``abs(i - j)``): an order comparison of one is a band
    # around the diagonal (bidirectional local attention), not a triangle
    self.symmetric: set[int] = set()
    # key -> how to compute its value from positions, literals and constants alone: ``(equation,
    # operands, output keys)``, an operand a key or ``(value,)``. Evaluated lazily (`_value`), only
    # where such a value meets per-sample data; ``value`` keeps the results (None: not evaluable)
    self.recipe: dict[int, tuple[Any, tuple[Any, ...], tuple[int, ...]]] = {}
    self.value: dict[int, np.ndarray | None] = {}
    # memoized evaluations and kept fractions, with the operands they read (kept alive: ids stay theirs)
    self._memo: dict[tuple[Any, ...], tuple[tuple[Any, ...], Any]] = {}
    self._literals: dict[tuple[Any, ...], np.ndarray] = {}
    self.eqn_count = 0
    self.rematted = 0  # depth of jax.checkpoint's recomputed forward around the equation walked
    # key -> the axes of its value that carry the batch (`wafer.costmodel.batchflow`); the first
    # equation whose batch axes could not be followed, if any
    self.baxes: dict[int, frozenset[int]] = {}
    self.batch_unknown: str | None = None
    self._fake_cast_cache: dict[int, bool] = {}
    self.top_keys = [self._new() for _ in range(n_invars)]
    for key, is_param in zip(self.top_keys, param_invars):
      if is_param:
        self.root[key] = key
      else:
        self.data.add(key)

  def _new(self) -> int:
    self.next_key += 1
    return self.next_key

  def walk(
    self,
    jaxpr: compat.Jaxpr,
    in_keys: Sequence[int | None],
    scopes: tuple[str, ...],
    transposed: bool,
    mult: int,
    consts: Sequence[Any] = (),
    in_values: Sequence[Any] = (),
  ) -> list[int]:
    env: dict[Any, int | None] = {}
    literal: dict[Any, tuple[np.ndarray]] = {}  # invars the caller passed a literal (``in_values``)
    for i, (var, key) in enumerate(zip(jaxpr.invars, in_keys)):
      env[var] = key
      if key is not None and key in self.data and key not in self.baxes:  # a batch argument's leaf
        shape = tuple(getattr(var.aval, "shape", ()))
        raw_key = shape == (2,) and getattr(var.aval, "dtype", None) == np.uint32
        self.baxes[key] = frozenset({0}) if shape and not raw_key else frozenset()
      if key is not None and key in self.root:  # a parameter, or one iteration's slice of a stack
        self.param_size[key] = min(self.param_size.get(key, math.inf), _size(var.aval))
      if key is None and i < len(in_values) and isinstance(in_values[i], tuple):
        literal[var] = in_values[i]
    for i, var in enumerate(jaxpr.constvars):
      env[var] = self._new()
      if i < len(consts) and _triangular(consts[i]):  # a mask closed over as a NumPy constant
        self.causal.add(env[var])
      if i < len(consts):
        self.recipe[env[var]] = (("const", var.aval, None), ((consts[i],),), (env[var],))
    for eqn in jaxpr.eqns:
      self.eqn_count += 1
      ins = tuple(None if isinstance(v, compat.Literal) else env.get(v) for v in eqn.invars)
      refs = tuple(self._ref(v, env, literal) for v in eqn.invars)
      e_scopes, e_transposed = self._context(eqn, scopes, transposed)
      stack = getattr(eqn.source_info.name_stack, "stack", ())
      recomputing = any(str(getattr(item, "name", "")) == "rematted_computation" for item in stack)
      self.rematted += recomputing
      try:
        outs = self._eqn(eqn, ins, refs, e_scopes, e_transposed, mult)
      finally:
        self.rematted -= recomputing
      for var, key in zip(eqn.outvars, outs):
        env[var] = key
    return [None if isinstance(v, compat.Literal) else env.get(v) for v in jaxpr.outvars]

  def _ref(self, var: Any, env: dict[Any, int | None], literal: dict[Any, tuple[np.ndarray]]) -> Any:
    """An operand whose value positions and constants alone determine: its key, ``(value,)`` for a
    literal; None for any other."""
    if isinstance(var, compat.Literal):
      return self._literal(var.val, var.aval)
    if var in literal:
      return literal[var]
    key = env.get(var)
    return key if key is not None and key in self.recipe else None

  def _literal(self, val: Any, aval: Any) -> tuple[np.ndarray] | None:
    """A literal as a NumPy value, one object per distinct literal (so that `_evaluate` memoizes)."""
    try:
      arr = np.asarray(val, dtype=getattr(aval, "dtype", None))
    except Exception:  # noqa: BLE001 (an extended dtype: no NumPy value)
      return None
    if arr.size > 64:
      return (arr,)
    return (self._literals.setdefault((arr.dtype.str, arr.shape, arr.tobytes()), arr),)

  @staticmethod
  def _context(eqn: Any, scopes: tuple[str, ...], transposed: bool) -> tuple[tuple[str, ...], bool]:
    stack = getattr(eqn.source_info.name_stack, "stack", ())
    names = list(scopes)
    crossed = False  # a transform since the last scope name
    segment = 0  # where the names since the last transform begin
    replay: int | None = None  # the next name of a segment seen again
    for item in stack:
      kind = type(item).__name__
      if kind == "Transform":
        crossed = True
        if item.name == "transpose":
          transposed = True
      elif item.name and "->" not in str(item.name) and str(item.name) not in _JAX_SCOPES:
        # (jnp.einsum names its call by its spec: not a scope). The same scopes seen again through
        # another transform are the same scopes: flax's nn.remat in the backward pass is named
        # ``transpose(jvp(LM))/jvp(LM)/...``, not ``LM/LM/...``, and a remat'd layer deeper in the
        # module tree (Hugging Face's gradient checkpointing) ``transpose(jvp(M/bert/encoder/layer))
        # /jvp(M/bert/encoder/layer)/1/...``, not ``M/bert/encoder/layer/M/bert/encoder/layer/1/...``
        name = str(item.name)
        if crossed and segment < len(names) and names[segment] == name:
          replay = segment + 1
        elif replay is not None and replay < len(names) and names[replay] == name:
          replay += 1
        elif not (crossed and names and names[-1] == name):
          if crossed:
            segment = len(names)
          replay = None
          names.append(name)
        crossed = False
    return tuple(names), transposed

  def _fresh_outs(self, eqn: Any, ins: Sequence[int | None]) -> list[int]:
    outs = [self._new() for _ in eqn.outvars]
    if any(k in self.data for k in ins if k is not None):
      self.data.update(outs)
    return outs

  # -- one equation ---------------------------------------------------------------------------
  def _eqn(
    self,
    eqn: Any,
    ins: tuple[int | None, ...],
    refs: tuple[Any, ...],
    scopes: tuple[str, ...],
    transposed: bool,
    mult: int,
  ) -> list[int]:
    prim = eqn.primitive.name
    params = eqn.params
    if prim == "while" and any(self.baxes.get(k) for k in ins if k is not None):
      self._unknown(f"a {prim} over per-sample data")
    if prim == "scan":
      return self._scan(eqn, ins, scopes, transposed, mult)
    if prim == "while":
      return self._while(eqn, ins, refs, scopes, transposed, mult)
    if prim == "cond":
      return self._cond(eqn, ins, scopes, transposed, mult)
    inner = compat.call_jaxpr(eqn)
    if inner is not None:
      if self._is_fake_cast(eqn, inner):
        outs = self._fresh_outs(eqn, ins)
        self._flow_batch(eqn, ins, outs)
        self._propagate_root(ins, outs, eqn)
        self._site(eqn, "cast", ins, outs, scopes, transposed, mult)
        return outs
      inner_mult = mult
      if prim == "shard_map":
        mesh = params.get("mesh")
        inner_mult = mult * int(getattr(mesh, "size", 1) or 1)
        self.notes.add("shard_map bodies are counted once per device of their mesh")
      inner_jaxpr, consts = compat.split_closed(inner)
      n = len(inner_jaxpr.invars)
      keys = list(ins[-n:]) if n <= len(ins) else list(ins) + [None] * (n - len(ins))
      values = list(refs[-n:]) if n <= len(refs) else list(refs) + [None] * (n - len(refs))
      res = self.walk(inner_jaxpr, keys, scopes, transposed, inner_mult, consts, values)
      outs = [k if k is not None else self._new() for k in res]
      if any(k in self.data for k in ins if k is not None):
        # the body's own values are data or not as the walk found them (a constant it broadcast
        # and returned, as a linearized jit's residual, is not per-sample data); only outputs
        # without a key (a literal) are assumed to follow the inputs
        self.data.update(o for o, k in zip(outs, res) if k is None)
      return outs
    # a computation this walk does not handle is an error; what is left with sub-jaxprs are scalar
    # combiners (a generic select_and_scatter's): walked once
    known = (
      prim in _MOVE or prim in _REDUCE or prim in _TRANSCENDENTAL or prim.startswith(("reduce", "scatter"))
    )
    if not known and compat.is_higher_order(eqn):  # never walked past silently
      raise compat.unhandled(eqn, "the cost model")
    subs = list(compat.jaxprs_in_params(params)) if not known and _has_subjaxprs(params) else []
    outs = self._fresh_outs(eqn, ins)
    self._flow_batch(eqn, ins, outs)
    for sub in subs:
      self.notes.add(f"primitive {prim!r}: its sub-computations are counted once")
      sub_j, _ = compat.split_closed(sub)
      self.walk(sub_j, [None] * len(sub_j.invars), scopes, transposed, mult)
    if subs:
      return outs
    kind = classify(eqn)
    applies_mask = self._mask_flow(eqn, ins, outs)
    kept = self._values(eqn, ins, refs, outs)
    if kept is None and applies_mask:
      kept = 0.5  # a causal mask whose value is unknown (too large, or not evaluable): half
    if prim in _VIEW:
      self._propagate_root(ins, outs, eqn)
    elif prim in _SLICE and ins and ins[0] in self.root and not any(k in self.data for k in ins if k):
      held = self.param_size.get(ins[0], math.inf)
      by_position = any(k in self.index or k in self.causal for k in ins[1:] if k is not None)
      for o, var in zip(outs, eqn.outvars):
        if by_position or _size(var.aval) >= held:  # a table looked up at positions (``wpe(arange(s))``
          self.root[o] = self.root[ins[0]]  # broadcast over the batch): the table, no more
          self.param_size[o] = min(held, _size(var.aval))
          self._inherit_distinct(ins[0], o)
        else:  # one layer's slice of stacked parameters (an unrolled loop): a parameter itself
          self.root[o] = o
          self.origin[o] = self.origin.get(self.root[ins[0]], self.root[ins[0]])
          self.param_size[o] = _size(var.aval)
          if mult > 1:  # inside a loop body: indexed by the iteration (a fori_loop over stacked layers)
            self.distinct[o] = mult
    elif prim in _JOIN and self._joins_parameters(ins):
      # parameters stacked or concatenated inside the step (each layer's weight, expanded by a view):
      # a parameter itself, whose slices a scan reads as weights and whose gradient is a weight's. It
      # is an addressing of the parameters it joins, not work: each layer's stay where they are
      held = frozenset().union(*(self.parts.get(self.root[k], {self.root[k]}) for k in ins if k is not None))
      for o, var in zip(outs, eqn.outvars):
        self.root[o] = o
        self.param_size[o] = _size(var.aval)
        self.parts[o] = held
        if mult > 1:
          self.distinct[o] = mult
      return outs
    if kind is not None:
      self._site(eqn, kind, ins, outs, scopes, transposed, mult, kept)
    else:
      at = next((i for i, k in enumerate(ins) if k is not None), None)
      if at is not None:
        src = ins[at]
        base = self.alias.get(src, src)
        if src not in self.alias:  # the value itself: its own element count, before any view
          self.elements.setdefault(src, _size(eqn.invars[at].aval))
        if prim in _RANDOM:
          self.random.add(base)
        elif prim not in _VIEW and base not in self.random:  # integer or boolean work (a
          # concatenation, a comparison of two broadcasts: an s x s mask from s positions) holds
          # as many values as it makes
          self.elements[base] = max([self.elements[base], *(_size(v.aval) for v in eqn.outvars)])
        for o in outs:
          self.alias[o] = base
    return outs

  def _joins_parameters(self, ins: Sequence[int | None]) -> bool:
    """Whether every operand of a join is a parameter (a literal aside), none per-sample data."""
    keys = [k for k in ins if k is not None]
    return bool(keys) and all(k in self.root and k not in self.data for k in keys)

  def held(self, key: int, shape: Sequence[int]) -> float:
    """Elements of the value ``key`` holds, read with ``shape``: a view (a mask broadcast to every
    head) holds only the value it views (`elements`)."""
    return min(float(math.prod(shape)), self.elements.get(key, math.inf))

  def source(self, key: int) -> int:
    """The value ``key`` holds, followed through free views (`alias`) and across loop boundaries
    (`flow`): a scan's stacked residual read by its backward is its forward body's value."""
    seen = set()
    while key not in seen:
      seen.add(key)
      key = self.alias.get(key, key)
      if key not in self.flow:
        break
      key = self.flow[key]
    return key

  def _unknown(self, why: str) -> None:
    if self.batch_unknown is None:
      self.batch_unknown = why

  def _flow_batch(self, eqn: Any, ins: Sequence[int | None], outs: Sequence[int]) -> None:
    """The batch axes of a primitive's outputs (`batchflow.out_axes`)."""
    try:
      axes = batchflow.out_axes(eqn, [None if k is None else self.baxes.get(k) for k in ins], self.batch)
    except batchflow.Unknown as why:
      self._unknown(f"{eqn.primitive.name}: {why}")
      axes = [frozenset() for _ in outs]
    for o, a in zip(outs, axes):
      self.baxes[o] = a

  def _batch_exps(
    self, eqn: Any, kind: str, ins: Sequence[int | None], outs: Sequence[int]
  ) -> tuple[int, ...] | None:
    """The batch's exponent in each measure of a site (`Site.batch_exps`), None where not followed."""
    ax = [frozenset() if k is None else self.baxes.get(k, frozenset()) for k in ins]
    out_ax = [self.baxes.get(k, frozenset()) for k in outs]
    if kind == "matmul":
      if eqn.primitive.name == "conv_general_dilated":
        if any(ax):
          self._unknown("a convolution of per-sample data")
        return None
      (lc, rc), (lb, rb), group, _, _ = compat.dot_numbers(eqn)
      lhs_n, rhs_n = len(eqn.invars[0].aval.shape), len(eqn.invars[1].aval.shape)
      both = lambda ls, rs: sum(1 for dl, dr in zip(ls, rs) if dl in ax[0] or dr in ax[1])  # noqa: E731
      m = sum(1 for d in range(lhs_n) if d not in lc and d not in lb and d in ax[0])
      n = sum(1 for d in range(rhs_n) if d not in rc and d not in rb and d not in group and d in ax[1])
      return (both(lb, rb), m, both(lc, rc), n)
    if kind == "move":
      counts = {len(a) for a in out_ax}
    else:
      src = ax if kind == "reduce" else out_ax
      avals = [v.aval for v in (eqn.invars if kind == "reduce" else eqn.outvars)]
      if not avals:
        return (0,)
      big = max(_size(a) for a in avals)
      counts = {len(a) for a, v in zip(src, avals) if _size(v) == big}
    if len(counts) != 1:
      self._unknown(f"{eqn.primitive.name}: outputs that grow differently with the batch")
      return None
    return (counts.pop(),)

  def _propagate_root(self, ins: Sequence[int | None], outs: Sequence[int], eqn: Any) -> None:
    held = [k for k in ins if k is not None and k in self.root]
    if held and not any(k in self.data for k in ins if k is not None):
      size = self.param_size.get(held[0], math.inf)
      for o, var in zip(outs, eqn.outvars):
        self.root[o] = self.root[held[0]]
        self.param_size[o] = min(size, _size(var.aval))  # a view holds no more than its input
        self._inherit_distinct(held[0], o)

  def _inherit_distinct(self, src: int, dst: int) -> None:
    """``dst`` holds the same parameter values as ``src`` (a view, a carry, a table lookup)."""
    if src in self.distinct:
      self.distinct[dst] = self.distinct[src]

  def _site(
    self,
    eqn: Any,
    kind: str,
    ins: tuple[int | None, ...],
    outs: Sequence[int],
    scopes: tuple[str, ...],
    transposed: bool,
    mult: int,
    kept: float | None = None,
  ) -> None:
    in_avals = [v.aval for v in eqn.invars]
    out_avals = [v.aval for v in eqn.outvars]
    pairs = [
      (self.alias.get(k, k), tuple(getattr(v.aval, "shape", ())))
      for k, v in zip(ins, eqn.invars)
      if k is not None
    ]
    in_keys = tuple(k for k, _ in pairs)
    in_shapes = tuple(sh for _, sh in pairs)
    out_shapes = tuple(tuple(getattr(a, "shape", ())) for a in out_avals)
    ops = 1.0
    weight_roots: tuple[int, ...] = ()
    if kind == "matmul":
      measures = _matmul_measures(eqn)
      weight_roots = tuple(self.root[k] for k in ins[:2] if k is not None and k in self.root)
      bits = max(_bits(a) for a in in_avals[:2])
    elif kind == "move":
      measures = (float(sum(_nbytes(a) for a in out_avals)),)
      bits = max((_bits(a) for a in out_avals), default=32)
      weight_roots = tuple(self.root[k] for k in ins if k is not None and k in self.root)
    else:
      src = in_avals if kind == "reduce" else out_avals
      measures = (float(max((_size(a) for a in src), default=0)),)
      bits = max((_bits(a) for a in in_avals + out_avals if _is_float(a)), default=32)
      weight_roots = tuple(self.root[k] for k in ins if k is not None and k in self.root)
      if eqn.primitive.name == "integer_pow":
        ops = float(max(1, abs(int(eqn.params.get("y", 2))) - 1))
    if (
      kept is None
      and eqn.primitive.name == "select_n"
      and ins[0] is not None
      and ins[0] not in self.data
      and ins[0] not in self.root
      and any(k in self.data for k in ins[1:] if k is not None)
    ):
      kept = 0.5  # a select by a constant predicate whose value is unknown
    if kept is None or len(out_shapes[0]) < 2:
      kept = 1.0
    exps = self._batch_exps(eqn, kind, ins, outs)
    per_sample = any(self.baxes.get(k) for k in (*ins, *outs) if k is not None)
    self.sites.append(
      Site(
        kind,
        scopes,
        transposed,
        mult,
        in_keys,
        tuple(outs),
        measures,
        in_shapes,
        out_shapes,
        bits,
        weight_roots,
        ops,
        kept,
        exps,
        per_sample,
        self.rematted > 0,
      )
    )

  # -- causal masks ---------------------------------------------------------------------------
  def _mask_flow(self, eqn: Any, ins: tuple[int | None, ...], outs: Sequence[int]) -> bool:
    """Follow position indices and causal masks through one equation; whether it applies a causal
    mask to per-sample data.

    A position index is a value computed from ``iota`` and literals alone; ``self.index`` keeps the
    axes it varies along. An order comparison (``i >= j``) of indices that vary along two axes or more
    makes a causal mask (``jnp.tril``, ``nn.make_causal_mask``, ``arange(s)[:, None] >= arange(s)``).
    The mask stays causal through views, slices, casts, logical ops (``and`` with a padding mask),
    comparisons and arithmetic with constants, and a ``select`` it drives between constants (the
    additive bias ``where(mask, 0, finfo.min)``). Where it meets per-sample data that is not a mask
    (``select(mask, scores, -inf)``, ``scores + bias``, ``scores * mask``), the mask is applied: the
    result is data, not a mask. A padding mask (from the batch) or a learned bias (a parameter) never
    becomes causal.
    """
    prim = eqn.primitive.name
    if len(outs) != 1:
      return False
    out, params = outs[0], eqn.params
    shape_of = lambda v: tuple(getattr(v.aval, "shape", ()))  # noqa: E731
    if prim == "iota":
      self.index[out] = frozenset({int(params["dimension"])})
      return False
    keys = [k for k in ins if k is not None]
    if not keys:
      return False
    first = ins[0]
    if first in self.index and not any(k not in self.index for k in keys[1:] if k is not first):
      axes = self.index[first]
      moved: frozenset[int] | None = None
      if prim == "broadcast_in_dim" and len(keys) == 1:
        moved = frozenset(params["broadcast_dimensions"][a] for a in axes)
      elif prim == "reshape":
        moved = _reshape_axes(shape_of(eqn.invars[0]), shape_of(eqn.outvars[0]), axes)
      elif prim == "squeeze":
        gone = {d % len(shape_of(eqn.invars[0])) for d in params["dimensions"]}
        kept = [d for d in range(len(shape_of(eqn.invars[0]))) if d not in gone]
        moved = frozenset(kept.index(a) for a in axes if a in kept)
      elif prim == "transpose":
        moved = frozenset(i for i, a in enumerate(params["permutation"]) if a in axes)
      elif prim in _SAME_AXES and len(keys) == 1:
        moved = axes
      if moved is not None:
        self.index[out] = moved
        if first in self.symmetric:
          self.symmetric.add(out)
        return False
    if prim in _INDEX_ARITH or prim in _ORDER or prim in _INDEX_SELECT:
      if all(k in self.index for k in keys):
        axes = frozenset().union(*(self.index[k] for k in keys))
        symmetric = any(k in self.symmetric for k in keys)
        if prim in _ORDER and len(axes) >= 2 and not symmetric:
          self.causal.add(out)
        else:  # still a function of the positions (``where(i < 0, i + n, i)`` in ``jnp.take``)
          self.index[out] = axes
          if (prim == "abs" and len(axes) >= 2) or (symmetric and prim in _INDEX_ARITH and len(keys) == 1):
            self.symmetric.add(out)  # abs(i - j), and it scaled or shifted by constants
        return False
    causal = [k for k in keys if k in self.causal]
    if not causal:
      return False
    others = [k for k in keys if k not in self.causal]
    data = [k for k in others if k in self.data]
    if prim == "select_n":
      if first not in self.causal:
        return False
      if any(k in self.data for k in ins[1:] if k is not None and k not in self.causal):
        return True  # where(mask, scores, -inf)
      self.causal.add(out)  # where(mask, 0, -inf): the bias
      return False
    if prim in _LOGICAL:  # mask & padding, ~mask, mask | padding_out: still at least a triangle masked
      self.causal.add(out)
      return False
    if not data and (prim in _INDEX_ARITH or first in self.causal and prim in _VIEW | _SLICE | _SAME_AXES):
      self.causal.add(out)  # (1 - mask) * -1e9, the mask broadcast over heads (a table looked up
      return False  # at indices made from a comparison, T5's relative-position buckets, is not a mask)
    if prim in ("eq", "ne") or prim in _ORDER:
      if not data:
        self.causal.add(out)  # mask > 0, mask == 0
      return False
    return prim in _APPLY and bool(data)

  # -- mask values ----------------------------------------------------------------------------
  def _values(
    self, eqn: Any, ins: tuple[int | None, ...], refs: tuple[Any, ...], outs: Sequence[int]
  ) -> float | None:
    """Record how to compute the outputs of an equation whose operands positions and constants alone
    determine; where such a value (a mask) meets per-sample data, the fraction of entries it keeps.

    A mask combined with the batch's padding (``tril & padding``) keeps what the mask keeps (padding
    assumed to keep every position), and a constant bias plus a learned one (T5's decoder) removes
    what the constant one removes (a learned bias is finite). None where no mask of known value is
    applied here.
    """
    if eqn.primitive.name in _NOT_EVALUATED or _has_subjaxprs(eqn.params):
      return None
    known = [i for i, r in enumerate(refs) if r is not None]
    if len(known) == len(refs):
      for o in outs:
        self.recipe[o] = (eqn, refs, tuple(outs))
      return None
    if not known or len(outs) != 1 or len(getattr(eqn.outvars[0].aval, "shape", ())) < 2:
      return None
    prim = eqn.primitive.name
    unknown = [i for i, r in enumerate(refs) if r is None]
    data = [i for i in unknown if ins[i] in self.data]
    out_dtype = getattr(eqn.outvars[0].aval, "dtype", None)
    if prim == "and" and out_dtype == np.bool_ and data == unknown:  # the mask & the batch's padding
      self.recipe[outs[0]] = (("and", eqn.outvars[0].aval, None), tuple(refs[i] for i in known), tuple(outs))
      return None
    if prim in ("add", "add_any", "sub") and not data and _is_float(eqn.outvars[0].aval):
      signs = tuple(-1.0 if prim == "sub" and i == 1 else 1.0 for i in known)  # the learned part: 0
      self.recipe[outs[0]] = (("sum", eqn.outvars[0].aval, signs), tuple(refs[i] for i in known), tuple(outs))
      return None
    if not data:
      return None
    return self._kept(eqn, refs, known, data)

  def _kept(self, eqn: Any, refs: tuple[Any, ...], known: list[int], data: list[int]) -> float | None:
    """The fraction of entries kept where a mask of known value meets per-sample data: a select
    (the entries that take a per-sample case), a sum with a bias (the entries it leaves above
    ``-1e4``: ``finfo.min``, ``-inf``, ``-1e9`` and BERT's ``-10000`` remove a score, ALiBi's
    slopes do not), a product with a 0/1 mask (the ones). None for anything else."""
    prim = eqn.primitive.name
    if prim == "select_n":
      if 0 not in known:
        return None
      pred = self._value(refs[0])
      if pred is None:
        return None
      memo = ("select", id(pred), tuple(data))
      if memo not in self._memo:
        chosen = np.logical_or.reduce([pred == i - 1 for i in data])
        self._memo[memo] = ((pred,), float(np.mean(chosen)) or None)  # (keeping nothing: no mask)
      return self._memo[memo][1]
    values = [self._value(refs[i]) for i in known]
    if any(v is None for v in values) or not _is_float(eqn.outvars[0].aval):
      return None
    if prim in ("add", "add_any", "sub"):
      with np.errstate(all="ignore"):
        if len(values) == 1:  # the common case, without a float64 copy
          keeps = values[0] < -_REMOVED if prim == "sub" and known == [1] else values[0] > _REMOVED
          return float(np.mean(keeps)) or None
        bias = sum(
          (-v.astype(np.float64) if prim == "sub" and i == 1 else v.astype(np.float64))
          for i, v in zip(known, values)
        )
        return float(np.mean(bias > _REMOVED)) or None
    if prim == "mul":
      factor = values[0].astype(np.float64)
      for v in values[1:]:
        factor = factor * v
      if factor.size > _VALUE_CAP or not np.isin(factor, (0.0, 1.0)).all():
        return None
      return float(np.mean(factor != 0)) or None
    return None

  def _value(self, ref: Any) -> np.ndarray | None:
    """The value of an operand (`_ref`), evaluated on first use from its recipe; compact: an axis
    the value does not vary along may have size 1 (``iota`` of ``[s, s]`` along axis 0 is ``[s, 1]``).
    None where an operand is too large (over ``_VALUE_CAP`` elements) or not evaluable."""
    if isinstance(ref, tuple):
      return ref[0]
    todo = [ref]
    while todo:  # iteratively: a chain of position arithmetic can be long
      key = todo[-1]
      if key in self.value:
        todo.pop()
        continue
      eqn, operands, out_keys = self.recipe[key]
      pending = [r for r in operands if isinstance(r, int) and r not in self.value]
      if pending:
        todo.extend(pending)
        continue
      todo.pop()
      args = [r[0] if isinstance(r, tuple) else self.value[r] for r in operands]
      results = self._evaluate(eqn, args) if all(a is not None for a in args) else None
      for i, o in enumerate(out_keys):
        self.value[o] = None if results is None else results[i]
    return self.value[ref]

  def _evaluate(self, op: Any, args: list[Any]) -> list[np.ndarray | None] | None:
    """`_evaluate`, memoized on the primitive, its parameters and the operand objects: the same mask
    built again in every layer of an unrolled loop is evaluated once."""
    try:
      if isinstance(op, tuple):
        memo: tuple[Any, ...] | None = (op[0], str(op[1]), op[2], *map(id, args))
      else:
        memo = (
          op.primitive,
          tuple(sorted(op.params.items())),
          tuple(str(v.aval) for v in op.outvars),
          *map(id, args),
        )
      hash(memo)
    except TypeError:  # an unhashable parameter: not memoized
      memo = None
    if memo is not None and memo in self._memo:
      return self._memo[memo][1]
    results = _evaluate(op, args)
    if memo is not None:
      self._memo[memo] = (tuple(args), results)  # (the operands kept alive: their ids stay theirs)
    return results

  # -- control flow ---------------------------------------------------------------------------
  def _scan(
    self, eqn: Any, ins: tuple[int | None, ...], scopes: tuple[str, ...], transposed: bool, mult: int
  ) -> list[int]:
    p = eqn.params
    body, _ = compat.split_closed(compat.scan_body(p))
    n_consts, n_carry = compat.scan_counts(p)
    length = int(p["length"])
    keys: list[int | None] = list(ins[:n_consts]) + self._carried(ins[n_consts : n_consts + n_carry])
    # batch axes: the carries keep theirs; a slice of xs loses axis 0 (a loop over chunks of the
    # batch, as the ordered sum of a weight gradient's chunks, runs as long as the first trace's)
    for k, c in zip(ins[n_consts : n_consts + n_carry], keys[n_consts:]):
      if k is not None and c is not None:
        self.baxes[c] = self.baxes.get(k, frozenset())
    stacked_batch = False
    for k in ins[n_consts + n_carry :]:  # xs: one slice per iteration, same parameter root
      sliced = self._new()
      axes = self.baxes.get(k, frozenset()) if k is not None else frozenset()
      self.baxes[sliced] = frozenset(a - 1 for a in axes if a > 0)
      stacked_batch |= 0 in axes
      if k is not None and k in self.root and k not in self.data:
        self.root[sliced] = self.root[k]
        self.distinct[sliced] = mult * max(length, 1)  # each iteration's own slice
      if k is not None and k in self.data:
        self.data.add(sliced)
      if k is not None:
        self.flow[sliced] = k
      keys.append(sliced)
    # the carries change with the per-sample data the loop reads (its constants, carries or xs:
    # an RNN's state, zeros at first, is per-sample from the first step)
    if any(k in self.data for k in keys if k is not None):
      self.data.update(k for k in keys[n_consts : n_consts + n_carry] if k is not None)
    body_outs = self.walk(body, keys, scopes, transposed, mult * max(length, 1))
    outs = self._fresh_outs(eqn, ins)
    for i, (o, b) in enumerate(zip(outs, body_outs)):
      axes = frozenset() if b is None else self.baxes.get(b, frozenset())
      if i < n_carry:
        start = keys[n_consts + i]
        if axes != (frozenset() if start is None else self.baxes.get(start, frozenset())):
          self._unknown("a scan carry whose batch axes change")
        self.baxes[o] = axes
      else:  # ys: stacked along a new axis 0 of the loop's length
        self.baxes[o] = frozenset(a + 1 for a in axes) | (frozenset({0}) if stacked_batch else frozenset())
    self.flow.update((o, b) for o, b in zip(outs, body_outs) if b is not None)
    return outs

  def _carried(self, keys: Sequence[int | None]) -> list[int | None]:
    """A loop's carried values as its body sees them: a value known before the loop (a counter's
    start) changes from one iteration to the next, so the body gets a key without it."""
    out: list[int | None] = []
    for k in keys:
      if k is not None and k in self.recipe:
        fresh = self._new()
        if k in self.data:
          self.data.add(fresh)
        if k in self.root:
          self.root[fresh] = self.root[k]
          self._inherit_distinct(k, fresh)
        k = fresh
      out.append(k)
    return out

  def _while(
    self,
    eqn: Any,
    ins: tuple[int | None, ...],
    refs: tuple[Any, ...],
    scopes: tuple[str, ...],
    transposed: bool,
    mult: int,
  ) -> list[int]:
    p = eqn.params
    cn, bn = compat.while_counts(p)
    body, _ = compat.split_closed(compat.while_jaxprs(p)[1])
    keys = list(ins[cn : cn + bn]) + self._carried(ins[cn + bn :])
    trips = self._trip_count(eqn, refs)
    if trips is None:
      self.notes.add(
        "while loops (unknown trip count) are counted as one iteration, so the rate is an upper bound "
        "where a loop runs more often; a lax.fori_loop or lax.scan with a fixed count is costed per iteration"
      )
    else:
      self.notes.add("while loops that count an integer up to a known bound run that many iterations")
    self.walk(body, keys, scopes, transposed, mult * max(trips or 1, 1))
    return self._fresh_outs(eqn, ins)

  def _trip_count(self, eqn: Any, refs: tuple[Any, ...]) -> int | None:
    """The iterations of a ``while`` that counts a carried integer up by 1 while it is below a bound
    whose value is known (``while_loop(lambda c: c[0] < n, ...)``, a ``fori_loop`` whose bounds are
    traced values of known value): ``bound - start``; None for any other loop."""
    cn, bn = compat.while_counts(eqn.params)
    cond_closed, body_closed = compat.while_jaxprs(eqn.params)
    cond, _ = compat.split_closed(cond_closed)
    body, _ = compat.split_closed(body_closed)
    if len(cond.eqns) != 1 or cond.eqns[0].primitive.name != "lt":
      return None
    counter, bound = cond.eqns[0].invars
    cond_in, carry_refs = list(cond.invars), refs[cn + bn :]
    carry_in = cond_in[cn:]
    if isinstance(counter, compat.Literal) or counter not in carry_in:
      return None
    j = carry_in.index(counter)
    # the body adds 1 to the counter
    out = body.outvars[j]
    step = next((e for e in body.eqns if out in e.outvars), None)
    if step is None or step.primitive.name != "add":
      return None
    ops = list(step.invars)
    lit = [v for v in ops if isinstance(v, compat.Literal)]
    if len(lit) != 1 or np.asarray(lit[0].val) != 1 or body.invars[bn + j] not in ops:
      return None

    def value(var: Any) -> Any:
      if isinstance(var, compat.Literal):
        return np.asarray(var.val)
      if var in cond_in[:cn]:
        ref = refs[cond_in.index(var)]
      elif var in carry_in:
        k = carry_in.index(var)
        if body.outvars[k] is not body.invars[bn + k]:  # a bound the loop changes
          return None
        ref = carry_refs[k]
      else:
        return None
      return None if ref is None else self._value(ref)

    start = None if carry_refs[j] is None else self._value(carry_refs[j])
    end = value(bound)
    if start is None or end is None or np.size(start) != 1 or np.size(end) != 1:
      return None
    return max(0, int(np.ceil(float(end) - float(start))))

  def _cond(
    self, eqn: Any, ins: tuple[int | None, ...], scopes: tuple[str, ...], transposed: bool, mult: int
  ) -> list[int]:
    branches = [compat.split_closed(b)[0] for b in compat.cond_branches(eqn.params)]
    default = compat.cond_platform_default(eqn.params)
    if default is not None:
      # jax.lax.platform_dependent (autocast's native tensor-core products on GPUs): the branches
      # are one program lowered per backend; the default branch is the program as written.
      branches = [branches[default]]
    best: list[Site] | None = None
    best_res: list[int | None] = []
    best_cost = -1.0
    saved = self.sites
    if ins[0] is not None and self.baxes.get(ins[0]):
      self._unknown("a cond on per-sample data")
    out_axes: set[tuple[frozenset[int], ...]] = set()
    for br in branches:
      self.sites = []
      res = self.walk(br, list(ins[1:]), scopes, transposed, mult)
      out_axes.add(tuple(frozenset() if k is None else self.baxes.get(k, frozenset()) for k in res))
      cost = sum(s.mult * math.prod(s.measures) * (4.0 if s.kind == "matmul" else 1.0) for s in self.sites)
      if cost > best_cost:
        best, best_cost, best_res = self.sites, cost, res
    self.sites = saved + (best or [])
    if len(branches) > 1:
      self.notes.add("cond: the most expensive branch is counted")
    outs = self._fresh_outs(eqn, ins)
    if len(out_axes) > 1:
      self._unknown("cond branches whose outputs differ in their batch axes")
    for o, a in zip(outs, next(iter(out_axes), ())):
      self.baxes[o] = a
    if default is not None:
      # one program: its outputs are the branch's values (autocast's product, whose result the
      # attention's softmax reads: attention's core follows it), as an inlined call's are
      outs = [r if r is not None else o for o, r in zip(outs, best_res)]
    return outs

  def _is_fake_cast(self, eqn: Any, inner: Any) -> bool:
    """A call that maps one float array to one float array of the same shape through integer bits."""
    if len(eqn.invars) < 1 or len(eqn.outvars) != 1:
      return False
    floats_in = [v for v in eqn.invars if _is_float(v.aval)]
    if len(floats_in) != 1 or not _is_float(eqn.outvars[0].aval):
      return False
    if tuple(floats_in[0].aval.shape) != tuple(eqn.outvars[0].aval.shape):
      return False
    j, _ = compat.split_closed(inner)
    key = id(j)
    if key not in self._fake_cast_cache:
      self._fake_cast_cache[key] = _contains_float_to_int_bitcast(j)
    return self._fake_cast_cache[key]


def _reshape_axes(
  before: tuple[int, ...], after: tuple[int, ...], axes: frozenset[int]
) -> frozenset[int] | None:
  """The axes of a reshape's output that ``axes`` of its input become, when the reshape only adds or
  drops axes of size 1 (else None: the index is no longer followed)."""
  src = [d for d in range(len(before)) if before[d] != 1]
  dst = [d for d in range(len(after)) if after[d] != 1]
  if [before[d] for d in src] != [after[d] for d in dst]:
    return None
  return frozenset(dst[src.index(a)] for a in axes if a in src)


def _triangular(value: Any) -> bool:
  """Whether a constant holds a causal mask on its last two axes: two values, split along a diagonal
  (``np.tril(ones)``, ``np.triu(full(-inf), 1)``), the same for every leading index."""
  shape = tuple(getattr(value, "shape", ()))
  if len(shape) < 2 or shape[-1] < 2 or shape[-2] < 2 or math.prod(shape) > 1 << 24:
    return False
  try:
    a = np.asarray(value).reshape(-1, *shape[-2:])
  except Exception:  # noqa: BLE001 (not a host array: nothing to read)
    return False
  if not (a == a[:1]).all():
    return False
  keep = a[0] == a[0][-1, 0]  # the side the bottom-left entry is on (kept by tril, left by triu(-inf, 1))
  n, m = keep.shape
  return not keep.all() and bool(np.array_equal(keep, np.tri(n, m, int(keep[0].sum()) - 1, dtype=bool)))


def _evaluate(op: Any, args: list[Any]) -> list[np.ndarray | None] | None:
  """The values of an equation's outputs from its operands' (`Walker._value`), compact (an axis an
  output does not vary along may have size 1); ``op`` is an equation or ``(kind, aval, extra)``: a
  closed-over constant, the mask of a ``mask & padding``, the constant part of a ``bias + learned``.
  NumPy rules for position arithmetic, comparisons, selects and views; any other primitive is bound
  on the full operands. None where a value would exceed ``_VALUE_CAP`` elements or cannot be had."""
  try:
    with np.errstate(all="ignore"), warnings.catch_warnings():
      warnings.simplefilter("ignore")
      if isinstance(op, tuple):
        kind, aval, extra = op
        return [_fit(_nominal(kind, extra, args), aval)]
      results = _rule(op, [np.asarray(a) for a in args])
      if results is None:
        return None
      return [_fit(r, v.aval) for r, v in zip(results, op.outvars)]
  except Exception:  # noqa: BLE001 (a value that cannot be had: the mask is costed by its structure)
    return None


def _nominal(kind: str, extra: Any, args: list[Any]) -> np.ndarray | None:
  if kind == "const":
    value = args[0]
    if _size_of(value) > _VALUE_CAP:
      return None
    return np.asarray(value)
  if kind == "and":
    out = args[0]
    for a in args[1:]:
      out = np.bitwise_and(out, a)
    return out
  return sum(sign * np.asarray(a) for sign, a in zip(extra, args))  # "sum"


def _size_of(value: Any) -> int:
  return int(math.prod(getattr(value, "shape", ())))


def _fit(value: Any, aval: Any) -> np.ndarray | None:
  """``value`` as a compact value of ``aval``: its dtype, as many axes, each of size 1 or the full size."""
  if value is None:
    return None
  shape = tuple(getattr(aval, "shape", ()))
  value = np.asarray(value)
  if value.ndim < len(shape):
    value = value.reshape((1,) * (len(shape) - value.ndim) + value.shape)
  if value.ndim != len(shape) or any(v not in (1, n) for v, n in zip(value.shape, shape)):
    return None
  if value.size > _VALUE_CAP:
    return None
  return value.astype(np.dtype(aval.dtype))


def _rule(eqn: Any, args: list[np.ndarray]) -> list[np.ndarray] | None:
  """One equation on compact NumPy operands (`_evaluate`)."""
  prim, params = eqn.primitive.name, eqn.params
  shape = tuple(getattr(eqn.outvars[0].aval, "shape", ()))
  if prim == "iota":
    d = int(params["dimension"])
    return [np.arange(shape[d]).reshape([shape[d] if a == d else 1 for a in range(len(shape))])]
  if prim in _NUMPY_SAME:
    return list(args[: len(eqn.outvars)])
  if prim in _NUMPY_UNARY and len(args) == 1:
    return [_NUMPY_UNARY[prim](args[0])]
  if len(args) > 1 and math.prod(np.broadcast_shapes(*(a.shape for a in args))) > _VALUE_CAP:
    return None
  if prim in _NUMPY_BINARY and len(args) == 2:
    return [_NUMPY_BINARY[prim](*args)]
  x = args[0]
  if prim == "div":
    if np.issubdtype(x.dtype, np.integer):  # rounds toward zero, as lax.div
      return [np.sign(x) * np.sign(args[1]) * (np.abs(x) // np.abs(args[1]))]
    return [x / args[1]]
  if prim == "integer_pow":
    return [x ** int(params["y"])]
  if prim == "select_n":
    out = args[1]
    for i, case in enumerate(args[2:], 1):
      out = np.where(x.astype(np.int64) == i, case, out)
    return [out]
  if prim == "clamp":  # clamp(lo, x, hi)
    return [np.minimum(np.maximum(args[1], x), args[2])]
  if prim == "broadcast_in_dim":
    compact = [1] * len(shape)
    for i, d in enumerate(params["broadcast_dimensions"]):
      compact[d] = x.shape[i]
    return [x.reshape(compact)]
  if prim == "transpose":
    return [np.transpose(x, params["permutation"])]
  if prim == "squeeze":
    return [np.squeeze(x, axis=tuple(int(d) % x.ndim for d in params["dimensions"]))]
  if prim == "expand_dims":
    return [np.expand_dims(x, tuple(params["dimensions"]))]
  before = tuple(getattr(eqn.invars[0].aval, "shape", ()))
  if prim == "reshape" and x.shape == before:
    return [x.reshape(shape)]
  if prim == "reshape":
    src = [d for d in range(len(before)) if before[d] != 1]
    dst = [d for d in range(len(shape)) if shape[d] != 1]
    if [before[d] for d in src] == [shape[d] for d in dst]:  # only axes of size 1 come and go
      compact = [1] * len(shape)
      for a, b in zip(src, dst):
        compact[b] = x.shape[a]
      return [x.reshape(compact)]
    if math.prod(before) <= _VALUE_CAP:
      return [np.broadcast_to(x, before).reshape(shape)]
    return None
  if prim == "slice":
    strides = params.get("strides") or (1,) * x.ndim
    return [
      x[
        tuple(
          slice(0, 1) if x.shape[a] == 1 else slice(lo, hi, st)
          for a, (lo, hi, st) in enumerate(zip(params["start_indices"], params["limit_indices"], strides))
        )
      ]
    ]
  if prim == "rev":
    return [np.flip(x, tuple(d for d in params["dimensions"] if x.shape[d] > 1))]
  # anything else: on the full operands, by JAX itself
  full = [tuple(getattr(v.aval, "shape", ())) for v in eqn.invars]
  if any(math.prod(sh) > _VALUE_CAP for sh in full) or any(_size(v.aval) > _VALUE_CAP for v in eqn.outvars):
    return None
  operands = [np.broadcast_to(a, sh) for a, sh in zip(args, full)]
  with jax.ensure_compile_time_eval():
    out = eqn.primitive.bind(*operands, **params)
  return [np.asarray(o) for o in (out if eqn.primitive.multiple_results else [out])]


def _has_subjaxprs(params: dict[str, Any]) -> bool:
  return next(compat.jaxprs_in_params(params), None) is not None


def _contains_float_to_int_bitcast(jaxpr: compat.Jaxpr) -> bool:
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "bitcast_convert_type":
      src = eqn.invars[0].aval
      if _is_float(src) and not _is_float(eqn.outvars[0].aval):
        return True
    inner = compat.call_jaxpr(eqn)
    if inner is not None:
      j, _ = compat.split_closed(inner)
      if _contains_float_to_int_bitcast(j):
        return True
  return False


def _is_float(aval: Any) -> bool:
  dtype = getattr(aval, "dtype", None)  # jax.dtypes knows extended dtypes (PRNG keys), NumPy does not
  return dtype is not None and jax.dtypes.issubdtype(dtype, np.floating)


def itemsize(dtype: Any) -> int:
  """Bytes per element, for NumPy dtypes and JAX's extended ones (a threefry key is 2 x uint32)."""
  try:
    return np.dtype(dtype).itemsize
  except TypeError:
    return int(getattr(dtype, "itemsize", 8))


def _bits(aval: Any) -> int:
  dtype = getattr(aval, "dtype", None)
  return 8 * itemsize(dtype) if dtype is not None else 32


def _size(aval: Any) -> int:
  return int(math.prod(getattr(aval, "shape", ())))


def _nbytes(aval: Any) -> int:
  return _size(aval) * _bits(aval) // 8


def classify(eqn: Any) -> str | None:
  """The kind of work of a leaf equation, or None when it is not work."""
  prim = eqn.primitive.name
  if prim in compat.PRODUCT_PRIMITIVES:
    return "matmul"
  if prim in _FREE:
    return None
  if not any(_is_float(v.aval) for v in eqn.invars):  # integer/bool arithmetic: index math, rounding bits
    return None
  if prim in _MOVE:
    return "move"
  if prim in _REDUCE:
    axes = eqn.params.get("axes")
    shape = getattr(eqn.invars[0].aval, "shape", ())
    if axes is not None and all(shape[a] == 1 for a in axes):  # over size-1 axes only: a reshape
      return None
    return "reduce"
  if prim in _TRANSCENDENTAL:
    return "transcendental"
  if prim in ("precision_round", "precision_round_bits"):  # the format a value is kept in, not an op:
    return None  # the wafer computes in it (autocast's roundings; `precision.round`)
  if prim == "convert_element_type":
    return "cast" if _is_float(eqn.outvars[0].aval) else None
  return "vector"


def _matmul_measures(eqn: Any) -> tuple[float, float, float, float]:
  """``(instances, m, k, n)`` of a ``dot_general``, a ragged product or a convolution.

  A ragged product of ``g`` groups is ``g`` products, each of ``1 / g`` of the ragged axis with its
  group's slice of ``rhs`` (a grouped matmul: every ``lhs`` row meets one expert's weight), so its
  FLOPs are those of the dense product without the group axis."""
  lhs = eqn.invars[0].aval.shape
  rhs = eqn.invars[1].aval.shape
  if eqn.primitive.name != "conv_general_dilated":
    (lc, rc), (lb, rb), group, ragged, groups = compat.dot_numbers(eqn)
    batch = math.prod(lhs[d] for d in lb)
    k = math.prod(lhs[d] for d in lc)
    m = math.prod(lhs[d] for d in range(len(lhs)) if d not in lc and d not in lb)
    n = math.prod(rhs[d] for d in range(len(rhs)) if d not in rc and d not in rb and d not in group)
    if groups > 1 and ragged:
      if any(d in lc for d in ragged):  # contracted (the weight gradient): each group sums its rows
        k = k / groups
      elif not any(d in lb for d in ragged):  # a row axis: each row meets one group
        m = m / groups
      batch *= groups
    return float(batch), float(m), float(k), float(n)
  # convolution as an implicit GEMM: m = N x output pixels, k = C_in/groups x window, n = C_out/groups
  dn = eqn.params["dimension_numbers"]
  out = eqn.outvars[0].aval.shape
  groups = int(eqn.params.get("feature_group_count", 1)) * int(eqn.params.get("batch_group_count", 1))
  lhs_spec, rhs_spec, out_spec = dn.lhs_spec, dn.rhs_spec, dn.out_spec
  n_batch = out[out_spec[0]]
  out_pixels = math.prod(out[d] for d in out_spec[2:])
  c_in = lhs[lhs_spec[1]]
  window = math.prod(rhs[d] for d in rhs_spec[2:])
  c_out = rhs[rhs_spec[0]]
  return (
    float(groups),
    float(n_batch * out_pixels),
    float(c_in // max(groups, 1) * window) * _real_tap_fraction(eqn),
    float(c_out // max(groups, 1)),
  )


def _real_tap_fraction(eqn: Any) -> float:
  """The share of a convolution's (output pixel, window tap) pairs that meet an input element and not
  one of the zeros ``lhs_dilation`` puts between them (the input gradient of a stride-``s`` convolution
  is one over its gradient dilated ``s``-fold: about ``1 / s`` of the taps per axis are real, and no
  compiler multiplies the rest). Padding is counted as before (as work); 1.0 without dilation.

  Per spatial axis: output position ``o`` and tap ``t`` read the dilated, padded input at
  ``q = o * stride + t * rhs_dilation - pad_lo``; inside ``[0, (size - 1) * d]`` it is real when
  ``q % d == 0``. The axes are independent, so the share is the product of the axes' shares.
  """
  p = eqn.params
  dilation = tuple(p.get("lhs_dilation") or ())
  if not dilation or all(d == 1 for d in dilation):
    return 1.0
  dn = p["dimension_numbers"]
  lhs, rhs, out = eqn.invars[0].aval.shape, eqn.invars[1].aval.shape, eqn.outvars[0].aval.shape
  strides = tuple(p.get("window_strides") or (1,) * len(dilation))
  rhs_dilation = tuple(p.get("rhs_dilation") or (1,) * len(dilation))
  share = 1.0
  for i, d in enumerate(dilation):
    if d == 1:
      continue
    size, taps, outs = lhs[dn.lhs_spec[2 + i]], rhs[dn.rhs_spec[2 + i]], out[dn.out_spec[2 + i]]
    pad_lo = p["padding"][i][0]
    extent = (size - 1) * d
    if outs * taps > 1 << 18:  # a long axis: the interior's share, 1 / d, to within its edges
      share /= d
      continue
    holes = 0
    for o in range(outs):  # (outs x taps: counted up to 2**18)
      for t in range(taps):
        q = o * strides[i] + t * rhs_dilation[i] - pad_lo
        holes += 0 <= q <= extent and q % d != 0
    share *= 1.0 - holes / max(outs * taps, 1)
  return share
