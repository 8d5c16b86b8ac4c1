"""The lowering of ``precision_round``: a rounding of an already rounded value lowers to nothing.

Deterministic rounding is idempotent, so the lowering may skip a rounding whose operand is
(by construction, in the same lowered function) already rounded to the same format and mode,
directly or through an exact op (reshape, transpose, broadcast, slice, concatenate, negate,
abs, select). These tests check that the skipped form gives the same bits as the kernel applied
every time (`precision._kernel.round_bits`, not deduplicated), and that only those roundings
are skipped (a multiplication, even by 2, is not exact: it can overflow).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import precision
from precision import _kernel
from precision.rounding import round_p
from tests import values as V

FORMATS = ("cbfloat16", "bfloat16", "float16")


def rounded_in(fn, *args) -> int:
  """Number of roundings in the lowered StableHLO (each is a call of the jitted kernel)."""
  return jax.jit(fn).lower(*args).as_text().count("call @_round_jit")


def r(x, fmt, mode="nearest_even"):
  return round_p.bind(x, fmt=precision.get_format(fmt), mode=mode)


def kernel(x, fmt, mode="nearest_even"):
  return _kernel.round_bits(x, precision.get_format(fmt), mode, None)


def same_bits(a, b) -> None:
  np.testing.assert_array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode", ["nearest_even", "toward_zero"])
def test_round_of_round_lowers_once_and_keeps_the_bits(fmt, mode):
  x = jnp.asarray(
    np.concatenate([V.special_values(precision.get_format(fmt)), V.random_patterns(4096, seed=15)])
  )
  deduplicated = jax.jit(lambda v: r(r(v, fmt, mode), fmt, mode))
  assert deduplicated.lower(x).as_text().count("precision_round") == 0  # lowered to the kernel
  assert rounded_in(lambda v: r(r(v, fmt, mode), fmt, mode), x) == 1
  same_bits(deduplicated(x), jax.jit(lambda v: kernel(kernel(v, fmt, mode), fmt, mode))(x))


def through_exact_ops(v, rnd):
  a = rnd(v)
  moved = jnp.concatenate([jnp.transpose(a)[:, :4], -jnp.abs(a.T[:, 4:])], axis=1)
  picked = jax.lax.select(moved > 0, moved, jnp.broadcast_to(a[0, :8], (12, 8)).T.reshape(12, 8))
  return rnd(picked)


EXACT_OPS = {  # fmt -> (deduplicated, kernel every time), compiled once
  fmt: (
    jax.jit(lambda v, fmt=fmt: through_exact_ops(v, lambda u: r(u, fmt))),
    jax.jit(lambda v, fmt=fmt: through_exact_ops(v, lambda u: kernel(u, fmt))),
  )
  for fmt in FORMATS
}


def test_exact_ops_between_roundings_lower_once():
  assert rounded_in(EXACT_OPS["cbfloat16"][0], jnp.zeros((8, 12))) == 1


@given(st.sampled_from(FORMATS), st.integers(0, 2**31 - 1))
def test_exact_ops_between_roundings_keep_the_bits(fmt, seed):
  x = jnp.asarray(V.random_patterns(96, seed=seed).reshape(8, 12))
  deduplicated, every_time = EXACT_OPS[fmt]
  same_bits(deduplicated(x), every_time(x))


def test_only_provably_rounded_operands_are_skipped():
  x = jnp.linspace(-3.0, 3.0, 64, dtype=jnp.float32).reshape(8, 8)
  assert rounded_in(lambda v: r(jnp.transpose(r(v, "cbfloat16")), "cbfloat16"), x) == 1
  # Not exact: a product (2 * max overflows), another format, another mode, an argument.
  assert rounded_in(lambda v: r(2.0 * r(v, "cbfloat16"), "cbfloat16"), x) == 2
  assert rounded_in(lambda v: r(r(v, "float16"), "cbfloat16"), x) == 2
  assert rounded_in(lambda v: r(r(v, "cbfloat16", "toward_zero"), "cbfloat16"), x) == 2
  assert rounded_in(lambda v: r(v, "cbfloat16"), x) == 1


def test_grad_of_autocast_rounds_a_cotangent_once():
  # y = r(x @ w); z = r(y + b): the transpose gives r(r(ct_z)) for ct_y, lowered as one rounding.
  def loss(x, w, b):
    return jnp.sum(jnp.tanh(x @ w + b[None, :]))

  x, w, b = jnp.ones((4, 8)), jnp.full((8, 8), 0.1), jnp.full((8,), 0.3)
  grad = jax.grad(precision.autocast(loss, "c=cb16"), argnums=(0, 1, 2))
  jaxpr = jax.make_jaxpr(grad)(x, w, b)
  sites = sum(e.primitive.name == "precision_round" for e in jaxpr.eqns)
  assert rounded_in(grad, x, w, b) < sites
