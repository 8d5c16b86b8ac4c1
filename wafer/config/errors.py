"""Config errors users can act on: one exception type, short messages, never a pydantic dump.

Every problem names where (file, line when known, key path), what was found and what is allowed;
misspelled keys and enum values get a "did you mean". Several problems are listed one per line.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import reprlib
from collections.abc import Iterable, Sequence
from typing import Any

from wafer.errors import WaferError

Loc = tuple[str | int, ...]


class _Missing:
  """The type of `_MISSING`; it pickles as a reference to it, so a copied `Problem` still has no value."""

  def __repr__(self) -> str:
    return "_MISSING"

  def __reduce__(self) -> str:
    return "_MISSING"


_MISSING = _Missing()


def dotted(loc: Sequence[str | int]) -> str:
  """``('optimizer', 'learning_rate', 0)`` -> ``'optimizer.learning_rate[0]'``."""
  out = ""
  for part in loc:
    if isinstance(part, int):
      out += f"[{part}]"
    else:
      out += f".{part}" if out else str(part)
  return out or "<top level>"


def suggest(name: Any, options: Iterable[str], cutoff: float = 0.6) -> str | None:
  """The option closest to ``name`` (difflib, case-insensitive), or None."""
  options = list(options)
  lowered = {o.lower(): o for o in options}
  close = difflib.get_close_matches(str(name).lower(), list(lowered), n=1, cutoff=cutoff)
  return lowered[close[0]] if close else None


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = 200
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 12
_REPR.maxlevel = 4


def short_repr(value: Any, limit: int = 60) -> str:
  """``repr(value)``, cut to ``limit`` characters (built bounded: a value of nested YAML aliases is huge)."""
  text = _REPR.repr(value)
  return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclasses.dataclass(frozen=True)
class Problem:
  """One thing wrong with a params file.

  Attributes:
    loc: the key path, e.g. ``('runconfig', 'max_steps')``.
    message: what is wrong and what is allowed (no key path, no file).
    value: the offending value, or ``_MISSING`` when there is none to show.
    source: where the value came from when not the file (e.g. ``override 'a.b=1'``).
    line: 1-based line in the file, when known.
    shown_path: the key path as the user wrote it, when it differs from ``loc`` (trainer layout).
  """

  loc: Loc
  message: str
  value: Any = _MISSING
  source: str | None = None
  line: int | None = None
  shown_path: str | None = None

  @property
  def path(self) -> str:
    return self.shown_path or dotted(self.loc)

  def render(self) -> str:
    where = self.path
    if self.line is not None and self.source is None:
      where = f"line {self.line}: {where}"
    if self.source is not None:
      where = f"{where} (from {self.source})"
    value = "" if self.value is _MISSING else f" (got {short_repr(self.value)})"
    return f"{where}: {self.message}{value}"


class ConfigError(WaferError, ValueError):
  """A params file (or an override) is wrong. The message is meant for the user, as is.

  Attributes:
    problems: every problem found, in file order.
    source: the params file's path (or a description such as ``<dict>``).
  """

  def __init__(self, problems: Sequence[Problem] | Problem | str, source: str | None = None):
    if isinstance(problems, str):
      problems = [Problem((), problems)]
    elif isinstance(problems, Problem):
      problems = [problems]
    self.problems = list(problems)
    self.source = source
    super().__init__(self._text())

  def with_source(self, source: str | None) -> ConfigError:
    """This error, attributed to ``source`` (keeps an existing source)."""
    return ConfigError(self.problems, self.source or source)

  def _text(self) -> str:
    head = self.source or "params"
    if len(self.problems) == 1:
      p = self.problems[0]
      if not p.loc and p.shown_path is None:
        return f"{head}: {p.message}" + ("" if p.value is _MISSING else f" (got {short_repr(p.value)})")
      return f"{head}: {p.render()}"
    lines = [f"{head}: {len(self.problems)} problems:"]
    lines += [f"  {p.render()}" for p in self.problems]
    return "\n".join(lines)

  def __str__(self) -> str:
    return self._text()


def format_config_error(err: BaseException) -> str:
  """The text the CLI prints for a config error (no traceback), ending with a hint.

  Args:
    err: a :class:`ConfigError` (anything else is shown as ``Type: message``).
  """
  if isinstance(err, ConfigError):
    return f"error: {err}\n(fix the params file, or override a key on the command line: key.path=value)"
  return f"error: {type(err).__name__}: {err}"


_QUOTED = re.compile(r"'([^']*)'")


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
      msg, value = "required key is missing", _MISSING
    elif kind in ("value_error", "assertion_error"):
      msg = re.sub(r"^(Value error|Assertion failed), ", "", msg)
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


def unknown_key_message(key: Any, allowed: Sequence[str]) -> str:
  """``unknown key 'x'; did you mean 'y'?`` or the list of allowed keys."""
  close = suggest(key, allowed)
  if close:
    return f"unknown key {key!r}; did you mean {close!r}?"
  if not allowed:
    return f"unknown key {key!r}"
  return f"unknown key {key!r}; allowed keys: {', '.join(sorted(allowed))}"
