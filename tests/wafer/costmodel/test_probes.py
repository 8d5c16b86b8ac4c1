"""Findings of probing the estimate with steps written the way users write them (issue 12, item 1).

Each test is a finding that failed before its fix: the model written two ways, other libraries'
conventions, bad inputs.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import wafer
from tests.wafer.costmodel.helpers import sds
from wafer.costmodel import CALIBRATION, EstimateError
from wafer.costmodel import workloads as W
from wafer.costmodel.hardware import WSE2
from wafer.costmodel.mesh import Machine, gemm_cycles

SHAPES = [
  (W.TransformerConfig(layers=4, d_model=128, heads=4, ffn=512, vocab=500, seq=64), 32),
  (W.TransformerConfig(layers=6, d_model=256, heads=8, ffn=1024, vocab=1000, seq=128), 16),
]
IDS = ["d128", "d256"]


def _per_layer_step(cfg: W.TransformerConfig):
  """The workloads' train step with one parameter dict per layer (a list) in a Python loop, as a
  user writes an unrolled model: the optimizer then runs over ``layers`` times as many arrays."""

  def layers(x, layer_params):
    for p in layer_params:
      x = W._layer(cfg, x, p)
    return x

  def step(params, opt_state, tokens):
    value, grads = jax.value_and_grad(lambda p: W.loss_fn(cfg, p, tokens, layers=layers))(params)
    params, opt_state = W.adamw_update(grads, opt_state, params)
    return params, opt_state, value

  return step


def _per_layer_args(cfg: W.TransformerConfig, args):
  """The stacked example arguments split into a list of per-layer dicts (params and AdamW moments)."""

  def split(tree):
    out = dict(tree)
    out["layers"] = [
      jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), tree["layers"])
      for _ in range(cfg.layers)
    ]
    return out

  params, opt_state, tokens = args
  opt_state = opt_state._replace(mu=split(opt_state.mu), nu=split(opt_state.nu))
  return split(params), opt_state, tokens


@pytest.mark.parametrize(("cfg", "batch"), SHAPES, ids=IDS)
def test_the_pipelined_weight_update_does_not_depend_on_how_the_parameters_are_split(cfg, batch):
  """Layer pipelined, every region updates its own weights at once. Summing every optimizer
  instruction over the whole wafer made the per-layer arrays of a Python loop pay about ``layers``
  times the scan's instructions: 3.2x (d128) and 4.7x (d256) the update time and the loop 2.2x and
  2.1x slower overall (a Flax BERT-style encoder, ``nn.scan`` against its loop at batch 32: 1.78x)."""
  fn, args = W.train_example(cfg, batch)
  scanned = wafer.estimate(fn, *args, mode="pipeline")
  unrolled = wafer.estimate(_per_layer_step(cfg), *_per_layer_args(cfg, args), mode="pipeline")
  assert scanned.fits and unrolled.fits
  assert unrolled.flops_per_sample == pytest.approx(scanned.flops_per_sample, rel=1e-6)
  assert unrolled.details["update_s"] == pytest.approx(scanned.details["update_s"], rel=0.1)
  assert abs(math.log(unrolled.samples_per_sec / scanned.samples_per_sec)) <= math.log(1.05)


def _equinox_mlp(widths):
  eqx = pytest.importorskip("equinox")
  return eqx, eqx.nn.MLP(widths[0], widths[-1], widths[1], len(widths) - 2, key=jax.random.PRNGKey(0))


@pytest.mark.parametrize("widths", [(128, 512, 512, 512, 32)])
def test_an_equinox_module_with_its_activation_function_is_costed(widths):
  """An ``eqx.nn.MLP`` holds its activation (a function) as a pytree leaf; ``eqx.filter_jit`` closes
  over such leaves, and so does the estimate (it raised 'model.activation is a custom_jvp, which the
  cost model cannot cost'). Its products are the plain-JAX MLP's, each layer its own kernel."""
  eqx, model = _equinox_mlp(widths)
  x = jax.ShapeDtypeStruct((32, widths[0]), jax.numpy.float32)

  def step(model, x):
    grads = eqx.filter_grad(lambda m: jax.numpy.mean(jax.vmap(m)(x) ** 2))(model)
    return eqx.apply_updates(model, jax.tree.map(lambda g: -0.1 * g, grads))

  r = wafer.estimate(step, model, x, mode="pipeline")
  assert r.batch_arguments == ("x",) and r.details["training"]
  products = sum(2 * a * b for a, b in zip(widths[:-1], widths[1:]))
  # forward and two backward products per layer, less the first layer's input gradient (x is data)
  assert r.flops_per_sample == pytest.approx(3 * products - 2 * widths[0] * widths[1])
  assert sum(k.count for k in r.kernels if k.flops_per_sample > 0) == len(widths) - 1


@pytest.mark.parametrize("widths", [(64, 256, 256, 64), (128, 512, 512, 512, 32)])
def test_equinox_layers_called_between_their_parents_ops_are_one_kernel_each(widths):
  """``eqx.nn.MLP`` names every layer ``eqx.nn.MLP/eqx.nn.Linear`` and runs its activation in
  ``eqx.nn.MLP`` between them: all layers were one kernel, which runs them one after another on one
  rectangle (layer pipelined 3.7x slower than the same MLP in plain JAX). Returning to the enclosing
  scope leaves the layer's scope, as a new scope does."""
  eqx, model = _equinox_mlp(widths)
  params, static = eqx.partition(model, eqx.is_array)
  x = jax.ShapeDtypeStruct((32, widths[0]), jax.numpy.float32)

  def eqx_step(params, x):
    loss = lambda p: jax.numpy.mean(jax.vmap(eqx.combine(p, static))(x) ** 2)  # noqa: E731
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, jax.grad(loss)(params))

  def plain_step(params, x):
    def loss(p):
      h = x
      for i, layer in enumerate(p.layers):
        h = h @ layer.weight.T + layer.bias[None]
        h = jax.nn.relu(h) if i < len(p.layers) - 1 else h
      return jax.numpy.mean(h**2)

    return jax.tree.map(lambda p, g: p - 0.1 * g, params, jax.grad(loss)(params))

  for mode in ("pipeline", "weight_streaming"):
    a = wafer.estimate(eqx_step, params, x, mode=mode)
    b = wafer.estimate(plain_step, params, x, mode=mode)
    assert a.flops_per_sample == pytest.approx(b.flops_per_sample)
    assert abs(math.log(a.samples_per_sec / b.samples_per_sec)) <= math.log(1.2), (
      mode,
      a.samples_per_sec,
      b.samples_per_sec,
    )


@settings(deadline=None, max_examples=40)
@given(
  inst=st.integers(2, 64),
  m=st.sampled_from([16, 32, 64, 128, 256]),
  k=st.sampled_from([16, 32, 64, 128]),
  n=st.sampled_from([16, 32, 64, 128, 256]),
  side=st.sampled_from([(750, 994), (600, 500), (128, 128)]),
)
def test_more_attention_instances_never_take_fewer_cycles(inst, m, k, n, side):
  """``inst`` independent products (samples x heads) on a rectangle, in the regime where twice as
  many still fit side by side with a PE per element of each one's largest matrix: doubling them
  cannot finish sooner. The groups were capped at ``inst``, so 4 instances paid the fill latency of
  quarter-wafer groups and 8 instances of eighth-wafer ones: a wave of one sample took longer than
  a wave of two (layer pipelined, micro-batch 1 to 2 gave 2.15x the compute rate). (Outside this
  regime, and for one product alone, which takes the single-product path over the whole rectangle,
  the cycles are not monotone: 2 products of 16 x 16 x 128 on 64 x 64 PEs take 240 cycles, 4 take 224.)"""
  assume(2 * inst * max(m * n, m * k, k * n) <= side[0] * side[1])
  machine = Machine(WSE2, CALIBRATION)
  one = gemm_cycles(machine, m, k, n, side[0], side[1], 16, inst).cycles
  two = gemm_cycles(machine, m, k, n, side[0], side[1], 16, 2 * inst).cycles
  assert one <= two


@pytest.mark.parametrize(("cfg", "batch"), SHAPES, ids=IDS)
def test_doubling_the_pipeline_wave_at_most_doubles_the_compute_rate(cfg, batch):
  """Without the weight update (which hid it), the compute rate from wave 1 to 2 was 2.15x (d128)."""
  fn, args = W.train_example(cfg, batch)
  rates = [
    wafer.estimate(fn, *args, mode="pipeline", micro_batch_size=s).compute_samples_per_sec for s in (1, 2, 4)
  ]
  for small, big in zip(rates, rates[1:]):
    assert big <= 2.0 * small * 1.02, rates


@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "e5m2"])
def test_an_8_bit_accumulator_is_an_error_naming_it(fmt):
  """FP8 compute is costed at the 16-bit rate with a note; an FP8 accumulator was accepted silently
  and costed as a 16-bit one. The WSE accumulates in 16 or 32 bits."""
  step = lambda p, x: jax.grad(lambda p: jax.numpy.mean((x @ p) ** 2))(p)  # noqa: E731
  args = jax.ShapeDtypeStruct((16, 8), jax.numpy.float32), jax.ShapeDtypeStruct((32, 16), jax.numpy.float32)
  with pytest.raises(
    wafer.costmodel.EstimateError, match=r"accumulate_format=.*no 8-bit accumulator.*allowed"
  ):
    wafer.estimate(step, *args, accumulate_format=fmt)
  graph = wafer.costmodel.extract(step, args, batch_argnums=(1,), compute_bits=16)
  with pytest.raises(wafer.costmodel.EstimateError, match=r"no 8-bit accumulator"):
    wafer.costmodel.estimate_graph(graph, accumulate_format=fmt)
  assert wafer.estimate(step, *args, accumulate_format="float16").accumulate_format == "float16"


def test_an_accumulator_narrower_than_the_compute_format_is_an_error_naming_both():
  """compute_format="float32" with accumulate_format="float16" was accepted: 32-bit products summed in
  a 16-bit accumulator, a run the WSE does not do."""
  step = lambda p, x: jax.grad(lambda p: jax.numpy.mean((x @ p) ** 2))(p)  # noqa: E731
  args = jax.ShapeDtypeStruct((16, 8), jax.numpy.float32), jax.ShapeDtypeStruct((32, 16), jax.numpy.float32)
  both = r"accumulate_format='f(loat)?16' \(16 bits\) is narrower than compute_format='float32' \(32 bits\)"
  with pytest.raises(wafer.costmodel.EstimateError, match=both + ".*allowed: accumulate_format='float32'"):
    wafer.estimate(step, *args, compute_format="float32", accumulate_format="float16")
  with pytest.raises(wafer.costmodel.EstimateError, match=both):
    wafer.estimate(step, *args, policy="c=f32", accumulate_format="f16")  # the policy's compute format
  graph = wafer.costmodel.extract(step, args, batch_argnums=(1,), compute_bits=32)
  with pytest.raises(wafer.costmodel.EstimateError, match=both):
    wafer.costmodel.estimate_graph(graph, compute_format="float32", accumulate_format="float16")
  ok = wafer.estimate(step, *args, compute_format="bfloat16", accumulate_format="float16")
  assert (ok.compute_format, ok.accumulate_format) == ("bfloat16", "float16")


def test_a_none_argument_the_step_fails_on_is_named_as_a_str_argument_is():
  """`wafer.estimate(step, w, None)` said only "could not trace the step" with the user's TypeError;
  a str argument is named ("y is a str, which the cost model cannot cost")."""
  from wafer.errors import TraceError

  f32 = jax.numpy.float32
  step = lambda w, x, y: jax.grad(lambda w: jax.numpy.mean((x @ w - y) ** 2))(w)  # noqa: E731
  w, x = jax.ShapeDtypeStruct((16, 8), f32), jax.ShapeDtypeStruct((32, 16), f32)
  with pytest.raises(TraceError, match=r"(?s)^y is None, which the cost model cannot cost, and tracing the step "
                     r"failed at .*TypeError: .*allowed: arrays, jax.ShapeDtypeStruct or Python numbers"):  # fmt: skip
    wafer.estimate(step, w, x, None)
  ignored = lambda w, x, unused: jax.grad(lambda w: jax.numpy.mean((x @ w) ** 2))(w)  # noqa: E731
  assert wafer.estimate(ignored, w, x, None).fits  # a None the step does not use is no error


def _sgd(w, x):
  return w - jax.grad(lambda w: jax.numpy.mean(jax.numpy.tanh(x @ w) ** 2))(w)


def _flagged(w, x, train):
  if train:
    x = x * 0.9
  return _sgd(w, x)


def _repeated(w, x, steps):
  for _ in range(steps):
    w = _sgd(w, x)
  return w


@pytest.mark.parametrize(
  ("step", "value", "line"), [(_flagged, True, "if train:"), (_repeated, 3, "for _ in range(steps):")]
)
def test_a_python_flag_or_count_among_the_example_arguments_gets_the_partial_fix(step, value, line):
  """Found by a probe: ``estimate(step, w, x, True)`` where the step does ``if train:`` (or
  ``range(n)``) failed with JAX's error about ``dynamic[2]``; the message now names the argument and
  the fix, the step with the value bound (which then estimates)."""
  import functools
  import re

  from wafer.errors import TraceError

  f32 = jax.numpy.float32
  w, x = jax.ShapeDtypeStruct((16, 8), f32), jax.ShapeDtypeStruct((32, 16), f32)
  name = step.__code__.co_varnames[2]
  fix = re.escape(f"functools.partial({step.__name__}, {name}={value!r})")
  with pytest.raises(TraceError, match=rf"(?s)at .*{re.escape(line)}.*{fix}"):
    wafer.estimate(step, w, x, value)
  assert wafer.estimate(functools.partial(step, **{name: value}), w, x).fits


def _linen_encoder_step(d_model: int, scan: bool, layers: int = 4, heads: int = 4, vocab: int = 500):
  """A Transformers-style Flax linen encoder (einsum attention, an additive mask bias, post-LN) with
  AdamW: its layers in a Python loop or in ``nn.scan``."""
  import flax.linen as nn
  import jax.numpy as jnp
  import optax

  class Layer(nn.Module):
    @nn.compact
    def __call__(self, x, mask):
      def heads_of(t):
        return t.reshape(t.shape[0], t.shape[1], heads, d_model // heads)

      q, k, v = (heads_of(nn.Dense(d_model, name=n)(x)) for n in ("q", "k", "v"))
      scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(d_model // heads)
      scores = scores + jnp.where(mask[:, None, None, :], 0.0, jnp.finfo(jnp.float32).min)
      context = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, -1), v).reshape(x.shape)
      x = nn.LayerNorm()(x + nn.Dense(d_model, name="o")(context))
      return nn.LayerNorm()(x + nn.Dense(d_model)(jax.nn.gelu(nn.Dense(4 * d_model)(x))))

  class Scanned(nn.Module):
    @nn.compact
    def __call__(self, x, mask):
      return Layer()(x, mask), None

  class Model(nn.Module):
    @nn.compact
    def __call__(self, ids, mask):
      x = nn.Embed(vocab, d_model)(ids)
      if scan:
        stack = nn.scan(
          Scanned,
          variable_axes={"params": 0},
          split_rngs={"params": True},
          in_axes=nn.broadcast,
          length=layers,
        )
        x, _ = stack()(x, mask)
      else:
        for _ in range(layers):
          x = Layer()(x, mask)
      return nn.Dense(vocab)(x)

  model, tx = Model(), optax.adamw(1e-3)

  def step(params, opt_state, ids, mask):
    def loss(p):
      logits = model.apply(p, ids, mask)
      return optax.softmax_cross_entropy_with_integer_labels(logits, ids).mean()

    updates, opt_state = tx.update(jax.grad(loss)(params), opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  return model, tx, step


@pytest.mark.slow
@pytest.mark.parametrize(("d_model", "batch"), [(64, 8), (128, 32)])
def test_a_flax_linen_encoder_in_nn_scan_and_in_a_loop_agree_within_5_percent(d_model, batch):
  """Issue 12's scan-vs-unrolled invariant on a model written as Transformers' Flax code is written."""
  import jax.numpy as jnp

  ids, mask = jnp.zeros((batch, 64), jnp.int32), jnp.ones((batch, 64), bool)
  rates = {}
  for scan in (False, True):
    model, tx, step = _linen_encoder_step(d_model, scan)
    params = jax.eval_shape(model.init, jax.random.key(0), ids, mask)
    opt_state = jax.eval_shape(tx.init, params)
    for mode in ("pipeline", "weight_streaming"):
      with jax.numpy_dtype_promotion("standard"):  # optax's bias correction mixes int32 and float
        rates[scan, mode] = wafer.estimate(step, params, opt_state, ids, mask, mode=mode).samples_per_sec
  for mode in ("pipeline", "weight_streaming"):
    assert rates[True, mode] == pytest.approx(rates[False, mode], rel=0.05), mode


# ---- the default batch arguments: a parameter whose axis 0 equals the batch is not data -------------


def _sgd_step(w: Any, x: Any, y: Any) -> Any:
  """The README's step: linear regression through a tanh, one SGD update of ``w``."""
  import jax.numpy as jnp

  def loss(w: Any) -> Any:
    return jnp.mean((jnp.tanh(x @ w) - y) ** 2)

  return w - 1e-3 * jax.grad(loss)(w)


def _scan_step(params: Any, x: Any, y: Any) -> Any:
  """Layers stacked by the caller (axis 0: the layer) and run by ``lax.scan``, one SGD update."""
  import jax.numpy as jnp

  def loss(p: Any) -> Any:
    layer = lambda h, q: (h + jax.nn.gelu(h @ q["w1"]) @ q["w2"], None)  # noqa: E731
    h, _ = jax.lax.scan(layer, x, p)
    return jnp.mean((h - y) ** 2)

  return jax.tree.map(lambda a, g: a - 1e-3 * g, params, jax.grad(loss)(params))


def _same_estimate(step: Any, args: tuple[Any, ...], argnums: tuple[int, ...]) -> Any:
  """The default estimate, checked equal to the one with the right ``batch_argnums`` given."""
  default = wafer.estimate(step, *args)
  explicit = wafer.estimate(step, *args, batch_argnums=argnums)
  assert default.batch_arguments == explicit.batch_arguments
  assert default.samples_per_sec == explicit.samples_per_sec
  assert default.flops_per_sample == explicit.flops_per_sample
  return default


def test_a_weight_with_the_batch_size_on_axis_0_is_not_a_batch_argument():
  """The README's step at batch = width: w was data, 3.05M samples/s at 4096 instead of 53k."""
  args = (sds(64, 64), sds(64, 64), sds(64, 64))
  r = _same_estimate(_sgd_step, args, (1, 2))
  assert r.batch_arguments == ("x", "y")
  assert r.notes[0] == (
    "w has 64 on axis 0 like the batch but the step returns an array of its shape (parameters or their "
    "gradient), so it is not a batch argument; pass batch_argnums= to override"
  )
  assert "w has 64 on axis 0" in r.to_text()
  # one sample more: nothing to decide, the same rate per sample (a step linear in the batch)
  other = wafer.estimate(_sgd_step, sds(64, 64), sds(65, 64), sds(65, 64))
  assert r.samples_per_sec == pytest.approx(other.samples_per_sec, rel=0.05)


def test_layers_stacked_by_the_caller_as_many_as_the_batch_are_not_a_batch_argument():
  """4 scanned layers at batch 4: the stacked params were data (318x the rate), with no note."""
  d = 64
  params = {"w1": sds(4, d, 4 * d), "w2": sds(4, 4 * d, d)}
  r = _same_estimate(_scan_step, (params, sds(4, 16, d), sds(4, 16, d)), (1, 2))
  assert r.batch_arguments == ("x", "y")
  assert any(
    n.startswith("params has 4 on axis 0 like the batch but the step returns arrays") for n in r.notes
  )


def test_a_weight_the_step_cannot_grow_with_the_batch_is_not_a_batch_argument():
  """Not returned (an inference step) but ``x @ w`` does not trace with w's axis 0 doubled too."""
  import jax.numpy as jnp

  def step(w, x):
    return jnp.sum(jnp.tanh(x @ w))

  r = _same_estimate(step, (sds(32, 32), sds(32, 32)), (1,))
  assert r.batch_arguments == ("x",)
  assert any(
    n.startswith("w has 32 on axis 0 like the batch but the step does not trace with its axis 0 doubled")
    for n in r.notes
  )


def test_a_step_with_no_data_is_an_error_naming_what_was_taken_as_the_batch():
  """``step(w, b)``: b (64,) was taken as 64 samples (853 samples/s); b broadcasts against w's axis 1,
  so the step cannot be traced with it doubled. Given explicitly, batch_argnums is obeyed as before."""
  import jax.numpy as jnp

  def step(w, b):
    return w - jax.grad(lambda w: jnp.sum((w + b[None, :]) ** 2))(w)

  with pytest.raises(
    EstimateError, match=r"axis 0 \(64\) of b .* does not trace with it doubled.*batch_argnums="
  ):
    wafer.estimate(step, sds(256, 64), sds(64))
  r = wafer.estimate(step, sds(256, 64), sds(64), batch_argnums=1)
  assert r.batch_arguments == ("b",)
  # the note says why the doubled trace failed, and what to pass if b is not data
  assert any(
    "does not trace with axis 0 of b doubled (TypeError" in n and "all work is assumed linear" in n
    for n in r.notes
  ), r.notes


def test_a_step_that_fixes_its_batch_size_needs_batch_argnums():
  def step(w, x):
    return (x.reshape(4, 2, 8) @ w).sum()

  with pytest.raises(EstimateError, match=r"axis 0 \(4\) of x.*fixes its batch size; pass batch_argnums="):
    wafer.estimate(step, sds(8, 8), sds(4, 16))
  r = wafer.estimate(step, sds(8, 8), sds(4, 16), batch_argnums=1)
  assert any("all work is assumed linear in the batch" in n for n in r.notes)


@pytest.mark.parametrize("value", [1.0, "x", [1.5], (True,), 3])
def test_a_bad_batch_argnums_is_an_estimate_error(value):
  with pytest.raises(
    EstimateError, match=r"batch_argnums=.*; allowed: positions 0..2 of the example arguments"
  ):
    wafer.estimate(_sgd_step, sds(8, 8), sds(4, 8), sds(4, 8), batch_argnums=value)


@settings(max_examples=10, deadline=None)
@given(d=st.sampled_from([8, 16, 32, 64]), batch=st.sampled_from(["d", "2d", "other"]))
def test_linear_regression_gets_the_same_rate_with_default_and_explicit_batch_argnums(d, batch):
  b = {"d": d, "2d": 2 * d, "other": d + 3}[batch]
  r = _same_estimate(_sgd_step, (sds(d, d), sds(b, d), sds(b, d)), (1, 2))
  assert r.batch_arguments == ("x", "y")


def test_the_report_says_when_the_formats_it_names_are_not_the_ones_costed():
  """A step that casts its own operands to bfloat16 runs its products at 16 bits whatever
  ``compute_format`` says; a ``compute_format`` given beside a policy of another format wins. Both
  are said in the notes (before, the report read "float32 operands" for a 16-bit step)."""
  import jax.numpy as jnp

  def cast_step(w, x):
    g = jax.grad(
      lambda w: jnp.sum((x.astype(jnp.bfloat16) @ w.astype(jnp.bfloat16)).astype(jnp.float32) ** 2)
    )(w)
    return w - 1e-3 * g

  r = wafer.estimate(cast_step, sds(64, 64), sds(32, 64), compute_format="float32")
  assert any("16-bit operands, narrower than compute_format float32" in n for n in r.notes), r.notes
  plain = wafer.estimate(_sgd_step, sds(8, 8), sds(4, 8), sds(4, 8), compute_format="float32")
  assert not any("narrower than compute_format" in n for n in plain.notes)
  both = wafer.estimate(_sgd_step, sds(8, 8), sds(4, 8), sds(4, 8), policy="c=f32", compute_format="bfloat16")
  assert any("compute_format bfloat16 given with a policy computing in float32" in n for n in both.notes)
  assert "bfloat16 operands" in both.to_text()


@pytest.mark.parametrize("clock", [0.0, -1.0, float("nan"), float("inf"), "1GHz", True])
def test_a_clock_that_is_not_a_positive_finite_frequency_is_an_error(clock):
  with pytest.raises(EstimateError, match=r"clock_hz=.*; allowed: a positive, finite frequency in Hz"):
    wafer.estimate(_sgd_step, sds(8, 8), sds(4, 8), sds(4, 8), clock_hz=clock)
