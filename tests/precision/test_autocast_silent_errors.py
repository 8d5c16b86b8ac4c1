"""Five silent errors of `precision.autocast` and `precision.numerics_report` (issue 27, item 6),
each tested over generated programs of its class (hypothesis), not only the example that found it.

1. A float32 value computed from values of other dtypes (``abs`` of a complex value, ``pow`` with
   an integer exponent array, a ``scatter_add`` at integer indices) was classed as a constant:
   nothing computed from it was rounded, and the cast report hid it.
2. A literal ``finfo(float32).max`` was replaced by the compute format's max wherever the
   policy rounds attention scores, in code without attention too.
3. A Python int argument (a loop count) worked under ``c=f32`` and failed under any 16-bit
   policy (``TracerIntegerConversionError``).
4. `_representable` ignored a custom format's ``subnormals=False`` and saturating infinities.
5. `numerics_report` did not count a ReLU whose input cancels to exactly zero as a flip.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax

import precision
from precision._interpreter import _representable
from precision.formats import FloatFormat
from precision.testing import assert_same_floats, same_floats

S, D = 4, 8
F32 = jnp.float32
BIG = float(np.finfo(np.float32).max)
FORMATS = ("cbfloat16", "bfloat16", "float16")
seeds = st.integers(0, 2**16)


def _assert_representable(out, fmt, context=""):
  for path, leaf in jax.tree_util.tree_leaves_with_path(out):
    if leaf.dtype == jnp.float32:
      rounded = precision.round(leaf, fmt)
      ok = same_floats(np.asarray(rounded), np.asarray(leaf))
      assert ok.all(), (
        f"{context}{jax.tree_util.keystr(path)}: {np.asarray(leaf)[~ok][:4]} not values of {fmt}"
      )


# ---- 1. float32 values computed from complex, integer and 16-bit values are values ----


def _inputs_1(seed):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((S, D)).astype(np.float32)
  z = (rng.standard_normal((S, D)) + 1j * rng.standard_normal((S, D))).astype(np.complex64)
  return {
    "x": jnp.asarray(x),
    "z": jnp.asarray(z),
    "k": jnp.asarray(rng.integers(-3, 4, (S, D)).astype(np.int32)),
    "idx": jnp.asarray(rng.integers(0, D, (S,)).astype(np.int32)),
    "lo": jnp.asarray(rng.standard_normal((S, D)).astype(np.float16)),
  }


# Each source computes a float32 (S, D) value from values that are not float32.
SOURCES_1 = {
  "abs_complex": lambda a: jnp.abs(a["z"]),
  "abs_fft": lambda a: jnp.abs(jnp.fft.fft(a["x"].astype(jnp.complex64), axis=-1)),
  "abs_complex_exp": lambda a: jnp.abs(jnp.exp(a["z"] * 0.5)),
  "real_product": lambda a: jnp.real(a["z"] * a["z"]),
  "pow_int_exponent": lambda a: lax.pow(jnp.full((S, D), 1.5, F32), a["k"]),
  "scatter_count": lambda a: jnp.broadcast_to(jnp.zeros((D,), F32).at[a["idx"]].add(0.3), (S, D)),
  "abs_lax_complex": lambda a: jnp.abs(lax.complex(a["x"], a["x"] * 0.5)),
}
# Ops applied after the source, then one op that computes (so a raw value is rounded too).
CHAIN_1 = {
  "neg": lambda v: -v,
  "relu": lambda v: jnp.maximum(v, 0.2),
  "sort": lambda v: jnp.sort(v, -1),
  "transpose": lambda v: v.T.reshape(S, D),
  "where": lambda v: jnp.where(v > 1.0, v, 0.5),
}
COMPUTE_1 = {
  "scale": lambda v: v * 1.1,
  "shift": lambda v: v + 0.3,
  "tanh": jnp.tanh,
  "exp": lambda v: jnp.exp(-0.1 * v),
  "sqrt": lambda v: jnp.sqrt(jnp.abs(v) + 1.0),
  "cumsum": lambda v: jnp.cumsum(v, -1),
  "sum": lambda v: v + jnp.sum(v, -1, keepdims=True),
  "matmul": lambda v: v @ jnp.full((D, D), 0.1, F32),
  "div": lambda v: v / 3.0,
}


def _program_1(source, chain, last):
  def f(a):
    v = SOURCES_1[source](a)
    for name in chain:
      v = CHAIN_1[name](v)
    return {"v": COMPUTE_1[last](v), "lo": a["lo"] * a["lo"]}

  return f


@settings(max_examples=15, deadline=None)
@given(
  source=st.sampled_from(sorted(SOURCES_1)),
  chain=st.lists(st.sampled_from(sorted(CHAIN_1)), max_size=2),
  last=st.sampled_from(sorted(COMPUTE_1)),
  fmt=st.sampled_from(FORMATS),
  level=st.sampled_from([0, 1, 2]),
  seed=seeds,
)
def test_values_computed_from_other_dtypes_are_rounded(source, chain, last, fmt, level, seed):
  """Every computed value is rounded when every class rounds: the float32 outputs are values of the
  compute format (``output`` is float32, so nothing else rounds them), and the cast report counts
  no constant. Was: ``abs(z) * 1.1`` returned float32 values, reported as a constant."""
  policy = precision.Policy(compute=fmt, level=level, rules={"transcendental": "round", "reduction": "round"})
  f, a = _program_1(source, chain, last), _inputs_1(seed)
  out = jax.jit(precision.autocast(f, policy))(a)
  _assert_representable(out["v"], fmt, f"{source} {chain} {last}: ")
  assert_same_floats(out["lo"], a["lo"] * a["lo"])  # 16-bit values: untouched
  report = precision.cast_report(f, policy, a)
  assert "constant" not in report.to_dict()["by_class"], report


def test_abs_of_a_complex_value_is_an_elementwise_rounding():
  """The issue's example: ``abs`` of a complex value computes its modulus, rounded as elementwise."""
  z = jnp.asarray([1 + 2j, 0.3 - 0.7j], jnp.complex64)
  out = precision.autocast(lambda z: jnp.abs(z) * 1.1, "c=cb16")(z)
  _assert_representable(out, "cbfloat16")
  report = precision.cast_report(lambda z: jnp.abs(z), "c=cb16", z).to_dict()
  assert report["by_primitive"]["abs"]["rounded"] == 2
  # Integer and bool inputs of an exact op select its float32 inputs: still a constant.
  mask = jnp.asarray([True, False])
  report = precision.cast_report(lambda m: jnp.where(m, 0.5, -1.0), "c=cb16", mask).to_dict()
  assert report["by_class"]["constant"]["untouched"] == 2


# ---- 2. finfo(float32).max outside attention keeps float32's value ----

# A sentinel no format swaps and none holds (24 significant bits, beyond every 16-bit max):
# the program with it computes what the program with finfo.max computes, up to the value itself.
SENTINEL = float(np.float32(2.0**100 * (1 + 2.0**-23)))

CHAIN_2 = {
  "tanh": lambda h, w: jnp.tanh(h),
  "exp": lambda h, w: jnp.exp(h),
  "scale": lambda h, w: h * 1.1,
  "matmul": lambda h, w: h @ w,
  "sum": lambda h, w: h - jnp.sum(h, -1, keepdims=True) * 0.1,
}
COMBINE_2 = {  # the literal (+-big) joins the values without arithmetic
  "where": lambda h, big: jnp.where(h > 0.2, h, big),
  "where_swapped": lambda h, big: jnp.where(h > 0.2, big, h),
  "select_full": lambda h, big: lax.select(h > 0.0, h, jnp.full(h.shape, big, F32)),
  "concatenate": lambda h, big: jnp.concatenate([h[:, 1:], jnp.full((S, 1), big, F32)], -1),
  "pad": lambda h, big: jnp.pad(h[:, 1:], ((0, 0), (0, 1)), constant_values=big),
  "scatter": lambda h, big: h.at[:, 0].set(big),
}
AFTER_2 = {  # exact ops and data movement: the literal's value reaches the output unchanged
  "neg": lambda h: -h,
  "abs": jnp.abs,
  "min": lambda h: jnp.broadcast_to(jnp.min(h, -1, keepdims=True), h.shape),
  "max": lambda h: jnp.broadcast_to(jnp.max(h, -1, keepdims=True), h.shape),
  "sort": lambda h: jnp.sort(h, -1),
  "cummin": lambda h: lax.cummin(h, axis=1),
  "relu": lambda h: jnp.maximum(h, 0.0),
  "transpose": lambda h: h.T.reshape(S, D),
}


def _attention(x, w, mask):
  """Attention whose mask bias is ``finfo(float32).min``: the swap still applies here (a fully
  masked row, the first, stays finite at level 2)."""
  q, k, v = x @ w, x @ w.T, x
  bias = lax.select(mask, jnp.full(mask.shape, 0.0, F32), jnp.full(mask.shape, jnp.finfo(F32).min, F32))
  p = jax.nn.softmax(q @ k.T * 0.35 + bias, axis=-1)
  return p @ v


def _program_2(chain, combine, sign, after, big):
  def f(x, w, mask):
    h = x
    for name in chain:
      h = CHAIN_2[name](h, w)
    h = COMBINE_2[combine](h, sign * big)
    for name in after:
      h = AFTER_2[name](h)
    return {"h": h, "attention": _attention(x, w, mask)}

  return f


policies_2 = st.one_of(
  st.builds(precision.Policy, compute=st.sampled_from(FORMATS), level=st.just(2)),
  st.just(precision.Policy.from_config(mixed_precision=True, fp16_type="cbfloat16", precision_opt_level=1)),
)


@settings(max_examples=8, deadline=None)
@given(
  chain=st.lists(st.sampled_from(sorted(CHAIN_2)), max_size=3),
  combine=st.sampled_from(sorted(COMBINE_2)),
  sign=st.sampled_from([1.0, -1.0]),
  after=st.lists(st.sampled_from(sorted(AFTER_2)), max_size=2),
  policy=policies_2,
  seed=seeds,
)
def test_finfo_max_outside_attention_keeps_its_value(chain, combine, sign, after, policy, seed):
  """Where the policy rounds attention scores (level 2, the default job's cbfloat16 override), a
  literal ``+-finfo(float32).max`` in code outside attention is float32's number: the program gives
  what it gives with another number no format holds, that number replaced. Was: the format's max
  (4.29e9 for cbfloat16), a value that appears nowhere. A mask bias of attention in the same program
  is still the format's lowest number (its fully masked row stays finite)."""
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.standard_normal((S, D)).astype(np.float32))
  w = jnp.asarray((rng.standard_normal((D, D)) / math.sqrt(D)).astype(np.float32))
  mask = jnp.asarray(rng.random((S, S)) < 0.7).at[0].set(False)
  got = jax.jit(precision.autocast(_program_2(chain, combine, sign, after, BIG), policy))(x, w, mask)
  ref = jax.jit(precision.autocast(_program_2(chain, combine, sign, after, SENTINEL), policy))(x, w, mask)
  h = np.asarray(ref["h"])
  want = np.where(np.abs(h) == SENTINEL, np.copysign(np.float32(BIG), h), h).astype(np.float32)
  assert_same_floats(got["h"], want, f"{chain} {combine} {sign} {after} {policy}")
  assert_same_floats(got["attention"], ref["attention"])
  assert np.isfinite(np.asarray(got["attention"])).all()


def test_the_issue_example_min_of_where_keeps_float32s_max():
  x = jnp.asarray([25.0, -1.0], F32)
  f = lambda x: jnp.min(jnp.where(x > 0, jnp.exp(x), jnp.finfo(jnp.float32).max))  # noqa: E731
  default_job = precision.Policy.from_config(
    mixed_precision=True, fp16_type="cbfloat16", precision_opt_level=1
  )
  for policy in (default_job, precision.Policy(compute="cbfloat16", level=2)):
    assert float(precision.autocast(f, policy)(x)) == float(f(x)) > 7e10  # exp is kept float32 there
    assert float(precision.autocast(f, policy)(-jnp.abs(x))) == BIG  # no x > 0: the max itself


# ---- 3. Python numbers are passed unchanged under every policy ----


def _step_3(name, h, n, c):
  if name == "loop":
    for _ in range(n):
      h = jnp.tanh(h) * 1.1
    return h
  if name == "python_if":
    return h * 2.0 if c > 0 else h - 1.0
  if name == "scale":
    return h * c
  if name == "shape":
    return h + jnp.ones((n + 1, D), F32)[:1] * 0.5
  if name == "roll":
    return jnp.roll(h, n, axis=-1) + h
  if name == "power":
    return h**n + h
  if name == "math":
    return h * math.sqrt(abs(c) + 1.0)
  raise AssertionError(name)


def _program_3(steps, style):
  def f(x, *rest, **kw):
    if style == "positional":
      n, c = rest
    elif style == "keyword":
      n, c = kw["n"], kw["c"]
    else:
      ((n, c),) = rest
    h = x
    for name in steps:
      h = _step_3(name, h, n, c)
    return h

  def call(g, x, n, c):
    if style == "positional":
      return g(x, n, c)
    if style == "keyword":
      return g(x, n=n, c=c)
    return g(x, (n, c))

  return f, call


all_policies = st.one_of(
  st.builds(precision.Policy, compute=st.sampled_from(FORMATS), level=st.sampled_from([0, 1, 2])),
  st.builds(precision.Policy, compute=st.just("float32"), output=st.sampled_from(["float32", *FORMATS])),
)


@settings(max_examples=30, deadline=None)
@given(
  steps=st.lists(
    st.sampled_from(["loop", "python_if", "scale", "shape", "roll", "power", "math"]), min_size=1, max_size=3
  ),
  style=st.sampled_from(["positional", "keyword", "tuple"]),
  n=st.integers(0, 4),
  c=st.floats(-3.0, 3.0, allow_nan=False, width=32),
  policy=all_policies,
  seed=seeds,
)
def test_python_numbers_are_static_under_every_policy(steps, style, n, c, policy, seed):
  """A Python int or float argument (positional, keyword or inside a tuple) is what it is under the
  float32 policy, which calls the function itself: a number known when tracing. The function works
  under every policy and computes what it computes with the numbers written into it. Was:
  ``TracerIntegerConversionError`` / ``TracerBoolConversionError`` under any 16-bit policy."""
  f, call = _program_3(steps, style)
  x = jnp.asarray(np.random.default_rng(seed).standard_normal((S, D)).astype(np.float32))
  got = call(precision.autocast(f, policy), x, n, c)
  closed = precision.autocast(lambda x: call(f, x, n, c), policy)(x)
  assert_same_floats(got, closed, f"{steps} {style} {n} {c} {policy}")


@settings(max_examples=10, deadline=None)
@given(use=st.sampled_from(["range", "if", "float"]), fmt=st.sampled_from(FORMATS))
def test_an_array_used_as_a_python_value_names_static_argnums(use, fmt):
  """An array argument is traced (a value, as under ``jax.jit``); used as a Python value, JAX's error
  now says how to make it static."""

  def f(x, n):
    if use == "range":
      for _ in range(n):
        x = x * 1.1
    elif use == "if":
      x = x * 2.0 if n > 0 else x
    else:
      x = x * float(n)
    return x

  with pytest.raises((jax.errors.ConcretizationTypeError, jax.errors.TracerIntegerConversionError)) as info:
    precision.autocast(f, f"c={fmt}")(jnp.ones(3, F32), jnp.int32(2))
  assert "static_argnums" in "".join(getattr(info.value, "__notes__", [])), info.value
  got = precision.autocast(f, f"c={fmt}", static_argnums=1)(jnp.ones(3, F32), 2)
  assert_same_floats(got, precision.autocast(f, f"c={fmt}")(jnp.ones(3, F32), 2))


def _loop(x, n):
  for _ in range(n):
    x = x + 1
  return x


def _loop_in_a_tree(scale, batch):
  return _loop(batch["x"] * scale, batch["n"])


@pytest.mark.parametrize(
  ("call", "name", "argument"),
  [
    (lambda: precision.autocast(_loop, "c=bf16")(jnp.ones(2), jnp.int32(2)), "_loop", "n"),
    (lambda: precision.autocast(_loop, "c=bf16")(jnp.ones(2), n=jnp.int32(2)), "_loop", "n"),
    # a Python number before it is not traced: the names still line up with the traced leaves
    (
      lambda: precision.autocast(_loop_in_a_tree, "c=bf16")(2.0, {"x": jnp.ones(2), "n": jnp.int32(2)}),
      "_loop_in_a_tree",
      "batch['n']",
    ),
    (lambda: precision.cast_report(_loop, "c=bf16", jnp.ones(2), jnp.int32(2)), "_loop", "n"),
    (lambda: precision.numerics_report(_loop, "c=bf16", jnp.ones(2), jnp.int32(2)), "_loop", "n"),
  ],
)
def test_jax_errors_name_the_users_function_line_and_argument(call, name, argument):
  """Found by a probe: JAX's error named autocast's own flat function ("tracing the function flat_fn at
  .../precision/_tracing.py:235 ... the argument dynamic[1]"), where ``jax.jit`` names ``f``, its line
  and ``n``. The traced function now carries the user's function's debug info."""
  with pytest.raises((jax.errors.ConcretizationTypeError, jax.errors.TracerIntegerConversionError)) as info:
    call()
  text = str(info.value)
  function = globals()[name]
  line = function.__code__.co_firstlineno
  assert f"the function {name} at {__file__}:{line} for autocast" in text, text
  assert f"depends on the value of the argument {argument}." in text, text
  assert "flat_fn" not in text and "dynamic[" not in text, text
  assert "static_argnums" in "".join(getattr(info.value, "__notes__", [])), info.value


# ---- 4. custom formats: subnormals and saturation ----


@st.composite
def custom_formats(draw):
  e = draw(st.integers(2, 8))
  m = draw(st.integers(1, 12))
  # 8 exponent bits without infinities would need a largest exponent beyond float32's
  specials = draw(st.sampled_from(["ieee", "finite_only"] if e < 8 else ["ieee"]))
  default_bias = 2 ** (e - 1) - 1
  top = 2**e - (2 if specials == "ieee" else 1)
  # a few biases around the default, within float32 (largest exponent <= 127, smallest >= -126)
  bias = draw(st.integers(max(top - 127, default_bias - 3), min(127, default_bias + 3)))
  return FloatFormat(
    "custom",
    e,
    m,
    bias=bias,
    subnormals=draw(st.booleans()),
    specials=specials,
    overflow=draw(st.sampled_from(["inf", "saturate"])),
  )


@st.composite
def edge_values(draw, fmt):
  """float32 values at and near the format's edges: subnormal and normal boundaries, max, infinities."""
  base = draw(
    st.sampled_from(
      [
        2.0 ** (fmt.emin - fmt.mantissa_bits),  # smallest subnormal (if any)
        2.0 ** (fmt.emin - fmt.mantissa_bits) * 3,
        fmt.min_normal,
        fmt.min_normal * (1 - 2.0**-fmt.mantissa_bits),  # largest subnormal
        fmt.min_normal / 2,
        fmt.max,
        fmt.max * (1 + 2.0**-20),
        2.0**fmt.emax * 2 if fmt.emax < 127 else fmt.max,
        2.0**-35,
        1.0 + 2.0**-fmt.mantissa_bits,
        1.0 + 2.0 ** -(fmt.mantissa_bits + 1),
        math.inf,
        0.0,
      ]
    )
  )
  factor = draw(st.sampled_from([1.0, 1.0, 1.0 + 2.0**-23, 1.0 - 2.0**-24, 2.0, 0.5]))
  with np.errstate(over="ignore"):  # beyond float32's max: inf
    value = float(np.float32(base * factor)) if math.isfinite(base) else base
  return draw(st.sampled_from([1.0, -1.0])) * value


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_representable_is_exactly_what_rounding_keeps(data):
  """`_representable(v, fmt)` iff rounding ``v`` to ``fmt`` gives ``v`` back, for random custom
  formats and values at their edges. Was: subnormals below ``min_normal`` of a format without them,
  and infinities of a saturating format (or one without infinities), counted as values."""
  fmt = data.draw(custom_formats())
  values = np.float32(data.draw(st.lists(edge_values(fmt), min_size=1, max_size=24)))
  kept = same_floats(np.asarray(precision.round(values, fmt)), values)
  assert [_representable(float(v), fmt) for v in values] == kept.tolist(), (fmt, values)


COMBINE_4 = {  # exact ops and data movement joining a rounded value and a literal
  "maximum": lambda h, c: jnp.maximum(h, c),
  "minimum": lambda h, c: jnp.minimum(h, c),
  "where": lambda h, c: jnp.where(h > 0, h, c),
  "select_full": lambda h, c: lax.select(h > 0, h, jnp.full(h.shape, c, F32)),
  "concatenate": lambda h, c: jnp.concatenate([h[1:], jnp.full((1,), c, F32)]),
  "pad": lambda h, c: jnp.pad(h[1:], (0, 1), constant_values=c),
}


@settings(max_examples=40, deadline=None)
@given(data=st.data(), combine=st.sampled_from(sorted(COMBINE_4)), seed=seeds)
def test_custom_format_outputs_are_values_of_the_format(data, combine, seed):
  """``autocast`` with ``output`` the custom compute format returns values of that format, whatever
  literal joins a rounded value. Was: ``maximum(tanh(x), 2**-35)`` returned 2^-35 under a format
  without subnormals, which flushes it to zero (the literal counted as rounded, so the output was not
  rounded again); ``where(x > 0, tanh(x), inf)`` returned inf under a saturating format."""
  fmt = data.draw(custom_formats())
  c = data.draw(edge_values(fmt))
  x = jnp.asarray(np.random.default_rng(seed).standard_normal(6).astype(np.float32))
  f = lambda x: COMBINE_4[combine](jnp.tanh(x), c)  # noqa: E731
  out = precision.autocast(f, precision.Policy(compute=fmt, output=fmt))(x)
  _assert_representable(out, fmt, f"{fmt} {combine} {c}: ")


def test_the_issue_example_flushes_under_a_format_without_subnormals():
  nosub = precision.formats.cbfloat16.replace(subnormals=False)
  f = lambda x: jnp.maximum(jnp.tanh(x), 2.0**-35)  # noqa: E731
  out = precision.autocast(f, precision.Policy(compute=nosub, output=nosub))(jnp.asarray([-1.0, 0.5], F32))
  assert float(out[0]) == 0.0


# ---- 5. numerics_report: a tie at zero that changes a decision is a flip ----

_NOT_TIED, _POSITIVE, _NEGATIVE = (lambda d: d != 0), (lambda d: d > 0), (lambda d: d < 0)
# name -> (function of d, {primitive deciding: which float32 elements it decides differently when d is 0})
DECISIONS_5 = {
  "relu": (jax.nn.relu, {"max": _NOT_TIED}),
  "maximum": (lambda d: jnp.maximum(d, 0.0), {"max": _NOT_TIED}),
  "maximum_first": (lambda d: jnp.maximum(0.0, d), {"max": _NOT_TIED}),
  "minimum": (lambda d: jnp.minimum(d, 0.0), {"min": _NOT_TIED}),
  "gt": (lambda d: (d > 0).astype(F32), {"gt": _POSITIVE}),
  "ge": (lambda d: (d >= 0).astype(F32), {"ge": _NEGATIVE}),
  "lt": (lambda d: (d < 0).astype(F32), {"lt": _NEGATIVE}),
  "where": (lambda d: jnp.where(d > 0, 1.0, -1.0), {"gt": _POSITIVE, "select_n": _POSITIVE}),
}


@settings(max_examples=8, deadline=None)
@given(
  decisions=st.lists(st.sampled_from(sorted(DECISIONS_5)), min_size=1, max_size=3, unique=True),
  fmt=st.sampled_from(FORMATS),
  seed=seeds,
)
def test_a_decision_on_a_value_that_cancels_to_zero_is_a_flip(decisions, fmt, seed):
  """``d = x * 1.0 - y * 1.0`` with ``y`` the compute format's rounding of ``x``: exactly 0 in the
  policy run, ``x - y`` (positive, negative or 0) in float32. Each decision on ``d`` counts the
  elements it decides differently: ``max`` / ``min`` with 0 every element float32 did not tie
  (the order of the operands changed: a ReLU's gradient mask), ``d > 0`` those float32 found
  positive, ``d >= 0`` those it found negative. Was: a tie in the policy run was no flip of ``max``."""
  rng = np.random.default_rng(seed)
  x = rng.standard_normal(32).astype(np.float32)
  x[:4] = np.asarray(precision.round(x[:4], fmt))  # some elements cancel in float32 too
  y = np.asarray(precision.round(x, fmt))
  d32 = x - y
  assert np.any(d32 != 0)

  def f(x, y):
    d = x * 1.0 - y * 1.0
    return sum(jnp.sum(DECISIONS_5[name][0](d)) for name in decisions)

  report = precision.numerics_report(f, f"c={fmt}", jnp.asarray(x), jnp.asarray(y))
  want: dict[str, int] = {}
  for name in decisions:
    for primitive, differs in DECISIONS_5[name][1].items():
      want[primitive] = want.get(primitive, 0) + int(np.sum(differs(d32)))
  got = {primitive: sum(r.flips for r in report.rows if r.primitive == primitive) for primitive in want}
  assert got == want, decisions
  assert sum(r.flips for r in report.rows if r.primitive == "sub") == 0


def test_the_issue_example_relu_cancelling_to_zero_flips():
  x, y = jnp.asarray([1 + 2.0**-12, 2.0], F32), jnp.asarray([1.0, 1.0], F32)
  report = precision.numerics_report(lambda x, y: jnp.sum(jax.nn.relu(x * 1.0 - y)), "c=cb16", x, y)
  (relu,) = [r for r in report.rows if r.primitive == "max"]
  # the input cancels to exactly 0 in cbfloat16, which holds 2^-12: a cancellation, not an underflow
  # (it was counted as one: a 2048^2 matmul of O(1) values showed ~1,000 "underflows")
  # counted once, where it happened (the sub); the ReLU's zero came in from it
  assert (relu.flips, relu.flip_distance, relu.underflow, relu.cancelled) == (1, 2.0**-12, 0, 0)
  (sub,) = [r for r in report.rows if r.primitive == "sub"]
  assert (sub.underflow, sub.cancelled) == (0, 1)


def test_float_work_outside_float32_is_listed_as_other_float_not_integer():
  """A float64 program (jax_enable_x64) or 16-bit values the program computes itself escape the
  policy: the cast report lists them as other_float (it called a float64 matmul "integer")."""
  before = jax.config.jax_enable_x64
  jax.config.update("jax_enable_x64", True)  # (restored below: a global switch)
  try:
    x, w = jnp.linspace(0.0, 1.0, 6).reshape(2, 3), jnp.full((3, 2), 0.5)
    assert x.dtype == jnp.float64
    report = precision.cast_report(lambda x, w: jnp.tanh(x @ w) * 2.0, "c=bf16", x, w).to_dict()["by_class"]
  finally:
    jax.config.update("jax_enable_x64", before)
  assert set(report) == {"other_float"} and report["other_float"]["untouched"] == 12
  half = precision.cast_report(lambda x: jnp.tanh(x) * 2, "c=bf16", jnp.ones(4, jnp.bfloat16))
  assert set(half.to_dict()["by_class"]) == {"other_float"}
  ints = precision.cast_report(lambda i: (i * 3) > 4, "c=bf16", jnp.arange(4))
  assert set(ints.to_dict()["by_class"]) == {"integer"}


def test_a_primitive_entered_under_an_unknown_class_is_refused():
  """``PRIMITIVE_CLASSES["sin"] = "elementwize"`` was accepted, and sin then ran unrounded in float32
  (the report called it an unknown primitive)."""
  table = precision.PRIMITIVE_CLASSES
  before = dict(table)
  for bad in ("elementwize", 3, None, "attention_softmax"):
    with pytest.raises(ValueError, match=r"PRIMITIVE_CLASSES\['sin'\] = .*allowed: matmul, elementwise"):
      table["sin"] = bad
    with pytest.raises(ValueError, match="allowed"):
      table.update({"my_op": "elementwise", "sin": bad})
    with pytest.raises(ValueError, match="allowed"):
      table |= {"sin": bad}
  with pytest.raises(TypeError, match="primitive's name"):
    table[3] = "elementwise"
  assert dict(table) == before  # nothing half-written
  x = jnp.array([1.0, 2.0], jnp.float32)
  assert precision.autocast(jnp.sin, "c=cb16")(x).tolist() == precision.round(jnp.sin(x), "cb16").tolist()
