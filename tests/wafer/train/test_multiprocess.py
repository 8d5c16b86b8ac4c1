"""Many processes: two `wafer run` processes (one CPU device each, gloo collectives) train num_csx=2.

Their losses must match a one-process ``num_csx=2`` run over two local devices, process 0 alone
writes metrics.jsonl, and both write and restore orbax checkpoints in one shared model_dir.

A mistake one process finds (settings that do not fit the checkpoint, a damaged checkpoint, a
model_dir process 0 cannot write, data only one process reads) stops both with the same message,
at once: the subprocesses must finish well inside their timeout (``jax.distributed`` would
otherwise leave the other process waiting in a collective, then fail it with a traceback).
"""

import base64
import io
import json
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from models.mlp import EXAMPLE_PARAMS
from tests.devices import needs_devices, on_cpu
from tests.processes import child_env
from wafer import cluster, runner
from wafer.config import ConfigError
from wafer.config.errors import Problem
from wafer.errors import CheckpointMismatch, ClusterConfigError, DataError, ExecutorError, OtherProcessFailed
from wafer.train.checkpoint import UnreadableCheckpoint

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


def _env() -> dict[str, str]:
  return child_env(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")


def _finish(procs: list[subprocess.Popen], timeout: float = 240) -> list[tuple[int, str]]:
  """``(exit code, output)`` of each process; fails the test when one is still running after ``timeout`` s."""
  outs = []
  try:
    for p in procs:
      try:
        outs.append(p.communicate(timeout=timeout)[0])
      except subprocess.TimeoutExpired:
        pytest.fail(f"process {len(outs)} still runs after {timeout} s: it waits for the other one")
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  return [(p.returncode, out) for p, out in zip(procs, outs)]


def _launch(
  params: Path, model_dir: Path, max_steps: int, *overrides: str, patch: str = ""
) -> list[tuple[int, str]]:
  """``wafer run`` in two processes: ``(exit code, output)`` of each.

  ``patch``: Python run in each process before the CLI, with ``PROCESS`` its process id (to make one
  process alone see a damaged file, as a file system that caches differently on each host would).
  """
  port = _free_port()
  procs = []
  for i in range(2):
    code = f"import sys\nPROCESS = {i}\n{patch}\nfrom wafer.cli import main\nsys.exit(main(sys.argv[1:]))"
    cmd = [sys.executable, "-c", code, "run",
           "--params", str(params), "--model_dir", str(model_dir), "--num_processes", "2", "--process_id", str(i),
           "--coordinator_address", f"127.0.0.1:{port}", f"runconfig.max_steps={max_steps}", *overrides]  # fmt: skip
    procs.append(
      subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    )
  return _finish(procs)


def _two_processes(
  params: Path, model_dir: Path, max_steps: int, *overrides: str, patch: str = ""
) -> list[str]:
  results = _launch(params, model_dir, max_steps, *overrides, patch=patch)
  for code, out in results:
    assert code == 0, out[-3000:]
  return [out for _, out in results]


def _errors(results: list[tuple[int, str]]) -> list[str]:
  """The ``wafer run: error:`` line of each process, checking that each exited 1 without a traceback."""
  lines = []
  for code, out in results:
    assert code == 1 and "Traceback" not in out, out[-3000:]
    lines += [line for line in out.splitlines() if line.startswith("wafer run: error: ")]
  assert len(lines) == len(results), lines
  return lines


def _losses(model_dir: Path) -> dict[int, float]:
  lines = (model_dir / "metrics.jsonl").read_text().splitlines()
  return {r["step"]: r["loss"] for r in map(json.loads, lines) if "loss" in r}


@pytest.mark.slow
def test_two_processes_match_one_process_with_two_devices(tmp_path):
  if not on_cpu():  # the processes run on CPU devices (JAX_PLATFORMS=cpu, gloo): the reference must too
    pytest.skip(
      "the one-process reference runs on the default backend; it must be the CPU (JAX_PLATFORMS=cpu)"
    )
  needs_devices(2)  # the one-process reference: num_csx=2 over two local devices
  params = _params(tmp_path)
  shared = tmp_path / "shared"
  first, second = _two_processes(params, shared, max_steps=6)
  assert "| Train Device=CPU, Step=6" in first and "| Train" not in second  # process 0 logs
  # each lists only what it wrote: process 1 its checkpoint parts, not process 0's metrics or TensorBoard
  assert "metrics.jsonl" in first.split("Outputs:")[1] and "metrics.jsonl" not in second.split("Outputs:")[1]
  assert "checkpoints" in second.split("Outputs:")[1]
  _two_processes(params, shared, max_steps=9)  # both processes restore the shared checkpoint of step 6
  ref = tmp_path / "ref"
  runner.run_params(params, [f"runconfig.model_dir={ref}", "runconfig.max_steps=9"])
  many, one = _losses(shared), _losses(ref)
  assert sorted(many) == sorted(one) == list(range(1, 10))
  assert many == one  # the same mesh of two systems: the same losses, bit for bit
  assert sorted(int(p.name) for p in (shared / "checkpoints").iterdir() if p.name.isdigit()) == [3, 6, 9]


@pytest.mark.slow
def test_two_processes_split_the_input_workers_and_match_one_process(tmp_path):
  if not on_cpu():  # the processes run on CPU devices (JAX_PLATFORMS=cpu, gloo): the reference must too
    pytest.skip(
      "the one-process reference runs on the default backend; it must be the CPU (JAX_PLATFORMS=cpu)"
    )
  needs_devices(2)  # the one-process reference: num_csx=2 over two local devices
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


# A mistake one process finds stops both, with the same message ----------------------------------


@pytest.fixture(scope="module")
def trained_to_6(tmp_path_factory):
  """params.yaml and a model_dir two processes trained to step 6 (checkpoints 3 and 6)."""
  tmp = tmp_path_factory.mktemp("mp")
  params = _params(tmp)
  _two_processes(params, tmp / "shared", max_steps=6)
  return params, tmp / "shared"


def _copy(trained: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
  params, model_dir = trained
  shutil.copytree(model_dir, tmp_path / "md")
  return params, tmp_path / "md"


def _checkpoints(model_dir: Path) -> list[str]:
  return sorted(p.name for p in (model_dir / "checkpoints").iterdir() if not p.name.startswith("."))


@pytest.mark.slow  # two processes through the CLI (~10-20 s a run)
def test_a_resume_with_other_settings_stops_every_process_with_the_same_message(trained_to_6, tmp_path):
  params, model_dir = _copy(trained_to_6, tmp_path)
  first, second = _errors(_launch(params, model_dir, 9, "train_input.batch_size=32"))
  assert first == second
  assert "Cannot resume from the checkpoint of step 6" in first
  assert "train_input.batch_size: checkpoint 64, now 32" in first
  assert _checkpoints(model_dir) == ["3", "6"]  # nothing was changed


@pytest.mark.slow  # two processes through the CLI (~10-20 s a run)
def test_a_resume_with_another_optimizer_stops_every_process_with_one_message_naming_the_keys(
  trained_to_6, tmp_path
):
  # Adam's state does not fit SGD's checkpoint; process 1 alone cannot read the settings the checkpoint
  # recorded (as a file system caching otherwise would): both still print process 0's message
  params, model_dir = _copy(trained_to_6, tmp_path)
  data = yaml.safe_load(params.read_text())
  data["optimizer"] = {"optimizer_type": "Adam", "learning_rate": 0.01, "loss_scaling_factor": "dynamic"}
  params = tmp_path / "adam.yaml"
  params.write_text(yaml.safe_dump(data))
  patch = (
    "import wafer.train.checkpoint as c\nif PROCESS == 1:\n  c.Checkpoints.meta = lambda self, step: {}\n"
  )
  first, second = _errors(_launch(params, model_dir, 9, patch=patch))
  assert first == second
  assert "The checkpoint of step 6 in" in first and "does not fit this model" in first
  assert "optimizer.optimizer_type: checkpoint 'SGD', now 'Adam'" in first
  assert _checkpoints(model_dir) == ["3", "6"]


def _on_process_1(name: str, replacement: str) -> str:
  """A `_launch` patch: on process 1 only, ``wafer.train.checkpoint.<name>`` becomes ``replacement``
  (an expression that may call ``_real``, the original)."""
  return (
    f"import wafer.train.checkpoint as c\n_real = c.{name}\nif PROCESS == 1:\n  c.{name} = {replacement}\n"
  )


@pytest.mark.slow  # two processes through the CLI (~10-20 s a run)
def test_a_damaged_latest_checkpoint_is_skipped_by_every_process(trained_to_6, tmp_path):
  params, model_dir = _copy(trained_to_6, tmp_path)
  for f in (model_dir / "checkpoints" / "6" / "state" / "d").iterdir():
    f.write_bytes(f.read_bytes()[:3])
  first, second = _two_processes(params, model_dir, 9)
  assert f"the checkpoint of step 6 at {model_dir / 'checkpoints' / '6'} cannot be read" in first
  assert "Resuming from the checkpoint at step 3." in first and "Step=9" in first
  assert _checkpoints(model_dir) == ["3", "6", "6.unreadable", "9"]
  assert sorted(_losses(model_dir)) == list(range(1, 10))


@pytest.mark.slow  # two processes through the CLI (~10-20 s a run)
def test_a_checkpoint_only_one_process_cannot_read_is_skipped_by_both(trained_to_6, tmp_path):
  # process 1 alone finds step 6 damaged: both must restore step 3 (not each its own), and say why
  params, model_dir = _copy(trained_to_6, tmp_path)
  patch = _on_process_1("_damage", "lambda d: 'seen damaged by process 1' if d.name == '6' else _real(d)")
  first, second = _two_processes(params, model_dir, 9, patch=patch)
  assert "the checkpoint of step 6" in first and "cannot be read (seen damaged by process 1)" in first
  assert "Resuming from the checkpoint at step 3." in first and "Step=9" in first
  assert _checkpoints(model_dir) == ["3", "6", "6.unreadable", "9"]
  assert sorted(_losses(model_dir)) == list(range(1, 10))


@pytest.mark.slow  # two processes through the CLI (~10-20 s a run)
def test_processes_that_see_different_checkpoints_stop_with_the_same_message(trained_to_6, tmp_path):
  # each process tries the checkpoints it sees, each try an agreement: different lists would pair the
  # agreements up wrongly (or leave one process in a collective), so the lists are agreed first
  params, model_dir = _copy(trained_to_6, tmp_path)
  patch = _on_process_1("Checkpoints.steps", "lambda self: [s for s in _real(self) if s != 6]")
  first, second = _errors(_launch(params, model_dir, 9, patch=patch))
  assert first == second
  assert "see different checkpoints (checkpoint steps: process 0 [3, 6], process 1 [3])" in first
  assert "must be one folder every host sees" in first


@pytest.mark.slow  # two processes through the CLI (~10-20 s a run)
def test_all_checkpoints_damaged_stops_every_process_with_the_same_message(trained_to_6, tmp_path):
  params, model_dir = _copy(trained_to_6, tmp_path)
  for step in ("3", "6"):
    (model_dir / "checkpoints" / step / "meta" / "metadata").write_bytes(b"")
  first, second = _errors(_launch(params, model_dir, 9))
  assert first == second and "None of the checkpoints in" in first and "(steps 3, 6) can be read" in first


@pytest.mark.slow  # two processes through the CLI (~10-20 s a run)
def test_a_model_dir_process_0_cannot_write_stops_every_process_with_its_message(tmp_path):
  # process 0 alone writes the compile report: its error used to leave process 1 waiting, then a traceback
  params = _params(tmp_path)
  (tmp_path / "md" / "compile_report.txt").mkdir(parents=True)
  first, second = _errors(_launch(params, tmp_path / "md", 3))
  assert first == second and "cannot write the compile report into model_dir" in first


@pytest.mark.slow  # two processes through the CLI (~10-20 s a run)
def test_data_only_one_process_cannot_read_stops_every_process_with_its_message(tmp_path):
  # each process may read other files (its own input workers): process 1 alone finds them damaged
  params = _params(tmp_path)
  patch = (
    "import models.mlp as m\n"
    "from wafer.data.processors import DataError\n"
    "_task = m.example_task\n"
    "def example_task(*a, **k):\n"
    "  task = _task(*a, **k)\n"
    "  def damaged(seed):\n"
    "    raise DataError('shard-1.bin:3: a damaged record (simulated)')\n"
    "  if PROCESS == 1:\n"
    "    task.train_data = damaged\n"
    "  return task\n"
    "m.example_task = example_task\n"
  )
  first, second = _errors(_launch(params, tmp_path / "md", 3, patch=patch))
  assert first == second == "wafer run: error: shard-1.bin:3: a damaged record (simulated)"


@pytest.mark.slow  # two processes through the CLI (~10 s)
def test_processes_started_with_different_settings_stop_with_the_same_message(tmp_path):
  params = _params(tmp_path)
  patch = "if PROCESS == 1:\n  sys.argv.append('optimizer.learning_rate=0.1')\n"
  first, second = _errors(_launch(params, tmp_path / "md", 3, patch=patch))
  assert first == second
  assert "started with different settings (optimizer.learning_rate: process 0 0.05, process 1 0.1)" in first
  assert not (tmp_path / "md" / "metrics.jsonl").exists()  # stopped before any work


@pytest.mark.slow  # two processes through the CLI (~10 s)
def test_processes_started_with_different_num_csx_stop_with_the_same_message(tmp_path):
  """Process 1's own num_csx check (it has too few devices) ran before the settings were compared: it
  stopped alone, and process 0 died in the comparison's collective with a Gloo traceback."""
  params = _params(tmp_path)
  patch = "if PROCESS == 1:\n  sys.argv.append('runconfig.num_csx=4')\n"
  first, second = _errors(_launch(params, tmp_path / "md", 3, patch=patch))
  assert first == second
  assert "started with different settings (runconfig.num_csx: process 0 2, process 1 4)" in first


@pytest.mark.slow  # two processes through the CLI (~10 s)
def test_a_params_error_of_one_process_stops_every_process_with_its_message(tmp_path):
  """A mistyped key on one process only: the other waited 2 minutes for it, then showed a backend
  traceback (``GetKeyValue() timed out``)."""
  params = _params(tmp_path)
  patch = "if PROCESS == 1:\n  sys.argv.append('runconfig.max_stesp=5')\n"
  t0 = time.monotonic()
  first, second = _errors(_launch(params, tmp_path / "md", 3, patch=patch))
  assert first == second
  assert "unknown key 'max_stesp'; did you mean 'max_steps'?" in first
  assert time.monotonic() - t0 < 100  # (JAX's own timeouts are minutes)


@pytest.mark.slow  # two processes through the CLI (~20 s)
def test_a_killed_process_leaves_the_other_one_line_and_exit_code_1(tmp_path):
  """Process 1 is killed while process 0 waits for it in a collective: process 0 said so in a
  traceback from inside JAX, then JAX's shutdown barrier aborted it with a C++ stack (exit 134)."""
  params = _params(tmp_path)
  patch = (
    "if PROCESS == 1:\n"
    "  import os, signal\n"
    "  from wafer import cluster\n"
    "  def gone(error):\n"
    "    os.kill(os.getpid(), signal.SIGKILL)\n"
    "  cluster.same_on_every_process = gone\n"
  )
  (zero, out0), (one, _) = _launch(params, tmp_path / "md", 3, patch=patch)
  assert one == -signal.SIGKILL
  assert zero == 1 and "Traceback" not in out0 and "Check failure" not in out0, out0[-3000:]
  [line] = [line for line in out0.splitlines() if line.startswith("wafer run: error: ")]
  assert "another process of this run stopped or cannot be reached" in line


# How an error reaches the other processes (wafer.cluster.first_error) ----------------------------


def _passed_on(error: BaseException, source: int = 1) -> BaseException:
  """``error`` as another process receives it: described, sent as bytes, rebuilt."""
  return cluster._rebuild(json.loads(cluster._describe(error).decode("utf-8")), source)


ERRORS = {
  "executor": lambda m: ExecutorError(m),
  "mismatch": lambda m: CheckpointMismatch(m, 7),
  "unreadable": lambda m: UnreadableCheckpoint(m),
  "cluster": lambda m: ClusterConfigError(m),
  "data": lambda m: DataError(m),
  "config": lambda m: ConfigError([Problem(("runconfig", "max_steps"), m, 3), Problem((), "two")], "p.yaml"),
}


@pytest.mark.parametrize("kind", sorted(ERRORS))
@given(message=st.text(max_size=200))
def test_a_wafer_error_reaches_the_other_processes_as_the_same_type_and_message(kind, message):
  error = ERRORS[kind](message)
  copy = _passed_on(error)
  assert type(copy) is type(error) and str(copy) == str(error)
  assert getattr(copy, "step", None) == getattr(error, "step", None)  # a checkpoint's number is kept


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyError("k"), ZeroDivisionError()])
def test_a_bug_reaches_the_other_processes_as_other_process_failed_naming_it(error):
  copy = _passed_on(error, source=1)
  assert isinstance(copy, OtherProcessFailed)
  assert str(copy).startswith(f"process 1 of 1 stopped with builtins.{type(error).__name__}: {error}")


def test_a_payload_that_calls_one_of_our_functions_is_not_unpickled(tmp_path):
  # what another process sends is unpickled as an error only: a function of ours (here one that
  # writes a file) named in the payload is refused, and the error arrives as OtherProcessFailed
  target = tmp_path / "written"

  class Payload(Exception):
    def __reduce__(self):
      from wafer._io import write_bytes_atomically

      return write_bytes_atomically, (str(target), b"x")

  described = {"type": "wafer.train.loop:ExecutorError", "message": "m", "attrs": {}}
  described["pickle"] = base64.b64encode(pickle.dumps(Payload())).decode("ascii")
  copy = cluster._rebuild(described, 1)
  assert not target.exists()
  assert type(copy).__name__ == "ExecutorError" and str(copy) == "m"  # rebuilt from type and message


def test_a_dotted_name_does_not_reach_through_our_modules():
  # pickle protocol 4 resolves "pickle.loads" in module "wafer.cluster" to the unrestricted pickle.loads
  def text(s):
    return b"\x8c" + bytes([len(s)]) + s.encode()

  payload = b"\x80\x04" + text("wafer.cluster") + text("pickle.loads") + b"\x93" + text("x") + b"\x85R."
  with pytest.raises(pickle.UnpicklingError, match="not an error class"):
    cluster._OwnUnpickler(io.BytesIO(payload)).load()


def test_one_process_gets_its_own_error_back_and_no_error_is_none():
  error = ExecutorError("x")
  assert cluster.first_error(error) is error and cluster.first_error(None) is None
  with pytest.raises(ExecutorError, match="^x$"):
    with cluster.same_outcome():
      raise error


_AGREE = """
import json, sys
import jax
jax.distributed.initialize(sys.argv[1], 2, int(sys.argv[2]))
from wafer import cluster
from wafer.errors import CheckpointMismatch
me = jax.process_index()
cases = {
  "none": None,
  "one": CheckpointMismatch("step 7 d\u00f6es not fit " + "x" * 5000, 7) if me == 1 else None,
  "both": ValueError(f"bug on {me}") if me == 0 else CheckpointMismatch("other", 1),
}
out = {}
for name, error in cases.items():
  got = cluster.first_error(error)
  out[name] = None if got is None else [type(got).__name__, str(got), getattr(got, "step", None), got is error]
print(json.dumps(out))
"""


@pytest.mark.slow  # two processes start jax.distributed (~5-10 s)
def test_first_error_passes_the_lowest_processs_error_to_every_process():
  port = _free_port()
  procs = [
    subprocess.Popen(
      [sys.executable, "-c", _AGREE, f"127.0.0.1:{port}", str(i)],
      env=_env(),
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )  # fmt: skip
    for i in range(2)
  ]
  results = _finish(procs, timeout=120)
  for code, out in results:
    assert code == 0, out[-3000:]
  zero, one = (json.loads(out.strip().splitlines()[-1]) for _, out in results)
  assert zero["none"] is None and one["none"] is None
  message = "step 7 d\u00f6es not fit " + "x" * 5000
  assert zero["one"] == ["CheckpointMismatch", message, 7, False] and one["one"][-1] is True
  assert one["one"][:3] == zero["one"][:3]
  assert zero["both"] == ["ValueError", "bug on 0", None, True]  # process 0's, the lowest of the two
  assert (
    one["both"][0] == "OtherProcessFailed"
    and "process 0 of 2 stopped with builtins.ValueError: bug on 0" in (one["both"][1])
  )


def test_an_incomplete_process_flag_set_is_one_sentence(monkeypatch):
  """JAX's own message ends with a period; the CLI's sentence after it doubled it ("defined.. Give")."""

  def refuse(**_):  # JAX's own check (the real one refuses once this process has used JAX at all)
    raise ValueError("coordinator_address should be defined.")

  monkeypatch.setattr(cluster.jax.distributed, "initialize", refuse)
  with pytest.raises(ClusterConfigError) as raised:
    cluster.initialize(None, 2, 0)
  assert "defined. Give --num_processes" in str(raised.value)
