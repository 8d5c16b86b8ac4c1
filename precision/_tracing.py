"""Tracing the user's function for `autocast`: static and traced arguments, pytrees with
non-array leaves (Equinox), Flax NNX modules (state written back as ``nnx.jit`` does)."""

from __future__ import annotations

import contextlib
import inspect
import sys as _sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from precision import _jax_compat as compat
from precision.policy import Policy, PolicyError

TRACING = threading.local()  # depth of autocast traces in progress (nesting detection)


@contextlib.contextmanager
def tracing() -> Any:
  TRACING.depth = getattr(TRACING, "depth", 0) + 1
  try:
    yield
  finally:
    TRACING.depth -= 1


# ---- tracing the user's function ----


class Statics(NamedTuple):
  argnums: tuple[int, ...]
  argnames: tuple[str, ...]

  @classmethod
  def of(cls, fn: Callable[..., Any], argnums: Any, argnames: Any) -> Statics:
    """Static positions and names, each completed from ``fn``'s signature (as ``jax.jit`` does).

    Raises:
      TypeError: ``argnums`` is not an int or a sequence of ints, ``argnames`` not a string or
        a sequence of strings.
      ValueError: a position or a name ``fn``'s signature does not have (as ``jax.jit``).
    """
    name = fn_name(fn)
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


def fn_name(fn: Any) -> str:
  return getattr(fn, "__name__", None) or type(fn).__name__


def check_callable(fn: Any, where: str) -> None:
  """A TypeError naming what was given in place of the function, if it is not callable."""
  if callable(fn):
    return
  hint = " Did you swap fn and policy?" if isinstance(fn, (str, Policy)) else ""
  raise TypeError(
    f"{where}(fn, policy, ...): fn must be a function (e.g. a loss, or jax.value_and_grad(loss)); got "
    f"{type(fn).__name__} {fn!r:.60}.{hint}"
  )


def check_key(fn: Callable[..., Any], policy: Policy, key: Any) -> jax.Array:
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


def as_policy(policy: Policy | str) -> Policy:
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


def _host(value: Any) -> Any:
  """A static argument as ``fn`` sees it: its 0-d integer and bool JAX arrays (not tracers) as Python
  numbers, so that a loop count or a flag (``range(n)``, ``n > 1``, ``if flag:``) is a Python value
  inside the trace, as it is when the float32 policy calls ``fn`` itself (a ``jnp`` operation inside a
  trace is staged, even on a concrete array). Every other leaf is passed as it is: a float scalar
  keeps its dtype and weak type, a table or a PRNG key stays a JAX array."""

  def leaf(x: Any) -> Any:
    if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer) and x.shape == ():
      if jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_:
        return x.item()
    return x

  return jax.tree.map(leaf, value)


def _split_static(statics: Statics, args: tuple, kwargs: dict) -> tuple[dict, dict, tuple, dict]:
  """``(static positional by index, static keywords, dynamic args with None at static positions,
  dynamic keywords)``; the static values on the host (`_host`)."""
  static_args = {i: _host(args[i]) for i in statics.argnums if i < len(args)}
  static_kwargs = {k: _host(kwargs[k]) for k in statics.argnames if k in kwargs}
  dyn_args = tuple(None if i in static_args else a for i, a in enumerate(args))
  dyn_kwargs = {k: v for k, v in kwargs.items() if k not in static_kwargs}
  return static_args, static_kwargs, dyn_args, dyn_kwargs


def trace_fn(
  fn: Callable[..., Any],
  statics: Statics,
  args: tuple,
  kwargs: dict,
  source: Callable[..., Any] | None = None,
) -> tuple[Any, _Outputs, list]:
  """(closed jaxpr, how to rebuild the output, flat dynamic arguments) of ``fn(*args, **kwargs)``.

  Leaves that are arrays (NumPy scalars included) are traced; Python numbers and bools are static,
  as the float32 policy passes them (it calls ``fn`` itself), so a loop count works under every
  policy; any other leaf (a function or a string held by an Equinox module, an enum, a config
  object) is static too: passed to ``fn`` as it is, as ``eqx.filter_jit`` does. Such leaves among
  ``fn``'s outputs are returned as they are. An array used as a Python value while tracing
  (``range(n)``, ``if flag:``) raises JAX's error with a note naming ``static_argnums``; JAX's error
  names ``fn`` (or ``source``, the user's function ``fn`` wraps), its line and the argument, as
  ``jax.jit``'s does (`compat.name_as`)."""
  static_args, static_kwargs, dyn_args, dyn_kwargs = _split_static(statics, args, kwargs)
  leaves, in_tree = jax.tree.flatten((dyn_args, dyn_kwargs))
  traced = [
    t and not (isinstance(leaf, (int, float, complex)) and not isinstance(leaf, np.generic))
    for leaf, t in zip(leaves, _traced_leaves((dyn_args, dyn_kwargs), leaves))
  ]
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

  compat.name_as(flat_fn, fn, args, kwargs, statics, traced, "autocast", source)
  try:
    with tracing():
      closed = jax.make_jaxpr(flat_fn)(*flat)
  except (jax.errors.ConcretizationTypeError, jax.errors.TracerIntegerConversionError) as e:
    e.add_note(
      f"autocast traces {fn_name(fn)}'s array arguments, as jax.jit does (Python numbers and bools are passed "
      "unchanged): an array used as a Python value (a loop count, a shape, a flag) must be static: "
      "autocast(fn, policy, static_argnums=...) or static_argnames=... (cast_report and numerics_report take the same)."
    )
    raise
  return closed, outputs[0], flat


class _Lifted(NamedTuple):
  """A call whose arguments hold Flax NNX modules, as a pure function of their state."""

  fn: Callable[..., Any]  # (state, other leaves) -> (fn's result, the modules' new state)
  args: tuple  # (state, other leaves)
  finish: Callable[[Any], Any]  # writes the new state into the caller's modules; returns the result
  traced_outputs: list[int]  # filled while tracing: how many traced outputs fn's result has


def module_as_argument(
  fn: Callable[..., Any], args: tuple, statics: Statics
) -> tuple[Callable[..., Any], tuple, Statics]:
  """``fn`` an NNX module, or a method bound to one, as a function of the module: ``(call, (module,
  *args), statics)`` with the static positions shifted, so that `lift_nnx_modules` writes back what
  the call changes in it (as if the user had written ``f(model, x)``); anything else as it is."""
  nnx = _sys.modules.get("flax.nnx")
  if nnx is None:
    return fn, args, statics
  is_node = nnx.graph.is_graph_node
  owner = getattr(fn, "__self__", None)
  if is_node(fn):
    module, call = fn, _call_module  # (positions from the end stay where they are)
  elif owner is not None and is_node(owner) and callable(getattr(fn, "__func__", None)):
    module, call = owner, fn.__func__
  else:
    return fn, args, statics
  shifted = tuple(i + 1 if i >= 0 else i for i in statics.argnums)
  return call, (module, *args), Statics(shifted, statics.argnames)


def _call_module(module: Any, *args: Any, **kwargs: Any) -> Any:
  return module(*args, **kwargs)


@contextlib.contextmanager
def module_state_errors(fn: Callable[..., Any], caller: str, *, writing_back: bool = False) -> Any:
  """Flax's error for a module changed from inside a trace as the fix. Tracing (``writing_back``
  false): a closure over a module with BatchNorm or Dropout; pass the module as an argument.
  Writing the new state back: the call runs inside a JAX transformation (``jax.jit(autocast(model,
  p))``) that was not given the module, so its new state belongs to that trace."""
  try:
    yield
  except Exception as exc:
    if type(exc).__name__ != "TraceContextError":
      raise
    if writing_back:
      raise TypeError(
        f"{caller}({fn_name(fn)}) runs inside a JAX transformation (jax.jit, jax.grad, ...) that was "
        "not given the NNX module it changes (BatchNorm statistics, the Rngs counts of dropout): the new "
        "state is a value of that trace and cannot be written into the module outside it. Pass the module "
        "as an argument of the transformation, with nnx.jit (or nnx.grad, ...), which carries it through "
        f"(jax.jit cannot): nnx.jit(lambda model, x: {caller}(model, policy)(x))(model, x); or call "
        "model.eval() when nothing should change"
      ) from exc
    raise TypeError(
      f"{caller}({fn_name(fn)}): it changes an NNX module that it reads from outside its arguments "
      "(BatchNorm statistics, the Rngs counts of dropout), which a traced function cannot do; pass the "
      f"module as an argument, as nnx.jit needs too: {caller}(lambda model, x: model(x), ...) called "
      "with (model, x)"
    ) from exc


def lift_nnx_modules(fn: Callable[..., Any], statics: Statics, args: tuple, kwargs: dict) -> _Lifted | None:
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
  static_args, static_kwargs, dyn_args, dyn_kwargs = _split_static(statics, args, kwargs)
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
