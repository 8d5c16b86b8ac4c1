"""The environment of a test's child Python process: this checkout first on ``PYTHONPATH``.

The caller's own ``PYTHONPATH`` is kept after it: an environment whose dependencies are installed
with ``pip --target`` and found through ``PYTHONPATH`` (the GPU image's) lost them when a test
replaced the variable, and the child failed on ``import pydantic``.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child_env(**extra: str) -> dict[str, str]:
  """``os.environ`` with ``ROOT`` prepended to ``PYTHONPATH`` and ``extra`` set on top."""
  path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
  return {**os.environ, "PYTHONPATH": path, **extra}
