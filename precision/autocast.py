"""`autocast`: run an unmodified float32 JAX function with a `Policy`'s mixed-precision numerics.

Specification
=============

The pass traces the function to a jaxpr, walks its equations and binds each one again,
inserting `precision.round` (nearest even, cast-like gradient) where the policy's rule table
(`precision.policy`) says. Values stay float32 arrays that hold compute-format values ("fake
casts"): shapes and dtypes never change, so the result has the function's exact signature.

**Values and constants.** A *constant* is a number known when the function is traced: a
Python scalar, or a literal the tracer inlined (a jaxpr ``Literal``), and anything computed
only from constants (``jnp.zeros``, ``jnp.full(s, 0.5)``); a Python number passed as an argument
is one (it is passed to the function unchanged, under every policy). Everything else is a *value*:
every array argument, every closed-over array that is not inlined, every result of an operation on a
value, **0-d arrays included** (a 0-d argument, a learned scalar, each example under
``vmap`` are values like any other), and every float32 result of an operation on a value of
another dtype (``abs`` of a complex value, which computes its modulus, a ``pow`` with an integer
exponent array: the pass keeps no state for other dtypes). Constants are never rounded; a
constant that is exactly representable in the compute format (rounding it gives it back:
subnormals, infinities and saturation as the format has them) counts as rounded for the rules
below. One constant stands for a format's number rather than float32's: where the attention
scores are rounded, a literal ``+-finfo(float32).max`` (``jnp.finfo(dtype).min``) that reaches
the scores of a recognised attention (a mask bias added to them or selected into them) becomes
the compute format's ``+-max`` (`_extremes`); anywhere else it keeps float32's value.

**State of a float32 value** while the pass runs: ``rounded`` (exactly representable in the
compute format), ``float32`` (deliberately kept in float32 by a ``"float32"`` rule),
``raw`` (anything else: arguments, weights), plus the two constant states. Where two states
meet (a ``concatenate``, a loop carry, the branches of a ``cond``) the result has the
weakest state both satisfy (``raw`` if nothing better is known).

**Op classes** (the primitive -> class table is `PRIMITIVE_CLASSES`, `precision._op_classes`):

* ``matmul``: ``dot_general``, ``conv_general_dilated``, ``ragged_dot``. Both operands are
  rounded to the compute format (a weight once per trace: an operand a jit, checkpoint or
  cond body, or every iteration of a scan, takes from its caller is rounded once, by the
  caller, so the gradient of a weight shared by layers does not depend on how they are
  wrapped), then, per the policy's treatment:
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
  NVIDIA GPUs: exact products of compute-format values). Under ``jax.grad(autocast(f))`` the
  backward products of a bfloat16 matrix-matrix ``dot_general`` (a cotangent, already rounded
  by the result rounding's transpose, times a rounded operand) run on the same tensor cores
  through the ``BF16_BF16_F32`` algorithm preset (float32 in and out); other backward products
  are TF32. Those kept float32 get ``HIGHEST``
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
is not yet rounded (a weight once per trace, as with nearest rounding), the result, and under
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
words only (docs/references.md, "Precision optimisation levels"). The op classes, the attention pattern, the chunk
model of "a mix of fp32 and 16-bit reductions", the float32 treatment of transcendental ops
and reductions (PyTorch autocast's lists), the constant rule, inner-policy-wins nesting and
the float32 region, and which roundings a stochastic class covers are ours. ``cstorch.pol``
regions (a different level per region) are not modelled; `float32_region` is the float32
case.

**Implementation.** This module holds the public functions; the pass lives in private modules,
one concern each: `precision._tracing` (the user's function to a jaxpr: static and traced
arguments, Equinox leaves, NNX modules), `precision._state` (tags, their lattice, the `Pass`),
`precision._interpreter` (the equation loop, value ops, constants and regions),
`precision._attention` (score products by structure), `precision._matmul` (operand rounding,
product precision, chunked sums) and `precision._control_flow` (higher-order primitives). Every
JAX internal they read goes through `precision._jax_compat`; a higher-order primitive none of
them handles is an error (`precision._jax_compat.UnhandledPrimitiveError`), never a float32
pass-through.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax

from precision import (
  _control_flow,  # noqa: F401  (registers the higher-order handlers)
  _matmul,
)
from precision import _jax_compat as compat
from precision._interpreter import run
from precision._op_classes import ENTRY_CLASSES, PRIMITIVE_CLASSES, UnknownPrimitiveWarning
from precision._state import (
  FLOAT32_SCOPE,
  NESTED_SCOPE,
  Pass,
)
from precision._tracing import (
  TRACING,
  Statics,
  as_policy,
  check_callable,
  check_key,
  fn_name,
  lift_nnx_modules,
  module_as_argument,
  module_state_errors,
  trace_fn,
)
from precision.cast_report import CastReport
from precision.formats import float32
from precision.policy import Policy

__all__ = ("PRIMITIVE_CLASSES", "autocast", "cast_report", "float32_region", "whole_products")


@contextlib.contextmanager
def whole_products() -> Iterator[None]:
  """Within it, `autocast` binds each product whole and rounds its result once, instead of
  emulating a ``mixed_accumulate`` accumulation in chunks (the zero-padded chunks, the batched
  product over them and the ordered sum of their rounded sums).

  The chunks are how a CPU or GPU reproduces the wafer's numerics, not what the wafer computes:
  traced inside this context, a step has the products the hardware runs, with the shapes and
  FLOPs of the same step without autocast. It is for tools that read a step's structure rather
  than its values (``wafer.estimate`` traces under it); the values are those of
  ``float32_accumulate``. Part of JAX's tracing-cache key (``jax.make_user_context``): a function
  ``jax.jit`` traced outside it is traced again inside it.

  >>> import jax, jax.numpy as jnp, precision
  >>> f = precision.autocast(lambda a, b: a @ b, "c=bf16,level=1")
  >>> a, b = jnp.ones((2, 3000)), jnp.ones((3000, 2))
  >>> "f32[3,2,2]" in str(jax.make_jaxpr(f)(a, b))  # the sums of 3 chunks of 1024 products
  True
  >>> with precision.whole_products():
  ...   "f32[3,2,2]" in str(jax.make_jaxpr(f)(a, b))
  False
  """
  with _matmul.WHOLE(True):
    yield


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
      (``lambda state, x: nnx.merge(graphdef, state)(x)``). Leaves that are arrays (NumPy
      scalars included) are traced. Python numbers and bools are passed to ``fn`` unchanged,
      under every policy, as the float32 policy (which calls ``fn`` itself) passes them: a loop
      count ``n`` in ``for _ in range(n)`` works at every format, and a Python number is a
      constant. Any other leaf (an Equinox module's activation function, a string)
      is passed to ``fn`` unchanged, as ``eqx.filter_jit`` does, and such leaves of the
      result are returned unchanged: ``eqx.filter_jit(autocast(loss, policy))(model, x)`` works.
      An *array* used as a Python value (a 0-d array as a loop count or a flag) is a tracer
      under a mixed policy, as under ``jax.jit``: JAX's error then names ``fn``, its line and
      the argument (as ``jax.jit``'s does), and a note names ``static_argnums``.
      A Flax NNX module among the arguments is handled as ``nnx.jit`` does: its state is traced
      and what ``fn`` changes in it (BatchNorm statistics, ``nnx.Rngs`` counts) is written back
      (not rounded to ``output``), so ``nnx.value_and_grad(autocast(loss, policy))(model, x)`` works.
    policy: a `Policy` or its string form (``"c=cb16,level=1"``).
    static_argnums, static_argnames: arguments to pass unchanged rather than trace (arrays
      used as Python values, configs), as in ``jax.jit`` (a name also covers the argument
      passed by position, and a position the argument passed by name).

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
  check_callable(fn, "autocast")
  return _Autocast(fn, as_policy(policy), Statics.of(fn, static_argnums, static_argnames))


class _Autocast:
  """The function `autocast` returns: ``fn``'s name, docstring and signature (``__wrapped__``),
  plus ``policy``. A callable object rather than a plain function, so that Equinox does not
  take it for a ``jax.jit``-style wrapper of arrays (``eqx.filter_jit(autocast(f, p))`` of an
  ``eqx.filter_value_and_grad`` would warn); like a function, it binds as a method."""

  def __init__(self, fn: Callable[..., Any], policy: Policy, statics: Statics):
    functools.update_wrapper(self, fn)
    self.policy = policy
    self._statics = statics
    try:  # a parameter of fn's own named rounding_key: the keyword would not reach it
      self._own_key = "rounding_key" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # no signature (a builtin, some C callables)
      self._own_key = False

  def __call__(self, *args: Any, rounding_key: Any = None, **kwargs: Any) -> Any:
    fn, policy = self.__wrapped__, self.policy
    if rounding_key is not None and self._own_key:
      name = fn_name(fn)
      raise TypeError(
        f"autocast({name}): rounding_key= is autocast's key for stochastic rounding, and {name} has a "
        f"parameter named rounding_key too, which the keyword would not reach; rename {name}'s "
        "parameter, or pass its value by position"
      )
    nested = getattr(TRACING, "depth", 0) > 0
    if not policy.is_mixed and policy.output == float32:
      # The identity is ``fn`` itself (products in true float32, as the pass binds them). The
      # pass would evaluate the bodies of inlined library jits (``jnp.einsum``) op by op, which
      # XLA rounds differently in the last bit when ``fn`` runs eagerly.
      with jax.named_scope(NESTED_SCOPE) if nested else contextlib.nullcontext():
        with jax.default_matmul_precision("highest"):
          return fn(*args, **kwargs)
    p = Pass(policy)
    if p.stochastic:
      p.key = check_key(fn, policy, rounding_key)
    fn, args, statics = module_as_argument(fn, args, self._statics)
    with module_state_errors(self.__wrapped__, "autocast"):
      lifted = lift_nnx_modules(fn, statics, args, kwargs)
      if lifted is None:
        closed, outputs, flat = trace_fn(fn, statics, args, kwargs, source=self.__wrapped__)
    if lifted is None:
      with jax.named_scope(NESTED_SCOPE) if nested else contextlib.nullcontext():
        outs = run(p, closed, flat)
      _warn_unknown(self.__wrapped__, policy, p.log.unknown)
      return outputs.unflatten(outs)
    closed, outputs, flat = trace_fn(lifted.fn, Statics((), ()), lifted.args, {}, source=self.__wrapped__)
    with jax.named_scope(NESTED_SCOPE) if nested else contextlib.nullcontext():
      outs = run(p, closed, flat, rounded_outputs=lifted.traced_outputs[0])
    _warn_unknown(self.__wrapped__, policy, p.log.unknown)
    with module_state_errors(self.__wrapped__, "autocast", writing_back=True):
      return lifted.finish(outputs.unflatten(outs))

  def __get__(self, instance: Any, owner: Any = None) -> Any:
    return self if instance is None else functools.partial(self, instance)

  def __repr__(self) -> str:
    return f"<autocast {getattr(self, '__qualname__', fn_name(self.__wrapped__))} ({self.policy})>"


def _warn_unknown(fn: Callable[..., Any], policy: Policy, unknown: dict[str, int]) -> None:
  """An `UnknownPrimitiveWarning` naming the float primitives the pass left unrounded, if any."""
  if not unknown:
    return
  listed = ", ".join(f"{name} ({n} equation{'s' * (n != 1)})" for name, n in sorted(unknown.items()))
  first = min(unknown)
  warnings.warn(
    f"autocast({fn_name(fn)}, {policy}): {listed} computed in float32 and not rounded: "
    f"precision.PRIMITIVE_CLASSES does not classify {'it' if len(unknown) == 1 else 'them'}. To round "
    f"a result, classify its primitive (precision.PRIMITIVE_CLASSES[{first!r}] = 'elementwise' for a "
    f"pointwise op; classes: {', '.join(ENTRY_CLASSES)}); to keep it float32 on purpose, call it inside "
    "precision.float32_region()",
    UnknownPrimitiveWarning,
    stacklevel=compat.user_stacklevel(),
  )


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
  check_callable(fn, "cast_report")
  policy = as_policy(policy)
  call, args, statics = module_as_argument(fn, args, Statics.of(fn, static_argnums, static_argnames))
  with module_state_errors(fn, "cast_report"):
    closed, _, flat = trace_fn(call, statics, args, kwargs, source=fn)
  p = Pass(policy)
  p.key = jax.random.key(0) if p.stochastic else None  # nothing is computed: any key will do
  jax.make_jaxpr(lambda *xs: run(p, closed, xs))(*flat)
  return CastReport.from_log(policy, p.log)
