"""Ahead-of-time compilation of a step, and the errors that keep its graph static.

``wafer.compile(step_fn, *example_args)`` traces ``step_fn`` once, lowers it and compiles it
with XLA (``jax.jit(...).trace(...).lower().compile()``), and returns a `CompiledStep` that runs
only that graph. As on a Cerebras system:

* a call whose arguments differ in shape, dtype or pytree structure raises `StaticGraphError`
  (it would need a second compile);
* Python control flow on traced values (``if``, ``assert``, a ``range`` of a traced count), value
  fetches in the step (``float(x)``, ``x.item()``, ``np.asarray(x)``, ``int(x)``), traced shapes
  (``jnp.zeros(n)``, ``jnp.arange(n)``), results whose size the data decides (``jnp.nonzero(x)``
  without ``size=``), printing traced values and asserting on them raise `StaticGraphError` at
  trace time, naming your file and line and the fix;
* a step that stores new arrays into its arguments' objects without returning them (Flax NNX's
  ``opt.update(model, grads)``) raises `StepUsageError` at trace time: the compiled step runs on
  copies of its arguments, so the update would be lost. Return the new state instead
  (``nnx.split`` / ``nnx.merge`` / ``nnx.state``), or train with ``nnx.jit``.

``validate_only=True`` traces and lowers without the XLA compile. `enable_compilation_cache`
points JAX's persistent compilation cache at a directory (the executor uses the model_dir), so
a rerun of the same step loads the compiled artifact instead of compiling again.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import re
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from precision import _jax_compat as compat
from wafer import closures as _closures
from wafer.cluster import data_parallel_shardings
from wafer.errors import StaticGraphError, StepUsageError, user_frame, where_defined, with_article

_FIXES = {
  "control_flow": (
    "Python control flow on a traced value",
    "The step is traced once and compiled; a Python `if`, `while` or `assert` on a traced value "
    "cannot be decided then.",
    "use jnp.where(cond, a, b) or jax.lax.cond / jax.lax.while_loop for data-dependent choices; "
    "check values on the host in a step closure (@wafer.step_closure).",
  ),
  "loop": (
    "a Python loop counted by a traced value",
    "The step's Python body runs once, when it is traced; range(n) needs n as a Python int then, and a value "
    "computed from the step's arrays does not exist yet.",
    "use jax.lax.fori_loop(0, n, body, init), whose count may be traced (a traced count makes it a while "
    "loop: not differentiable in reverse), or jax.lax.while_loop; or make the count static: a Python int "
    "closed over by the step or a static argument (wafer.compile(..., static_argnums=... / static_argnames=...)).",
  ),
  "size": (
    "an operation whose result size depends on values inside the step",
    "jnp.nonzero, jnp.argwhere, jnp.where(cond), jnp.flatnonzero, jnp.unique and jnp.repeat return as many "
    "elements as the data decides, which is not known when the step is compiled; every shape in the graph "
    "is fixed.",
    "give the size: jnp.nonzero(x, size=N, fill_value=...), jnp.unique(x, size=N, fill_value=...), "
    "jnp.where(cond, size=N), jnp.repeat(x, r, total_repeat_length=N), with a fixed N (the most there can "
    "be); or keep the shape: jnp.where(mask, x, 0).",
  ),
  "value_fetch": (
    "a value fetch inside the step",
    "float(x), int(x), x.item() and np.asarray(x) need the value, which does not exist while "
    "the step is traced (tensor-to-scalar decay).",
    "keep the value as an array (jnp ops), or read it after the step in a step closure: "
    "@wafer.step_closure def log(loss): print(float(loss)).",
  ),
  "mask": (
    "boolean-mask indexing (x[mask]) inside the step",
    "x[mask] has as many elements as mask has True values, which is not known when the step is compiled; "
    "every shape in the graph is fixed.",
    "keep the shape: jnp.where(mask, x, 0) (then sum or average with mask as weights), or "
    "jnp.nonzero(mask, size=N, fill_value=...) with a fixed N.",
  ),
  "shape": (
    "a traced value used as a shape inside the step",
    "Shapes are fixed when the step is compiled; an array argument (or a value computed from one) "
    "has no value then.",
    "pass the size as a static argument (wafer.compile(..., static_argnums=... / static_argnames=...)) "
    "or as a Python int closed over by the step, or derive it from an array's .shape.",
  ),
  "log": (
    "logging a traced value inside the step",
    "The logging call formats its arguments at trace time, when values do not exist.",
    "log from a step closure: @wafer.step_closure def log(x): logging.warning('%s', x), called in the "
    "step as log(x); it runs after the step with host values.",
  ),
  "print": (
    "printing a traced value inside the step",
    "The step's Python body runs once, at trace time, when values do not exist.",
    "print from a step closure (@wafer.step_closure), or use jax.debug.print for a debug run.",
  ),
}


def _static_graph_error(kind: str, error: BaseException) -> StaticGraphError:
  what, why, fix = _FIXES[kind]
  frame = user_frame(error.__traceback__)
  if frame is None:
    where, location = None, ""
  else:
    where = f"{frame[0]}:{frame[1]}"
    location = f" at {where}\n    {frame[2]}"
  return StaticGraphError(f"{what}{location}\n{why}\nFix: {fix}", where)


class _PrintedTracer(BaseException):
  """Raised by str()/repr()/format() of a tracer in user code. A BaseException, so that logging's
  handler (which catches Exception and prints "--- Logging error ---") lets it through."""


@contextlib.contextmanager
def _no_printing_tracers() -> Iterator[None]:
  """Make str()/repr()/format() of a tracer raise while the step is traced."""
  tracer = jax.core.Tracer
  saved = {name: tracer.__dict__.get(name) for name in ("__str__", "__repr__", "__format__")}

  def guarded(name: str) -> Callable[..., str]:
    original = getattr(tracer, name)

    def method(self: Any, *args: Any) -> str:
      caller = sys._getframe(1).f_code.co_filename
      if os.path.realpath(caller).startswith(compat.JAX_DIRS):  # JAX formats tracers in its own errors
        return original(self, *args)
      raise _PrintedTracer()

    return method

  for name in saved:
    setattr(tracer, name, guarded(name))
  try:
    yield
  finally:
    for name, method in saved.items():
      if method is None:
        delattr(tracer, name)
      else:
        setattr(tracer, name, method)


_PROBE_LOCK = threading.Lock()
_PROBE_DEPTH = 0
_PROBE_SAVED: Any = None


@contextlib.contextmanager
def cheap_sharding_probes() -> Iterator[None]:
  """While active, ``tracer.sharding`` raises a plain ``AttributeError``, without JAX's origin message.

  A tracer has no sharding, so JAX raises ``AttributeError`` there (``hasattr`` / ``getattr(x,
  "sharding", None)`` work); in JAX 0.10 its message names where the value came from, which walks every
  equation traced so far (``DynamicJaxprTrace.frame.find_progenitors``). ``flax.nnx`` probes that
  attribute on every write of a ``Variable`` (``getattr(value, "sharding", None)`` in ``set_value``),
  i.e. at every draw of an RNG stream: parameter initialisers under ``eval_shape`` and each dropout in
  a traced step. Tracing then costs O(draws x equations): for GPT-2 XL (48 layers, about 1,000 draws,
  45,000 equations) the probes took more time than the rest of the trace (reported upstream, with a
  fix that drops the walk: https://github.com/jax-ml/jax/pull/40041). Nothing else changes: the attribute is still missing and its error still names
  the tracer. Re-entrant; restores the original property on exit; a no-op where a JAX has no
  ``Tracer.sharding`` property of its own.

  >>> import jax, jax.numpy as jnp
  >>> with cheap_sharding_probes():
  ...   jax.eval_shape(lambda x: jnp.asarray(getattr(x, "sharding", None) is None), 1.0).shape
  ()
  """
  global _PROBE_DEPTH, _PROBE_SAVED
  tracer = jax.core.Tracer
  with _PROBE_LOCK:  # one patch for all threads, undone by the last to leave
    if _PROBE_DEPTH == 0:
      _PROBE_SAVED = tracer.__dict__.get("sharding")
      if isinstance(_PROBE_SAVED, property):
        tracer.sharding = property(_no_sharding, doc=_PROBE_SAVED.__doc__)
    _PROBE_DEPTH += 1
  try:
    yield
  finally:
    with _PROBE_LOCK:
      _PROBE_DEPTH -= 1
      if _PROBE_DEPTH == 0 and isinstance(_PROBE_SAVED, property):
        tracer.sharding = _PROBE_SAVED


def _no_sharding(self: Any) -> Any:
  raise AttributeError(
    f"The 'sharding' attribute is not available on a traced value ({type(self).__name__}, {self.aval}): "
    "only a concrete jax.Array has one"
  )


class CompiledStep:
  """A step compiled once; calls run that graph and nothing else.

  Attributes:
    in_avals: ``jax.ShapeDtypeStruct`` leaves of the example arguments.
    traced: the ``jax.stages.Traced`` step (its ``.jaxpr`` feeds the cost model).
    lowered, compiled: the AOT stages (``compiled`` is None with ``validate_only``).
    compilations: how many XLA compilations this object did (1, or 0 with validate_only).
  """

  def __init__(
    self,
    fn: Callable,
    example_args: tuple,
    traced: Any,
    lowered: Any,
    compiled: Any,
    collector: Any,
    static: _Static | None = None,
    donated: tuple[int, ...] = (),
  ):
    self._static = static or _Static((), ())
    self._donated = donated
    self._layout = (len(example_args[0]), tuple(sorted(example_args[1])))
    self._positional_names = _positional_names(fn, len(example_args[0]))
    self._static_values = self._static.values(example_args[0], example_args[1])
    example_args = self._static.dynamic(example_args[0], example_args[1])
    leaves_with_paths, self._in_tree = jax.tree_util.tree_flatten_with_path(example_args)
    self._paths = [_arg_name(p) for p, _ in leaves_with_paths]
    self.in_avals = [_aval(x) for _, x in leaves_with_paths]
    self.fn = fn
    self.traced, self.lowered, self.compiled = traced, lowered, compiled
    self.compilations = 0 if compiled is None else 1
    self._closures = list(collector.closures)
    self._pending: list[Any] | None = None

  @property
  def jaxpr(self) -> Any:
    return self.traced.jaxpr

  @property
  def has_closures(self) -> bool:
    return bool(self._closures)

  def check_args(self, args: tuple, kwargs: dict | None = None) -> None:
    """Raise `StaticGraphError` unless the arguments match the compiled signature.

    Dynamic arguments must have the compiled shapes and (canonical) dtypes; static arguments
    (``static_argnums`` / ``static_argnames``) must equal the compiled values.

    Raises:
      StepUsageError: the call passes its arguments otherwise than the compile did (by keyword where
        they were positional, or one missing), or passes an array donated to an earlier call.
    """
    kwargs = kwargs or {}
    problem = _call_layout_problem(self._layout, (len(args), tuple(sorted(kwargs))), self._positional_names)
    if problem is not None:
      raise StepUsageError(problem)
    for name, (want, got) in zip(
      self._static.names(args, kwargs), zip(self._static_values, self._static.values(args, kwargs))
    ):
      if not _same_static(got, want):
        raise StaticGraphError(
          f"static argument {name} is {got!r}; the step was compiled for {want!r}. A static argument is "
          "part of the graph, so a new value would need a second compile, which a wafer run does not "
          "allow. Fix: pass the compiled value, or make the argument an array (dynamic)."
        )
    args = self._static.dynamic(args, kwargs)
    leaves_with_paths, tree = jax.tree_util.tree_flatten_with_path(args)
    if tree != self._in_tree:
      raise StaticGraphError(
        "the step's arguments changed structure since it was compiled.\n"
        f"  compiled: {self._in_tree}\n  got:      {tree}\n"
        "The graph is compiled once and must not change: pass the same pytrees (same keys, same "
        "number of leaves) every step."
      )
    for (_path, leaf), want, name in zip(leaves_with_paths, self.in_avals, self._paths):
      if isinstance(leaf, jax.Array) and leaf.is_deleted():
        raise StepUsageError(
          f"argument {name} is an array whose buffer was donated to an earlier call of the step (or "
          "deleted): the step reused it for its outputs, so its values are gone. Fix: pass the step's "
          "output, e.g. state = step(state, batch), not the array passed before; or compile without "
          "donate_argnums to keep the inputs."
        )
      got = _aval(leaf)
      if got.shape != want.shape or got.dtype != want.dtype:
        hint = (
          "use fixed batches: drop the last partial batch (drop_remainder=True / drop_last: True)"
          if got.dtype == want.dtype and got.ndim == want.ndim
          else "convert the argument to the compiled dtype and shape before the call"
        )
        raise StaticGraphError(
          f"argument {name} is {got.dtype}{list(got.shape)}; the compiled step takes "
          f"{want.dtype}{list(want.shape)}. A different shape or dtype would need a second "
          f"compile, which a wafer run does not allow. Fix: {hint}."
        )

  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    """Run the compiled graph; returns ``step_fn``'s outputs (closure values are kept aside)."""
    if self.compiled is None:
      raise StepUsageError(
        "this step was only validated (validate_only=True), not compiled, so it cannot run: compile it "
        "without validate_only to run it"
      )
    self.check_args(args, kwargs)
    if self._donated:
      _check_no_donated_alias(args, kwargs, self._donated)
    dyn_args, dyn_kwargs = self._static.dynamic(args, kwargs)
    out, closure_arrays = self.compiled(*dyn_args, **dyn_kwargs)
    self._pending = closure_arrays
    return out

  def run_closures(self, checkpoint: bool = False, step: bool = True) -> None:
    """Fetch the last step's closure values and run its closures, in queue order.

    Step closures run unless ``step=False`` (a checkpoint step that is neither a log nor an
    activation step); checkpoint closures only with ``checkpoint=True``.
    """
    if self._pending is None or not self._closures:
      return
    host = jax.device_get(self._pending)
    if any(isinstance(c, _closures.InnerClosure) for c in self._closures):
      jax.effects_barrier()  # the debug callbacks of closures inside grad / scan / cond have run
    offset = 0
    for closure in self._closures:
      if isinstance(closure, _closures.InnerClosure):
        if (closure.kind == _closures.STEP and step) or (closure.kind == _closures.CHECKPOINT and checkpoint):
          closure.call_latest()
        continue
      n = len(closure.array_slots)
      values = host[offset : offset + n]
      offset += n
      if (closure.kind == _closures.STEP and step) or (closure.kind == _closures.CHECKPOINT and checkpoint):
        closure.call(values)
    self._pending = None


def _positional_names(fn: Callable, n: int) -> tuple[str, ...]:
  """Names of the step's first ``n`` positional parameters (``args[i]`` where it has none: ``*args``)."""
  try:
    parameters = list(inspect.signature(fn).parameters.values())
  except (TypeError, ValueError):
    parameters = []
  named = [
    p.name
    for p in parameters
    if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
  ]
  return tuple(named[i] if i < len(named) else f"args[{i}]" for i in range(n))


def _layout_text(n: int, keywords: Sequence[str], names: Sequence[str] = ()) -> str:
  """``"2 positional arguments (p, x)"``, ``"0 positional and keywords p, x"``."""
  positional = f"{n} positional argument{'' if n == 1 else 's'}"
  if n and names:
    positional += f" ({', '.join(names[:n])})"
  if not keywords:
    return positional
  return f"{positional} and keyword{'' if len(keywords) == 1 else 's'} {', '.join(keywords)}"


def _call_layout_problem(
  compiled: tuple[int, tuple[str, ...]], called: tuple[int, tuple[str, ...]], names: Sequence[str]
) -> str | None:
  """What is wrong with a call that passes ``called`` (positional count, sorted keywords) to a step compiled
  with ``compiled``; ``names``: the step's names of the compiled positional arguments. None when they agree.

  >>> print(_call_layout_problem((2, ()), (0, ("p", "x")), ("p", "x")))
  the step was compiled with 2 positional arguments (p, x); called with 0 positional arguments and keywords p, x: pass them as at compile time, step(p, x); the compiled graph takes its arguments in that order
  >>> print(_call_layout_problem((2, ()), (1, ()), ("p", "x")))
  the step was compiled with 2 positional arguments (p, x); called with 1 positional argument (p): missing argument x. Pass every argument, as at compile time: step(p, x)
  """
  if compiled == called:
    return None
  n, keywords = compiled
  head = f"the step was compiled with {_layout_text(n, keywords, names)}; called with {_layout_text(*called, names)}"
  example = "step(" + ", ".join([*names[:n], *(f"{k}={k}" for k in keywords)]) + ")"
  given = set(names[: called[0]]) | set(called[1])
  missing = [name for name in [*names[:n], *keywords] if name not in given]
  if missing and called[0] + len(called[1]) < n + len(keywords):
    return (
      f"{head}: missing argument{'s' if len(missing) > 1 else ''} {', '.join(missing)}. Pass every argument, as "
      f"at compile time: {example}"
    )
  return (
    f"{head}: pass them as at compile time, {example}; the compiled graph takes its arguments in that order"
  )


def _aval(x: Any) -> jax.ShapeDtypeStruct:
  """Shape and dtype as JAX sees ``x``: NumPy and Python scalars get JAX's canonical dtype
  (``np.int64(1)`` is int32 and ``np.float64(0.01)`` float32 unless ``jax_enable_x64``)."""
  if isinstance(x, jax.ShapeDtypeStruct):
    return x
  dtype = x.dtype if hasattr(x, "dtype") else jax.numpy.asarray(x).dtype
  if not jax.dtypes.issubdtype(dtype, jax.dtypes.extended):  # typed PRNG keys keep their dtype
    dtype = jax.dtypes.canonicalize_dtype(dtype)
  return jax.ShapeDtypeStruct(np.shape(x), dtype)


def compile(
  step_fn: Callable[..., Any],
  *example_args: Any,
  static_argnums: int | Sequence[int] = (),
  static_argnames: str | Sequence[str] = (),
  donate_argnums: int | Sequence[int] = (),
  num_csx: int = 1,
  batch_argnums: Sequence[int] = (),
  validate_only: bool = False,
  **example_kwargs: Any,
) -> CompiledStep:
  """Trace, lower and compile ``step_fn`` for arguments shaped like ``example_args``.

  Example:

  >>> import jax.numpy as jnp, numpy as np, wafer
  >>> step = wafer.compile(lambda x, scale, *, n: x[:n] * scale, jnp.ones(4), 0.5, n=2, static_argnames="n")
  >>> step(jnp.arange(4.0), np.float64(2.0), n=2).tolist()  # a NumPy scalar: the same float32 graph
  [0.0, 2.0]

  Args:
    step_fn: a function of pytrees of arrays (params, optimizer state, batch, ...).
    example_args: arrays or ``jax.ShapeDtypeStruct``s fixing every shape and dtype; Python and NumPy
      scalars stand for JAX's canonical dtype (``np.float64`` is float32 without ``jax_enable_x64``).
    static_argnums, static_argnames: arguments that are part of the graph (hashable Python values,
      e.g. a layer count or a mode string), as in ``jax.jit``; a call must pass the same values.
    donate_argnums: arguments whose buffers the step may reuse (the train state).
    num_csx: data-parallel systems; > 1 shards ``batch_argnums`` along axis 0 over that many
      JAX devices (`wafer.cluster`) and replicates the rest.
    batch_argnums: which arguments hold the global batch (axis 0), for ``num_csx > 1``.
    validate_only: trace and lower only; no XLA compile.
    example_kwargs: keyword arguments of ``step_fn`` (static ones listed in ``static_argnames``).

  Raises:
    StaticGraphError: the step reads values or branches on them while traced (the message
      names your file and line and the fix).
    StepUsageError: examples or settings that cannot fit the step, an output that is not an array,
      or a step that stores new arrays into its arguments without returning them (the update would
      be lost: return the new state, e.g. ``nnx.state((model, opt))``).
  """
  if not callable(step_fn):
    raise StepUsageError(
      f"the step must be a function; got {with_article(type(step_fn).__name__)} ({step_fn!r:.60}): "
      "wafer.compile(step_fn, *example_args)"
    )
  try:
    signature = inspect.signature(step_fn)
  except (TypeError, ValueError):  # a builtin or C function: JAX reports a mismatch itself
    signature = None
  if signature is not None:
    try:
      signature.bind(*example_args, **example_kwargs)
    except TypeError as e:
      raise StepUsageError(
        f"the example arguments do not fit the step {where_defined(step_fn)}: {e}. "
        f"Give wafer.compile one example per argument of the step{signature}."
      ) from None
  static = _Static(
    tuple(_argnum(i, len(example_args), "static_argnums") for i in _as_tuple(static_argnums)),
    tuple(_as_tuple(static_argnames)),
  )
  takes_any_keyword = signature is None or any(
    p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values()
  )
  for name in static.argnames:
    if not takes_any_keyword and name not in signature.parameters:
      raise StepUsageError(
        f"static_argnames names {name!r}, which is not an argument of the step{signature}; a name there "
        "would be ignored"
      )
  donated = tuple(
    sorted({_argnum(i, len(example_args), "donate_argnums") for i in _as_tuple(donate_argnums)})
  )
  for i in donated:
    if i in static.argnums:
      raise StepUsageError(
        f"donate_argnums names argument {i}, which is static (static_argnums): only an array argument has "
        "buffers to donate"
      )
  _check_example_args(static, example_args, example_kwargs)
  if isinstance(num_csx, bool) or not isinstance(num_csx, (int, np.integer)) or num_csx < 1:
    raise StepUsageError(f"num_csx={num_csx!r}; allowed: a positive integer (the data-parallel systems)")
  batch_argnums = tuple(_argnum(i, len(example_args), "batch_argnums") for i in _as_tuple(batch_argnums))
  for i in batch_argnums:
    if i in static.argnums:
      raise StepUsageError(
        f"batch_argnums names argument {i}, which is static (static_argnums); a batch argument is an "
        "array split on axis 0 over the systems"
      )
  in_shardings = None
  if num_csx > 1:
    dyn_args, _ = static.dynamic(example_args, example_kwargs)
    dyn_batch = [static.dynamic_index(i) for i in batch_argnums]
    in_shardings = data_parallel_shardings(dyn_args, [i for i in dyn_batch if i is not None], num_csx)
  collector_box: list[Any] = []

  def with_closures(*args: Any, **kwargs: Any) -> tuple[Any, list[Any]]:
    before = _array_leaves((args, kwargs))
    with _closures.collecting() as collector:
      out = step_fn(*args, **kwargs)
    _check_outputs(step_fn, out)
    _check_no_lost_updates(step_fn, signature, before, _array_leaves((args, kwargs)), out)
    collector_box.append(collector)
    return out, list(collector.arrays)

  jitted = jax.jit(
    with_closures,
    static_argnums=static.argnums,
    static_argnames=static.argnames,
    donate_argnums=donated,
    in_shardings=in_shardings,
  )
  try:
    with _no_printing_tracers(), cheap_sharding_probes():
      traced = jitted.trace(*example_args, **example_kwargs)
  except jax.errors.TracerBoolConversionError as e:
    raise _static_graph_error("control_flow", e) from None
  except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError,
          jax.errors.TracerIntegerConversionError) as e:  # fmt: skip
    raise _static_graph_error(_concretization_kind(e), e) from None
  except StepUsageError as e:  # the step's outputs (checked inside the trace)
    raise StepUsageError(e.message) from None
  except jax.errors.NonConcreteBooleanIndexError as e:
    raise _static_graph_error("mask", e) from None
  except TypeError as e:
    if not _is_shape(e):
      raise
    raise _static_graph_error("shape", e) from None
  except _PrintedTracer as e:
    raise _static_graph_error("log" if _in_logging(e) else "print", e) from None
  lowered = traced.lower()
  compiled = None if validate_only else lowered.compile()
  return CompiledStep(
    step_fn, (example_args, example_kwargs), traced, lowered, compiled, collector_box[-1], static, donated
  )


def _arg_name(path: tuple) -> str:
  """``((0,), [1], ['w'])`` of the ``(args, kwargs)`` pair -> ``"args[1]['w']"``."""
  head, rest = path[0], jax.tree_util.keystr(tuple(path[1:]))
  return ("args" if getattr(head, "idx", 0) == 0 else "kwargs") + rest


def _as_tuple(x: Any) -> tuple:
  return (x,) if isinstance(x, (int, str)) else tuple(x)


def _argnum(i: Any, n: int, what: str) -> int:
  """Argument number ``i`` (negative counts from the end) of ``n`` positional example arguments."""
  if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not -n <= i < n:
    raise StepUsageError(
      f"{what} names argument {i!r}, but the step was given {n} positional example argument(s); allowed: "
      f"an int in {-n}..{n - 1}"
      if n
      else f"{what} names argument {i!r}, but the step was given no positional example arguments"
    )
  return int(i) % n


def _check_no_donated_alias(args: tuple, kwargs: dict, donated: tuple[int, ...]) -> None:
  """Refuse one array passed as a donated argument and again elsewhere in the call (XLA would read a buffer
  it is overwriting)."""
  seen: dict[int, str] = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path((args, kwargs))[0]:
    if not isinstance(leaf, jax.Array):
      continue
    name = _arg_name(path)
    first = seen.setdefault(id(leaf), name)
    if first == name:
      continue
    donated_one = next((n for n in (first, name) if any(n.startswith(f"args[{i}]") for i in donated)), None)
    if donated_one is not None:
      raise StepUsageError(
        f"arguments {first} and {name} are the same array, and {donated_one} is donated (donate_argnums): the "
        "step would overwrite the buffer it also reads. Fix: pass a copy (x.copy()) for one of them."
      )


def _same_static(got: Any, want: Any) -> bool:
  """Whether static value ``got`` equals the compiled ``want`` (an array's ``==`` is not one bool)."""
  if got is want:
    return True
  try:
    return bool(got == want)
  except Exception:  # an array's elementwise ==, or a value that cannot be compared
    return False


def _is_array_like(x: Any) -> bool:
  return isinstance(
    x, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct, bool, int, float, complex)
  ) or (hasattr(x, "shape") and hasattr(x, "dtype"))


def _check_example_args(static: _Static, args: tuple, kwargs: dict) -> None:
  """Refuse static values that cannot be hashed and dynamic leaves that are not arrays or numbers."""
  for name, value in zip(static.names(args, kwargs), static.values(args, kwargs)):
    try:
      hash(value)
    except TypeError:
      raise StepUsageError(
        f"static argument {name} is {with_article(type(value).__name__)} ({value!r:.60}), which cannot be hashed; a static "
        "argument is part of the compiled graph and must be hashable. Fix: pass a tuple instead of a list, a "
        "frozen dataclass or tuple of pairs instead of a dict, or close over the value in the step."
      ) from None
  dyn = static.dynamic(args, kwargs)
  for path, leaf in jax.tree_util.tree_flatten_with_path(dyn)[0]:
    if not _is_array_like(leaf):
      names = (
        f"static_argnums={path[1].idx}"
        if getattr(path[0], "idx", 0) == 0
        else f"static_argnames={path[1].key!r}"
      )
      raise StepUsageError(
        f"argument {_arg_name(path)} is {with_article(type(leaf).__name__)} ({leaf!r:.60}); a dynamic argument's leaves must "
        f"be arrays or numbers. Fix: make the argument static ({names}, if it is the whole argument) or "
        "close over the value in the step."
      )


def _check_outputs(step_fn: Callable, out: Any) -> None:
  """Refuse a step output leaf that is not an array or a number (a string, an object)."""
  for path, leaf in jax.tree_util.tree_flatten_with_path(out)[0]:
    if not _is_array_like(leaf):
      raise StepUsageError(
        f"the step {where_defined(step_fn)} returned {with_article(type(leaf).__name__)} "
        f"({leaf!r:.60}) at output{jax.tree_util.keystr(path)}; a step returns a pytree of arrays (the "
        "compiled graph's outputs). Fix: return arrays only, and report other values from a step closure "
        "(@wafer.step_closure)."
      )


def _array_leaves(tree: Any) -> dict[str, Any]:
  """The ``(args, kwargs)`` pair ``tree``'s leaves that are arrays or tracers held by an object's attribute
  (a path through a ``GetAttrKey``: an NNX module's Variables, an ``nnx.Rngs`` count), by their path
  (`_arg_name`: ``"args[0].kernel.value"``).

  Leaves reached through dict keys and list indices alone are left out: a step that rewrites an entry of
  its batch dict in place (``batch["x"] = batch["x"] / 255``) only uses the new value itself, as under
  ``jax.jit``; objects whose attributes a step assigns (modules, optimizers) are state the caller keeps.
  """
  return {
    _arg_name(path): leaf
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
    if isinstance(leaf, (jax.Array, np.ndarray))
    and any(isinstance(k, jax.tree_util.GetAttrKey) for k in path)
  }


def _lost_updates(before: dict[str, Any], after: dict[str, Any], out: Any) -> list[str]:
  """Paths of the arrays that a step stored into its arguments' objects (``after`` is not ``before``,
  by identity) and did not return (the new value is no leaf of ``out``): lost when the trace ends.

  >>> import numpy as np
  >>> a, b, c = np.zeros(1), np.ones(1), np.full(1, 2.0)
  >>> _lost_updates({"w": a, "n": b}, {"w": c, "n": b, "m": a}, out=())
  ['w', 'm']
  >>> _lost_updates({"w": a}, {"w": c}, out={"new_w": c})  # returned: the caller has it
  []
  """
  returned = {id(leaf) for leaf in jax.tree.leaves(out)}
  return [
    path
    for path, leaf in after.items()
    if (path not in before or before[path] is not leaf) and id(leaf) not in returned
  ]


def _check_no_lost_updates(
  step_fn: Callable,
  signature: inspect.Signature | None,
  before: dict[str, Any],
  after: dict[str, Any],
  out: Any,
) -> None:
  """Refuse a step that assigned new arrays to its arguments' attributes (``opt.update(model, grads)`` on NNX
  modules, BatchNorm statistics, an ``nnx.Rngs`` count) without returning them:
  the compiled step runs on copies of its arguments, so every call would start from the old values."""
  lost = _lost_updates(before, after, out)
  if not lost:
    return
  shown = ", ".join(lost[:4]) + (f" (and {len(lost) - 4} more)" if len(lost) > 4 else "")
  owners = sorted({_parameter_of(path, signature) for path in lost})
  raise StepUsageError(
    f"the step {where_defined(step_fn)} assigns new values inside its argument{'s' if len(owners) > 1 else ''} "
    f"{', '.join(owners)} and does not return them: {shown}. A compiled step runs on copies of its arguments: "
    "what it writes into them (opt.update(model, grads) on NNX modules, BatchNorm statistics, an nnx.Rngs "
    "count) is lost when it returns, so every call would start again from the old "
    "values and nothing would train. Fix: return the new state and pass it to the next call, e.g. "
    "graphdef, state = nnx.split((model, opt)) outside the step; inside it, model, opt = nnx.merge(graphdef, "
    "state), update them, and return (loss, nnx.state((model, opt))); after the run, nnx.update((model, opt), "
    "state). Or train with nnx.jit, which carries module state; nothing needs returning when the step only "
    "reads its arguments (a forward pass; model.eval() keeps dropout and BatchNorm from changing state)."
  )


def _parameter_of(path: str, signature: inspect.Signature | None) -> str:
  """The step's parameter (by name where the signature tells it) that holds the leaf at ``path``."""
  kind, _, rest = path.partition("[")
  index = rest.split("]", 1)[0]
  if kind == "args" and index.isdigit() and signature is not None:
    positional = [
      p.name
      for p in signature.parameters.values()
      if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    if int(index) < len(positional):
      return f"{positional[int(index)]} (args[{index}])"
  return f"{kind}[{index}]"


class _Static:
  """Which positional / keyword arguments are static, and how to split them from the dynamic ones."""

  def __init__(self, argnums: tuple[int, ...], argnames: tuple[str, ...]):
    self.argnums, self.argnames = tuple(sorted(set(argnums))), argnames

  def names(self, args: tuple, kwargs: dict) -> list[str]:
    return [f"args[{i}]" for i in self.argnums if i < len(args)] + [k for k in self.argnames if k in kwargs]

  def values(self, args: tuple, kwargs: dict) -> list[Any]:
    return [args[i] for i in self.argnums if i < len(args)] + [
      kwargs[k] for k in self.argnames if k in kwargs
    ]

  def dynamic(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    return (
      tuple(a for i, a in enumerate(args) if i not in self.argnums),
      {k: v for k, v in kwargs.items() if k not in self.argnames},
    )

  def dynamic_index(self, i: int) -> int | None:
    return None if i in self.argnums else i - sum(1 for j in self.argnums if j < i)


_SHAPE_MARKERS = (
  "Shapes must be 1D sequences of concrete values",  # jnp.zeros(n), x.reshape(n, -1)
  "shape argument",
  "jnp.arange argument",  # jnp.arange(n): "It arose in the jnp.arange argument 'stop'"
  "argument of jnp.linspace",  # jnp.linspace(0, 1, n): "'num' argument of jnp.linspace"
)
_SIZE_MARKERS = (
  "size argument",  # jnp.nonzero, jnp.argwhere, jnp.where(cond), jnp.flatnonzero, jnp.unique
  "total_repeat_length",  # jnp.repeat
)


def _is_shape(error: BaseException) -> bool:
  """A traced value where JAX needs a concrete shape (``jnp.zeros(n)``, ``x.reshape(n, -1)``,
  ``jnp.arange(n)``)."""
  text = str(error)
  return any(marker in text for marker in _SHAPE_MARKERS)


def _concretization_kind(error: BaseException) -> str:
  """Which `_FIXES` entry a traced value used as a Python value calls for: by JAX's message (a shape, a
  result of data-dependent size), else by the user's line (a ``range`` loop, a branch), else a value
  fetch (``float(x)``, ``x.item()``)."""
  if _is_shape(error):
    return "shape"
  if any(marker in str(error) for marker in _SIZE_MARKERS):
    return "size"
  frame = user_frame(error.__traceback__)
  line = "" if frame is None else frame[2]
  # (np.asarray(x) on a `for` line is a value fetch: only a range of a traced count is a loop)
  if re.search(r"\brange\(", line) and not isinstance(error, jax.errors.TracerArrayConversionError):
    return "loop"
  return "control_flow" if _is_branch(error) else "value_fetch"


def _in_logging(error: BaseException) -> bool:
  logging_dir = str(Path(logging.__file__).resolve().parent) + os.sep
  return any(
    str(Path(f.filename).resolve()).startswith(logging_dir) for f in traceback.extract_tb(error.__traceback__)
  )


def _is_branch(error: BaseException) -> bool:
  frame = user_frame(error.__traceback__)
  if frame is None:
    return False
  text = frame[2]
  return text.startswith(("if ", "elif ", "while ", "assert "))


def enable_compilation_cache(directory: str | os.PathLike) -> Path:
  """Use ``directory`` for JAX's persistent compilation cache (every compile is cached)."""
  path = Path(directory)
  path.mkdir(parents=True, exist_ok=True)
  path = path.resolve()  # the setting outlives the call: a relative one would follow a later chdir
  if jax.config.jax_compilation_cache_dir != str(path):
    compat.reset_compilation_cache()  # JAX opens its cache once per process; reopen it at the new directory
  jax.config.update("jax_compilation_cache_dir", str(path))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return path
