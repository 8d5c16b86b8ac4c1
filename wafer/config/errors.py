"""How config errors are worded: short messages, never a pydantic dump (the type, `ConfigError`, and
its `Problem` live in `wafer.errors`, with every other user-facing error).

Every problem names where (file, line when known, key path), what was found and what is allowed;
misspelled keys and enum values get a "did you mean". Several problems are listed one per line.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from wafer.errors import _MISSING as _MISSING
from wafer.errors import ConfigError as ConfigError
from wafer.errors import Loc as Loc
from wafer.errors import Problem as Problem
from wafer.errors import dotted as dotted
from wafer.errors import short_repr as short_repr


def suggest(name: Any, options: Iterable[str], cutoff: float = 0.6) -> str | None:
  """The option closest to ``name`` (difflib, case-insensitive), or None."""
  options = list(options)
  lowered = {o.lower(): o for o in options}
  close = difflib.get_close_matches(str(name).lower(), list(lowered), n=1, cutoff=cutoff)
  return lowered[close[0]] if close else None


def format_config_error(err: BaseException) -> str:
  """The text the CLI prints for a config error (no traceback), ending with a hint where a key is wrong.

  Args:
    err: a :class:`ConfigError` (anything else is shown as ``Type: message``).
  """
  if isinstance(err, ConfigError):
    if not any(p.loc for p in err.problems):  # the file itself or an override's syntax: no key to fix
      return f"error: {err}"
    return f"error: {err}\n(fix the params file, or override a key on the command line: key.path=value)"
  return f"error: {type(err).__name__}: {err}"


_QUOTED = re.compile(r"'([^']*)'")
REQUIRED = "required key is missing"
"""The message of a missing required key (`from_pydantic`)."""


def from_pydantic(errors: Iterable[dict[str, Any]], prefix: Loc, fields_at: Any) -> list[Problem]:
  """Problems from pydantic's ``ValidationError.errors()``, located under ``prefix``.

  Args:
    errors: pydantic error dicts.
    prefix: the section's key path.
    fields_at: ``fields_at(loc) -> list[str] | None``: the keys allowed at a path inside the
      section (for "did you mean").
  """
  out = []
  for e in errors:
    loc = tuple(e["loc"])
    kind = e["type"]
    value = e.get("input", _MISSING)
    msg = e["msg"]
    if kind == "extra_forbidden":
      allowed = fields_at(loc[:-1]) or []
      msg = unknown_key_message(loc[-1], allowed)
    elif kind == "missing":
      msg, value = REQUIRED, _MISSING
    elif kind in ("value_error", "assertion_error"):
      msg = re.sub(r"^(Value error|Assertion failed), ", "", msg)
      key = re.match(r"^(\w+(?:\.\w+)*)=[^:]*: ", msg)
      path, inner = (key.group(1).split(".") if key else []), value
      for part in path:  # a section validator's "key=value: why" (or "key.sub=value: why") is about that key
        inner = inner.get(part, _MISSING) if isinstance(inner, dict) else _MISSING
      if key and inner is not _MISSING:  # locate it there: its own line, or the override that set it
        loc, value, msg = (*loc, *path), inner, msg[key.end() :]
      elif loc and (inside := _inside(msg, loc[-1], value)) is not None:  # a field's "field[1].key: why"
        path, value, msg = inside
        loc = (*loc, *path)
    elif kind.startswith("literal_error") or kind == "enum":
      options = _QUOTED.findall(e.get("ctx", {}).get("expected", ""))
      msg = "must be one of " + ", ".join(repr(o) for o in options)
      close = suggest(value, options) if isinstance(value, str) else None
      if close:
        msg += f"; did you mean {close!r}?"
    elif kind in ("too_short", "too_long"):
      n = e.get("ctx", {}).get("min_length" if kind == "too_short" else "max_length")
      msg = f"must have {'at least' if kind == 'too_short' else 'at most'} {n} item(s)"
    else:
      msg = re.sub(r"^\w+ should ", "must ", msg)
      if kind.endswith("_type") and value is not _MISSING:
        msg += f", not {type(value).__name__}"
    out.append(Problem(prefix + loc, msg, value))
  return out


_INSIDE = re.compile(r"^(\w+)((?:\[\d+\]|\.\w+)+)(?:=[^:]*)?: ")
_PART = re.compile(r"\[(\d+)\]|\.(\w+)")


def _inside(msg: str, field: Any, value: Any) -> tuple[Loc, Any, str] | None:
  """``(path, inner value, rest of msg)`` of a field validator's message about a part of its value (a
  scheduler of a list: ``learning_rate[1].total_iter: LinearLR: unknown key ...``), the path inside the
  field; None when ``msg`` names no part of ``value`` (the problem stays at the field).

  >>> _inside("learning_rate[1].x: bad", "learning_rate", [{}, {"x": 2}])
  ((1, 'x'), 2, 'bad')
  """
  match = _INSIDE.match(msg)
  if match is None or match.group(1) != field:
    return None
  path = tuple(int(i) if i else key for i, key in _PART.findall(match.group(2)))
  inner = value
  for part in path:
    if isinstance(part, int) and isinstance(inner, list) and 0 <= part < len(inner):
      inner = inner[part]
    elif isinstance(part, str) and isinstance(inner, dict) and part in inner:
      inner = inner[part]
    else:
      return None
  return path, inner, msg[match.end() :]


def unknown_key_message(key: Any, allowed: Sequence[str]) -> str:
  """``unknown key 'x'; did you mean 'y'?`` or the list of allowed keys."""
  close = suggest(key, allowed)
  if close:
    return f"unknown key {key!r}; did you mean {close!r}?"
  if not allowed:
    return f"unknown key {key!r}"
  return f"unknown key {key!r}; allowed keys: {', '.join(sorted(allowed))}"


def locate(
  p: Problem,
  lines: Mapping[Loc, int],
  origins: Sequence[tuple[Loc, str]],
  renames: Sequence[tuple[Loc, Loc]] = (),
) -> Problem:
  """``p`` with its path as written, and the override it came from or its line in the file."""
  shown, lookup = p.shown_path, p.loc
  for prefix, written in renames:
    if p.loc[: len(prefix)] == prefix:
      lookup = written + p.loc[len(prefix) :]
      shown = dotted(lookup)
      break
  for prefix, origin in origins:
    if p.loc[: len(prefix)] == prefix or lookup[: len(prefix)] == prefix:
      return dataclasses.replace(p, source=origin, shown_path=shown)
  for prefix, origin in origins:  # an override set a part of the value checked as a whole (a scheduler list)
    if any(len(loc) >= 2 and prefix[: len(loc)] == loc for loc in (p.loc, lookup)):
      return dataclasses.replace(p, source=origin, shown_path=shown)
  for prefix, origin in origins:  # a problem of a section that names a key an override set (or emptied:
    if _names_key(
      p, prefix, lookup
    ):  # ``runconfig.max_steps=`` leaves "one of ..., max_steps must be given")
      return dataclasses.replace(p, source=origin, shown_path=shown)
  for n in range(len(lookup), 0, -1):
    if lookup[:n] in lines:
      return dataclasses.replace(p, line=lines[lookup[:n]], shown_path=shown)
  return dataclasses.replace(p, shown_path=shown)


def _names_key(p: Problem, key: Loc, lookup: Loc) -> bool:
  """Whether ``p``, a problem of the mapping that holds ``key`` (a key path an override set), names that key
  in its message.

  >>> _names_key(Problem(("runconfig",), "One of num_steps or max_steps must be provided"),
  ...   ("runconfig", "max_steps"), ("runconfig",))
  True
  """
  if not key or not isinstance(key[-1], str) or key[:-1] not in (p.loc, lookup):
    return False
  return re.search(rf"(?<![\w.]){re.escape(key[-1])}(?!\w)", p.message) is not None
