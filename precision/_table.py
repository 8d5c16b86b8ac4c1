"""A small text/HTML table that prints in a terminal and renders in a notebook."""

from __future__ import annotations

import html
import textwrap
from collections.abc import Sequence
from typing import Any


class Table:
  """Rows of cells under a header.

  ``str(table)`` is an aligned plain-text table; Jupyter shows ``_repr_html_``;
  ``to_dict()`` gives ``{"columns": [...], "rows": [[...], ...]}`` for JSON.
  """

  def __init__(
    self, columns: Sequence[str], rows: Sequence[Sequence[Any]], title: str = "", footer: str = ""
  ):
    self.title = title
    self.footer = footer
    self.columns = [str(c) for c in columns]
    self.rows = [[_cell(v) for v in row] for row in rows]
    for row in self.rows:
      if len(row) != len(self.columns):
        raise ValueError(f"table row {row} has {len(row)} cells; the header has {len(self.columns)}")

  def __str__(self) -> str:
    widths = [len(c) for c in self.columns]
    for row in self.rows:
      widths = [max(w, len(v)) for w, v in zip(widths, row)]

    def line(cells: Sequence[str]) -> str:
      return "  ".join(v.ljust(w) for v, w in zip(cells, widths)).rstrip()

    out = [self.title] if self.title else []
    out += [line(self.columns), line(["-" * w for w in widths])]
    out += [line(row) for row in self.rows]
    if self.footer:
      out += [""] + textwrap.wrap(self.footer, width=max(60, len(out[-1])))
    return "\n".join(out)

  __repr__ = __str__

  def _repr_html_(self) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>" for row in self.rows)
    caption = f"<caption>{html.escape(self.title)}</caption>" if self.title else ""
    footer = f"<p>{html.escape(self.footer)}</p>" if self.footer else ""
    return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{footer}"

  def to_dict(self) -> dict[str, Any]:
    return {
      "title": self.title,
      "footer": self.footer,
      "columns": list(self.columns),
      "rows": [list(r) for r in self.rows],
    }


def _cell(value: Any) -> str:
  if isinstance(value, float):
    return f"{value:.6g}"
  return str(value)
