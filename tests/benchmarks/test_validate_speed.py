"""Smoke test of benchmarks/validate_speed.py: a small file as the timed file, one round."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "models" / "gpt2" / "configs" / "params_gpt2_tiny.yaml"


@pytest.mark.slow  # two cold `wafer run --validate_only` processes
def test_validate_speed_times_a_file_against_the_baseline_and_writes_its_json(tmp_path):
  out = tmp_path / "validate_speed.json"
  broken = tmp_path / "broken.yaml"
  broken.write_text(TINY.read_text().replace("num_heads: 2", "num_heads: 3"))
  command = [sys.executable, "benchmarks/validate_speed.py", str(broken), "--out", str(out)]
  done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert done.returncode == 1, done.stdout + done.stderr  # a file that does not validate fails the benchmark
  report = json.loads(out.read_text())
  assert report["benchmark"] == "validate_speed" and report["budget_s"] == 10.0
  base, timed = report["results"]["models/gpt2/configs/params_gpt2_tiny.yaml"], report["results"][str(broken)]
  assert base["validated"] and base["ratio_vs_baseline"] == 1.0 and base["median_s"] > 0
  assert not timed["validated"] and "num_heads=3" in timed["runs"][0]["error"]
  assert timed["runs"][0]["cpu_s"] > 0 and timed["ratio_vs_budget"] == timed["median_s"] / 10.0


def test_without_files_or_defaults_it_says_what_to_pass(tmp_path):
  done = subprocess.run(
    [sys.executable, "-c", "import sys; sys.argv = ['v']; sys.path.insert(0, 'benchmarks'); import validate_speed as v; "
     "v.DEFAULTS = ('tests/data/none/*.yaml',); sys.exit(v.main())"],
    cwd=ROOT, capture_output=True, text=True, timeout=120,
  )  # fmt: skip
  assert done.returncode == 2
  assert "no file matches tests/data/none/*.yaml" in done.stderr and "pass them as arguments" in done.stdout
