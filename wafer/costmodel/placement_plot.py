"""A PNG of a `Report`'s placement on the wafer (matplotlib, Agg backend).

Layer pipelined: every kernel instance is a rectangle on the fabric, coloured by kernel and
labelled. Weight streaming: the one rectangle all layers share in time, beside a bar chart of each
kernel's share of the step (compute and weight I/O).
"""

from __future__ import annotations

import math
import os
from typing import Any

__all__ = ("plot_report",)


def plot_report(report: Any, path: str) -> str:
  """Draw ``report``'s placement into ``path`` (PNG; ``.png`` added where it names no extension) and
  return the path written. ``report`` is a `wafer.costmodel.Report`; this module does not import it
  (``report.plot`` imports this one when asked for a picture).

  Drawn on a bare ``matplotlib.figure.Figure``: pyplot, its backend (a notebook's inline one) and
  its open figures are left alone."""
  from matplotlib import colormaps
  from matplotlib.figure import Figure
  from matplotlib.patches import Patch, Rectangle

  fab_w, fab_h = report.fabric
  ox, oy = report.offset
  streaming = report.mode == "weight_streaming"
  if streaming:
    fig = Figure(figsize=(13, 7))
    ax, bx = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.0, 1.1]})
  else:
    fig = Figure(figsize=(8.5, 9))
    ax = fig.subplots()
    bx = None
  ax.add_patch(Rectangle((0, 0), fab_w, fab_h, facecolor="#f2f2f2", edgecolor="#444444", linewidth=1.2))
  gw, gh = report.grid
  ax.add_patch(
    Rectangle((ox, oy), gw, gh, facecolor="none", edgecolor="#999999", linewidth=0.8, linestyle="--")
  )
  names = []
  for k in report.kernels:
    if k.name not in names:
      names.append(k.name)
  cmap = colormaps["tab20" if len(names) > 10 else "tab10"]
  colour = {n: cmap(i % cmap.N) for i, n in enumerate(names)}
  for r in report.placement:
    base = r.label.split("[")[0]
    face = colour.get(base, "#4c78a8") if not streaming else "#4c78a8"
    ax.add_patch(
      Rectangle(
        (ox + r.x, oy + r.y), r.width, r.height, facecolor=face, edgecolor="white", linewidth=0.6, alpha=0.9
      )
    )
    small = r.width < fab_w / 14 or r.height < fab_h / 40
    if not small:
      ax.text(
        ox + r.x + r.width / 2,
        oy + r.y + r.height / 2,
        _short(r.label, r.width, fab_w),
        ha="center",
        va="center",
        fontsize=6.5,
        color="white",
      )
  ax.set_xlim(-10, fab_w + 10)
  ax.set_ylim(fab_h + 10, -10)
  ax.set_aspect("equal")
  ax.set_xlabel("PE column")
  ax.set_ylabel("PE row")
  if not streaming:
    handles = [
      Patch(facecolor=colour[n], label=n)
      for n in names
      if any(r.label.split("[")[0] == n for r in report.placement)
    ]
    ax.legend(
      handles=handles,
      loc="upper center",
      bbox_to_anchor=(0.5, -0.07),
      ncol=min(4, max(1, len(handles))),
      fontsize=8,
      frameon=False,
    )
  if bx is not None:
    rows = [k for k in report.kernels if k.flops_per_sample or k.weight_bytes]
    labels = [k.name + (f" x{k.count}" if k.count > 1 else "") for k in rows]
    step = report.step_time_s or 1.0
    comp = [
      report.batch_size / k.compute_samples_per_sec / step if k.compute_samples_per_sec else 0.0 for k in rows
    ]
    io = [
      report.batch_size / k.transmission_samples_per_sec / step
      if k.transmission_samples_per_sec and not math.isinf(k.transmission_samples_per_sec)
      else 0.0
      for k in rows
    ]
    y = list(range(len(rows)))
    bx.barh([v - 0.2 for v in y], comp, height=0.4, color="#4c78a8", label="compute")
    bx.barh([v + 0.2 for v in y], io, height=0.4, color="#f58518", label="weight I/O")
    bx.set_yticks(y, labels, fontsize=8)
    bx.invert_yaxis()
    bx.set_xlabel("fraction of the step")
    bx.legend(fontsize=8, loc="lower right")
    bx.set_title("time per kernel (overlapped: the longer bar counts)", fontsize=9)
  state = "" if report.fits else " - DOES NOT FIT"
  mode = "layer pipelined" if report.mode == "pipeline" else "weight streaming"
  rates = (  # a model that does not fit has no rate: what would make it fit instead
    f"{report.samples_per_sec:,.1f} samples/s, active PEs {100 * report.active_pes_fraction:.0f}%, "
    f"compute utilization {100 * report.compute_utilization:.0f}%, "
    f"{100 * report.flops_utilization:.1f}% of peak FLOP/s"
    if report.fits
    else f"would fit: {report.remedy}"[:150]
  )
  fig.suptitle(
    f"{report.name} on {report.num_csx} x {report.system_name} ({report.chip}), {mode}{state}\n{rates}",
    fontsize=10,
  )
  fig.tight_layout()
  if not os.path.splitext(path)[1]:  # matplotlib would add it (savefig.format) and not say so
    path += ".png"
  fig.savefig(path, dpi=110)
  return path


def _short(label: str, width: float, fabric_width: float) -> str:
  """``"layers/attn[3]"`` -> ``"attn 3"``, cut to what fits in the rectangle's width."""
  base, _, index = label.partition("[")
  text = base.rsplit("/", 1)[-1] + (" " + index.rstrip("]") if index else "")
  room = max(3, int(70 * width / fabric_width))
  return text if len(text) <= room else text[: room - 1] + "…"
