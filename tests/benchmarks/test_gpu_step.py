"""Smoke test of benchmarks/gpu_step.py: the tiny size, one timed step per variant, on CPU."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_step_runs_tiny_and_writes_its_json(tmp_path):
  out = tmp_path / "gpu_step.json"
  command = [sys.executable, "benchmarks/gpu_step.py", "--size", "tiny", "--rounds", "1", "--warmup", "1"]
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  done = subprocess.run(
    [*command, "--output", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
  )
  assert done.returncode == 0, done.stderr[-4000:]
  report = json.loads(out.read_text())
  assert report["benchmark"] == "gpu_step" and report["platform"] == "cpu"
  results = report["sizes"]["tiny"]["results"]
  expected = ["float32", "bf16_native"] + [
    f"autocast_{f}_l{level}" for f in ("bfloat16", "cbfloat16") for level in (0, 1)
  ]
  assert list(results) == expected
  for name, row in results.items():
    assert len(row["step_times_s"]) == 1 and row["median_step_s"] > 0, name
    assert row["tokens_per_s"] == pytest.approx(64 / row["median_step_s"]), name  # batch 2 x seq 32
    assert row["hlo_matmuls"]["dot"] > 0, name  # CPU: XLA keeps dot instructions
  products = {name: row["products"] for name, row in results.items()}
  assert products["float32"] == "highest" and products["bf16_native"] == "bf16 dtype"
  assert products["autocast_bfloat16_l0"] == "native bfloat16" and products["autocast_cbfloat16_l1"] == "tf32"
  assert set(results["autocast_bfloat16_l1"]["hlo_matmuls"]["operand_dtypes"]) == {"f32"}  # CPU: TF32 form
  assert results["float32"]["ratio_vs_float32"] == 1.0
  assert results["bf16_native"]["ratio_vs_bf16_native"] == 1.0
  # The emulations actually round: the losses differ from float32's, and by format.
  losses = {name: row["loss_after_warmup"] for name, row in results.items()}
  assert losses["autocast_cbfloat16_l1"] != losses["float32"]
  assert losses["autocast_bfloat16_l1"] != losses["autocast_cbfloat16_l1"]
