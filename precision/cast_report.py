"""`CastReport`: what `precision.autocast` did to each primitive of a traced function."""

from __future__ import annotations

import dataclasses
from typing import Any

from precision._table import Table


@dataclasses.dataclass
class CastCounts:
  """Counts for one primitive or op class, per call of the function.

  Attributes:
    equations: equations of this kind in the traced program (a scan body counts ``length``
      times; a while body once; every branch of a ``cond`` once, as if each ran: a call runs one,
      so its elements are at most these).
    rounded: tensor elements rounded to the compute format by inserted roundings (a matmul's
      operand roundings and its result's; an elementwise op's result).
    kept_float32: float32 result elements left unrounded by a ``"float32"`` rule (or because
      every input was a float32-kept value or a constant, or inside a float32 region).
    untouched: result elements of ops the pass leaves alone (data movement, exact ops on
      values already rounded, casts, integer ops, unknown primitives).
  """

  equations: int = 0
  rounded: int = 0
  kept_float32: int = 0
  untouched: int = 0

  def add(self, other: CastCounts, times: int = 1) -> None:
    self.equations += other.equations * times
    self.rounded += other.rounded * times
    self.kept_float32 += other.kept_float32 * times
    self.untouched += other.untouched * times


class CastLog:
  """Mutable per-primitive and per-class counters filled while the pass runs."""

  def __init__(self) -> None:
    self.by_primitive: dict[str, CastCounts] = {}
    self.by_class: dict[str, CastCounts] = {}
    self.unknown: dict[str, int] = {}
    self.while_loops = 0

  def record(
    self,
    primitive: str,
    op_class: str,
    *,
    rounded: int = 0,
    kept_float32: int = 0,
    untouched: int = 0,
    equations: int = 1,
  ) -> None:
    """Add one equation's counts (``equations=0``: elements of an equation counted already, as an
    operand a caller rounds for a body's product)."""
    counts = CastCounts(equations, rounded, kept_float32, untouched)
    self.by_primitive.setdefault(primitive, CastCounts()).add(counts)
    self.by_class.setdefault(op_class, CastCounts()).add(counts)
    if op_class == "unknown":
      self.unknown[primitive] = self.unknown.get(primitive, 0) + 1

  def merge(self, other: CastLog, times: int = 1) -> None:
    for name, counts in other.by_primitive.items():
      self.by_primitive.setdefault(name, CastCounts()).add(counts, times)
    for name, counts in other.by_class.items():
      self.by_class.setdefault(name, CastCounts()).add(counts, times)
    for name, n in other.unknown.items():
      self.unknown[name] = self.unknown.get(name, 0) + n * times
    self.while_loops += other.while_loops


@dataclasses.dataclass
class CastReport:
  """What autocast does to one function at one input signature.

  Attributes:
    policy: the policy's string form, e.g. ``"p=float32,c=cbfloat16,o=float32,level=1"``.
    by_primitive: `CastCounts` per primitive name (higher-order primitives are recursed into;
      their bodies' equations are counted under their own primitives).
    by_class: `CastCounts` per op class, plus ``constant`` (ops on constants only),
      ``float32_region`` (equations inside `precision.float32_region`), ``nested_autocast``
      (equations of an inner autocast, left to its own policy) and ``output``.
    unknown_primitives: float primitives the pass did not recognise and left unchanged,
      with their equation counts. Add them to ``precision.autocast.PRIMITIVE_CLASSES``.
    while_loops: number of while loops, whose bodies are counted once (trip counts are
      unknown before running).
  """

  policy: str
  by_primitive: dict[str, CastCounts]
  by_class: dict[str, CastCounts]
  unknown_primitives: dict[str, int]
  while_loops: int = 0

  @classmethod
  def from_log(cls, policy: Any, log: CastLog) -> CastReport:
    order = lambda d: dict(sorted(d.items(), key=lambda kv: (-kv[1].rounded, kv[0])))
    return cls(str(policy), order(log.by_primitive), order(log.by_class), dict(log.unknown), log.while_loops)

  @property
  def total(self) -> CastCounts:
    """Sums over all op classes."""
    total = CastCounts()
    for counts in self.by_class.values():
      total.add(counts)
    return total

  def table(self, by: str = "class") -> Table:
    """A `Table` of the counts ``by="class"`` or ``by="primitive"``."""
    if by not in ("class", "primitive"):
      raise ValueError(f"by={by!r}; allowed: 'class', 'primitive'")
    rows_of = self.by_class if by == "class" else self.by_primitive
    rows = [[name, c.equations, c.rounded, c.kept_float32, c.untouched] for name, c in rows_of.items()]
    t = self.total
    rows.append(["total", t.equations, t.rounded, t.kept_float32, t.untouched])
    notes = []
    if self.unknown_primitives:
      listed = ", ".join(f"{k} ({v})" for k, v in self.unknown_primitives.items())
      notes.append(f"Unknown primitives left unchanged: {listed}.")
    if self.while_loops:
      notes.append(
        f"{self.while_loops} while loop(s): bodies counted once each (their trip counts are not known before they run)."
      )
    return Table(
      [f"op {by}", "equations", "values rounded", "kept float32", "untouched"],
      rows,
      title=f"autocast cast report ({self.policy}); counts are tensor elements per call",
      footer=" ".join(notes),
    )

  def __str__(self) -> str:
    return f"{self.table('class')}\n\n{self.table('primitive')}"

  __repr__ = __str__

  def _repr_html_(self) -> str:
    return self.table("class")._repr_html_() + self.table("primitive")._repr_html_()

  def to_dict(self) -> dict[str, Any]:
    """Plain ``dict``/``int``/``str`` data (JSON-serialisable)."""
    return {
      "policy": self.policy,
      "by_class": {k: dataclasses.asdict(v) for k, v in self.by_class.items()},
      "by_primitive": {k: dataclasses.asdict(v) for k, v in self.by_primitive.items()},
      "unknown_primitives": dict(self.unknown_primitives),
      "while_loops": self.while_loops,
      "total": dataclasses.asdict(self.total),
    }
