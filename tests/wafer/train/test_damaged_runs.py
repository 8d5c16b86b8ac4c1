"""Damaged and interrupted runs: a killed run's metrics.jsonl, resumes, checkpoints, disks, ctrl-C.

Each test damages a model_dir the way a crash, a full disk or a user would, then checks that the
next run (or reader) reports it with a message that says where and what to do, and that
model_dir stays consistent (`wafer.train.read_metrics` never sees a step twice from training).
"""

import dataclasses
import errno
import json
import os
import shutil
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from models.mlp import example_run, example_task
from wafer import _io
from wafer.errors import WaferError
from wafer.train import Checkpoints, ExecutorError, IndexedBatches, RunInterrupted, read_metrics, run
from wafer.train import metrics as metrics_module
from wafer.train.metrics import SUPERSEDED, Metrics

ROOT = Path(__file__).resolve().parents[3]


def _run(model_dir, **overrides):
  return run(*example_run(str(model_dir), **overrides), progress=False)


def _steps(model_dir, say=None):
  return [r["step"] for r in read_metrics(Path(model_dir) / "metrics.jsonl", say=say) if "loss" in r]


def _same_params(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module")
def killed_at_25(tmp_path_factory):
  """A model_dir as a run to 40 killed after step 25 leaves it: checkpoints 10, 20; records 1..25."""
  model_dir = tmp_path_factory.mktemp("killed")
  _run(model_dir, max_steps=25, checkpoint_steps=10, log_steps=5)
  shutil.rmtree(model_dir / "checkpoints" / "25")  # the final-step checkpoint a killed run never wrote
  return model_dir


# metrics.jsonl: a partial line, duplicate steps ---------------------------------------------------


def test_resume_moves_the_killed_runs_later_records_aside_no_step_twice(killed_at_25, tmp_path, capsys):
  model_dir = tmp_path / "md"
  shutil.copytree(killed_at_25, model_dir)
  assert _steps(model_dir) == [1, 5, 10, 15, 20, 25]
  before = (model_dir / "metrics.jsonl").read_text().splitlines()
  capsys.readouterr()
  _run(model_dir, max_steps=40, checkpoint_steps=10, log_steps=5)
  out = capsys.readouterr().out
  assert "Resuming from the checkpoint at step 20." in out
  assert "held 1 record(s) of steps after the checkpoint of step 20 (steps 25..25" in out
  steps = _steps(model_dir)
  assert steps == sorted(set(steps)) == [1, 5, 10, 15, 20, 25, 30, 35, 40]  # each step once, in order
  assert (model_dir / SUPERSEDED).read_text().splitlines() == before[-1:]  # kept, not deleted
  whole = read_metrics(killed_at_25 / "metrics.jsonl")  # the records up to 20 are the original lines
  assert read_metrics(model_dir / "metrics.jsonl")[:5] == whole[:5]


def test_a_partial_last_line_is_moved_aside_on_resume_never_merged(killed_at_25, tmp_path, capsys):
  model_dir = tmp_path / "md"
  shutil.copytree(killed_at_25, model_dir)
  path = model_dir / "metrics.jsonl"
  with path.open("ab") as f:
    f.write(b'{"step": 26, "loss": 1.2')  # SIGKILL in the middle of writing a record
  said = []
  assert _steps(model_dir, say=said.append) == [1, 5, 10, 15, 20, 25]
  assert said == [
    f'{path}:7: not a complete record (a run killed while writing it?); skipped: \'{{"step": 26, "loss": 1.2\''
  ]
  capsys.readouterr()
  _run(model_dir, max_steps=30, checkpoint_steps=10, log_steps=5)
  out = capsys.readouterr().out
  assert f"Warning: {path}:7: not a complete record" in out
  said = []
  assert _steps(model_dir, say=said.append) == [1, 5, 10, 15, 20, 25, 30] and said == []
  assert all(json.loads(line) for line in path.read_text().splitlines())  # every line a whole record
  assert (model_dir / SUPERSEDED).read_text().splitlines()[-1] == '{"step": 26, "loss": 1.2'


@pytest.mark.slow  # a few seconds of training; kept out of the default suite's 10 minutes
def test_eval_after_a_partial_line_starts_a_line_of_its_own(tmp_path, capsys):
  _run(tmp_path, max_steps=10, checkpoint_steps=10, log_steps=5)
  path = tmp_path / "metrics.jsonl"
  with path.open("ab") as f:
    f.write(b'{"step": 11, "lo')
  _run(tmp_path, mode="eval")  # eval modes append to the history as it is
  assert "ended in a partial line" in capsys.readouterr().out
  said = []
  records = read_metrics(path, say=said.append)
  assert records[-1]["step"] == 10 and "eval/accuracy" in records[-1]  # not glued to the partial line
  assert len(said) == 1 and f"{path}:4:" in said[0]


@pytest.mark.slow  # a few seconds of training; kept out of the default suite's 10 minutes
def test_a_run_killed_before_its_first_checkpoint_starts_the_history_again(tmp_path, capsys):
  _run(tmp_path, max_steps=5, checkpoint_steps=0, log_steps=1)  # no checkpoint: a rerun starts at 0
  assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").iterdir())
  _run(tmp_path, max_steps=3, checkpoint_steps=0, log_steps=1)
  assert _steps(tmp_path) == [1, 2, 3]
  assert [json.loads(x)["step"] for x in (tmp_path / SUPERSEDED).read_text().splitlines()] == [1, 2, 3, 4, 5]


RECORD = st.fixed_dictionaries({"step": st.integers(0, 10**6), "loss": st.floats(allow_nan=False)})


@given(
  records=st.lists(RECORD, max_size=8),
  cut=st.integers(0, 200),
  garbage=st.binary(max_size=30),
)
def test_read_metrics_returns_exactly_the_whole_records(tmp_path_factory, records, cut, garbage):
  """Whatever a crash leaves after whole records (a cut line, any bytes), the whole records come back."""
  path = tmp_path_factory.mktemp("m") / "metrics.jsonl"
  whole = "".join(json.dumps(r) + "\n" for r in records).encode()
  extra = json.dumps({"step": 7, "loss": 0.5}).encode()[:cut] + garbage.replace(b"\n", b" ")
  path.write_bytes(whole + extra)
  said = []
  got = read_metrics(path, say=said.append)
  tail = metrics_module._record(extra) if extra.strip() else None
  assert got == records + ([tail] if tail is not None else [])
  assert len(said) == (1 if extra.strip() and tail is None else 0)
  assert all(s.startswith(f"{path}:{len(records) + 1}: ") for s in said)


@pytest.mark.slow  # a few seconds of training; kept out of the default suite's 10 minutes
def test_a_full_disk_during_a_metrics_write_leaves_no_partial_line(tmp_path, monkeypatch):
  import types

  _run(tmp_path, max_steps=10, checkpoint_steps=10, log_steps=5)
  before = (tmp_path / "metrics.jsonl").read_bytes()

  def half_then_full(fd, data):  # the disk fills in the middle of the record
    if len(data) > 20:
      os.write(fd, bytes(data[:20]))
      raise OSError(errno.ENOSPC, "No space left on device")
    return os.write(fd, data)

  fake_os = types.SimpleNamespace(**{k: getattr(os, k) for k in dir(os) if not k.startswith("__")})
  fake_os.write = half_then_full
  monkeypatch.setattr(metrics_module, "os", fake_os)
  with pytest.raises(ExecutorError, match=r"Cannot write the metrics of step 11 to .*metrics\.jsonl \(No space "
                     r"left on device\): free space in model_dir .* rerun the same command"):  # fmt: skip
    _run(tmp_path, max_steps=20, checkpoint_steps=10, log_steps=1)
  monkeypatch.undo()
  assert (tmp_path / "metrics.jsonl").read_bytes() == before  # the half record was cut off again
  _run(tmp_path, max_steps=20, checkpoint_steps=10, log_steps=5)
  assert _steps(tmp_path) == [1, 5, 10, 15, 20]


def test_a_metrics_file_of_garbage_is_moved_aside_with_a_few_lines_of_report(tmp_path, capsys):
  path = tmp_path / "metrics.jsonl"
  path.write_bytes(bytes(range(256)) * 40)  # 41 lines (b"\n" is among the bytes), none a record
  m = Metrics(tmp_path, "CPU")
  m.resume(0)
  out = capsys.readouterr().out.splitlines()
  assert len(out) == 4 and out[0].startswith(f"Warning: {path}:1: not a record") and "and 38 more" in out[3]
  assert path.read_bytes() == b"" and (tmp_path / SUPERSEDED).stat().st_size > 0


def test_a_full_disk_while_resuming_the_history_changes_nothing(killed_at_25, tmp_path, monkeypatch):
  model_dir = tmp_path / "md"
  shutil.copytree(killed_at_25, model_dir)
  before = (model_dir / "metrics.jsonl").read_bytes()

  def full(path, data):
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(metrics_module, "write_bytes_atomically", full)
  with pytest.raises(
    ExecutorError, match=r"Cannot rewrite .*metrics\.jsonl for the resume at step 20 \(No space "
  ):
    _run(model_dir, max_steps=30, checkpoint_steps=10, log_steps=5)
  assert (model_dir / "metrics.jsonl").read_bytes() == before and not (model_dir / SUPERSEDED).exists()


def test_a_folder_where_metrics_jsonl_belongs_or_a_file_where_checkpoints_belong_is_refused_before_training(
  tmp_path, capsys
):
  from wafer import cli

  argv = [
    "run",
    "--params",
    str(ROOT / "models" / "mlp" / "configs" / "params_mlp.yaml"),
    "runconfig.max_steps=5",
  ]
  (tmp_path / "a" / "metrics.jsonl").mkdir(parents=True)
  assert cli.main([*argv, "--model_dir", str(tmp_path / "a")]) == 1
  err = capsys.readouterr().err
  assert (
    "metrics.jsonl for the resume at step 0 (Is a directory); nothing was trained: a folder stands" in err
  )
  (tmp_path / "b").mkdir()
  (tmp_path / "b" / "checkpoints").write_text("")
  assert cli.main([*argv, "--model_dir", str(tmp_path / "b")]) == 1
  captured = capsys.readouterr()
  assert (
    f"{tmp_path / 'b' / 'checkpoints'} is a file, not the folder of checkpoints: move it away" in captured.err
  )
  assert "| Train" not in captured.out  # refused before training, not at the first save


def test_a_model_dir_that_cannot_be_written_is_refused_before_any_work(tmp_path, capsys):
  from wafer import cli

  (tmp_path / "file").write_text("")
  rc = cli.main(["run", "--model_dir", str(tmp_path / "file" / "md"), "runconfig.max_steps=20"])
  err = capsys.readouterr().err
  assert rc == 1 and "cannot be created" in err and "--model_dir DIR" in err and "Traceback" not in err
  _run(tmp_path / "md", max_steps=10, checkpoint_steps=10, log_steps=5)
  os.chmod(tmp_path / "md", 0o555)
  try:
    if os.access(tmp_path / "md", os.W_OK):
      return  # root: permissions are not enforced (the check below cannot fail here)
    rc = cli.main(["run", "--model_dir", str(tmp_path / "md"), "runconfig.max_steps=20"])
  finally:
    os.chmod(tmp_path / "md", 0o755)
  err = capsys.readouterr().err
  assert rc == 1 and "is not writable" in err and "--model_dir DIR" in err and "Traceback" not in err


# checkpoints -------------------------------------------------------------------------------------


def test_a_checkpoint_without_its_array_metadata_is_skipped_not_called_another_model(tmp_path, capsys):
  """A lost state/_METADATA used to read as "holds 0 arrays ... does not fit this model" and stop the run."""
  _run(tmp_path, max_steps=20, checkpoint_steps=10, log_steps=10)
  (tmp_path / "checkpoints" / "20" / "state" / "_METADATA").unlink()
  summary = _run(tmp_path, max_steps=30, checkpoint_steps=10, log_steps=10)
  out = capsys.readouterr().out
  assert "step 20" in out and "state/_METADATA" in out and "Resuming from the checkpoint at step 10." in out
  assert summary["final_step"] == 30 and (tmp_path / "checkpoints" / "20.unreadable").is_dir()


DAMAGE = {
  "arrays cut": lambda p: [f.write_bytes(f.read_bytes()[:3]) for f in (p / "state" / "d").iterdir()],
  "arrays garbage": lambda p: [
    f.write_bytes(b"\x5a" * f.stat().st_size) for f in (p / "state" / "d").iterdir()
  ],
  "arrays missing": lambda p: shutil.rmtree(p / "state" / "d"),
  "manifest empty": lambda p: (p / "state" / "manifest.ocdbt").write_bytes(b""),
  "meta empty": lambda p: (p / "meta" / "metadata").write_bytes(b""),
  "meta garbage": lambda p: (p / "meta" / "metadata").write_bytes(b"\xff\x00"),
  "no state": lambda p: shutil.rmtree(p / "state"),
  "empty folder": lambda p: [shutil.rmtree(p), p.mkdir()],
  # orbax reads these in the middle of the restore: the failure left orphaned reads ("Exception ignored in
  # <coroutine ...>", "RuntimeError: Event loop is closed" tracebacks) behind
  "array metadata garbage": lambda p: [
    f.write_bytes(b"{bad") for f in (p / "state" / "array_metadatas").iterdir()
  ],
  # JSON, but not wafer's object: a bare AttributeError ('list' object has no attribute 'get') in the resume
  "meta a list": lambda p: (p / "meta" / "metadata").write_text("[1, 2]"),
  "meta config a number": lambda p: (p / "meta" / "metadata").write_text('{"config": 5}'),
  # orbax does not list a file named like a step: the run resumed from the one before without a word, and its
  # save of step 20 deleted the file
  "a zero-byte file": lambda p: [shutil.rmtree(p), p.write_bytes(b"")],
}


@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_every_kind_of_damaged_latest_checkpoint_resumes_from_the_one_before(
  killed_at_25, tmp_path, capsys, how
):
  model_dir = tmp_path / "md"
  shutil.copytree(killed_at_25, model_dir)
  DAMAGE[how](model_dir / "checkpoints" / "20")
  capsys.readouterr()
  summary = _run(model_dir, max_steps=30, checkpoint_steps=10, log_steps=5)
  out, err = capsys.readouterr()
  assert f"the checkpoint of step 20 at {model_dir / 'checkpoints' / '20'} cannot be read" in out
  assert "Traceback" not in err and "Exception ignored" not in err
  assert "Resuming from the checkpoint at step 10." in out and summary["final_step"] == 30
  assert _steps(model_dir) == [1, 5, 10, 15, 20, 25, 30]
  aside = model_dir / "checkpoints" / "20.unreadable"  # kept, not deleted or overwritten by the new step 20
  assert (
    aside.exists()
    and f"Note: moved the unreadable checkpoint of step 20 aside ({aside.parent / '20'} -> {aside})" in out
  )


@pytest.mark.slow  # three runs, ~10 s; the zero-byte case of DAMAGE is in the default suite
def test_a_file_named_like_a_checkpoint_is_reported_kept_and_never_overwritten(
  killed_at_25, tmp_path, capsys
):
  """A file ``checkpoints/30`` (not a folder: orbax does not list it) is reported by eval_all and by a
  resume, and moved aside, byte for byte, when the run saves step 30; an eval_all of only such files stops."""
  model_dir = tmp_path / "md"
  shutil.copytree(killed_at_25, model_dir)
  mine = model_dir / "checkpoints" / "30"
  mine.write_bytes(b"my notes")
  capsys.readouterr()
  summary = _run(model_dir, mode="eval_all")
  out = capsys.readouterr().out
  assert (
    f"Warning: the checkpoint of step 30 at {mine} cannot be read (it is a file of 8 bytes, not a " in out
  )
  assert (
    "skipping it." in out and sorted(summary["eval_all"]) == [10, 20] and mine.read_bytes() == b"my notes"
  )
  _run(model_dir, max_steps=30, checkpoint_steps=10, log_steps=5)
  out = capsys.readouterr().out
  assert "step 30" in out and "Resuming from the checkpoint at step 20." in out and mine.is_dir()
  assert (model_dir / "checkpoints" / "30.unreadable").read_bytes() == b"my notes"
  only = tmp_path / "only"
  (only / "checkpoints").mkdir(parents=True)
  (only / "checkpoints" / "5").write_bytes(b"")
  with pytest.raises(
    ExecutorError, match=r"None of the checkpoints in .* \(steps 5\) can be read. Move them away"
  ):
    _run(only, max_steps=10)
  assert (only / "checkpoints" / "5").read_bytes() == b""


def test_damaged_orbax_json_is_found_before_orbax_starts_reading(killed_at_25, tmp_path, monkeypatch):
  """A garbage ``state/array_metadatas/process_0`` failed inside orbax's restore, which left its reads
  behind (tracebacks of orphaned coroutines after the warning); it is now found by the checks before."""
  import orbax.checkpoint as ocp

  model_dir = tmp_path / "md"
  shutil.copytree(killed_at_25, model_dir)
  DAMAGE["array metadata garbage"](model_dir / "checkpoints" / "20")
  restored, original = [], ocp.CheckpointManager.restore

  def restore(self, step, *args, **kwargs):
    restored.append(step)
    return original(self, step, *args, **kwargs)

  monkeypatch.setattr(ocp.CheckpointManager, "restore", restore)
  assert _run(model_dir, max_steps=30, checkpoint_steps=10, log_steps=5)["final_step"] == 30
  assert restored == [10]


def _silently_damaged(monkeypatch, where, value):
  """Restores read one value of the checkpoint as ``value`` without an error, as a checkpoint whose data bytes
  were overwritten did (``where``: ``"params"``, a weight, or ``"opt_state"``, the momentum): the first
  hidden unit's bias (a momentum of -2.5e38 makes it 1e37 at the first step)."""
  restore = Checkpoints.restore

  def damaged(self, step, like):
    state, meta = restore(self, step, like)
    leaves, treedef = jax.tree.flatten(getattr(state, where))
    first = next(i for i, x in enumerate(leaves) if np.issubdtype(x.dtype, np.floating))
    leaves[first] = leaves[first].at[(0,) * leaves[first].ndim].set(value)
    return dataclasses.replace(state, **{where: jax.tree.unflatten(treedef, leaves)}), meta

  monkeypatch.setattr(Checkpoints, "restore", damaged)


@pytest.mark.parametrize(("where", "value", "step"), [("params", 2.5e38, 21), ("opt_state", -2.5e38, 22)])
def test_a_nan_loss_right_after_a_resume_names_the_checkpoint_a_later_one_the_learning_rate(
  killed_at_25, tmp_path, monkeypatch, where, value, step
):
  """A checkpoint whose bytes were overwritten restores without an error; its 2.5e38 made the next steps'
  loss NaN, and the error blamed the learning rate, so every rerun resumed from it and looped on the NaN."""
  model_dir = tmp_path / "md"
  shutil.copytree(killed_at_25, model_dir)
  _silently_damaged(monkeypatch, where, value)
  with pytest.raises(ExecutorError) as error:
    _run(model_dir, max_steps=30, checkpoint_steps=10, log_steps=5)
  message, path = str(error.value), model_dir / "checkpoints" / "20"
  after = "1 step" if step == 21 else "2 steps"
  assert message.startswith(f"Step {step}: the loss is ")
  assert (
    f"{after} after the run resumed from the checkpoint of step 20 ({path}), before any finite loss was logged: "
    "that checkpoint may be damaged (the largest |value| among its weights and optimizer state is 2.5e+38)"
  ) in message
  assert (
    f"Move it aside (to {path}.unreadable, where wafer keeps checkpoints it cannot read) and rerun the same "
    "command: it then resumes from the checkpoint of step 10, the one before." in message
  )
  assert "was written before it" not in message and "\n" not in message
  assert _steps(model_dir) == [1, 5, 10, 15, 20]  # stopped before logging or saving anything after it
  # a NaN after a finite loss was logged since the resume is the training's: the learning-rate advice
  monkeypatch.undo()
  task, rc, optimizer, loss_scale, policy = example_run(str(model_dir), max_steps=30, log_steps=2)
  with pytest.raises(ExecutorError) as error:  # resumed from 20, finite at 21 and 22, NaN from 23
    run(_nan_from(task, 22), rc, optimizer, loss_scale, policy, progress=False)
  message = str(error.value)
  assert message.startswith("Step 24: the loss is NaN") and "may be damaged" not in message
  assert "lower optimizer.learning_rate" in message
  # (a review) the same when the steps read after the resume were finite but not logged: 21 and 22
  # read, NaN from 23, first logged at 25: the checkpoint is not blamed
  task, rc, optimizer, loss_scale, policy = example_run(str(model_dir), max_steps=30, log_steps=5)
  with pytest.raises(ExecutorError) as error:
    run(_nan_from(task, 22), rc, optimizer, loss_scale, policy, progress=False)
  message = str(error.value)
  assert message.startswith("Step 25: the loss is NaN") and "may be damaged" not in message, message


def _nan_from(task, first):
  """``task`` whose training batches from number ``first`` on (steps ``first + 1`` on) hold NaN."""

  def data(seed):
    batch_of = task.train_data(seed).batch_of  # the example's IndexedBatches

    def nan_from(k):
      return jax.tree.map(
        lambda x: np.full_like(x, np.nan) if k >= first and x.dtype.kind == "f" else x, batch_of(k)
      )

    return IndexedBatches(nan_from)

  return dataclasses.replace(task, train_data=data)


class _OrphanedWrite:
  """Dropped at once: its ``__del__`` raises as TensorStore's writes still pending when orbax's event loop
  closed do (printed by ``sys.unraisablehook``, a traceback each)."""

  def __init__(self, message):
    self.message = message

  def __del__(self):
    raise RuntimeError(self.message)


def _orbax_save_that(monkeypatch, error=None, note=None):
  """orbax's save, with what a full disk makes it do: an absl ERROR with a traceback, an orphaned write's
  "Event loop is closed", then ``error``; or (``error`` None) a real save that logs ``note`` on the way."""
  import logging

  import orbax.checkpoint as ocp

  save = ocp.CheckpointManager.save

  def failing(self, *args, **kwargs):
    if error is None:
      logging.getLogger("absl").warning(note)
      _OrphanedWrite("not orbax's")
      return save(self, *args, **kwargs)
    try:
      raise error
    except type(error):
      logging.getLogger("absl").error(f"_SignalingThread.run() raised an exception: {error}", exc_info=True)
    _OrphanedWrite("Event loop is closed")
    raise error

  monkeypatch.setattr(ocp.CheckpointManager, "save", failing)


LONG = "/state.orbax-checkpoint-tmp" * 12 + "/ocdbt.process_0/d/a66472d202f77a4c5ddbe6311d81a44e"
"""A file of a checkpoint being written, as deep as orbax's (the error used to be cut in the middle of it)."""


@pytest.mark.parametrize("kind", ["OSError", "TensorStore ValueError"])
def test_a_full_disk_while_saving_a_checkpoint_says_so_whole_without_orbaxs_tracebacks(
  tmp_path, monkeypatch, capsys, caplog, kind
):
  path = f"{tmp_path}/checkpoints/10.orbax-checkpoint-tmp{LONG}"
  error = (
    OSError(errno.ENOSPC, "No space left on device", path)
    if kind == "OSError"
    else ValueError(
      f'RESOURCE_EXHAUSTED: Error writing "params/0" in OCDBT database at local file "{tmp_path}/checkpoints/'
      f'10.orbax-checkpoint-tmp/state.orbax-checkpoint-tmp/ocdbt.process_0/": Failed writing: "{path}": Failed to '
      "write 140981 bytes to file 22: No space left on device [os_error_code='28']"
    )
  )
  unraisable = []
  monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
  _orbax_save_that(monkeypatch, error)
  with pytest.raises(ExecutorError) as raised:
    _run(tmp_path, max_steps=10, checkpoint_steps=10, log_steps=5)
  assert str(raised.value) == (
    f"Cannot save the checkpoint of step 10 in {tmp_path / 'checkpoints'}: No space left on device (errno 28), "
    f"writing {path}; no checkpoint was saved, and nothing saved before was changed. Free space in model_dir (or "
    "give another --model_dir) and rerun the same command: it resumes from there."
  )
  assert [r for r in caplog.records if r.name == "absl"] == [] and unraisable == []
  assert "Traceback" not in capsys.readouterr().err
  # a save that goes through lets orbax's output through: nothing wafer does not report is hidden
  monkeypatch.undo()
  monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
  _orbax_save_that(monkeypatch, note="orbax says something")
  caplog.clear()
  _run(tmp_path, max_steps=10, checkpoint_steps=10, log_steps=5)
  assert [(r.name, r.getMessage()) for r in caplog.records if r.name == "absl"] == [
    ("absl", "orbax says something")
  ]
  assert [str(u.exc_value) for u in unraisable] == ["not orbax's"]


def test_a_resume_with_another_batch_size_names_the_key(tmp_path):
  """The example's batches are drawn by step number: another batch size used to resume silently."""
  _run(tmp_path, max_steps=10, checkpoint_steps=10, log_steps=5)
  _, rc, optimizer, loss_scale, policy = example_run(str(tmp_path), max_steps=20)
  task = example_task(batch_size=32)  # train_input.batch_size: 32 (the data's batches too)
  with pytest.raises(
    ExecutorError,
    match=r"Cannot resume from the checkpoint of step 10: it was written with train_input\.batch_size=64, this "
    r"run has 32 .* Set train_input\.batch_size back to 64, or use a new model_dir .* Settings changed since "
    r"that checkpoint was written: train_input\.batch_size: checkpoint 64, now 32\.",
  ):
    run(task, rc, optimizer, loss_scale, policy, progress=False)
  assert _steps(tmp_path) == [1, 5, 10]  # nothing was changed


@pytest.mark.slow  # two fc_mnist runs through the CLI (~10 s); the batch-size case above runs by default
def test_a_resume_with_another_model_shape_names_the_changed_key_not_an_array_path(tmp_path, capsys):
  from wafer import cli

  fc_mnist = Path(__file__).resolve().parents[3] / "models" / "fc_mnist" / "configs" / "params_fc_mnist.yaml"
  argv = ["run", "--params", str(fc_mnist), "--model_dir", str(tmp_path), "runconfig.log_steps=1"]
  assert cli.main([*argv, "runconfig.max_steps=2", "runconfig.checkpoint_steps=2", "model.depth=2"]) == 0
  capsys.readouterr()
  rc = cli.main(
    [*argv, "runconfig.max_steps=4", "model.depth=2", "model.hidden_size=40", "optimizer.momentum=0.5"]
  )
  err = capsys.readouterr().err
  assert rc == 1 and "Traceback" not in err
  assert "The checkpoint of step 2 in" in err and "does not fit this model" in err
  assert (
    "Settings changed since that checkpoint was written: model.hidden_size: checkpoint 50, now 40; " in err
  )
  assert "optimizer.momentum: checkpoint 0.9, now 0.5." in err
  assert cli.main([*argv, "runconfig.max_steps=3", "model.depth=2", "optimizer.momentum=0.5"]) == 0
  out = capsys.readouterr().out  # a change that fits is a note, not an error
  assert (
    "Note: settings changed since the checkpoint of step 2: optimizer.momentum: checkpoint 0.9, now 0.5."
    in out
  )


# ctrl-C ------------------------------------------------------------------------------------------


def test_ctrl_c_during_a_step_leaves_a_consistent_model_dir_and_says_how_to_resume(
  tmp_path, monkeypatch, capsys
):
  from wafer.compile import CompiledStep

  whole = _run(tmp_path / "whole", max_steps=30, checkpoint_steps=10, log_steps=5)
  real = CompiledStep.__call__
  calls = {"n": 0}

  def interrupt_at_step_23(self, *args, **kwargs):  # ctrl-C while step 23 runs
    calls["n"] += 1
    if calls["n"] == 23:
      raise KeyboardInterrupt
    return real(self, *args, **kwargs)

  monkeypatch.setattr(CompiledStep, "__call__", interrupt_at_step_23)
  with pytest.raises(RunInterrupted) as info:
    _run(tmp_path / "md", max_steps=30, checkpoint_steps=10, log_steps=5)
  monkeypatch.undo()
  message = str(info.value)
  assert "Interrupted at step 22." in message and "newest checkpoint is step 20" in message
  assert "Rerun the same command to resume" in message
  assert isinstance(info.value, KeyboardInterrupt) and not isinstance(info.value, Exception)
  resumed = _run(tmp_path / "md", max_steps=30, checkpoint_steps=10, log_steps=5)
  _same_params(whole["params"], resumed["params"])
  assert _steps(tmp_path / "md") == _steps(tmp_path / "whole") == [1, 5, 10, 15, 20, 25, 30]


@pytest.mark.slow  # a few seconds of training; kept out of the default suite's 10 minutes
def test_ctrl_c_in_the_middle_of_a_checkpoint_keeps_the_one_before_and_the_rerun_replaces_it(
  tmp_path, monkeypatch, capsys
):
  import orbax.checkpoint as ocp

  real = ocp.JsonCheckpointHandler.async_save
  calls = {"n": 0}

  def interrupted_second_save(self, *args, **kwargs):  # the arrays of step 20 are written, its JSON is not
    calls["n"] += 1
    if calls["n"] == 2:
      raise KeyboardInterrupt
    return real(self, *args, **kwargs)

  monkeypatch.setattr(ocp.JsonCheckpointHandler, "async_save", interrupted_second_save)
  with pytest.raises(RunInterrupted, match=r"Interrupted at step 20\. .* newest checkpoint is step 10 "):
    _run(tmp_path, max_steps=30, checkpoint_steps=10, log_steps=5)
  monkeypatch.undo()
  checkpoints = tmp_path / "checkpoints"
  assert "20" not in os.listdir(checkpoints) and "10" in os.listdir(checkpoints)
  summary = _run(tmp_path, max_steps=30, checkpoint_steps=10, log_steps=5)
  assert "Resuming from the checkpoint at step 10." in capsys.readouterr().out
  assert summary["final_step"] == 30 and sorted(os.listdir(checkpoints)) == ["10", "20", "30"]
  assert _steps(tmp_path) == [1, 5, 10, 15, 20, 25, 30]


def test_the_cli_prints_the_resume_advice_on_ctrl_c(tmp_path, monkeypatch, capsys):
  from wafer import cli, runner

  def interrupted(plan, **kwargs):
    raise RunInterrupted("Interrupted at step 7. Rerun the same command to resume from there.")

  monkeypatch.setattr(runner, "run_plan", interrupted)
  assert cli.main(["run", "--model_dir", str(tmp_path / "md"), "runconfig.max_steps=10"]) == 130
  err = capsys.readouterr().err
  assert "wafer run: interrupted. Interrupted at step 7. Rerun the same command" in err


# the atomic-write helper -------------------------------------------------------------------------


@pytest.mark.parametrize("fail_at", ["write", "rename"])
def test_replace_atomically_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch, fail_at):
  path = tmp_path / "report.png"
  path.write_bytes(b"old")
  seen = []

  def write(tmp):
    seen.append(tmp)
    Path(tmp).write_bytes(b"new, half")
    if fail_at == "write":
      raise OSError(errno.ENOSPC, "No space left on device")

  if fail_at == "rename":
    monkeypatch.setattr(_io.os, "replace", lambda a, b: (_ for _ in ()).throw(OSError(errno.EXDEV, "cross")))
  with pytest.raises(OSError):
    _io.replace_atomically(path, write)
  assert path.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["report.png"]
  assert seen[0].endswith(".png") and Path(seen[0]).parent == tmp_path  # same folder, same extension


def test_no_module_of_wafer_writes_a_file_in_place():
  """Files wafer writes go through wafer._io (a crash leaves the old file or the new one, never a part)."""
  import re

  root = Path(__file__).resolve().parents[3] / "wafer"
  pattern = re.compile(r"\.write_text\(|\.write_bytes\(|open\([^)]*['\"]w")
  offenders = [
    f"{p.relative_to(root.parent)}:{n}"
    for p in sorted(root.rglob("*.py"))
    if p.name != "_io.py"
    for n, line in enumerate(p.read_text().splitlines(), start=1)
    if pattern.search(line) and "os.devnull" not in line and ">>>" not in line
  ]
  assert offenders == []


def test_errors_of_damaged_runs_are_wafer_errors():
  assert issubclass(ExecutorError, WaferError)
  m = Metrics(Path("/nonexistent-wafer-dir"), "CPU")
  with pytest.raises(ExecutorError, match=r"Cannot write the metrics of step 1 to /nonexistent-wafer-dir"):
    m.write({"step": 1, "loss": 1.0}, "line")


@pytest.mark.parametrize(
  "module",
  ["wafer._io", "wafer.cluster", "wafer.train.checkpoint", "wafer.train.metrics", "wafer.train.loop"],
)
def test_the_docstring_examples_run(module):
  """The default pytest run collects no doctests; these modules' examples run here."""
  import doctest
  import importlib

  result = doctest.testmod(importlib.import_module(module))
  assert result.attempted > 0 and result.failed == 0


def test_a_checkpoint_of_another_model_says_so_first_and_a_long_change_list_is_cut():
  """An fc_mnist run in a GPT-2 model_dir: one 4,000-character line of ~60 changed keys, with the
  cause (``model.name``) in the middle of it."""
  from types import SimpleNamespace

  from wafer.train.loop import _CHANGES_SHOWN, _Run

  saved = {"model.name": "gpt2", **{f"model.k{i:02d}": i for i in range(60)}}

  def run(now):
    meta = SimpleNamespace(meta=lambda step: {"config": saved})
    return SimpleNamespace(checkpoints=meta, settings=now, model_dir=Path("md"))

  other = _Run._with_changes(run({"model.name": "fc_mnist"}), "The checkpoint does not fit.", 7)
  assert other == (
    "md holds checkpoints of model 'gpt2' (step 7), and this run is model 'fc_mnist': give this run a "
    "model_dir of its own (--model_dir), or move those checkpoints away. The checkpoint does not fit."
  )
  same = _Run._with_changes(run({"model.name": "gpt2"}), "The checkpoint does not fit.", 7)
  assert same.count(", now ") == _CHANGES_SHOWN and same.endswith(f"; and {60 - _CHANGES_SHOWN} more.")


def test_a_resume_with_gradient_clipping_added_names_the_key_not_a_damaged_checkpoint(tmp_path, capsys):
  """Clipping wraps the optimizer (the same arrays under other paths): it was called unreadable, and
  eval_all skipped the good checkpoints."""
  import optax

  _run(tmp_path, max_steps=2, checkpoint_steps=2, log_steps=1)
  task, rc, _, loss_scale, policy = example_run(str(tmp_path), max_steps=4)
  clipped = optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.05, momentum=0.9))
  for mode in ("train", "eval_all"):
    capsys.readouterr()
    with pytest.raises(ExecutorError, match=r"The checkpoint of step 2 in .* does not fit this model: its state is "
                       r"laid out otherwise \(arrays only in the checkpoint: opt_state/0/"):  # fmt: skip
      run(task, rc.model_copy(update={"mode": mode}), clipped, loss_scale, policy, progress=False)
    out = capsys.readouterr().out
    assert "cannot be read" not in out and "Move them away" not in out, mode
  assert (tmp_path / "checkpoints" / "2").is_dir() and not (
    tmp_path / "checkpoints" / "2.unreadable"
  ).exists()


def test_a_resume_or_an_eval_under_another_precision_policy_says_so(tmp_path, capsys):
  """A changed precision_opt_level (a runconfig key, not among the compared sections) or half type
  changes the numerics: the resume and the eval modes note it, as they note a changed model key."""
  import precision

  task, rc, optimizer, loss_scale, policy = example_run(str(tmp_path), max_steps=2, checkpoint_steps=2)
  run(task, rc, optimizer, loss_scale, policy, progress=False)
  capsys.readouterr()
  other = precision.Policy(compute=policy.compute, level=0 if policy.level else 1)
  task, rc, optimizer, loss_scale, _ = example_run(str(tmp_path), max_steps=3, checkpoint_steps=3)
  run(task, rc, optimizer, loss_scale, other, progress=False)
  out = capsys.readouterr().out
  assert (
    f"Note: settings changed since the checkpoint of step 2: precision.policy: checkpoint {str(policy)!r}, now {str(other)!r}."
    in out
  )
  for mode in ("eval", "eval_all"):
    task, rc, optimizer, loss_scale, _ = example_run(str(tmp_path), mode=mode)
    run(task, rc, optimizer, loss_scale, policy, progress=False)
    assert f"precision.policy: checkpoint {str(other)!r}, now {str(policy)!r}" in capsys.readouterr().out, (
      mode
    )
  task, rc, optimizer, loss_scale, _ = example_run(str(tmp_path), mode="eval")
  run(task, rc, optimizer, loss_scale, other, progress=False)  # the latest checkpoint's policy: nothing said
  assert "settings changed" not in capsys.readouterr().out
