"""The estimate is a function of the computation, not of how the step is written (issue 12, item 1).

Each invariant is checked on several model shapes (small transformers from
`wafer.costmodel.workloads`, traced abstractly).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import pytest

import precision
import wafer
from tests.wafer.costmodel.helpers import sds, unrolled_layers
from wafer.costmodel import EstimateError, TraceError
from wafer.costmodel import workloads as W
from wafer.errors import WaferError

SHAPES = [
  (W.TransformerConfig(layers=4, d_model=128, heads=4, ffn=512, vocab=500, seq=64), 32),
  (W.TransformerConfig(layers=6, d_model=256, heads=8, ffn=1024, vocab=1000, seq=128), 16),
  (
    W.TransformerConfig(
      layers=3, d_model=384, heads=6, ffn=1536, vocab=2000, seq=256, causal=False, positions="rotary"
    ),
    8,
  ),
]
IDS = ["d128", "d256", "d384-rotary"]


def _unrolled_step(cfg: W.TransformerConfig, naming: str):
  """The workloads' train step with the layers in a Python loop instead of ``lax.scan``."""

  layers = unrolled_layers(cfg, naming)

  def loss(params, tokens):  # W.loss_fn with the Python loop in place of the scan
    return W.loss_fn(cfg, params, tokens, layers=layers)

  def step(params, opt_state, tokens):
    value, grads = jax.value_and_grad(loss)(params, tokens)
    params, opt_state = W.adamw_update(grads, opt_state, params)
    return params, opt_state, value

  return step


@pytest.mark.parametrize("mode", ["pipeline", "weight_streaming"])
@pytest.mark.parametrize(("cfg", "batch"), SHAPES, ids=IDS)
@pytest.mark.parametrize("naming", ["indexed", "shared"])
def test_scan_and_unrolled_layers_agree_within_5_percent(cfg, batch, mode, naming):
  fn, args = W.train_example(cfg, batch)
  scanned = wafer.estimate(fn, *args, mode=mode)
  unrolled = wafer.estimate(_unrolled_step(cfg, naming), *args, mode=mode)
  assert scanned.fits and unrolled.fits
  assert unrolled.flops_per_sample == pytest.approx(scanned.flops_per_sample, rel=1e-6)
  assert abs(math.log(unrolled.samples_per_sec / scanned.samples_per_sec)) <= math.log(1.05), (
    scanned.samples_per_sec,
    unrolled.samples_per_sec,
  )
  # layers that share scope names still get one kernel each, like the scan's instances
  per_layer = [k for k in unrolled.kernels if "attn" in k.name]
  assert sum(k.count for k in per_layer) == cfg.layers


@pytest.mark.parametrize("mode", ["auto", "fastest", "pipeline", "weight_streaming"])
@pytest.mark.parametrize(("cfg", "batch"), SHAPES, ids=IDS)
def test_forward_only_is_costed_as_inference_and_never_slower_than_training(cfg, batch, mode):
  fn, args = W.train_example(cfg, batch)
  params, _, tokens = args

  def forward(params, tokens):
    return W.loss_fn(cfg, params, tokens)

  train = wafer.estimate(fn, *args, mode=mode)
  infer = wafer.estimate(forward, params, tokens, mode=mode)
  assert infer.samples_per_sec >= train.samples_per_sec
  assert any("inference" in n for n in infer.notes)
  assert not any("inference" in n for n in train.notes)
  assert infer.flops_per_sample < 0.5 * train.flops_per_sample  # no backward products


def _two_input_step(d_in: int, d_out: int):
  def loss(params, x, labels):
    return jnp.mean(jnp.square(jnp.einsum("bd,df->bf", x, params["w"]) - labels))

  def step(params, opt_state, x, labels):
    grads = jax.grad(loss)(params, x, labels)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), opt_state

  return step


@pytest.mark.parametrize(("batch", "d_in", "d_out"), [(8, 64, 32), (32, 256, 128), (128, 512, 512)])
def test_every_argument_with_the_batch_on_axis_0_is_a_batch_argument(batch, d_in, d_out):
  step = _two_input_step(d_in, d_out)
  params = {"w": sds(d_in, d_out)}
  opt_state = {"m": sds(d_in, d_out), "count": sds(dtype=jnp.int32)}
  x, labels = sds(batch, d_in), sds(batch, d_out)
  default = wafer.estimate(step, params, opt_state, x, labels, mode="weight_streaming")
  explicit = wafer.estimate(step, params, opt_state, x, labels, batch_argnums=(2, 3), mode="weight_streaming")
  assert default.batch_arguments == ("x", "labels") == explicit.batch_arguments
  # forward x @ w and the weight gradient (x is data: no input gradient)
  assert default.flops_per_sample == explicit.flops_per_sample == pytest.approx(2 * 2 * d_in * d_out)
  assert default.samples_per_sec == pytest.approx(explicit.samples_per_sec)
  assert "Batch args:     x, labels" in default.to_text()
  assert default.to_dict()["batch_arguments"] == ["x", "labels"]


@pytest.mark.parametrize(("batch", "d_out"), [(512, 1024), (96, 96), (64, 8)])
def test_a_weight_whose_axis_0_equals_the_batch_is_not_a_batch_argument(batch, d_out):
  """Found by a probe: an inference step ``tanh(x @ w.T)`` with ``w`` of shape ``(batch, d)`` (a
  weight stored output-first) traces with ``w`` doubled along with ``x``, so ``w`` was taken as data:
  the work per sample looked 500x smaller and doubling the batch seemed to raise the rate 72x.
  Doubling ``w`` widens the output on axis 1; data only lengthens axis 0."""

  def infer(w, x):
    return jnp.tanh(x @ w.T)

  w, x = sds(batch, d_out), sds(batch, d_out)
  default = wafer.estimate(infer, w, x)
  explicit = wafer.estimate(infer, w, x, batch_argnums=1)
  assert default.batch_arguments == ("x",) == explicit.batch_arguments
  assert default.flops_per_sample == explicit.flops_per_sample == pytest.approx(2 * batch * d_out)
  assert default.samples_per_sec == pytest.approx(explicit.samples_per_sec)
  why = "beyond axis 0" if d_out != batch else "the step returns"  # (a square w: its shape is the output's)
  assert any(n.startswith(f"w has {batch} on axis 0") and why in n for n in default.notes), default.notes


def _contrastive(w, images, texts):  # CLIP-like: the logits are B x B, both axes made by the batch
  logits = jnp.tanh(images @ w) @ (texts @ w).T
  return -jnp.mean(jnp.diag(jax.nn.log_softmax(logits))), logits


def _time_major(w, x, y):  # a per-sample output with its batch on axis 1
  h = jnp.tanh(x @ w)
  return jnp.mean((h - y) ** 2), jnp.swapaxes(h, 0, 1)


@pytest.mark.parametrize(
  ("step", "args", "batch_arguments"),
  [
    (_contrastive, (sds(128, 128), sds(64, 128), sds(64, 128)), ("images", "texts")),
    (_time_major, (sds(128, 128), sds(64, 16, 128), sds(64, 16, 128)), ("x", "y")),
  ],
  ids=["contrastive", "time-major"],
)
def test_data_whose_outputs_widen_beyond_axis_0_is_still_data(step, args, batch_arguments):
  """A review of the rule above: outputs that the batch widens beyond axis 0 by themselves (a
  contrastive B x B matrix, a time-major output) must not make data look like a weight: doubling
  the other candidates is compared with doubling the last argument alone, not with the batch."""
  default = wafer.estimate(step, *args)
  explicit = wafer.estimate(step, *args, batch_argnums=(1, 2))
  assert default.batch_arguments == batch_arguments == explicit.batch_arguments
  assert default.flops_per_sample == pytest.approx(explicit.flops_per_sample)


def test_per_sample_keys_are_batch_arguments_a_shared_key_is_not():
  def step(params, x, sample_keys, key):
    noise = jax.random.normal(key, x.shape, jnp.float32)
    drop = jax.vmap(lambda k: jax.random.bernoulli(k, 0.9, x.shape[1:]))(sample_keys)
    y = jnp.einsum("bd,df->bf", jnp.where(drop, x + noise, 0.0), params)
    return jax.grad(lambda p: jnp.mean(jnp.einsum("bd,df->bf", x, p) * y))(params)

  r = wafer.estimate(
    step, sds(64, 32), sds(16, 64), jax.random.split(jax.random.key(0), 16), jax.random.key(1)
  )
  assert r.batch_arguments == ("x", "sample_keys")


@pytest.mark.parametrize(("batch", "bad"), [(8, 4), (16, 32)])
def test_a_batch_argument_mismatch_is_an_error_naming_the_argument(batch, bad):
  step = _two_input_step(16, 8)
  args = ({"w": sds(16, 8)}, {}, sds(batch, 16), {"y": sds(bad, 8)})
  with pytest.raises(TraceError, match=rf"labels\['y'\] has axis 0 of size {bad} but x has {batch}") as err:
    wafer.estimate(step, *args, batch_argnums=(2, 3))
  assert isinstance(err.value, WaferError)
  with pytest.raises(EstimateError, match=r"labels.*do not share an axis 0"):
    wafer.estimate(step, args[0], args[1], args[2], {"y": sds(bad, 8), "z": sds(batch, 8)})


@pytest.mark.parametrize("mode", ["pipeline", "weight_streaming"])
@pytest.mark.parametrize(("cfg", "batch"), SHAPES[:2], ids=IDS[:2])
def test_the_rate_changes_smoothly_with_micro_batch_size(cfg, batch, mode):
  fn, args = W.train_example(cfg, batch)
  sizes = [s for s in (1, 2, 4, 8, 16, 32) if batch % s == 0]
  rates = [wafer.estimate(fn, *args, mode=mode, micro_batch_size=s).samples_per_sec for s in sizes]
  for small, big in zip(rates, rates[1:]):
    # doubling the micro-batch at most doubles the rate (fixed costs amortised) and costs < 15 %
    assert big <= 2.05 * small and big >= 0.85 * small, (sizes, rates)


def test_a_step_without_per_sample_work_is_an_error_naming_the_batch_arguments():
  def step(params, x):
    return jax.tree.map(lambda p: p * 0.9, params)  # ignores x

  with pytest.raises(EstimateError, match=r"no work per sample.*\(x\)"):
    wafer.estimate(step, {"w": sds(64, 64)}, sds(8, 64))


def test_a_batch_argument_that_feeds_no_work_is_fine_when_another_does():
  def step(params, x, unused):
    return jax.grad(lambda p: jnp.mean(jnp.einsum("bd,df->bf", x, p)))(params)

  r = wafer.estimate(step, sds(64, 64), sds(8, 64), sds(8, 3))
  assert r.batch_arguments == ("x", "unused") and r.samples_per_sec > 0


@pytest.mark.parametrize("value", ["a string", object()])
def test_an_input_the_model_cannot_cost_is_an_error_naming_it(value):
  def step(params, cfg, x):
    return jnp.sum(jnp.einsum("bd,df->bf", x, params))

  with pytest.raises(TraceError, match=r"cfg\['mode'\] is a (str|object), which the cost model cannot cost"):
    wafer.estimate(step, sds(16, 16), {"mode": value}, sds(4, 16))


@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("system", ["wse2", "wse3"])
def test_fp8_compute_is_costed_at_the_16_bit_rate_and_says_so(fmt, system):
  cfg, batch = SHAPES[0]
  fn, args = W.train_example(cfg, batch)
  fp8 = wafer.estimate(fn, *args, compute_format=fmt, system=system)
  bf16 = wafer.estimate(fn, *args, compute_format="bfloat16", system=system)
  assert fp8.samples_per_sec == pytest.approx(bf16.samples_per_sec)
  assert any(f"compute format {fmt}" in n and "16-bit SIMD rate" in n for n in fp8.notes)
  assert f"compute format {fmt}" in fp8.to_text()


@pytest.mark.parametrize("mode", ["pipeline", "weight_streaming"])
@pytest.mark.parametrize(("cfg", "batch"), SHAPES[:2], ids=IDS[:2])
@pytest.mark.parametrize("policy", ["c=cbfloat16", "c=bfloat16,level=2", "c=float16,level=0"])
def test_autocast_inside_the_step_keeps_the_weights_and_the_estimate(cfg, batch, mode, policy):
  """``grad(autocast(loss))``, how ``wafer run`` builds its step: the roundings autocast inserts
  (``precision_round``) are views of the weights, not new values, so every kernel keeps its
  weights and the estimate is the one of the same step in the policy's compute format."""
  fn, args = W.train_example(cfg, batch)
  params, opt_state, tokens = args
  parsed = precision.Policy.parse(policy)
  loss = precision.autocast(lambda p, t: W.loss_fn(cfg, p, t), parsed)

  def step(params, opt_state, tokens):
    value, grads = jax.value_and_grad(loss)(params, tokens)
    params, opt_state = W.adamw_update(grads, opt_state, params)
    return params, opt_state, value

  plain = wafer.estimate(fn, *args, mode=mode, compute_format=parsed.compute)
  mixed = wafer.estimate(step, params, opt_state, tokens, mode=mode, compute_format=parsed.compute)
  assert sum(k.weight_bytes for k in mixed.kernels) == pytest.approx(
    sum(k.weight_bytes for k in plain.kernels)
  )
  assert mixed.flops_per_sample == pytest.approx(plain.flops_per_sample, rel=1e-6)
  # the same weights and products; the element-wise work may differ (the policy's float32 softmax
  # and reductions, level 1's chunk sums), and the pipeline floorplan follows it
  assert abs(math.log(mixed.samples_per_sec / plain.samples_per_sec)) <= math.log(1.1), (
    plain.samples_per_sec,
    mixed.samples_per_sec,
  )
