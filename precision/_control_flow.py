"""Higher-order primitives under `autocast`: their bodies interpreted with the policy.

``jit`` bodies stay ``jit`` calls (same shardings) when traced and are inlined when evaluated
eagerly; calls (``closed_call``, ``core_call``, ``eval_jaxpr``) are inlined; ``scan``,
``while`` and ``cond`` are rebuilt with the public ``lax.scan``, ``lax.while_loop`` and
``lax.switch``, ``shard_map`` with ``jax.shard_map``; ``remat`` is rebound with its
transformed body; ``custom_jvp`` / ``custom_vjp`` keep their rules, whose jvp, fwd and bwd are
interpreted too. Parameters are read through `precision._jax_compat`. A loop carry's tag is
the fixed point of its body (module docstring of `precision.autocast`).

Each handler has the signature ``(pass, eqn, values, tags) -> (outputs, output tags)`` and is
registered in `precision._state.HIGHER_ORDER` by primitive name when this module is imported.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from precision import _jax_compat as compat
from precision._interpreter import interpret, random_results
from precision._matmul import hoist
from precision._state import HIGHER_ORDER, RAW_TAG, Pass, Tag, is_f32, join, join_all_opt, numel
from precision.cast_report import CastLog
from precision.policy import PolicyError

Handler = Callable[[Pass, Any, list, list], tuple[list, list]]


def _retrace(
  p: Pass,
  jaxpr: Any,
  consts: Sequence[Any],
  tags: Sequence[Tag | None],
  iteration: bool = False,
  rounded: dict[int, Any] | None = None,
) -> tuple[Any, list[Any], list[Tag | None], CastLog]:
  """Trace the transformed ``jaxpr`` (bound to ``consts`` and arguments tagged ``tags``).

  Returns ``(new jaxpr, new constants, output tags, cast log)``; the new jaxpr is open and takes
  the new constants first, then the arguments (`compat.trace`). ``iteration``: it takes one more,
  last, argument: a uint32 iteration index folded into the child's rounding key (fresh
  stochastic bits in each loop iteration). ``rounded``: arguments the caller rounded as
  matrix-product operands (`hoist`), closed over (they become new constants)."""
  child = p.child()
  loop_key = child.key
  box: list[list[Tag | None]] = []

  def body(*args: Any) -> list[Any]:
    if iteration:
      *args, i = args
      child.key, child.sites = (None if loop_key is None else jax.random.fold_in(loop_key, i)), 0
    outs, out_tags = interpret(child, jaxpr, consts, args, tags, rounded)
    box.append(out_tags)
    return outs

  arg_vars = compat.binders(jaxpr)[len(consts) :]
  in_avals = [v.aval for v in arg_vars] + ([compat.ShapedArray((), jnp.uint32)] if iteration else [])
  debug = compat.debug_info_of(jaxpr)
  if debug is not None and getattr(debug, "arg_names", None) is not None:
    names = tuple(debug.arg_names)[-len(arg_vars) :] if arg_vars else ()
    debug = debug._replace(arg_names=(*names, "iteration") if iteration else names)
  new_jaxpr, new_consts = compat.trace(body, in_avals, debug)
  return new_jaxpr, new_consts, box[-1], child.log


def _as_fun(jaxpr: Any, consts: Sequence[Any]) -> Callable[..., list[Any]]:
  """A traced jaxpr (constants first) as a function of its arguments."""
  fun = compat.jaxpr_as_fun(compat.closed(jaxpr))
  return lambda *args: list(fun(*consts, *args))


def _fixed_point(
  p: Pass,
  body: Any,
  head: list[Tag | None],
  carry: list[Tag | None],
  tail: list[Tag | None],
  iteration: bool = False,
  rounded: dict[int, Any] | None = None,
) -> tuple[Any, list[Any], list[Tag | None], list[Tag | None], CastLog]:
  """Retrace a loop body (a closed jaxpr) until the carried tags are stable (each pass can only
  widen them). Returns (new jaxpr, new constants, carry tags, output tags, log)."""
  jaxpr, consts = compat.split_closed(body)
  while True:
    new_jaxpr, new_consts, out_tags, log = _retrace(p, jaxpr, consts, head + carry + tail, iteration, rounded)
    joined = [join(a, b) for a, b in zip(carry, out_tags[: len(carry)])]
    if joined == carry:
      return new_jaxpr, new_consts, carry, out_tags, log
    carry = joined


def _inline(p: Pass, eqn: Any, values: list[Any], tags: list[Tag | None]) -> tuple[list, list]:
  jaxpr, consts = compat.split_closed(compat.call_jaxpr(eqn))
  rounded = hoist(p, jaxpr, len(consts), eqn.invars, values, tags)
  outs, out_tags = interpret(p, jaxpr, consts, values, tags, rounded)
  random_results(p, outs, p.random_outputs)
  return outs, out_tags


def _jit(p: Pass, eqn: Any, values: list[Any], tags: list[Tag | None]) -> tuple[list, list]:
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
  traced = any(isinstance(v, compat.Tracer) for v in values)
  placed = any(not compat.is_unspecified(s) for s in (*params["in_shardings"], *params["out_shardings"]))
  placed = placed or any(layout is not None for layout in (*params["in_layouts"], *params["out_layouts"]))
  if not (traced or placed):
    return _inline(p, eqn, values, tags)
  jaxpr, consts = compat.split_closed(params["jaxpr"])
  rounded = hoist(p, jaxpr, len(consts), eqn.invars, values, tags)  # closed over: new constants
  box: list[list[Tag | None]] = []

  def body(*args: Any) -> list[Any]:
    outs, out_tags = interpret(p, jaxpr, consts, args, tags, rounded)
    box.append(out_tags)
    bits.append(p.random_outputs)
    return outs

  bits: list[tuple[int, ...]] = []
  new_jaxpr, new_consts = compat.trace(body, [v.aval for v in eqn.invars], compat.debug_info_of(jaxpr))
  n = len(new_consts)  # the new constants (rounded weights, keys of stochastic sites) lead the arguments
  outs = compat.bind(
    eqn,
    [*new_consts, *values],
    jaxpr=compat.closed(new_jaxpr),
    in_shardings=(compat.UNSPECIFIED,) * n + tuple(params["in_shardings"]),
    in_layouts=(None,) * n + tuple(params["in_layouts"]),
    donated_invars=(False,) * n + tuple(params["donated_invars"]),
  )
  random_results(p, outs, bits[-1])
  return outs, box[-1]


def _remat(p: Pass, eqn: Any, values: list[Any], tags: list[Tag | None]) -> tuple[list, list]:
  jaxpr, consts = compat.split_closed(eqn.params["jaxpr"])
  rounded = hoist(p, jaxpr, len(consts), eqn.invars, values, tags)
  new_jaxpr, new_consts, out_tags, log = _retrace(p, jaxpr, consts, tags, rounded=rounded)
  p.log.merge(log)
  outs = compat.bind(eqn, [*new_consts, *values], jaxpr=new_jaxpr)
  return outs, out_tags


def _scan(p: Pass, eqn: Any, values: list[Any], tags: list[Tag | None]) -> tuple[list, list]:
  params = eqn.params
  n_consts, n_carry = compat.scan_counts(params)
  length = int(params["length"])
  head, carry, tail = tags[:n_consts], tags[n_consts : n_consts + n_carry], tags[n_consts + n_carry :]
  stochastic = bool(p.stochastic) and p.key is not None  # an iteration index as one more scanned input
  body_jaxpr, body_consts = compat.split_closed(compat.scan_body(params))
  rounded = hoist(p, body_jaxpr, len(body_consts), eqn.invars, values, tags, range(n_consts))
  new_jaxpr, new_consts, carry, out_tags, log = _fixed_point(
    p, compat.scan_body(params), head, carry, tail, stochastic, rounded
  )
  p.log.merge(log, times=length)
  body = _as_fun(new_jaxpr, new_consts)
  consts, init, xs = values[:n_consts], values[n_consts : n_consts + n_carry], values[n_consts + n_carry :]
  if stochastic:
    xs = [*xs, jnp.arange(length, dtype=jnp.uint32)]

  def step(c: list[Any], x: list[Any]) -> tuple[list[Any], list[Any]]:
    outs = body(*consts, *c, *x)
    return outs[:n_carry], outs[n_carry:]

  final, ys = jax.lax.scan(
    step, list(init), list(xs), length=length, reverse=bool(params["reverse"]), unroll=params["unroll"]
  )
  return [*final, *ys], carry + out_tags[n_carry:]


def _while(p: Pass, eqn: Any, values: list[Any], tags: list[Tag | None]) -> tuple[list, list]:
  params = eqn.params
  nc, nb = compat.while_counts(params)
  cond_consts, body_consts, init = values[:nc], values[nc : nc + nb], values[nc + nb :]
  cond_tags, body_tags, carry = tags[:nc], tags[nc : nc + nb], tags[nc + nb :]
  if p.stochastic and p.key is not None:
    raise PolicyError(
      f"policy {str(p.policy)!r}: stochastic rounding inside a while loop (lax.while_loop, or fori_loop "
      "with bounds not known when tracing) is not supported: its iterations would reuse the same bits. "
      "Use lax.scan or a fori_loop with Python-int bounds, or a policy without stochastic=."
    )
  body_jaxpr, body_new, carry, _, log = _fixed_point(p, params["body_jaxpr"], body_tags, carry, [])
  cond, cond_attached = compat.split_closed(params["cond_jaxpr"])
  cond_jaxpr, cond_new, _, cond_log = _retrace(p, cond, cond_attached, cond_tags + carry)
  p.log.merge(log)
  p.log.merge(cond_log)
  p.log.while_loops += 1
  cond_fun, body_fun = _as_fun(cond_jaxpr, cond_new), _as_fun(body_jaxpr, body_new)
  pred_shape = tuple(cond.outvars[0].aval.shape)
  if not pred_shape:
    outs = jax.lax.while_loop(
      lambda c: cond_fun(*cond_consts, *c)[0], lambda c: body_fun(*body_consts, *c), list(init)
    )
    return list(outs), carry
  # a batched predicate (vmap of a while_loop whose condition depends on the mapped value): as JAX
  # lowers it, the loop runs while any element's predicate holds, and an element whose predicate
  # no longer holds keeps its carry (the predicate's axes lead every carry's)
  for v in init:
    if tuple(jnp.shape(v))[: len(pred_shape)] != pred_shape:
      raise NotImplementedError(
        f"a while loop with a batched predicate of shape {pred_shape} and a carry of shape "
        f"{jnp.shape(v)} (the predicate's axes do not lead it): not supported"
      )

  def keep_going(c: list[Any]) -> Any:
    return jnp.any(cond_fun(*cond_consts, *c)[0])

  def step(c: list[Any]) -> list[Any]:
    pred = cond_fun(*cond_consts, *c)[0]
    new = body_fun(*body_consts, *c)
    return [
      jax.lax.select(jax.lax.broadcast_in_dim(pred, jnp.shape(n), tuple(range(len(pred_shape)))), n, o)
      for n, o in zip(new, c)
    ]

  return list(jax.lax.while_loop(keep_going, step, list(init))), carry


def _cond(p: Pass, eqn: Any, values: list[Any], tags: list[Tag | None]) -> tuple[list, list]:
  index, operands, op_tags = values[0], values[1:], tags[1:]
  split = [compat.split_closed(b) for b in compat.cond_branches(eqn.params)]
  rounded: dict[int, Any] = {}
  for jaxpr, consts in split:  # an operand rounded once for every branch
    rounded.update(hoist(p, jaxpr, len(consts), eqn.invars[1:], operands, op_tags))
  traced = [_retrace(p, jaxpr, consts, op_tags, rounded=rounded) for jaxpr, consts in split]
  for *_, log in traced:
    p.log.merge(log)
  branches = [_as_fun(jaxpr, consts) for jaxpr, consts, _, _ in traced]
  outs = jax.lax.switch(index, branches, *operands)
  out_tags = [join_all_opt([t[2][i] for t in traced]) for i in range(len(eqn.outvars))]
  return list(outs), out_tags


def _linear_solve(p: Pass, eqn: Any, values: list[Any], tags: list[Tag | None]) -> tuple[list, list]:
  """``lax.custom_linear_solve`` (``jnp.linalg.solve``, ``jax.scipy.sparse.linalg.cg``): its matvec,
  vecmat, solve and transpose-solve jaxprs (each: its constants, then ``b``) interpreted with the
  pass and bound again; the outputs have the solve's tags."""
  params = eqn.params
  lengths, jaxprs = params["const_lengths"], params["jaxprs"]
  n_consts = sum(lengths)
  b_tags = list(tags[n_consts:])
  groups, new_jaxprs, new_lengths, start = [], [], [], 0
  out_tags: list[Tag | None] = [RAW_TAG if is_f32(v.aval) else None for v in eqn.outvars]
  for name, n, closed_body in zip(jaxprs._fields, lengths, jaxprs):
    consts, start = values[start : start + n], start + n
    if closed_body is None:
      groups.append([])
      new_jaxprs.append(None)
      new_lengths.append(0)
      continue
    jaxpr, attached = compat.split_closed(closed_body)
    arg_tags = [RAW_TAG if is_f32(jax.typeof(c)) else None for c in consts] + b_tags
    new_jaxpr, new_consts, body_tags, log = _retrace(p, jaxpr, attached, arg_tags)
    p.log.merge(log)
    if name == "solve":
      out_tags = body_tags
    groups.append([*new_consts, *consts])
    new_jaxprs.append(compat.closed(new_jaxpr))
    new_lengths.append(len(new_consts) + n)
  operands = [v for group in groups for v in group] + list(values[n_consts:])
  outs = compat.bind(
    eqn, operands, const_lengths=type(lengths)(*new_lengths), jaxprs=type(jaxprs)(*new_jaxprs)
  )
  return outs, out_tags


_MANUAL = threading.local()  # mesh axes of the shard_map bodies being interpreted (innermost last)


def manual_axes() -> tuple[str, ...]:
  """The mesh axis names that are manual where the pass is now tracing (inside ``shard_map``
  bodies; empty outside). An observer (`numerics_report`) uses them to tell the shards apart."""
  return getattr(_MANUAL, "axes", ())


def _shard_map(p: Pass, eqn: Any, values: list[Any], tags: list[Tag | None]) -> tuple[list, list]:
  params = eqn.params
  box: list[list[Tag | None]] = []
  newly_manual = compat.shard_map_manual_axes(params)
  manual = newly_manual or set(params["mesh"].axis_names)
  names = tuple(n for n in params["mesh"].axis_names if n in manual)
  jaxpr, consts = compat.split_closed(params["jaxpr"])

  def body(*args: Any) -> tuple[Any, ...]:
    outer = manual_axes()
    _MANUAL.axes = outer + tuple(n for n in names if n not in outer)
    try:
      outs, out_tags = interpret(p, jaxpr, consts, args, tags)
    finally:
      _MANUAL.axes = outer
    box.append(out_tags)
    return tuple(outs)

  mapped = jax.shard_map(
    body,
    mesh=params["mesh"],
    in_specs=tuple(params["in_specs"]),
    out_specs=tuple(params["out_specs"]),
    axis_names=newly_manual,
    check_vma=params.get("check_vma", True),
  )
  outs = list(mapped(*values))
  return outs, box[-1]


def _is_precision_round(call: Any) -> bool:
  info = compat.debug_info_of(compat.split_closed(call)[0])
  return info is not None and str(getattr(info, "func_src_info", "")).startswith("_round_with_vjp ")


def _primal(p: Pass, call: Any, tags: Sequence[Tag | None], box: list) -> Callable[..., list[Any]]:
  """A custom function's primal, evaluated with the pass; its output tags go to ``box``."""
  jaxpr, consts = compat.split_closed(call)

  def fun(*args: Any) -> list[Any]:
    outs, out_tags = interpret(p, jaxpr, consts, args, tags)
    box.append(out_tags)
    return outs

  return fun


def _custom_jvp(p: Pass, eqn: Any, values: list[Any], tags: list[Tag | None]) -> tuple[list, list]:
  params = eqn.params
  call = params["call_jaxpr"]
  num_consts = params["num_consts"]
  jvp_fun = params["jvp_jaxpr_fun"]
  box: list[list[Tag | None]] = []
  fun = _primal(p, call, tags, box)

  def jvp(*xs: Any) -> list[Any]:  # jax's lift_jvp, evaluating with the pass
    n = len(xs) // 2
    primals, tangents = xs[num_consts:n], xs[n + num_consts :]
    zeros = [type(t) is compat.SymbolicZero for t in tangents]
    jvp_jaxpr, jvp_consts, out_zeros = jvp_fun.call_wrapped(*zeros)
    nonzero = [t for t in tangents if type(t) is not compat.SymbolicZero]
    arg_tags = list(tags[num_consts:]) + [RAW_TAG if is_f32(jax.typeof(t)) else None for t in nonzero]
    out, out_tags = interpret(p, jvp_jaxpr, jvp_consts, [*primals, *nonzero], arg_tags)
    box.append(out_tags[: len(out_zeros)])
    out_primals, nonzero_out = out[: len(out_zeros)], iter(out[len(out_zeros) :])
    out_tangents = [
      compat.SymbolicZero(jax.typeof(x).to_tangent_aval()) if z else next(nonzero_out)
      for x, z in zip(out_primals, out_zeros)
    ]
    return [*out_primals, *out_tangents]

  params_bind = compat.bind_params(eqn, params)
  params_bind["subfuns"] = (
    compat.wrap(fun, compat.debug_info_of(compat.split_closed(call)[0])),
    compat.wrap(jvp, jvp_fun.debug_info),
  )
  outs = eqn.primitive.bind(*values, **params_bind)
  out_tags = box[-1] if box else [RAW_TAG if is_f32(v.aval) else None for v in eqn.outvars]
  return list(outs), out_tags


def _custom_vjp(p: Pass, eqn: Any, values: list[Any], tags: list[Tag | None]) -> tuple[list, list]:
  params = eqn.params
  call = params["call_jaxpr"]
  if _is_precision_round(call):  # a rounding the user wrote: keep it as it is
    outs = compat.bind(eqn, values)
    p.log.record("precision.round", "cast", untouched=sum(numel(v.aval) for v in eqn.outvars))
    return outs, [RAW_TAG if is_f32(v.aval) else None for v in eqn.outvars]
  num_consts = params["num_consts"]
  fwd_thunk = params["fwd_jaxpr_thunk"]
  box: list[list[Tag | None]] = []
  fun = _primal(p, call, tags, box)

  def fwd(*args: Any) -> list[Any]:  # jax's lift_fwd, evaluating with the pass
    vals, nonzeros = args[::2], args[1::2]
    if any(nonzeros[:num_consts]):
      raise compat.CustomVJPException()
    fwd_jaxpr, fwd_consts = fwd_thunk.call_wrapped(*nonzeros[num_consts:])
    outs, out_tags = interpret(p, fwd_jaxpr, fwd_consts, vals[num_consts:], tags[num_consts:])
    box.append(out_tags)
    return outs

  params_bind = compat.bind_params(eqn, params)
  _, _, bwd = params_bind["subfuns"]
  params_bind["subfuns"] = (
    compat.wrap(fun, compat.debug_info_of(compat.split_closed(call)[0])),
    compat.wrap(fwd, fwd_thunk.debug_info),
    compat.wrap(functools.partial(_autocast_bwd, p, bwd), bwd.debug_info),
  )
  outs = eqn.primitive.bind(*values, **params_bind)
  n_out = len(eqn.outvars)
  out_tags = box[-1][:n_out] if box else [RAW_TAG if is_f32(v.aval) else None for v in eqn.outvars]
  return list(outs), out_tags


def _autocast_bwd(p: Pass, bwd: Any, *args: Any) -> Any:
  """A custom_vjp's bwd rule, traced and evaluated with the pass (symbolic zeros kept).

  Returns what JAX's flattened bwd returns: the cotangents, or, where JAX's bwd rules may log
  (`compat.bwd_returns_logs`), ``(cotangents, logs)`` with the logs evaluated by the pass too."""
  with_logs = compat.bwd_returns_logs()
  if not all(isinstance(a, jax.Array) for a in args):
    return bwd.call_wrapped(*args)
  zeros: list[Any] = []
  logs_tree: list[Any] = []

  def arrays_only(*xs: Any) -> list[Any]:
    res = bwd.call_wrapped(*xs)
    cts, logs = res if with_logs else (res, None)
    cts = list(cts)
    zeros.extend(r if isinstance(r, compat.Zero) else None for r in cts)
    log_leaves, tree = jax.tree.flatten(logs)
    logs_tree.append(tree)
    return [r for r in cts if not isinstance(r, compat.Zero)] + list(log_leaves)

  in_avals = [jax.typeof(a) for a in args]
  jaxpr, consts = compat.trace(arrays_only, in_avals, bwd.debug_info)
  arg_tags = [RAW_TAG if is_f32(a) else None for a in in_avals]
  outs, _ = interpret(p, jaxpr, consts, args, arg_tags)
  n_cts = sum(z is None for z in zeros)
  it = iter(outs[:n_cts])
  cts = [z if z is not None else next(it) for z in zeros]
  if not with_logs:
    return cts
  return cts, jax.tree.unflatten(logs_tree[-1], outs[n_cts:])


_HANDLERS: dict[str, Handler] = {
  "jit": _jit,
  "pjit": _jit,
  **dict.fromkeys(compat.CALL_PRIMITIVES, _inline),
  "remat2": _remat,
  "checkpoint": _remat,
  "scan": _scan,
  "while": _while,
  "cond": _cond,
  "shard_map": _shard_map,
  "custom_jvp_call": _custom_jvp,
  "custom_vjp_call": _custom_vjp,
  "custom_linear_solve": _linear_solve,
}
HIGHER_ORDER.update(_HANDLERS)
