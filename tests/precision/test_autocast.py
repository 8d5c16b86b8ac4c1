"""precision.autocast: numerics against float64 and against hand-placed roundings, bit for bit."""

import functools
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import precision
from precision.testing import assert_same_floats
from tests.devices import assert_same_up_to_summation_order, cpu_devices, true_float32

CB16 = precision.cbfloat16
r = functools.partial(precision.round, fmt="cbfloat16")


def _level(level, **kw):
  return precision.Policy(compute="cbfloat16", level=level, **kw)


def _normal(seed, shape, scale=1.0):
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * scale)


def _integers(seed, shape, bound=31):
  return jnp.asarray(np.random.default_rng(seed).integers(-bound, bound + 1, shape).astype(np.float32))


def _same(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert_same_floats(np.asarray(x), np.asarray(y))


# ---- a matmul against float64, with the error bound derived ----


def _gamma(n, unit):
  return n * unit / (1 - n * unit)


def test_matmul_error_bound_against_float64_at_levels_0_and_1():
  """Bound (per output element, A = sum_k |x_k w_k| in float64, u = 2^-10, u32 = 2^-24):

  Level 0 computes r(fl32(sum_k r(x_k) r(w_k))). Operand rounding: r(x) = x (1 + a), |a| <= u,
  so each exact product carries a relative error <= (1 + u)^2 - 1. The products are exact in
  float32 (10 + 10 significant bits). Float32 summation in any order adds <= g32 * sum|p|,
  g32 = gamma_{K-1}(u32), and sum|p| <= (1 + u)^2 A. The final rounding adds u |t| with
  |t| <= (1 + g32) sum|p|. Total: B0 = [(2u + u^2) + (1+u)^2 (g32 + u (1 + g32))] A.

  Level 1 sums n chunks of b products in float32 (g32 = gamma_{b-1}(u32) each), rounds each
  chunk sum (u) and adds the n rounded sums one by one in cbfloat16: recursive summation with
  unit u, gamma_{n-1}(u). The last addition's rounding is the result's rounding. Total:
  B1 = [(2u + u^2) + (1+u)^2 (g32 + u (1 + g32) + gamma_{n-1}(u) (1 + u)(1 + g32))] A.
  """
  u, u32 = 2.0**-10, 2.0**-24
  m, k, n_out, block = 16, 1024, 24, 128
  x, w = _normal(0, (m, k)), _normal(1, (k, n_out))
  exact = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
  a = np.abs(np.asarray(x, np.float64)) @ np.abs(np.asarray(w, np.float64))
  y0 = np.asarray(precision.autocast(jnp.matmul, _level(0))(x, w), np.float64)
  y1 = np.asarray(precision.autocast(jnp.matmul, _level(1, accumulation_block=block))(x, w), np.float64)

  g32 = _gamma(k - 1, u32)
  b0 = ((2 * u + u * u) + (1 + u) ** 2 * (g32 + u * (1 + g32))) * a
  chunks = k // block
  g32b = _gamma(block - 1, u32)
  b1 = (
    (2 * u + u * u) + (1 + u) ** 2 * (g32b + u * (1 + g32b) + _gamma(chunks - 1, u) * (1 + u) * (1 + g32b))
  ) * a
  assert np.all(np.abs(y0 - exact) <= b0)
  assert np.all(np.abs(y1 - exact) <= b1)
  # Rounding happened: every result is a cbfloat16 value, most differ from float32's, and the
  # errors are far above float32's.
  f32 = np.asarray(jnp.matmul(x, w, precision="highest"), np.float64)  # true float32, also on GPUs
  for y in (y0, y1):
    assert np.array_equal(y, np.asarray(precision.round(jnp.asarray(y, jnp.float32), CB16), np.float64))
    assert np.mean(y != f32) > 0.9
    assert np.median(np.abs(y - exact)) > 20 * np.median(np.abs(f32 - exact))
  assert np.mean(y0 != y1) > 0.3  # the chunked 16-bit accumulation is a different computation
  assert np.mean(np.abs(y1 - exact)) > np.mean(np.abs(y0 - exact))


# ---- bit-for-bit against hand-written roundings ----


def _mlp(x, w1, b1, w2):
  return jnp.mean((jnp.tanh(x @ w1 + b1[None]) @ w2) ** 2)


def _mlp_by_hand(x, w1, b1, w2):
  h = r(r(r(x) @ r(w1)) + b1[None])  # matmul: operands and result rounded; add: result rounded
  y = r(r(jnp.tanh(h)) @ r(w2))  # tanh: result rounded; the next matmul's lhs is already rounded
  return jnp.mean(r(y**2))  # square rounded; mean: float32 reduction, division of float32 values


def test_equals_hand_written_roundings_values_and_gradients():
  args = (_normal(2, (8, 16)), _normal(3, (16, 32), 0.3), _normal(4, (32,)), _normal(5, (32, 4), 0.3))
  auto = precision.autocast(_mlp, _level(0))
  _same(auto(*args), _mlp_by_hand(*args))
  _same(jax.grad(auto, argnums=(0, 1, 2, 3))(*args), jax.grad(_mlp_by_hand, argnums=(0, 1, 2, 3))(*args))
  assert float(auto(*args)) != float(_mlp(*args))  # rounding happened


def test_mixed_accumulation_equals_hand_written_chunks():
  # Integer data: every chunk sum is exact in float32 whatever the summation order, and the
  # sums exceed 2^10, so rounding them to cbfloat16 (10 significant bits) loses bits.
  x, w = _integers(6, (6, 32)), _integers(7, (32, 5))
  got = precision.autocast(jnp.matmul, _level(1, accumulation_block=8))(x, w)
  total = r(x[:, 0:8] @ w[0:8])
  for i in range(1, 4):
    total = r(total + r(x[:, 8 * i : 8 * i + 8] @ w[8 * i : 8 * i + 8]))
  _same(got, total)
  level0 = precision.autocast(jnp.matmul, _level(0))(x, w)
  _same(level0, r(x @ w))
  assert np.any(np.asarray(got) != np.asarray(level0))
  # A contraction that does not divide into whole chunks (zero padding completes the last one).
  x7, w7 = x[:, :30], w[:30]
  got7 = precision.autocast(jnp.matmul, _level(1, accumulation_block=8))(x7, w7)
  total = r(x7[:, 0:8] @ w7[0:8])
  for lo in (8, 16, 24):
    total = r(total + r(x7[:, lo : lo + 8] @ w7[lo : lo + 8]))
  _same(got7, total)


def _attention(q, k, v):
  scores = jnp.einsum("bqd,bkd->bqk", q, k) * 0.125
  return jnp.einsum("bqk,bkd->bqd", jax.nn.softmax(scores, axis=-1), v)


@pytest.mark.parametrize("level", [1, 2])
def test_attention_softmax_float32_at_level_1_and_16_bit_at_level_2(level):
  q, k, v = (_normal(s, (2, 16, 8)) for s in (8, 9, 10))
  policy = _level(level, accumulation_block=64)  # no chunking here: isolates the softmax rule
  got = precision.autocast(_attention, policy)(q, k, v)
  scores = r(jnp.einsum("bqd,bkd->bqk", r(q), r(k)))
  if level == 1:
    probs = jax.nn.softmax(scores * 0.125, axis=-1)  # the whole softmax in float32
  else:
    s = r(scores * 0.125)
    e = r(jnp.exp(r(s - jnp.max(s, axis=-1, keepdims=True))))
    probs = r(e / r(jnp.sum(e, axis=-1, keepdims=True)))
  _same(got, r(jnp.einsum("bqk,bkd->bqd", r(probs), r(v))))


def test_rule_overrides_change_the_numerics():
  x = _normal(11, (64,), 3.0)
  f = lambda v: jnp.exp(v) * v
  default = precision.autocast(f, _level(1))(x)
  _same(default, r(jnp.exp(x) * x))  # exp kept in float32, the product rounded
  rounded = precision.autocast(f, _level(1, rules={"transcendental": "round"}))(x)
  _same(rounded, r(r(jnp.exp(x)) * x))
  # A float32 value times a scalar stays float32 (loss * loss_scale, var + eps).
  _same(precision.autocast(lambda v: jnp.exp(v) * 1.0001, _level(1))(x), jnp.exp(x) * 1.0001)
  assert np.any(np.asarray(default) != np.asarray(rounded))


def test_float32_statistics_and_loss_scaling_stay_float32():
  x = _normal(12, (4, 64))

  def layer_norm_loss(v, scale):
    mean = jnp.mean(v, axis=-1, keepdims=True)
    var = jnp.mean((v - mean) ** 2, axis=-1, keepdims=True)
    y = (v - mean) * jax.lax.rsqrt(var + 1e-5)
    return jnp.mean(y) * scale  # a float32 loss times a constant (a Python number) stays float32

  got = precision.autocast(layer_norm_loss, _level(1), static_argnums=1)(x, 2.0**31 + 2.0**20)
  mean = jnp.mean(x, axis=-1, keepdims=True)  # reduction: float32
  centred = r(x - mean)
  var = jnp.mean(r(centred**2), axis=-1, keepdims=True)  # the square rounded, the mean float32
  y = r(centred * jax.lax.rsqrt(var + 1e-5))  # var + eps and rsqrt stay float32
  _same(got, jnp.mean(y) * jnp.float32(2.0**31 + 2.0**20))


# ---- control flow ----


def test_scan_rnn():
  def rnn(h0, xs, w, u):
    return jax.lax.scan(lambda h, x: (jnp.tanh(h @ w + x @ u), h), h0, xs)

  def by_hand(h0, xs, w, u):  # the weights rounded once, outside the loop, as the unrolled loop rounds them
    rw, ru = r(w), r(u)
    return jax.lax.scan(lambda h, x: (r(jnp.tanh(r(r(r(h) @ rw) + r(r(x) @ ru)))), h), h0, xs)

  args = (_normal(13, (3, 8)), _normal(14, (5, 3, 4)), _normal(15, (8, 8), 0.4), _normal(16, (4, 8), 0.4))
  auto = precision.autocast(rnn, _level(0))
  _same(auto(*args), by_hand(*args))
  loss = lambda f: lambda *a: jnp.sum(f(*a)[0] ** 2)
  _same(jax.grad(loss(auto), argnums=(0, 2))(*args), jax.grad(loss(by_hand), argnums=(0, 2))(*args))


def test_while_loop_and_cond():
  def f(x):
    _, y = jax.lax.while_loop(lambda s: s[0] < 5, lambda s: (s[0] + 1, s[1] * 1.1 + 0.01), (0, x))
    return jax.lax.cond(jnp.sum(y) > 0, lambda v: jnp.sin(v) * 2.0, jnp.exp, y)

  def by_hand(x):
    _, y = jax.lax.while_loop(lambda s: s[0] < 5, lambda s: (s[0] + 1, r(r(s[1] * 1.1) + 0.01)), (0, x))
    return jax.lax.cond(jnp.sum(y) > 0, lambda v: r(r(jnp.sin(v)) * 2.0), jnp.exp, y)

  for seed, shift in ((17, 1.0), (18, -1.0)):  # both branches
    x = _normal(seed, (32,)) + shift
    _same(precision.autocast(f, _level(0))(x), by_hand(x))


@pytest.mark.parametrize("level", [0, 1, 2])
@pytest.mark.parametrize("seed", [19, 20])
def test_a_vmapped_while_loop_with_a_per_example_trip_count(seed, level):
  """vmap of a while_loop whose condition reads the mapped value binds a while with a batched
  predicate (each element runs until its own condition fails); autocast of it is vmap of autocast."""

  def g(u, w):
    def body(s):
      i, v = s
      return i + 1, jnp.tanh(v @ w) * 1.7 + v

    return jax.lax.while_loop(lambda s: (jnp.sum(jnp.abs(s[1])) < 40.0) & (s[0] < 50), body, (0, u))

  x, w = _normal(seed, (6, 4)), _normal(seed + 100, (4, 4), 0.5)
  batched = jax.vmap(g, in_axes=(0, None))
  trips = batched(x, w)[0]
  assert len(set(np.asarray(trips).tolist())) > 1, "the example must have per-example trip counts"
  policy = _level(level)
  _same(
    precision.autocast(batched, policy)(x, w),
    jax.vmap(precision.autocast(g, policy), in_axes=(0, None))(x, w),
  )
  _same(jax.jit(precision.autocast(batched, policy))(x, w), precision.autocast(batched, policy)(x, w))


PRODUCTS = {
  "matmul": lambda x, w: jnp.tanh(x @ w),
  "einsum": lambda x, w: jnp.einsum("bi,io->bo", x, w) * 0.5,
  "dot_general": lambda x, w: jax.lax.dot_general(
    x, w, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32
  ),
}  # (lax.conv_general_dilated refuses operands of two dtypes)


@pytest.mark.parametrize("level", [0, 1, 2])
@pytest.mark.parametrize("narrow", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("product", sorted(PRODUCTS))
def test_16_bit_data_into_a_float32_product_is_the_float32_value_it_holds(product, narrow, level):
  """A bfloat16 or float16 input times float32 weights (JAX binds the mixed product with a float32
  result, no convert): the same numbers as the float32 copy of the input, weights and result rounded
  (they were left in float32, silently)."""
  f = PRODUCTS[product]
  x, w = _normal(21, (4, 8)).astype(narrow), _normal(22, (8, 3))
  auto = precision.autocast(f, _level(level))
  with jax.numpy_dtype_promotion("standard"):  # (the suite runs strict; mixed dtypes are the point)
    _same(auto(x, w), auto(x.astype(jnp.float32), w))
    assert not np.array_equal(np.asarray(auto(x, w)), np.asarray(f(x, w)))  # rounding happened
    loss = lambda g: lambda x, w: jnp.sum(g(x, w) ** 2)
    _same(jax.grad(loss(auto), 1)(x, w), jax.grad(loss(auto), 1)(x.astype(jnp.float32), w))


def test_custom_vjp_keeps_its_rule_and_autocasts_it():
  @jax.custom_vjp
  def half_square(x):
    return x * x * 0.5

  half_square.defvjp(lambda x: (x * x * 0.5, x), lambda x, g: (g * x * 3.0,))  # deliberately not x

  @jax.custom_vjp
  def by_hand_half_square(x):
    return r(r(x * x) * 0.5)

  by_hand_half_square.defvjp(lambda x: (r(r(x * x) * 0.5), x), lambda x, g: (r(r(g * x) * 3.0),))

  w = _normal(19, (16,))
  f = lambda x: jnp.sum(half_square(x) * w)
  hand = lambda x: jnp.sum(r(by_hand_half_square(x) * w))
  x = _normal(20, (16,))
  auto = precision.autocast(f, _level(0))
  _same(auto(x), hand(x))
  _same(jax.grad(auto)(x), jax.grad(hand)(x))
  np.testing.assert_allclose(jax.grad(auto)(x), 3 * x * w, rtol=2e-2)  # the custom rule ran


def test_custom_jvp_and_checkpoint():
  def f(x, w):
    return jnp.sum(jax.checkpoint(lambda v: jax.nn.relu(v @ w) * 1.5)(x))

  def plain(x, w):
    return jnp.sum(jax.nn.relu(x @ w) * 1.5)

  def by_hand(x, w):
    return jnp.sum(r(jax.nn.relu(r(r(x) @ r(w))) * 1.5))  # relu of rounded values: exact

  x, w = _normal(21, (4, 8)), _normal(22, (8, 8))
  auto, auto_plain = precision.autocast(f, _level(0)), precision.autocast(plain, _level(0))
  _same(auto(x, w), by_hand(x, w))
  _same(jax.grad(auto, argnums=(0, 1))(x, w), jax.grad(by_hand, argnums=(0, 1))(x, w))
  _same(jax.grad(auto, argnums=(0, 1))(x, w), jax.grad(auto_plain, argnums=(0, 1))(x, w))
  jaxpr = str(jax.make_jaxpr(jax.grad(auto))(x, w))
  assert "remat" in jaxpr or "checkpoint" in jaxpr  # the checkpoint survives the pass
  assert "custom_jvp_call" in str(jax.make_jaxpr(auto)(x, w))


def test_forward_mode_and_second_derivatives():
  f = lambda v: jnp.sum(jnp.tanh(v) ** 3)
  auto = precision.autocast(f, _level(0))
  x = _normal(23, (8,))
  primal, tangent = jax.jvp(auto, (x,), (jnp.ones_like(x),))
  _same(primal, auto(x))
  # Tangents are rounded like cotangents (a cast's JVP), so forward and reverse mode agree to
  # a few cbfloat16 roundings, not bit for bit.
  _, exact = jax.jvp(f, (x,), (jnp.ones_like(x),))
  np.testing.assert_allclose(tangent, exact, rtol=2e-2)
  np.testing.assert_allclose(tangent, jnp.sum(jax.grad(auto)(x)), rtol=2e-2)
  assert float(tangent) != float(exact)
  hess = jax.hessian(auto)(x)
  assert hess.shape == (8, 8) and np.all(np.isfinite(hess))


# ---- composition and signatures ----


def test_jit_vmap_and_eager_agree():
  args = (_normal(24, (3, 8, 16)), _normal(25, (16, 32), 0.3), _normal(26, (32,)), _normal(27, (32, 4), 0.3))
  auto = precision.autocast(_mlp, _level(1))
  eager = [auto(args[0][i], *args[1:]) for i in range(3)]
  # Bitwise on CPUs; on GPUs the batched and per-example GEMMs may sum in other orders.
  batched = jax.jit(jax.vmap(auto, in_axes=(0, None, None, None)))(*args)
  assert_same_up_to_summation_order(batched, jnp.stack(eager), CB16, "vmap vs eager")
  assert_same_up_to_summation_order(jax.jit(auto)(args[0][0], *args[1:]), eager[0], CB16, "jit vs eager")


def test_pytrees_kwargs_static_arguments_and_output_format():
  def f(params, x, *, scale, activation):
    return {"y": getattr(jnp, activation)(x @ params["w"]) * scale, "n": jnp.int32(3)}

  params, x = {"w": _normal(28, (4, 4))}, _normal(29, (2, 4))
  auto = precision.autocast(
    f, precision.Policy(compute="cb16", output="bf16", level=0), static_argnames="activation"
  )
  out = auto(params, x, scale=jnp.float32(3.0), activation="tanh")
  _same(out["y"], precision.round(r(r(jnp.tanh(r(r(x) @ r(params["w"])))) * 3.0), "bf16"))
  assert out["n"].dtype == jnp.int32 and auto.policy.output is precision.bfloat16
  # A leaf that is neither an array nor a number (the string) is passed unchanged, marked static or not.
  unmarked = precision.autocast(f, auto.policy)(params, x, scale=jnp.float32(3.0), activation="tanh")
  _same(unmarked["y"], out["y"])


def test_float32_compute_and_non_float32_values_are_untouched():
  x = _normal(30, (8, 8))
  _same(
    precision.autocast(_attention, "c=f32")(x[None], x[None], x[None]),
    true_float32(_attention)(x[None], x[None], x[None]),  # the float32 policy: true float32 products
  )
  xb = x.astype(jnp.bfloat16)
  got = precision.autocast(lambda v: jnp.tanh(v @ v) * 3, "c=cb16")(xb)
  assert got.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(jnp.tanh(xb @ xb) * 3, np.float32))


def test_shard_map_body_is_transformed():
  devices = cpu_devices(4)  # both runs on CPU devices: a GPU has one device
  mesh = jax.sharding.Mesh(np.array(devices), ("batch",))
  spec = jax.sharding.PartitionSpec("batch")
  replicated = jax.sharding.PartitionSpec()
  x, w = _normal(31, (8, 16)), _normal(32, (16, 16), 0.3)

  def f(x, w):
    return jnp.tanh(x @ w) + 1.0

  sharded = jax.shard_map(f, mesh=mesh, in_specs=(spec, replicated), out_specs=spec)
  with jax.default_device(devices[0]):
    xs = jax.device_put(x, jax.sharding.NamedSharding(mesh, spec))
    _same(precision.autocast(sharded, _level(0))(xs, w), precision.autocast(f, _level(0))(x, w))


def test_unknown_primitives_pass_through_and_are_reported():
  from precision._jax_compat import Primitive, mlir

  mystery = Primitive("mystery_scale")
  mystery.def_impl(lambda x: x * 3.0)
  mystery.def_abstract_eval(lambda x: x)
  mlir.register_lowering(mystery, mlir.lower_fun(lambda x: x * 3.0, multiple_results=False))
  f = lambda x: jnp.tanh(mystery.bind(x))
  x = _normal(33, (8,))
  with pytest.warns(
    precision.UnknownPrimitiveWarning, match=r"mystery_scale \(1 equation\) computed in float32"
  ) as seen:
    _same(precision.autocast(f, _level(0))(x), r(jnp.tanh(x * 3.0)))  # mystery ran unrounded
  assert "PRIMITIVE_CLASSES['mystery_scale'] = 'elementwise'" in str(seen[0].message)
  assert seen[0].filename == __file__  # the warning points at the user's call
  report = precision.cast_report(f, _level(0), x)  # (the report lists it; no warning)
  assert report.unknown_primitives == {"mystery_scale": 1}
  assert "mystery_scale" in str(report)
  precision.PRIMITIVE_CLASSES["mystery_scale"] = "elementwise"  # classified: rounded, no warning
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("error")
      _same(precision.autocast(f, _level(0))(x), r(jnp.tanh(r(x * 3.0))))
  finally:
    dict.pop(precision.PRIMITIVE_CLASSES, "mystery_scale")


# ---- the cast report ----


def test_cast_report_counts():
  x, w1, b1, w2 = (jax.ShapeDtypeStruct(s, jnp.float32) for s in ((8, 16), (16, 32), (32,), (32, 4)))
  report = precision.cast_report(_mlp, _level(0), x, w1, b1, w2)
  dot = report.by_primitive["dot_general"]
  # operands x (128), w1 (512), result (256); operand w2 (128), result (32); h already rounded
  assert (dot.equations, dot.rounded) == (2, 128 + 512 + 256 + 128 + 32)
  assert report.by_primitive["add"].rounded == 256 and report.by_primitive["tanh"].rounded == 256
  assert report.by_primitive["integer_pow"].rounded == 32
  assert report.by_primitive["reduce_sum"].kept_float32 == 1
  assert report.by_class["matmul"].rounded == dot.rounded
  assert report.unknown_primitives == {}
  as_dict = report.to_dict()
  assert as_dict["by_primitive"]["tanh"] == {
    "equations": 1,
    "rounded": 256,
    "kept_float32": 0,
    "untouched": 0,
  }
  assert as_dict["total"]["rounded"] == report.total.rounded
  text = str(report)
  assert "values rounded" in text and "dot_general" in text and "matmul" in text


def test_cast_report_puts_the_score_divisions_in_attention_softmax_at_every_level():
  """Found by a probe: at levels 0 and 1 the scores' division by sqrt(d) and the softmax's division
  were reported as ``elementwise`` kept in float32, at level 2 as ``attention_softmax`` rounded: the
  class of an equation is what it computes on (the scores), whatever the level does to it."""

  def attention(q, k, v, wo):
    scores = jnp.einsum("bqd,bkd->bqk", q, k) / 8.0
    return jnp.einsum("bqk,bkd->bqd", jax.nn.softmax(scores, axis=-1), v) @ wo

  args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in ((2, 16, 64), (2, 16, 64), (2, 16, 64), (64, 8))]
  reports = [precision.cast_report(attention, _level(level), *args) for level in (0, 1, 2)]
  counts = {r.by_class["attention_softmax"].equations for r in reports}
  assert len(counts) == 1, counts
  assert all("elementwise" not in r.by_class or r.by_class["elementwise"].equations == 0 for r in reports)
  assert reports[0].by_class["attention_softmax"].rounded == 0  # float32 at level 0 ...
  assert reports[2].by_class["attention_softmax"].kept_float32 == 0  # ... rounded at level 2


def test_cast_report_scales_scan_bodies_by_their_length():
  step = lambda h, x: (jnp.tanh(h + x), h)
  f = lambda h, xs: jax.lax.scan(step, h, xs)[0]
  report = precision.cast_report(f, _level(0), jnp.zeros(4), jnp.zeros((7, 4)))
  assert report.by_primitive["tanh"].equations == 7
  assert report.by_primitive["tanh"].rounded == 7 * 4


def test_autocast_error_messages():
  with pytest.raises(TypeError, match="precision.Policy or a string"):
    precision.autocast(jnp.sin, 3)
  with pytest.raises(precision.PolicyError, match="unknown key"):
    precision.autocast(jnp.sin, "compute_format=cb16")


def test_signature_and_metadata_are_kept():
  def loss(params, batch):
    """Docstring."""
    return jnp.sum(params * batch)

  auto = precision.autocast(loss, "c=cb16")
  assert auto.__wrapped__ is loss and auto.__doc__ == "Docstring." and auto.__name__ == "loss"
  assert math.isfinite(float(auto(jnp.ones(3), jnp.ones(3))))


@pytest.mark.parametrize("policy", ["c=cb16", "c=f32", "c=bf16,o=bf16"])
def test_python_numbers_returned_come_back_as_python_numbers(policy):
  """They came back as JAX's internal literal types (``TypedInt``, ``TypedFloat``) under a mixed
  policy and as plain numbers under ``c=f32``, as the function returns them."""
  x = jnp.ones(2)
  got = precision.autocast(lambda x: (x * 2, 3, 2.5, 1j, True), policy)(x)
  assert [type(v) for v in got[1:]] == [int, float, complex, bool]
  assert got[1:] == (3, 2.5, 1j, True)
