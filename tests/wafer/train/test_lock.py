"""One run at a time in a model_dir: a second run is refused at once, naming the run that holds it.

Two runs sharing a model_dir used to run into each other (the second resumed from the live run's
checkpoint, their saves clashed, metrics.jsonl got steps twice).
"""

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from models.mlp import example_run
from wafer.errors import WaferError
from wafer.train import Checkpoints, ExecutorError, read_metrics, run
from wafer.train import lock as lock_module
from wafer.train.lock import LOCK_NAME, ModelDirLock

fcntl = pytest.importorskip("fcntl")
ROOT = Path(__file__).resolve().parents[3]


def _run(model_dir, **overrides):
  return run(*example_run(str(model_dir), **overrides), progress=False)


def _hold(model_dir: Path, record: dict) -> int:
  """Lock ``model_dir`` as a live run does (flock on wafer.lock, who holds it inside); returns the fd."""
  model_dir.mkdir(parents=True, exist_ok=True)
  fd = os.open(model_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT)
  fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  os.pwrite(fd, json.dumps(record).encode(), 0)
  return fd


def test_a_second_run_into_a_locked_model_dir_is_refused_before_any_work_naming_the_holder(tmp_path):
  record = {"pid": 4242, "host": "h1", "started": "2025-01-02 03:04:05 +0000", "command": "wafer run"}
  fd = _hold(tmp_path, record)
  try:
    with pytest.raises(ExecutorError) as error:
      _run(tmp_path, max_steps=4, checkpoint_steps=2, log_steps=1)
  finally:
    os.close(fd)
  message = str(error.value)
  assert message.startswith(
    f"Another run (pid 4242, on host h1, started 2025-01-02 03:04:05 +0000, command: wafer run) is writing "
    f"into {tmp_path}"
  )
  assert message.endswith("Wait for it to finish, or choose another --model_dir.") and "\n" not in message
  assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_NAME]  # no report, metrics or checkpoint
  # once the holder is gone, the same run goes; its lock is released at its end (a rerun goes too)
  _run(tmp_path, max_steps=2, checkpoint_steps=2, log_steps=1)
  _run(tmp_path, max_steps=4, checkpoint_steps=2, log_steps=1)
  assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4]  # each step once


def test_a_run_holds_the_lock_while_it_runs_and_a_failed_run_releases_it(tmp_path, monkeypatch):
  """Seen at the run's checkpoint save (the middle of the run): the lock is taken, and names this process."""
  seen = []
  save = Checkpoints.save

  def probing_save(self, state, meta):
    fd = os.open(tmp_path / LOCK_NAME, os.O_RDWR)
    try:
      with pytest.raises(BlockingIOError):
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      seen.append(json.loads(os.pread(fd, 4096, 0)))
    finally:
      os.close(fd)
    return save(self, state, meta)

  monkeypatch.setattr(Checkpoints, "save", probing_save)
  _run(tmp_path, max_steps=2, checkpoint_steps=2, log_steps=1)
  assert seen and seen[0]["pid"] == os.getpid()
  os.close(_hold(tmp_path, {}))  # released at the end of the run
  with pytest.raises(WaferError, match="max_steps"):  # a run that fails releases it too
    _run(tmp_path, max_steps=1, checkpoint_steps=1, log_steps=1)
  os.close(_hold(tmp_path, {}))


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
  holder = subprocess.Popen(
    [
      sys.executable,
      "-c",
      "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
      "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, b'{\"pid\": %d}' % os.getpid()); print('held', flush=True); "
      "time.sleep(120)",
      str(tmp_path / LOCK_NAME),
    ],
    stdout=subprocess.PIPE,
    text=True,
  )
  try:
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(ExecutorError, match=rf"^Another run \(pid {holder.pid}\) is writing into"):
      ModelDirLock.acquire(tmp_path)
  finally:
    holder.kill()  # SIGKILL: no cleanup runs in the holder
    holder.wait()
    holder.stdout.close()
  lock = ModelDirLock.acquire(tmp_path)  # the kernel released it with the process
  assert lock.held
  lock.release()
  assert not lock.held and (tmp_path / LOCK_NAME).read_text() == ""


def test_the_cli_prints_the_refusal_as_one_line(tmp_path, capsys):
  from wafer import cli

  fd = _hold(tmp_path, {"pid": 77})
  try:
    rc = cli.main(
      [
        "run",
        "--params",
        str(ROOT / "models" / "mlp" / "configs" / "params_mlp.yaml"),
        "--model_dir",
        str(tmp_path),
        "runconfig.max_steps=2",
      ]
    )
  finally:
    os.close(fd)
  captured = capsys.readouterr()
  assert rc == 1 and "Traceback" not in captured.err
  assert f"wafer run: error: Another run (pid 77) is writing into {tmp_path}" in captured.err
  assert "| Train" not in captured.out


def test_without_fcntl_or_where_the_file_system_refuses_locks_the_run_goes_unlocked(tmp_path, monkeypatch):
  monkeypatch.setattr(lock_module, "fcntl", None)  # Windows
  assert not ModelDirLock.acquire(tmp_path).held
  monkeypatch.undo()

  class NoLocks:
    LOCK_EX, LOCK_NB = fcntl.LOCK_EX, fcntl.LOCK_NB

    @staticmethod
    def flock(fd, how):
      raise OSError(errno.ENOLCK, "No locks available")

  monkeypatch.setattr(lock_module, "fcntl", NoLocks)
  said = []
  lock = ModelDirLock.acquire(tmp_path, say=said.append)
  assert not lock.held
  assert said == [
    f"Note: cannot lock {tmp_path / LOCK_NAME} (No locks available): a second run started into {tmp_path} "
    "would not be refused, so start only one."
  ]
  lock.release()  # nothing to release
