"""Writing a file so that a crash never leaves it half-written: the one helper wafer uses for it.

`replace_atomically(path, write)` calls ``write(tmp)`` on a fresh temporary name in ``path``'s
folder (same extension, so writers that pick a format by it, e.g. matplotlib, still do), flushes
it to disk and renames it onto ``path`` (``os.replace``: atomic on POSIX and Windows). A reader
sees the old file or the new one, never a part: a process killed (SIGKILL, ctrl-C, full disk)
in the middle leaves ``path`` as it was. On an error the temporary file is removed and the error
propagates; one left by a SIGKILL is named ``<stem>.tmp-<pid>-<hex><ext>`` (safe to delete).

`write_text_atomically` / `write_bytes_atomically` are the common cases; `what_to_do(error)` is
the advice an error message gives for an ``OSError`` of a write (full disk, permissions, a folder
where a file belongs); `strict_json` makes a value writable as strict JSON (NaN and infinities as
``null``, which JSON has in their place).

>>> import os, pathlib, tempfile
>>> folder = tempfile.mkdtemp()
>>> path = os.path.join(folder, "report.json")
>>> write_text_atomically(path, '{"a": 1}\\n')
>>> pathlib.Path(path).read_text()
'{"a": 1}\\n'
>>> def broken(tmp):
...   with open(tmp, "w") as f:
...     f.write("half")
...   raise OSError(28, "No space left on device")
>>> replace_atomically(path, broken)
Traceback (most recent call last):
OSError: [Errno 28] No space left on device
>>> pathlib.Path(path).read_text(), sorted(os.listdir(folder))  # the old file, and no temporary left behind
('{"a": 1}\\n', ['report.json'])
"""

from __future__ import annotations

import errno
import math
import os
import secrets
from collections.abc import Callable
from typing import Any

__all__ = (
  "make_writable_dir",
  "replace_atomically",
  "strict_json",
  "what_to_do",
  "write_bytes_atomically",
  "write_text_atomically",
)


def _temporary_name(path: str) -> str:
  base, ext = os.path.splitext(path)
  return f"{base}.tmp-{os.getpid()}-{secrets.token_hex(4)}{ext}"


def _fsync(path: str) -> None:
  """Flush ``path``'s data to disk (a power loss after the rename must not leave an empty file)."""
  try:
    fd = os.open(path, os.O_RDONLY)
  except OSError:  # the writer wrote nothing there (e.g. a library that appends its own suffix)
    return
  try:
    os.fsync(fd)
  except OSError:  # some file systems (e.g. some network mounts) cannot fsync: the rename still is atomic
    pass
  finally:
    os.close(fd)


def replace_atomically(path: str | os.PathLike[str], write: Callable[[str], object]) -> None:
  """``write(tmp)``, then rename ``tmp`` onto ``path``; on any error ``path`` is left as it was.

  ``write`` receives the temporary path (a ``str``, same folder and extension as ``path``) and
  must create the file there. Nothing is written outside ``path``'s folder, so the rename never
  crosses file systems.

  Raises:
    Whatever ``write`` raises (the temporary file is removed first), or the ``OSError`` of the
    rename (e.g. ``path`` is a directory).
  """
  path = os.fspath(path)
  tmp = _temporary_name(path)
  try:
    write(tmp)
    _fsync(tmp)
    os.replace(tmp, path)
  except BaseException:
    try:
      os.remove(tmp)
    except OSError:
      pass
    raise


def write_text_atomically(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> None:
  """``path`` holds ``text`` (encoded with ``encoding``), replaced atomically (`replace_atomically`)."""
  write_bytes_atomically(path, text.encode(encoding))


def write_bytes_atomically(path: str | os.PathLike[str], data: bytes) -> None:
  """``path`` holds ``data``, replaced atomically (`replace_atomically`)."""

  def write(tmp: str) -> None:
    with open(tmp, "wb") as f:
      f.write(data)

  replace_atomically(path, write)


def make_writable_dir(path: str | os.PathLike[str], key: str, saved: str) -> str | None:
  """Create the folder ``path`` (and its parents) where it is missing; None when it is ready, else the
  problem for an error message (``key`` names it; ``saved`` is what could not be saved there): it is a
  file, it cannot be created, or it is not writable.

  >>> import tempfile
  >>> make_writable_dir(tempfile.mkstemp()[1], "model_dir", "the report").endswith("is a file, not a directory")
  True
  """
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as error:
    how = (
      "is a file, not a directory"
      if os.path.isfile(path)
      else f"cannot be created ({error.strerror or error})"
    )
    return f"{key}={os.fspath(path)!r} {how}"
  if not os.access(path, os.W_OK | os.X_OK):
    return f"{key}={os.fspath(path)!r} is not writable, so {saved} could not be saved"
  return None


def what_to_do(error: OSError) -> str:
  """What to do about an ``OSError`` of writing into model_dir, for an error message.

  >>> what_to_do(OSError(errno.ENOSPC, "No space left on device"))
  'free space in model_dir (or give another --model_dir)'
  >>> what_to_do(IsADirectoryError(errno.EISDIR, "Is a directory"))
  'a folder stands where a file belongs (or a file where a folder belongs): move it away'
  """
  if error.errno in (errno.ENOSPC, errno.EDQUOT):
    return "free space in model_dir (or give another --model_dir)"
  if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
    return "make model_dir writable (or give another --model_dir)"
  if error.errno in (errno.EISDIR, errno.ENOTDIR, errno.EEXIST):
    return "a folder stands where a file belongs (or a file where a folder belongs): move it away"
  return "check model_dir (or give another --model_dir)"


def strict_json(value: Any) -> Any:
  """``value`` with every NaN or infinite float, in dicts, lists and tuples at any depth, as None:
  ``json.dumps(strict_json(v), allow_nan=False)`` is strict JSON (Python's bare ``NaN`` breaks jq and
  other readers). A diverged run's losses are written so.

  >>> strict_json({"losses": [2.5, float("nan")], "eval": {"loss": float("inf")}})
  {'losses': [2.5, None], 'eval': {'loss': None}}
  """
  if isinstance(value, float) and not math.isfinite(value):
    return None
  if isinstance(value, dict):
    return {k: strict_json(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [strict_json(v) for v in value]
  return value
