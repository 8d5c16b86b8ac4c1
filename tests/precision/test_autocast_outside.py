"""autocast on programs written by other people: Equinox / Flax / Haiku models and plain JAX
with the primitives such code uses (control flow, custom derivatives, remat, pooling, sorting,
gathers and scatters, integer and complex values, PRNG keys, sharding).

Each defect found by probing such programs has a test here (non-array leaves, empty
contractions, error messages); the invariants that held are checked over a bank of programs:
a float32 policy is the identity (values and gradients, under jit), ``jit`` and ``vmap``
commute with autocast, and with ``output=compute`` every float32 result is a compute-format
value that differs from the float32 one (rounding happened).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import precision
from precision.testing import assert_close, assert_same_floats
from tests.devices import cpu_devices, true_float32

F32 = [precision.Policy(compute="float32", level=level) for level in (0, 1, 2)]


def _normal(seed: int, shape: tuple[int, ...], scale: float = 1.0) -> jax.Array:
  return scale * jax.random.normal(jax.random.key(seed), shape, jnp.float32)


def _assert_tree_same(actual, expected, context: str = "") -> None:
  assert jax.tree.structure(actual) == jax.tree.structure(expected), context
  for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
    if jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
      a, e = jax.random.key_data(a), jax.random.key_data(e)
    assert a.dtype == e.dtype, context
    if jnp.issubdtype(a.dtype, jnp.inexact):
      assert_same_floats(np.asarray(a), np.asarray(e), context)
    else:
      np.testing.assert_array_equal(np.asarray(a), np.asarray(e), context)


def _representable(x: jax.Array, fmt: str) -> bool:
  return bool(np.array_equal(np.asarray(precision.round(x, fmt)), np.asarray(x), equal_nan=True))


# ---- defect 1: leaves that are not arrays (an Equinox module's activation function) ----


def _mlp(params, x):
  """A pytree holding a function next to arrays, as an Equinox module does."""
  h = params["activation"](x @ params["w1"])
  return h @ params["w2"]


def _mlp_params():
  return {"w1": _normal(1, (8, 16), 0.3), "w2": _normal(2, (16, 4), 0.3), "activation": jax.nn.gelu}


@pytest.mark.parametrize("policy", ["c=cb16,level=2,block=4"])
def test_non_array_leaves_are_passed_unchanged(policy):
  # Was: TypeError "got a custom_jvp argument ... Mark non-array arguments with static_argnums"
  # (the leaf cannot be marked: it sits inside the pytree of weights).
  params, x = _mlp_params(), _normal(3, (5, 8))
  arrays = {k: v for k, v in params.items() if k != "activation"}
  want = jax.jit(precision.autocast(lambda a, x: _mlp({**a, "activation": jax.nn.gelu}, x), policy))(
    arrays, x
  )
  _assert_tree_same(precision.autocast(_mlp, policy)(params, x), want)
  # A function returning such a pytree (a train step returning the updated module).
  step = precision.autocast(lambda p, x: (jnp.sum(_mlp(p, x) ** 2), {**p, "w1": p["w1"] * 0.5}), policy)
  loss, new = step(params, x)
  assert new["activation"] is jax.nn.gelu and new["w1"].shape == (8, 16)
  report = precision.cast_report(_mlp, policy, params, x)
  assert report.total.rounded > 0


def test_non_array_leaves_float32_policy_is_the_identity():
  params, x = _mlp_params(), _normal(3, (5, 8))

  def loss(p, x):
    return jnp.sum(_mlp(p, x) ** 2)

  want = jax.jit(true_float32(jax.value_and_grad(lambda x: loss(params, x))))(x)  # GPUs: not TF32
  for policy in F32:
    auto = precision.autocast(loss, policy)
    _assert_tree_same(jax.jit(jax.value_and_grad(lambda x, auto=auto: auto(params, x)))(x), want)


@pytest.mark.parametrize("policy", ["c=bf16", pytest.param(F32[1], marks=pytest.mark.slow)])
def test_equinox_filter_transforms_of_autocast(policy):
  eqx = pytest.importorskip("equinox")  # tested with equinox 0.13.8
  model = eqx.nn.MLP(8, 4, 16, 2, key=jax.random.key(0))  # holds jax.nn.relu and the identity as leaves
  x = _normal(4, (6, 8))

  def loss(model, x):
    return jnp.mean(jax.vmap(model)(x) ** 2)

  arrays, static = eqx.partition(model, eqx.is_array)
  want_loss, want_grads = jax.jit(
    precision.autocast(jax.value_and_grad(lambda a, x: loss(eqx.combine(a, static), x)), policy)
  )(arrays, x)
  got_loss, got_grads = eqx.filter_jit(precision.autocast(eqx.filter_value_and_grad(loss), policy))(model, x)
  _assert_tree_same(got_loss, want_loss)
  _assert_tree_same(eqx.filter(got_grads, eqx.is_array), want_grads)
  got = eqx.filter_grad(precision.autocast(loss, policy))(model, x)  # grad of autocast
  assert jax.tree.structure(eqx.filter(got, eqx.is_array)) == jax.tree.structure(want_grads)

  def step(model, x):
    grads = eqx.filter_grad(loss)(model, x)
    with precision.float32_region():
      return eqx.apply_updates(model, jax.tree.map(lambda g: -0.1 * g, grads))

  new = eqx.filter_jit(precision.autocast(step, policy))(model, x)  # returns the module
  assert new.activation is model.activation
  assert float(loss(new, x)) < float(loss(model, x))


# ---- defect 2: an empty contraction (ZeroDivisionError in the chunking) ----


@pytest.mark.parametrize("policy", ["c=bf16,level=0", "c=cb16,level=1", "c=f16,level=2,block=2"])
def test_empty_contractions_give_zeros(policy):
  def f(a, b, x, k):
    conv = lax.conv_general_dilated(x, k, (1,), "SAME")
    return a @ b, jnp.einsum("ijk,jkl->il", a[:, None, :] * 0, b[None]), conv

  args = (jnp.ones((3, 0)), jnp.ones((0, 5)), jnp.ones((2, 0, 5)), jnp.ones((3, 0, 3)))
  want = jax.jit(f)(*args)
  _assert_tree_same(jax.jit(precision.autocast(f, policy))(*args), want)
  _assert_tree_same(precision.autocast(f, policy)(*args), want)
  assert precision.cast_report(f, policy, *args).total.equations > 0


# ---- defect 3: errors for a wrong function or wrong static arguments ----


def _two(a, b):
  return a * b


@pytest.mark.parametrize(
  ("call", "error", "fragments"),
  [
    (lambda: precision.autocast(3, "c=bf16"), TypeError, ("fn must be a function", "int 3")),
    (lambda: precision.autocast(None, "c=bf16"), TypeError, ("fn must be a function", "NoneType")),
    (lambda: precision.autocast("c=bf16", _two), TypeError, ("fn must be a function", "swap fn and policy")),
    (lambda: precision.cast_report(3, "c=bf16", 1.0), TypeError, ("cast_report(fn, policy", "int 3")),
    (lambda: precision.numerics_report(3, "c=bf16", 1.0), TypeError, ("numerics_report(fn, policy",)),
    (
      lambda: precision.autocast(_two, "c=bf16", static_argnums="b"),
      TypeError,
      ("static_argnums must be", "'b'"),
    ),
    (lambda: precision.autocast(_two, "c=bf16", static_argnames=1), TypeError, ("static_argnames must be",)),
    (
      lambda: precision.autocast(_two, "c=bf16", static_argnums=5),
      ValueError,
      ("[5] out of range", "(a, b)"),
    ),
    (
      lambda: precision.autocast(_two, "c=bf16", static_argnames="c"),
      ValueError,
      ("['c']", "parameters: a, b"),
    ),
    (lambda: precision.float32_region(3), TypeError, ("float32_region", "int 3")),
    (
      lambda: precision.autocast(_two, "c=bf17"),
      precision.PolicyError,
      ("unknown float format 'bf17'", "bf16"),
    ),
    (lambda: precision.Policy(compute="bf16", level=3), precision.PolicyError, ("level=3", "0, 1 or 2")),
  ],
)
def test_errors_say_what_was_given_and_what_is_allowed(call, error, fragments):
  with pytest.raises(error) as info:
    call()
  for fragment in fragments:
    assert fragment in str(info.value), str(info.value)


def test_static_argnums_negative_and_varargs_and_kwargs():
  x = jnp.ones(2)
  flagged = functools.partial(precision.autocast, policy="c=bf16")
  assert float(flagged(lambda x, on: x * 3 if on else x, static_argnums=-1)(x, True)[0]) == 3.0
  assert float(flagged(lambda *a: a[0] * 3 if a[1] else a[0], static_argnums=1)(x, True)[0]) == 3.0
  assert float(flagged(lambda x, **k: x * 3 if k["on"] else x, static_argnames="on")(x, on=True)[0]) == 3.0


# ---- defect 4: jit bodies were inlined, which reordered the sums of a cotangent ----


def _silu_residual(x):
  return jnp.sum((jax.nn.silu(x) + jnp.sin(x)) ** 2)  # jax.nn.silu is a jit that uses x twice


def test_gradients_through_jitted_functions_are_the_identity_under_float32():
  # Was: the last bit of jax.grad(autocast(f)) differed (the transpose added x's three
  # contributions as (a + b) + c where jax.grad(f) adds a + (b + c), the last two inside silu's jit).
  x = _normal(15, (16,))
  want = jax.jit(jax.grad(_silu_residual))(x)
  for policy in F32:
    _assert_tree_same(jax.jit(jax.grad(precision.autocast(_silu_residual, policy)))(x), want, str(policy))
  jaxpr = jax.make_jaxpr(precision.autocast(_silu_residual, "c=bf16"))(x)
  assert [e.params["name"] for e in jaxpr.eqns if e.primitive.name == "jit"] == ["silu"]
  eager = precision.autocast(_silu_residual, "c=bf16")(x)  # eagerly the body is inlined: same values
  _assert_tree_same(eager, jax.jit(precision.autocast(_silu_residual, "c=bf16"))(x))


def test_a_jit_with_its_own_shardings_keeps_them():
  # Was: inlined, its shardings dropped, and the float32 policy's values differed by an ulp.
  devices = cpu_devices(4)  # and every run below on CPU devices: a GPU has one device
  with jax.default_device(devices[0]):
    mesh = jax.sharding.Mesh(np.array(devices), ("d",))
    rows = NamedSharding(mesh, P("d"))
    w = _normal(18, (16, 16), 0.3)
    layer = jax.jit(lambda a: jnp.tanh(a @ w), in_shardings=rows, out_shardings=rows)

    def f(x):
      return jnp.sum(layer(x) * 2)

    x = _normal(19, (4, 16))
    for policy in F32[1:2]:
      _assert_tree_same(
        jax.jit(jax.value_and_grad(precision.autocast(f, policy)))(x), jax.jit(jax.value_and_grad(f))(x)
      )
    jaxpr = jax.make_jaxpr(precision.autocast(f, "c=bf16"))(x)
    (inner,) = [e for e in jaxpr.eqns if e.primitive.name == "jit"]
    assert inner.params["out_shardings"] == (rows,)
    assert precision.autocast(layer, "c=bf16")(x).sharding == rows  # eagerly too


def test_stochastic_bits_do_not_depend_on_jit_boundaries():
  def f(x, w):
    return jnp.sum(jax.jit(lambda a: jnp.tanh(a @ w) * 1.7)(x) ** 2)

  def inlined(x, w):
    return jnp.sum((jnp.tanh(x @ w) * 1.7) ** 2)

  x, w, key = _normal(16, (4, 8)), _normal(17, (8, 8), 0.3), jax.random.key(3)
  policy = "c=bf16,sr=matmul+elementwise"
  for fn in (jax.grad,):  # the gradient needs the forward's bits too
    got = jax.jit(fn(precision.autocast(f, policy)))(x, w, rounding_key=key)
    _assert_tree_same(got, jax.jit(fn(precision.autocast(inlined, policy)))(x, w, rounding_key=key))


# ---- invariants that held, over a bank of programs in other people's style ----

W = _normal(10, (16, 16), 0.3)
IDX = jnp.array([0, 3, 5, 9, 15])


def _optax_like_ce(logits, labels):  # custom_jvp softmax + gather, as optax's losses
  return -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[..., None], axis=-1)[..., 0]


PROGRAMS = {
  "gelu_mlp": lambda x: jax.nn.gelu(x @ W) @ W,
  "softplus_silu_relu": lambda x: jax.nn.softplus(x @ W) + jax.nn.relu(x) * jax.nn.silu(x),
  "cond": lambda x: lax.cond(x.sum() > 0, lambda y: jnp.tanh(y @ W), lambda y: jnp.sin(y) * 3, x),
  "switch": lambda x: lax.switch(jnp.int32(1), [jnp.sin, lambda y: y @ W, jnp.cos], x),
  "fori": lambda x: lax.fori_loop(0, 3, lambda i, c: jnp.tanh(c @ W) + 0.1, x),
  "scan": lambda x: lax.scan(lambda c, w: (jnp.tanh(c @ w), c.sum()), x, jnp.stack([W, W * 0.5]))[0],
  "remat_policy": lambda x: jax.checkpoint(
    lambda y: jnp.sin(y @ W) @ W, policy=jax.checkpoint_policies.dots_saveable
  )(x),
  "sort_cumsum_topk": lambda x: jnp.cumsum(jnp.sort(x * 1.1, -1), -1) + lax.top_k(x * 3.3, 16)[0],
  "gather_scatter": lambda x: x.at[..., IDX].add(x[..., IDX] * 1.3).at[..., IDX].max(0.5),
  "pooling": lambda x: (
    lax.reduce_window(x * 1.3, -jnp.inf, lax.max, (2,), (1,), "VALID")
    + lax.reduce_window(x * 1.7, 0.0, lax.add, (2,), (1,), "VALID")
  ),
  "integer_mix": lambda x: x * (jnp.argmax(x) + 1).astype(jnp.float32) + jnp.where(x > 0, x, 0.1 * x),
  "log_softmax_loss": lambda x: _optax_like_ce(x @ W, jnp.argsort(x)[..., :1].squeeze(-1) % 16),
  "cumprod_logsumexp": lambda x: jnp.cumprod(1 + 0.01 * x, -1) * jax.nn.logsumexp(x @ W),
  "jit_inside": lambda x: jax.jit(lambda y: jnp.tanh(y @ W) * 1.7)(x),
  "complex": lambda x: jnp.abs(jnp.fft.rfft(x @ W)) * 1.3,
}


def _all_programs(x):
  return {name: f(x) for name, f in PROGRAMS.items()}


@pytest.mark.slow  # about 12 s; .ci/run runs the slow tests
def test_program_bank_in_one_function():
  """The bank's programs side by side in one function (few compilations; the gradients are in
  the slow per-program test): the float32 policy is the identity, and under bfloat16 every
  output is rounded, differs from float32, and ``vmap`` commutes to one ulp."""
  xs = _normal(11, (3, 16))
  exact = jax.jit(true_float32(jax.vmap(_all_programs)))(xs)  # true float32 products on GPUs too
  _assert_tree_same(jax.jit(jax.vmap(precision.autocast(_all_programs, F32[1])))(xs), exact)
  fmt = "bfloat16"
  auto = precision.autocast(
    _all_programs, precision.Policy(compute=fmt, output=fmt, level=2, accumulation_block=4)
  )
  inner = jax.jit(jax.vmap(auto))(xs)
  outer = jax.jit(precision.autocast(jax.vmap(_all_programs), auto.policy))(xs)
  for name in PROGRAMS:
    assert _representable(inner[name], fmt), name
    assert not np.array_equal(np.asarray(inner[name]), np.asarray(exact[name])), f"{name}: nothing rounded"
    assert_close(outer[name], inner[name], fmt, ulps=1, context=f"{name}: autocast(vmap) vs vmap(autocast)")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_program_bank_invariants(name):
  f = PROGRAMS[name]
  xs = _normal(11, (3, 16))
  loss = lambda g: lambda x: jnp.sum(g(x) ** 2)  # noqa: E731
  exact, exact_grad = jax.jit(true_float32(f))(xs[0]), jax.jit(true_float32(jax.grad(loss(f))))(xs[0])
  for policy in F32:  # the float32 policy is the identity: values and both gradient placements
    _assert_tree_same(jax.jit(precision.autocast(f, policy))(xs[0]), exact, f"{name} {policy}")
    _assert_tree_same(jax.jit(jax.grad(loss(precision.autocast(f, policy))))(xs[0]), exact_grad, name)
    _assert_tree_same(jax.jit(precision.autocast(jax.grad(loss(f)), policy))(xs[0]), exact_grad, name)
  fmt = "bfloat16"
  policy = precision.Policy(compute=fmt, output=fmt, level=2, accumulation_block=4)
  auto = precision.autocast(f, policy)
  one = jax.jit(auto)(xs[0])
  assert _representable(one, fmt) and not np.array_equal(np.asarray(one), np.asarray(exact)), name
  _assert_tree_same(jax.jit(precision.autocast(jax.jit(f), policy))(xs[0]), one, f"{name}: autocast(jit)")
  inner, outer = jax.jit(jax.vmap(auto))(xs), jax.jit(precision.autocast(jax.vmap(f), policy))(xs)
  assert_close(outer, inner, fmt, ulps=1, context=f"{name}: autocast(vmap) vs vmap(autocast)")
  grads = jax.jit(jax.grad(loss(auto)))(xs[0])
  assert np.all(np.isfinite(np.asarray(grads))) and not np.array_equal(
    np.asarray(grads), np.asarray(exact_grad)
  )


def test_typed_keys_through_scan_and_cond_and_dropout():
  def f(x, key):
    def body(carry, _):
      h, k = carry
      k, sub = jax.random.split(k)
      keep = jax.random.bernoulli(sub, 0.8, h.shape)
      return (jnp.where(keep, jnp.tanh(h @ W) / 0.8, 0.0), k), None

    (h, key), _ = lax.scan(body, (x, key), None, length=3)
    noise = lax.cond(h.sum() > 0, lambda k: jax.random.normal(k, (16,)), lambda k: jnp.zeros(16), key)
    return h + noise, key

  x, key = _normal(12, (16,)), jax.random.key(5)
  for policy in F32[1:2]:
    _assert_tree_same(jax.jit(precision.autocast(f, policy))(x, key), jax.jit(f)(x, key))
  out, out_key = jax.jit(precision.autocast(f, "c=bf16"))(x, key)
  _assert_tree_same(out_key, jax.jit(f)(x, key)[1])  # the key is untouched


def test_sharded_programs_on_four_devices():
  devices = cpu_devices(4)  # and every run below on CPU devices: a GPU has one device
  with jax.default_device(devices[0]):
    mesh = jax.sharding.Mesh(np.array(devices).reshape(2, 2), ("data", "model"))
    x, w = _normal(13, (8, 16)), _normal(14, (16, 16), 0.3)

    def dense(x, w):
      return jnp.tanh(x @ w)

    @functools.partial(jax.shard_map, mesh=mesh, in_specs=(P("data", None), P()), out_specs=P())
    def mean_loss(x, w):
      return lax.pmean(jnp.mean(dense(x, w) ** 2), "data")

    for policy in F32[1:2]:
      _assert_tree_same(
        jax.jit(precision.autocast(jax.value_and_grad(mean_loss, argnums=1), policy))(x, w),
        jax.jit(jax.value_and_grad(mean_loss, argnums=1))(x, w),
      )
    policy = "c=bf16"
    shardings = (NamedSharding(mesh, P("data")), NamedSharding(mesh, P(None, "model")))
    sharded = jax.jit(precision.autocast(dense, policy), in_shardings=shardings)
    out = sharded(*[jax.device_put(a, s) for a, s in zip((x, w), shardings)])
    _assert_tree_same(out, jax.jit(precision.autocast(dense, policy))(x, w))

    @functools.partial(jax.shard_map, mesh=mesh, in_specs=(P("data", None), P()), out_specs=P("data", None))
    def per_shard(x, w):
      return dense(x, w)

    _assert_tree_same(jax.jit(precision.autocast(per_shard, policy))(x, w), out)


# ---- library models (slow: each compiles a model several times) ----


def _flax_cnn():
  nn = pytest.importorskip("flax.linen")

  class CNN(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool):
      x = nn.Conv(16, (3, 3))(x)
      x = nn.BatchNorm(use_running_average=not train)(x)
      x = nn.max_pool(nn.relu(x), (2, 2), (2, 2))
      x = nn.Dropout(0.5, deterministic=not train)(x)
      x = nn.LayerNorm()(x.reshape(x.shape[0], -1))
      return nn.Dense(10)(x)

  return CNN()


@pytest.mark.slow
def test_flax_linen_train_step_with_batch_stats_and_dropout():
  model = _flax_cnn()
  x = _normal(20, (4, 8, 8, 3))
  with jax.numpy_dtype_promotion("standard"):  # flax's pooling mixes int and float
    variables = model.init({"params": jax.random.key(0), "dropout": jax.random.key(1)}, x, train=False)

    def loss(params, batch_stats, x, key):
      out, updates = model.apply(
        {"params": params, "batch_stats": batch_stats},
        x,
        train=True,
        mutable=["batch_stats"],
        rngs={"dropout": key},
      )
      return jnp.mean(jax.nn.log_softmax(out)[:, 0]), updates

    args = (variables["params"], variables["batch_stats"], x, jax.random.key(2))
    step = jax.value_and_grad(loss, has_aux=True)
    exact = jax.jit(true_float32(step))(*args)  # the float32 policy's reference (tests/devices.py)
    for policy in F32:
      _assert_tree_same(jax.jit(precision.autocast(step, policy))(*args), exact)
      _assert_tree_same(
        jax.jit(jax.value_and_grad(precision.autocast(loss, policy), has_aux=True))(*args), exact
      )
    mixed = jax.jit(precision.autocast(step, "c=cb16,level=1"))(*args)
  assert jax.tree.structure(mixed) == jax.tree.structure(exact)
  assert not np.array_equal(np.asarray(mixed[0][0]), np.asarray(exact[0][0]))


@pytest.mark.slow
def test_haiku_transform_with_state():
  hk = pytest.importorskip("haiku")  # tested with dm-haiku 0.0.17

  def net(x, is_training):
    y = jax.nn.relu(hk.Conv2D(4, 3)(x))
    y = hk.BatchNorm(True, True, 0.9)(y, is_training)
    y = hk.MaxPool((1, 2, 2, 1), (1, 2, 2, 1), "VALID")(y)
    y = hk.dropout(hk.next_rng_key(), 0.2, hk.Flatten()(y)) if is_training else hk.Flatten()(y)
    return hk.Linear(3)(hk.LayerNorm(-1, True, True)(y))

  with jax.numpy_dtype_promotion("standard"):  # haiku mixes int and float
    transformed = hk.transform_with_state(net)
    x = _normal(21, (2, 8, 8, 3))
    params, state = transformed.init(jax.random.key(1), x, True)

    def loss(params, state, key, x):
      out, new_state = transformed.apply(params, state, key, x, True)
      return jnp.mean(out**2), new_state

    step = jax.grad(loss, has_aux=True)
    args = (params, state, jax.random.key(2), x)
    exact = jax.jit(true_float32(step))(*args)  # the float32 policy's reference (tests/devices.py)
    for policy in F32:
      _assert_tree_same(jax.jit(precision.autocast(step, policy))(*args), exact)
    evaluate = precision.autocast(transformed.apply, "c=bf16", static_argnums=4)
    assert evaluate(params, state, None, x, False)[0].shape == (2, 3)
