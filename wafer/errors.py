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

__all__ = ("WaferError",)


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
  import os

  return not _LIBRARY_FOLDERS.isdisjoint(path.split(os.sep))
