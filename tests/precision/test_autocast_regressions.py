"""Issue 11's findings, one test each: every one failed on the code before the fix."""

import contextlib
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import precision
from precision.testing import assert_same_floats, same_floats
from tests.devices import assert_same_up_to_summation_order, true_float32

r = functools.partial(precision.round, fmt="cbfloat16")


def _normal(seed, shape, scale=1.0):
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * scale)


def _integers(seed, shape, bound=31):
  return jnp.asarray(np.random.default_rng(seed).integers(-bound, bound + 1, shape).astype(np.float32))


def _policy(level, **kw):
  return precision.Policy(compute="cbfloat16", level=level, **kw)


def _same(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert_same_floats(np.asarray(x), np.asarray(y))


# ---- 1. 0-d values are values ----


def test_0d_arguments_are_rounded():
  f = lambda x: x * x + 1.0
  got = precision.autocast(f, _policy(1))(jnp.float32(0.1))
  _same(got, r(r(jnp.float32(0.1) * jnp.float32(0.1)) + 1.0))
  assert float(got) != float(f(jnp.float32(0.1)))  # rounding happened


def test_vmap_of_autocast_rounds_each_example():
  f = lambda x, w: jnp.tanh(x * w + 0.5)
  x, w = _normal(1, (64,)), jnp.float32(0.7)
  batched = jax.vmap(precision.autocast(f, _policy(1)), in_axes=(0, None))(x, w)
  _same(batched, precision.autocast(f, _policy(1))(x, w))
  assert np.mean(np.asarray(batched) != np.asarray(f(x, w))) > 0.5


def test_python_scalars_stay_constants_and_a_0d_array_is_a_value():
  x = _normal(2, (4, 64))

  def loss(v, scale):
    mean = jnp.mean(v, axis=-1, keepdims=True)
    var = jnp.mean((v - mean) ** 2, axis=-1, keepdims=True)
    return jnp.sum(jnp.exp(var + 1e-5)) * scale

  got = precision.autocast(loss, _policy(1), static_argnums=1)(x, 3.0)  # a Python scalar
  mean = jnp.mean(x, axis=-1, keepdims=True)
  var = jnp.mean(r(r(x - mean) ** 2), axis=-1, keepdims=True)
  total = jnp.sum(jnp.exp(var + 1e-5))
  _same(got, total * 3.0)  # var + eps, exp, sum and * 3.0 stay float32
  as_array = precision.autocast(loss, _policy(1))(x, jnp.float32(3.0))  # a 0-d array: a value
  _same(as_array, r(total * 3.0))
  assert float(as_array) != float(got)


@pytest.mark.parametrize("by_name", [False, True])
def test_a_static_jax_array_is_a_python_value_under_every_policy(by_name):
  """Found by a probe: the docstring says static arguments are passed unchanged (a loop count, a
  flag), and its error note sends a user with a 0-d array used as a Python value to
  ``static_argnums``; but a static ``jnp`` array was passed into the trace, where ``n > 1`` is staged,
  so it failed under a mixed policy and worked under float32. It is now on the host (NumPy)."""
  x = _normal(3, (4, 8))

  def f(a, n):
    for _ in range(n):  # a loop count
      a = jnp.tanh(a * 1.5)
    return a * 2.0 if n > 1 else a  # a flag

  def call(policy, n):
    wrapped = precision.autocast(
      f, policy, **({"static_argnames": "n"} if by_name else {"static_argnums": 1})
    )
    return wrapped(x, n=n) if by_name else wrapped(x, n)

  for policy in ("c=cb16", "c=f32"):
    _same(call(policy, jnp.int32(3)), call(policy, 3))
  assert not same_floats(call("c=cb16", jnp.int32(3)), call("c=cb16", jnp.int32(1))).all()


def test_other_static_jax_arrays_stay_jax_arrays():
  """A review of the fix above (which first turned every static JAX array into NumPy): a static table
  indexed by traced ids, ``.at`` on a static array, a typed PRNG key and a weak float scalar must
  behave as under the float32 policy (only 0-d integers and bools become Python numbers)."""
  x = _normal(4, (4, 8))
  ids, table = jnp.array([0, 2, 1]), jnp.arange(40.0).reshape(10, 4)
  cases = [
    (lambda i, t: t[i] * 2.0, (ids, table)),
    (lambda a, t: a + t.at[0].set(0.0)[0], (x, jnp.ones(8))),
    (lambda a, k: a + jax.random.normal(k, a.shape), (x, jax.random.key(0))),
    (lambda a, s: a.astype(jnp.bfloat16) * s, (x, jnp.asarray(2.0))),
  ]
  for f, args in cases:
    want = precision.autocast(f, "c=f32", static_argnums=1)(*args)
    got = precision.autocast(f, "c=cb16", static_argnums=1)(*args)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.dtype, want.dtype)


# ---- 2. attention by structure, not batch dimensions ----


def _ensemble(x, w):
  return jnp.tanh(jnp.einsum("bsd,bdf->bsf", x, w)) * 1.5


def test_batched_products_are_ordinary_matmuls():
  x, w = _integers(3, (2, 4, 64)), _integers(4, (2, 64, 8))
  policy = _policy(1, accumulation_block=16)
  got = precision.autocast(_ensemble, policy)(x, w)
  total = r(jnp.einsum("bsd,bdf->bsf", x[..., :16], w[:, :16]))
  for i in range(1, 4):
    total = r(total + r(jnp.einsum("bsd,bdf->bsf", x[..., 16 * i : 16 * i + 16], w[:, 16 * i : 16 * i + 16])))
  _same(got, r(r(jnp.tanh(total)) * 1.5))  # mixed accumulation, and tanh and * rounded
  report = precision.cast_report(_ensemble, policy, x, w)
  assert "attention_matmul" not in report.by_class and "attention_softmax" not in report.by_class


def test_autocast_of_vmap_equals_vmap_of_autocast():
  def mlp(x, w1, w2):
    return jnp.sum(jnp.tanh(x @ w1) @ w2)

  x, w1, w2 = _normal(5, (6, 16)), _normal(6, (16, 32), 0.3), _normal(7, (32, 4), 0.3)
  a = precision.autocast(jax.vmap(mlp, in_axes=(0, None, None)), _policy(1))(x, w1, w2)
  b = jax.vmap(precision.autocast(mlp, _policy(1)), in_axes=(0, None, None))(x, w1, w2)
  assert_same_up_to_summation_order(a, b, "cbfloat16")  # bitwise on CPUs (tests/tolerances.py)


def test_attention_is_still_recognised():
  def attention(q, k, v):
    return jnp.einsum("bqk,bkd->bqd", jax.nn.softmax(jnp.einsum("bqd,bkd->bqk", q, k) * 0.125), v)

  q, k, v = (_normal(s, (2, 8, 16)) for s in (8, 9, 10))
  report = precision.cast_report(attention, _policy(1), q, k, v)
  assert report.by_class["attention_matmul"].equations == 2
  assert report.by_class["attention_softmax"].kept_float32 > 0
  # A classifier's logits go through a softmax that feeds no second product: not attention.
  classifier = lambda x, w: jnp.sum(jax.nn.softmax(x @ w))
  assert "attention_matmul" not in precision.cast_report(classifier, _policy(1), q[0], v[0].T).by_class


# ---- 3. convolutions get mixed accumulation ----


def _conv(x, w, groups=1):
  return jax.lax.conv_general_dilated(
    x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=groups
  )


@pytest.mark.parametrize("groups", [1, 2])
def test_convolution_mixed_accumulation_equals_hand_written_chunks(groups):
  # Integer data: every chunk sum is exact in float32 whatever the summation order.
  channels, block = 24, 9 * 5  # 3x3 window: 5 channels per chunk, 3 chunks of 12 per group
  x, w = _integers(11, (2, 6, 6, channels)), _integers(12, (3, 3, channels // groups, 6))
  got = precision.autocast(functools.partial(_conv, groups=groups), _policy(1, accumulation_block=block))(
    x, w
  )
  per_group = channels // groups
  outs = []
  for g in range(groups):
    og = 6 // groups
    xg, wg = x[..., g * per_group : (g + 1) * per_group], w[..., g * og : (g + 1) * og]
    total = None
    for lo in range(0, per_group, 5):
      s = r(_conv(xg[..., lo : lo + 5], wg[:, :, lo : lo + 5]))
      total = s if total is None else r(total + s)
    outs.append(total)
  _same(got, jnp.concatenate(outs, axis=-1))
  level0 = precision.autocast(functools.partial(_conv, groups=groups), _policy(0))(x, w)
  _same(level0, r(_conv(x, w, groups)))
  assert np.any(np.asarray(got) != np.asarray(level0))


def test_a_3x3_convolution_over_128_channels_differs_between_levels_0_and_1():
  x, w = _normal(13, (1, 8, 8, 128)), _normal(14, (3, 3, 128, 16), 0.1)
  y0 = precision.autocast(_conv, _policy(0))(x, w)
  y1 = precision.autocast(_conv, _policy(1))(x, w)
  assert np.mean(np.asarray(y0) != np.asarray(y1)) > 0.05


# ---- 4. compute="float32" is the identity ----


@pytest.mark.parametrize("level", [0, 1, 2])
def test_float32_compute_is_the_identity(level):
  def f(x, w):
    return jnp.sum(jnp.tanh(x @ w) ** 2)

  x, w = _normal(15, (8, 4096)), _normal(16, (4096, 16), 0.02)  # 4 chunks of 1024 at level 1
  policy = precision.Policy(compute="float32", level=level)
  # The float32 policy is f with true float32 products (tests/devices.py; TF32 on GPUs otherwise).
  _same(jax.jit(precision.autocast(f, policy))(x, w), jax.jit(true_float32(f))(x, w))
  report = precision.cast_report(f, policy, x, w)
  assert report.total.rounded == 0
  baseline = precision.Policy.from_config(mixed_precision=False, precision_opt_level=level)
  _same(jax.jit(precision.autocast(jax.grad(f), baseline))(x, w), jax.jit(true_float32(jax.grad(f)))(x, w))


@pytest.mark.parametrize("level", [0, 1, 2])
def test_float32_compute_is_the_identity_when_called_eagerly(level):
  # A jitted function inside (jnp.einsum, jax.nn.* and users' layers are): evaluated eagerly, the
  # pass ran its body op by op while ``f`` runs it compiled and fused, where XLA contracts
  # a * 1.7 + b into one FMA: the last bit differed.
  @jax.jit
  def layer(x, w):
    return jnp.tanh(x @ w) * 1.7 + jnp.exp(-jnp.sum(x))

  def f(x, w):
    return layer(x, w) ** 2 + jnp.log1p(jnp.abs(x[:, :16]))

  x, w = _normal(18, (8, 16)), _normal(19, (16, 16))
  policy = precision.Policy(compute="float32", level=level)
  _same(precision.autocast(f, policy)(x, w), true_float32(f)(x, w))  # true float32 products on GPUs too
  grad = true_float32(jax.grad(lambda x, w: jnp.sum(f(x, w))))
  _same(jax.grad(lambda x, w: jnp.sum(precision.autocast(f, policy)(x, w)))(x, w), grad(x, w))


# ---- 5. Policy.param: see tests/precision/test_policy.py ----


# ---- 6. nesting, float32 regions, statics, compile size ----


def test_nested_autocast_inner_policy_wins():
  inner = precision.autocast(lambda x: jnp.tanh(x * 1.7), "c=bf16,level=1")
  outer = precision.autocast(lambda x: inner(x) * x, "c=cb16,level=1")
  x = _normal(17, (256,))
  bf = functools.partial(precision.round, fmt="bfloat16")
  _same(outer(x), r(bf(jnp.tanh(bf(x * 1.7))) * x))


def _adam_like(w, g, v, region):
  grad = jnp.tanh(g * w)  # the autocast part: rounded
  with precision.float32_region() if region else contextlib.nullcontext():
    v = 0.999 * v + 0.001 * grad**2
    return w - 1e-3 * grad / (jnp.sqrt(v) + 1e-8), v


def test_float32_region_keeps_the_optimizer_update_in_float32():
  w, g, v = _normal(18, (64,)), _normal(19, (64,), 1e-5), jnp.zeros(64)
  got_w, got_v = precision.autocast(_adam_like, _policy(1), static_argnums=3)(w, g, v, True)
  grad = r(jnp.tanh(r(g * w)))
  want_v = 0.999 * v + 0.001 * grad**2
  _same((got_w, got_v), (w - 1e-3 * grad / (jnp.sqrt(want_v) + 1e-8), want_v))
  assert np.all(np.asarray(got_v) > 0)
  # Without the region the second moment underflows in cbfloat16 and the step is ~1e-3 / 1e-8.
  bad_w, bad_v = precision.autocast(_adam_like, _policy(1), static_argnums=3)(w, g, v, False)
  assert np.mean(np.asarray(bad_v) == 0) > 0.9 and np.max(np.abs(np.asarray(bad_w - w))) > 0.1
  decorated = precision.float32_region(lambda a, b: a * b + 1e-3)
  _same(precision.autocast(decorated, _policy(1))(w, g), w * g + 1e-3)
  report = precision.cast_report(_adam_like, _policy(1), w, g, v, True, static_argnums=3)
  assert report.by_class["float32_region"].rounded == 0 and report.by_class["float32_region"].kept_float32 > 0


def test_static_argnames_also_cover_positional_use_and_cast_report_takes_statics():
  def f(x, activation):
    return getattr(jnp, activation)(x)

  x = _normal(20, (8,))
  auto = precision.autocast(f, "c=cb16", static_argnames="activation")
  _same(auto(x, "tanh"), r(jnp.tanh(x)))
  _same(auto(x, activation="tanh"), r(jnp.tanh(x)))
  report = precision.cast_report(f, "c=cb16", x, "tanh", static_argnames="activation")
  assert report.by_primitive["tanh"].rounded == 8
  # numerics_report takes them too (the keyword reached f before)
  for statics in ({"static_argnames": "activation"}, {"static_argnums": 1}):
    numerics = precision.numerics_report(f, "c=cb16", x, "tanh", **statics)
    _same(numerics.outputs, r(jnp.tanh(x)))


def test_long_contractions_compile_to_few_equations():
  x, w = jax.ShapeDtypeStruct((2, 2**18), jnp.float32), jax.ShapeDtypeStruct((2**18, 2), jnp.float32)
  jaxpr = jax.make_jaxpr(precision.autocast(jnp.matmul, _policy(1)))(x, w)
  assert len(jaxpr.jaxpr.eqns) < 30  # 256 chunks: one product and one scan, not a Python loop


def test_chunked_sum_is_bit_identical_to_the_sequential_definition():
  x, w = _normal(21, (5, 8192)), _normal(22, (8192, 3))
  got = precision.autocast(jnp.matmul, _policy(1, accumulation_block=512))(x, w)
  xr, wr = r(x), r(w)
  total = r(xr[:, :512] @ wr[:512])
  for i in range(1, 16):
    total = r(total + r(xr[:, 512 * i : 512 * i + 512] @ wr[512 * i : 512 * i + 512]))
  _same(got, total)


def test_round_of_float64_into_a_22_bit_format_rounds_once():
  fmt = precision.FloatFormat("e8m22", 8, 22)
  # Just above the midpoint between two 22-bit values: float32 rounds it to the midpoint,
  # which then ties to even (down); the correct rounding goes up.
  lo = 1.0
  value = np.float64(lo + 2.0**-23 + 2.0**-30)
  assert float(precision.round(value, fmt)) == lo + 2.0**-22
  assert float(precision.round(np.float64(lo + 2.0**-23 - 2.0**-30), fmt, "toward_zero")) == lo


def test_failed_register_format_leaves_nothing_behind():
  fmt = precision.FloatFormat("issue11_fmt", 5, 4)
  with pytest.raises(precision.FormatError, match="already registered"):
    precision.register_format(fmt, aliases=("issue11_alias", "bf16"))
  with pytest.raises(precision.FormatError, match="unknown float format"):
    precision.get_format("issue11_fmt")
  with pytest.raises(precision.FormatError, match="unknown float format"):
    precision.get_format("issue11_alias")


def test_assert_same_floats_does_not_narrow_float64():
  with pytest.raises(AssertionError, match="1 of 1 differ"):
    assert_same_floats(np.float64(0.1), np.float32(0.1))
  assert same_floats(np.float64(0.5), np.float32(0.5))


_SAMPLERS = {
  "uniform": lambda k, n: jax.random.uniform(k, (n,)),
  "uniform_range": lambda k, n: jax.random.uniform(k, (n,), minval=-3.0, maxval=5.0),
  "normal": lambda k, n: jax.random.normal(k, (n,)),
  "gumbel": lambda k, n: jax.random.gumbel(k, (n,)),
  "exponential": lambda k, n: jax.random.exponential(k, (n,)),
  "truncated_normal": lambda k, n: jax.random.truncated_normal(k, -2.0, 2.0, (n,)),
  "logistic": lambda k, n: jax.random.logistic(k, (n,)),
}


@settings(max_examples=12, deadline=None)
@given(
  sampler=st.sampled_from(sorted(_SAMPLERS)),
  fmt=st.sampled_from(["bfloat16", "float16", "cbfloat16"]),
  level=st.sampled_from([0, 1, 2]),
  seed=st.integers(0, 2**31 - 1),
)
def test_random_samplers_inside_autocast_keep_their_contract(sampler, fmt, level, seed):
  """A float32 built from random bits is data, kept float32 through the arithmetic that finishes it:
  JAX's samplers make a float in [1, 2) from bits and subtract 1, and rounding that gave uniforms of
  exactly 1.0 and normal, Gumbel and exponential draws of inf (a VAE's loss was inf at every step)."""
  n = 50_000
  fn = lambda k: _SAMPLERS[sampler](k, n)  # noqa: E731
  key = jax.random.key(seed)
  want = fn(key)
  got = precision.autocast(fn, precision.Policy(compute=fmt, level=level))(key)
  assert bool(jnp.all(jnp.isfinite(got))), sampler
  if sampler.startswith("uniform"):  # every op of the sampler is float32 arithmetic on its bits
    assert jnp.array_equal(got, want)
    lo, hi = (-3.0, 5.0) if sampler == "uniform_range" else (0.0, 1.0)
    assert float(got.min()) >= lo and float(got.max()) < hi


def test_a_sampled_value_meets_the_policy_where_it_meets_computed_values():
  """The reparameterisation ``mu + sigma * eps``: eps is a float32 draw, the result is rounded."""

  def sample(mu, key):
    return mu + jnp.exp(0.5 * mu) * jax.random.normal(key, mu.shape)

  mu = jnp.linspace(-1.0, 1.0, 4096, dtype=jnp.float32)
  out = precision.autocast(sample, "c=bf16")(mu, jax.random.key(1))
  assert bool(jnp.all(jnp.isfinite(out))) and jnp.array_equal(out, precision.round(out, "bfloat16"))


def test_complex_arithmetic_is_listed_as_other_float_not_integer():
  """An FFT and complex products escape the policy (untouched): the cast report lists them as
  ``other_float``, the class that shows such an escape; they were listed as ``integer``."""
  fn = lambda x: jnp.real(jnp.fft.ifft(jnp.fft.fft(x) * 2.0))  # noqa: E731
  table = str(precision.cast_report(fn, "c=bf16", jnp.ones(8)).table("class"))
  assert "other_float" in table and "integer" not in table, table


def test_bits_of_a_computed_float_are_not_a_random_draw():
  """Only a float built from random bits is kept float32: a user's mantissa trick on a computed value
  (bitcast to int, mask, bitcast back) is rounded as before, and an old-style uint32 key samples as a
  new-style one."""
  w = jnp.linspace(-2.0, 2.0, 64, dtype=jnp.float32).reshape(8, 8)
  x = jnp.linspace(-1.0, 1.3, 64, dtype=jnp.float32).reshape(8, 8)

  def trick(x):
    bits = jax.lax.bitcast_convert_type(jnp.tanh(x @ w), jnp.int32) & jnp.int32(-65536)
    return jax.lax.bitcast_convert_type(bits, jnp.float32) * 3.3 + 0.1

  out = precision.autocast(trick, "c=bf16")(x)
  assert jnp.array_equal(out, precision.round(out, "bfloat16"))
  old_key = jax.random.PRNGKey(3)
  draw = precision.autocast(lambda k: jax.random.uniform(k, (50_000,)), "c=bf16")(old_key)
  assert jnp.array_equal(draw, jax.random.uniform(old_key, (50_000,)))


def test_random_bits_returned_by_a_jitted_helper_are_still_random_bits():
  """Bits a jitted function returns (the caller makes the float): eagerly (the jit inlined) the
  uniform was rounded once the body's record of its bits was dropped, 11 of 4096 became 1.0; traced
  (the jit kept) it was rounded before. The draw is the float32 sampler's value either way."""

  @jax.jit
  def bits(key):
    return jax.random.bits(key, (4096,), jnp.uint32)

  def uniform(key):
    b = bits(key)
    u = jax.lax.bitcast_convert_type((b >> 9) | jnp.uint32(0x3F800000), jnp.float32) - 1.0
    return u * 0.999 + 0.0005

  key = jax.random.key(0)
  want = jax.jit(uniform)(key)
  for run in (precision.autocast(uniform, "c=bf16"), jax.jit(precision.autocast(uniform, "c=bf16"))):
    got = run(key)
    assert float(jnp.max(got)) < 1.0
    assert float(jnp.max(jnp.abs(got - want))) <= 6e-8  # float32 (a fused multiply-add may differ by an ulp)
