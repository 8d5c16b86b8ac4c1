"""Loading a params YAML: parse (with line numbers), apply overrides, convert, validate."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import os
import re
import typing
from collections.abc import Mapping, Sequence
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from wafer.config import modelzoo as _modelzoo
from wafer.config import trainer as _trainer
from wafer.config.errors import (
  REQUIRED,
  ConfigError,
  Loc,
  Problem,
  dotted,
  from_pydantic,
  locate,
  suggest,
  unknown_key_message,
)
from wafer.config.params import (
  SECTIONS,
  Params,
  model_schemas,
  models_of,
  processors_of,
  registered_input_schemas,
  section_schema,
  unknown_model,
)
from wafer.config.schema import MODES, OpenSection


class _Loader(yaml.SafeLoader):
  """SafeLoader with YAML 1.2 floats (``1e-8`` is a float, not a string).

  A key given twice in one mapping keeps its last value, as PyYAML (which Cerebras' modelzoo reads
  params files with) does, so a real file that repeats a key loads as it did there; `_index_lines`
  finds each such key (with its key path) and `load_params` turns it into a note.
  """


_Loader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver(
  "tag:yaml.org,2002:float",
  re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                   |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                   |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                   |[-+]?\.(?:inf|Inf|INF)
                   |\.(?:nan|NaN|NAN))$""",
    re.VERBOSE,
  ),
  list("-+0123456789."),
)


def _construct_mapping(loader: _Loader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
  loader.flatten_mapping(node)
  for key_node, _ in node.value:
    key = loader.construct_object(key_node, deep=deep)
    try:
      hash(key)
    except TypeError:
      raise yaml.constructor.ConstructorError(
        None,
        None,
        f"a key must be a name, not a {type(key).__name__} (a [...] or {...} key)",
        key_node.start_mark,
      ) from None
  return loader.construct_mapping(node, deep=deep)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse_yaml(text: str, source: str = "<string>") -> tuple[Any, dict[Loc, int]]:
  """``(data, lines)``: the YAML document and the 1-based line of every key path.

  Raises:
    ConfigError: a syntax error, naming ``source`` and the line.
  """
  data, lines, _ = _parse_yaml(text, source)
  return data, lines


Duplicate = tuple[Loc, int, int, bool]
"""A key given twice in one mapping: ``(key path, first line, last line, whether its first value is a mapping)``."""


def _duplicate_notes(duplicates: Sequence[Duplicate]) -> list[str]:
  """One note per key given twice in a mapping (the last value is used, as PyYAML does), naming the
  key's whole path as written (``train_input.batch_size``) and both lines.

  >>> _duplicate_notes([(("train_input", "batch_size"), 3, 4, False)])[0]
  "note: key 'train_input.batch_size' is given twice (lines 3 and 4): its last value (line 4) is used, as PyYAML, which modelzoo reads params files with, does; delete one of them"
  """
  why = "as PyYAML, which modelzoo reads params files with, does"
  return [
    f"note: key {dotted(loc)!r} is given twice (lines {first} and {last}): "
    + (
      f"only the last one (line {last}) is read, {why}: the keys under line {first} are not; merge the two into one"
      if mapping
      else f"its last value (line {last}) is used, {why}; delete one of them"
    )
    for loc, first, last, mapping in duplicates
  ]


def _parse_yaml(text: str, source: str) -> tuple[Any, dict[Loc, int], list[Duplicate]]:
  """`parse_yaml` and the keys given twice (`Duplicate`)."""
  try:
    node = yaml.compose(text, Loader=_Loader)
    loader = _Loader(text)
    try:
      data = loader.get_single_data()
    finally:
      loader.dispose()
  except yaml.YAMLError as e:
    mark = getattr(e, "problem_mark", None)
    where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
    problem = getattr(e, "problem", None) or str(e)
    context = getattr(e, "context", None)
    cmark = getattr(e, "context_mark", None)
    if context and cmark is not None and mark is not None and cmark.line != mark.line:
      context = f"{context} started at line {cmark.line + 1}"
    detail = f"{problem} ({context})" if context else problem
    raise ConfigError(f"YAML syntax error: {detail}", where) from None
  lines: dict[Loc, int] = {}
  duplicates: list[Duplicate] = []
  if node is not None:
    _index_lines(node, (), lines, set(), duplicates)
  return data, lines, duplicates


def _index_lines(
  node: yaml.Node, loc: Loc, lines: dict[Loc, int], seen: set[int], duplicates: list[Duplicate]
) -> None:
  """Index each node once: a node reached again through an alias (``*name``) keeps the line of its
  first path (a problem under the alias is shown at the alias's line), so a file of nested aliases
  is indexed in linear time, not in the exponential size of what it expands to.

  A key given twice in one mapping is recorded in ``duplicates`` with its whole path; the lines under it
  are those of its last value, the one read (PyYAML keeps the last)."""
  if id(node) in seen:
    return
  seen.add(id(node))
  if isinstance(node, yaml.MappingNode):
    first: dict[tuple[str, str], tuple[int, bool]] = {}
    for key_node, value_node in node.value:
      if isinstance(key_node, yaml.ScalarNode):
        sub = loc + (key_node.value,)
        line = key_node.start_mark.line + 1
        key = (key_node.tag, key_node.value)  # 1 and "1" are two keys
        if key in first:
          duplicates.append((sub, first[key][0], line, first[key][1]))
          for indexed in [k for k in lines if k[: len(sub)] == sub]:
            del lines[indexed]
        first[key] = (line, isinstance(value_node, yaml.MappingNode))
        lines.setdefault(sub, line)
        _index_lines(value_node, sub, lines, seen, duplicates)
  elif isinstance(node, yaml.SequenceNode):
    for i, item in enumerate(node.value):
      lines.setdefault(loc + (i,), item.start_mark.line + 1)
      _index_lines(item, loc + (i,), lines, seen, duplicates)


def parse_override(text: str) -> tuple[Loc, Any]:
  """A ``key.path=value`` override as ``(loc, value)``.

  ``'optimizer.learning_rate.0.total_iters=100'`` gives
  ``(('optimizer', 'learning_rate', 0, 'total_iters'), 100)``.

  The value is parsed as YAML (``10`` int, ``0.1`` / ``1e-3`` float, ``true`` bool, ``null``,
  ``[0.9, 0.95]`` list); integer path parts index lists, negative ones from the end
  (``optimizer.learning_rate.-1.total_iters=100``: the last scheduler).

  >>> parse_override("optimizer.learning_rate.-1.total_iters=100")
  (('optimizer', 'learning_rate', -1, 'total_iters'), 100)
  """
  key, sep, raw = text.partition("=")
  key = key.strip()
  if not sep or not key or any(not part for part in key.split(".")):
    raise ConfigError(
      Problem(
        (),
        "an override must look like key.path=value, e.g. runconfig.max_steps=10",
        text,
        source=f"override {text!r}",
      ),
      "command line",
    )
  try:
    value = yaml.load(raw, Loader=_Loader) if raw.strip() else None
  except yaml.YAMLError as e:
    raise ConfigError(
      Problem(
        (), f"the value is not valid YAML: {getattr(e, 'problem', e)}", raw, source=f"override {text!r}"
      ),
      "command line",
    ) from None
  comment = _comment_dropped(raw, value)
  if comment is not None:
    raise ConfigError(
      Problem(
        (),
        f"the value {raw.strip()!r} holds {comment!r}, which YAML reads as a comment: the value would be "
        f"{value!r}. Leave the comment out, or, to keep the '#', quote the value for YAML inside the shell's "
        f"quotes: '{key}=\"{raw.strip()}\"'",
        raw,
        source=f"override {text!r}",
      ),
      "command line",
    )
  loc = tuple(int(p) if _INDEX.fullmatch(p) else p for p in key.split("."))
  return loc, value


def _comment_dropped(raw: str, value: Any) -> str | None:
  """The comment YAML dropped from an override's value (``runs/b #3`` is ``runs/b``: the shell took the
  quotes of ``runconfig.model_dir="runs/b #3"``), or None: the value reads the same without it.

  >>> _comment_dropped("runs/b #3", "runs/b")
  ' #3'
  >>> _comment_dropped('"runs/b #3"', "runs/b #3") is None
  True
  """
  match = re.search(r"\s#", raw)
  if match is None:
    return None
  try:
    before = yaml.load(raw[: match.start()], Loader=_Loader) if raw[: match.start()].strip() else None
  except yaml.YAMLError:  # the # is inside a quoted value
    return None
  return raw[match.start() :] if before == value else None


_INDEX = re.compile(r"-?[0-9]+")
"""An override's path part that indexes a list (``0``, ``-1`` from the end)."""


_YAML_PRINTABLE = re.compile("[\t\n\r\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def literal_override(key: str, value: str) -> str:
  """A ``key.path=value`` override that sets ``key`` to the string ``value`` exactly (a quoted YAML scalar).

  For values that are not YAML, such as a ``--model_dir`` path: unquoted, ``/runs/a #2`` would be
  ``/runs/a`` (a comment), ``~`` or ``null`` the default and ``2024`` an int.

  >>> literal_override("runconfig.model_dir", "runs/a #2")
  'runconfig.model_dir="runs/a #2"'
  >>> parse_override(literal_override("runconfig.model_dir", "~"))
  (('runconfig', 'model_dir'), '~')
  """

  def quoted(ch: str) -> str:
    if ch in '"\\':
      return "\\" + ch
    if ch in "\t\n\r\x85\u2028\u2029" or not _YAML_PRINTABLE.fullmatch(ch):  # YAML folds line breaks
      return f"\\u{ord(ch):04x}" if ord(ch) < 0x10000 else f"\\U{ord(ch):08x}"
    return ch

  return f'{key}="{"".join(map(quoted, value))}"'


def apply_override(data: dict[str, Any], loc: Loc, value: Any, text: str) -> Loc:
  """Set ``data[loc] = value``, creating mappings on the way; list indices must exist.

  Returns ``loc`` with its negative list indices counted from the start (the path errors name).

  >>> data = {"optimizer": {"learning_rate": [{"total_iters": 10}, {"total_iters": 20}]}}
  >>> apply_override(data, ("optimizer", "learning_rate", -1, "total_iters"), 5, "...")
  ('optimizer', 'learning_rate', 1, 'total_iters')
  >>> data["optimizer"]["learning_rate"][1]
  {'total_iters': 5}
  """
  where = f"override {text!r}"
  node: Any = data
  resolved: list[Any] = []
  for i, part in enumerate(loc):
    if isinstance(node, list):
      if not isinstance(part, int) or not -len(node) <= part < len(node):
        allowed = f"0..{len(node) - 1}, or -{len(node)}..-1 from the end" if node else "it is empty"
        raise ConfigError(
          Problem(
            (*resolved, part), f"no element {part!r} in a list of {len(node)} ({allowed})", source=where
          )
        )
      part %= len(node)
    elif not isinstance(node, dict):
      raise ConfigError(
        Problem(tuple(resolved), f"is not a mapping, so it has no key {part!r}", node, source=where)
      )
    resolved.append(part)
    if i == len(loc) - 1:
      node[part] = value
    else:
      if isinstance(node, dict) and node.get(part) is None:
        node[part] = {}
      node = node[part]
  return tuple(resolved)


def _apply(
  data: dict[str, Any],
  loc: Loc,
  value: Any,
  text: str,
  source: str,
  origins: Sequence[tuple[Loc, str]] = (),
  named: str | None = None,
) -> Loc:
  """`apply_override`, its errors attributed to the params file (they said "params:") and to the override,
  or to ``named``, the flag it came from as the user typed it (``--model_dir runs/a``, not the override the
  flag made); a flag's problem is the earlier override's that set a value in its way (`_blame_earlier`)."""
  try:
    return apply_override(data, loc, value, text)
  except ConfigError as e:
    if named is None or named == f"override {text!r}":  # one the user typed: its own mistake
      raise e.with_source(source) from None
    raise ConfigError([_blame_earlier(p, origins, named) for p in e.problems], source) from None


def _blame_earlier(p: Problem, origins: Sequence[tuple[Loc, str]], named: str) -> Problem:
  """A problem of applying the override of flag ``named`` (a value on its path that is not a mapping or a
  list), from the earlier override that set that value when one did (``runconfig=3`` before
  ``--model_dir``: the user typed the one, not the other), saying which flag needed it; else from ``named``.

  >>> _blame_earlier(Problem(("runconfig",), "is not a mapping, so it has no key 'model_dir'", 3),
  ...   [(("runconfig",), "override 'runconfig=3'")], "--model_dir md").source
  "override 'runconfig=3'"
  """
  for prefix, origin in origins:
    if p.loc[: len(prefix)] == prefix:
      return dataclasses.replace(p, message=f"{p.message} ({named} sets a key under it)", source=origin)
  return dataclasses.replace(p, source=named)


def _fields_at(schema: type[BaseModel], loc: Loc) -> list[str] | None:
  """The keys a (nested) schema allows at ``loc`` inside it."""
  for part in loc:
    field = schema.model_fields.get(part) if isinstance(part, str) else None
    ann = getattr(field, "annotation", None)
    if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
      return None
    schema = ann
  return list(schema.model_fields)


def _takes_null(schema: type[BaseModel], key: str) -> bool:
  """Whether ``key`` is a field of ``schema`` whose annotation accepts None."""
  field = schema.model_fields.get(key)
  if field is None:
    return False
  ann = field.annotation
  return ann is Any or ann is type(None) or type(None) in typing.get_args(ann)


def _validate_section(key: str, value: Any) -> tuple[Any, list[Problem]]:
  """``(section object or None, problems)`` of one section's mapping, by its (registered) schema."""
  if not isinstance(value, dict) and key != "sparsity":  # sparsity: also a number or a list of groups
    return None, [Problem((key,), "must be a mapping of keys", value)]
  schema = section_schema(key, value)  # a model or input section: after the plugins registered theirs
  # a key set to null is absent (its default applies) unless null is one of its values: a key the schema
  # does not have (``optimizer.momentum=null`` when switching optimizer_type), or one that takes no null
  # (``optimizer.momentum=null`` for SGD: momentum's default)
  if isinstance(value, dict):
    value = {k: v for k, v in value.items() if v is not None or _takes_null(schema, k)}
  problems: list[Problem] = []
  processor = value.get("data_processor") if key in ("train_input", "eval_input") else None
  if isinstance(processor, str) and schema is SECTIONS[key] and registered_input_schemas():
    problems.append(Problem((key, "data_processor"), _unknown_processor_message(processor), processor))
  if issubclass(schema, OpenSection):
    found = schema.key_problems(value)
    problems += [Problem((key, k), m, value[k]) for k, m in found.items()]
    value = {k: v for k, v in value.items() if k not in found}
  try:
    return schema.model_validate(value), problems
  except ValidationError as e:
    return None, problems + from_pydantic(e.errors(), (key,), lambda loc, s=schema: _fields_at(s, loc))


def validate_section(key: str, value: Any, source: str | None = None) -> Any:
  """One section (``"optimizer"``, ``"train_input"``, ...) validated by its schema, alone.

  Raises:
    ConfigError: every problem of the section.
  """
  section, problems = _validate_section(key, value)
  if key == "optimizer" and section is not None:
    problems += section.problems()
  if problems:
    raise ConfigError(problems, source or f"<{key}>")
  return section


def build_optimizer(optimizer_section: Mapping[str, Any], *, half_dtype: Any = "float16") -> tuple[Any, Any]:
  """``(tx, loss_scale)`` of an ``optimizer`` mapping: validated by its config class, then built.

  A shortcut for ``validate_section("optimizer", section).build(half_dtype)``; a run builds from
  the validated `wafer.config.Params` instead (``params.build()``).

  Raises:
    ConfigError: a key or value the section's schema rejects (with "did you mean").
    OptimizerError: a loss-scaling setting that does not fit ``half_dtype``.
  """
  return validate_section("optimizer", dict(optimizer_section)).build(half_dtype)


def validate_params(
  data: Any,
  source: str | None = None,
  lines: Mapping[Loc, int] | None = None,
  origins: Sequence[tuple[Loc, str]] = (),
  renames: Sequence[tuple[Loc, Loc]] = (),
  found: Sequence[Problem] = (),
  notes: Sequence[str] = (),
  release: Any = None,
) -> Params:
  """Validate a legacy-layout dict into :class:`Params`, reporting every problem at once.

  Args:
    data: the parsed YAML (legacy layout).
    source: the file name for messages.
    lines: key path -> line, from :func:`parse_yaml`.
    origins: ``(loc prefix, origin)`` pairs: values under ``loc`` came from ``origin`` (an override).
    renames: ``(legacy loc prefix, written loc prefix)`` pairs, for files converted from the
      trainer layout: problems are shown at the key path the user wrote.
    found: problems found before (the layout conversion's, `wafer.config.modelzoo.adapt`'s), reported
      with the others.
    notes: the loader's notes (``Params.notes``); release: ``Params.release``.

  Raises:
    ConfigError: listing every problem found.
  """
  lines = lines or {}
  if not isinstance(data, dict):
    what = "empty" if data is None else f"a {type(data).__name__}, not a mapping"
    raise ConfigError(f"the params file is {what}; expected the sections {', '.join(SECTIONS)}", source)
  problems: list[Problem] = list(found)
  sections: dict[str, Any] = {}
  for key, value in data.items():
    if key not in SECTIONS:
      problems.append(Problem((key,), unknown_key_message(key, list(SECTIONS)) + " (top-level section)"))
      continue
    if value is None:  # an empty section (``eval_input:``) is an absent one
      continue
    section, found = _validate_section(key, value)
    problems += found
    if section is not None:
      sections[key] = section
  if data.get("model") is None:
    problems.append(Problem(("model",), "required section is missing"))
  if not problems:
    params = Params(
      **sections,
      source=source,
      lines=dict(lines or {}),
      origins=tuple(origins),
      renames=tuple(renames),
      release=release,
      notes=tuple(notes),
    )
    problems = params.problems()
  if problems:
    raise ConfigError([locate(p, lines, origins, renames) for p in problems], source)
  return params


def _unknown_processor_message(processor: str) -> str:
  """``unknown data_processor 'X'`` with the nearest registered one, or the list. The nearest is
  kept only if the names are still near without the ending they share (``SST2DataProcessor`` is not
  ``MNISTDataProcessor``: ``SST2`` is not ``MNIST``).

  >>> _unknown_processor_message("BertCSVDynamicMaskDataProcesor")
  "unknown data_processor 'BertCSVDynamicMaskDataProcesor'; did you mean 'BertCSVDynamicMaskDataProcessor'?"
  """
  known = registered_input_schemas()
  close = suggest(processor, known)
  if close is not None:
    a, b = processor.lower(), close.lower()
    shared = len(os.path.commonprefix([a[::-1], b[::-1]]))
    if difflib.SequenceMatcher(None, a[: len(a) - shared], b[: len(b) - shared]).ratio() >= 0.6:
      return f"unknown data_processor {processor!r}; did you mean {close!r}?"
  return f"unknown data_processor {processor!r}; registered processors: {', '.join(sorted(known))}"


def _unknown_processor(p: Problem) -> bool:
  """Whether ``p`` is an input section's unknown ``data_processor`` (`_validate_section`'s problem)."""
  return len(p.loc) == 2 and p.loc[1] == "data_processor" and p.message.startswith("unknown data_processor")


def _not_utf8(error: UnicodeDecodeError, source: str) -> str:
  """Where a params file stops being UTF-8 text: line and column of the first bad byte."""
  with open(source, "rb") as f:
    head = f.read(error.start)
  line = head.count(b"\n") + 1
  column = error.start - (head.rfind(b"\n") + 1) + 1
  bad = error.object[error.start : error.end]
  return (
    f"line {line}, column {column}: byte {bad[:4]!r} is not UTF-8 text; a params file is a UTF-8 YAML "
    "text file (is this a binary file, or one saved in another encoding? Re-save it as UTF-8)"
  )


def load_params(
  path: str | os.PathLike[str] | Mapping[str, Any],
  overrides: Sequence[str] = (),
  mode: str | None = None,
  flags: Mapping[str, str] | None = None,
) -> Params:
  """Load and validate a params file.

  Args:
    path: a YAML file in modelzoo's legacy layout or the trainer (v2) layout (detected by its
      top-level ``trainer`` key and converted with :func:`from_trainer_layout`); or an already
      parsed mapping.
    overrides: ``key.path=value`` strings, applied in order to the legacy layout (paths starting
      with ``trainer.`` are applied to a trainer-layout file before conversion).
    mode: sets ``runconfig.mode`` (the CLI's ``--mode``), checked like any other key.
    flags: for overrides a command-line flag made, the flag as the user typed it (``{"train_input.
      batch_size=3": "--batch_size 3"}``): a problem with its value names the flag, not the override.

  Returns:
    The validated :class:`Params`.

  Raises:
    ConfigError: an unreadable file, a YAML error (with its line), an unknown key (with a
      suggestion), a wrong type or value, or a cross-key check; every problem at once. A key the
      file gives twice is a note after the problems (it may explain them: a second ``model:`` section
      replaces the first), as it is a note of a file that loads.
  """
  if isinstance(path, Mapping):
    source, data, lines, duplicates = "<dict>", copy.deepcopy(dict(path)), {}, []
  else:
    source = os.fspath(path)
    try:
      with open(source, encoding="utf-8") as f:
        text = f.read()
    except OSError as e:
      raise ConfigError(f"cannot read the params file: {e.strerror or e}", source) from None
    except UnicodeDecodeError as e:
      raise ConfigError(_not_utf8(e, source), source) from None
    data, lines, duplicates = _parse_yaml(text, source)
  notes = _duplicate_notes(duplicates)
  try:
    return _load_data(source, data, lines, notes, overrides, mode, flags)
  except ConfigError as error:
    if not notes:
      raise
    raise error.with_notes(notes) from None


def _load_data(
  source: str,
  data: Any,
  lines: dict[Loc, int],
  duplicate_notes: list[str],
  overrides: Sequence[str],
  mode: str | None,
  flags: Mapping[str, str] | None,
) -> Params:
  """`load_params` of a parsed file: ``data`` and the lines of its keys."""
  if not isinstance(data, dict):
    what = "empty" if data is None else f"a {type(data).__name__}, not a mapping"
    raise ConfigError(
      f"the params file is {what}; expected a mapping of the sections {', '.join(SECTIONS)} "
      "(or a top-level 'trainer' section)",
      source,
    )
  parsed = [(parse_override(o), o) for o in overrides]
  flags = dict(flags or {})

  def origin(text: str) -> str:
    return flags.get(text, f"override {text!r}")

  origins: list[tuple[Loc, str]] = []
  v2_map: list[tuple[Loc, Loc]] = []
  found: list[Problem] = []
  callbacks: list[tuple[Loc, str]] = []
  trainer_layout = _trainer.is_trainer_layout(data)
  if trainer_layout:
    for (loc, value), text in parsed:
      if loc[0] == "trainer":
        origins.insert(0, (_apply(data, loc, value, text, source, origins, origin(text)), origin(text)))
    try:
      data, v2_map, found, callbacks = _trainer.convert_all(data)
    except ConfigError as e:  # the file's shape does not convert at all (a list of trainers)
      raise ConfigError([locate(p, lines, origins) for p in e.problems], source) from None
    parsed = [item for item in parsed if item[0][0][0] != "trainer"]
  written = copy.deepcopy(
    data
  )  # the file as written: its keys date it (`_modelzoo.release_of`), not overrides'
  for (loc, value), text in parsed:
    if loc[0] not in SECTIONS:
      raise ConfigError(
        Problem(
          loc[:1],
          unknown_key_message(loc[0], list(SECTIONS)) + " (top-level section)",
          source=f"override {text!r}",
        ),
        source,
      )
    origins.insert(0, (_apply(data, loc, value, text, source, origins, origin(text)), origin(text)))
  if mode is not None:
    if data.get("runconfig") is None:
      data["runconfig"] = {}
    if isinstance(data["runconfig"], dict):
      data["runconfig"]["mode"] = mode
    origins.insert(0, (("runconfig", "mode"), "--mode"))

  def where(loc: Loc) -> str:
    p = locate(Problem(loc, ""), lines, origins, v2_map)
    shown = p.shown_path or dotted(loc)
    return f"{shown} ({p.source or f'line {p.line}'})" if p.source or p.line else shown

  adapted = _modelzoo.adapt(
    data,
    None if source == "<dict>" else source,
    models_of,
    model_schemas(),
    processors_of,
    where,
    [f"{dotted(loc)} ({_modelzoo.IGNORED[('callback', name)]})" for loc, name in callbacks],
  )
  if adapted.alone:
    raise ConfigError([locate(p, lines, origins, v2_map) for p in adapted.problems], source)
  model = adapted.data.get("model")
  name = model.get("name") if isinstance(model, dict) else None
  # the release from the keys as written, before the overrides (`runconfig.eval_frequency=5` does not make a
  # 1.8 file one of 1.9, nor change its AdamW) and before adapt (which drops ignored keys, some dating the
  # file); a runconfig.modelzoo_release given by an override still decides
  release = _modelzoo.release_of(_modelzoo.dated_by(written, data), trainer_layout=trainer_layout, model=name)
  adamw_note = _modelzoo.adamw_default(adapted.data, release)
  if isinstance(adapted.data.get("sparsity"), list):  # validated as {groups: [...]}: shown as written
    v2_map = [*v2_map, (("sparsity", "groups"), ("sparsity",))]
  v2_map = [*v2_map, *adapted.renames]  # a 1.x key moved (model.precision_opt_level): named as written
  try:
    params = validate_params(
      adapted.data,
      source,
      lines,
      origins,
      v2_map,
      found + adapted.problems,
      duplicate_notes + list(adapted.notes) + ([adamw_note] if adamw_note else []),
      release,
    )
  except ConfigError as e:
    problems = e.problems
    if any("schedulers" in p.loc for p in found):  # a scheduler that did not convert is not a missing one
      problems = [p for p in problems if (p.loc, p.message) != (("optimizer", "learning_rate"), REQUIRED)]
    # a model that is not available: say so first (its keys and data processors are its own, not
    # mistakes; its unknown data processors are left out); the runner says the same of a file
    # without other problems
    why = unknown_model(name) if isinstance(name, str) else None
    if why is not None:
      head = locate(Problem(("model", "name"), why, name), lines, origins, v2_map)
      rest = [p for p in problems if not _unknown_processor(p)]
      raise ConfigError([head, *rest], e.source) from None
    # a model read from the data processor (no model.name): its problems may be those of another
    # model sharing the processor (a LLaMA file read as gpt3): say first how the file was read
    if adapted.inferred is None:
      raise ConfigError(problems, e.source) from None
    head = Problem(
      ("model", "name"),
      f"not set: {adapted.inferred}. The problems below may mean the file is of another model, "
      f"which is not available here (registered models: {', '.join(sorted(model_schemas()))})",
    )
    raise ConfigError([head, *problems], e.source) from None
  note = _modelzoo.precision_note(params)
  return params.model_copy(update={"notes": params.notes + ((note,) if note else ())})


__all__ = (
  "MODES",
  "apply_override",
  "build_optimizer",
  "literal_override",
  "load_params",
  "parse_override",
  "parse_yaml",
  "suggest",
  "validate_params",
  "validate_section",
)
