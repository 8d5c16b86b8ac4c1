"""One run at a time in a model_dir: `ModelDirLock`, held for the life of a run that writes there.

Two runs writing into one model_dir run into each other: the second resumes from the first one's
live checkpoint, their orbax saves clash and ``metrics.jsonl`` gets steps twice. A run therefore takes
an exclusive ``fcntl.flock`` on ``model_dir/wafer.lock`` before any slow work (`ModelDirLock.acquire`)
and keeps it until it ends; a second run that finds it taken stops at once, naming the run that holds
it (its pid, host, start time and command, which the holder writes into the file).

The lock is the kernel's, not the file: it is released when the holder's process ends, however it
ends (SIGKILL included), so a lock is never stale, and a ``wafer.lock`` left behind means nothing (it
is safe to delete when no run is going). With many processes only process 0, which writes model_dir,
takes it (`wafer.train.loop`). Where there is no ``fcntl`` (Windows) nothing is locked; where the file
system refuses locks (some network mounts) the run says so once and goes on unlocked.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from wafer.errors import ExecutorError

try:
  import fcntl
except ImportError:  # Windows: no advisory locks here; runs are not kept apart
  fcntl = None  # type: ignore[assignment]

__all__ = ("LOCK_NAME", "ModelDirLock")

LOCK_NAME = "wafer.lock"
"""The lock file in model_dir (its content, written by the holder, says who holds it)."""


class ModelDirLock:
  """The exclusive lock of one model_dir, held by this process until `release`."""

  def __init__(self, path: Path, fd: int | None):
    self.path, self._fd = path, fd

  @classmethod
  def acquire(cls, model_dir: str | os.PathLike[str], say: Callable[[str], Any] = print) -> ModelDirLock:
    """Lock ``model_dir`` (an existing folder) for this run and record who holds it.

    Returns a lock that holds nothing where locks are not available (no ``fcntl``, or a file system
    that refuses them: then ``say`` gets one line).

    Raises:
      ExecutorError: another run holds it (the message names that run: pid, host, start, command).
    """
    path = Path(model_dir) / LOCK_NAME
    if fcntl is None:
      return cls(path, None)
    try:
      fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:  # model_dir was checked writable just before: nothing here is worth stopping the run
      return cls(path, None)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
      if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
        os.close(fd)
        say(
          f"Note: cannot lock {path} ({error.strerror or error}): a second run started into "
          f"{Path(model_dir)} would not be refused, so start only one."
        )
        return cls(path, None)
      holder = _holder(fd)
      os.close(fd)
      raise ExecutorError(
        f"Another run{holder} is writing into {Path(model_dir)} (it holds {path}): two runs in one "
        "model_dir would overwrite each other's compile report, resume from each other's checkpoints and "
        "log steps twice. Wait for it to finish, or choose another --model_dir."
      ) from None
    # The content says who holds the lock, for the message above; it is rewritten in place, not
    # replaced (a new file would be another lock), and a reader that finds it partial names no one.
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(_identity()) + "\n").encode("utf-8"), 0)
    return cls(path, fd)

  @property
  def held(self) -> bool:
    """Whether this process holds the lock (False where locks are not available, or once released)."""
    return self._fd is not None

  def release(self) -> None:
    """Release the lock (its content cleared first); nothing when it is not held."""
    fd, self._fd = self._fd, None
    if fd is None:
      return
    try:
      os.ftruncate(fd, 0)
    except OSError:  # a full or vanished model_dir: the lock is still released below
      pass
    try:  # (explicitly: a child forked during the run shares the lock, and closing ours would not end it)
      fcntl.flock(fd, fcntl.LOCK_UN)
    except OSError:
      pass
    os.close(fd)


def _identity() -> dict[str, Any]:
  """Who holds the lock: this process's pid, host, start time and command line."""
  return {
    "pid": os.getpid(),
    "host": socket.gethostname(),
    "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    "command": " ".join(sys.argv),
  }


def _holder(fd: int) -> str:
  """`` (pid 12, on host h, started ..., command ...)`` from the lock file's content, or "" when unreadable."""
  try:
    record = json.loads(os.pread(fd, 4096, 0).decode("utf-8"))
  except (OSError, ValueError):  # empty (the holder has not written it yet) or partial
    return ""
  if not isinstance(record, dict):
    return ""
  parts = [f"pid {record['pid']}"] if "pid" in record else []
  parts += [f"on host {record['host']}"] if record.get("host") else []
  parts += [f"started {record['started']}"] if record.get("started") else []
  parts += [f"command: {record['command']}"] if record.get("command") else []
  return f" ({', '.join(parts)})" if parts else ""
