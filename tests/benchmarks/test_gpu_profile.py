"""Smoke test of benchmarks/gpu_profile.py: the tiny size on CPU (host threads, not kernels)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import child_env

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_profile  # noqa: E402


def test_kernels_are_sorted_into_kinds():
  assert gpu_profile.kind_of("nvjet_sm90_tst_128x128_64x6_2x1_v_bz_NNT") == "gemm"
  assert gpu_profile.kind_of("gemm_fusion_dot_121") == "gemm"
  assert gpu_profile.kind_of("input_reduce_fusion_74") == "reduce"
  assert gpu_profile.kind_of("loop_multiply_fusion") == "elementwise"
  assert gpu_profile.kind_of("wrapped_transpose") == "copy"
  assert gpu_profile.kind_of("wrapped_convert") == "other"


def test_device_lanes_are_the_streams_only():
  """A device's "XLA Ops" line repeats its stream's kernels: counted once."""
  trace = {"traceEvents": [
    {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
    {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "Stream #14(Compute)"}},
    {"ph": "M", "name": "thread_name", "pid": 1, "tid": 8, "args": {"name": "XLA Ops"}},
    {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}},
    {"ph": "X", "name": "loop_add_fusion", "pid": 1, "tid": 7, "dur": 5.0},
    {"ph": "X", "name": "loop_add_fusion", "pid": 1, "tid": 7, "dur": 3.0},
    {"ph": "X", "name": "add", "pid": 1, "tid": 8, "dur": 8.0},
    {"ph": "X", "name": "python", "pid": 2, "tid": 1, "dur": 100.0},
  ]}  # fmt: skip
  totals, lanes = gpu_profile.device_kernels(trace)
  assert totals == {"loop_add_fusion": 8.0} and lanes == ["/device:GPU:0: Stream #14(Compute)"]


@pytest.mark.slow
def test_gpu_profile_runs_tiny_and_writes_its_json(tmp_path):
  out = tmp_path / "gpu_profile.json"
  command = [sys.executable, "gpu_profile.py", "--size", "tiny", "--steps", "1", "--warmup", "1",
             "--variants", "bf16_native,autocast_bfloat16_l0", "--output", str(out)]  # fmt: skip
  env = child_env(JAX_PLATFORMS="cpu")
  done = subprocess.run(
    command, cwd=ROOT / "benchmarks", env=env, capture_output=True, text=True, timeout=600
  )
  assert done.returncode == 0, done.stderr[-4000:]
  report = json.loads(out.read_text())
  assert list(report["variants"]) == ["bf16_native", "autocast_bfloat16_l0"]
  for row in report["variants"].values():
    assert row["kernel_ms"] > 0 and row["bytes_accessed"] > 0 and row["by_kind_ms"]
  assert "excess over bf16_native" in done.stdout
