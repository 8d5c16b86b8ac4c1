"""benchmarks/costmodel_accuracy.py end to end: the stored results, the shipped calibration and the
band the reports quote are what a fresh run of the benchmark computes."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import child_env

ROOT = Path(__file__).resolve().parents[2]
STORED = ROOT / "benchmarks" / "results" / "costmodel_accuracy.json"


@pytest.mark.slow  # about 17 minutes on 2 cores (the grid has 108 points since round 26), more under load
def test_a_fresh_run_reproduces_the_stored_results_and_the_shipped_band(tmp_path):
  from wafer.costmodel import ACCURACY, CALIBRATION

  out = tmp_path / "costmodel_accuracy.json"
  env = child_env(JAX_PLATFORMS="cpu")
  done = subprocess.run(
    [sys.executable, "benchmarks/costmodel_accuracy.py", "--out", str(out)],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=3600,
  )
  assert done.returncode == 0, done.stderr[-4000:]
  fresh, stored = json.loads(out.read_text()), json.loads(STORED.read_text())
  assert fresh["fitted"] == stored["fitted"]
  assert fresh["defaults_equal_fit"]
  for name, value in fresh["fitted"].items():
    assert math.isclose(getattr(CALIBRATION, name), value, rel_tol=1e-9, abs_tol=1e-15), name
  assert fresh["band_errors"] == pytest.approx(stored["band_errors"], rel=1e-6)
  assert tuple(fresh["band"]) == ACCURACY.band and fresh["band_coverage"] == ACCURACY.coverage
  assert fresh["band_placed_coverage"] == pytest.approx(ACCURACY.placed_coverage)
  # every row has its family-out and leave-one-out predictions, and ratios consistent with them
  for row in fresh["rows"]:
    for key in ("in_sample", "leave_one_out", "leave_one_family_out"):
      assert row[key + "_log_ratio"] == pytest.approx(math.log(row[key] / row["measured"]))
  kinds = {p["pins"].split(" ")[0] for p in fresh["pairs"]}
  assert {"chip", "data", "batch"} <= kinds


@pytest.mark.parametrize(
  ("args", "says"),
  [
    (["--set", "max_micro_batch_tokens=262144"], "give --out PATH"),
    (["--out", "x.json", "--set", "clock_hz=1e9"], "NAME one of"),  # fitted: not a what-if
    (["--out", "x.json", "--set", "max_micro_batch_tokens"], "expected NAME=VALUE"),
    (["--out", "x.json", "--set", "max_micro_batch_tokens=lots"], "is not a number"),
    (["--out", "x.json", "--set", "max_micro_batch_tokens=-1"], "allowed: a finite number >= 0"),
    (["--out", "x.json", "--set", "max_micro_batch_tokens=0.5"], "allowed: a whole number >= 0"),
  ],
)
def test_a_what_if_names_a_constant_that_is_not_fitted_and_its_own_output(args, says):
  """``--set`` fails before any estimate, saying what is allowed; it never overwrites the stored results."""
  done = subprocess.run(
    [sys.executable, "benchmarks/costmodel_accuracy.py", *args],
    cwd=ROOT,
    env=child_env(JAX_PLATFORMS="cpu"),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert done.returncode != 0 and says in done.stderr, done.stderr[-2000:]
  assert "Traceback" not in done.stderr
