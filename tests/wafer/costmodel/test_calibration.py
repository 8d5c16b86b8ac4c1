"""The calibration against the published measurements (``docs/references.md``, "Published measurements").

The numbers themselves come from ``python benchmarks/costmodel_accuracy.py`` (in-sample and
leave-one-out errors, written to benchmarks/results/costmodel_accuracy.json). These tests check that
the defaults and the accuracy the reports quote are the ones that benchmark measured (one source of
truth), and that every published point is estimated under its measured conditions.
"""

import dataclasses
import json
import math
import pathlib

import pytest

from wafer.costmodel import ACCURACY, CALIBRATION
from wafer.costmodel.workloads import WORKLOADS, accuracy

RESULTS = pathlib.Path(__file__).parents[3] / "benchmarks" / "results" / "costmodel_accuracy.json"


@pytest.fixture(scope="module")
def rows():
  return accuracy()


@pytest.fixture(scope="module")
def bench():
  return json.loads(RESULTS.read_text())


def test_defaults_are_the_benchmarks_in_sample_fit(bench):
  for name, value in bench["fitted"].items():
    assert math.isclose(getattr(CALIBRATION, name), value, rel_tol=1e-9, abs_tol=1e-15), name
  assert bench["defaults_equal_fit"]


def test_the_quoted_accuracy_is_the_benchmarks_leave_one_out(bench):
  assert ACCURACY.points == len(bench["rows"])
  assert ACCURACY.median == pytest.approx(bench["leave_one_out_median"], abs=5e-4)
  assert ACCURACY.worst == pytest.approx(bench["leave_one_out_worst"], abs=5e-4)
  assert ACCURACY.band == pytest.approx(tuple(bench["band"]), abs=5e-3)
  assert ACCURACY.held_out == len(bench["held_out_rows"])
  assert ACCURACY.held_out_median == pytest.approx(bench["held_out_median"], abs=5e-4)
  assert ACCURACY.held_out_worst == pytest.approx(bench["held_out_worst"], abs=5e-4)
  # the band covers every run not fitted: each left-out point and each held-out run
  ratios = [r["measured"] / r["leave_one_out"] for r in bench["rows"]]
  ratios += [r["measured"] / r["predicted"] for r in bench["held_out_rows"]]
  for ratio in ratios:
    assert ACCURACY.band[0] - 5e-3 <= ratio <= ACCURACY.band[1] + 5e-3, ratio
  assert min(ratios) == pytest.approx(ACCURACY.band[0], abs=5e-3)  # and no wider
  assert max(max(ratios), 1.0) == pytest.approx(ACCURACY.band[1], abs=5e-3)


@pytest.mark.slow  # over 5 s; .ci/run runs the slow tests
def test_the_benchmark_rows_are_the_published_points(bench, rows):
  assert {r["id"] for r in bench["rows"]} == {r["id"] for r in rows if not r["held_out"]}
  assert {r["id"] for r in bench["held_out_rows"]} == {r["id"] for r in rows if r["held_out"]}
  for b, r in zip(bench["held_out_rows"], [r for r in rows if r["held_out"]]):  # never fitted
    assert b["predicted"] == pytest.approx(r["predicted"], rel=1e-6), b["id"]
  for b in bench["rows"]:
    assert b["leave_one_out_abs_log_ratio"] == pytest.approx(
      abs(math.log(b["leave_one_out"] / b["measured"]))
    )


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
