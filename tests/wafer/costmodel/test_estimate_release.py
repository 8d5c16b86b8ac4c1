"""The release decides the mode (issue 25, item 1), and run details are inputs: a given micro-batch is
used as given, and when it does not fit the report says by how much, which assumption decides it and
what would fit; a searched micro-batch comes with the range of rates over the feasible sizes (items 2
and 5)."""

from __future__ import annotations

import functools
import json
import re

import hypothesis
import jax
import pytest
from hypothesis import strategies as st

import wafer
from tests.wafer.costmodel.helpers import batch_args, mlp_params, mlp_train_step
from wafer.costmodel import EstimateError, Release, estimate_graph, extract, parse_release
from wafer.costmodel import workloads as W
from wafer.costmodel.estimate import run_inputs
from wafer.costmodel.release import PIPELINE_MAX_PARAMS
from wafer.costmodel.streaming import activation_memory

SMALL = W.TransformerConfig(layers=2, d_model=128, heads=4, ffn=512, vocab=512, seq=64, max_positions=64)


@functools.cache
def _small_graph(batch: int = 64):
  fn, args = W.train_example(SMALL, batch)
  return extract(fn, args, batch_argnums=(2,), compute_bits=16)


@functools.cache
def _mlp_graph(widths: tuple[int, ...], batch: int, tokens: int):
  return extract(
    mlp_train_step(widths),
    (mlp_params(widths), *batch_args(batch, tokens, widths[0], widths[-1])),
    batch_argnums=(1, 2),
    compute_bits=16,
  )


# -- the release --------------------------------------------------------------------------------


@pytest.mark.parametrize(
  ("text", "label", "streams"),
  [
    ("2.x", "2.x", True),
    ("2", "2.x", True),
    ("2.4", "2.4", True),
    ("Release_2.10.0", "2.10", True),
    ("rel-2.2.1", "2.2", True),
    ("R1.9.1", "1.9", True),  # 1.9 dropped layer pipelining already
    ("1.9", "1.9", True),
    ("R_1.6.0", "1.6", False),
    ("Release_1.8.0", "1.8", False),
    ("1.x", "1.x", False),
    ("r1.7", "1.7", False),
  ],
)
def test_release_strings_parse_to_the_release_and_its_rule(text, label, streams):
  release = parse_release(text)
  assert release.label == label and release.streams_every_model is streams
  assert parse_release(release) is release


@pytest.mark.parametrize("bad", ["3.0", "0.9", "1.10", "latest", "", "2.x.y", None, True, [2]])
def test_an_unknown_release_is_an_error_listing_what_is_allowed(bad):
  with pytest.raises(EstimateError, match=r"release=.*allowed: '2.x' \(default"):
    parse_release(bad)
  with pytest.raises(EstimateError, match="release="):
    estimate_graph(_mlp_graph((64, 256, 64), 8, 16), release=bad)


@pytest.mark.parametrize("bad", ["3.0", "3.x", "Release_3.1.0"])
def test_the_release_error_says_which_majors_are_accepted(bad):
  """The message said "2.0 and later" and refused 3.0: 2 is the newest major release Cerebras ships."""
  with pytest.raises(EstimateError, match=r"no such Cerebras release; allowed: .*1.0-1.9 or 2.N \(2 is "):
    parse_release(bad)
  with pytest.raises(EstimateError) as info:
    parse_release(bad)
  assert "and later" not in str(info.value)


def test_the_default_release_streams_every_small_model_and_says_why():
  """Issue 25: under the default (2.x), ESM-2 35M-class models were costed layer pipelined (the
  faster mode in the model) although Cerebras' 2.x software streams the weights of every model."""
  graph = _small_graph()
  report = estimate_graph(graph)
  assert report.release == "2.x" and report.mode == "weight_streaming"
  assert "release 2.x" in report.mode_reason and "every model" in report.mode_reason
  assert report.alternatives == {}  # no layer-pipelined what-if unless asked for
  text = report.to_text()
  assert "Release:        2.x" in text and report.mode_reason in text
  data = json.loads(report.to_json())
  assert data["release"] == "2.x" and data["mode"] == "weight_streaming" and data["mode_reason"]


@pytest.mark.parametrize("release", ["1.x", "1.8", "R_1.6.0"])
def test_a_1x_release_pipelines_a_small_model_on_one_system(release):
  graph = _small_graph()
  assert graph.param_elements < PIPELINE_MAX_PARAMS
  report = estimate_graph(graph, release=release)
  assert report.mode == "pipeline" and report.fits
  assert "under 1B parameters" in report.mode_reason and parse_release(release).label in report.mode_reason
  two = estimate_graph(graph, release=release, num_csx=2)  # layer pipelining ran on one system only
  assert two.mode == "weight_streaming" and "2 systems" in two.mode_reason


def test_a_1x_release_streams_a_model_that_does_not_fit_pipelined_or_has_1b_parameters():
  huge = _mlp_graph((64, 65536, 65536, 64), 8, 16)  # 4.3 G parameters
  assert huge.param_elements >= PIPELINE_MAX_PARAMS
  report = estimate_graph(huge, release="1.8")
  assert report.mode == "weight_streaming" and "1B parameters or more" in report.mode_reason
  wide = _mlp_graph((64, 16384, 16384, 16384, 64), 64, 2048)  # 0.54 G parameters, 2048 tokens
  assert wide.param_elements < PIPELINE_MAX_PARAMS
  report = estimate_graph(wide, release="1.8", micro_batch_size=64)  # waves of 64: too big pipelined
  assert report.mode == "weight_streaming" and "does not fit pipelined" in report.mode_reason
  assert "pipeline" in report.alternatives


def test_explicit_modes_stay_explicit_and_fastest_is_the_what_if():
  graph = _small_graph()
  piped = estimate_graph(graph, mode="pipeline")  # under 2.x: a what-if, said so
  assert piped.mode == "pipeline" and "what-if" in piped.mode_reason and piped.release == "2.x"
  streamed = estimate_graph(graph, mode="weight_streaming", release="1.8")
  assert streamed.mode == "weight_streaming" and streamed.mode_reason.startswith("requested")
  fastest = estimate_graph(graph, mode="fastest")
  assert "what-if" in fastest.mode_reason and set(fastest.alternatives) == {
    "pipeline",
    "weight_streaming",
  } - {fastest.mode}
  other = fastest.alternatives[next(iter(fastest.alternatives))]
  assert fastest.samples_per_sec >= other  # the faster of the two
  assert fastest.samples_per_sec == max(piped.samples_per_sec, estimate_graph(graph).samples_per_sec)


def test_release_reaches_estimate_and_the_cli(capsys, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)  # `wafer estimate` writes ./model_dir/compile_report.txt
  fn, args = W.train_example(SMALL, 16)
  assert wafer.estimate(fn, *args, release="Release_1.8.0").mode == "pipeline"
  assert wafer.estimate(fn, *args).mode == "weight_streaming"
  from wafer.cli import main

  assert main(["estimate", "--workload", "gpt2_small", "--release", "1.8", "--mode", "auto"]) == 0
  out = capsys.readouterr().out
  assert "Release:        1.8" in out and "layer pipelined (release 1.8 runs models under 1B" in out
  assert main(["estimate", "--workload", "gpt2_small", "--release", "7.1"]) == 1
  assert "--release 7.1: no such Cerebras release" in capsys.readouterr().err


# -- micro-batch as given -------------------------------------------------------------------------


def test_the_api_searches_the_micro_batch_for_none_auto_or_explore_as_the_cli_and_params_files_do():
  """`wafer.estimate(..., micro_batch_size="auto")` was refused ("allowed: a positive integer", None
  not named) while the guide says "auto", "explore" or no micro-batch mean searched."""
  widths = (64, 256, 64)
  graph = _mlp_graph(widths, 32, 16)
  searched = estimate_graph(graph, mode="weight_streaming")
  assert not searched.details["micro_batch_given"]
  for word in ("auto", "explore", "Auto", " EXPLORE ", "none"):
    report = estimate_graph(graph, mode="weight_streaming", micro_batch_size=word)
    assert report.to_dict() == searched.to_dict(), word
  fn, args = mlp_train_step(widths), (mlp_params(widths), *batch_args(32, 16, 64, 64))
  api = wafer.estimate(fn, *args, batch_argnums=(1, 2), mode="weight_streaming", micro_batch_size="explore")
  assert api.micro_batch_size == searched.micro_batch_size and not api.details["micro_batch_given"]
  allowed = "allowed: a positive integer (used as given), or None, 'auto' or 'explore' (searched)"
  for bad in ("fast", 0, -2, 2.5, True):
    with pytest.raises(EstimateError, match=re.escape(f"micro_batch_size={bad!r}; {allowed}")):
      estimate_graph(graph, micro_batch_size=bad)
  with pytest.raises(EstimateError, match=re.escape(allowed)):
    wafer.estimate(fn, *args, batch_argnums=(1, 2), micro_batch_size="fastest")


def test_a_given_micro_batch_is_used_as_given_or_reported_not_fitting_by_how_much():
  """Issue 25: a modelzoo file's micro_batch_size "did not fit" and the compile report silently used
  another one. Given, it is kept: the report says it does not fit, the memory needed and available,
  the factor, the deciding assumption, and the largest micro-batch that fits (and its rate)."""
  graph = _mlp_graph(
    (4096, 8192, 4096), 512, 16384
  )  # its input alone, 128 MiB a sample, caps the micro-batch
  searched = estimate_graph(graph, mode="weight_streaming")
  fits = sorted(searched.details["micro_batch_range"]["sizes"])
  largest = fits[-1]
  assert largest < 512, "the example must have micro-batches that do not fit"
  kept = estimate_graph(graph, mode="weight_streaming", micro_batch_size=largest)
  assert kept.fits and kept.micro_batch_size == largest and kept.details["micro_batch_given"]
  too_big = 2 * largest if 512 % (2 * largest) == 0 else 512
  report = estimate_graph(graph, mode="weight_streaming", micro_batch_size=too_big)
  assert not report.fits and report.micro_batch_size == too_big  # never replaced
  assert report.samples_per_sec is None and report.step_time_s is None  # no rate, not 0 samples/s
  d = report.details
  assert d["memory_required_bytes"] > d["memory_available_bytes"]
  assert d["over_factor"] == pytest.approx(d["memory_required_bytes"] / d["memory_available_bytes"])
  # the numbers themselves, not their 3-digit rendering in the reason: the least of the levels
  mem = activation_memory(graph, too_big / graph.traced_batch)
  levels = [mem.full, mem.attention if mem.attention < mem.full else mem.full]
  levels += [mem.checkpointed] if mem.recomputable else []
  assert d["memory_required_bytes"] == pytest.approx(min(levels), rel=1e-12)
  assert "activations" in d["deciding_assumption"] and "SRAM" in d["deciding_assumption"]
  assert d["largest_fitting_micro_batch"] == largest
  assert d["largest_fitting_samples_per_sec"] == pytest.approx(kept.samples_per_sec, rel=1e-9)
  text = report.to_text()
  assert f"x{d['over_factor']:.2f} over" in text and f"micro_batch_size {largest}" in text
  assert "Samples/s:" not in text and "0 samples/s" not in text.replace(",", "")


@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(
  width=st.sampled_from([256, 1024, 4096]),
  tokens=st.sampled_from([64, 512, 2048]),
  batch=st.sampled_from([8, 60, 256]),
  system=st.sampled_from(["wse2", "wse3"]),
)
def test_the_searched_micro_batch_is_the_fastest_of_the_range_it_reports(width, tokens, batch, system):
  graph = _mlp_graph((64, width, width, 64), 8, tokens)
  report = estimate_graph(graph, mode="weight_streaming", batch_size=batch, system=system)
  span = report.details.get("micro_batch_range")
  if not report.fits:
    assert span is None and report.remedy
    return
  lo, hi = span["samples_per_sec"]
  assert lo <= report.samples_per_sec * (1 + 1e-12) and report.samples_per_sec == pytest.approx(hi)
  assert span["sizes"][0] <= report.micro_batch_size <= span["sizes"][1] <= batch
  assert "Micro-batch:    searched" in report.to_text()
  given = estimate_graph(
    graph, mode="weight_streaming", batch_size=batch, system=system, micro_batch_size=span["sizes"][0]
  )
  assert given.fits and "micro_batch_range" not in given.details  # given: nothing searched
  assert lo * (1 - 1e-9) <= given.samples_per_sec <= hi * (1 + 1e-9)


def test_run_inputs_take_the_params_files_micro_batch_and_release_as_given():
  p = wafer.config.load_params("models/gpt2/configs/params_gpt2_tiny.yaml")
  assert p.train_input.micro_batch_size in ("auto", None) or isinstance(p.train_input.micro_batch_size, int)
  from types import SimpleNamespace as NS

  assert run_inputs(NS(train_input=NS(micro_batch_size=88), runconfig=NS())) == {"micro_batch_size": 88}
  for searched in ("auto", "explore", {"explore": {"min": 1}}, None):
    assert run_inputs(NS(train_input=NS(micro_batch_size=searched), runconfig=NS())) == {}
  assert run_inputs(NS(train_input=None, runconfig=NS(release="R1.8.0"))) == {"release": "R1.8.0"}
  assert (
    run_inputs(NS(train_input=None, release=Release(1, 8), runconfig=NS(release="2.4")))["release"].label
    == "1.8"
  )
  # the release the loader infers from a real file's layout decides its keys' meaning, not the stack the
  # estimate runs on (today's 2.x); runconfig.modelzoo_release, given, is the release to cost
  legacy = wafer.config.load_params("tests/data/modelzoo/Release_1.9.1/gpt2/params_gpt2_small.yaml")
  assert legacy.release.name == "1.x or 2.0" and "release" not in run_inputs(legacy)
  given = wafer.config.load_params(
    "tests/data/modelzoo/Release_1.9.1/gpt2/params_gpt2_small.yaml", ["runconfig.modelzoo_release=1.8"]
  )
  assert parse_release(run_inputs(given)["release"]).label == "1.8"


def test_the_cli_passes_the_params_files_micro_batch_unchanged(tmp_path, capsys):
  from wafer.cli import main

  config = "models/gpt2/configs/params_gpt2_tiny.yaml"
  p = wafer.config.load_params(config)
  per_system = p.train_input.batch_size // p.runconfig.num_csx
  mb = max(d for d in range(1, per_system) if per_system % d == 0)  # a divisor, not the whole batch
  assert (
    main(["estimate", "--params", config, "--model_dir", str(tmp_path), f"train_input.micro_batch_size={mb}"])
    == 0
  )
  out = capsys.readouterr().out
  assert f"micro-batch {mb} as given" in out
  data = json.loads((tmp_path / "compile_report.json").read_text())
  assert data["micro_batch_size"] == mb  # and the release is the file's (a 2.x one streams every model)
  assert data["release"] == parse_release(run_inputs(p).get("release", "2.x")).label
  assert data["mode"] == "weight_streaming"


def test_the_compile_report_of_a_run_keeps_the_params_files_micro_batch(tmp_path, capsys):
  """`wafer run`'s compile report (issue 25: it silently searched another micro-batch): the params
  file's train_input.micro_batch_size is passed as given, and the release defaults to 2.x."""
  from wafer import runner

  config = "models/gpt2/configs/params_gpt2_tiny.yaml"
  p = wafer.config.load_params(config)
  per_system = p.train_input.batch_size // p.runconfig.num_csx
  mb = max(d for d in range(1, per_system) if per_system % d == 0)
  runner.run_params(
    config,
    [f"runconfig.model_dir={tmp_path}", "runconfig.validate_only=true", f"train_input.micro_batch_size={mb}"],
  )
  data = json.loads((tmp_path / "compile_report.json").read_text())
  assert data["micro_batch_size"] == mb and data["release"] == "2.x" and data["mode"] == "weight_streaming"
  assert "release 2.x" in capsys.readouterr().out


def test_a_trainer_layout_files_micro_batch_reaches_the_estimate():
  """The 2.x trainer layout keeps the micro-batch in ``ScopedTrainFlags: {csx.performance.micro_batch_size}``;
  it lands in train_input.micro_batch_size, which the estimate takes as given."""
  from wafer.config import load_params

  data = {
    "trainer": {
      "init": {
        "backend": {"backend_type": "CSX", "cluster_config": {"num_csx": 2}},
        "model": {"name": "gpt3"},
        "optimizer": {"SGD": {"lr": 0.5}},
        "loop": {"num_steps": 5},
        "callbacks": [{"ScopedTrainFlags": {"csx.performance.micro_batch_size": 2}}],
      },
      "fit": {"train_dataloader": {"batch_size": 8}},
    }
  }
  assert run_inputs(load_params(data))["micro_batch_size"] == 2


def test_a_run_whose_given_micro_batch_does_not_fit_says_so_and_has_no_rate(tmp_path, capsys):
  """The compile report of `wafer run` with a params file's micro-batch the model thinks does not fit:
  the log line says so and what would fit; the summary carries no rate (not 0 samples/s)."""
  from types import SimpleNamespace as NS

  from wafer.train.loop import _write_compile_report

  widths = (4096, 8192, 4096)  # its input, 128 MiB a sample, caps the micro-batch below 512
  step = mlp_train_step(widths)
  summary = {}
  _write_compile_report(
    lambda params, batch: step(params, *batch),
    mlp_params(widths),
    batch_args(512, 16384, widths[0], widths[-1]),
    NS(batch_size=512),
    1,
    None,
    tmp_path,
    summary,
    NS(train_input=NS(micro_batch_size=512), runconfig=NS()),
  )
  out = capsys.readouterr().out
  assert (
    "does not fit on the wafer in weight streaming (release 2.x)" in out
    and "would fit: micro_batch_size" in out
  )
  assert "samples_per_sec_estimate" not in summary and summary["compile_report"]
  data = json.loads((tmp_path / "compile_report.json").read_text())
  assert data["micro_batch_size"] == 512 and data["fits"] is False and data["samples_per_sec"] is None


# -- the release's compute rate and each chip's clock ---------------------------------------------


@hypothesis.settings(max_examples=6, deadline=None)
@hypothesis.given(
  widths=st.sampled_from([(256, 512, 256), (512, 1024, 512, 128)]),
  micro=st.sampled_from([8, 16, 32]),
  old=st.sampled_from(["1.7", "R1.8.0", "1.9", "1.x"]),
)
def test_a_1x_release_computes_at_two_thirds_of_2x_and_moves_bytes_alike(widths, micro, old):
  """Cerebras' R2.0 announcement: 2.0 is 50 % faster; the links run at their rate whatever the software."""
  from wafer.costmodel.release import SPEEDUP_2_0

  graph = _mlp_graph(widths, 64, 128)
  kw = dict(batch_size=64, micro_batch_size=micro, mode="weight_streaming")
  new, slow = estimate_graph(graph, release="2.4", **kw), estimate_graph(graph, release=old, **kw)
  assert slow.details["compute_s"] == pytest.approx(SPEEDUP_2_0 * new.details["compute_s"], rel=1e-12)
  assert slow.details["io_s"] == pytest.approx(new.details["io_s"], rel=1e-12)
  assert slow.clock_hz == new.clock_hz  # the chip's clock is the same; the software is slower
  assert any("1.x software computes at 1/1.5" in n for n in slow.notes)
  assert not any("1.x software" in n for n in new.notes)
  pipe = {r: estimate_graph(graph, batch_size=64, mode="pipeline", release=r) for r in ("2.x", old)}
  ratio = pipe[old].compute_samples_per_sec / pipe["2.x"].compute_samples_per_sec
  assert ratio == pytest.approx(1 / SPEEDUP_2_0, rel=1e-9)  # (its links: the fabric-bound test below)


def test_a_fabric_bound_pipeline_is_as_fast_under_1x():
  """A 1.x release slowed the layer-pipelined fabric transfers too (a wide, thin MLP bound by moving
  activations between its regions: 1.5x slower under 1.8)."""
  import jax.numpy as jnp

  def step(params, x):
    def loss(p):
      return jnp.mean(jnp.square((x @ p["w1"]) @ p["w2"]))

    g = jax.grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 1e-3 * g, params, g)

  f32 = jnp.float32
  params = {"w1": jax.ShapeDtypeStruct((16, 65536), f32), "w2": jax.ShapeDtypeStruct((65536, 4), f32)}
  x = jax.ShapeDtypeStruct((4096, 16), f32)
  r = {
    rel: wafer.estimate(step, params, x, release=rel, mode="pipeline", micro_batch_size=64)
    for rel in ("2.x", "1.8")
  }
  from wafer.costmodel.release import SPEEDUP_2_0

  new, old = r["2.x"], r["1.8"]
  assert new.transmission_samples_per_sec < new.compute_samples_per_sec / SPEEDUP_2_0  # fabric bound
  assert old.compute_samples_per_sec == pytest.approx(new.compute_samples_per_sec / SPEEDUP_2_0, rel=1e-9)
  assert old.transmission_samples_per_sec == pytest.approx(new.transmission_samples_per_sec, rel=1e-9)
  assert old.samples_per_sec == pytest.approx(new.samples_per_sec, rel=1e-3)  # still fabric bound


def test_a_not_fitting_pipeline_under_1x_names_the_release_of_its_streaming_rate():
  fn, args = W.train_example(SMALL, 64)
  r = wafer.estimate(fn, *args, mode="pipeline", release="1.8", rect=(8, 8))
  assert not r.fits
  assert "weight streaming" in r.remedy and r.remedy.endswith("samples/s under release 1.8"), r.remedy


@pytest.mark.parametrize("bad", ["-2", -2, "__2.4", "2.x.1", "-1.8", "r-", "2.", ".4"])
def test_release_junk_is_refused(bad):
  with pytest.raises(EstimateError, match="allowed"):
    parse_release(bad)


def test_release_accepts_numpy_numbers_and_checks_a_release_built_directly():
  import numpy as np

  assert parse_release(np.float32(1.8)).label == "1.8" and parse_release(np.int64(2)).label == "2.x"
  for major, minor in ((2, -1), (3, 0), (1, 10), (True, None), (2.0, None), (2, 1.5)):
    with pytest.raises(EstimateError, match="no such Cerebras release"):
      Release(major, minor)


def test_calibration_names_each_chips_clock_and_refuses_what_it_cannot_name():
  import numpy as np

  from wafer.costmodel import CALIBRATION, Calibration
  from wafer.costmodel.hardware import get_system

  apart = CALIBRATION.replace(clock_hz=1.0e9, wse3_clock_hz=0.7e9)  # two clocks told apart
  for name in ("WSE-3", "wse3", "CS-3", "cs3", "WSE 3", "cs_3", get_system("wse3"), get_system("wse3").chip):
    assert apart.clock(name) == 0.7e9
  for name in ("WSE-2", "wse2", "CS-2", "WSE-1", "cs1", "CS 2", "wse_2", get_system("wse2").chip):
    assert apart.clock(name) == 1.0e9
  for bad in ("bogus", "", None, 3):
    with pytest.raises(ValueError, match="allowed: WSE-1, WSE-2, WSE-3"):
      CALIBRATION.clock(bad)
  for field in ("clock_hz", "wse3_clock_hz"):
    for bad in (float("inf"), 0, -1, float("nan"), True):
      with pytest.raises(ValueError, match=f"{field}=.*allowed: a positive, finite frequency in Hz"):
        CALIBRATION.replace(**{field: bad})
  with pytest.raises(ValueError, match="max_lanes=inf; allowed: a finite number >= 0"):
    Calibration(max_lanes=float("inf"))
  c = CALIBRATION.replace(wse3_clock_hz=np.float32(9e8), max_lanes=np.int64(8))
  assert type(c.wse3_clock_hz) is float and type(c.max_lanes) is int and c.wse3_clock_hz == 9e8
  from fractions import Fraction

  assert type(CALIBRATION.replace(step_overhead_s=Fraction(1, 10)).step_overhead_s) is float


def test_each_chip_runs_at_its_own_clock():
  from wafer.costmodel import CALIBRATION

  graph = _mlp_graph((512, 1024, 512), 64, 128)
  kw = dict(batch_size=64, micro_batch_size=16, mode="weight_streaming")
  for system, own, other in (("wse3", "wse3_clock_hz", "clock_hz"), ("wse2", "clock_hz", "wse3_clock_hz")):
    base = estimate_graph(graph, system=system, **kw)
    assert base.clock_hz == getattr(CALIBRATION, own)
    moved = estimate_graph(graph, system=system, calibration=CALIBRATION.replace(**{other: 0.5e9}), **kw)
    assert moved.samples_per_sec == base.samples_per_sec  # the other chip's clock changes nothing
    half = CALIBRATION.replace(**{own: getattr(CALIBRATION, own) / 2})
    slow = estimate_graph(graph, system=system, calibration=half, **kw)
    assert slow.details["compute_s"] == pytest.approx(2 * base.details["compute_s"], rel=1e-12)
    # wafer.estimate's clock_hz= overrides the clock of the system's chip
    widths = (512, 1024, 512)
    args = (mlp_params(widths), *batch_args(64, 128, widths[0], widths[-1]))
    step = mlp_train_step(widths)
    run = dict(kw, system=system, batch_argnums=(1, 2))
    at, set_ = wafer.estimate(step, *args, **run), wafer.estimate(step, *args, clock_hz=0.7e9, **run)
    assert (at.clock_hz, set_.clock_hz) == (getattr(CALIBRATION, own), 0.7e9)
    assert set_.details["compute_s"] == pytest.approx(
      at.details["compute_s"] * getattr(CALIBRATION, own) / 0.7e9, rel=1e-12
    )


def test_pairs_of_system_and_release_that_never_ran_are_called_what_ifs():
  graph = _small_graph()
  what_ifs = lambda r: [n for n in r.notes if n.startswith("a what-if")]  # noqa: E731
  assert what_ifs(estimate_graph(graph, batch_size=64, system="wse1")) == [
    "a what-if: the CS-1 has no MemoryX, so it never streamed weights"
  ]
  assert what_ifs(estimate_graph(graph, batch_size=64, system="wse1", release="1.8")) == []  # pipelined
  assert what_ifs(estimate_graph(graph, batch_size=64, system="wse3", release="1.8")) == [
    "a what-if: the CS-3 never ran a 1.x release (the CS-3 came with 2.x software)"
  ]
  assert what_ifs(estimate_graph(graph, batch_size=64, system="wse3")) == []
  assert what_ifs(estimate_graph(graph, batch_size=64, system="wse2", release="1.8")) == []


def test_a_users_own_chip_runs_at_the_wse2_clock_and_says_so():
  """A `System` with a renamed chip crashed on `Calibration.clock` once each chip had its own clock."""
  import dataclasses

  from wafer.costmodel import CALIBRATION
  from wafer.costmodel.hardware import get_system

  wse2 = get_system("wse2")
  mine = dataclasses.replace(wse2, chip=dataclasses.replace(wse2.chip, name="MY-WSE"))
  graph = _small_graph()
  r = estimate_graph(graph, batch_size=64, system=mine)
  assert r.clock_hz == CALIBRATION.clock_hz
  assert r.samples_per_sec == pytest.approx(
    estimate_graph(graph, batch_size=64, system="wse2").samples_per_sec
  )
  assert any("'MY-WSE' has no calibrated clock of its own" in n for n in r.notes), r.notes
