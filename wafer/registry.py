"""Model plugins: one `ModelSpec` per model, discovered through the ``wafer.models`` entry point group.

A model package declares its spec in its ``pyproject.toml``::

  [project.entry-points."wafer.models"]
  my_model = "my_package.my_model:SPEC"

and `load_plugins` registers each spec: its strict ``model:`` schema for every name it answers to,
the strict input schema of each of its data processors, its task builder and, optionally, a default
job for ``wafer run`` without ``--params``. ``wafer`` itself names no model package.

The registry owns model lookup and fills the config's schema table; the config never imports it.
Plugins load once, at the edge: the CLI and `wafer.runner` call `load_plugins` before they load a
params file. A program that validates params files itself (``wafer.config.load_params``) gets the
plugins' schemas too: importing this module (``import wafer`` does) hands `load_plugins` to the config
as its schema source (`wafer.config.add_schema_source`).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping
from importlib import metadata
from typing import Any

from wafer.config import add_model_check, add_schema_source, register_input_schema, register_model_schema
from wafer.config.modelzoo import MODELZOO_MODELS
from wafer.errors import PluginError, UnknownModelError

GROUP = "wafer.models"


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """Everything a run needs from a model package.

  Attributes:
    names: the ``model.name`` values this spec answers to (case-insensitive), e.g. ``("gpt2", "gpt3")``.
    config: the strict ``model:`` schema (a `wafer.config.ModelConfig` subclass).
    build_task: ``build_task(params) -> wafer.train.Task``: the module's init and loss, its data
      (built by the data processor the input sections name) and its eval metric.
    data_processors: ``{data_processor name: strict input schema}`` (`wafer.config.InputConfig`
      subclasses) of the processors that feed this model.
    eval_metric: the name of the eval metric the task reports (``"loss"``, ``"accuracy"``).
    default_job: ``(params path, one-line description, priority)``: the job ``wafer run`` runs without
      ``--params``; the highest priority among the installed plugins wins.
  """

  names: tuple[str, ...]
  config: type
  build_task: Callable[[Any], Any]
  data_processors: Mapping[str, type] = dataclasses.field(default_factory=dict)
  eval_metric: str = "loss"
  default_job: tuple[str, str, int] | None = None

  def __post_init__(self) -> None:
    from wafer.config import InputConfig, ModelConfig

    names = (self.names,) if isinstance(self.names, str) else self.names  # one name: not its letters
    try:
      names = tuple(names)
    except TypeError:
      names = None
    if not names or not all(isinstance(n, str) and n.strip() for n in names):
      raise PluginError(f"ModelSpec.names={self.names!r}; allowed: a model name or a tuple of names")
    object.__setattr__(self, "names", names)
    if not (isinstance(self.config, type) and issubclass(self.config, ModelConfig)):
      raise PluginError(
        f"ModelSpec({names[0]!r}).config={self.config!r}; allowed: a wafer.config.ModelConfig subclass"
      )
    if not callable(self.build_task):
      raise PluginError(
        f"ModelSpec({names[0]!r}).build_task={self.build_task!r}; allowed: build_task(params) -> Task"
      )
    for processor, schema in dict(self.data_processors).items():
      if not isinstance(processor, str) or not (isinstance(schema, type) and issubclass(schema, InputConfig)):
        raise PluginError(
          f"ModelSpec({names[0]!r}).data_processors[{processor!r}]={schema!r}; allowed: "
          "{data_processor name: a wafer.config.InputConfig subclass}"
        )


_SPECS: dict[str, ModelSpec] = {}
_LOADED: list[bool] = []
_ORIGIN: dict[str, str] = {}  # model name -> the entry point that registered it
_FAILED: dict[str, str] = {}  # entry point name -> why it did not load
_CONFLICTS: dict[str, list[str]] = {}  # model name -> the entry points that each registered it
_PROCESSOR_ORIGIN: dict[str, str] = {}  # data_processor name -> the entry point that registered it


def register(spec: ModelSpec) -> None:
  """Register ``spec`` under each of its names, with its model and input schemas (a name already
  registered is replaced: an explicit call wins; entry points that share a name are refused)."""
  if not isinstance(spec, ModelSpec):
    raise PluginError(f"{spec!r} is not a wafer.registry.ModelSpec")
  for name in spec.names:
    _SPECS[name.lower()] = spec
    register_model_schema(name, spec.config)
  for processor, schema in spec.data_processors.items():
    register_input_schema(processor, schema, spec.names)


def _entry(entry: Any) -> str:
  return f"{entry.name!r} ({entry.value})"


def load_plugins() -> None:
  """Load every ``wafer.models`` entry point once (each a `ModelSpec` or a sequence of them).

  An entry point that does not load (or gives something other than specs) is set aside with its
  error, and the others are registered: a broken plugin blocks only its own models, whose lookup
  (`get_spec`) is then a `PluginError` naming it. Two entry points registering one name make that
  name a `PluginError` naming both.
  """
  if _LOADED:
    return
  _LOADED.append(True)
  for entry in metadata.entry_points(group=GROUP):
    origin = _entry(entry)
    try:
      loaded = entry.load()
      specs = list(loaded) if isinstance(loaded, (list, tuple)) else [loaded]
      wrong = [s for s in specs if not isinstance(s, ModelSpec)]
      if wrong or not specs:
        raise PluginError(f"it gives {wrong[0] if wrong else loaded!r}, not a wafer.registry.ModelSpec")
      for spec in specs:  # a processor's schema is looked up by its name alone: two cannot share one
        for processor in spec.data_processors:
          if _PROCESSOR_ORIGIN.get(processor, origin) != origin:
            raise PluginError(
              f"its data_processor {processor!r} is already registered by {_PROCESSOR_ORIGIN[processor]}; "
              "rename the processor, or uninstall one of the packages"
            )
    except Exception as error:  # reported by name when one of its models is asked for
      _FAILED[entry.name] = f"the {GROUP} entry point {origin} does not load: {error}"
      continue
    for spec in specs:
      taken = [n for n in spec.names if n.lower() in _ORIGIN and _ORIGIN[n.lower()] != origin]
      for name in taken:
        _CONFLICTS.setdefault(name.lower(), [_ORIGIN[name.lower()]]).append(origin)
      register(spec)
      for name in spec.names:
        _ORIGIN.setdefault(name.lower(), origin)
      for processor in spec.data_processors:
        _PROCESSOR_ORIGIN.setdefault(processor, origin)


def unknown_model(name: str) -> str | None:
  """Why ``model.name`` = ``name`` names no registered model (the registered names, the nearest one, the
  plugins that did not load), or None when it names one. `get_spec` raises it; the config's loader puts
  it first among a file's problems (`wafer.config.add_model_check`), so that a file of another model
  says so before its keys are read as this project's.

  A Model Zoo model this project does not have (`wafer.config.modelzoo.MODELZOO_MODELS`) gets no
  "did you mean": a GPT-J file is not a GPT-3 file with a typo."""
  load_plugins()
  key = str(name).lower()
  if key in _SPECS:
    return None
  known = sorted(_SPECS)
  other = MODELZOO_MODELS.get(key)
  if other is not None:
    hint = f" It is Cerebras Model Zoo's {other} model, which wafer does not have."
  else:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
  if _FAILED:  # a plugin's error: the model may be one of its own
    return (
      f"unknown model {name!r}.{hint} It may be in a plugin that did not load: "
      + "; ".join(_FAILED.values())
      + f". Registered models: {', '.join(known)}"
    )
  return f"unknown model {name!r}.{hint} Registered models ({GROUP} entry points): {', '.join(known)}"


def get_spec(name: str) -> ModelSpec:
  """The spec registered as ``name``; an error lists the known names (and the plugins that did not load)."""
  load_plugins()
  key = str(name).lower()
  if key in _CONFLICTS:
    raise PluginError(
      f"model.name: {name!r} is registered by several {GROUP} entry points: "
      f"{', '.join(_CONFLICTS[key])}; uninstall one of the packages or rename its model"
    )
  found = _SPECS.get(key)
  if found is None:
    why = unknown_model(name)
    raise (PluginError if _FAILED else UnknownModelError)(f"model.name: {why}")
  return found


def get_model(name: str) -> Callable[[Any], Any]:
  """The task builder of the model registered as ``name``."""
  return get_spec(name).build_task


def data_processors() -> dict[str, str]:
  """``{data_processor: model names}`` over the registered specs."""
  load_plugins()
  out: dict[str, str] = {}
  for spec in {id(s): s for s in _SPECS.values()}.values():
    for processor in spec.data_processors:
      out[processor] = "/".join(spec.names)
  return out


def default_job() -> tuple[str, str] | None:
  """``(params path, one-line description)`` of the highest-priority default job, or None."""
  load_plugins()
  jobs = [s.default_job for s in _SPECS.values() if s.default_job is not None]
  if not jobs:
    return None
  path, description, _ = max(jobs, key=lambda job: job[2])
  return path, description


def registered() -> list[str]:
  """The registered model names."""
  load_plugins()
  return sorted(_SPECS)


add_schema_source(load_plugins)
add_model_check(unknown_model)
