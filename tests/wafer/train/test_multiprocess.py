"""Many processes: two `wafer run` processes (one CPU device each, gloo collectives) train num_csx=2.

Their losses must match a one-process ``num_csx=2`` run over two local devices, process 0 alone
writes metrics.jsonl, and both write and restore orbax checkpoints in one shared model_dir.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from models.mlp import EXAMPLE_PARAMS
from wafer import runner

ROOT = Path(__file__).resolve().parents[3]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _params(tmp_path: Path) -> Path:
  data = yaml.safe_load(EXAMPLE_PARAMS)
  data["runconfig"].update(num_csx=2, log_steps=1, checkpoint_steps=3)
  path = tmp_path / "params.yaml"
  path.write_text(yaml.safe_dump(data))
  return path


def _two_processes(params: Path, model_dir: Path, max_steps: int) -> list[str]:
  port = _free_port()
  env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
  env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
  procs = []
  for i in range(2):
    cmd = [sys.executable, "-c", "import sys; from wafer.cli import main; sys.exit(main(sys.argv[1:]))", "run",
           "--params", str(params), "--model_dir", str(model_dir), "--num_processes", "2", "--process_id", str(i),
           "--coordinator_address", f"127.0.0.1:{port}", f"runconfig.max_steps={max_steps}"]  # fmt: skip
    procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
  outs = []
  try:
    for p in procs:
      outs.append(p.communicate(timeout=240)[0])
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  for p, out in zip(procs, outs):
    assert p.returncode == 0, out[-3000:]
  return outs


def _losses(model_dir: Path) -> dict[int, float]:
  lines = (model_dir / "metrics.jsonl").read_text().splitlines()
  return {r["step"]: r["loss"] for r in map(json.loads, lines) if "loss" in r}


@pytest.mark.slow
def test_two_processes_match_one_process_with_two_devices(tmp_path):
  params = _params(tmp_path)
  shared = tmp_path / "shared"
  first, second = _two_processes(params, shared, max_steps=6)
  assert "| Train Device=CPU, Step=6" in first and "| Train" not in second  # process 0 logs
  _two_processes(params, shared, max_steps=9)  # both processes restore the shared checkpoint of step 6
  ref = tmp_path / "ref"
  runner.run_params(params, [f"runconfig.model_dir={ref}", "runconfig.max_steps=9"])
  many, one = _losses(shared), _losses(ref)
  assert sorted(many) == sorted(one) == list(range(1, 10))
  assert many == one  # the same mesh of two systems: the same losses, bit for bit
  assert sorted(int(p.name) for p in (shared / "checkpoints").iterdir() if p.name.isdigit()) == [3, 6, 9]


@pytest.mark.slow
def test_two_processes_split_the_input_workers_and_match_one_process(tmp_path):
  # fc_mnist reads a grain pipeline: each process builds only its own system's rows (its workers).
  data = yaml.safe_load((ROOT / "models" / "fc_mnist" / "configs" / "params_fc_mnist.yaml").read_text())
  data["runconfig"].update(num_csx=2, num_workers_per_csx=2, log_steps=1, checkpoint_steps=100)
  params = tmp_path / "params.yaml"
  params.write_text(yaml.safe_dump(data))
  _two_processes(params, tmp_path / "shared", max_steps=5)
  ref = tmp_path / "ref"
  runner.run_params(params, [f"runconfig.model_dir={ref}", "runconfig.max_steps=5"])
  many, one = _losses(tmp_path / "shared"), _losses(ref)
  assert sorted(many) == list(range(1, 6))
  assert many == one
