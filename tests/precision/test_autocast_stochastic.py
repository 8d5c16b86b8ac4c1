"""Stochastic rounding inside `precision.autocast` (``Policy(stochastic=...)``, ``rounding_key=``).

The specification is the "Stochastic rounding" section of `precision.autocast`'s module
docstring: which sites, where the bits come from, what happens without a key, and the
behaviour under jit, vmap, scan and grad.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import precision
from precision.policy import LEVEL_RULES, RULE_CLASSES, PolicyError
from precision.testing import assert_same_floats, same_floats
from tests.devices import true_float32
from tests.tolerances import SR_SIGMAS, sr_mean_bound

FORMATS = ("cbfloat16", "bfloat16", "float16")


def _model(x, w1, b, w2):
  """Multilinear in every rounded value (each site rounds independently): unbiased exactly."""
  h = x @ w1
  h = h + b
  return h @ w2


def _model_args(n=16):
  # Entries a quarter ulp above 1 (in every format here): nearest rounding moves them all
  # the same way, so its error does not average out; stochastic rounding's does.
  x = jnp.full((4, n), 1.0 + 2.0**-12, jnp.float32) + jnp.linspace(0, 0.3, n, dtype=jnp.float32)[None, :]
  w1 = jnp.linspace(-0.7, 1.3, n * 8, dtype=jnp.float32).reshape(n, 8) + 2.0**-13
  b = jnp.linspace(0.1, 0.2, 8, dtype=jnp.float32)[None, :]
  w2 = jnp.linspace(0.3, 1.1, 8 * 3, dtype=jnp.float32).reshape(8, 3)
  return x, w1, b, w2


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("level, block", [(0, 1024), (1, 4)])
def test_stochastic_autocast_is_unbiased_inside_a_model(fmt, level, block):
  """The mean over many keys converges to the float32 value; nearest rounding's does not."""
  policy = precision.Policy(
    compute=fmt, level=level, accumulation_block=block, stochastic="matmul+elementwise"
  )
  f = precision.autocast(_model, policy)
  args = _model_args()
  # true float32 products (TF32 on GPUs otherwise)
  exact = np.asarray(true_float32(_model)(*args), np.float64)
  n = 4000
  keys = jax.random.split(jax.random.key(7), n)
  samples = np.asarray(jax.jit(jax.vmap(lambda k: f(*args, rounding_key=k)))(keys), np.float64)
  mean, sd = samples.mean(0), samples.std(0, ddof=1)
  # Statistical bound on the mean of n independent samples (SR_SIGMAS standard errors).
  bound = SR_SIGMAS * sd / np.sqrt(n) + 1e-6 * np.abs(exact)
  assert np.all(np.abs(mean - exact) <= bound), (mean - exact, bound)
  # Rounding happened: every sample differs from float32, and the samples from each other.
  assert np.all(samples != exact)
  assert np.all(sd > 0)
  # The same check fails for round-to-nearest (it is biased on these inputs): the test can fail.
  nearest = np.asarray(precision.autocast(_model, policy.__class__(compute=fmt, level=level))(*args))
  assert np.any(np.abs(nearest - exact) > bound)


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_site_rounds_one_value_without_bias(fmt):
  """One elementwise site: the mean of n roundings of x is x within `sr_mean_bound`."""
  f = precision.autocast(lambda a, c: a + c, precision.Policy(compute=fmt, stochastic="elementwise"))
  x = np.float32(1.0 + 2.0**-12)  # its step at 1 and round-up probability, per format
  step = 2.0 ** -precision.get_format(fmt).mantissa_bits
  p = float((np.float64(x) - 1.0) / step)
  n = 20000
  keys = jax.random.split(jax.random.key(3), n)
  out = np.asarray(jax.vmap(lambda k: f(jnp.float32(1.0), jnp.float32(x - 1.0), rounding_key=k))(keys))
  assert set(np.unique(out)) == {1.0, 1.0 + step}
  assert abs(out.astype(np.float64).mean() - float(x)) <= sr_mean_bound(step, p, n)


@pytest.mark.parametrize(
  "fmt, increment, steps", [("bfloat16", 1e-3, 1000), ("cbfloat16", 2.5e-4, 4000), ("float16", 2.5e-4, 4000)]
)
def test_long_sum_stalls_with_nearest_and_grows_with_stochastic(fmt, increment, steps):
  """Accumulating increments below half an ulp of 1.0: nearest rounding never leaves 1.0;
  stochastic rounding tracks the exact sum."""

  def total(start, inc):
    return jax.lax.scan(lambda c, _: (c + inc, None), start, None, length=steps)[0]

  start, inc = jnp.float32(1.0), jnp.float32(increment)
  exact = float(total(start, inc))
  assert abs(exact - (1.0 + steps * increment)) < 1e-3  # float32 itself does not stall
  nearest = precision.autocast(total, precision.Policy(compute=fmt))(start, inc)
  assert float(nearest) == 1.0  # stalls: 1 + inc rounds back to 1
  sr = precision.autocast(total, precision.Policy(compute=fmt, stochastic="elementwise"))
  runs = 32
  keys = jax.random.split(jax.random.key(11), runs)
  results = np.asarray(jax.jit(jax.vmap(lambda k: sr(start, inc, rounding_key=k)))(keys), np.float64)
  # Each addition's rounding error has mean 0 and |error| <= ulp(2) = 2 * ulp(1): the sum of
  # `steps` of them has standard deviation at most ulp(1) * sqrt(steps).
  ulp1 = 2.0 ** -precision.get_format(fmt).mantissa_bits
  sd = ulp1 * np.sqrt(steps)
  assert abs(results.mean() - exact) <= SR_SIGMAS * sd / np.sqrt(runs)
  assert np.all(results > 1.5)  # every run kept growing
  assert len(np.unique(results)) > 1


def test_the_same_site_gets_fresh_bits_in_each_scan_iteration():
  """A scan whose body rounds the same value every iteration: the iterations' roundings differ."""

  def body(c, _):
    return c, c * 1.1  # the same product every iteration

  f = precision.autocast(lambda c: jax.lax.scan(body, c, None, length=64)[1], "c=bf16,sr=elementwise")
  ys = np.asarray(f(jnp.float32(1.0 + 2.0**-10), rounding_key=jax.random.key(0)))
  assert len(np.unique(ys)) == 2  # both neighbours of the product occur


def test_two_sites_with_equal_inputs_get_different_bits():
  f = precision.autocast(lambda a, c: (a + c, a + c), "c=bf16,sr=elementwise")
  a, c = jnp.ones(256, jnp.float32), jnp.full(256, 2.0**-9, jnp.float32)
  first, second = f(a, c, rounding_key=jax.random.key(5))
  assert not same_floats(first, second).all()


@pytest.mark.slow  # over 7 s on the 2-core CI machine; runs in the slow stage
@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), fmt=st.sampled_from(FORMATS), level=st.sampled_from((0, 1, 2)))
def test_same_key_same_bits_different_keys_different_bits(seed, fmt, level):
  f, jitted = _stochastic_model(fmt, level)  # compiled once per (format, level): the key is an argument
  args = _model_args()
  key, other = jax.random.key(seed), jax.random.key(seed + 1)
  a = jitted(*args, rounding_key=key)
  assert_same_floats(a, jitted(*args, rounding_key=key))
  assert_same_floats(a, jitted(*args, rounding_key=jax.random.key_data(key)))  # raw uint32[2] form
  assert not same_floats(a, jitted(*args, rounding_key=other)).all()


@pytest.mark.slow  # over 7 s on the 2-core CI machine; runs in the slow stage
@pytest.mark.parametrize("fmt", FORMATS)
def test_without_jit_the_same_bits_as_with_jit(fmt):
  f, jitted = _stochastic_model(fmt, 1)
  key = jax.random.key(3)
  assert_same_floats(f(*_model_args(), rounding_key=key), jitted(*_model_args(), rounding_key=key))


@functools.cache
def _stochastic_model(fmt: str, level: int):
  policy = precision.Policy(compute=fmt, level=level, accumulation_block=4, stochastic="matmul+elementwise")
  f = precision.autocast(_model, policy)
  return f, jax.jit(f)


def test_vmap_over_keys_equals_one_call_per_key_and_an_unbatched_key_is_shared():
  f = precision.autocast(lambda x, c: x * c, "c=bf16,sr=elementwise")
  xs = jnp.linspace(1.0, 2.0, 4 * 32, dtype=jnp.float32).reshape(4, 32)
  c = jnp.float32(1.0 + 2.0**-10)
  keys = jax.random.split(jax.random.key(9), 4)
  batched = jax.vmap(lambda x, k: f(x, c, rounding_key=k))(xs, keys)
  for i in range(4):
    assert_same_floats(batched[i], f(xs[i], c, rounding_key=keys[i]))
  shared = jax.vmap(lambda x: f(x, c, rounding_key=keys[0]))(xs)
  for i in range(4):
    assert_same_floats(shared[i], f(xs[i], c, rounding_key=keys[0]))


@pytest.mark.slow  # over 7 s on the 2-core CI machine; runs in the slow stage
def test_gradients_round_stochastically_through_custom_jvp_rules():
  """softmax and logaddexp are custom_jvp: their rules' roundings must transpose."""

  def loss(w, x):
    return jnp.sum(jax.nn.softmax(x @ w) * jax.nn.softplus(x @ w))

  w = jnp.linspace(-1, 1, 12, dtype=jnp.float32).reshape(4, 3)
  x = jnp.linspace(0, 2, 8, dtype=jnp.float32).reshape(2, 4)
  policy = "c=bf16,level=0,sr=matmul+elementwise"
  g32 = jax.grad(loss)(w, x)
  for g in (
    jax.grad(precision.autocast(loss, policy))(w, x, rounding_key=jax.random.key(1)),
    precision.autocast(jax.grad(loss), policy)(w, x, rounding_key=jax.random.key(1)),
    precision.autocast(jax.grad(jax.checkpoint(loss)), policy)(w, x, rounding_key=jax.random.key(1)),
  ):
    assert np.all(np.isfinite(g)) and not same_floats(g, g32).all()
    np.testing.assert_allclose(g, g32, atol=0.05)
    assert_same_floats(g, precision.round(g, "bf16"))  # the gradient left a bfloat16 rounding


def test_missing_key_is_a_policy_error_that_says_what_to_pass():
  f = precision.autocast(_model, "c=cb16,sr=matmul")
  with pytest.raises(
    PolicyError, match=r"rounds matmul stochastically and needs a key: call it with rounding_key="
  ):
    f(*_model_args())
  with pytest.raises(PolicyError, match="rounding_key must be one PRNG key"):
    f(*_model_args(), rounding_key=jax.random.split(jax.random.key(0), 2))


def test_numerics_report_and_while_loops_refuse_stochastic_policies_clearly():
  with pytest.raises(PolicyError, match="no rounding key reached the pass"):
    precision.numerics_report(_model, "c=cb16,sr=matmul", *_model_args())

  def loop(x):
    return jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 1.1), (0, x))[1]

  with pytest.raises(PolicyError, match="inside a while loop"):
    precision.autocast(loop, "c=bf16,sr=elementwise")(jnp.float32(1.0), rounding_key=jax.random.key(0))
  precision.autocast(loop, "c=bf16")(jnp.float32(1.0))  # nearest rounding still works there


def test_cast_report_needs_no_key():
  report = precision.cast_report(_model, "c=cb16,level=0,sr=matmul+elementwise", *_model_args())
  assert report.to_dict()


@pytest.mark.parametrize("level", [0, 1, 2])
def test_float32_policy_with_stochastic_options_is_the_identity(level):
  policy = precision.Policy(compute="float32", level=level, stochastic="matmul+elementwise")
  args = _model_args()
  expected = jax.jit(true_float32(_model))(*args)  # true float32 products, on GPUs too
  f = precision.autocast(_model, policy)
  assert_same_floats(jax.jit(f)(*args), expected)  # no key needed
  assert_same_floats(jax.jit(f)(*args, rounding_key=jax.random.key(0)), expected)


def test_a_key_is_ignored_by_a_policy_without_stochastic_classes():
  f = precision.autocast(_model, "c=cb16")
  assert_same_floats(f(*_model_args(), rounding_key=jax.random.key(0)), f(*_model_args()))


_ROUNDING = {
  level: tuple(c for c in RULE_CLASSES if LEVEL_RULES[level][c] != "float32") for level in (0, 1, 2)
}


@settings(max_examples=60, deadline=None)
@given(data=st.data(), level=st.sampled_from((0, 1, 2)), alias=st.sampled_from(("stochastic", "sr")))
def test_policy_string_round_trips_with_stochastic_classes(data, level, alias):
  classes = data.draw(st.lists(st.sampled_from(_ROUNDING[level]), unique=True))
  order = data.draw(st.permutations(classes))
  policy = precision.Policy(compute="bf16", level=level, stochastic=tuple(order))
  assert policy.stochastic == tuple(c for c in RULE_CLASSES if c in classes)  # canonical order
  assert precision.Policy.parse(str(policy)) == policy
  if classes:
    assert precision.Policy.parse(f"c=bf16,level={level},{alias}={'+'.join(order)}") == policy
    assert "stochastic=" in str(policy)
  else:
    assert "stochastic" not in str(policy)


@pytest.mark.parametrize(
  "text, fragment",
  [
    ("c=bf16,stochastic=matmul,sr=elementwise", "stochastic is given twice"),
    ("c=bf16,sr=matmul+matmul", "matmul is given twice"),
    ("c=bf16,sr=softmax", "unknown op class 'softmax'. Did you mean 'attention_softmax'?"),
    ("c=bf16,sr=reduction", "reduction is kept in float32 by the rule table"),
    ("c=bf16,matmul=float32,sr=matmul", "matmul is kept in float32"),
  ],
)
def test_bad_stochastic_settings_say_what_is_allowed(text, fragment):
  with pytest.raises(PolicyError) as info:
    precision.Policy.parse(text)
  assert fragment in str(info.value)


def test_stochastic_class_of_a_rounding_rule_override_is_accepted():
  policy = precision.Policy.parse("c=bf16,reduction=round,sr=reduction")
  assert policy.stochastic == ("reduction",)
  assert precision.Policy.parse(str(policy)) == policy


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), fmt=st.sampled_from(FORMATS))
def test_the_sites_primitive_rounds_like_precision_round(seed, fmt):
  """autocast's transposable primitive gives `precision.round`'s stochastic bits exactly."""
  from precision.rounding import round_stochastic_linear

  x = jax.random.normal(jax.random.key(seed), (257,)) * 3.0
  key = jax.random.key(seed + 1)
  expected = precision.round(x, fmt, "stochastic", key=key)
  assert_same_floats(round_stochastic_linear(x, precision.get_format(fmt), key), expected)
  assert not same_floats(expected, x).all()


@pytest.mark.parametrize("policy", ["c=bf16", "c=bf16,stochastic=elementwise", "c=f32"])
def test_a_functions_own_rounding_key_parameter_is_not_swallowed(policy):
  """autocast's rounding_key= would take the keyword meant for the function's own parameter of that
  name (which then ran with its default, silently): an error names the clash; by position it works."""

  def noisy(x, rounding_key=None):
    return x if rounding_key is None else x + jax.random.normal(rounding_key, x.shape)

  x, key = jnp.ones(3), jax.random.key(0)
  with pytest.raises(
    TypeError, match=r"autocast\(noisy\): rounding_key= .* has a parameter named rounding_key"
  ):
    precision.autocast(noisy, policy)(x, rounding_key=key)
  if "stochastic" not in policy:
    assert not np.array_equal(np.asarray(precision.autocast(noisy, policy)(x, key)), np.ones(3))
