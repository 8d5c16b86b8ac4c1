"""Packing kernel rectangles on the PE grid without overlap.

Rectangles are laid out in horizontal shelves of equal height, in dataflow order, left to right on
even shelves and right to left on odd ones (a snake), so consecutive kernels are fabric
neighbours. Each shelf's leftover width is shared among its rectangles in proportion to their
widths, so the whole grid is used. The shelf count is chosen to fit every rectangle and keep the
rectangles as square as possible (a mesh GEMM wants a square-ish rectangle).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

__all__ = ("Rect", "overlaps", "pack", "pack_options")


@dataclasses.dataclass(frozen=True)
class Rect:
  """A rectangle of PEs: columns ``x .. x + width - 1``, rows ``y .. y + height - 1``."""

  x: int
  y: int
  width: int
  height: int
  label: str = ""

  @property
  def area(self) -> int:
    return self.width * self.height

  def to_dict(self) -> dict[str, object]:
    return {"x": self.x, "y": self.y, "width": self.width, "height": self.height, "label": self.label}


def overlaps(a: Rect, b: Rect) -> bool:
  """True when two rectangles share at least one PE."""
  return a.x < b.x + b.width and b.x < a.x + a.width and a.y < b.y + b.height and b.y < a.y + a.height


def _try(
  areas: Sequence[float], width: int, height: int, shelves: int
) -> list[tuple[int, int, int, int]] | None:
  shelf_h = height // shelves
  if shelf_h < 1:
    return None
  widths = [max(1, math.ceil(a / shelf_h)) for a in areas]
  if max(widths) > width:
    return None
  rows: list[list[int]] = [[]]
  used = 0
  for i, w in enumerate(widths):
    if used + w > width:
      rows.append([])
      used = 0
      if len(rows) > shelves:
        return None
    rows[-1].append(i)
    used += w
  out: list[tuple[int, int, int, int]] = [(0, 0, 0, 0)] * len(areas)
  for r, members in enumerate(rows):
    total = sum(widths[i] for i in members)
    spare = width - total
    grown = [widths[i] + (spare * widths[i]) // total for i in members]
    grown[-1] += width - sum(grown)  # rounding leftovers to the last one
    x = 0
    seq = list(zip(members, grown))
    for i, w in seq:
      xx = x if r % 2 == 0 else width - x - w
      out[i] = (xx, r * shelf_h, w, shelf_h)
      x += w
  return out


def pack(
  areas: Sequence[float], width: int, height: int, labels: Sequence[str] | None = None
) -> list[Rect] | None:
  """Place rectangles of at least ``areas`` PEs (in order) on a ``width x height`` grid.

  Returns:
    One `Rect` per area (each at least as large as asked, inside the grid, none overlapping), or
    None when they cannot all be placed.
  """
  if not areas:
    return []
  if sum(areas) > width * height:
    return None
  labels = list(labels) if labels is not None else [""] * len(areas)
  best: list[tuple[int, int, int, int]] | None = None
  best_cost = math.inf
  for shelves in range(1, min(height, 4 * len(areas)) + 1):
    placed = _try(areas, width, height, shelves)
    if placed is None:
      continue
    cost = max(max(w / h, h / w) for _, _, w, h in placed)
    if cost < best_cost:
      best, best_cost = placed, cost
  if best is None:
    return None
  return [Rect(x, y, w, h, lab) for (x, y, w, h), lab in zip(best, labels)]


def pack_options(
  areas: Sequence[float], width: int, height: int, labels: Sequence[str] | None = None
) -> list[list[Rect]]:
  """Every shelf packing of ``areas`` (as `pack`, one per feasible shelf count): the floorplans a
  caller can compare by the rate they give (the Cerebras compiler "explores floorplans")."""
  if not areas or sum(areas) > width * height:
    return []
  labels = list(labels) if labels is not None else [""] * len(areas)
  out = []
  for shelves in range(1, min(height, 4 * len(areas)) + 1):
    placed = _try(areas, width, height, shelves)
    if placed is not None:
      out.append([Rect(x, y, w, h, lab) for (x, y, w, h), lab in zip(placed, labels)])
  return out
