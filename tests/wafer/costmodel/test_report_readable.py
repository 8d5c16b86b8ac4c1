"""A report a user can read (issue 25, item 6), checked over generated small steps and run settings:
no ``inf`` / ``nan`` anywhere in the text or the JSON (strict JSON that round-trips), the rows' shares
add up to the whole, trivial kernels are folded instead of showing rates far above the model's, and a
model that does not fit has no rate line: it says why and what would make it fit."""

from __future__ import annotations

import functools
import json
import math
import re

import hypothesis
import pytest
from hypothesis import strategies as st

from tests.wafer.costmodel.helpers import batch_args, mlp_params, mlp_train_step
from wafer.costmodel import estimate_graph, extract
from wafer.costmodel import workloads as W
from wafer.costmodel.report import FOLD_SHARE

NOT_A_NUMBER = re.compile(r"\b(inf|infinity|nan)\b", re.IGNORECASE)


@functools.cache
def _mlp(widths: tuple[int, ...], tokens: int):
  return extract(
    mlp_train_step(widths),
    (mlp_params(widths), *batch_args(8, tokens, widths[0], widths[-1])),
    batch_argnums=(1, 2),
    compute_bits=16,
  )


@functools.cache
def _transformer(layers: int, d: int, seq: int, causal: bool):
  cfg = W.TransformerConfig(
    layers=layers, d_model=d, heads=4, ffn=4 * d, vocab=256, seq=seq, max_positions=seq, causal=causal
  )
  fn, args = W.train_example(cfg, 8)
  return extract(fn, args, batch_argnums=(2,), compute_bits=16)


graphs = st.one_of(
  st.builds(
    lambda widths, tokens: _mlp(tuple(widths), tokens),
    st.lists(st.sampled_from([16, 64, 256, 1024, 4096]), min_size=2, max_size=4),
    st.sampled_from([1, 16, 512]),
  ),
  st.builds(
    _transformer,
    st.integers(1, 2),
    st.sampled_from([64, 128]),
    st.sampled_from([16, 128]),
    st.booleans(),
  ),
)
runs = st.fixed_dictionaries(
  {
    "mode": st.sampled_from(["auto", "fastest", "pipeline", "weight_streaming"]),
    "release": st.sampled_from(["2.x", "1.8", "R1.9.1"]),
    "system": st.sampled_from(["wse2", "wse3"]),
    "batch_size": st.sampled_from([1, 8, 96, 1024]),
    "rect": st.sampled_from([None, (40, 30), (8, 6)]),  # small rectangles: many configs do not fit
  }
)


def _check_readable(report) -> None:
  text = report.to_text()
  raw = report.to_json()
  assert not NOT_A_NUMBER.search(text), text
  assert not NOT_A_NUMBER.search(raw)
  data = json.loads(raw, parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))  # strict JSON
  assert data == json.loads(json.dumps(report.to_dict(), allow_nan=False))  # round-trips
  assert data["release"] and data["mode"] in ("pipeline", "weight_streaming") and data["mode_reason"]
  assert f"Release:        {report.release}" in text and report.mode_reason in text
  if report.kernels:
    assert sum(k.time_share for k in report.kernels) == pytest.approx(1.0, abs=1e-6)
    shown = report.table_rows()
    assert sum(k.time_share for k in shown) == pytest.approx(1.0, abs=1e-6)
    assert all(k.time_share >= FOLD_SHARE for k in shown if not k.name.startswith("other:"))
    if report.fits:  # no row of a trivial kernel at rates far above the model's
      for k in shown:
        if k.samples_per_sec is not None:
          assert k.samples_per_sec <= report.samples_per_sec / FOLD_SHARE * (1 + 1e-9)
  if report.fits:
    assert report.samples_per_sec > 0 and math.isfinite(report.samples_per_sec)
    assert re.search(r"^ Samples/s: +[0-9]", text, re.MULTILINE)
    assert data["samples_per_sec"] == pytest.approx(report.samples_per_sec)
  else:
    assert "Samples/s:" not in text and "Tokens/s" not in text and "Model FLOP/s" not in text
    assert not re.search(r"(?<![\d.])0(\.0+)? samples/s", text)  # a rate of 0 (10.0 is a rate)
    assert f"Does not fit in {'layer pipelined' if report.mode == 'pipeline' else 'weight streaming'}" in text
    assert report.reason in text and report.remedy and report.remedy in text
    assert data["samples_per_sec"] is None and data["step_time_s"] is None and data["tokens_per_sec"] is None


@hypothesis.settings(max_examples=30, deadline=None)
@hypothesis.given(graph=graphs, run=runs)
def test_reports_of_generated_steps_are_readable(graph, run):
  report = estimate_graph(graph, **run)
  hypothesis.event("fits" if report.fits else "does not fit")
  hypothesis.event(report.mode)
  _check_readable(report)


def test_the_generated_runs_include_reports_that_do_not_fit():
  """The generators above reach both outcomes in both modes (else the invariants test half)."""
  seen = set()
  for graph in (_mlp((16, 4096, 4096, 16), 512), _transformer(2, 128, 128, True)):
    for mode in ("pipeline", "weight_streaming"):
      for rect in (None, (40, 30)):
        report = estimate_graph(graph, mode=mode, rect=rect, batch_size=1024)
        _check_readable(report)
        seen.add((mode, report.fits))
  assert seen == {(m, f) for m in ("pipeline", "weight_streaming") for f in (True, False)}


@hypothesis.settings(max_examples=15, deadline=None)
@hypothesis.given(
  width=st.sampled_from([8192, 16384]),
  batch=st.sampled_from([64, 256, 512]),
  divisor=st.sampled_from([1, 2, 4]),
  system=st.sampled_from(["wse2", "wse3"]),
)
def test_a_given_micro_batch_that_does_not_fit_is_readable(width, batch, divisor, system):
  graph = _mlp((256, width, width, 256), 2048)
  report = estimate_graph(
    graph, mode="weight_streaming", batch_size=batch, micro_batch_size=batch // divisor, system=system
  )
  _check_readable(report)
  if not report.fits:
    assert report.micro_batch_size == batch // divisor  # kept, not replaced
    assert report.details["over_factor"] > 1 and "deciding_assumption" in report.details


def test_a_model_too_big_to_pipeline_says_what_would_fit():
  report = estimate_graph(_mlp((64, 65536, 65536, 64), 16), mode="pipeline")
  assert not report.fits
  _check_readable(report)
  assert "weight streaming" in report.remedy and "samples/s" in report.remedy
  d = report.details
  assert (
    d["over_factor"] == pytest.approx(d["memory_required_pes"] / d["memory_available_pes"])
    and d["over_factor"] > 1
  )
  assert "optimizer state" in d["deciding_assumption"] and f"x{d['over_factor']:.2f} over" in report.to_text()


def test_trivial_kernels_are_folded_into_one_other_row_named_in_the_text():
  w = W.get_workload("gpt2_small")
  # Batch 448: one micro-batch under every supported JAX, the embedding lookup at 0.16 % of the step.
  # At the workload's batch (112) two plans tie within 1 % (one micro-batch recomputing activations,
  # or six without), and JAX 0.11's gradient keeps one FFN residual fewer than 0.10's, which picks
  # the other plan: the rate is the same, but the embedding's share there is 3 %, not 0.5 %.
  fn, args = w.example(448)
  report = estimate_graph(extract(fn, args, batch_argnums=(2,), compute_bits=16), mode="weight_streaming")
  small = report.folded_kernels()
  assert [k for k in report.kernels if k.time_share < FOLD_SHARE] == small, (
    "a weight-streaming row's rate is its share's"
  )
  assert small, "the example must have small kernels"
  rows = report.table_rows()
  [other] = [k for k in rows if k.name.startswith("other:")]
  assert other.samples_per_sec is None and other.count == sum(k.count for k in small)
  assert f"{len(small)} small kernel" in other.name
  text = report.to_text()
  assert all(k.name in text for k in small)  # named below the table, with no rate
  assert len(rows) == len(report.kernels) - len(small) + 1


def test_a_pipelines_embedding_at_millions_of_samples_per_second_is_folded():
  """Issue 25: GPT-2 small pipelined showed its embedding lookup at 1.5 million samples/s (2.4 % of the
  PEs), a row that limits nothing; it is folded (and named below the table)."""
  w = W.get_workload("gpt2_small")
  fn, args = w.example()
  report = estimate_graph(extract(fn, args, batch_argnums=(2,), compute_bits=16), mode="pipeline")
  fast = [k for k in report.kernels if k.samples_per_sec and k.samples_per_sec > 100 * report.samples_per_sec]
  assert fast and all(k in report.folded_kernels() for k in fast)
  assert all(
    k.samples_per_sec is None or k.samples_per_sec <= 100 * report.samples_per_sec
    for k in report.table_rows()
  )
  _check_readable(report)


@pytest.mark.parametrize("system, rect", [("wse2", None), ("wse3", None), ("wse3", (40, 40))])
def test_a_model_that_does_not_fit_is_told_what_would_give_it_room(system, rect):
  """The remedy of a step no micro-batch fits: a chip with more SRAM only when there is one (not on a
  WSE-3), and the whole wafer when ``rect=`` gave a smaller rectangle."""
  import dataclasses

  import wafer

  seq = 2048 if rect else 2**22  # on the whole wafer: one sample of 4M tokens keeps too much
  cfg = dataclasses.replace(W.GPT2_SMALL, layers=2, seq=seq, max_positions=seq)
  fn, args = W.train_example(cfg, 2)
  report = wafer.estimate(fn, *args, system=system, mode="weight_streaming", rect=rect)
  assert not report.fits and report.details.get("largest_fitting_micro_batch") is None
  assert report.remedy.startswith("no micro-batch fits")
  assert ("(wse3)" in report.remedy) == (system != "wse3" and rect is None), report.remedy
  assert ("larger rect=" in report.remedy) == (rect is not None), report.remedy


def test_the_micro_batch_line_reads_as_english_for_one_feasible_size_and_every_kth_boundary():
  """It said "1 is the fastest of 1 feasible sizes (1-1), which give 9.56-9.56 samples/s", and
  "every 3th boundary"."""
  from wafer.costmodel.streaming import ordinal

  graph = _mlp((64, 64, 64), 1)
  text = estimate_graph(graph, batch_size=1, mode="weight_streaming").to_text()
  line = next(x for x in text.splitlines() if "Micro-batch:" in x)
  assert "the one feasible size" in line and "of 1 feasible" not in line, line
  assert [ordinal(n) for n in (1, 2, 3, 4, 11, 13, 22, 101, 111)] == [
    "1st", "2nd", "3rd", "4th", "11th", "13th", "22nd", "101st", "111th"
  ]  # fmt: skip


def test_a_pipelined_rate_set_by_the_input_io_says_so():
  """In layer-pipelined mode the system's input I/O can set the rate, below every kernel's; the
  report showed a Transmission rate that no row had and said nothing."""
  import jax
  import jax.numpy as jnp

  import wafer

  def infer(p, x):
    h = x
    for i, w in enumerate(p):
      with jax.named_scope(f"fc{i}"):
        h = jnp.tanh(h @ w)
    return h

  d, f32 = 2048, jnp.float32
  r = wafer.estimate(
    infer, [jax.ShapeDtypeStruct((d, d), f32)] * 2, jax.ShapeDtypeStruct((65536, d), f32), mode="pipeline"
  )
  note = next((n for n in r.notes if "input I/O" in n), None)
  assert note is not None, r.notes
  fed = float(re.search(r"feed ([\d,.]+) samples/s", note)[1].replace(",", ""))
  assert fed == pytest.approx(r.samples_per_sec, rel=1e-3)
  assert all(k.samples_per_sec is None or k.samples_per_sec > r.samples_per_sec for k in r.kernels)


def test_a_layer_too_large_for_any_tile_is_told_to_split_it_not_to_shorten_a_sequence():
  import jax
  import jax.numpy as jnp

  import wafer

  def step(w, x):
    return w - 1e-3 * jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)

  d, f32 = 131072, jnp.float32
  r = wafer.estimate(
    step, jax.ShapeDtypeStruct((d, d), f32), jax.ShapeDtypeStruct((1024, d), f32), system="wse3"
  )
  assert not r.fits
  assert "split that layer" in r.remedy and "shorter sequence" not in r.remedy, r.remedy
