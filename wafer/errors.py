"""`WaferError`: the base class of every error a user of `wafer` can act on.

Each subclass is one kind of mistake (a bad params file, a step that does not fit a static graph,
damaged data, ...). Its message names where the problem is (file and line, key path or source line),
what was found, and what to do. The CLI prints the message of a `WaferError` without a traceback and
exits non-zero; any other exception is a bug and keeps its traceback.

>>> from wafer.errors import WaferError
>>> from wafer.config import ConfigError
>>> issubclass(ConfigError, WaferError)
True
"""

from __future__ import annotations

import os
import traceback
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ("WaferError", "in_installed_library", "user_frame", "where_defined")


class WaferError(Exception):
  """An error in what the user gave `wafer` (config, step, data, cluster), not a bug in `wafer`."""


# Folders pip and distribution packages install libraries into: a frame there is not the user's line.
_LIBRARY_FOLDERS = frozenset({"site-packages", "dist-packages"})


def in_installed_library(path: str) -> bool:
  """Whether ``path`` lies in an installed package (``site-packages`` or Debian's ``dist-packages``),
  so that an error message names the user's own line instead.

  >>> in_installed_library("/usr/lib/python3/dist-packages/flax/linen/module.py")
  True
  >>> in_installed_library("/home/me/jax/train.py")
  False
  """
  return not _LIBRARY_FOLDERS.isdisjoint(path.split(os.sep))


def _internal_dirs() -> tuple[str, ...]:
  import contextlib
  import logging

  import jax
  import numpy as np

  import precision

  mods = (jax, np, contextlib, logging, precision)
  dirs = tuple(str(Path(m.__file__).resolve().parent) + os.sep for m in mods if getattr(m, "__file__", None))
  return dirs + (str(Path(__file__).resolve().parent) + os.sep,)  # wafer itself


def user_frame(tb: TracebackType | None) -> tuple[str, int, str] | None:
  """``(file, line, source text)`` of the deepest frame of ``tb`` in the user's own code: outside
  JAX, NumPy, ``contextlib``, ``logging``, ``precision``, ``wafer`` and installed packages; None if
  there is none (the error arose in a library the user called directly).

  >>> def f():
  ...   return 1 / 0
  >>> try:
  ...   f()
  ... except ZeroDivisionError as error:
  ...   user_frame(error.__traceback__)[2]
  'return 1 / 0'
  """
  internal = _internal_dirs()
  found = None
  for frame in traceback.extract_tb(tb):
    path = str(Path(frame.filename).resolve())
    if path.startswith(internal) or in_installed_library(path) or frame.filename.startswith("<frozen"):
      continue
    found = (frame.filename, frame.lineno or 0, (frame.line or "").strip())
  return found


def where_defined(fn: Any) -> str:
  """``"name (file:line)"`` of a user's function, for messages (its repr when it has no code)."""
  code = getattr(fn, "__code__", None) or getattr(vars(type(fn)).get("__call__"), "__code__", None)
  name = getattr(fn, "__qualname__", None) or type(fn).__name__
  return f"{name} ({code.co_filename}:{code.co_firstlineno})" if code is not None else repr(fn)[:80]
