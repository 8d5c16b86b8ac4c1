"""`precision.numerics_report`: ranking, counts and SQNR against independent float64 NumPy computations."""

import inspect
import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import precision
from precision.testing import assert_same_floats

seeds = st.integers(0, 2**31 - 1)


def _line_of(fn, marker):
  """``file.py:line`` of the line of ``fn`` that contains ``marker``."""
  lines, start = inspect.getsourcelines(fn)
  (offset,) = [i for i, line in enumerate(lines) if marker in line]
  return f"{inspect.getsourcefile(fn).rsplit('/', 1)[-1]}:{start + offset}"


def _sqnr64(x, s):
  x, s = np.asarray(x, np.float64), np.asarray(s, np.float64)
  noise = np.sum((x - s) ** 2)
  return math.inf if noise == 0 else 10 * math.log10(np.sum(s**2) / noise)


def _cancellation(x, y, w):
  a = jnp.tanh(x @ w) * 1.5
  b = jnp.tanh(y @ w) * 1.5
  d = a - b  # the cancellation
  return jnp.sum(jnp.exp(d) * a)


@settings(max_examples=8, deadline=None)
@given(seed=seeds, policy=st.sampled_from(["c=cb16", "c=bf16", "c=f16"]))
def test_catastrophic_cancellation_ranks_first_at_its_line(seed, policy):
  kx, kw, kd = jax.random.split(jax.random.key(seed), 3)
  x = jax.random.normal(kx, (8, 16))
  y = x + 1e-3 * jax.random.normal(kd, (8, 16))  # a and b agree to about 3 digits
  w = jax.random.normal(kw, (16, 16)) / 4
  report = precision.numerics_report(_cancellation, policy, x, y, w)
  top = report.rows[0]
  assert (top.primitive, top.source.rsplit("/", 1)[-1]) == (
    "sub",
    _line_of(_cancellation, "the cancellation"),
  )
  assert top.drop_db > 20  # the format's rounding of a and b is amplified by |a| / |a - b|
  assert all(r.drop_db < top.drop_db for r in report.rows[1:])


def test_rows_in_program_order_follow_the_source_and_its_callbacks_are_unordered(monkeypatch):
  """The report's callbacks are unordered: an ordered callback threads a token through the
  program, and XLA's GPU compiler aborted on `_cancellation`'s (H100, JAX 0.11.2: a CHECK in its
  fusion cost model, with two products sharing an operand). ``order`` is then the equation's
  place in the program, not the arrival order of its callbacks."""
  ordered = []
  callback = jax.debug.callback

  def spy(fn, *args, **kwargs):
    ordered.append(kwargs.get("ordered", False))
    return callback(fn, *args, **kwargs)

  monkeypatch.setattr(jax.debug, "callback", spy)
  kx, kw = jax.random.split(jax.random.key(0))
  x = jax.random.normal(kx, (8, 16))
  w = jax.random.normal(kw, (16, 16)) / 4
  report = precision.numerics_report(_cancellation, "c=bf16", x, x + 1e-3, w)
  assert ordered and not any(ordered)
  rows = report.in_program_order()
  assert [r.order for r in rows] == list(range(len(rows)))
  lines = [int(r.source.rsplit(":", 1)[1]) for r in rows]
  assert lines == sorted(lines) and rows[0].primitive == "dot_general"
  assert [r.primitive for r in rows][-2:] == ["mul", "reduce_sum"]


def test_where_a_value_first_becomes_inf_or_nan_ranks_first():
  # 1e10 and -3e10 are beyond cbfloat16's largest finite value (about 4.3e9): the product
  # overflows to inf and -inf and the sum of the two is NaN, where float32 gives -2e10.
  x = jnp.array([1e4, 2.0, -3e4])
  report = precision.numerics_report(lambda x: jnp.sum(x * 1e6), "c=cb16", x)
  mul, total = report.rows
  assert (mul.primitive, mul.overflow, mul.sqnr_db, mul.drop_db) == ("mul", 2, -math.inf, math.inf)
  # the sum inherits the lost values: it loses nothing itself
  assert (total.primitive, total.nonfinite, total.sqnr_db, total.drop_db) == ("reduce_sum", 1, -math.inf, 0.0)
  assert math.isnan(float(report.outputs)) and "nonfinite" in str(report)
  cleaned = precision.numerics_report(lambda x: jnp.where(jnp.isfinite(x * 1e6), x * 1e6, 0.0), "c=cb16", x)
  (select,) = [r for r in cleaned.rows if r.primitive == "select_n"]
  assert select.drop_db == 0.0 and math.isfinite(select.sqnr_db)  # its inputs lost the values, not it


def test_calls_without_a_float32_counterpart_are_counted_and_shown():
  def f(x):
    y = x * 1.0001  # 1 - 1e-5 rounds up past 1 in cbfloat16: the cond takes the other branch
    return jax.lax.cond(y[0] > 1.0, lambda v: jnp.sin(v) * 2.0, lambda v: jnp.cos(v) * 3.0, y)

  report = precision.numerics_report(f, "c=cb16", jnp.array([1 - 1e-5, 2.0]))
  # the policy run's cos and its product, and the float32 run's sin and its product
  assert report.unmatched == report.to_dict()["unmatched"] == 4
  assert "4 call(s) had no counterpart in the other run" in str(report)
  assert {r.primitive for r in report.rows} == {"mul", "gt"}


@pytest.mark.parametrize("fmt", ["bf16", "cb16"])
def test_a_loop_that_runs_fewer_times_under_the_policy_is_counted(fmt):
  """The float32 run's extra iterations have no counterpart either (they were dropped: 0)."""

  def f(x):
    def body(s):
      i, v, _ = s
      new = v * 0.9 + 0.2
      return i + 1, new, new - v

    return jax.lax.while_loop(lambda s: (s[0] < 100) & (jnp.abs(s[2]) > 1e-6), body, (0, x, jnp.float32(1.0)))

  report = precision.numerics_report(f, f"c={fmt}", jnp.float32(1.0))
  policy_iters, shadow_iters = int(report.outputs[0]), int(f(jnp.float32(1.0))[0])
  assert policy_iters < shadow_iters  # the policy's update reaches 0 sooner
  assert report.unmatched >= 4 * (shadow_iters - policy_iters)  # (mul, add, sub in the body at least)
  assert "had no counterpart in the other run" in str(report)


def test_cancelled_counts_only_zeros_the_equation_made():
  """A zero an input brought (an upstream underflow) is not a cancellation of the equation that
  receives it; a difference of two values equal after rounding is."""
  x = jnp.full((1000,), 1e-4, jnp.float32)
  tiny, scaled = precision.numerics_report(lambda x: (x * x) * 1e4, "c=f16", x).in_program_order()
  assert (tiny.underflow, tiny.cancelled) == (1000, 0)  # 1e-8: below float16's range
  assert (scaled.underflow, scaled.cancelled) == (0, 0)  # 0 * 1e4: the zero came in
  a = jnp.full((8,), 1 + 2.0**-10, jnp.float32)  # a * 3 rounds to 3 in bfloat16 (7 fraction bits)
  rows = precision.numerics_report(lambda a: a * 3.0 - 3.0, "c=bf16", a).in_program_order()
  assert [(r.primitive, r.cancelled) for r in rows] == [("mul", 0), ("sub", 8)]  # 3 * 2**-10 became 0
  products = precision.numerics_report(lambda a, b: (a * a) @ b, "c=f16", x[:4][None], jnp.ones((4, 2)))
  dot = [r for r in products.rows if r.primitive == "dot_general"][0]
  assert dot.cancelled == 0  # its operand underflowed: the whole product inherits
  # an op that keeps the shape but mixes elements is not elementwise: a cumulative sum of the zeros
  (cumsum,) = [
    r
    for r in precision.numerics_report(lambda x: jnp.cumsum(x * x), "c=f16", x).rows
    if r.primitive == "cumsum"
  ]
  assert cumsum.cancelled == 0


def test_float8_e4m3fn_overflow_to_nan_is_an_overflow():
  """float8_e4m3fn has no infinity: a value beyond its max (448) becomes NaN, which is overflow."""
  (mul,) = precision.numerics_report(lambda x: x * 2.0, "c=e4m3", jnp.array([300.0, 1.0])).rows
  assert (mul.overflow, mul.nonfinite) == (1, 0)


def test_bfloat16_values_are_reported_and_integer_selects_are_not():
  xb = jax.random.normal(jax.random.key(3), (5, 8)).astype(jnp.bfloat16)
  report = precision.numerics_report(lambda a: jnp.sum(jnp.exp(a) * 1.5), "c=cb16", xb)
  (exp,) = [r for r in report.rows if r.primitive == "exp"]
  assert exp.elements == 40 and exp.sqnr_db == math.inf  # autocast leaves bfloat16 values alone
  i, j = jnp.arange(5), jnp.arange(5) * 2
  report = precision.numerics_report(
    lambda i, j, x: jnp.where(i > 2, i, j) * jnp.sum(x).astype(jnp.int32), "c=cb16", i, j, jnp.ones(3)
  )
  assert "select_n" not in {r.primitive for r in report.rows}


@settings(max_examples=10, deadline=None)
@given(seed=seeds, exponent=st.integers(-30, -20))
def test_float16_underflow_counts_match_numpy(seed, exponent):
  x = jax.random.normal(jax.random.key(seed), (64,))
  scale = jnp.float32(2.0**exponent)

  def f(x):
    return x * scale

  report = precision.numerics_report(f, "c=f16", x)
  (row,) = report.rows
  shadow = np.asarray(x) * np.float32(2.0**exponent)
  rounded = shadow.astype(np.float16)  # an independent rounding to float16 (NumPy)
  assert row.underflow == int(np.sum((shadow != 0) & (rounded == 0)))
  assert row.subnormal == int(np.sum((rounded != 0) & (np.abs(rounded) < np.float16(2.0**-14))))
  if exponent <= -26:
    assert row.underflow > 0  # the case actually underflows


@settings(max_examples=10, deadline=None)
@given(seed=seeds)
def test_sqnr_agrees_with_a_float64_hand_computation(seed):
  kx, ky = jax.random.split(jax.random.key(seed))
  x = jax.random.normal(kx, (32,))
  y = jax.random.normal(ky, (32,))

  def f(x, y):
    z = x * y
    return z + x

  report = precision.numerics_report(f, "c=bf16", x, y)
  rows = {r.primitive: r for r in report.rows}
  x64, y64 = np.asarray(x, np.float64), np.asarray(y, np.float64)
  bf = ml_dtypes.bfloat16
  z_shadow = (x64 * y64).astype(np.float32)
  z_policy = z_shadow.astype(bf).astype(np.float64)  # round(x * y): the product is exact in float32
  out_shadow = (z_shadow.astype(np.float64) + x64).astype(np.float32)
  out_policy = (z_policy + x64).astype(np.float32).astype(bf)
  assert rows["mul"].sqnr_db == pytest.approx(_sqnr64(z_policy, z_shadow), rel=1e-9)
  assert rows["add"].sqnr_db == pytest.approx(_sqnr64(out_policy, out_shadow), rel=1e-9)
  assert rows["add"].input_sqnr_db == pytest.approx(_sqnr64(z_policy, z_shadow), rel=1e-9)
  assert rows["add"].round_sqnr_db == pytest.approx(_sqnr64(out_shadow.astype(bf), out_shadow), rel=1e-9)
  assert rows["mul"].drop_db == pytest.approx(0.0, abs=1e-9)  # one rounding of an exact value
  assert rows["mul"].sqnr_db < 80  # rounding happened


def _net(w, x):
  h = jnp.maximum(x @ w, 0.0)

  def body(c, wi):
    c = jnp.tanh(c @ wi) + c
    return c, c

  h, _ = jax.lax.scan(body, h, jnp.stack([w, w * 0.5, w * 0.25]))
  h = jax.lax.cond(jnp.sum(h) > 0, lambda v: v * 2.0, lambda v: v - 1.0, h)
  return jnp.mean(jax.checkpoint(lambda v: jax.nn.softmax(v) * v)(h))


@pytest.mark.slow  # over 7 s on the 2-core CI machine; runs in the slow stage
@settings(max_examples=5, deadline=None)
@given(seed=seeds)
def test_value_and_grad_and_scan(seed):
  kw, kx = jax.random.split(jax.random.key(seed))
  w = jax.random.normal(kw, (8, 8)) / 3
  x = jax.random.normal(kx, (4, 8))
  fn = jax.jit(jax.value_and_grad(_net))
  report = precision.numerics_report(fn, "c=cb16", w, x)
  # The report's policy run is autocast's computation, bit for bit.
  for got, want in zip(
    jax.tree.leaves(report.outputs), jax.tree.leaves(precision.autocast(fn, "c=cb16")(w, x))
  ):
    assert_same_floats(got, want)
  scopes = {r.scope for r in report.rows}
  assert any("transpose" in s for s in scopes)  # backward equations are reported
  tanh = [r for r in report.rows if r.primitive == "tanh"]
  assert tanh and all(r.calls == 3 for r in tanh)  # one row per equation, 3 scan iterations
  assert any(math.isfinite(r.sqnr_db) for r in report.rows)  # rounding happened
  assert report.unmatched == 0
  assert [r.drop_db for r in report.rows] == sorted((r.drop_db for r in report.rows), reverse=True)


@pytest.mark.slow  # over 7 s on the 2-core CI machine; runs in the slow stage
@settings(max_examples=5, deadline=None)
@given(seed=seeds)
def test_float32_policy_is_exact_everywhere(seed):
  kw, kx = jax.random.split(jax.random.key(seed))
  w = jax.random.normal(kw, (8, 8)) / 3
  x = jax.random.normal(kx, (4, 8))
  report = precision.numerics_report(jax.value_and_grad(_net), "c=f32", w, x)
  assert len(report.rows) > 10
  for r in report.rows:
    assert (r.sqnr_db, r.drop_db, r.flips, r.overflow, r.underflow) == (math.inf, 0.0, 0, 0, 0), r


def _relu_layer(x, y, z):
  return jnp.sum(jax.nn.relu(x * y - z))  # the relu


def test_flipped_relu_mask_with_its_boundary_distance():
  # x * y = 1 + 2^-11 + 2^-13 rounds to 1.0 in cbfloat16 (9 fraction bits), below z = 1 + 2^-11:
  # the float32 pre-activation is +2^-13, the cbfloat16 one -2^-11. The other elements do not flip.
  x = jnp.array([1 + 2.0**-11 + 2.0**-13, 2.0, 0.5, -1.0])
  y = jnp.ones(4)
  z = jnp.array([1 + 2.0**-11, 1.0, 1.0, 1.0])
  assert float(precision.round(x[0], "cbfloat16")) < float(z[0]) < float(x[0])  # the rounding flips it
  report = precision.numerics_report(_relu_layer, "c=cb16", x, y, z)
  (relu,) = [r for r in report.rows if r.primitive == "max"]
  assert (relu.flips, relu.flip_distance) == (1, 2.0**-13)
  assert relu.source.endswith(_line_of(_relu_layer, "the relu"))
  grads = precision.numerics_report(jax.grad(_relu_layer), "c=cb16", x, y, z)
  assert sum(r.flips for r in grads.rows if r.op_class == "comparison") == 1  # the gradient's mask
  assert grads.rows[0].flips or grads.rows[0].drop_db > 0


def test_views_table_dict_plot_scope(tmp_path, capsys):
  w = jnp.eye(8) * 0.3
  x = jnp.ones((4, 8))

  def f(w, x):
    with jax.named_scope("layer1"):
      h = jnp.tanh(x @ w)
    with jax.named_scope("layer2"):
      return jnp.sum((h - 0.29) ** 2)

  report = precision.numerics_report(f, "c=cb16", w, x)
  report.table(5)
  assert "numerics report" in capsys.readouterr().out
  d = report.to_dict()
  assert len(d["rows"]) == len(report.rows) and d["by_scope"]
  assert {s["scope"] for s in report.by_scope()} == {"layer1", "layer2"}
  assert report.by_scope()[0]["scope"] == "layer2"  # the subtraction near 0.29 loses most
  assert "<table>" in report._repr_html_()
  report.plot(tmp_path / "p.png")
  assert (tmp_path / "p.png").stat().st_size > 1000


def test_module_docstring_example_runs():
  import doctest
  import sys

  result = doctest.testmod(sys.modules["precision.numerics_report"], optionflags=doctest.ELLIPSIS)
  assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("bad", [-1, 1.5, "rows", True])
def test_row_and_depth_counts_are_checked(bad, capsys):
  """A negative count would count from the end (rows[:-1] drops the last row), silently; a
  non-integer gave a bare slicing TypeError."""
  report = precision.numerics_report(lambda x: jnp.sum(jnp.tanh(x) * 3.0), "c=cb16", jnp.arange(4.0))
  for call in (lambda: report.table(bad), lambda: report.by_scope(bad), lambda: report.rich_table(bad)):
    with pytest.raises(ValueError, match=r"(n|depth)=.*; allowed: an int >= 0"):
      call()
  report.table(0)
  assert report.by_scope(0) == report.by_scope(0) and len(report.by_scope(None)) >= 1


def test_a_value_kept_in_float32_beyond_the_formats_max_is_no_overflow():
  """A probe: ``sum(x * x)`` under ``c=f16`` with x = 100 reported ``overflow 1`` on the sum, whose
  1e6 the policy keeps in float32 (finite and exact): float16 has inf, so an overflow is a value that
  became inf; a product that does overflow is still counted, as is e4m3fn's NaN (it has no inf)."""
  kept = precision.numerics_report(lambda x: jnp.sum(x * x), "c=f16", jnp.full(100, 100.0))
  assert {r.primitive: r.overflow for r in kept.rows}["reduce_sum"] == 0
  assert float(kept.outputs) == 1e6
  over = precision.numerics_report(lambda x: x * x, "c=f16", jnp.full(8, 1000.0))
  assert [r.overflow for r in over.rows if r.primitive == "mul"] == [8]
  e4m3 = precision.numerics_report(lambda x: x * x, "c=float8_e4m3fn", jnp.full(4, 100.0))
  assert [r.overflow for r in e4m3.rows if r.primitive == "mul"] == [4]


def test_a_report_with_no_float_equation_plots_without_a_warning(tmp_path):
  """A probe: plotting the report of an integer function warned "No artists with labels found to
  put in legend" (an error under ``filterwarnings = error``)."""
  import warnings

  report = precision.numerics_report(lambda i: i + 1, "c=cb16", jnp.arange(3))
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    report.plot(tmp_path / "empty.png")
  assert (tmp_path / "empty.png").stat().st_size > 0
