"""`autocast`: run an unmodified float32 JAX function with a `Policy`'s mixed-precision numerics.

Specification
=============

The pass traces the function to a jaxpr, walks its equations and binds each one again,
inserting `precision.round` (nearest even, cast-like gradient) where the policy's rule table
(`precision.policy`) says. Values stay float32 arrays that hold compute-format values ("fake
casts"): shapes and dtypes never change, so the result has the function's exact signature.

**Values and constants.** A *constant* is a number known when the function is traced: a
Python scalar, or a literal the tracer inlined (a jaxpr ``Literal``), and anything computed
only from constants (``jnp.zeros``, ``jnp.full(s, 0.5)``). Everything else is a *value*: every
argument, every closed-over array that is not inlined, every result of an operation on a
value, **0-d arrays included** (a 0-d argument, a learned scalar, each example under
``vmap`` are values like any other). Constants are never rounded; a constant that is exactly
representable in the compute format counts as rounded for the rules below. One constant stands
for a format's number rather than float32's: where the attention scores are rounded, a literal
``+-finfo(float32).max`` (``jnp.finfo(dtype).min``, a mask bias) becomes the compute format's ``+-max``
(`_extremes`).

**State of a float32 value** while the pass runs: ``rounded`` (exactly representable in the
compute format), ``float32`` (deliberately kept in float32 by a ``"float32"`` rule),
``raw`` (anything else: arguments, weights), plus the two constant states. Where two states
meet (a ``concatenate``, a loop carry, the branches of a ``cond``) the result has the
weakest state both satisfy (``raw`` if nothing better is known).

**Op classes** (the primitive -> class table is `PRIMITIVE_CLASSES`, `precision._op_classes`):

* ``matmul``: ``dot_general``, ``conv_general_dilated``, ``ragged_dot``. Both operands are
  rounded to the compute format (a weight once per trace), then, per the policy's treatment:
  ``float32_accumulate`` (products summed in float32, result rounded once),
  ``mixed_accumulate`` (the contraction is cut into chunks of ``accumulation_block``
  products; chunk sums are float32, rounded, and added one after another in the compute
  format: one batched product plus an ordered reduction), or ``float32`` (unrounded). A
  convolution's contraction is input channels x kernel window; its chunks are slices of
  input channels of ``max(1, block // window)`` channels each (a grouped convolution).
  ``ragged_dot`` and convolutions with ``batch_group_count > 1`` are never chunked.
  The products on rounded operands are exact on every device: on GPUs, where a native dtype
  holds every compute-format value (bfloat16, float16, and the float8 formats in bfloat16),
  they run on that dtype's tensor cores with float32 accumulation; otherwise (cbfloat16, or
  ``Policy(products="tf32")``) they are bound with ``precision=HIGH`` (TF32 tensor cores on
  NVIDIA GPUs: exact products of compute-format values). Those kept float32 get ``HIGHEST``
  (true float32). On CPUs all of these are true float32 products summed in the same order,
  so CPU results do not depend on the choice (`ROUNDED_OPERANDS`, `TRUE_FLOAT32`,
  `_native_dtype`, `_rounded_product`; docs/gpu.md).
* ``attention_matmul``: the two matrix products of attention, recognised by structure, not
  by batch dimensions. A *score product* is a ``dot_general`` whose result reaches (through
  any non-matmul ops: scaling, masking, max-subtraction) an ``exp`` whose output is divided
  by a ``reduce_sum`` of that ``exp`` (a softmax), and whose softmax (through data movement,
  ``mul``, ``div``, ``select``: dropout) is an operand of another ``dot_general``. That
  score product, and every matrix product with an operand derived from its result before
  the next matrix product (``P V``, and in ``autocast(grad(f))`` the backward products of
  ``dS`` and ``P``), are attention matmuls. A classifier's logits (softmax, no second
  product) and batched products such as ``einsum("bsd,bdf->bsf")`` are ordinary matmuls.
* ``attention_softmax``: any non-matmul float op with an input derived from a score
  product's result, before the next matrix product.
* ``elementwise``, ``transcendental``, ``reduction``: the rule rounds the result
  (``round``) or keeps it float32 (``float32``). An elementwise op whose inputs are all
  ``float32``-kept values or constants stays float32 (``var + eps``, ``loss * 0.5``); an op
  on constants only is a constant.
* ``exact`` (max, neg, abs, select, floor, sort, ...): the result is one of the inputs'
  values (up to sign), so it is never rounded and has the join of the inputs' states:
  ``relu`` of a rounded value is rounded, ``relu`` of a weight is a raw value that the next
  op rounds. (``vmap`` turns a ``cond`` into ``select_n``; rounding there would make
  ``autocast(vmap(f))`` differ from ``vmap(autocast(f))``.)
* ``data_movement`` keeps its inputs' state; ``cast`` (user conversions, user
  ``precision.round`` calls) is left as written; equations without float32 results and
  ``unknown`` primitives are left unchanged (the cast report lists the unknown ones).

**compute="float32"** is the identity: every rule becomes ``float32``; no rounding, no
chunking, and the cast report counts nothing rounded, at every level. With ``output="float32"``
too, the autocast function calls ``fn`` itself (matrix products without a precision of their own
in true float32: ``jax.default_matmul_precision("highest")``), so it is bitwise ``fn`` eagerly as well as under
``jit`` (evaluated op by op, the bodies of library jits that tracing inlines, such as
``jnp.einsum``'s, round differently in the last bit); `numerics_report` runs the pass itself.
The invariant, on every device: ``autocast(f, "c=f32")`` equals ``f`` run under
``jax.default_matmul_precision("highest")``. On a CPU that is ``f`` itself; on a GPU, where
``f``'s own products run in TF32 at the default precision, it is not, by design: float32 on
Cerebras means true float32 products, and the float32 policy is the baseline that the 16-bit
policies are measured against (docs/gpu.md).

**Regions.** Equations traced inside `float32_region` (a context manager or decorator, like
``torch.autocast(enabled=False)``) are bound unchanged and their results are ``float32``.
**Nesting**: an `autocast` function called while another autocast traces keeps its own
policy (the inner policy wins); the outer pass leaves its equations alone.

**Transformations.** ``jit``/``pjit`` bodies are transformed and stay ``jit`` calls with
their shardings when traced (so ``jax.grad(autocast(f))`` sums a cotangent's contributions in
the order ``jax.grad(f)`` does), and are inlined when evaluated eagerly (unless sharded); ``remat``, ``scan``, ``while``, ``cond`` and ``shard_map`` are rebound with transformed bodies; a loop carry's state is the
fixed point of the body (so the first iteration of a scan sees the joined state: a scan over
layers equals the unrolled loop when each layer's output state is its input's, e.g. ends
in a rounded activation); ``cond`` branches are transformed separately and their output
states joined. ``custom_jvp`` / ``custom_vjp`` functions keep their custom rules, whose jvp,
fwd and bwd are transformed too. ``vmap(autocast(f))`` and ``autocast(vmap(f))`` give the
same values up to float32 summation order. Gradients: ``jax.grad(autocast(f))``
differentiates through the inserted roundings, whose VJP rounds the cotangent (a dtype
cast's rule); ``autocast(jax.value_and_grad(f))`` applies the rules to every forward *and*
backward equation (closest to the wafer's backward pass).

**A cotangent is rounded once.** Where a nearest-even rounding's result has a single
consumer that sends its own (rounded) cotangent back unchanged (an ``add``, ``sub`` or
``add_any`` of the same shape, or a ``reduce_sum``, whose result the pass rounds to nearest
even; possibly through reshapes, transposes and float32 conversions), the cotangent reaching
the rounding is already a compute-format value, and rounding it again changes no bit
(nearest-even rounding is idempotent). Such a rounding is bound with ``ct_rounded=True`` and
its transpose passes the cotangent on (`_rounds_cotangent`). Likewise a result already
rounded to the compute format is not rounded again when ``output`` is that format.
Products are not exact (``2 * max`` overflows, ``min_subnormal / 2`` underflows), so a
product by a power of two keeps its rounding.

**Stochastic rounding.** ``Policy(..., stochastic=("matmul", "elementwise"))`` (string
``stochastic=matmul+elementwise``) makes every rounding the rules insert for equations of
those classes stochastic (`precision.round`'s ``"stochastic"`` mode: rounds up with
probability equal to the discarded fraction of a step, so ``E[r(x)] = x`` exactly; see
`precision.rounding`). *Sites*: for an elementwise, transcendental, reduction or
attention_softmax equation, its result; for a matmul or attention_matmul, each operand that
is not yet rounded (a weight once per jaxpr, as with nearest rounding), the result, and under
``mixed_accumulate`` the chunk sums and each addition of the ordered sum. Everything else
(the ``output`` rounding, user casts, other classes) stays nearest-even.

*Where the bits come from*: the caller passes one PRNG key per call, ``autocast(f, policy)(*args,
rounding_key=key)`` (``jax.random.key(n)`` or a raw ``PRNGKey``); a train step passes a key it
already has, e.g. ``jax.random.fold_in(step_key, 1)`` beside its dropout key, so each step
gets fresh bits and the run is reproducible from its seed. The pass numbers the rounding sites
in trace order; site ``i`` rounds with ``fold_in(key, i)``, whose two words seed the
counter-based generator of `precision.round` (`precision._kernel.counter_bits`: one word per
element). A sub-jaxpr (the body of a ``scan``, ``remat`` or ``cond`` branch) takes the next
site's key as its own key and numbers its sites from 0; a ``scan`` body folds in the
iteration index too (an extra scanned ``uint32`` input), so each iteration gets fresh bits, and
the additions of a chunked matmul fold in their index. Same key and same program give the same
bits (eager or under ``jit``); different keys give independent bits. The roundings are the
linear primitive ``precision_round_bits`` (`precision.rounding.round_bits_p`), so they
transpose inside ``custom_jvp`` rules (softmax, logaddexp); under ``jax.grad(autocast(f))``
the cotangent of a stochastic site is rounded stochastically with words derived from the
forward ones (`precision._kernel.derive_bits`), as `precision.round`'s ``grad="cast"``.

*No key*: calling the function of a policy with stochastic classes without ``rounding_key``
is a `PolicyError` (it is never silently rounded to nearest); a key passed to a policy without
stochastic classes, or to a float32 policy (the identity), is ignored. `cast_report` needs no
key (nothing is computed). `precision.numerics_report` takes no key and refuses such a policy
(`PolicyError`). A ``while_loop`` (or ``fori_loop`` with traced bounds) in a stochastic
policy's function is a `PolicyError`: its iterations would reuse the same bits.

*Transformations*: ``jit`` changes nothing (the key is an argument like any other).
``vmap(lambda x, k: g(x, rounding_key=k))(xs, keys)`` with one key per example gives each
example exactly the bits of ``g(x_i, rounding_key=k_i)``; with one unbatched key every example
gets the same words (as with `precision.round` and ``jax.random``): unbiased per example,
but the errors of the examples are correlated. ``autocast(vmap(f))`` draws one word per
element of the batched value, so it is not bitwise ``vmap(autocast(f))`` under stochastic
rounding (the rule "same values up to float32 summation order" is for nearest rounding).

**Where this is our choice, not Cerebras'.** Cerebras documents the precision levels in
words only (``cerebras.md`` section 2). The op classes, the attention pattern, the chunk
model of "a mix of fp32 and 16-bit reductions", the float32 treatment of transcendental ops
and reductions (PyTorch autocast's lists), the constant rule, inner-policy-wins nesting and
the float32 region, and which roundings a stochastic class covers are ours. ``cstorch.pol``
regions (a different level per region) are not modelled; `float32_region` is the float32
case.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import sys as _sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax._src.interpreters import ad as _ad
from jax._src.interpreters import partial_eval as _pe
from jax._src.sharding_impls import UNSPECIFIED as _UNSPECIFIED_VALUE
from jax._src.sharding_impls import UnspecifiedValue as _UNSPECIFIED
from jax.custom_derivatives import SymbolicZero
from jax.extend import core as jcore
from jax.extend import linear_util as lu
from jax.extend import source_info_util

from precision import formats as _formats
from precision import rounding as _rounding
from precision._op_classes import PRIMITIVE_CLASSES
from precision.cast_report import CastLog, CastReport
from precision.formats import FloatFormat, float32
from precision.policy import RULE_CLASSES, Policy, PolicyError

ROUNDED, FLOAT32, RAW = "rounded", "float32", "raw"
CONST, CONST_ROUNDED = "constant", "constant_rounded"  # constants: not / exactly representable
_CONSTANTS = (CONST, CONST_ROUNDED)
FLOAT32_SCOPE = "precision.float32_region"
_NESTED_SCOPE = "precision.autocast_region"

__all__ = ("PRIMITIVE_CLASSES", "autocast", "cast_report", "float32_region")


class Tag(NamedTuple):
  """What the pass knows about a float32 value (None for other dtypes)."""

  state: str  # ROUNDED, FLOAT32, RAW, CONST or CONST_ROUNDED
  attention: bool = False


_RAW = Tag(RAW)


class float32_region(contextlib.ContextDecorator):  # noqa: N801  (used like a function)
  """Mark code that `autocast` must leave in float32: a context manager or a decorator.

  Equations traced inside the region are bound unchanged (no rounding, no chunked
  accumulation) and their results count as float32 values. Use it for the optimizer update
  when it is traced inside an autocast function: the weights, Adam's moments and the update
  must stay float32, as on Cerebras (weights are stored and updated in fp32). A 16-bit
  update loses small updates to rounding (``w + lr * g`` rounds back to ``w``), and Adam's
  second moment ``g**2`` underflows to 0 in the compute format, which turns ``g / sqrt(v)``
  into a division by ``eps``: training silently breaks. Outside autocast the marker only
  names a scope.

  >>> import jax.numpy as jnp, precision
  >>> def step(w, g):
  ...   with precision.float32_region():
  ...     return w - 1e-3 * g
  >>> w, g = jnp.float32(1.0), jnp.float32(0.1)
  >>> float(precision.autocast(step, "c=bf16")(w, g)) == float(w - 1e-3 * g)
  True
  """

  def __init__(self, fn: Callable[..., Any] | None = None):
    if fn is not None and not callable(fn):
      raise TypeError(
        f"float32_region takes no arguments as a context manager (with precision.float32_region(): ...) or "
        f"one function as a decorator; got {type(fn).__name__} {fn!r:.60}"
      )
    self._fn = fn
    self._scopes: list[Any] = []
    if fn is not None:
      functools.update_wrapper(self, fn)

  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    if self._fn is not None:  # used as @float32_region without parentheses
      with float32_region():
        return self._fn(*args, **kwargs)
    return super().__call__(*args, **kwargs)

  def __enter__(self) -> float32_region:
    scope = jax.named_scope(FLOAT32_SCOPE)
    scope.__enter__()
    self._scopes.append(scope)
    return self

  def __exit__(self, *exc: Any) -> bool:
    return bool(self._scopes.pop().__exit__(*exc))


_TRACING = threading.local()  # depth of autocast traces in progress (nesting detection)


@contextlib.contextmanager
def _tracing() -> Any:
  _TRACING.depth = getattr(_TRACING, "depth", 0) + 1
  try:
    yield
  finally:
    _TRACING.depth -= 1


def autocast(
  fn: Callable[..., Any],
  policy: Policy | str,
  *,
  static_argnums: int | Sequence[int] = (),
  static_argnames: str | Sequence[str] = (),
) -> Callable[..., Any]:
  """``fn`` with ``policy``'s mixed-precision numerics inserted; same signature, same dtypes.

  Args:
    fn: any function of arrays (pytrees of arrays in, pytrees out), e.g. a loss written in
      float32, ``jax.value_and_grad(loss)``, or a function that merges an NNX module
      (``lambda state, x: nnx.merge(graphdef, state)(x)``). Leaves that are arrays or Python
      numbers are traced; any other leaf (an Equinox module's activation function, a string)
      is passed to ``fn`` unchanged, as ``eqx.filter_jit`` does, and such leaves of the
      result are returned unchanged: ``eqx.filter_jit(autocast(loss, policy))(model, x)`` works.
      A Flax NNX module among the arguments is handled as ``nnx.jit`` does: its state is traced
      and what ``fn`` changes in it (BatchNorm statistics, ``nnx.Rngs`` counts) is written back
      (not rounded to ``output``), so ``nnx.value_and_grad(autocast(loss, policy))(model, x)`` works.
    policy: a `Policy` or its string form (``"c=cb16,level=1"``).
    static_argnums, static_argnames: arguments to pass unchanged rather than trace (Python
      bools and numbers used as flags, configs), as in ``jax.jit`` (a name also covers the
      argument passed by position, and a position the argument passed by name).

  Returns:
    A function with ``fn``'s signature plus one keyword, ``rounding_key``: the PRNG key
    (``jax.random.key(n)`` or ``PRNGKey(n)``) of the policy's stochastic roundings, needed
    when ``policy.stochastic`` names op classes and ignored otherwise (see the module
    docstring's "Stochastic rounding"). Float32 outputs are rounded to ``policy.output``.
    It carries ``.policy`` and ``__wrapped__`` (``fn``). Called while another autocast
    traces it, it keeps its own policy (see the module docstring). A float32 policy
    (``"c=f32"``) returns ``fn`` under ``jax.default_matmul_precision("highest")``: true
    float32 products on every device (on GPUs not TF32, the default precision there).
    Products of rounded operands run on native bfloat16/float16 tensor cores on GPUs where
    the compute format allows, TF32 otherwise (``Policy(products="tf32")`` forces TF32).

  Raises:
    PolicyError: the policy rounds stochastically and no ``rounding_key`` was given.
    TypeError: ``fn`` is not callable, or a static argument spec of the wrong type.
    ValueError: a static position or name that ``fn``'s signature does not have.

  Example:
    >>> import jax.numpy as jnp, precision
    >>> f = precision.autocast(lambda x, w: jnp.tanh(x @ w), "c=bf16")
    >>> f(jnp.ones((2, 3)), jnp.full((3, 2), 0.1)).dtype
    dtype('float32')
  """
  _check_callable(fn, "autocast")
  return _Autocast(fn, _as_policy(policy), _Statics.of(fn, static_argnums, static_argnames))


class _Autocast:
  """The function `autocast` returns: ``fn``'s name, docstring and signature (``__wrapped__``),
  plus ``policy``. A callable object rather than a plain function, so that Equinox does not
  take it for a ``jax.jit``-style wrapper of arrays (``eqx.filter_jit(autocast(f, p))`` of an
  ``eqx.filter_value_and_grad`` would warn); like a function, it binds as a method."""

  def __init__(self, fn: Callable[..., Any], policy: Policy, statics: _Statics):
    functools.update_wrapper(self, fn)
    self.policy = policy
    self._statics = statics

  def __call__(self, *args: Any, rounding_key: Any = None, **kwargs: Any) -> Any:
    fn, policy = self.__wrapped__, self.policy
    nested = getattr(_TRACING, "depth", 0) > 0
    if not policy.is_mixed and policy.output == float32:
      # The identity is ``fn`` itself (products in true float32, as the pass binds them). The
      # pass would evaluate the bodies of inlined library jits (``jnp.einsum``) op by op, which
      # XLA rounds differently in the last bit when ``fn`` runs eagerly.
      with jax.named_scope(_NESTED_SCOPE) if nested else contextlib.nullcontext():
        with jax.default_matmul_precision("highest"):
          return fn(*args, **kwargs)
    p = _Pass(policy)
    if p.stochastic:
      p.key = _check_key(fn, policy, rounding_key)
    lifted = _lift_nnx_modules(fn, self._statics, args, kwargs)
    if lifted is None:
      closed, outputs, flat = _trace(fn, self._statics, args, kwargs)
      with jax.named_scope(_NESTED_SCOPE) if nested else contextlib.nullcontext():
        outs = _run(p, closed, flat)
      return outputs.unflatten(outs)
    closed, outputs, flat = _trace(lifted.fn, _Statics((), ()), lifted.args, {})
    with jax.named_scope(_NESTED_SCOPE) if nested else contextlib.nullcontext():
      outs = _run(p, closed, flat, rounded_outputs=lifted.traced_outputs[0])
    return lifted.finish(outputs.unflatten(outs))

  def __get__(self, instance: Any, owner: Any = None) -> Any:
    return self if instance is None else functools.partial(self, instance)

  def __repr__(self) -> str:
    return f"<autocast {getattr(self, '__qualname__', _name(self.__wrapped__))} ({self.policy})>"


def cast_report(
  fn: Callable[..., Any],
  policy: Policy | str,
  *args: Any,
  static_argnums: int | Sequence[int] = (),
  static_argnames: str | Sequence[str] = (),
  **kwargs: Any,
) -> CastReport:
  """What `autocast` does to ``fn`` at these arguments' shapes: counts per primitive and op class.

  Nothing is computed: ``args`` may be arrays or ``jax.ShapeDtypeStruct``s. Non-array
  arguments are marked with ``static_argnums`` / ``static_argnames`` as for `autocast`.

  Returns:
    A `CastReport` (prints as tables, ``.to_dict()`` for JSON).
  """
  _check_callable(fn, "cast_report")
  policy = _as_policy(policy)
  closed, _, flat = _trace(fn, _Statics.of(fn, static_argnums, static_argnames), args, kwargs)
  p = _Pass(policy)
  p.key = jax.random.key(0) if p.stochastic else None  # nothing is computed: any key will do
  jax.make_jaxpr(lambda *xs: _run(p, closed, xs))(*flat)
  return CastReport.from_log(policy, p.log)


# ---- tracing the user's function ----


class _Statics(NamedTuple):
  argnums: tuple[int, ...]
  argnames: tuple[str, ...]

  @classmethod
  def of(cls, fn: Callable[..., Any], argnums: Any, argnames: Any) -> _Statics:
    """Static positions and names, each completed from ``fn``'s signature (as ``jax.jit`` does).

    Raises:
      TypeError: ``argnums`` is not an int or a sequence of ints, ``argnames`` not a string or
        a sequence of strings.
      ValueError: a position or a name ``fn``'s signature does not have (as ``jax.jit``).
    """
    name = _name(fn)
    nums, names = (
      _as_set(name, "static_argnums", argnums, int),
      _as_set(name, "static_argnames", argnames, str),
    )
    try:
      parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
      return cls(tuple(sorted(nums)), tuple(sorted(names)))  # no signature: taken as given
    kinds = {param.kind for param in parameters}
    positional = [
      param
      for param in parameters
      if param.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    if inspect.Parameter.VAR_POSITIONAL not in kinds:
      bad = sorted(i for i in nums if not -len(positional) <= i < len(positional))
      if bad:
        raise ValueError(
          f"autocast({name!r}): static_argnums={bad} out of range: {name} takes {len(positional)} positional "
          f"argument(s) ({', '.join(p.name for p in positional) or 'none'}); allowed: 0 to {len(positional) - 1}, "
          "or negative positions counted from the end."
        )
      nums = {i % len(positional) for i in nums}
    if inspect.Parameter.VAR_KEYWORD not in kinds:
      known = {p.name for p in parameters if p.kind != inspect.Parameter.POSITIONAL_ONLY}
      bad_names = sorted(names - known)
      if bad_names:
        raise ValueError(
          f"autocast({name!r}): static_argnames={bad_names} are not parameters of {name}; its parameters: "
          f"{', '.join(sorted(known)) or 'none'}."
        )
    for i, param in enumerate(positional):
      if param.name in names:
        nums.add(i)
      if i in nums and param.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD:
        names.add(param.name)
    return cls(tuple(sorted(nums)), tuple(sorted(names)))


def _as_set(where: str, what: str, value: Any, kind: type) -> set:
  """``value`` (one ``kind`` or a sequence of them) as a set, or a TypeError saying what is allowed."""
  if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
    return {value}
  items = list(value) if isinstance(value, (list, tuple, set, frozenset, range)) else None
  if items is None or not all(isinstance(v, kind) and not isinstance(v, bool) for v in items):
    example = "1 or (0, 2)" if kind is int else "'train' or ('train', 'config')"
    raise TypeError(
      f"autocast({where!r}): {what} must be {'an int' if kind is int else 'a string'} or a sequence of them, "
      f"e.g. {example}; got {value!r}"
    )
  return set(items)


def _name(fn: Any) -> str:
  return getattr(fn, "__name__", None) or type(fn).__name__


def _check_callable(fn: Any, where: str) -> None:
  """A TypeError naming what was given in place of the function, if it is not callable."""
  if callable(fn):
    return
  hint = " Did you swap fn and policy?" if isinstance(fn, (str, Policy)) else ""
  raise TypeError(
    f"{where}(fn, policy, ...): fn must be a function (e.g. a loss, or jax.value_and_grad(loss)); got "
    f"{type(fn).__name__} {fn!r:.60}.{hint}"
  )


def _check_key(fn: Callable[..., Any], policy: Policy, key: Any) -> jax.Array:
  """``key`` as one PRNG key, or a PolicyError saying how to pass it."""
  name = getattr(fn, "__name__", repr(fn))
  if key is None:
    raise PolicyError(
      f"autocast({name!r}, {str(policy)!r}) rounds {'+'.join(policy.stochastic)} stochastically and needs "
      "a key: call it with rounding_key=<a PRNG key>, e.g. f(params, batch, rounding_key=jax.random.fold_in("
      "step_key, 1)), a fresh key each step (like a dropout key). It is not rounded to nearest silently."
    )
  key = key if isinstance(key, jax.Array) else jnp.asarray(key)
  typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
  if (typed and key.shape != ()) or (not typed and (key.dtype != jnp.uint32 or key.shape != (2,))):
    raise PolicyError(
      f"autocast({name!r}): rounding_key must be one PRNG key (jax.random.key(0) or jax.random.PRNGKey(0)); "
      f"got {key.dtype}{list(key.shape)}. For one stream per example, vmap over keys."
    )
  return key


def _as_policy(policy: Policy | str) -> Policy:
  if isinstance(policy, Policy):
    return policy
  if isinstance(policy, str):
    return Policy.parse(policy)
  raise TypeError(f"policy must be a precision.Policy or a string like 'c=cb16'; got {type(policy).__name__}")


_ARRAY_LEAVES = (jax.Array, np.ndarray, np.generic, int, float, complex, jax.ShapeDtypeStruct)


class _Outputs(NamedTuple):
  """How to rebuild ``fn``'s result from the traced outputs: its treedef, and the leaves that
  are not arrays (functions, strings of an Equinox module ...), which are returned as they are."""

  tree: Any
  static: tuple[Any, ...]  # per leaf: the object itself, or _TRACED for a traced output

  def unflatten(self, outs: Sequence[Any]) -> Any:
    it = iter(outs)
    return jax.tree.unflatten(self.tree, [next(it) if s is _TRACED else s for s in self.static])


_TRACED = object()


def _traced_leaves(tree: Any, leaves: list[Any]) -> list[bool]:
  """Which of ``tree``'s ``leaves`` (``jax.tree.leaves(tree)``) are traced: arrays, and Python
  numbers that are neither bools nor fields of an Equinox module.

  A Python bool is a flag (``inference``, ``use_bias``, ``deterministic``): traced, ``if flag:``
  fails. Inside an Equinox module only arrays are traced, as ``eqx.filter_jit`` does: its Python
  numbers are hyperparameters (a convolution's strides, a number of heads, a dropout rate).
  """
  traced = [isinstance(leaf, _ARRAY_LEAVES) and not isinstance(leaf, bool) for leaf in leaves]
  eqx = _sys.modules.get("equinox")
  if eqx is None:
    return traced
  pieces = jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, eqx.Module))
  if not any(isinstance(piece, eqx.Module) for piece in pieces):
    return traced
  i = 0
  for piece in pieces:
    n = len(jax.tree.leaves(piece)) if isinstance(piece, eqx.Module) else 1
    if isinstance(piece, eqx.Module):
      for j in range(i, i + n):
        traced[j] = traced[j] and isinstance(leaves[j], _ARRAYS)
    i += n
  return traced


_ARRAYS = (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct)


def _trace(
  fn: Callable[..., Any], statics: _Statics, args: tuple, kwargs: dict
) -> tuple[Any, _Outputs, list]:
  """(closed jaxpr, how to rebuild the output, flat dynamic arguments) of ``fn(*args, **kwargs)``.

  Leaves that are arrays or Python numbers are traced (not Python bools, nor the numbers of an
  Equinox module: `_traced_leaves`); any other leaf (a function or a string held by an Equinox
  module, an enum, a config object) is static: passed to ``fn`` as it is, as ``eqx.filter_jit``
  does. Such leaves among ``fn``'s outputs are returned as they are."""
  static_args = {i: args[i] for i in statics.argnums if i < len(args)}
  static_kwargs = {k: kwargs[k] for k in statics.argnames if k in kwargs}
  dyn_args = tuple(None if i in static_args else a for i, a in enumerate(args))
  dyn_kwargs = {k: v for k, v in kwargs.items() if k not in static_kwargs}
  leaves, in_tree = jax.tree.flatten((dyn_args, dyn_kwargs))
  traced = _traced_leaves((dyn_args, dyn_kwargs), leaves)
  flat = [leaf for leaf, t in zip(leaves, traced) if t]
  outputs: list[_Outputs] = []

  def flat_fn(*dynamic: Any) -> list[Any]:
    it = iter(dynamic)
    a, k = jax.tree.unflatten(in_tree, [next(it) if t else leaf for leaf, t in zip(leaves, traced)])
    a = tuple(static_args.get(i, x) for i, x in enumerate(a))
    out = fn(*a, **k, **static_kwargs)
    out_flat, out_tree = jax.tree.flatten(out)
    keep = tuple(_TRACED if t else o for o, t in zip(out_flat, _traced_leaves(out, out_flat)))
    outputs.append(_Outputs(out_tree, keep))
    return [o for o, s in zip(out_flat, keep) if s is _TRACED]

  with _tracing():
    closed = jax.make_jaxpr(flat_fn)(*flat)
  return closed, outputs[0], flat


def _run(
  p: _Pass, closed: jcore.ClosedJaxpr, flat: Sequence[Any], rounded_outputs: int | None = None
) -> list[Any]:
  """Interpret ``closed`` on ``flat``; float32 outputs (the first ``rounded_outputs`` of them, all
  if None) are rounded to the policy's output format."""
  tags = [_RAW if _is_f32(v.aval) else None for v in closed.jaxpr.invars]
  outs, out_tags = _interpret(p, closed.jaxpr, closed.consts, list(flat), tags)
  if p.policy.output == float32:
    return outs
  # An output already rounded to the output format (it is the compute format) is not rounded again.
  done = (ROUNDED, CONST_ROUNDED) if p.policy.output == p.fmt and p.policy.is_mixed else ()
  n = len(outs) if rounded_outputs is None else rounded_outputs
  return [
    p.round_to(o, p.policy.output, "<output>")
    if i < n and _is_f32(jax.typeof(o)) and (t is None or t.state not in done)
    else o
    for i, (o, t) in enumerate(zip(outs, out_tags))
  ]


class _Lifted(NamedTuple):
  """A call whose arguments hold Flax NNX modules, as a pure function of their state."""

  fn: Callable[..., Any]  # (state, other leaves) -> (fn's result, the modules' new state)
  args: tuple  # (state, other leaves)
  finish: Callable[[Any], Any]  # writes the new state into the caller's modules; returns the result
  traced_outputs: list[int]  # filled while tracing: how many traced outputs fn's result has


def _lift_nnx_modules(fn: Callable[..., Any], statics: _Statics, args: tuple, kwargs: dict) -> _Lifted | None:
  """``fn(*args, **kwargs)`` as ``nnx.jit`` runs it, where an argument holds an NNX module.

  A module passed to a traced function is a copy inside the trace: what ``fn`` changes in it
  (BatchNorm statistics, the counts of the ``nnx.Rngs`` that draw dropout masks) would be lost.
  Here the modules are split into their state (traced), merged inside, and the state ``fn`` leaves
  is written back with ``nnx.update``, as ``nnx.jit`` does. None when no argument holds a module
  (or Flax is not imported: nothing here imports it).
  """
  nnx = _sys.modules.get("flax.nnx")
  if nnx is None:
    return None
  is_node = nnx.graph.is_graph_node
  static_args = {i: args[i] for i in statics.argnums if i < len(args)}
  static_kwargs = {k: kwargs[k] for k in statics.argnames if k in kwargs}
  dyn_args = tuple(None if i in static_args else a for i, a in enumerate(args))
  dyn_kwargs = {k: v for k, v in kwargs.items() if k not in static_kwargs}
  leaves, tree = jax.tree.flatten((dyn_args, dyn_kwargs), is_leaf=is_node)
  where = [i for i, leaf in enumerate(leaves) if is_node(leaf)]
  if not where:
    return None
  nodes = tuple(leaves[i] for i in where)
  graphdef, state = nnx.split(nodes)
  rest = [None if i in where else leaf for i, leaf in enumerate(leaves)]
  traced_outputs: list[int] = []

  def pure(state: Any, rest: list) -> tuple[Any, Any]:
    copies = nnx.merge(graphdef, state)
    full = list(rest)
    for i, copy in zip(where, copies):
      full[i] = copy
    a, k = jax.tree.unflatten(tree, full)
    a = tuple(static_args.get(i, x) for i, x in enumerate(a))
    out = fn(*a, **k, **static_kwargs)
    traced_outputs.append(sum(isinstance(o, _ARRAY_LEAVES) for o in jax.tree.leaves(out)))
    return out, nnx.state(copies)

  def finish(result: tuple[Any, Any]) -> Any:
    out, new_state = result
    # Only what fn changed: an unchanged variable comes back as the very value passed in, and
    # writing it would still count as a mutation (refused by NNX from another trace level, as
    # when autocast runs inside jax.grad inside jax.jit).
    before = dict(nnx.to_flat_state(state))
    changed = [
      (path, var)
      for path, var in nnx.to_flat_state(new_state)
      if path not in before
      or any(a is not b for a, b in zip(jax.tree.leaves(var), jax.tree.leaves(before[path]), strict=True))
    ]
    if changed:
      nnx.update(nodes, nnx.from_flat_state(changed))
    return out

  return _Lifted(pure, (state, rest), finish, traced_outputs)


# ---- the interpreter ----


class _Pass:
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
    # what a literal +-finfo(float32).max stands for (`_extremes`): the compute format's largest number
    # where the attention scores, which a mask bias joins, are rounded
    self.extreme: float = self.fmt.max if self.rules["attention_softmax"] == "round" else float32.max

  def child(self) -> _Pass:
    """A pass for a sub-jaxpr; its rounding stream is a fresh site of this one's."""
    child = _Pass(self.policy, CastLog(), self.score_dots, self.observer)
    child.analysed = self.analysed
    child.extreme = self.extreme
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

  def round_result(self, x: jax.Array, rule_class: str) -> jax.Array | _Deferred:
    """The rounding of an equation's result: as `round_class`, except that a nearest-even one
    is returned `_Deferred`, bound by `_interpret` once its consumer is known (see
    `_rounds_cotangent`)."""
    if rule_class in self.stochastic or not SKIP_ROUNDED_COTANGENTS:
      return self.round_class(x, rule_class)
    return _Deferred(x)

  def round_to(self, x: jax.Array, fmt: FloatFormat, primitive: str | None = None) -> jax.Array:
    if fmt == float32:
      return x
    if primitive is not None:
      self.log.record(primitive, "output", rounded=_size(x))
    return _rounding.round_p.bind(x, fmt=fmt, mode="nearest_even")

  def round(self, x: jax.Array) -> jax.Array:
    return self.round_to(x, self.fmt)


class _Deferred(NamedTuple):
  """A nearest-even rounding of ``value`` to the compute format, not bound yet."""

  value: jax.Array

  def bind(self, p: _Pass, cotangent_rounded: bool = False) -> jax.Array:
    params = {"ct_rounded": True} if cotangent_rounded else {}
    return _rounding.round_p.bind(self.value, fmt=p.fmt, mode="nearest_even", **params)


# A rounding whose cotangent is provably already rounded keeps ``ct_rounded=True`` (its
# transpose passes the cotangent on unchanged; see `_rounds_cotangent`). A switch for tests,
# which check that the results do not depend on it.
SKIP_ROUNDED_COTANGENTS = True
_PASS_COTANGENT = frozenset(("add", "sub", "add_any"))  # transpose: the cotangent, +-, same shape
_COMMUTING = frozenset(
  ("reshape", "squeeze", "expand_dims", "transpose", "rev", "copy", "copy_p", "convert_element_type")
)


def _is_f32(aval: Any) -> bool:
  return getattr(aval, "dtype", None) == jnp.float32


def _size(x: Any) -> int:
  return math.prod(getattr(x, "shape", ()))


# The states form a lattice: CONST_ROUNDED < ROUNDED < RAW and CONST_ROUNDED < CONST < FLOAT32 < RAW.
_JOIN = {
  frozenset((ROUNDED, CONST_ROUNDED)): ROUNDED,
  frozenset((CONST, CONST_ROUNDED)): CONST,
  frozenset((FLOAT32, CONST)): FLOAT32,
  frozenset((FLOAT32, CONST_ROUNDED)): FLOAT32,
}


def _join(a: Tag | None, b: Tag | None) -> Tag | None:
  if a is None or b is None:
    return a if b is None else b
  state = a.state if a.state == b.state else _JOIN.get(frozenset((a.state, b.state)), RAW)
  return Tag(state, a.attention or b.attention)


def _join_all(tags: Sequence[Tag | None]) -> Tag:
  present = [t for t in tags if t is not None]
  if not present:
    return _RAW
  return functools.reduce(_join, present)  # type: ignore[return-value]


def _representable(value: float, fmt: FloatFormat) -> bool:
  """Whether a float32 scalar is exactly a value of ``fmt`` (host arithmetic, exact)."""
  if value == 0 or not math.isfinite(value):
    return True
  exponent = math.frexp(abs(value))[1] - 1
  quantum = max(exponent, fmt.emin) - fmt.mantissa_bits
  return abs(value) <= fmt.max and (value / 2.0**quantum).is_integer()


def _literal_tag(p: _Pass, literal: Any) -> Tag | None:
  if not _is_f32(literal.aval):
    return None
  value = np.asarray(literal.val)
  if value.ndim == 0 and _representable(float(value), p.fmt):
    return Tag(CONST_ROUNDED)
  return Tag(CONST)


def _region(name_stack: Any) -> str | None:
  text = str(name_stack)
  if FLOAT32_SCOPE in text:
    return "float32_region"
  if _NESTED_SCOPE in text:
    return "nested_autocast"
  return None


def _interpret(
  p: _Pass, jaxpr: jcore.Jaxpr, consts: Sequence[Any], args: Sequence[Any], tags: Sequence[Tag | None]
) -> tuple[list[Any], list[Tag | None]]:
  """Evaluate ``jaxpr`` on ``args`` at the current trace, applying the policy's rules."""
  if id(jaxpr) not in p.analysed:
    _find_attention(jaxpr, [None] * len(jaxpr.invars), p.score_dots, p.analysed)
  env: dict[Any, tuple[Any, Tag | None]] = {}
  memo: dict[Any, jax.Array] = {}  # var -> its rounded value (round each weight once)

  def read(atom: Any) -> tuple[Any, Tag | None]:
    if isinstance(atom, jcore.Literal):
      return atom.val, _literal_tag(p, atom)
    return env[atom]

  for var, value in zip(jaxpr.constvars, consts):
    env[var] = (value, _RAW if _is_f32(var.aval) else None)
  for var, value, tag in zip(jaxpr.invars, args, tags):
    env[var] = (value, tag if _is_f32(var.aval) else None)
  single = _single_uses(jaxpr) if SKIP_ROUNDED_COTANGENTS and p.observer is None else {}
  for eqn in jaxpr.eqns:
    pairs = [read(atom) for atom in eqn.invars]
    values = [v for v, _ in pairs]
    in_tags = [t for _, t in pairs]
    if _commutes(eqn, values) and single.get(eqn.outvars[0]) is not None:
      # A move of a rounding's only result on to a consumer that may pass a rounded cotangent
      # back: round(move(x)) == move(round(x)) bit for bit (and the same element count), so
      # the move is bound on the unrounded value and the rounding stays deferred.
      outs, out_tags = _apply(p, eqn, [values[0].value], in_tags, memo)
      env[eqn.outvars[0]] = (_Deferred(outs[0]), out_tags[0])
      continue
    for i, value in enumerate(values):
      if isinstance(value, _Deferred):  # this equation is the value's only consumer
        values[i] = value.bind(p, _rounds_cotangent(p, eqn, i, in_tags))
    name_stack = source_info_util.current_name_stack() + eqn.source_info.name_stack
    with source_info_util.user_context(eqn.source_info.traceback, name_stack=name_stack), eqn.ctx.manager:
      region = _region(eqn.source_info.name_stack)  # this jaxpr's own scopes, not the caller's
      if region is None:
        values, in_tags = _extremes(p, eqn, values, in_tags)
        outs, out_tags = _apply(p, eqn, values, in_tags, memo)
      else:
        outs, out_tags = _in_region(p, eqn, values, region)
    outs = [
      value.bind(p) if isinstance(value, _Deferred) and single.get(var) is None else value
      for var, value in zip(eqn.outvars, outs)
    ]
    if p.observer is not None:
      p.observer(eqn, values, in_tags, outs, out_tags)
    for var, value, tag in zip(eqn.outvars, outs, out_tags):
      env[var] = (value, tag)
  results = [read(atom) for atom in jaxpr.outvars]
  return [v for v, _ in results], [t for _, t in results]


# A comparison or a clamp with float32's largest number tests a float32 value (an overflow count,
# ``clip(x, -finfo.max, finfo.max)``): its literal keeps its value.
_NOT_EXTREMES = frozenset({"lt", "le", "gt", "ge", "eq", "ne", "max", "min", "clamp"})


def _extremes(
  p: _Pass, eqn: Any, values: list[Any], tags: list[Tag | None]
) -> tuple[list[Any], list[Tag | None]]:
  """Literals ``+-finfo(float32).max`` become ``+-p.extreme``, the compute format's largest number.

  Code writes ``jnp.finfo(dtype).min`` for "the lowest number of the working dtype": Hugging Face's
  attention bias ``select(mask > 0, full(0), full(finfo(dtype).min))``, flax's ``big_neg``. Where the
  policy rounds the attention scores (``attention_softmax="round"``: level 2, modelzoo's cbfloat16
  override), that dtype is the compute format, and with its largest number the program computes what
  it computes with the format as its dtype. Kept as float32's, the rounding of ``scores + bias`` is an
  infinity, and a row of scores masked everywhere (the query at a left-padded position) gives
  ``inf - inf``: NaN where float32 gives a uniform row. Where the scores stay float32 (and under a
  float32 policy) nothing changes: there float32's number is the working dtype's, and a smaller one
  (float16's 65504) would not absorb the scores it is added to. Comparisons, ``max``, ``min`` and
  ``clamp`` keep the literal (`_NOT_EXTREMES`).
  """
  if p.extreme == float32.max or eqn.primitive.name in _NOT_EXTREMES:
    return values, tags
  values, tags = list(values), list(tags)
  for i, atom in enumerate(eqn.invars):
    if not (isinstance(atom, jcore.Literal) and _is_f32(atom.aval) and np.ndim(atom.val) == 0):
      continue
    if abs(float(atom.val)) == float32.max:
      new = math.copysign(p.extreme, float(atom.val))
      values[i] = np.asarray(new, np.float32) if isinstance(atom.val, (np.ndarray, np.generic)) else new
      tags[i] = Tag(CONST_ROUNDED)
  return values, tags


def _single_uses(jaxpr: jcore.Jaxpr) -> dict[Any, Any]:
  """Variables read exactly once, by an equation that may pass a rounded cotangent back
  (`_PASS_COTANGENT`, ``reduce_sum``), and not results of ``jaxpr``: variable -> equation."""
  uses: dict[Any, list[Any]] = {}
  for eqn in jaxpr.eqns:
    for atom in eqn.invars:
      if isinstance(atom, jcore.Var):
        uses.setdefault(atom, []).append(eqn)
  for atom in jaxpr.outvars:
    if isinstance(atom, jcore.Var):
      uses.setdefault(atom, []).extend((None, None))
  candidates = (*_PASS_COTANGENT, "reduce_sum", *_COMMUTING)
  return {v: e[0] for v, e in uses.items() if len(e) == 1 and e[0].primitive.name in candidates}


def _commutes(eqn: Any, values: list[Any]) -> bool:
  """Whether ``eqn`` moves a deferred rounding's value without changing any element or the
  element count (a reshape, transpose, reversal, copy or float32 -> float32 conversion)."""
  if eqn.primitive.name not in _COMMUTING or len(values) != 1 or not isinstance(values[0], _Deferred):
    return False
  return _is_f32(eqn.invars[0].aval) and _is_f32(eqn.outvars[0].aval)


def _rounds_cotangent(p: _Pass, eqn: Any, position: int, tags: list[Tag | None]) -> bool:
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
  if _region(eqn.source_info.name_stack) is not None or len(eqn.outvars) != 1:
    return False
  if name in _PASS_COTANGENT and eqn.invars[position].aval.shape != eqn.outvars[0].aval.shape:
    return False
  op_class = PRIMITIVE_CLASSES.get(name, "unknown")
  treatment, rule_class = _value_treatment(p, op_class, [t for t in tags if t is not None])
  return treatment == "round" and rule_class not in p.stochastic


def _bind(eqn: Any, values: Sequence[Any], **param_updates: Any) -> list[Any]:
  params = eqn.primitive.get_bind_params({**eqn.params, **param_updates})
  out = eqn.primitive.bind(*values, **params)
  return list(out) if eqn.primitive.multiple_results else [out]


def _in_region(p: _Pass, eqn: Any, values: list[Any], region: str) -> tuple[list, list]:
  """An equation of a float32 region or of a nested autocast: bound exactly as written."""
  outs = _bind(eqn, values)
  avals = [v.aval for v in eqn.outvars]
  size = sum(_size(a) for a in avals if _is_f32(a))
  if region == "float32_region":
    p.log.record(eqn.primitive.name, region, kept_float32=size)
    return outs, [Tag(FLOAT32) if _is_f32(a) else None for a in avals]
  p.log.record(eqn.primitive.name, region, untouched=size)
  return outs, [_RAW if _is_f32(a) else None for a in avals]


def _apply(
  p: _Pass, eqn: Any, values: list[Any], tags: list[Tag | None], memo: dict[Any, jax.Array]
) -> tuple[list[Any], list[Tag | None]]:
  name = eqn.primitive.name
  handler = _CONTROL_FLOW.get(name)
  if handler is not None:
    return handler(p, eqn, values, tags)
  out_avals = [v.aval for v in eqn.outvars]
  op_class = PRIMITIVE_CLASSES.get(name, "unknown")
  if not any(_is_f32(a) for a in out_avals):
    outs = _bind(eqn, values)
    p.log.record(
      name, "integer" if op_class != "cast" else "cast", untouched=sum(_size(a) for a in out_avals)
    )
    return outs, [None] * len(outs)
  if op_class == "matmul":
    return _matmul(p, eqn, values, tags, memo)
  if op_class in ("elementwise", "transcendental", "reduction", "exact"):
    return _value_op(p, eqn, values, tags, op_class)
  outs = _bind(eqn, values)
  size = sum(_size(a) for a in out_avals)
  if op_class == "data_movement":
    tag = _join_all(tags)
    p.log.record(name, op_class, untouched=size)
    return outs, [tag if _is_f32(a) else None for a in out_avals]
  if op_class == "cast":
    same = name == "convert_element_type" and len(tags) == 1 and tags[0] is not None
    tag = tags[0] if same else _RAW
    if name == "precision_round" and eqn.params["fmt"] == p.fmt and eqn.params["mode"] == "nearest_even":
      tag = Tag(ROUNDED, tags[0].attention if tags[0] else False)
    p.log.record(name, op_class, untouched=size)
    return outs, [tag if _is_f32(a) else None for a in out_avals]
  p.log.record(name, "unknown", untouched=size)
  return outs, [_RAW if _is_f32(a) else None for a in out_avals]


def _value_op(
  p: _Pass, eqn: Any, values: list[Any], tags: list[Tag | None], op_class: str
) -> tuple[list, list]:
  """Elementwise, transcendental, reduction and exact ops: round or keep the result."""
  name = eqn.primitive.name
  out_avals = [v.aval for v in eqn.outvars]
  size = sum(_size(a) for a in out_avals if _is_f32(a))
  floats = [t for t in tags if t is not None]
  attention = any(t.attention for t in floats)
  outs = _bind(eqn, values)

  def tagged(state: str) -> list[Tag | None]:
    return [Tag(state, attention) if _is_f32(a) else None for a in out_avals]

  treatment, rule_class = _value_treatment(p, op_class, floats)
  if treatment == "constant":  # computed from constants only: a constant
    p.log.record(name, "constant", untouched=size)
    exact = op_class == "exact" and all(t.state == CONST_ROUNDED for t in floats)
    return outs, tagged(CONST_ROUNDED if exact and floats else CONST)
  if treatment == "exact":  # the result is one of the inputs' values: never rounded
    p.log.record(name, op_class, untouched=size)
    return outs, tagged(_join_all(floats).state)
  if treatment == "round":
    p.log.record(name, rule_class, rounded=size)
    outs = [p.round_result(o, rule_class) if _is_f32(a) else o for o, a in zip(outs, out_avals)]
    return outs, tagged(ROUNDED)
  p.log.record(name, rule_class, kept_float32=size)
  return outs, tagged(FLOAT32)


def _value_treatment(p: _Pass, op_class: str, floats: list[Tag]) -> tuple[str, str]:
  """(treatment, rule class) of a value op whose float32 inputs have tags ``floats``:
  ``"constant"``, ``"exact"``, ``"round"`` or ``"float32"``."""
  if all(t.state in _CONSTANTS for t in floats):
    return "constant", op_class
  if op_class == "exact":
    return "exact", op_class
  if op_class == "elementwise" and all(t.state in (FLOAT32, *_CONSTANTS) for t in floats):
    return "float32", op_class
  if op_class not in ("elementwise", "transcendental", "reduction"):
    return "unknown", op_class
  rule_class = "attention_softmax" if any(t.attention for t in floats) else op_class
  return ("round" if p.rules[rule_class] == "round" else "float32"), rule_class


# ---- attention: recognised by structure ----


class _Facts(NamedTuple):
  """Per variable: score-product candidates it is derived from (``dots``), and those of
  which it is an ``exp``, a sum of an ``exp``, or a softmax."""

  dots: frozenset = frozenset()
  exps: frozenset = frozenset()
  sums: frozenset = frozenset()
  softmax: frozenset = frozenset()


_NO_FACTS = _Facts()
_KEEP_ALL = ("data_movement", "cast", "exact", "control_flow")


def _union(facts: Sequence[_Facts]) -> _Facts:
  if not facts:
    return _NO_FACTS
  return _Facts(*(frozenset().union(*(getattr(f, k) for f in facts)) for k in _Facts._fields))


def _find_attention(
  jaxpr: jcore.Jaxpr, in_facts: Sequence[_Facts | None], found: set[int], seen: set[int]
) -> list:
  """Forward data flow over ``jaxpr`` (and the jaxprs inside it): adds to ``found`` the
  ids of the score products (module docstring) and returns the output variables' facts."""
  seen.add(id(jaxpr))
  env: dict[Any, _Facts] = {}

  def get(atom: Any) -> _Facts:
    return _NO_FACTS if isinstance(atom, jcore.Literal) else env.get(atom, _NO_FACTS)

  for var, facts in zip(jaxpr.invars, in_facts):
    env[var] = facts or _NO_FACTS
  for eqn in jaxpr.eqns:
    ins = [get(a) for a in eqn.invars]
    name = eqn.primitive.name
    outs = _sub_jaxpr_facts(eqn, ins, found, seen)
    if outs is None:
      merged = _union(ins)
      op_class = PRIMITIVE_CLASSES.get(name, "unknown")
      if name == "dot_general":
        for facts in ins:
          found.update(facts.softmax)
        out = _Facts(dots=frozenset((id(eqn),)))
      elif op_class == "matmul":
        out = _NO_FACTS
      elif name == "exp":
        out = _Facts(dots=merged.dots, exps=merged.dots)
      elif name == "reduce_sum":
        out = _Facts(dots=merged.dots, sums=merged.exps)
      elif name == "div" and len(ins) == 2:
        softmax = (ins[0].exps & ins[1].sums) | ins[0].softmax
        out = _Facts(dots=merged.dots, softmax=softmax)
      elif name == "mul":
        out = _Facts(dots=merged.dots, softmax=merged.softmax)
      elif op_class in _KEEP_ALL:
        out = merged
      else:
        out = _Facts(dots=merged.dots)
      outs = [out] * len(eqn.outvars)
    for var, facts in zip(eqn.outvars, outs):
      env[var] = facts
  return [get(a) for a in jaxpr.outvars]


def _sub_jaxpr_facts(eqn: Any, ins: list[_Facts], found: set[int], seen: set[int]) -> list | None:
  """Facts of a higher-order equation's outputs, from its body; None for other equations."""
  params, name = eqn.params, eqn.primitive.name

  def run(closed: Any, facts: Sequence[_Facts]) -> list:
    jaxpr = closed.jaxpr if isinstance(closed, jcore.ClosedJaxpr) else closed
    padded = [_NO_FACTS] * (len(jaxpr.invars) - len(facts)) + list(facts)
    return _find_attention(jaxpr, padded, found, seen)

  if name in ("jit", "pjit", "closed_call", "core_call", "remat2", "checkpoint", "shard_map"):
    return run(params.get("jaxpr", params.get("call_jaxpr")), ins)
  if name in ("custom_jvp_call", "custom_vjp_call"):
    return run(params["call_jaxpr"], ins)
  if name == "cond":
    results = [run(b, ins[1:]) for b in params["branches"]]
    return [_union(list(fs)) for fs in zip(*results)]
  if name == "scan":
    n_consts, n_carry = params["num_consts"], params["num_carry"]
    carry = ins[n_consts : n_consts + n_carry]
    for _ in range(2):  # the carry's facts after one and two iterations
      outs = run(params["jaxpr"], ins[:n_consts] + carry + ins[n_consts + n_carry :])
      carry = [_union([a, b]) for a, b in zip(carry, outs[:n_carry])]
    return carry + outs[n_carry:]
  if name == "while":
    nc, nb = params["cond_nconsts"], params["body_nconsts"]
    carry = ins[nc + nb :]
    for _ in range(2):
      carry = [_union([a, b]) for a, b in zip(carry, run(params["body_jaxpr"], ins[nc : nc + nb] + carry))]
    return carry
  return None


# ---- matrix products ----


def _matmul(
  p: _Pass, eqn: Any, values: list[Any], tags: list[Tag | None], memo: dict[Any, jax.Array]
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
      outs = _bind(eqn, values, **_dot_precision(eqn, TRUE_FLOAT32))
      p.log.record(name, rule_class, kept_float32=_size(out_aval))
      return outs, [Tag(FLOAT32, score)]
    outs = _bind(eqn, values)
    p.log.record(name, rule_class, untouched=_size(out_aval))
    return outs, [_RAW if _is_f32(out_aval) else None]
  rounded = 0
  operands = list(values)
  for i, (atom, tag) in enumerate(zip(eqn.invars[:operand_count], tags[:operand_count])):
    if tag.state in (ROUNDED, CONST_ROUNDED):
      continue
    if isinstance(atom, jcore.Var) and atom in memo:
      operands[i] = memo[atom]
      continue
    operands[i] = p.round_class(values[i], rule_class)
    rounded += _size(values[i])
    if isinstance(atom, jcore.Var):
      memo[atom] = operands[i]
  chunked = _mixed_product(p, eqn, operands, rule_class) if treatment == "mixed_accumulate" else None
  if chunked is None:
    native = _native_dtype(p) if name in ("dot_general", "conv_general_dilated") else None

    def product(lhs: Any, rhs: Any, precision: tuple) -> jax.Array:
      f32 = {"preferred_element_type": np.dtype(np.float32)} if lhs.dtype != jnp.float32 else {}
      return _bind(eqn, [lhs, rhs, *operands[2:]], **_dot_precision(eqn, precision), **f32)[0]

    out = p.round_result(_rounded_product(product, operands[0], operands[1], native), rule_class)
    rounded += _size(out_aval)
  else:
    out, n = chunked
    rounded += (2 * n - 1) * _size(out_aval)
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
# Native tensor cores (`_native_dtype`, `_rounded_product`): on GPUs a product of two rounded
# operands whose values a native 16-bit dtype holds exactly (compute bfloat16 or float16, and
# the float8 formats, which bfloat16 holds) runs on that dtype, float32 accumulation. The
# operands are the same numbers, so every product is the same; only the float32 summation
# order inside the GPU library may differ, as between any two GEMM algorithms. Platforms
# where the native branch is taken; elsewhere (CPUs, TPUs) the TF32 binding above, bit for
# bit today's program. ``Policy(products="tf32")`` keeps TF32 everywhere.
NATIVE_PLATFORMS = ("cuda", "rocm")
NATIVE_OPERANDS = (jax.lax.Precision.DEFAULT, jax.lax.Precision.DEFAULT)  # explicit: not the config's default


def _native_dtype(p: _Pass) -> Any:
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


def _rounded_product(product: Callable[..., jax.Array], lhs: Any, rhs: Any, native: Any) -> jax.Array:
  """``product(lhs, rhs, precision)`` of two rounded operands: TF32-eligible (`ROUNDED_OPERANDS`),
  or, with a ``native`` dtype, on that dtype's tensor cores on GPUs (`NATIVE_PLATFORMS`).

  The native form is ``platform_dependent``: lowered for a CPU it is exactly the TF32 binding
  (XLA CPU sums bfloat16 operands in another order, so converting there would change bits).
  Its derivative is the TF32 binding's (a custom JVP), so tangents and cotangents stay float32
  as without native products: a conversion to bfloat16 would round the cotangent reaching a
  rounded operand before that rounding's own transpose does (twice for float8 formats, and
  before a stochastic rounding of it)."""

  def tf32(a: Any, b: Any) -> jax.Array:
    return product(a, b, ROUNDED_OPERANDS)

  if native is None:
    return tf32(lhs, rhs)

  def tensor_cores(a: Any, b: Any) -> jax.Array:
    return product(a.astype(native), b.astype(native), NATIVE_OPERANDS)

  @jax.custom_jvp
  def rounded(a: Any, b: Any) -> jax.Array:
    branches = dict.fromkeys(NATIVE_PLATFORMS, tensor_cores)
    return jax.lax.platform_dependent(a, b, **branches, default=tf32)

  def rounded_jvp(primals: Any, tangents: Any) -> tuple[jax.Array, jax.Array]:
    (a, b), (da, db) = primals, tangents
    out = rounded(a, b)
    terms = [tf32(da, b)] if not isinstance(da, SymbolicZero) else []  # dot_general's own JVP
    terms += [tf32(a, db)] if not isinstance(db, SymbolicZero) else []
    return out, functools.reduce(jnp.add, terms) if terms else jnp.zeros_like(out)

  rounded.defjvp(rounded_jvp, symbolic_zeros=True)
  return rounded(lhs, rhs)


def _dot_precision(eqn: Any, precision: tuple) -> dict[str, Any]:
  """Parameter update giving a matrix product ``precision`` (none for products without one)."""
  return {"precision": precision} if "precision" in eqn.params else {}


def _mixed_product(p: _Pass, eqn: Any, operands: list[Any], rule_class: str) -> tuple[jax.Array, int] | None:
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
    return _ordered_sum(p, _dot_chunk_sums(operands, eqn.params, chunks, native), rule_class), chunks[2]
  if eqn.primitive.name == "conv_general_dilated":
    partial = _conv_chunk_sums(operands, eqn.params, p.block, native)
    return None if partial is None else (_ordered_sum(p, partial, rule_class), partial.shape[0])
  return None


def _ordered_sum(p: _Pass, partial: jax.Array, rule_class: str) -> jax.Array:
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
  operands: list[Any], params: dict, chunks: tuple[int, int, int], native: Any = None
) -> jax.Array:
  """float32 sums of each chunk of a dot_general's contraction, stacked on a leading axis.

  The chunk axis becomes a leading batch axis of one batched dot_general (zero padding
  completes the last chunk exactly), bound by `_rounded_product` (``native``: its dtype).
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

  return _rounded_product(product, lhs, rhs, native)


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


# ---- higher-order primitives ----


def _retrace(
  p: _Pass, jaxpr: jcore.Jaxpr, consts: Sequence[Any], tags: Sequence[Tag | None], iteration: bool = False
) -> tuple[jcore.Jaxpr, list[Any], list[Tag | None], CastLog]:
  """Trace the transformed ``jaxpr`` to a new jaxpr (constvars hold the new constants).

  ``iteration``: the new jaxpr takes one more, last, argument: a uint32 iteration index that
  is folded into the child's rounding key (fresh stochastic bits in each loop iteration)."""
  child = p.child()
  loop_key = child.key
  box: list[list[Tag | None]] = []

  def body(*args: Any) -> list[Any]:
    if iteration:
      *args, i = args
      child.key, child.sites = (None if loop_key is None else jax.random.fold_in(loop_key, i)), 0
    outs, out_tags = _interpret(child, jaxpr, consts, args, tags)
    box.append(out_tags)
    return outs

  in_avals = [v.aval for v in jaxpr.invars] + ([jax.core.ShapedArray((), jnp.uint32)] if iteration else [])
  debug = jaxpr.debug_info
  if iteration and debug is not None and debug.arg_names is not None:
    debug = debug._replace(arg_names=(*debug.arg_names, "iteration"))
  new_jaxpr, _, new_consts = _pe.trace_to_jaxpr_dynamic(lu.wrap_init(body, debug_info=debug), in_avals)
  return new_jaxpr, list(new_consts), box[-1], child.log


def _fixed_point(
  p: _Pass,
  closed: jcore.ClosedJaxpr,
  head: list[Tag | None],
  carry: list[Tag | None],
  tail: list[Tag | None],
  iteration: bool = False,
) -> tuple[jcore.Jaxpr, list[Any], list[Tag | None], list[Tag | None], CastLog]:
  """Retrace a loop body until the carried tags are stable (each pass can only widen them)."""
  while True:
    new_jaxpr, consts, out_tags, log = _retrace(
      p, closed.jaxpr, closed.consts, head + carry + tail, iteration
    )
    joined = [_join(a, b) for a, b in zip(carry, out_tags[: len(carry)])]
    if joined == carry:
      return new_jaxpr, consts, carry, out_tags, log
    carry = joined


def _inline(p: _Pass, eqn: Any, values: list[Any], tags: list[Tag | None]) -> tuple[list, list]:
  closed = eqn.params["jaxpr"] if "jaxpr" in eqn.params else eqn.params["call_jaxpr"]
  if isinstance(closed, jcore.ClosedJaxpr):
    return _interpret(p, closed.jaxpr, closed.consts, values, tags)
  return _interpret(p, closed, (), values, tags)


def _jit(p: _Pass, eqn: Any, values: list[Any], tags: list[Tag | None]) -> tuple[list, list]:
  """A ``jit`` inside the function (``jax.nn.silu``, ``jnp.var``, a user's jitted layer): its
  body transformed and bound as a ``jit`` again (same shardings, layouts, mesh and name) when
  traced (under ``jit``, ``grad``, ``vmap``); inlined when evaluated eagerly (op by op,
  nothing to compile) unless it has shardings or layouts of its own.

  Keeping the boundary keeps the association of the sums JAX's transpose makes of a
  cotangent, so ``jax.grad(autocast(f))`` adds the gradient contributions of a value used
  inside and outside a jitted function in the same order as ``jax.grad(f)`` (inlined, a float32
  policy's gradients differed from ``jax.grad(f)`` in the last bit), and keeps a sharded jit's
  shardings (inlined, they were dropped and the values changed). The body is evaluated by this
  pass: same rounding sites and stochastic bits as inlined."""
  params = eqn.params
  traced = any(isinstance(v, jax.core.Tracer) for v in values)
  placed = any(not isinstance(s, _UNSPECIFIED) for s in (*params["in_shardings"], *params["out_shardings"]))
  placed = placed or any(layout is not None for layout in (*params["in_layouts"], *params["out_layouts"]))
  if not (traced or placed):
    return _inline(p, eqn, values, tags)
  closed = params["jaxpr"]
  box: list[list[Tag | None]] = []

  def body(*args: Any) -> list[Any]:
    outs, out_tags = _interpret(p, closed.jaxpr, closed.consts, args, tags)
    box.append(out_tags)
    return outs

  in_avals = [v.aval for v in eqn.invars]
  new_jaxpr, _, consts = _pe.trace_to_jaxpr_dynamic(
    lu.wrap_init(body, debug_info=closed.jaxpr.debug_info), in_avals
  )
  n = len(consts)  # the new constants (rounded weights, keys of stochastic sites) lead the arguments
  outs = _bind(
    eqn,
    [*consts, *values],
    jaxpr=jcore.ClosedJaxpr(_pe.convert_constvars_jaxpr(new_jaxpr), ()),
    in_shardings=(_UNSPECIFIED_VALUE,) * n + tuple(params["in_shardings"]),
    in_layouts=(None,) * n + tuple(params["in_layouts"]),
    donated_invars=(False,) * n + tuple(params["donated_invars"]),
  )
  return outs, box[-1]


def _remat(p: _Pass, eqn: Any, values: list[Any], tags: list[Tag | None]) -> tuple[list, list]:
  new_jaxpr, consts, out_tags, log = _retrace(p, eqn.params["jaxpr"], (), tags)
  p.log.merge(log)
  outs = _bind(eqn, [*consts, *values], jaxpr=_pe.convert_constvars_jaxpr(new_jaxpr))
  return outs, out_tags


def _scan(p: _Pass, eqn: Any, values: list[Any], tags: list[Tag | None]) -> tuple[list, list]:
  params = eqn.params
  n_consts, n_carry = params["num_consts"], params["num_carry"]
  head, carry, tail = tags[:n_consts], tags[n_consts : n_consts + n_carry], tags[n_consts + n_carry :]
  stochastic = bool(p.stochastic) and p.key is not None  # an iteration index as one more scanned input
  new_jaxpr, consts, carry, out_tags, log = _fixed_point(p, params["jaxpr"], head, carry, tail, stochastic)
  p.log.merge(log, times=params["length"])
  updates: dict[str, Any] = {
    "jaxpr": jcore.ClosedJaxpr(_pe.convert_constvars_jaxpr(new_jaxpr), ()),
    "num_consts": n_consts + len(consts),
  }
  extra = [jnp.arange(params["length"], dtype=jnp.uint32)] if stochastic else []
  if "linear" in params:
    updates["linear"] = (False,) * len(consts) + tuple(params["linear"]) + (False,) * len(extra)
  outs = _bind(eqn, [*consts, *values, *extra], **updates)
  return outs, carry + out_tags[n_carry:]


def _while(p: _Pass, eqn: Any, values: list[Any], tags: list[Tag | None]) -> tuple[list, list]:
  params = eqn.params
  nc, nb = params["cond_nconsts"], params["body_nconsts"]
  cond_consts, body_consts, init = values[:nc], values[nc : nc + nb], values[nc + nb :]
  cond_tags, body_tags, carry = tags[:nc], tags[nc : nc + nb], tags[nc + nb :]
  if p.stochastic and p.key is not None:
    raise PolicyError(
      f"policy {str(p.policy)!r}: stochastic rounding inside a while loop (lax.while_loop, or fori_loop "
      "with bounds not known when tracing) is not supported: its iterations would reuse the same bits. "
      "Use lax.scan or a fori_loop with Python-int bounds, or a policy without stochastic=."
    )
  body_jaxpr, body_new, carry, _, log = _fixed_point(p, params["body_jaxpr"], body_tags, carry, [])
  cond = params["cond_jaxpr"]
  cond_jaxpr, cond_new, _, cond_log = _retrace(p, cond.jaxpr, cond.consts, cond_tags + carry)
  p.log.merge(log)
  p.log.merge(cond_log)
  p.log.while_loops += 1
  outs = _bind(
    eqn,
    [*cond_new, *cond_consts, *body_new, *body_consts, *init],
    cond_jaxpr=jcore.ClosedJaxpr(_pe.convert_constvars_jaxpr(cond_jaxpr), ()),
    body_jaxpr=jcore.ClosedJaxpr(_pe.convert_constvars_jaxpr(body_jaxpr), ()),
    cond_nconsts=nc + len(cond_new),
    body_nconsts=nb + len(body_new),
  )
  return outs, carry


def _cond(p: _Pass, eqn: Any, values: list[Any], tags: list[Tag | None]) -> tuple[list, list]:
  index, operands, op_tags = values[0], values[1:], tags[1:]
  traced = [_retrace(p, b.jaxpr, b.consts, op_tags) for b in eqn.params["branches"]]
  all_consts = [c for _, consts, _, _ in traced for c in consts]
  in_avals = [jax.typeof(c) for c in all_consts] + [v.aval for v in eqn.invars[1:]]
  branches, start = [], 0
  for new_jaxpr, consts, _, log in traced:
    p.log.merge(log)
    lifted = jcore.jaxpr_as_fun(jcore.ClosedJaxpr(_pe.convert_constvars_jaxpr(new_jaxpr), ()))
    lo, hi = start, start + len(consts)
    start = hi

    def branch(*args: Any, lifted: Callable = lifted, lo: int = lo, hi: int = hi) -> list[Any]:
      return lifted(*args[lo:hi], *args[len(all_consts) :])

    debug = new_jaxpr.debug_info._replace(arg_names=None)
    jaxpr, _, consts_left = _pe.trace_to_jaxpr_dynamic(lu.wrap_init(branch, debug_info=debug), in_avals)
    branches.append(jcore.ClosedJaxpr(jaxpr, consts_left))
  out_tags = [_join_all_opt([t[2][i] for t in traced]) for i in range(len(eqn.outvars))]
  outs = _bind(eqn, [index, *all_consts, *operands], branches=tuple(branches))
  return outs, out_tags


def _join_all_opt(tags: Sequence[Tag | None]) -> Tag | None:
  return None if all(t is None for t in tags) else _join_all(tags)


_MANUAL = threading.local()  # mesh axes of the shard_map bodies being interpreted (innermost last)


def _manual_axes() -> tuple[str, ...]:
  """The mesh axis names that are manual where the pass is now tracing (inside ``shard_map``
  bodies; empty outside). An observer (`numerics_report`) uses them to tell the shards apart."""
  return getattr(_MANUAL, "axes", ())


def _shard_map(p: _Pass, eqn: Any, values: list[Any], tags: list[Tag | None]) -> tuple[list, list]:
  params = eqn.params
  box: list[list[Tag | None]] = []
  manual = set(params.get("newly_manual_axes", ())) or set(params["mesh"].axis_names)
  names = tuple(n for n in params["mesh"].axis_names if n in manual)

  def body(*args: Any) -> tuple[Any, ...]:
    outer = _manual_axes()
    _MANUAL.axes = outer + tuple(n for n in names if n not in outer)
    try:
      outs, out_tags = _interpret(p, params["jaxpr"], (), args, tags)
    finally:
      _MANUAL.axes = outer
    box.append(out_tags)
    return tuple(outs)

  mapped = jax.shard_map(
    body,
    mesh=params["mesh"],
    in_specs=tuple(params["in_specs"]),
    out_specs=tuple(params["out_specs"]),
    axis_names=set(params.get("newly_manual_axes", ())) or set(),
    check_vma=params.get("check_vma", True),
  )
  outs = list(mapped(*values))
  return outs, box[-1]


def _is_precision_round(call_jaxpr: jcore.ClosedJaxpr) -> bool:
  info = call_jaxpr.jaxpr.debug_info
  return info is not None and str(getattr(info, "func_src_info", "")).startswith("_round_with_vjp ")


def _primal(
  p: _Pass, call: jcore.ClosedJaxpr, tags: Sequence[Tag | None], box: list
) -> Callable[..., list[Any]]:
  """A custom function's primal, evaluated with the pass; its output tags go to ``box``."""

  def fun(*args: Any) -> list[Any]:
    outs, out_tags = _interpret(p, call.jaxpr, call.consts, args, tags)
    box.append(out_tags)
    return outs

  return fun


def _custom_jvp(p: _Pass, eqn: Any, values: list[Any], tags: list[Tag | None]) -> tuple[list, list]:
  params = eqn.params
  call = params["call_jaxpr"]
  num_consts = params["num_consts"]
  jvp_fun = params["jvp_jaxpr_fun"]
  box: list[list[Tag | None]] = []
  fun = _primal(p, call, tags, box)

  def jvp(*xs: Any) -> list[Any]:  # jax's lift_jvp, evaluating with the pass
    n = len(xs) // 2
    primals, tangents = xs[num_consts:n], xs[n + num_consts :]
    zeros = [type(t) is SymbolicZero for t in tangents]
    jvp_jaxpr, jvp_consts, out_zeros = jvp_fun.call_wrapped(*zeros)
    nonzero = [t for t in tangents if type(t) is not SymbolicZero]
    arg_tags = list(tags[num_consts:]) + [_RAW if _is_f32(jax.typeof(t)) else None for t in nonzero]
    out, out_tags = _interpret(p, jvp_jaxpr, jvp_consts, [*primals, *nonzero], arg_tags)
    box.append(out_tags[: len(out_zeros)])
    out_primals, nonzero_out = out[: len(out_zeros)], iter(out[len(out_zeros) :])
    out_tangents = [
      SymbolicZero(jax.typeof(x).to_tangent_aval()) if z else next(nonzero_out)
      for x, z in zip(out_primals, out_zeros)
    ]
    return [*out_primals, *out_tangents]

  params_bind = eqn.primitive.get_bind_params(params)
  params_bind["subfuns"] = (
    lu.wrap_init(fun, debug_info=call.jaxpr.debug_info),
    lu.wrap_init(jvp, debug_info=jvp_fun.debug_info),
  )
  outs = eqn.primitive.bind(*values, **params_bind)
  out_tags = box[-1] if box else [_RAW if _is_f32(v.aval) else None for v in eqn.outvars]
  return list(outs), out_tags


def _custom_vjp(p: _Pass, eqn: Any, values: list[Any], tags: list[Tag | None]) -> tuple[list, list]:
  params = eqn.params
  call = params["call_jaxpr"]
  if _is_precision_round(call):  # a rounding the user wrote: keep it as it is
    outs = _bind(eqn, values)
    p.log.record("precision.round", "cast", untouched=sum(_size(v.aval) for v in eqn.outvars))
    return outs, [_RAW if _is_f32(v.aval) else None for v in eqn.outvars]
  num_consts = params["num_consts"]
  fwd_thunk = params["fwd_jaxpr_thunk"]
  box: list[list[Tag | None]] = []
  fun = _primal(p, call, tags, box)

  def fwd(*args: Any) -> list[Any]:  # jax's lift_fwd, evaluating with the pass
    vals, nonzeros = args[::2], args[1::2]
    if any(nonzeros[:num_consts]):
      raise _ad.CustomVJPException()
    fwd_jaxpr, fwd_consts = fwd_thunk.call_wrapped(*nonzeros[num_consts:])
    outs, out_tags = _interpret(p, fwd_jaxpr, fwd_consts, vals[num_consts:], tags[num_consts:])
    box.append(out_tags)
    return outs

  params_bind = eqn.primitive.get_bind_params(params)
  fun_w, _, bwd = params_bind["subfuns"]
  params_bind["subfuns"] = (
    lu.wrap_init(fun, debug_info=call.jaxpr.debug_info),
    lu.wrap_init(fwd, debug_info=fwd_thunk.debug_info),
    lu.wrap_init(functools.partial(_autocast_bwd, p, bwd), debug_info=bwd.debug_info),
  )
  outs = eqn.primitive.bind(*values, **params_bind)
  n_out = len(eqn.outvars)
  out_tags = box[-1][:n_out] if box else [_RAW if _is_f32(v.aval) else None for v in eqn.outvars]
  return list(outs), out_tags


def _autocast_bwd(p: _Pass, bwd: Any, *args: Any) -> list[Any]:
  """A custom_vjp's bwd rule, traced and evaluated with the pass (symbolic zeros kept)."""
  if not all(isinstance(a, jax.Array) for a in args):
    return list(bwd.call_wrapped(*args))
  zeros: list[Any] = []

  def arrays_only(*xs: Any) -> list[Any]:
    res = list(bwd.call_wrapped(*xs))
    zeros.extend(r if isinstance(r, _ad.Zero) else None for r in res)
    return [r for r in res if not isinstance(r, _ad.Zero)]

  in_avals = [jax.typeof(a) for a in args]
  jaxpr, _, consts = _pe.trace_to_jaxpr_dynamic(
    lu.wrap_init(arrays_only, debug_info=bwd.debug_info), in_avals
  )
  arg_tags = [_RAW if _is_f32(a) else None for a in in_avals]
  outs, _ = _interpret(p, jaxpr, consts, args, arg_tags)
  it = iter(outs)
  return [z if z is not None else next(it) for z in zeros]


_CONTROL_FLOW: dict[str, Callable[..., tuple[list, list]]] = {
  "jit": _jit,
  "pjit": _jit,
  "closed_call": _inline,
  "core_call": _inline,
  "remat2": _remat,
  "checkpoint": _remat,
  "scan": _scan,
  "while": _while,
  "cond": _cond,
  "shard_map": _shard_map,
  "custom_jvp_call": _custom_jvp,
  "custom_vjp_call": _custom_vjp,
}
