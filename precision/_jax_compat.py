"""Every JAX internal the project reads, in one place, chosen by feature detection.

`precision.autocast` and `wafer`'s cost model walk jaxprs: they read equations, their
primitives' parameters and the jaxprs inside them, and rebuild higher-order primitives with
transformed bodies. None of that is public API (``jax.extend`` has "no deprecation window"),
and it changes between JAX releases. This module is the only one in the repository that
imports ``jax._src``, ``jax.extend`` or ``jax.interpreters``, or reads the parameters of a
higher-order primitive: a JAX layout change is fixed here and caught by ``tests/compat``.

Rules:

* **Feature detection, not version strings**: each reader checks for the layout it finds
  (``"num_consts" in params`` or ``"ft_in" in params``), so a backport or a nightly works.
* **Rebuild through public APIs** where one exists (``lax.scan``, ``lax.while_loop``,
  ``lax.switch``, ``jax.shard_map``): only *reading* parameters stays private. ``jit``
  (shardings, layouts, donation) and ``remat`` (``differentiated``) are rebound with updated
  parameters, whose names have been stable.
* **Never silently skip**: `is_higher_order` says whether an equation carries a computation
  (a jaxpr in its parameters, or a ``call_hi_primitive``); a caller that does not handle one
  raises `UnhandledPrimitiveError` naming the primitive and the user's line.

Layouts handled (each verified by ``tests/compat``):

* **Jaxprs and constants.** Up to JAX 0.10 a ``ClosedJaxpr`` wraps a ``Jaxpr`` whose
  ``constvars`` pair with ``consts``. From 0.11 ``ClosedJaxpr`` is an alias of ``Jaxpr``
  (jax-ml/jax commit cb3ad2fed5), ``.jaxpr`` returns the jaxpr itself, and tracing returns the
  constants' variables as *leading invars* (ed98c34bc0). `binders` gives ``[*constvars,
  *invars]`` in both, so binding ``[*consts, *args]`` by position is right everywhere.
* **scan**: ``num_consts``/``num_carry`` up to 0.10, ``ft_in``/``ft_out`` flat trees from 0.11
  (08958bdfe2). `scan_counts` reads both.
* **custom_vjp**: from 0.11 the flattened bwd returns ``(cotangents, logs)`` (075da916a3,
  ``defvjp_with_logs``). `bwd_returns_logs` detects it.
* **call primitives**: ``closed_call``/``core_call`` and, from 0.11, ``eval_jaxpr``
  (99a9f6e705) carry their body as ``call_jaxpr``: `CALL_PRIMITIVES`.
* **shard_map**: the manual axes are ``newly_manual_axes`` from 0.10.2, ``manual_axes`` before:
  `shard_map_manual_axes`.
* ``Primitive.get_bind_params`` returns a dict of parameters (a tuple before 0.9.2, which is
  below the supported floor: `bind` refuses it with a clear error).
"""

from __future__ import annotations

import functools
import inspect
import os
import pathlib
import sysconfig
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jaxlib as _jaxlib
import numpy as _np
from jax._src import api_util as _api_util
from jax._src import core as _core
from jax._src import source_info_util as _source_info_src
from jax._src.interpreters import ad as _ad
from jax._src.interpreters import batching as _batching_src
from jax._src.interpreters import partial_eval as _pe
from jax._src.sharding_impls import UNSPECIFIED
from jax._src.sharding_impls import UnspecifiedValue as _Unspecified
from jax.custom_derivatives import SymbolicZero
from jax.extend import core as jcore
from jax.extend import linear_util as lu
from jax.extend import source_info_util
from jax.extend.core import primitives as _primitives
from jax.interpreters import ad, batching, mlir

__all__ = (
  "CALL_PRIMITIVES",
  "UNSPECIFIED",
  "ClosedJaxpr",
  "CustomVJPException",
  "Jaxpr",
  "Literal",
  "Primitive",
  "SymbolicZero",
  "UnhandledPrimitiveError",
  "Var",
  "Zero",
  "ad",
  "batching",
  "bind",
  "binders",
  "bwd_returns_logs",
  "call_jaxpr",
  "closed",
  "cond_branches",
  "cond_platform_default",
  "current_trace",
  "dce",
  "eqn_context",
  "is_batch_tracer",
  "is_higher_order",
  "is_unspecified",
  "jax_primitives",
  "jaxpr_as_fun",
  "jaxprs_in_params",
  "mlir",
  "name_as",
  "reset_compilation_cache",
  "scan_counts",
  "shard_map_manual_axes",
  "source_info_util",
  "plain_scalar",
  "split_closed",
  "trace",
  "INSTALLED_FOLDERS",
  "JAX_DIRS",
  "library_file",
  "user_line",
  "user_stacklevel",
  "while_counts",
)

Jaxpr = jcore.Jaxpr
ClosedJaxpr = jcore.ClosedJaxpr
Literal = jcore.Literal
Var = jcore.Var
Primitive = jcore.Primitive
jaxpr_as_fun = jcore.jaxpr_as_fun
Zero = _ad.Zero
CustomVJPException = _ad.CustomVJPException
ShapedArray = jax.core.ShapedArray
Tracer = jax.core.Tracer
closed_call_p = _primitives.closed_call_p  # ``eval_jaxpr`` from JAX 0.11

# Primitives whose body is a jaxpr evaluated once with the equation's inputs (inlined by autocast).
CALL_PRIMITIVES = frozenset({"closed_call", "core_call", "eval_jaxpr"})
# Primitives that carry a computation not as a jaxpr parameter (JAX's "hi" primitives, behind the
# ``jax_remat3`` / ``jax_custom_vjp3`` / ``jax_custom_jvp3`` flags of JAX's main branch).
_OPAQUE_HIGHER_ORDER = frozenset({"call_hi_primitive"})
# First-order primitives whose jaxpr parameter only describes a scalar combiner (the monoid of a
# scatter or a generic reduction), not a computation on the operands.
_COMBINER_PREFIXES = ("scatter", "reduce", "select_and_scatter", "select_and_gather")
_SPLIT_CLOSED = isinstance(ClosedJaxpr, type) and ClosedJaxpr is not Jaxpr  # JAX <= 0.10


class UnhandledPrimitiveError(NotImplementedError):
  """A higher-order primitive (one that carries a computation) that a jaxpr walker does not
  handle. Never passed through silently: its body would escape the walker's rules."""


# ---- the installed JAX's primitives ----

# Kernel languages: their primitives live inside kernels (``pallas_call``'s body), not in the
# programs a jaxpr walker reads.
_KERNEL_MODULES = ("pallas", "mosaic", "triton")


def jax_primitives() -> dict[str, str]:
  """Every primitive that JAX's own modules define at module level: name -> module.

  Imports ``jax.numpy``, ``jax.nn``, ``jax.random``, ``jax.scipy`` and
  ``jax.experimental.multihost_utils`` (which Orbax imports) first, and reads JAX's library
  modules (``jax._src``, the public ones) but not the rest of ``jax.experimental``, which a
  program must import itself (``jax.experimental.sparse`` defines dozens): the answer does not
  depend on what else the process imported. What a newer JAX adds shows up here, and the tests
  compare it with the op-class table (`precision._op_classes`).
  """
  import sys

  import jax.experimental.multihost_utils  # noqa: F401 (imported for their primitives)
  import jax.nn  # noqa: F401
  import jax.numpy  # noqa: F401
  import jax.random  # noqa: F401
  import jax.scipy.linalg  # noqa: F401
  import jax.scipy.special  # noqa: F401

  found: dict[str, str] = {}
  for module_name, module in sorted(sys.modules.items()):
    if module is None or not (module_name == "jax" or module_name.startswith("jax.")):
      continue
    if module_name.startswith("jax.experimental.") and module_name != "jax.experimental.multihost_utils":
      continue
    if any(part in module_name for part in _KERNEL_MODULES):
      continue
    for value in list(vars(module).values()):
      if isinstance(value, Primitive):
        found.setdefault(value.name, module_name)
  return found


# ---- jaxprs ----


def plain_scalar(value: Any) -> Any:
  """A jaxpr literal's value as the Python number the traced function returned.

  Recent JAX versions keep a Python number in a jaxpr as ``TypedInt`` / ``TypedFloat`` (``int`` / ``float``
  subclasses carrying a dtype, in ``jax._src.literals``); earlier versions keep the number itself.
  Anything else is returned as it is.
  """
  for base in (int, float, complex):
    if isinstance(value, base) and type(value) is not base and type(value).__module__.startswith("jax"):
      return base(value)
  return value


def split_closed(j: Any) -> tuple[Any, list[Any]]:
  """(jaxpr, constants) of a closed jaxpr, or of an open one (no constants).

  Bind ``binders(jaxpr)`` to ``[*constants, *args]`` by position."""
  consts = getattr(j, "consts", None)
  if consts is None:
    return j, []
  return (j.jaxpr if _SPLIT_CLOSED else j), list(consts)


def binders(jaxpr: Any) -> list[Any]:
  """The variables that take a jaxpr's inputs, in order: constants first, then arguments."""
  return [*jaxpr.constvars, *jaxpr.invars]


def closed(jaxpr: Any, consts: Sequence[Any] = ()) -> Any:
  """A closed jaxpr of an open ``jaxpr`` (no constvars) and constants (for parameters)."""
  return ClosedJaxpr(jaxpr, list(consts))


def trace(
  fn: Callable[..., Sequence[Any]], in_avals: Sequence[Any], debug_info: Any
) -> tuple[Any, list[Any]]:
  """Trace ``fn`` (flat arrays in, a flat list out) at the current trace level.

  Returns ``(jaxpr, consts)``: an open jaxpr whose invars are the constants' variables followed
  by ``in_avals``'s (no constvars), and the constants to pass first."""
  if debug_info is None:
    debug_info = _api_util.debug_info("precision", fn, tuple(in_avals), {})
  jaxpr, _, consts = _pe.trace_to_jaxpr_dynamic(lu.wrap_init(fn, debug_info=debug_info), list(in_avals))
  if jaxpr.constvars:
    jaxpr = _pe.convert_constvars_jaxpr(jaxpr)
  return jaxpr, list(consts)


def debug_info_of(jaxpr: Any) -> Any:
  """A jaxpr's debug info (for tracing a replacement body)."""
  return getattr(jaxpr, "debug_info", None)


def name_as(
  wrapper: Callable[..., Any],
  fn: Callable[..., Any],
  args: tuple,
  kwargs: dict[str, Any],
  static: tuple[Sequence[int], Sequence[str]],
  traced: Sequence[bool],
  traced_for: str,
  source: Callable[..., Any] | None = None,
) -> None:
  """Make JAX's tracing errors about ``wrapper`` name ``fn``: its name, file and line, and its arguments.

  ``wrapper`` takes the traced leaves of ``fn(*args, **kwargs)`` flat: ``traced[i]`` says whether leaf
  ``i`` of ``((args without the static ones), (kwargs without the static ones, sorted))`` is one of them
  (``static`` is ``(static_argnums, static_argnames)``). JAX's error for a traced value used as a Python
  value (``range(n)``) then reads "tracing the function f at file:line ... the argument n" rather than
  naming ``wrapper`` and ``dynamic[1]``. JAX reads a function's debug info from its
  ``__fun_debug_info__`` (``api_util.debug_info``, which ``jax.jit`` and ``jax.make_jaxpr`` call): a no-op
  where a JAX has no such hook, or where the names do not line up with ``traced`` (a signature ``args``
  does not fit). ``source``: the function whose name and line to show when not ``fn`` (the user's,
  where ``fn`` is a wrapper of it); a callable object shows its class's ``__call__``."""
  save = getattr(_api_util, "save_wrapped_fun_debug_info", None)
  if save is None:
    return
  try:
    shown = fn if source is None else source
    while isinstance(shown, functools.partial):
      shown = shown.func
    shown = inspect.unwrap(shown)
    if not hasattr(shown, "__code__"):
      shown = type(shown).__call__  # (an NNX module, any callable object)
    info = _api_util.debug_info(
      traced_for,
      fn,
      args,
      kwargs,
      static_argnums=tuple(static[0]),
      static_argnames=tuple(static[1]),
      sourceinfo=_api_util.fun_sourceinfo(shown),
    )
    names = info.arg_names
    if names is None or len(names) != len(traced):
      return
    save(wrapper, info._replace(arg_names=tuple(n for n, t in zip(names, traced) if t)))
  except Exception:  # noqa: BLE001 (debug info only, from JAX's private helper: never fail a trace over it)
    return


def wrap(fn: Callable[..., Any], debug_info: Any) -> Any:
  """``fn`` as a ``linear_util.WrappedFun`` (the ``subfuns`` of custom derivative primitives)."""
  return lu.wrap_init(fn, debug_info=debug_info)


def jaxprs_in_params(params: dict[str, Any]) -> Iterator[Any]:
  """Every jaxpr (open or closed) among an equation's parameters, tuples included."""
  for value in params.values():
    for v in value if isinstance(value, (tuple, list)) else (value,):
      if isinstance(v, (Jaxpr, ClosedJaxpr)):
        yield v


def call_jaxpr(eqn: Any) -> Any | None:
  """The body of a call-like equation (``jit``, ``closed_call``, ``eval_jaxpr``, ``remat``,
  ``shard_map``, custom derivatives): its ``jaxpr`` or ``call_jaxpr`` parameter; else None."""
  for name in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
    value = eqn.params.get(name)
    if isinstance(value, (Jaxpr, ClosedJaxpr)):
      return value
  return None


def is_higher_order(eqn: Any) -> bool:
  """Whether ``eqn`` carries a computation of its own (a jaxpr parameter, or an opaque one). A
  scatter whose ``update_jaxpr`` is more than its monoid (``x.at[i].apply(fn)`` binds ``scatter`` with
  ``fn`` as its update) carries one (`_only_a_combiner`)."""
  name = eqn.primitive.name
  if name in _OPAQUE_HIGHER_ORDER:
    return True
  if name.startswith("scatter"):
    return not _only_a_combiner(eqn.params.get("update_jaxpr"))
  if name.startswith(_COMBINER_PREFIXES):
    return False
  return any(True for _ in jaxprs_in_params(eqn.params))


def _only_a_combiner(update: Any) -> bool:
  """Whether a scatter's ``update_jaxpr`` is only how an update meets the operand: none, ``(x, y) -> y``
  or one equation of the two inputs (``add``, ``mul``, ``max``, ...), as ``.set`` / ``.add`` / ``.mul``
  / ``.max`` bind it. ``.apply(fn)``'s is ``fn`` of the operand alone (``(x, _) -> fn(x)``).

  >>> import jax, jax.numpy as jnp
  >>> def update(f):
  ...   eqns = jax.make_jaxpr(f)(jnp.ones(3)).jaxpr.eqns
  ...   return next(e for e in eqns if e.primitive.name.startswith("scatter")).params.get("update_jaxpr")
  >>> _only_a_combiner(update(lambda x: x.at[0].add(2.0))), _only_a_combiner(update(lambda x: x.at[0].set(2.0)))
  (True, True)
  >>> _only_a_combiner(update(lambda x: x.at[0].apply(jnp.sin)))
  False
  >>> _only_a_combiner(update(lambda x: x.at[0].apply(lambda v: v * v)))
  False
  """
  if update is None:
    return True
  jaxpr = getattr(update, "jaxpr", update)  # a ClosedJaxpr or a Jaxpr
  inputs = list(getattr(jaxpr, "invars", ()))
  eqns = list(getattr(jaxpr, "eqns", ()))
  if not eqns:
    return True
  if len(eqns) > 1 or len(inputs) != 2:
    return False
  (only,) = eqns
  used = [v for v in only.invars if not isinstance(v, Literal)]
  # each input once: ``mul a b`` is a monoid, ``mul a a`` (``.apply(lambda v: v * v)``) is not
  return len(used) == 2 and {id(v) for v in used} == {id(w) for w in inputs}


_OWN_DIRS = tuple(
  os.path.realpath(pathlib.Path(__file__).parent.parent / package) + os.sep
  for package in ("precision", "wafer")
)
"""This project's own packages: a frame in them is never the user's line (a user's own model, under
``models/`` or elsewhere, is)."""


JAX_DIRS = tuple(
  os.path.realpath(os.path.dirname(module.__file__)) + os.sep
  for module in (jax, _jaxlib)
  if getattr(module, "__file__", None)
)
"""JAX's and jaxlib's folders (wherever installed, a source checkout too)."""

_LIBRARY_DIRS = (
  _OWN_DIRS
  + JAX_DIRS
  + (os.path.realpath(os.path.dirname(_np.__file__)) + os.sep,)  # (NumPy outside site-packages: pip --target)
  + tuple(sorted({os.path.realpath(sysconfig.get_path(key)) + os.sep for key in ("stdlib", "platstdlib")}))
)
INSTALLED_FOLDERS = frozenset({"site-packages", "dist-packages"})
"""Folders pip and distribution packages install libraries into (``dist-packages``: Debian's pip,
NVIDIA's JAX containers): a frame there is not the user's line."""


@functools.lru_cache(maxsize=4096)
def library_file(path: str) -> bool:
  """Whether code in the file ``path`` is a library's, never the user's line: JAX and jaxlib, Python's
  standard library (on JAX < 0.10.2 a name-stack decorator's ``contextlib`` frame lies between the
  user's line and JAX's), any installed package (``site-packages`` / ``dist-packages``: Flax, optax)
  and this project's ``precision`` and ``wafer`` packages; also the interpreter's frozen modules
  (``<frozen runpy>``). Code typed at a prompt or run by ``exec`` (``<stdin>``, ``<string>``) is the
  user's.

  >>> library_file(jax.__file__), library_file(os.__file__), library_file("/home/me/train.py")
  (True, True, False)
  >>> library_file("/usr/lib/python3/dist-packages/flax/linen/module.py"), library_file("<stdin>")
  (True, False)
  """
  if path.startswith("<"):
    return path.startswith("<frozen")
  real = os.path.realpath(path)
  # (both the path and its target: a file linked into a cache, as uv's symlink mode installs, is
  # installed though its target's path names no site-packages)
  return real.startswith(_LIBRARY_DIRS) or any(
    not INSTALLED_FOLDERS.isdisjoint(p.split(os.sep)) for p in (path, real)
  )


def user_stacklevel() -> int:
  """``warnings.warn``'s ``stacklevel``, for a warning raised in this project's code, that names the
  innermost caller outside the libraries (`library_file`): under ``jit``, ``grad`` or ``vmap`` an
  autocast function is called from JAX's tracing, not from the user's line."""
  import sys

  frame, level = sys._getframe(1), 1  # (1: the function that calls warnings.warn)
  while frame is not None and library_file(frame.f_code.co_filename):
    frame, level = frame.f_back, level + 1
  return level if frame is not None else 1


def user_line(eqn: Any) -> str:
  """``file:line (function)`` of the user's code that traced ``eqn``: the innermost frame outside JAX,
  the standard library and this project's ``precision`` and ``wafer`` packages (``<unknown>`` if
  none: the function given is then the primitive's own call, a ``functools.partial`` of its
  ``bind``, say)."""
  if hasattr(_source_info_src, "user_frames"):  # (every supported JAX; feature-detected)
    frames = _source_info_src.user_frames(eqn.source_info.traceback)
  else:
    frames = iter([_source_info_src.user_frame(eqn.source_info.traceback)])
  for frame in frames:
    if frame is not None and not os.path.realpath(frame.file_name).startswith(_OWN_DIRS):  # (symlinks too)
      return f"{frame.file_name}:{frame.start_line} ({frame.function_name})"
  return "<unknown>"


def unhandled(eqn: Any, walker: str) -> UnhandledPrimitiveError:
  """The error for a higher-order equation ``walker`` does not handle."""
  line = user_line(eqn)
  where = f"traced at {line}" if line != "<unknown>" else f"bound by the function given to {walker} itself"
  name = eqn.primitive.name
  hint = next((h for prefix, h in _UNHANDLED_HINTS.items() if name.startswith(prefix)), None)
  if hint is None:
    hint = (
      f"If it is new in your JAX version ({jax.__version__}), please report it; meanwhile move the call "
      "out of the function"
    )
  return UnhandledPrimitiveError(
    f"{walker}: the primitive {name!r} ({where}) carries a computation that {walker} does not know how "
    "to transform, so its body would escape the policy (it would run unchanged, in float32). "
    f"{hint}, or wrap it in precision.float32_region() to keep it float32 deliberately."
  )


_UNHANDLED_HINTS = {
  "scatter": "x.at[idx].apply(fn) runs fn inside a scatter: write x.at[idx].set(fn(x[idx])), which "
  "computes fn under the policy",
  "composite": "jax.lax.composite wraps a decomposition for other compilers: call the decomposition itself",
  "custom_partitioning": "a custom_partitioning function partitions by rules of its own: call its "
  "undecorated body",
}
"""What to write instead, by primitive name (prefix), for higher-order primitives users meet."""


def eqn_context(eqn: Any) -> Any:
  """A context that makes equations bound inside it carry ``eqn``'s source line and name stack."""
  name_stack = source_info_util.current_name_stack() + eqn.source_info.name_stack
  return source_info_util.user_context(eqn.source_info.traceback, name_stack=name_stack)


def name_stack(eqn: Any) -> str:
  """``eqn``'s own name stack (its jaxpr's scopes, not the caller's), as text."""
  return str(eqn.source_info.name_stack)


def full_name_stack(eqn: Any) -> str:
  """The name stack of the trace in progress plus ``eqn``'s own."""
  return str(source_info_util.current_name_stack() + eqn.source_info.name_stack)


# ---- binding equations ----


def bind(eqn: Any, values: Sequence[Any], **param_updates: Any) -> list[Any]:
  """Bind ``eqn``'s primitive again on ``values`` with its parameters (some replaced)."""
  params = bind_params(eqn, {**eqn.params, **param_updates})
  out = eqn.primitive.bind(*values, **params)
  return list(out) if eqn.primitive.multiple_results else [out]


def bind_params(eqn: Any, params: dict[str, Any]) -> dict[str, Any]:
  """``primitive.get_bind_params(params)``: the keyword arguments of ``bind``."""
  bind_params = eqn.primitive.get_bind_params(params)
  if not isinstance(bind_params, dict):  # JAX < 0.9.2: (subfuns, params)
    raise RuntimeError(
      f"JAX {jax.__version__} is older than this project supports (Primitive.get_bind_params returned a "
      f"{type(bind_params).__name__}); see the supported versions in docs/jax-versions.md."
    )
  return bind_params


def is_unspecified(sharding: Any) -> bool:
  """Whether a ``jit`` sharding parameter is JAX's "unspecified" marker."""
  return isinstance(sharding, _Unspecified)


# ---- reading products ----

# Matrix products the cost model counts (`dot_numbers` reads the first three).
PRODUCT_PRIMITIVES = frozenset({"dot_general", "ragged_dot_general", "ragged_dot", "conv_general_dilated"})


def dot_numbers(eqn: Any) -> tuple[tuple[Any, Any], tuple[Any, Any], tuple[int, ...], tuple[int, ...], int]:
  """``((lhs_contract, rhs_contract), (lhs_batch, rhs_batch), rhs_group, lhs_ragged, groups)`` of a
  ``dot_general`` or a ragged (grouped) product.

  A ragged product (``lax.ragged_dot``, the grouped matmul of a mixture of experts) multiplies each
  slice of ``lhs`` along ``lhs_ragged`` with one of ``groups`` slices of ``rhs`` (its
  ``rhs_group`` axes; none where the output holds the groups instead, as in the weight gradient).
  Layouts: ``ragged_dot_general`` with ``ragged_dot_dimension_numbers`` (JAX >= 0.4.38, every
  supported release), and the older ``ragged_dot`` (``lhs [m, k]``, ``rhs [g, k, n]``).
  """
  prim = eqn.primitive.name
  if prim == "dot_general":
    contract, batch = eqn.params["dimension_numbers"]
    return contract, batch, (), (), 1
  groups = int(eqn.invars[2].aval.shape[-1]) if len(eqn.invars) > 2 else 1
  if prim == "ragged_dot_general" and "ragged_dot_dimension_numbers" in eqn.params:
    rdn = eqn.params["ragged_dot_dimension_numbers"]
    contract, batch = rdn.dot_dimension_numbers
    return contract, batch, tuple(rdn.rhs_group_dimensions), tuple(rdn.lhs_ragged_dimensions), groups
  if prim == "ragged_dot":
    return ((1,), (1,)), ((), ()), (0,), (0,), groups
  raise RuntimeError(f"{prim} parameters of an unknown layout: {sorted(eqn.params)} (JAX {jax.__version__})")


# ---- reading higher-order primitives ----


def scan_counts(params: dict[str, Any]) -> tuple[int, int]:
  """(number of constants, number of carried values) of a ``scan`` equation; the rest are xs."""
  if "num_consts" in params:  # JAX <= 0.10
    return int(params["num_consts"]), int(params["num_carry"])
  if "ft_in" in params:  # JAX >= 0.11: flat trees (consts, carry, xs)
    consts, carry, _ = params["ft_in"].unpack()
    return len(consts), len(carry)
  raise RuntimeError(f"scan parameters of an unknown layout: {sorted(params)} (JAX {jax.__version__})")


def scan_body(params: dict[str, Any]) -> Any:
  """A ``scan``'s body (a closed jaxpr: consts, carry and xs in; carry and ys out)."""
  return params["jaxpr"]


def while_counts(params: dict[str, Any]) -> tuple[int, int]:
  """(cond constants, body constants) of a ``while`` equation; the rest is the carry."""
  return int(params["cond_nconsts"]), int(params["body_nconsts"])


def while_jaxprs(params: dict[str, Any]) -> tuple[Any, Any]:
  """``(cond, body)`` of a ``while`` equation (closed jaxprs: constants, then the carry)."""
  return params["cond_jaxpr"], params["body_jaxpr"]


def cond_branches(params: dict[str, Any]) -> tuple[Any, ...]:
  """A ``cond``'s branches (closed jaxprs), in index order."""
  return tuple(params["branches"])


def cond_platform_default(params: dict[str, Any]) -> int | None:
  """The index of the default branch of a ``lax.platform_dependent`` ``cond`` (one program per
  backend), or None for an ordinary ``cond``."""
  platforms = params.get("branches_platforms")
  if platforms and None in platforms:
    return list(platforms).index(None)
  return None


def shard_map_manual_axes(params: dict[str, Any]) -> set[str]:
  """The mesh axes a ``shard_map`` makes manual (empty: all of its mesh's axes)."""
  for name in ("newly_manual_axes", "manual_axes"):
    if name in params:
      return set(params[name])
  return set()


# ---- custom derivatives ----


def bwd_returns_logs() -> bool:
  """Whether a custom_vjp's flattened bwd rule returns ``(cotangents, logs)`` (JAX >= 0.11)."""
  return hasattr(jax.custom_vjp, "defvjp_with_logs")


# ---- for wafer: traces, tracers, the compilation cache, dead code ----


def current_trace() -> Any:
  """The trace in progress (identifies a trace level), or None if JAX has no trace context."""
  ctx = getattr(_core, "trace_ctx", None)
  return None if ctx is None else ctx.trace


def is_batch_tracer(x: Any) -> bool:
  """Whether ``x`` is a ``vmap`` tracer."""
  return isinstance(x, _batching_src.BatchTracer)


def reset_compilation_cache() -> None:
  """Make JAX reopen its persistent compilation cache (after its directory changed)."""
  try:
    from jax._src import compilation_cache
  except ImportError:  # pragma: no cover - a JAX without it
    return
  reset = getattr(compilation_cache, "reset_cache", None)
  if reset is not None:
    reset()


def dce(jaxpr: Any) -> Any:
  """``jaxpr`` without dead code (all outputs used); the jaxpr itself if JAX cannot."""
  try:
    return _pe.dce_jaxpr(jaxpr, [True] * len(jaxpr.outvars), instantiate=True)[0]
  except Exception:  # noqa: BLE001 (a primitive without a DCE rule: the jaxpr as it is)
    return jaxpr
