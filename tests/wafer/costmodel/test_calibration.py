"""The calibration targets against the published measurements (../shared/reference/wafer.md §2).

"Within x %" is symmetric in log space: max(pred/meas, meas/pred) <= 1 + x. The workloads are
traced abstractly, so this is fast. The held-out CS-3 point is checked only for being finite: it is
reported by benchmarks/costmodel_accuracy.py, not a target (the model misses it, see the README).
"""

import math
import statistics

import pytest

from wafer.costmodel.workloads import WORKLOADS, accuracy


@pytest.fixture(scope="module")
def rows():
  return accuracy()


def test_every_published_point_within_25_percent_and_median_within_15(rows):
  calibration = [r for r in rows if not r["held_out"]]
  assert {r["id"] for r in calibration} == {"V01", "V06", "V08", "V11"}
  for r in calibration:
    assert r["abs_log_ratio"] <= math.log(1.25), r
  assert statistics.median(r["abs_log_ratio"] for r in calibration) <= math.log(1.15)


def test_the_measured_conditions_are_used(rows):
  by_id = {r["id"]: r for r in rows}
  assert by_id["V01"]["mode"] == by_id["V06"]["mode"] == by_id["V08"]["mode"] == "weight_streaming"
  assert by_id["V01"]["micro_batch"] == 112  # the GPT-2 log says "Gradient accumulation disabled"
  assert WORKLOADS["llama3_8b_prefill"].estimate_kwargs["clock_hz"] == 1.1e9  # WaferLLM's cycle conversion
  held = [r for r in rows if r["held_out"]]
  assert held and all(math.isfinite(r["predicted"]) and r["predicted"] > 0 for r in held)
