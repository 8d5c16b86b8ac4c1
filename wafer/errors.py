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
