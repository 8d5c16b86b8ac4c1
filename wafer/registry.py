"""Model registry: ``model.name`` in a params file -> a builder of the executor's `Task`.

Model packages register themselves (``wafer.registry.register_model("bert", build_bert)``);
the CLI imports the ``models`` package by name, if installed, so that ``wafer`` never imports
model code statically (models depend on wafer, not the other way round).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from typing import Any

from wafer.errors import WaferError

_BUILDERS: dict[str, Callable[[Any], Any]] = {}
PLUGIN_PACKAGES = ("wafer.example", "models")


class UnknownModelError(WaferError, ValueError):
  """``model.name`` names no registered model."""


def register_model(name: str, builder: Callable[[Any], Any]) -> None:
  """Register ``builder(params) -> wafer.executor.Task`` under ``name`` (case-insensitive)."""
  _BUILDERS[name.lower()] = builder


def load_plugins() -> None:
  """Import the model packages so that they register their models."""
  for package in PLUGIN_PACKAGES:
    try:
      importlib.import_module(package)
    except ModuleNotFoundError as error:
      if error.name != package:
        raise


def get_model(name: str) -> Callable[[Any], Any]:
  """The builder registered as ``name``; an error lists the known names."""
  load_plugins()
  found = _BUILDERS.get(str(name).lower())
  if found is None:
    known = sorted(_BUILDERS)
    close = difflib.get_close_matches(str(name).lower(), known, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise UnknownModelError(
      f"model.name: unknown model {name!r}.{hint} Registered models: {', '.join(known)}"
    )
  return found


_DEFAULT_JOB: list[tuple[str, str]] = []


def register_default_job(params_path: str, description: str) -> None:
  """The params file ``wafer run`` runs without ``--params`` (a model package registers it)."""
  _DEFAULT_JOB[:] = [(params_path, description)]


def default_job() -> tuple[str, str] | None:
  """``(params path, one-line description)`` of the registered default job, or None."""
  load_plugins()
  return _DEFAULT_JOB[0] if _DEFAULT_JOB else None


def registered() -> list[str]:
  load_plugins()
  return sorted(_BUILDERS)
