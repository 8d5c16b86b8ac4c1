"""round under jit / vmap / grad, its gradient rules, input handling and error messages."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import precision
from precision import _kernel
from precision.formats import FormatError
from precision.testing import assert_close
from tests import values as V
from tests.devices import on_cpu
from tests.tolerances import ONE_ROUNDING

W = 1.0 + 2.0**-12  # not representable in bfloat16 or cbfloat16: rounds to 1.0


@pytest.mark.parametrize("fmt", ["bfloat16", "cbfloat16", "float16"])
def test_cast_gradient_rounds_the_cotangent(fmt):
  f = lambda x: jnp.sum(W * precision.round(x, fmt))
  x = jnp.linspace(-3.0, 3.0, 16, dtype=jnp.float32)
  g = jax.grad(f)(x)
  np.testing.assert_array_equal(g, np.ones(16, np.float32))  # the cotangent W, rounded: 1.0
  g_ste = jax.grad(lambda x: jnp.sum(W * precision.round(x, fmt, grad="straight_through")))(x)
  np.testing.assert_array_equal(g_ste, np.full(16, W, np.float32))


def test_cast_gradient_matches_jax_dtype_cast():
  # A bfloat16 cast in JAX has exactly this gradient rule (convert_element_type's transpose).
  x = jnp.asarray(V.random_patterns(4096, seed=3))
  x = jnp.where(jnp.isfinite(x), x, 1.0)
  weights = jnp.asarray(np.random.default_rng(3).standard_normal(4096).astype(np.float32))
  ours = jax.grad(lambda v: jnp.sum(weights * precision.round(v, "bf16")))(x)
  xla = jax.grad(lambda v: jnp.sum(weights * v.astype(jnp.bfloat16).astype(jnp.float32)))(x)
  V.assert_same_floats(ours, xla, "cotangent rounding")


@pytest.mark.parametrize("fmt", ["cbfloat16", "bfloat16", "float16", "float8_e4m3fn"])
def test_higher_order_gradients_keep_cast_semantics(fmt):
  # d2/dx2 round(x)^2 with cast semantics = 2, as for a JAX dtype cast.
  for grad in ("cast", "straight_through"):
    second = jax.grad(jax.grad(lambda v, grad=grad: precision.round(v, fmt, grad=grad) ** 2))(
      jnp.float32(1.3)
    )
    assert float(second) == 2.0
  cast = jax.grad(jax.grad(lambda v: v.astype(jnp.bfloat16).astype(jnp.float32) ** 2))(jnp.float32(1.3))
  assert float(cast) == 2.0


def test_cast_gradient_matches_jax_cast_on_the_fast_path():
  # float16 takes the nearest-even fast path; JAX's float16 cast has the same gradient rule.
  x = jnp.asarray(np.random.default_rng(4).standard_normal(4096).astype(np.float32) * 100)
  weights = jnp.asarray(np.random.default_rng(5).standard_normal(4096).astype(np.float32) * 1e-3)
  ours = jax.grad(lambda v: jnp.sum(weights * precision.round(v, "f16")))(x)
  xla = jax.grad(lambda v: jnp.sum(weights * v.astype(jnp.float16).astype(jnp.float32)))(x)
  V.assert_same_floats(ours, xla, "float16 cotangent rounding")


@pytest.mark.parametrize("mode", ["nearest_even", "toward_zero"])
@pytest.mark.parametrize("fmt", [f.name for f in precision.formats.PREDEFINED])
def test_nan_gives_the_input_nan_quieted(fmt, mode):
  nans = np.array([0x7FC00001, 0xFFC00001, 0x7F800001, 0xFFA00000], np.uint32)
  got = V.bits_of(precision.round(nans.view(np.float32), fmt, mode))  # CPU: payload and sign kept
  if not on_cpu() and mode == "nearest_even":  # GPUs: the float fast paths may give the canonical NaN
    assert np.all(np.isnan(got.view(np.float32)))  # (documented in precision.round; encode keeps the sign)
    return
  np.testing.assert_array_equal(got, nans | np.uint32(0x0040_0000))


def test_stochastic_gradient_uses_its_own_stream():
  key = jax.random.key(11)
  x = jnp.full((4096,), 1.0 + 2.0**-11, jnp.float32)  # a quarter step above 1.0 in cbfloat16
  grad_fn = jax.grad(lambda v: jnp.sum(precision.round(v, "cb16", "stochastic", key=key) * x))
  g1, g2 = grad_fn(x), grad_fn(x)
  np.testing.assert_array_equal(g1, g2)  # reproducible for a fixed key
  fwd = precision.round(x, "cb16", "stochastic", key=key)
  assert set(np.unique(np.asarray(g1)).tolist()) == {1.0, 1.0 + 2.0**-9}
  assert (np.asarray(g1) != np.asarray(fwd)).any()  # not the forward's random stream


def test_vmap_and_jit_agree_with_eager():
  x = jnp.asarray(V.random_patterns(8 * 512, seed=5)).reshape(8, 512)
  eager = precision.round(x, "cb16")
  vmapped = jax.vmap(lambda row: precision.round(row, "cb16"))(x)
  jitted = jax.jit(jax.vmap(lambda row: precision.round(row, "cb16", "toward_zero")))(x)
  V.assert_same_floats(vmapped, eager, "vmap")
  V.assert_same_floats(jitted, precision.round(x, "cb16", "toward_zero"), "jit(vmap)")
  keys = jax.random.split(jax.random.key(0), 8)
  per_row = jax.vmap(lambda row, k: precision.round(row, "cb16", "stochastic", key=k))(x, keys)
  for i in range(8):
    V.assert_same_floats(per_row[i], precision.round(x[i], "cb16", "stochastic", key=keys[i]), f"row {i}")


def test_stochastic_is_reproducible_and_key_dependent():
  x = jnp.linspace(1.0, 2.0, 10_000, dtype=jnp.float32)
  a = precision.round(x, "cb16", "stochastic", key=jax.random.key(1))
  b = precision.round(x, "cb16", "stochastic", key=jax.random.key(1))
  c = precision.round(x, "cb16", "stochastic", key=jax.random.PRNGKey(2))  # raw keys work too
  np.testing.assert_array_equal(a, b)
  assert (np.asarray(a) != np.asarray(c)).mean() > 0.2


def test_rounding_happened_within_the_stated_tolerance():
  x = jnp.asarray(np.random.default_rng(0).uniform(1.0, 1000.0, 10_000).astype(np.float32))
  for name in ("bfloat16", "float16", "cbfloat16"):
    r = np.asarray(precision.round(x, name))
    rel = np.abs(r.astype(np.float64) - np.asarray(x)) / np.asarray(x)
    assert rel.max() <= ONE_ROUNDING[name].rtol, ONE_ROUNDING[name].reason
    assert_close(r, x, name, ulps=ONE_ROUNDING[name].ulps, context=ONE_ROUNDING[name].reason)
    assert (r != np.asarray(x)).mean() > 0.9  # rounding actually happened


def _float_producing_primitives(jaxpr) -> set[str]:
  """Names of primitives (recursively) whose outputs are floating point, except containers."""
  found = set()
  for eqn in jaxpr.eqns:
    subs = [v for v in eqn.params.values() if hasattr(v, "eqns") or hasattr(v, "jaxpr")]
    for sub in subs:
      found |= _float_producing_primitives(sub.jaxpr if hasattr(sub, "jaxpr") else sub)
    if not subs and any(jnp.issubdtype(v.aval.dtype, jnp.floating) for v in eqn.outvars):
      found.add(eqn.primitive.name)
  return found


def _float_multipliers(jaxpr) -> set[float]:
  """The literal float operands of every ``mul`` (recursively)."""
  found = set()
  for eqn in jaxpr.eqns:
    for sub in (v for v in eqn.params.values() if hasattr(v, "eqns") or hasattr(v, "jaxpr")):
      found |= _float_multipliers(sub.jaxpr if hasattr(sub, "jaxpr") else sub)
    if eqn.primitive.name == "mul" and jnp.issubdtype(eqn.outvars[0].aval.dtype, jnp.floating):
      found |= {float(v.val) for v in eqn.invars if hasattr(v, "val")}
  return found


@pytest.mark.parametrize("mode", ["nearest_even", "toward_zero", "stochastic"])
@pytest.mark.parametrize("fmt", ["cbfloat16", "float16", "bfloat16", "float8_e4m3fn"])
def test_kernel_float_arithmetic_cannot_be_folded(fmt, mode):
  """XLA's algebraic simplifier folds float tricks such as (x + c) - c, and XLA on CPU flushes
  float32 subnormals in float ops; integer ops and bitcasts are immune to both. The float
  paths (nearest_even in IEEE formats) multiply by exact powers of two around roundeven and
  compare ``abs(x)`` with ``min_normal`` (a flushed subnormal input compares as 0 and takes the
  branch that rounds it to 0): nothing there can be folded, and no float add or subtract
  appears anywhere."""
  x = jnp.ones(4, jnp.float32)
  f = precision.get_format(fmt)
  rbits = jnp.ones(4, jnp.uint32) if mode == "stochastic" else None
  jaxpr = jax.make_jaxpr(lambda v: _kernel.round_bits(v, f, mode, rbits))(x).jaxpr
  allowed = {"bitcast_convert_type", "mul", "round", "select_n", "reduce_precision", "abs"}
  assert _float_producing_primitives(jaxpr) <= allowed
  for multiplier in _float_multipliers(jaxpr):
    assert multiplier == np.inf or np.log2(multiplier) == int(np.log2(multiplier)), multiplier
  integer_only = jax.make_jaxpr(lambda v: _kernel.round_bits(v, f, mode, rbits, integer_only=True))(x)
  assert _float_producing_primitives(integer_only.jaxpr) <= {"bitcast_convert_type"}
  decode = jax.make_jaxpr(lambda c: precision.decode(c, fmt))(jnp.ones(4, jnp.uint16))
  assert _float_producing_primitives(decode.jaxpr) <= {"bitcast_convert_type"}


def test_inputs_and_outputs():
  assert precision.round(1, "cb16").dtype == jnp.float32  # Python numbers
  assert float(precision.round(jnp.bfloat16(1.5), "cb16")) == 1.5  # narrower floats
  enc = precision.encode(np.float32(1.0), "cb16")
  assert isinstance(enc, np.ndarray) and enc.dtype == np.uint16 and int(enc) == 0x3E00
  assert isinstance(precision.encode(jnp.ones(2), "cb16"), jax.Array)
  assert precision.encode(np.ones(2, np.float32), "e4m3fn").dtype == np.uint8
  assert precision.encode(np.ones(2, np.float32), "f32").dtype == np.uint32
  assert precision.decode([0x3E00], "cb16").tolist() == [1.0]
  assert jax.jit(lambda c: precision.decode(c, "cb16"))(jnp.uint16(0x3E00)) == 1.0


@pytest.mark.parametrize(
  "call, error, fragment",
  [
    (lambda: precision.round(jnp.ones(2), "cb17"), FormatError, "Did you mean 'cb16'"),
    (lambda: precision.round(jnp.ones(2), "cb16", "nearest"), ValueError, "'nearest_even'"),
    (lambda: precision.round(jnp.ones(2), "cb16", grad="ste"), ValueError, "'straight_through'"),
    (lambda: precision.round(jnp.ones(2), "cb16", "stochastic"), ValueError, "needs exactly one of key"),
    (lambda: precision.round(jnp.ones(2), "cb16", key=jax.random.key(0)), ValueError, "deterministic"),
    (
      lambda: precision.round(jnp.ones(2), "cb16", "stochastic", key=jax.random.split(jax.random.key(0))),
      ValueError,
      "one PRNG key",
    ),
    (
      lambda: precision.round(jnp.ones(2), "cb16", "stochastic", rbits=jnp.zeros(3, jnp.uint32)),
      ValueError,
      "rbits must be uint32 of shape",
    ),
    (lambda: precision.round(jnp.arange(3), "cb16"), TypeError, "floating-point"),
    (lambda: precision.round(np.arange(3), "cb16"), TypeError, "floating-point"),
    (lambda: precision.round([True, False], "cb16"), TypeError, "floating-point"),
    (lambda: precision.round(jnp.ones(2), None), FormatError, "no float format given"),
    (lambda: precision.decode(np.ones(2, np.float32), "cb16"), TypeError, "integer bit patterns"),
  ],
)
def test_errors_say_what_was_wrong_and_what_is_allowed(call, error, fragment):
  with pytest.raises(error, match=fragment):
    call()


def test_cli_demo_prints_formats_and_example(capsys):
  from wafer import cli

  assert cli.main(["demo"]) == 0
  out = capsys.readouterr().out
  assert "cbfloat16" in out and "3.140625 (0x4124)" in out and "Inferred" in out
  assert cli.main([]) == 2
