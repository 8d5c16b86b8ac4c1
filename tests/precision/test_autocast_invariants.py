"""Invariants of `precision.autocast` over generated programs (metamorphic tests, hypothesis).

A program is a short list of layers applied to an activation ``h`` (``S x D``, or a 0-d
scalar): elementwise and transcendental ops, matmuls, 1-D convolutions, layer norm,
softmax attention, ``scan`` over stacked layers, ``cond``, ``jit`` and a ``vmap`` over rows,
under policies drawn over formats, levels 0-2 and accumulation blocks small enough to chunk.
Each test states one property of the pass's specification (the module docstring of
`precision.autocast`) that must hold for every program, at the precision `docs/invariants.md`
states: two compilations of one program (jit/eager, vmap, scan/unrolled, conv/dot) agree bit for
bit only where XLA computes the same bits; kept-float32 values within
`tolerances.TRANSFORM_EQUALITY`, roundings of them up to a flip (`tests.values.fusion_exposure`).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import precision
from precision import _interpreter, _state, _tracing  # noqa: E402  (the pass, observed)
from precision.testing import assert_same_floats, same_floats
from tests.devices import true_float32
from tests.tolerances import transform_tolerance
from tests.values import assert_equal_up_to_fusion, bits_of, examples, fusion_exposure

S, D, B, LAYERS = 4, 8, 3, 3
SCALAR_OPS = ("tanh", "affine", "square_add", "relu", "gauss", "log1p", "scalar_weight")
VECTOR_OPS = SCALAR_OPS[:-1] + (
  "bias",
  "matmul",
  "conv",
  "layernorm",
  "attention",
  "scan",
  "cond",
  "jit",
  "vmap_rows",
)


def _layer(op, i, h, p):
  """One generated layer: ``h`` to a value of the same shape."""
  w = p.get(f"w{i}")
  if op == "tanh":
    return jnp.tanh(h)
  if op == "affine":
    return h * 1.7 + 0.25
  if op == "square_add":
    return h * h + h
  if op == "relu":
    return jnp.maximum(h, 0.0)
  if op == "gauss":
    return jnp.exp(-h * h)
  if op == "log1p":
    return jnp.log1p(h * h)
  if op == "scalar_weight":
    return h * p[f"a{i}"]
  if op == "bias":
    return h + p[f"b{i}"][None]
  if op == "matmul":
    return h @ w
  if op == "conv":
    spec = ("NWC", "WIO", "NWC")
    return jax.lax.conv_general_dilated(h[None], p[f"k{i}"], (1,), "SAME", dimension_numbers=spec)[0]
  if op == "layernorm":
    mean = jnp.mean(h, axis=-1, keepdims=True)
    var = jnp.mean((h - mean) ** 2, axis=-1, keepdims=True)
    return (h - mean) * jax.lax.rsqrt(var + 1e-5)
  if op == "attention":
    q, k, v = h @ w, h @ p[f"wk{i}"], h @ p[f"wv{i}"]
    return jax.nn.softmax((q @ k.T) * (1 / math.sqrt(D)), axis=-1) @ v
  if op == "scan":
    return jax.lax.scan(lambda c, wl: (jnp.tanh(c @ wl), None), h, p[f"s{i}"])[0]
  if op == "cond":
    return jax.lax.cond(jnp.sum(h) > 0, lambda v: jnp.sin(v) * 2.0, lambda v: jnp.tanh(v) + 0.5, h)
  if op == "jit":
    return jax.jit(lambda v, wj: jnp.tanh(v @ wj))(h, w)
  if op == "vmap_rows":
    return jax.vmap(lambda row, wr: jnp.tanh(row @ wr), in_axes=(0, None))(h, w)
  raise AssertionError(op)


def _params(ops, seed):
  rng = np.random.default_rng(seed)
  normal = lambda *shape, scale=1.0: jnp.asarray(rng.standard_normal(shape).astype(np.float32) * scale)
  p = {}
  for i in range(len(ops)):
    p[f"w{i}"] = normal(D, D, scale=D**-0.5)
    p[f"wk{i}"] = normal(D, D, scale=D**-0.5)
    p[f"wv{i}"] = normal(D, D, scale=D**-0.5)
    p[f"b{i}"] = normal(D)
    p[f"a{i}"] = normal(scale=0.8)
    p[f"k{i}"] = normal(3, D, D, scale=(3 * D) ** -0.5)
    p[f"s{i}"] = normal(2, D, D, scale=D**-0.5)
  return p


def _program(ops):
  def f(x, p):
    h = x
    for i, op in enumerate(ops):
      h = _layer(op, i, h, p)
    return h

  return f


policies = st.builds(
  precision.Policy,
  compute=st.sampled_from(["cbfloat16", "bfloat16", "float16"]),
  level=st.sampled_from([0, 1, 2]),
  accumulation_block=st.sampled_from([4, 16, 1024]),
)
vector_ops = st.lists(st.sampled_from(VECTOR_OPS), min_size=1, max_size=4)
scalar_ops = st.lists(st.sampled_from(SCALAR_OPS), min_size=1, max_size=4)
seeds = st.integers(0, 2**16)


def _case(ops, seed, batch=None, scalar=False):
  shape = () if scalar else (S, D)
  if batch is not None:
    shape = (batch, *shape)
  x = jnp.asarray(np.random.default_rng(seed + 1).standard_normal(shape).astype(np.float32))
  return _program(ops), x, _params(ops, seed)


def _assert_same_up_to_fusion(a, b, fn, policy, *args):
  """``a`` and ``b``, two compilations of ``autocast(fn, policy)(*args)``, agree as
  `docs/invariants.md` states (`tests.values.assert_equal_up_to_fusion`)."""
  exposure = fusion_exposure(fn, policy, *args)
  assert_equal_up_to_fusion(a, b, policy.compute, exposure, transform_tolerance(), f"{policy}")


# ---- vmap, jit and scan commute with the pass ----


@settings(max_examples=examples(12))
@given(ops=st.one_of(vector_ops, scalar_ops), seed=seeds, policy=policies)
def test_vmap_of_autocast_equals_autocast_of_vmap(ops, seed, policy):
  scalar = all(op in SCALAR_OPS for op in ops) and seed % 2 == 0
  f, x, p = _case(ops, seed, batch=B, scalar=scalar)
  axes = (0, None)
  if seed % 3 == 0:  # an ensemble: every example has its own weights (batched products)
    p, axes = jax.tree.map(lambda *a: jnp.stack(a), *(_params(ops, seed + k) for k in range(B))), (0, 0)
  inner = jax.jit(jax.vmap(precision.autocast(f, policy), in_axes=axes))(x, p)
  outer = jax.jit(precision.autocast(jax.vmap(f, in_axes=axes), policy))(x, p)
  _assert_same_up_to_fusion(inner, outer, jax.vmap(f, in_axes=axes), policy, x, p)
  exact = jax.jit(jax.vmap(f, in_axes=axes))(x, p)
  # Something rounds (relu is exact), unless a final relu zeroes every output: then the rounded
  # and float32 results are both 0 and equality shows nothing.
  if set(ops) - {"relu"} and np.any(exact != 0):
    assert not np.array_equal(inner, exact)  # rounding happened


LEVEL0_CB16 = precision.Policy(compute="cbfloat16", level=0, accumulation_block=4)


@settings(max_examples=examples(8))
@given(ops=vector_ops, seed=seeds, policy=policies)
# Was bit-exact and failed on an Intel Xeon: exp(-h^2) * 1.7 + 0.25 is kept float32, and jit
# contracts its multiply-add into an FMA (1 of 32 values 1 float32 ulp apart).
@example(ops=["gauss", "affine"], seed=0, policy=LEVEL0_CB16)
@example(ops=["affine", "square_add", "bias"], seed=1, policy=LEVEL0_CB16)  # bit for bit
def test_jit_of_autocast_equals_autocast(ops, seed, policy):
  f, x, p = _case(ops, seed)
  auto = precision.autocast(f, policy)
  _assert_same_up_to_fusion(jax.jit(auto)(x, p), auto(x, p), f, policy, x, p)


@settings(max_examples=examples(8))
@given(
  ops=st.lists(st.sampled_from([o for o in VECTOR_OPS if o != "scan"]), max_size=3),
  seed=seeds,
  policy=policies,
)
def test_scan_over_layers_equals_the_unrolled_loop(ops, seed, policy):
  body = _program(ops)

  def layer(h, p):  # each layer ends in a rounded activation (see the specification)
    return jnp.tanh(body(h, p) @ p["out"])

  per_layer = [
    dict(_params(ops, seed + n), out=_params(["matmul"], seed + 100 + n)["w0"]) for n in range(LAYERS)
  ]
  stacked = jax.tree.map(lambda *a: jnp.stack(a), *per_layer)
  x = jnp.asarray(np.random.default_rng(seed).standard_normal((S, D)).astype(np.float32))
  scanned = lambda x, ps: jax.lax.scan(lambda h, pl: (layer(h, pl), None), x, ps)[0]

  def unrolled(x, ps):
    for n in range(LAYERS):
      x = layer(x, jax.tree.map(lambda a, n=n: a[n], ps))
    return x

  a = jax.jit(precision.autocast(scanned, policy))(x, stacked)
  b = jax.jit(precision.autocast(unrolled, policy))(x, stacked)
  _assert_same_up_to_fusion(a, b, unrolled, policy, x, stacked)


@pytest.mark.parametrize(
  "ops",
  [
    ["affine", "square_add", "bias"],  # IEEE operations only: bit for bit
    ["gauss", "affine"],  # a kept-float32 output: within TRANSFORM_EQUALITY's float32 ulps
    ["tanh", "bias", "matmul"],  # roundings of approximated / summed values: up to flips
  ],
)
def test_the_comparison_catches_a_missing_rounding_and_a_wrong_format(ops):
  f, x, p = _case(ops, 3)
  exposure = fusion_exposure(f, LEVEL0_CB16, x, p)
  assert exposure.float32 == (ops[0] != "affine") and exposure.flips == (ops[0] == "tanh")
  want = jax.jit(precision.autocast(f, LEVEL0_CB16))(x, p)
  tol = transform_tolerance()
  assert_equal_up_to_fusion(want, want, "cbfloat16", exposure, tol)
  last_unrounded = lambda x, p: _layer(
    ops[-1], len(ops) - 1, precision.autocast(_program(ops[:-1]), LEVEL0_CB16)(x, p), p
  )  # noqa: E731
  other = lambda c: jax.jit(precision.autocast(f, precision.Policy(compute=c, level=0, accumulation_block=4)))  # noqa: E731
  mutants = [
    ("no rounding", jax.jit(f)(x, p)),
    ("bfloat16", other("bfloat16")(x, p)),
    ("float16", other("float16")(x, p)),
  ]
  if exposure.outputs == ("rounded",):
    mutants.append(("last op unrounded", jax.jit(last_unrounded)(x, p)))
  for name, wrong in mutants:
    if exposure.flips and name == "bfloat16":
      # A coarser format's values are cbfloat16 values, at most 2 ulps from the right ones: the
      # same size as a flip carried on. Caught where no flip can happen (the cases above), and
      # by the comparison with float32 (test_autocast_generated, tolerances.GENERATED_PROGRAM).
      assert_equal_up_to_fusion(wrong, want, "cbfloat16", exposure, tol, name)
      continue
    with pytest.raises(AssertionError):
      assert_equal_up_to_fusion(wrong, want, "cbfloat16", exposure, tol, name)


# ---- compute="float32" is the identity ----


@settings(max_examples=examples(10))
@given(ops=vector_ops, seed=seeds, level=st.sampled_from([0, 1, 2]), block=st.sampled_from([4, 1024]))
def test_float32_policy_is_the_identity(ops, seed, level, block):
  f, x, p = _case(ops, seed)
  policy = precision.Policy(compute="float32", level=level, accumulation_block=block)
  # The float32 policy is f with true float32 products (tests/devices.py; on GPUs f runs TF32).
  assert_same_floats(jax.jit(precision.autocast(f, policy))(x, p), jax.jit(true_float32(f))(x, p))
  assert precision.cast_report(f, policy, x, p).total.rounded == 0


# ---- the states the pass assigns are true ----


@settings(max_examples=examples(8))
@given(ops=vector_ops, seed=seeds, policy=policies)
def test_rounded_values_are_representable_and_float32_values_are_float32(ops, seed, policy):
  f, x, p = _case(ops, seed)
  checked = {"rounded": 0, "float32": 0}

  def observe(eqn, inputs, in_tags, outs, out_tags):
    concrete = all(not isinstance(v, jax.core.Tracer) for v in (*inputs, *outs))
    if not concrete or eqn.primitive.name in _state.HIGHER_ORDER:
      return
    for out, tag in zip(outs, out_tags):
      if tag is None or tag.state not in checked:
        continue
      if tag.state == "rounded":  # exactly a value of the compute format
        assert_same_floats(precision.round(out, policy.compute), out, f"{eqn.primitive.name} tagged rounded")
      else:  # the equation evaluated in float32 on the same inputs
        expected = eqn.primitive.bind(*inputs, **eqn.primitive.get_bind_params(eqn.params))
        expected = expected if eqn.primitive.multiple_results else [expected]
        assert any(same_floats(out, e).all() for e in expected), f"{eqn.primitive.name} tagged float32"
      checked[tag.state] += 1

  closed, _, flat = _tracing.trace_fn(f, _tracing.Statics.of(f, (), ()), (x, p), {})
  _interpreter.run(_state.Pass(policy, observer=observe), closed, flat)
  # relu alone is exact on the float32 input (nothing to round); scan and cond bodies run on
  # tracers (nothing concrete to check): a program of only these checks nothing rounded.
  if set(ops) - {"relu", "scan", "cond"}:
    assert checked["rounded"] > 0


# ---- the cast report counts what the jaxpr does ----


def _rounded_in_jaxpr(jaxpr, times=1):
  """Elements rounded by precision_round equations, counted from the jaxpr alone."""
  total = 0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == "precision_round":
      total += times * math.prod(eqn.outvars[0].aval.shape)
    elif name == "scan":
      total += _rounded_in_jaxpr(eqn.params["jaxpr"].jaxpr, times * eqn.params["length"])
    elif name == "cond":
      total += sum(_rounded_in_jaxpr(b.jaxpr, times) for b in eqn.params["branches"])
    elif name == "while":
      total += _rounded_in_jaxpr(eqn.params["body_jaxpr"].jaxpr, times)
    else:
      for key in ("jaxpr", "call_jaxpr"):
        sub = eqn.params.get(key)
        if sub is not None:
          total += _rounded_in_jaxpr(getattr(sub, "jaxpr", sub), times)
  return total


@settings(max_examples=examples(20))
@given(ops=vector_ops, seed=seeds, policy=policies)
def test_cast_report_counts_equal_the_jaxpr(ops, seed, policy):
  f, x, p = _case(ops, seed)
  report = precision.cast_report(f, policy, x, p)
  jaxpr = jax.make_jaxpr(precision.autocast(f, policy))(x, p).jaxpr
  rounded = _rounded_in_jaxpr(jaxpr)
  assert report.total.rounded == rounded
  if set(ops) - {"relu"}:  # relu alone is exact on the float32 input: nothing to round
    assert rounded > 0


# ---- what an op computes decides its treatment, not how it is spelled ----


@settings(max_examples=examples(8))
@given(ops=vector_ops, seed=seeds, policy=policies)
def test_a_1x1_convolution_is_treated_as_the_matmul_it_is(ops, seed, policy):
  f, x, p = _case(ops, seed)

  def conv_spelling(x, p):
    h = f(x, p)
    w = p["w0"]
    return jax.lax.conv_general_dilated(
      h[None], w[None], (1,), "VALID", dimension_numbers=("NWC", "WIO", "NWC")
    )[0]

  dot_spelling = lambda x, p: f(x, p) @ p["w0"]
  a = jax.jit(precision.autocast(conv_spelling, policy))(x, p)
  b = jax.jit(precision.autocast(dot_spelling, policy))(x, p)
  _assert_same_up_to_fusion(a, b, dot_spelling, policy, x, p)


# ---- a weight shared by layers: its gradient does not depend on the layers' boundaries ----

_WRAPPINGS = ("plain", "jit", "checkpoint", "scan", "cond")


def _tied_layers(wrapping: str, depth: int):
  """``depth`` tanh layers of one weight ``w`` (ALBERT, tied layers), written five ways."""

  def layer(h, w):
    return jnp.tanh(h @ w)

  def net(w, x):
    if wrapping == "scan":
      x, _ = jax.lax.scan(lambda h, _: (layer(h, w), None), x, None, length=depth)
    else:
      wrap = {
        "plain": lambda f: f,
        "jit": jax.jit,
        "checkpoint": jax.checkpoint,
        "cond": lambda f: lambda h, w: jax.lax.cond(True, f, lambda h, w: h, h, w),
      }[wrapping]
      for _ in range(depth):
        x = wrap(layer)(x, w)
    return jnp.sum(x**2)

  return net


@settings(max_examples=examples(10), deadline=None)
@given(
  seed=seeds,
  policy=policies,
  depth=st.integers(2, 3),
  wrapping=st.sampled_from(_WRAPPINGS[1:]),
)
def test_a_shared_weight_gets_the_same_gradient_across_jit_checkpoint_scan_and_cond(
  seed, policy, depth, wrapping
):
  """``jax.grad(autocast(f))`` of a weight used by every layer: the weight is rounded once per
  function, not once per jit / checkpoint / cond body or scan iteration, so its gradient is the
  rounding of the sum of the layers' contributions however the layers are wrapped (each body
  rounding its own copy made it a float32 sum of separately rounded parts: 0.0078 apart in
  bfloat16). The gradient is a compute-format value, and equals the unwrapped network's; with
  three layers the float32 sum before that rounding may be added in another order (scan adds the
  iterations' contributions in reverse), moving it by a float32 ulp: the one rounding of it may then
  flip, by one compute-format ulp (of the gradient's scale, the largest flip possible)."""
  k = jax.random.split(jax.random.key(seed), 2)
  x = jax.random.normal(k[0], (5, D))
  w = jax.random.normal(k[1], (D, D)) * 0.5
  grads = {
    name: jax.jit(jax.grad(precision.autocast(_tied_layers(name, depth), policy)))(w, x)
    for name in ("plain", wrapping)
  }
  fmt = policy.compute
  for name, g in grads.items():
    np.testing.assert_array_equal(
      bits_of(np.asarray(g)), bits_of(np.asarray(precision.round(g, fmt))), err_msg=name
    )
  a, b = (np.asarray(grads[n], np.float64) for n in ("plain", wrapping))
  scale = float(np.max(np.abs(a)))
  ulp = scale * 2.0**-fmt.mantissa_bits if scale else 0.0
  if depth == 2:
    np.testing.assert_array_equal(a, b)
  else:  # one rounding of a float32 sum added in another order: at most one flip, one ulp
    assert np.max(np.abs(a - b)) <= ulp
