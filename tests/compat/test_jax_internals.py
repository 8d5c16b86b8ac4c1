"""Every JAX internal the project reads, checked on one traced example of each higher-order primitive.

A JAX release that changes a parameter layout fails here, in one clear test per reader, instead of
deep inside autocast or the cost model. The readers are in `precision._jax_compat`.
"""

from __future__ import annotations

import ast
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import precision
from precision import _jax_compat as compat
from precision.testing import assert_same_floats

ROOT = pathlib.Path(__file__).resolve().parents[2]
X = jnp.linspace(-2.0, 2.0, 8, dtype=jnp.float32)


def eqns_of(fn, *args, name: str):
  """The equations named ``name`` in ``fn``'s jaxpr (top level)."""
  closed = jax.make_jaxpr(fn)(*args)
  jaxpr, _ = compat.split_closed(closed)
  found = [e for e in jaxpr.eqns if e.primitive.name == name]
  assert found, f"no {name!r} equation in\n{closed}"
  return found


def check_body(body, n_args: int) -> None:
  """A body's jaxpr and constants bind its inputs by position."""
  jaxpr, consts = compat.split_closed(body)
  assert len(compat.binders(jaxpr)) == len(consts) + n_args


# ---- readers of parameters ----


def test_scan_counts_and_body():
  w = jnp.float32(1.5)

  def f(x):
    def step(carry, xi):
      a, b = carry
      return (a * w + xi, b + xi), a * xi

    return jax.lax.scan(step, (x[0], x[1]), x)

  (eqn,) = eqns_of(f, X, name="scan")
  n_consts, n_carry = compat.scan_counts(eqn.params)
  assert n_carry == 2
  assert len(eqn.invars) == n_consts + n_carry + 1  # one xs
  check_body(compat.scan_body(eqn.params), n_consts + n_carry + 1)
  assert compat.is_higher_order(eqn)


def test_while_counts():
  def f(x, limit):
    return jax.lax.while_loop(lambda c: c[0] < limit, lambda c: (c[0] + 1, c[1] * x), (0, x))

  (eqn,) = eqns_of(f, X, 5, name="while")
  nc, nb = compat.while_counts(eqn.params)
  assert nc + nb + 2 == len(eqn.invars)
  check_body(eqn.params["body_jaxpr"], nb + 2)
  check_body(eqn.params["cond_jaxpr"], nc + 2)


def test_cond_branches():
  def f(i, x):
    return jax.lax.switch(i, [jnp.sin, jnp.cos, lambda v: v * 2.0], x)

  (eqn,) = eqns_of(f, 1, X, name="cond")
  branches = compat.cond_branches(eqn.params)
  assert len(branches) == 3
  for b in branches:
    check_body(b, 1)


@pytest.mark.parametrize(
  ("name", "make"),
  [
    ("pjit", lambda: jax.jit(lambda x: jnp.sin(x) * 2.0)),
    ("remat2", lambda: jax.checkpoint(lambda x: jnp.sin(x) * 2.0)),
    ("custom_jvp_call", lambda: jax.nn.relu),
    ("custom_vjp_call", lambda: _custom_vjp_square),
  ],
)
def test_call_jaxpr_of_call_like_primitives(name, make):
  fn = make()
  found = eqns_of(fn, X, name=name if name != "pjit" else _jit_name())
  body = compat.call_jaxpr(found[0])
  assert body is not None
  check_body(body, len(found[0].invars))
  assert compat.is_higher_order(found[0])


def _jit_name() -> str:
  return jax.make_jaxpr(jax.jit(jnp.sin))(X).eqns[0].primitive.name


@jax.custom_vjp
def _custom_vjp_square(x):
  return x * x


_custom_vjp_square.defvjp(lambda x: (x * x, x), lambda x, g: (2.0 * x * g,))


def test_eval_style_calls_are_call_primitives_and_inlined():
  closed = jax.make_jaxpr(lambda v: jnp.tanh(v) * 1.1)(X)

  def f(x):
    params = compat.closed_call_p.get_bind_params({"call_jaxpr": closed})
    return compat.closed_call_p.bind(x, **params)[0]

  (eqn,) = eqns_of(f, X, name=compat.closed_call_p.name)
  assert eqn.primitive.name in compat.CALL_PRIMITIVES
  assert compat.call_jaxpr(eqn) is not None
  got = precision.autocast(f, "c=bf16")(X)
  want = precision.autocast(lambda v: jnp.tanh(v) * 1.1, "c=bf16")(X)
  assert_same_floats(got, want)
  assert_same_floats(precision.round(got, "bfloat16"), got)  # rounded, not a float32 pass-through


def test_shard_map_manual_axes_partly_manual():
  devices = np.array(jax.devices("cpu")[:4]).reshape(2, 2) if len(jax.devices("cpu")) >= 4 else None
  if devices is None:
    pytest.skip("needs 4 CPU devices (tests/conftest.py forces them)")
  mesh = jax.sharding.Mesh(devices, ("a", "b"))
  spec = jax.sharding.PartitionSpec("a")
  f = jax.shard_map(lambda v: v * 2.0, mesh=mesh, in_specs=spec, out_specs=spec, axis_names={"a"})
  (eqn,) = eqns_of(f, X, name="shard_map")
  assert compat.shard_map_manual_axes(eqn.params) == {"a"}
  check_body(compat.call_jaxpr(eqn), 1)


def test_custom_vjp_bwd_layout_is_detected():
  assert compat.bwd_returns_logs() == hasattr(jax.custom_vjp, "defvjp_with_logs")
  got = jax.grad(lambda x: precision.autocast(_custom_vjp_square, "c=bf16")(x).sum())(X)
  want = precision.round(2.0 * X, "bfloat16")  # bwd interpreted: 2 x g rounded
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2**-7)


# ---- tracing and binding ----


def test_trace_returns_an_open_jaxpr_with_constants_first():
  big = jnp.arange(8.0)  # a closed-over array becomes a constant of the trace

  def body(x):
    return [x * big + 1.0]

  jaxpr, consts = compat.trace(body, [jax.typeof(X)], None)
  assert not jaxpr.constvars
  assert len(jaxpr.invars) == len(consts) + 1
  (out,) = compat.jaxpr_as_fun(compat.closed(jaxpr))(*consts, X)
  assert_same_floats(out, X * big + 1.0)


def test_name_as_gives_a_flat_wrapper_the_users_name_line_and_arguments():
  """JAX reads a function's debug info from its ``__fun_debug_info__``: a flat wrapper of the traced
  leaves then raises JAX's error about the user's function and argument names."""

  def user(scale, n):
    return sum(range(n)) * scale

  def flat(n):  # the Python number 2.0 (leaf 0) is not traced
    return user(2.0, n)

  compat.name_as(flat, user, (2.0, jnp.int32(3)), {}, ((), ()), [False, True], "autocast")
  with pytest.raises(jax.errors.TracerIntegerConversionError) as info:
    jax.make_jaxpr(flat)(jnp.int32(3))
  line = user.__code__.co_firstlineno
  assert f"the function user at {__file__}:{line} for autocast" in str(info.value)
  assert "the argument n." in str(info.value)
  compat.name_as(flat, user, (2.0, jnp.int32(3)), {}, ((), ()), [True], "autocast")  # names do not line up
  assert flat.__fun_debug_info__.arg_names == ("n",)  # (left as it was)


def test_bind_rebinds_an_equation():
  (eqn,) = eqns_of(lambda x: jnp.sum(x, axis=0), X, name="reduce_sum")
  (out,) = compat.bind(eqn, [X])
  assert_same_floats(out, jnp.sum(X))


def test_is_higher_order_ignores_scalar_combiners_and_first_order_ops():
  scatter = eqns_of(lambda x: x.at[jnp.array([0, 2])].add(1.0), X, name="scatter-add")[0]
  add = eqns_of(lambda x: x + 1.0, X, name="add")[0]
  assert not compat.is_higher_order(scatter)
  assert not compat.is_higher_order(add)


def test_user_line_names_the_line_that_traced_the_equation():
  (eqn,) = eqns_of(lambda x: jnp.sin(x), X, name="sin")
  assert pathlib.Path(__file__).name in compat.user_line(eqn)


# ---- an unhandled higher-order primitive is an error, never a float32 pass-through ----


def _opaque_call_primitive():
  prim = compat.Primitive("opaque_call_for_tests")
  prim.multiple_results = True
  prim.def_impl(lambda *args, body: compat.jaxpr_as_fun(body)(*args))
  prim.def_abstract_eval(lambda *avals, body: [v.aval for v in compat.split_closed(body)[0].outvars])
  compat.mlir.register_lowering(
    prim, compat.mlir.lower_fun(lambda *args, body: compat.jaxpr_as_fun(body)(*args), multiple_results=True)
  )
  return prim


OPAQUE = _opaque_call_primitive()


def _uses_opaque(x):
  body = jax.make_jaxpr(lambda v: jnp.tanh(v) * 1.1)(x)
  return OPAQUE.bind(x, body=body)[0] + 1.0


def test_autocast_refuses_a_higher_order_primitive_it_does_not_handle():
  assert compat.is_higher_order(eqns_of(_uses_opaque, X, name="opaque_call_for_tests")[0])
  with pytest.raises(compat.UnhandledPrimitiveError) as info:
    precision.autocast(_uses_opaque, "c=cb16")(X)
  message = str(info.value)
  assert "opaque_call_for_tests" in message and pathlib.Path(__file__).name in message


def test_an_unhandled_primitive_bound_by_the_function_itself_names_no_internal_line():
  """The function given to autocast is the primitive's own call: no line of the user's traced it,
  and the error said "traced at .../precision/_tracing.py" (this project's own frame)."""
  import functools

  body = jax.make_jaxpr(lambda v: jnp.tanh(v) * 1.1)(X)
  with pytest.raises(compat.UnhandledPrimitiveError) as info:
    precision.autocast(functools.partial(OPAQUE.bind, body=body), "c=cb16")(X)
  message = str(info.value)
  assert "bound by the function given to precision.autocast itself" in message, message
  assert "_tracing.py" not in message and f"{os.sep}precision{os.sep}" not in message, message


def test_the_cost_model_refuses_a_higher_order_primitive_it_does_not_handle():
  wafer = pytest.importorskip("wafer")

  def step(params, batch):
    return jnp.sum(_uses_opaque(batch @ params))

  with pytest.raises(Exception, match="opaque_call_for_tests"):
    wafer.estimate(step, jnp.ones((8, 8)), jnp.ones((4, 8)), batch_argnums=(1,))


# ---- the one place ----

_INTERNAL = ("jax._src", "jax.extend", "jax.interpreters")


def _internal_uses(path: pathlib.Path) -> list[str]:
  tree = ast.parse(path.read_text(), filename=str(path))
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found += [f"{path}:{node.lineno} import {a.name}" for a in node.names if a.name.startswith(_INTERNAL)]
    elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(_INTERNAL):
      found.append(f"{path}:{node.lineno} from {node.module} import ...")
    elif isinstance(node, ast.Attribute) and ast.unparse(node).startswith(_INTERNAL):
      found.append(f"{path}:{node.lineno} {ast.unparse(node)}")
  return found


def test_no_module_but_the_compat_module_uses_jax_internals():
  compat_file = ROOT / "precision" / "_jax_compat.py"
  files = [ROOT / "_precision_pytest_plugin.py"]
  for folder in ("precision", "wafer", "models", "benchmarks", "examples", "tests"):
    files += sorted((ROOT / folder).rglob("*.py"))
  offenders = [use for f in files if f != compat_file for use in _internal_uses(f)]
  assert not offenders, "JAX internals outside precision/_jax_compat.py:\n" + "\n".join(offenders)


def test_autocast_keeps_a_partly_manual_shard_map_partly_manual():
  """A shard_map manual over one mesh axis of two is re-bound manual over that axis only (the
  parameter is ``manual_axes`` before JAX 0.10.2, ``newly_manual_axes`` from it)."""
  if len(jax.devices("cpu")) < 4:
    pytest.skip("needs 4 CPU devices (tests/conftest.py forces them)")
  mesh = jax.sharding.Mesh(np.array(jax.devices("cpu")[:4]).reshape(2, 2), ("a", "b"))
  spec = jax.sharding.PartitionSpec

  def body(x):
    return jax.lax.psum(jnp.tanh(x) * 2.0, "a")

  f = jax.shard_map(body, mesh=mesh, in_specs=spec("a"), out_specs=spec(), axis_names={"a"})
  x = jnp.arange(32.0, dtype=jnp.float32).reshape(8, 4) / 32
  with jax.set_mesh(mesh):
    got = precision.autocast(f, "c=bf16")(x)
    want = f(x)
    (eqn,) = eqns_of(precision.autocast(f, "c=bf16"), x, name="shard_map")
  assert compat.shard_map_manual_axes(eqn.params) == {"a"}
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2**-6)
  assert not np.array_equal(np.asarray(got), np.asarray(want))  # rounded inside the body


M = jnp.linspace(-2.0, 2.0, 12, dtype=jnp.float32).reshape(3, 4)

_SCATTERS = {
  "set": lambda y: y.at[:, 0].set(2.0),
  "add": lambda y: y.at[:, 0].add(2.0),
  "mul": lambda y: y.at[:, 0].multiply(2.0),
  "min": lambda y: y.at[:, 0].min(0.5),
  "max": lambda y: y.at[:, 0].max(0.5),
  "divide": lambda y: y.at[:, 0].divide(2.0),
  "power": lambda y: y.at[:, 0].power(2.0),
}


@pytest.mark.parametrize("how", sorted(_SCATTERS))
def test_a_scatter_of_updates_is_a_combiner_and_is_rounded_as_before(how):
  """``.at[i].set/add/multiply/min/max/divide/power`` bind scatters whose update_jaxpr is only their
  monoid (or none): first order, never refused."""
  fn = lambda x: _SCATTERS[how](jnp.tanh(x @ M.T))  # noqa: E731
  for eqn in jax.make_jaxpr(fn)(M).jaxpr.eqns:
    assert not compat.is_higher_order(eqn), eqn.primitive.name
  assert precision.autocast(fn, "c=bf16")(M).dtype == jnp.float32


@pytest.mark.parametrize("fn", [jnp.sin, lambda v: v * v, lambda v: v + v, lambda v: jnp.maximum(v, v)])
def test_every_scatter_apply_is_higher_order(fn):
  """``.apply(fn)`` of one equation of the operand with itself (``mul a a``) is not a monoid either."""
  (eqn,) = eqns_of(lambda x: x.at[0].apply(fn), X, name="scatter")
  assert compat.is_higher_order(eqn)


def test_scatter_apply_runs_a_function_and_is_refused_with_the_rewrite():
  """``x.at[i].apply(fn)`` binds ``scatter`` with ``fn`` as its update: fn ran unrounded in float32 and
  the result kept its "rounded" tag. It is a higher-order primitive: an error that says what to write."""
  g = lambda v: v * v * 0.37 + v  # noqa: E731

  def apply(x):
    return jnp.tanh(x @ M.T).at[:, 0].apply(g)

  def rewritten(x):
    y = jnp.tanh(x @ M.T)
    return y.at[:, 0].set(g(y[:, 0]))

  assert compat.is_higher_order(eqns_of(apply, M, name="scatter")[0])
  with pytest.raises(compat.UnhandledPrimitiveError, match=r"x\.at\[idx\]\.set\(fn\(x\[idx\]\)\)") as info:
    precision.autocast(apply, "c=bf16")(M)
  assert pathlib.Path(__file__).name in str(info.value) and "new in your JAX version" not in str(info.value)
  out = precision.autocast(rewritten, "c=bf16,o=bf16")(M)
  assert jnp.array_equal(out, precision.round(out, "bfloat16"))  # the rewrite is rounded throughout
  assert jnp.array_equal(precision.autocast(apply, "c=f32")(M), apply(M))  # float32: fn itself
