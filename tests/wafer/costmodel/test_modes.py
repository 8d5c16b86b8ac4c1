"""Layer-pipelined and weight-streaming estimates: placement, bottleneck, fitting, I/O, data parallel."""

import itertools
import random

import hypothesis
import jax
import jax.numpy as jnp
import pytest
from hypothesis import strategies as st

import precision
import wafer
from tests.wafer.costmodel.helpers import batch_args, mlp_params, mlp_train_step, sds
from wafer.costmodel import CALIBRATION, EstimateError, extract
from wafer.costmodel.hardware import get_system
from wafer.costmodel.mesh import Machine
from wafer.costmodel.pipeline import _lanes
from wafer.costmodel.placement import overlaps, pack
from wafer.costmodel.streaming import supported_micro_batch, supported_micro_batches


def _mlp_estimate(widths, batch, tokens=512, **kwargs):
  step = mlp_train_step(widths)
  kwargs.setdefault("batch_argnums", (1, 2))
  return wafer.estimate(step, mlp_params(widths), *batch_args(batch, tokens, widths[0], widths[-1]), **kwargs)


def _assert_disjoint_and_inside(rects, width, height):
  for r in rects:
    assert 0 <= r.x and 0 <= r.y and r.x + r.width <= width and r.y + r.height <= height, r
  for a, b in itertools.combinations(rects, 2):
    assert not overlaps(a, b), (a, b)


def test_pack_places_every_area_without_overlap():
  rng = random.Random(7)
  for _ in range(30):
    n = rng.randint(1, 40)
    areas = [rng.uniform(1, 4000) for _ in range(n)]
    scale = rng.uniform(0.2, 0.9) * 200 * 150 / sum(areas)
    areas = [a * scale for a in areas]
    rects = pack(areas, 200, 150)
    assert rects is not None
    _assert_disjoint_and_inside(rects, 200, 150)
    assert all(r.area >= a - 1e-9 for r, a in zip(rects, areas))
  assert pack([200 * 150 + 1], 200, 150) is None


def test_pipeline_placement_is_disjoint_on_the_grid_and_the_slowest_kernel_sets_the_rate():
  widths = [256, 256, 2048, 256]  # layer1 and layer2 carry 8x the work of layer0
  r = _mlp_estimate(widths, 64, mode="pipeline")
  assert r.mode == "pipeline" and r.fits
  _assert_disjoint_and_inside(r.placement, *r.grid)
  assert r.active_pes == sum(rect.area for rect in r.placement) <= r.grid[0] * r.grid[1]
  rows = {k.name: k for k in r.kernels}
  assert r.compute_samples_per_sec == pytest.approx(min(k.compute_samples_per_sec for k in r.kernels))
  assert r.samples_per_sec <= min(k.samples_per_sec for k in r.kernels) * (1 + 1e-9)
  # area follows work: the heavy layers get more PEs than the light one
  assert rows["layer1"].active_pes > 2 * rows["layer0"].active_pes
  # a wider bottleneck layer lowers the compute rate (the rate too, unless fabric transfers bound it)
  slower = _mlp_estimate([256, 256, 8192, 256], 64, mode="pipeline")
  assert slower.compute_samples_per_sec < 0.7 * r.compute_samples_per_sec
  assert slower.samples_per_sec <= r.samples_per_sec


def test_a_model_too_big_for_the_wafer_is_reported_not_fitting():
  widths = [64, 65536, 65536, 64]  # 4.3 G parameters: 34 GB of weights and gradients
  r = _mlp_estimate(widths, 8, tokens=16, mode="pipeline")
  assert not r.fits  # no rate: None, never 0 samples/s that a mean over reports would average in
  assert r.samples_per_sec is r.compute_samples_per_sec is r.transmission_samples_per_sec is None
  assert r.step_time_s is r.model_flops_per_sec is r.flops_utilization is r.expected_range is None
  assert r.to_dict()["samples_per_sec"] is None and "Samples/s" not in r.to_text()
  assert "needs" in r.reason and "PEs" in r.reason and "GB" in r.reason
  assert "Does not fit" in r.to_text()
  assert "weight streaming" in r.remedy and "samples/s" in r.remedy  # what would make it fit
  fastest = _mlp_estimate(widths, 8, tokens=16, mode="fastest")
  assert fastest.mode == "weight_streaming" and fastest.fits and fastest.samples_per_sec > 0
  assert "does not fit" in fastest.mode_reason and "needs" in fastest.alternatives["pipeline"]


def test_weight_streaming_io_bound_at_small_batch_compute_bound_at_large():
  widths = [64, 8192, 8192, 8192, 64]  # 135 M parameters, 2048 tokens per sample, small inputs
  small = _mlp_estimate(widths, 1, tokens=2048, mode="weight_streaming")
  large = _mlp_estimate(widths, 256, tokens=2048, mode="weight_streaming")
  assert small.transmission_samples_per_sec < 0.5 * small.compute_samples_per_sec
  assert small.samples_per_sec <= small.transmission_samples_per_sec
  assert small.samples_per_sec < 0.5 * small.compute_samples_per_sec
  assert large.compute_samples_per_sec < large.transmission_samples_per_sec
  # compute bound: the step is the compute plus the layers' pass latencies and the iteration-boundary
  # bubble (MemoryX's optimizer pass)
  d = large.details
  assert d["boundary_s"] > 0 and d["layer_latencies_s"] > 0
  assert large.step_time_s == pytest.approx(
    d["compute_s"] + d["layer_latencies_s"] + d["boundary_s"], rel=0.05
  )
  assert large.samples_per_sec > 3 * small.samples_per_sec
  # forcing small micro-batches streams the weights once per micro-batch
  forced = _mlp_estimate(widths, 256, tokens=2048, mode="weight_streaming", micro_batch_size=1)
  assert forced.micro_batch_size == 1 and forced.details["micro_batches"] == 256
  assert forced.transmission_samples_per_sec < large.transmission_samples_per_sec / 100


def test_num_csx_scales_compute_bound_steps_not_io_bound_ones():
  widths = [64, 8192, 8192, 8192, 64]
  one = _mlp_estimate(widths, 512, tokens=2048, mode="weight_streaming")
  four = _mlp_estimate(widths, 512, tokens=2048, mode="weight_streaming", num_csx=4)
  # the per-system compute shrinks 4x; the MemoryX optimizer bubble at the step boundary does not
  assert 3.6 < one.details["compute_s"] / four.details["compute_s"] <= 4.0
  assert four.details["boundary_s"] == pytest.approx(one.details["boundary_s"])
  latencies = one.details["layer_latencies_s"] - four.details["layer_latencies_s"]  # fewer micro-batches each
  expected = one.step_time_s / (one.step_time_s - 0.75 * one.details["compute_s"] - latencies)
  assert four.samples_per_sec / one.samples_per_sec == pytest.approx(expected, rel=0.1)
  assert four.peak_flops_per_sec == pytest.approx(4 * one.peak_flops_per_sec)
  io_one = _mlp_estimate(widths, 4, tokens=2048, mode="weight_streaming")
  io_four = _mlp_estimate(widths, 4, tokens=2048, mode="weight_streaming", num_csx=4)
  assert io_four.samples_per_sec / io_one.samples_per_sec < 1.5  # every system streams all the weights


def test_wse3_is_faster_than_wse2_for_compute_bound_work():
  widths = [64, 4096, 4096, 64]
  two = _mlp_estimate(widths, 256, tokens=2048, mode="weight_streaming", system="wse2")
  three = _mlp_estimate(widths, 256, tokens=2048, mode="weight_streaming", system="wse3")
  # compute: more PEs (+19 %), twice the 16-bit datapath and ports per PE, instruction setup
  # overlapped by microthreads, at the WSE-3's own clock (Calibration.wse3_clock_hz, 0.85 against
  # the WSE-2's 1.1 GHz); the step itself is mostly the fixed per-step cost, the same on both
  assert (
    1.15 * two.compute_samples_per_sec < three.compute_samples_per_sec < 2.5 * two.compute_samples_per_sec
  )
  assert two.samples_per_sec < three.samples_per_sec


def test_compute_format_and_autocast_unwrapping():
  widths = [64, 2048, 2048, 64]
  cb16 = _mlp_estimate(widths, 64, tokens=2048, mode="weight_streaming")
  fp32 = _mlp_estimate(widths, 64, tokens=2048, mode="weight_streaming", compute_format="float32")
  assert cb16.compute_format == "cbfloat16" and fp32.compute_format == "float32"
  # 16-bit AXPYs into FP32 accumulators run at the write port's 2 per cycle, FP32 at 1 (the fixed
  # instruction setup, the same for both, dilutes the difference on short weight tiles)
  assert fp32.compute_samples_per_sec < 0.9 * cb16.compute_samples_per_sec

  step = mlp_train_step(widths)

  class Policy:
    compute = precision.float32

  class Autocast:  # the shape of precision.autocast's wrapper: .policy and .__wrapped__
    policy = Policy()
    __wrapped__ = staticmethod(step)

    def __call__(self, *args):
      raise AssertionError("estimate must trace the unwrapped function")

  wrapped = wafer.estimate(
    Autocast(),
    mlp_params(widths),
    *batch_args(64, 2048, 64, 64),
    batch_argnums=(1, 2),
    mode="weight_streaming",
  )
  assert wrapped.compute_format == "float32"
  assert wrapped.samples_per_sec == pytest.approx(fp32.samples_per_sec)


@pytest.mark.parametrize("text", ["c=bf16", "c=float32,level=2", "c=fp16,o=f32"])
def test_a_policy_string_sets_the_compute_format(text):
  """``policy="c=bf16"`` was accepted and ignored (the estimate stayed cbfloat16)."""
  widths = [64, 256, 64]
  by_string = _mlp_estimate(widths, 8, tokens=16, policy=text)
  by_policy = _mlp_estimate(widths, 8, tokens=16, policy=precision.Policy.parse(text))
  assert by_string.compute_format == by_policy.compute_format == precision.Policy.parse(text).compute.name
  assert by_string.samples_per_sec == by_policy.samples_per_sec


@pytest.mark.parametrize(
  ("kwargs", "pattern"),
  [
    ({"system": "tpu"}, r"system='tpu'.*allowed: 'wse1', 'wse2', 'wse3'"),
    ({"mode": "fast"}, r"mode='fast'; allowed: 'auto', 'fastest', 'pipeline', 'weight_streaming'"),
    ({"batch_size": 0}, r"batch_size=0; allowed: a positive integer"),
    ({"batch_size": 2.5}, r"batch_size=2.5; allowed: a positive integer"),
    ({"num_csx": 0}, r"num_csx=0; allowed: a positive integer"),
    ({"num_csx": 500}, r"num_csx=500; allowed: 1 to 192 CS-2"),
    ({"num_csx": 2, "mode": "pipeline"}, r"num_csx=2 with mode='pipeline'"),
    # the argument's name, not the params file's key (runconfig.num_csx), which estimate has not seen
    ({"num_csx": 3, "batch_size": 8}, r"batch_size=8: must be a multiple of num_csx=3 \("),
    ({"micro_batch_size": 9, "batch_size": 8}, r"micro_batch_size=9 is larger than the 8 samples per system"),
    ({"compute_format": "float13"}, r"compute_format='float13' is not a float format"),
    ({"rect": (2000, 10)}, r"rect=\(2000, 10\); allowed: 1..750 x 1..994"),
    ({"gemm_algorithm": "magic"}, r"gemm_algorithm='magic'"),
    ({"batch_argnums": 7}, r"batch_argnums=7"),
    ({"policy": "c=bf61"}, r"policy='c=bf61' is not a precision policy: .*Did you mean 'bf16'"),
    ({"policy": 16}, r"policy=16; allowed: a precision.Policy"),
  ],
)
def test_bad_arguments_name_the_argument_the_value_and_what_is_allowed(kwargs, pattern):
  with pytest.raises(ValueError, match=pattern):
    _mlp_estimate([64, 64], 8, tokens=4, **kwargs)
  with pytest.raises(EstimateError):
    _mlp_estimate([64, 64], 8, tokens=4, **kwargs)


def test_needs_example_arguments():
  with pytest.raises(EstimateError, match="example arguments"):
    wafer.estimate(lambda x: x)


def test_batch_size_defaults_to_the_example_and_scales():
  r8 = _mlp_estimate([16, 512, 16], 8, tokens=64, mode="weight_streaming")
  r64 = _mlp_estimate([16, 512, 16], 8, tokens=64, mode="weight_streaming", batch_size=64)
  assert r8.batch_size == 8 and r64.batch_size == 64
  assert r64.flops_per_sample == pytest.approx(r8.flops_per_sample)
  assert r64.samples_per_sec > r8.samples_per_sec  # longer vectors, weights streamed fewer times per sample
  assert r64.step_time_s is not None and jnp.isfinite(r64.step_time_s)
  assert sds(1).shape == (1,)


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(
  widths=st.lists(st.sampled_from([64, 256, 1024, 4096]), min_size=2, max_size=4),
  area=st.integers(1, 400_000),
  acts=st.floats(0.0, 2e8),
)
def test_pipeline_copies_of_a_weight_layout_fit_in_the_rectangle_sram(widths, area, acts):
  graph = extract(
    mlp_train_step(widths),
    (mlp_params(widths), *batch_args(8, 16, widths[0], widths[-1])),
    batch_argnums=(1, 2),
    compute_bits=16,
  )
  machine = Machine(get_system("wse2").chip, CALIBRATION)
  sram = machine.sram_data_bytes
  for kernel in graph.kernels:
    if not kernel.weights:
      continue
    per_copy = kernel.weight_elements() * (graph.state_bytes_per_param() + 4.0)
    copies = _lanes(graph, machine, kernel, area, per_copy + acts)
    assert copies is not None and copies >= 1
    if copies > 1:  # every copy keeps weights, optimizer state and gradient; one more would not fit
      assert copies * per_copy + acts <= area * sram
    assert (copies + 1) * per_copy + acts > area * sram
    assert _lanes(graph, machine, kernel, 2 * area, per_copy + acts) >= copies  # more PEs, never fewer


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(batch=st.integers(1, 3000))
def test_supported_micro_batches_are_the_even_splits_of_the_batch(batch):
  sizes = supported_micro_batches(batch)
  brute = sorted({-(-batch // n) for n in range(1, batch + 1)})  # ceil(batch / n), n = 1 .. batch
  assert sizes == brute
  assert all(d in sizes for d in range(1, batch + 1) if batch % d == 0)  # every divisor
  for mb in sizes:
    n_micro = -(-batch // mb)
    assert (n_micro - 1) * mb < batch <= n_micro * mb  # no micro-batch is empty


@hypothesis.settings(max_examples=80, deadline=None)
@hypothesis.given(batch=st.integers(1, 3000), requested=st.integers(-5, 3100))
def test_the_nearest_supported_size_is_found_without_listing_every_size(batch, requested):
  """`supported_micro_batch` no longer lists every size (2 sqrt(batch) of them: a batch of 10**12
  took 90 s, 2**63 never ended): it equals the nearest of the full list, the larger on a tie."""
  brute = sorted({-(-batch // n) for n in range(1, batch + 1)})
  want = min(brute, key=lambda v: (abs(v - min(max(requested, 1), batch)), -v))
  assert supported_micro_batch(batch, requested) == want


def test_an_absurd_batch_is_answered_not_searched_forever():
  for batch in (10**12, 2**63):
    report = _mlp_estimate([64, 64], 8, tokens=1, mode="weight_streaming", batch_size=batch)
    assert report.fits and 1 <= report.micro_batch_size <= batch and report.samples_per_sec > 0


def test_a_micro_batch_that_does_not_split_evenly_is_replaced_by_the_nearest_even_one():
  assert supported_micro_batch(337, 168) == 169  # the Cerebras docs' example
  report = _mlp_estimate([64, 256, 64], 10, tokens=16, mode="weight_streaming", micro_batch_size=7)
  assert report.micro_batch_size == 5 and report.details["micro_batches"] == 2
  assert any("micro_batch_size=7" in note and "uses 5" in note for note in report.notes)


@pytest.mark.parametrize("mode", ["pipeline", "weight_streaming"])
@pytest.mark.parametrize(
  ("width", "layers", "batch"), [(64, 3, 8), (64, 3, 64), (1024, 2, 8), (2048, 4, 512)]
)
def test_a_cs3_is_never_slower_than_a_cs2_at_one_clock(width, layers, batch, mode):
  """Tiny latency-bound steps too: a product's operand wave crosses the PEs holding its tiles, not
  the idle rest of a larger rectangle (the WSE-3's fabric is 18 % taller than the WSE-2's). At one
  clock (the CS-2 at the WSE-3's): each chip's own clock is a fitted unknown."""
  from wafer.costmodel import CALIBRATION

  shapes = {"w": jax.ShapeDtypeStruct((width, width), jnp.float32)}
  params = [shapes] * layers

  def forward(params, x):
    for layer in params:
      x = jnp.tanh(x @ layer["w"])
    return x

  def step(params, x):
    grads = jax.grad(lambda p: jnp.mean(forward(p, x) ** 2))(params)
    return jax.tree.map(lambda a, g: a - 0.1 * g, params, grads)

  x = jax.ShapeDtypeStruct((batch, width), jnp.float32)
  for fn in (step, forward):
    two = wafer.estimate(fn, params, x, system="wse2", mode=mode, clock_hz=CALIBRATION.wse3_clock_hz)
    three = wafer.estimate(fn, params, x, system="wse3", mode=mode)
    assert three.samples_per_sec >= two.samples_per_sec, (
      fn.__name__,
      two.samples_per_sec,
      three.samples_per_sec,
    )


@pytest.mark.parametrize("mode", ["pipeline", "weight_streaming"])
@pytest.mark.parametrize(("d_model", "seq", "batch"), [(64, 32, 8), (64, 64, 8), (128, 64, 32)])
def test_a_cs3_is_never_slower_than_a_cs2_at_one_clock_for_tiny_transformers(d_model, seq, batch, mode):
  """The workloads' 2-layer transformer train step at sizes where fill latency is most of the step
  (before the wave crossed only the PEs holding tiles, these came out 1-5 % slower on a CS-3).

  The chips are compared at one clock (the CS-2 at the WSE-3's): each chip's clock is a fitted
  unknown (`Calibration.wse3_clock_hz` is below `clock_hz`), so at the fitted clocks a step this
  small, bound by latency rather than by the datapath, is slower on a CS-3."""
  from wafer.costmodel import CALIBRATION
  from wafer.costmodel import workloads as W

  cfg = W.TransformerConfig(
    layers=2, d_model=d_model, heads=d_model // 32, ffn=4 * d_model, vocab=500, seq=seq
  )
  fn, args = W.train_example(cfg, batch)
  clock = CALIBRATION.wse3_clock_hz
  two = wafer.estimate(fn, *args, system="wse2", mode=mode, clock_hz=clock).samples_per_sec
  three = wafer.estimate(fn, *args, system="wse3", mode=mode).samples_per_sec
  assert three >= two, (two, three)
