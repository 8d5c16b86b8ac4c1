"""A cotangent is rounded once, not twice: `precision.autocast`'s ``ct_rounded`` rule.

Under ``jax.grad(autocast(f))`` every rounding the pass inserts transposes to a rounding of
its cotangent. Where the cotangent reaching a rounding is provably a value of the compute
format already (its value's only consumer is an ``add``/``sub``/``add_any`` of the same shape
or a ``reduce_sum`` whose result the pass rounds to nearest even), the pass marks the rounding
``ct_rounded=True`` and its transpose passes the cotangent on unchanged. The properties:

* the rule changes no bit: gradients with it equal gradients without it (the switch
  ``SKIP_ROUNDED_COTANGENTS``), bit for bit, NaN payloads included, over generated programs;
* it removes roundings from the differentiated program (the sites it claims are gone);
* consumers that do not pass a rounded cotangent back (a product, even by 2 or 3; two
  consumers; a float32 reduction; a result of the function) keep their cotangent's rounding;
* an output already rounded to the output format is not rounded again.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

import precision
from precision import _state as _autocast  # noqa: E402  (the pass state: SKIP_ROUNDED_COTANGENTS)
from precision.rounding import round_p
from tests import values as V
from tests.precision.test_autocast_invariants import _case, policies, seeds, vector_ops


def same_bits(a, b) -> None:
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x).view(np.uint32), np.asarray(y).view(np.uint32))


def fresh(fn):
  """``fn`` as a new function object: JAX caches traces per function, and the rule's switch
  is read while tracing."""
  return lambda *args: fn(*args)


def sites(fn, *args) -> tuple[int, int]:
  """(precision_round equations, those marked ct_rounded) in ``fn``'s jaxpr, top level."""
  eqns = [e for e in jax.make_jaxpr(fresh(fn))(*args).eqns if e.primitive.name == "precision_round"]
  return len(eqns), sum(bool(e.params.get("ct_rounded")) for e in eqns)


def without_rule(monkeypatch, fn, *args):
  with monkeypatch.context() as m:
    m.setattr(_autocast, "SKIP_ROUNDED_COTANGENTS", False)
    return jax.jit(fresh(fn))(*args)


def loss_of(f):
  return lambda x, p: jnp.sum(jnp.tanh(f(x, p)))


@pytest.mark.slow  # over 7 s on the 2-core CI machine; runs in the slow stage
@settings(max_examples=V.examples(25))
@given(ops=vector_ops, seed=seeds, policy=policies)
def test_rule_changes_no_bit_of_the_gradient(ops, seed, policy):
  f, x, p = _case(ops, seed)
  grad = jax.grad(precision.autocast(loss_of(f), policy), argnums=(0, 1))
  with pytest.MonkeyPatch.context() as m:
    m.setattr(_autocast, "SKIP_ROUNDED_COTANGENTS", False)
    expected = jax.jit(fresh(grad))(x, p)
  same_bits(jax.jit(fresh(grad))(x, p), expected)


def test_rule_keeps_nan_inf_and_signed_zero_cotangents(monkeypatch):
  fmt = precision.get_format("cbfloat16")
  x = jnp.asarray(np.concatenate([V.special_values(fmt), V.random_patterns(1024, seed=3)]))
  # y = r(x * w) has one consumer, z = r(y + b): the cotangent of y is r(ct_z) already.
  f = precision.autocast(lambda x, w, b, ct: jnp.vdot(x * w + b, ct), "c=cb16")
  grad = jax.grad(f, argnums=(0, 1, 2))
  args = (x, jnp.flip(x), jnp.roll(x, 7), jnp.roll(x, 11))
  assert sites(grad, *args)[1] > 0
  same_bits(jax.jit(fresh(grad))(*args), without_rule(monkeypatch, grad, *args))


def test_rule_removes_the_second_rounding_of_a_cotangent(monkeypatch):
  def loss(x, w, b):
    return jnp.sum(jnp.tanh(x @ w + b[None, :]))

  x, w, b = jnp.ones((4, 8)), jnp.full((8, 8), 0.1), jnp.full((8,), 0.3)
  grad = jax.grad(precision.autocast(loss, "c=cb16"), argnums=(0, 1, 2))
  with_rule, marked = sites(grad, x, w, b)
  with monkeypatch.context() as m:
    m.setattr(_autocast, "SKIP_ROUNDED_COTANGENTS", False)
    without, none = sites(grad, x, w, b)
  assert (marked, none) == (1, 0)  # r(x @ w), whose only consumer is the rounded bias add
  assert with_rule == without - marked  # the transpose of each marked site rounds nothing
  same_bits(jax.jit(fresh(grad))(x, w, b), without_rule(monkeypatch, grad, x, w, b))


@pytest.mark.parametrize(
  "consumer, marked",
  [
    # A product by a power of two (2 * max overflows: not exact), by 3: the cotangent of y is a
    # product; only the product's own rounding (consumed by the rounded add) is marked.
    (lambda y, b: y * 2.0 + b[None], 1),
    (lambda y, b: y * 3.0 + b[None], 1),
    (lambda y, b: (y + b[None]) + (y - b[None]), 2),  # y has two consumers: a sum of two cotangents
    (lambda y, b: jnp.sum(y, axis=0) + b, 0),  # reduce_sum is float32 at level 1: not rounded
    (lambda y, b: y, 0),  # a result of the function: its cotangent comes from outside
    (lambda y, b: jnp.broadcast_to(y[None], (2, 4, 8)) + 1.0, 0),  # a broadcast: its transpose sums
  ],
)
def test_consumers_that_do_not_pass_a_rounded_cotangent_keep_the_rounding(consumer, marked, monkeypatch):
  def f(x, w, b):
    return consumer(x @ w, b)

  x, w, b = jnp.full((4, 8), 0.7), jnp.full((8, 8), 0.1), jnp.full((8,), 0.3)
  auto = precision.autocast(f, "c=cb16")
  jaxpr = jax.make_jaxpr(fresh(auto))(x, w, b)
  product = next(e.outvars[0] for e in jaxpr.eqns if e.primitive.name == "dot_general")
  for e in jaxpr.eqns:  # the rounding of x @ w may come after a move (a float32 conversion)
    if e.primitive.name == "convert_element_type" and e.invars[0] is product:
      product = e.outvars[0]
  rounding = next(e for e in jaxpr.eqns if e.primitive.name == "precision_round" and e.invars[0] is product)
  assert not rounding.params.get("ct_rounded")  # x @ w's rounding still rounds its cotangent
  assert sites(auto, x, w, b)[1] == marked
  ct = jnp.full(jax.eval_shape(f, x, w, b).shape, 1.3)
  grad = jax.grad(lambda *a: jnp.vdot(auto(*a), ct), argnums=(0, 1, 2))
  same_bits(jax.jit(fresh(grad))(x, w, b), without_rule(monkeypatch, grad, x, w, b))


def test_level_2_rounds_reductions_so_a_sum_passes_a_rounded_cotangent(monkeypatch):
  def f(x, w):
    return jnp.sum(x @ w, axis=0) * 0.5

  x, w = jnp.full((4, 8), 0.7), jnp.full((8, 8), 0.1)
  policy = precision.Policy(compute="cbfloat16", level=2, rules={"reduction": "round"})
  grad = jax.grad(lambda *a: jnp.sum(precision.autocast(f, policy)(*a)), argnums=(0, 1))
  assert sites(precision.autocast(f, policy), x, w)[1] == 1
  same_bits(jax.jit(fresh(grad))(x, w), without_rule(monkeypatch, grad, x, w))


def test_transpose_of_a_marked_rounding_passes_the_cotangent_and_jvp_still_rounds():
  fmt = precision.get_format("cbfloat16")
  ct = jnp.asarray([1.0 + 2.0**-12, 3.0], jnp.float32)  # the first is not a cbfloat16 value
  marked = lambda v: round_p.bind(v, fmt=fmt, mode="nearest_even", ct_rounded=True)
  plain = lambda v: round_p.bind(v, fmt=fmt, mode="nearest_even")
  _, vjp_marked = jax.vjp(marked, ct)
  _, vjp_plain = jax.vjp(plain, ct)
  same_bits(vjp_marked(ct), (ct,))
  same_bits(vjp_plain(ct), (precision.round(ct, fmt),))
  same_bits(jax.jvp(marked, (ct,), (ct,))[1], precision.round(ct, fmt))


def test_an_output_already_rounded_is_not_rounded_again():
  f = lambda x, w: x @ w  # noqa: E731
  x, w = jnp.full((4, 8), 0.7), jnp.full((8, 8), 0.1)
  rounded_output = precision.Policy(compute="cbfloat16", output="cbfloat16")
  assert sites(precision.autocast(f, rounded_output), x, w)[0] == 3  # x, w and the product
  other_output = precision.Policy(compute="cbfloat16", output="bfloat16")
  assert sites(precision.autocast(f, other_output), x, w)[0] == 4  # and the output, to bf16
  raw_output = precision.autocast(lambda x, w: (x @ w, w), rounded_output)
  assert sites(raw_output, x, w)[0] == 4  # w, an argument, is rounded as an output
  exact = jax.jit(f)(x, w)
  result = precision.autocast(f, rounded_output)(x, w)
  same_bits(result, precision.round(precision.round(exact, "cbfloat16"), "cbfloat16"))
  assert not np.array_equal(result, exact)  # rounding happened
