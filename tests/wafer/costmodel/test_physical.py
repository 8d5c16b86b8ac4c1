"""Physical sanity of the calibrated cost model over generated workload sizes.

* no estimate beats the chip's dense peak (model FLOP/s <= peak FLOP/s);
* a WSE-3 is never slower than a WSE-2 on the same step (more PEs, twice the matmul datapath per
  PE, more I/O);
* two systems in data parallel are never slower per system than one system on half the batch by
  more than the data-parallel overhead (SwarmX's tree latency per step);
* the uncertainty band a report quotes is the calibrated one and holds the estimate.
"""

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wafer.costmodel import ACCURACY, CALIBRATION, estimate_graph, extract
from wafer.costmodel.workloads import TransformerConfig, train_example


def _graph(layers: int, d: int, seq: int, batch: int):
  cfg = TransformerConfig(layers=layers, d_model=d, heads=max(1, d // 64), ffn=4 * d, vocab=512, seq=seq)
  fn, args = train_example(cfg, batch)
  return extract(fn, args, batch_argnums=(len(args) - 1,), compute_bits=16)


_sizes = st.tuples(
  st.integers(1, 3),  # layers
  st.sampled_from([64, 128, 256, 512]),  # d_model
  st.sampled_from([32, 128, 512]),  # sequence
  st.sampled_from([4, 16, 64]),  # batch per system
)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_sizes)
def test_rates_stay_below_peak_and_a_wse3_is_never_slower_at_one_clock(sizes):
  """Each chip's clock is a fitted unknown; at one clock (the CS-2 at the WSE-3's) the WSE-3's
  larger grid, wider SIMD and ports never make a step slower."""
  graph = _graph(*sizes)
  batch = sizes[3]
  rates = {}
  one_clock = CALIBRATION.replace(clock_hz=CALIBRATION.wse3_clock_hz)
  for system in ("wse2", "wse3"):
    for mode in ("weight_streaming", "pipeline"):
      r = estimate_graph(graph, batch_size=batch, system=system, mode=mode, calibration=one_clock)
      if not r.fits:
        continue
      assert r.samples_per_sec > 0 and math.isfinite(r.samples_per_sec)
      assert r.model_flops_per_sec <= r.peak_flops_per_sec * (1 + 1e-9), (system, mode)
      assert 0 <= r.flops_utilization <= 1 + 1e-9
      rates[system, mode] = r.samples_per_sec
  if ("wse2", "weight_streaming") in rates and ("wse3", "weight_streaming") in rates:
    assert rates["wse3", "weight_streaming"] >= rates["wse2", "weight_streaming"] * (1 - 1e-9)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_sizes, st.sampled_from([2, 4]))
def test_more_systems_are_never_slower_per_system_than_the_dp_overhead(sizes, systems):
  graph = _graph(*sizes)
  per_system = sizes[3]
  one = estimate_graph(graph, batch_size=per_system, system="wse2", mode="weight_streaming")
  many = estimate_graph(
    graph, batch_size=per_system * systems, system="wse2", mode="weight_streaming", num_csx=systems
  )
  assert one.fits and many.fits
  overhead = 2 * math.ceil(math.log2(systems)) * CALIBRATION.swarmx_level_latency_s
  step_one = per_system / one.samples_per_sec
  step_many = per_system * systems / many.samples_per_sec
  assert step_many <= step_one + overhead + 1e-12
  assert many.samples_per_sec <= systems * one.samples_per_sec * (1 + 1e-9)  # no superlinear gain


@pytest.mark.parametrize("system", ["wse2", "wse3"])
def test_the_quoted_range_is_the_calibrated_band(system):
  r = estimate_graph(_graph(2, 128, 128, 16), batch_size=16, system=system, mode="weight_streaming")
  lo, hi = r.expected_range
  assert lo == pytest.approx(r.samples_per_sec * ACCURACY.band[0])
  assert hi == pytest.approx(r.samples_per_sec * ACCURACY.band[1])
  assert lo <= r.samples_per_sec <= hi
  assert f"{100 * ACCURACY.coverage:.0f} %" in r.to_text()


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_sizes, st.floats(0.0, 0.5))
def test_the_per_step_cost_is_paid_once_per_weight_streaming_step_only(sizes, overhead):
  """`Calibration.step_overhead_s` adds exactly itself to a weight-streaming step and nothing to a
  layer-pipelined one (the weights stay on the wafer); the MemoryX bubble grows with the parameters."""
  graph = _graph(*sizes)
  batch = sizes[3]
  steps = {}
  for s in (0.0, overhead):
    calib = CALIBRATION.replace(step_overhead_s=s)
    ws = estimate_graph(graph, batch_size=batch, mode="weight_streaming", calibration=calib)
    pipe = estimate_graph(graph, batch_size=batch, mode="pipeline", calibration=calib)
    steps[s] = (batch / ws.samples_per_sec, pipe.samples_per_sec if pipe.fits else None)
  assert steps[overhead][0] - steps[0.0][0] == pytest.approx(overhead, abs=1e-9)
  assert steps[overhead][1] == steps[0.0][1]


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_sizes, st.floats(1e-4, 1e-2), st.sampled_from([1, 2, 4]))
def test_the_layer_latency_is_paid_by_every_layer_pass_of_every_micro_batch(sizes, latency, n_micro):
  """`Calibration.layer_latency_s` adds ``latency`` per layer pass (forward and backward of each
  layer, and of the embedding and the head) per micro-batch to a weight-streaming step at a fixed
  micro-batch, and nothing to a layer-pipelined one."""
  layers, _, _, batch = sizes
  graph = _graph(*sizes)
  mb = max(1, batch // n_micro)
  n = -(-batch // mb)
  steps = {}
  for t in (0.0, latency):
    calib = CALIBRATION.replace(layer_latency_s=t)
    ws = estimate_graph(
      graph, batch_size=batch, mode="weight_streaming", micro_batch_size=mb, calibration=calib
    )
    pipe = estimate_graph(graph, batch_size=batch, mode="pipeline", calibration=calib)
    steps[t] = (batch / ws.samples_per_sec, pipe.samples_per_sec if pipe.fits else None)
  passes = (steps[latency][0] - steps[0.0][0]) / (latency * n)
  # every layer forward and backward, plus the embedding's and the head's (each one segment); one
  # layer is no repeated block: the whole step is one segment
  assert passes == pytest.approx(2 * layers + 4 if layers > 1 else 2, abs=1e-6)
  assert steps[latency][1] == steps[0.0][1]


@pytest.mark.parametrize("tied", [True, False])
def test_memoryx_updates_each_parameter_once(tied):
  """MemoryX's optimizer pass at the iteration boundary runs over every parameter once: a tied
  embedding, read by the embedding and by the LM head, is one parameter array, so the pass grows by
  ``optimizer_bytes_per_param`` times the step's unique parameters (`Graph.param_elements`), the
  count the arguments hold. Before, the tied table was counted once per kernel reading it."""
  import jax

  from wafer.costmodel.hardware import get_system

  cfg = TransformerConfig(
    layers=2, d_model=64, heads=2, ffn=256, vocab=512, seq=32, max_positions=32, tied_embeddings=tied
  )
  fn, args = train_example(cfg, 8)
  graph = extract(fn, args, batch_argnums=(2,), compute_bits=16)
  unique = sum(math.prod(a.shape) for a in jax.tree.leaves(args[0]))
  assert graph.param_elements == unique
  b_in = get_system("wse2").io_bytes_per_sec
  per_param = 64.0
  boundary = {}
  for bytes_ in (0.0, per_param):
    calib = CALIBRATION.replace(optimizer_bytes_per_param=bytes_)
    r = estimate_graph(graph, batch_size=8, mode="weight_streaming", micro_batch_size=8, calibration=calib)
    boundary[bytes_] = 8 / r.samples_per_sec
  assert boundary[per_param] - boundary[0.0] == pytest.approx(unique * per_param / b_in, rel=1e-6)


def test_a_training_step_that_reads_no_weight_still_pays_the_per_step_cost():
  """A loss linear in a looked-up table (a bag of embeddings): its gradient is a scatter of ones and
  no kernel reads a weight, but the step still updates its parameters on MemoryX and pays the
  weight-streaming step's fixed cost. Before, it was 7.8e9 samples/s."""
  import jax
  import jax.numpy as jnp

  from wafer.costmodel import estimate

  params = {"w": jax.ShapeDtypeStruct((256, 256), jnp.float32)}
  tokens = jax.ShapeDtypeStruct((64,), jnp.int32)

  def step(p, t):
    g = jax.grad(lambda p: jnp.sum(p["w"][t]))(p)
    return jax.tree.map(lambda a, b: a - 1e-3 * b, p, g)

  report = estimate(step, params, tokens, mode="weight_streaming")
  assert report.samples_per_sec <= 64 / CALIBRATION.step_overhead_s * (1 + 1e-9)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_sizes, st.sampled_from([0, 256, 1024, 4096, 2**18]))
def test_the_searched_micro_batch_holds_at_most_the_token_cap_and_a_given_one_is_kept(sizes, cap):
  """`Calibration.max_micro_batch_tokens` caps the compiler's own micro-batch search (``mb * seq``
  tokens, at least one sample); 0 is no cap. A micro-batch the user gives is run as given, over the
  cap too, and the capped search is never faster than the uncapped one."""
  layers, d, seq, batch = sizes
  graph = _graph(*sizes)
  calib = CALIBRATION.replace(max_micro_batch_tokens=cap)
  r = estimate_graph(graph, batch_size=batch, mode="weight_streaming", calibration=calib)
  free = estimate_graph(
    graph, batch_size=batch, mode="weight_streaming", calibration=calib.replace(max_micro_batch_tokens=0)
  )
  assert r.fits and free.fits
  if cap:
    assert r.micro_batch_size * seq <= cap or r.micro_batch_size == 1
  assert r.samples_per_sec <= free.samples_per_sec * (1 + 1e-12)
  given_ = estimate_graph(
    graph, batch_size=batch, mode="weight_streaming", micro_batch_size=batch, calibration=calib
  )
  assert given_.micro_batch_size == batch


def test_the_report_says_when_the_token_cap_decides_the_micro_batch():
  graph = _graph(2, 64, 512, 64)
  calib = CALIBRATION.replace(max_micro_batch_tokens=4096)
  r = estimate_graph(graph, batch_size=64, mode="weight_streaming", calibration=calib)
  assert r.micro_batch_size == 8  # 8 x 512 tokens; memory alone would take all 64
  assert r.details["micro_batch_range"]["token_cap"] == 4096
  assert "at most 4,096 tokens per micro-batch" in r.to_text()
  free = estimate_graph(
    graph, batch_size=64, mode="weight_streaming", calibration=calib.replace(max_micro_batch_tokens=0)
  )
  assert free.micro_batch_size == 64 and "token_cap" not in free.details["micro_batch_range"]
  assert "tokens per micro-batch" not in free.to_text()


def test_a_sample_over_the_token_cap_runs_alone_and_the_report_says_so():
  graph = _graph(1, 64, 512, 16)
  calib = CALIBRATION.replace(max_micro_batch_tokens=256)
  r = estimate_graph(graph, batch_size=16, mode="weight_streaming", calibration=calib)
  assert r.micro_batch_size == 1 and r.details["micro_batch_range"]["token_cap"] == 256
  assert "(one sample, 512 tokens, is over it: one sample per micro-batch)" in r.to_text()


@pytest.mark.parametrize("field", ["max_micro_batch_tokens", "max_lanes"])
def test_a_count_in_the_calibration_is_a_whole_number(field):
  from wafer.costmodel import Calibration

  assert getattr(CALIBRATION.replace(**{field: 4.0}), field) == 4
  assert type(getattr(CALIBRATION.replace(**{field: 4.0}), field)) is int
  with pytest.raises(ValueError, match="allowed: a whole number >= 0"):
    Calibration(**{field: 0.5})
