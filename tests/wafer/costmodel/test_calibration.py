"""The calibration against the published measurements (``docs/references.md``, "Published measurements").

The numbers come from ``PYTHONPATH=. python benchmarks/costmodel_accuracy.py`` (in-sample,
leave-one-out and leave-one-family-out errors, written to benchmarks/results/costmodel_accuracy.json).
These tests check that the defaults and the band the reports quote are what that benchmark and the
calibration procedure compute (one source of truth, no number copied by hand), that the band's
procedure has the properties it claims, and that every published point is estimated under its
measured conditions with an honest role.
"""

import dataclasses
import json
import math
import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wafer.costmodel import ACCURACY, CALIBRATION, Calibration
from wafer.costmodel.calibration import (
  BAND_MAX_WIDTH,
  calibrate_band,
  coverage_of,
  cross_validated_coverage,
  place_band,
)
from wafer.costmodel.workloads import ROLES, WORKLOADS, Measurement, Workload, accuracy, log_error

RESULTS = pathlib.Path(__file__).parents[3] / "benchmarks" / "results" / "costmodel_accuracy.json"


@pytest.fixture(scope="module")
def bench():
  return json.loads(RESULTS.read_text())


@pytest.fixture(scope="module")
def rows():
  return accuracy()


def test_defaults_are_the_benchmarks_in_sample_fit(bench):
  for name, value in bench["fitted"].items():
    assert math.isclose(getattr(CALIBRATION, name), value, rel_tol=1e-9, abs_tol=1e-15), name
  assert bench["defaults_equal_fit"]
  assert bench["closed_form_check"] < 1e-6  # the closed-form per-step costs are the estimate's


def test_the_band_is_what_the_calibration_procedure_computes_from_the_stored_errors(bench):
  errors = bench["band_errors"]
  # the stored errors are the leave-one-family-out errors of the rows, ln(measured / predicted)
  assert errors == pytest.approx([-r["leave_one_family_out_log_ratio"] for r in bench["rows"]])
  for r in bench["rows"]:
    assert r["leave_one_family_out_log_ratio"] == pytest.approx(
      math.log(r["leave_one_family_out"] / r["measured"])
    )
  families = [r["family"] for r in bench["rows"]]
  coverage, band = calibrate_band(errors, families)
  assert (ACCURACY.coverage, ACCURACY.band) == (coverage, band)
  assert tuple(bench["band"]) == band and bench["band_coverage"] == coverage
  assert band[1] / band[0] <= BAND_MAX_WIDTH + 1e-9  # at most x1.6 wide
  # it claims what it holds of each family's runs when placed without that family
  assert coverage == cross_validated_coverage(errors, families)
  assert ACCURACY.placed_coverage == pytest.approx(coverage_of(band, errors))
  assert ACCURACY.placed_coverage == pytest.approx(bench["band_placed_coverage"])
  assert ACCURACY.points == len(bench["rows"])
  assert ACCURACY.median == pytest.approx(bench["summary"]["leave_one_family_out"]["median"], abs=5e-4)
  assert ACCURACY.worst == pytest.approx(bench["summary"]["leave_one_family_out"]["worst"], abs=5e-4)
  held = bench["summary"]["held_out"]  # scored by the shipped (in-sample) calibration
  assert ACCURACY.held_out == held.get("n", 0)
  assert ACCURACY.held_out_median == pytest.approx(held.get("median", 0.0), abs=5e-4)
  assert ACCURACY.held_out_worst == pytest.approx(held.get("worst", 0.0), abs=5e-4)
  errors = [abs(r["in_sample_log_ratio"]) for r in bench["rows"] if r["role"] == "held_out"]
  assert held.get("n", 0) == len(errors) and (not errors or held["worst"] == max(errors))


def test_the_report_states_the_claimed_coverage():
  text = ACCURACY.describe()
  assert f"{100 * ACCURACY.coverage:.0f} %" in text and f"x{ACCURACY.band[0]:.2f}" in text


_errors = st.lists(st.floats(-1.5, 1.5, allow_nan=False), min_size=1, max_size=30)
_widths = st.sampled_from([1.01, 1.05, 1.2, 1.6, 2.0, 3.0, 10.0])


@settings(max_examples=200, deadline=None)
@given(_errors, _widths)
def test_place_band_holds_the_prediction_and_the_most_runs_within_its_width(errors, width):
  lo, hi = place_band(errors, width)
  assert lo <= 1.0 <= hi
  assert hi / lo <= width + 1e-9
  # no window of the same width that holds the prediction holds more runs (the band keeps back
  # 0.0025 of ln width for its rounding to 4 significant figures, so compare with that much less)
  w = math.log(width) - 0.0025
  held = round(coverage_of((lo, hi), errors) * len(errors))
  e = sorted(errors)
  for start in [*e, *(x - w for x in e), 0.0, -w]:
    if start <= 0.0 <= start + w:
      assert sum(start <= x <= start + w for x in e) <= held


@settings(max_examples=100, deadline=None)
@given(_errors, st.lists(st.sampled_from("abcd"), min_size=30, max_size=30))
def test_the_claim_is_each_familys_share_inside_a_band_placed_without_it(errors, names):
  groups = names[: len(errors)]
  if len(set(groups)) < 2:
    with pytest.raises(ValueError, match="two or more"):
      calibrate_band(errors, groups)
    return
  coverage, band = calibrate_band(errors, groups)
  assert band == place_band(errors)
  inside = 0
  for g in set(groups):
    rest = [x for x, h in zip(errors, groups) if h != g]
    own = [x for x, h in zip(errors, groups) if h == g]
    if rest:
      b = place_band(rest)
      inside += sum(math.log(b[0]) - 1e-9 <= x <= math.log(b[1]) + 1e-9 for x in own)
  assert coverage == pytest.approx(inside / len(errors))
  assert 0.0 <= coverage <= 1.0


def test_a_family_whose_errors_differ_from_the_others_lowers_the_claim():
  """Two families that agree and one 2x off: placed on all three the band can hold the
  outlier family's runs too, but placed without it, it cannot; the claim says so."""
  errors = [0.0, 0.02, -0.01, 0.01, 0.7, 0.72]
  groups = ["a", "a", "b", "b", "c", "c"]
  coverage, band = calibrate_band(errors, groups, max_width=2.2)
  assert coverage_of(band, errors) == 1.0
  assert coverage == pytest.approx(4 / 6)


def test_band_errors_are_clear():
  with pytest.raises(ValueError, match="no errors"):
    place_band([])
  with pytest.raises(ValueError, match="max_width=0.9"):
    place_band([0.1], 0.9)
  with pytest.raises(ValueError, match="max_width=1.001; allowed: a factor of 1.01 or more"):
    place_band([0.1], 1.001)
  with pytest.raises(ValueError, match="allowed: finite"):
    place_band([0.1, float("nan")])
  with pytest.raises(ValueError, match="2 errors but 1 groups"):
    cross_validated_coverage([0.1, 0.2], ["a"])
  with pytest.raises(ValueError, match="errors of 1 model family; allowed: two or more"):
    calibrate_band([0.1, 0.2], ["a", "a"])


@pytest.mark.parametrize("errors, width", [([-1.0561108670510664], 3.0), ([-1.0859375], 3.0), ([0.0], 1.01)])
def test_the_rounded_band_stays_within_its_width(errors, width):
  """Found by review: rounding outwards to 3 decimals made a x3 band x3.003 wide."""
  lo, hi = place_band(errors, width)
  assert hi / lo <= width and lo <= 1.0 <= hi


_values = st.fixed_dictionaries(
  {
    "clock_hz": st.floats(1e8, 3e9),
    "instruction_overhead_cycles": st.floats(0, 64),
    "attention_row_cycles": st.floats(0, 4),
    "optimizer_bytes_per_param": st.floats(0, 64),
    "step_overhead_s": st.floats(0, 1),
  }
)


@settings(max_examples=100, deadline=None)
@given(_values)
def test_calibration_round_trips(values):
  calib = CALIBRATION.replace(**values)
  assert Calibration(**calib.to_dict()) == calib
  assert calib.replace(**CALIBRATION.to_dict()) == CALIBRATION
  for name, value in values.items():
    assert getattr(calib, name) == value


def test_calibration_rejects_bad_values():
  with pytest.raises(ValueError, match=r"step_overhead_s=-1.*allowed: a finite number >= 0"):
    CALIBRATION.replace(step_overhead_s=-1)
  with pytest.raises(ValueError, match="no parameter 'clock'"):
    CALIBRATION.replace(clock=1e9)


def test_every_measurement_has_a_role_family_and_explicit_mode(bench):
  measured = [w for w in WORKLOADS.values() if w.measurement is not None]
  for w in WORKLOADS.values():  # the mode is the published run's, never the default's choice
    assert w.kind == "prefill" or w.estimate_kwargs.get("mode") in ("weight_streaming", "pipeline"), w.name
  for w in measured:
    assert w.measurement.role in ROLES and w.measurement.family, w.name
  fitted = {w.measurement.id for w in measured if w.measurement.role == "fit"}
  assert set(bench["fitted_on"]) == fitted  # only "fit" measurements calibrate the constants
  assert {r["id"] for r in bench["rows"]} == {w.measurement.id for w in measured}
  with pytest.raises(ValueError, match="role='tuned'; allowed: fit, structure, held_out"):
    Measurement("X", 1.0, "", "", role="tuned")
  with pytest.raises(ValueError, match="value=0"):
    Measurement("X", 0, "", "")
  with pytest.raises(ValueError, match="blind=True needs role 'held_out' or 'structure'"):
    Measurement("X", 1.0, "", "", role="fit", blind=True)
  blind = {r["id"] for r in bench["rows"] if r["blind"]}
  assert blind == {w.measurement.id for w in measured if w.measurement.blind} and len(blind) >= 10
  sets = {k: v for k, v in bench["summary"].items() if k.startswith("blind_")}  # every blind run in one set
  assert sum(v["n"] for v in sets.values()) == len(blind)
  assert {k.removeprefix("blind_") for k in sets} == {i[0] for i in blind}


@pytest.mark.slow  # over 5 s; .ci/run runs the slow tests
def test_the_benchmark_rows_are_the_default_calibrations_estimates(bench, rows):
  by_id = {r["id"]: r for r in rows}
  for b in bench["rows"]:
    r = by_id[b["id"]]
    if "in_sample_range" in b:  # a run detail not known: the benchmark scores the range
      assert b["in_sample_range"] == pytest.approx(list(r["predicted_range"]), rel=1e-6), b["id"]
      assert b["in_sample_log_ratio"] == pytest.approx(
        math.copysign(r["abs_log_ratio"], b["in_sample_log_ratio"])
      )
    else:
      assert b["in_sample"] == pytest.approx(r["predicted"], rel=1e-6), b["id"]
      assert r["predicted_range"] == (r["predicted"], r["predicted"])


@pytest.mark.slow  # over 5 s; .ci/run runs the slow tests
def test_the_measured_conditions_are_used(rows):
  by_id = {r["id"]: r for r in rows}
  assert by_id["V01"]["mode"] == by_id["V06"]["mode"] == by_id["V08"]["mode"] == "weight_streaming"
  assert by_id["C1"]["mode"] == "pipeline"
  assert by_id["C2"]["mode"] == by_id["C3"]["mode"] == "weight_streaming"
  assert by_id["V01"]["micro_batch"] == 112  # the GPT-2 log says "Gradient accumulation disabled"
  assert by_id["V06"]["micro_batch"] == 11  # R2.1-2.3: a divisor of 99 (33 does not fit)
  assert by_id["E4"]["predicted"] > by_id["E1"]["predicted"]  # 2 x CS-2 at batch 120 vs 1 x CS-2 at 66
  assert WORKLOADS["llama3_8b_prefill"].estimate_kwargs["clock_hz"] == 1.1e9  # WaferLLM's cycle conversion
  assert all(math.isfinite(r["predicted"]) and r["predicted"] > 0 for r in rows)


def test_the_dit_workload_has_dits_parameter_count():
  """DiT-2B's adaLN-Zero projections (``d x 6d`` per layer) make a third of its 2.3 B parameters."""
  import jax

  from wafer.costmodel import workloads as W

  def count(cfg):
    shapes = jax.eval_shape(lambda: W.init_params(cfg, jax.random.key(0)))
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(shapes))

  dit = count(W.DIT_2B)
  assert 2.2e9 < dit < 2.35e9
  without = count(dataclasses.replace(W.DIT_2B, adaln=False))
  assert dit - without == W.DIT_2B.layers * (6 * 2048 * 2048 + 6 * 2048)


@settings(max_examples=200, deadline=None)
@given(
  st.lists(st.floats(0.01, 1e6), min_size=1, max_size=4),
  st.floats(0.01, 1e6),
)
def test_a_ranged_prediction_scores_the_distance_to_its_range(predicted, measured):
  """0 inside ``[min, max]``; outside, the log ratio to the nearer end, with its sign; never more
  than any single prediction's error, and the point error when there is one prediction."""
  err = log_error(predicted, measured)
  lo, hi = min(predicted), max(predicted)
  if lo <= measured <= hi:
    assert err == 0.0
  else:
    assert err == pytest.approx(math.log((lo if lo > measured else hi) / measured))
  assert abs(err) <= min(abs(math.log(p / measured)) for p in predicted) + 1e-12
  assert log_error(predicted[:1], measured) == pytest.approx(math.log(predicted[0] / measured))


def test_a_run_detail_not_stated_is_a_range_of_configs():
  from wafer.costmodel import workloads as W

  e8 = WORKLOADS["llama2_7b_cs3"]
  assert dict(e8.unknown) == {"seq": (4096, 2048)}
  assert [c.seq for c in e8.variants()] == [4096, 2048]  # the workload's own config first
  assert all(dataclasses.replace(c, seq=4096) == e8.config for c in e8.variants())
  assert all(len(w.variants()) == 1 for w in WORKLOADS.values() if not w.unknown)
  with pytest.raises(ValueError, match="unknown='sequence' is not a TransformerConfig field; allowed: .*seq"):
    Workload("x", "", W.GPT2_SMALL, 8, unknown=(("sequence", (1024, 2048)),))
  with pytest.raises(ValueError, match="config.seq=2048 is not one of unknown seq values"):
    Workload("x", "", W.GPT2_SMALL, 8, unknown=(("seq", (512, 1024)),))


def test_the_calibration_table_lists_every_constant_once():
  """`Calibration.describe`, the table of the constants: one row per field (a constant added
  without a row is invisible there: `layer_latency_s` was)."""
  import dataclasses

  from wafer.costmodel import CALIBRATION

  names = [row[0] for row in CALIBRATION.describe().rows]
  assert sorted(names) == sorted(f.name for f in dataclasses.fields(CALIBRATION))
