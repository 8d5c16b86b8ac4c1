"""The estimate's result: `Report`, its kernel rows, and its text / JSON / files.

``Report.to_text()`` follows the layout of Cerebras' ``compile_report.txt`` (an "Estimated Overall
Performance" block, then one row per kernel with Samples/s, Compute Samples/s, Transmission
Samples/s, Active PEs and Compute Utilization), followed by what the estimate assumed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

from precision._table import Table
from wafer._io import make_writable_dir, replace_atomically, write_text_atomically
from wafer.costmodel.calibration import Accuracy, Calibration
from wafer.costmodel.placement import Rect
from wafer.errors import EstimateError

__all__ = ("FOLD_SHARE", "KernelRow", "Report")

FOLD_SHARE = 0.01
"""Kernels under this share of the step (weight streaming) or of the PEs (pipeline), or with a rate
over ``1 / FOLD_SHARE`` times the model's, are folded into one "other" row of the report's table
(`Report.folded_kernels`, `Report.table_rows`)."""


@dataclasses.dataclass(frozen=True)
class KernelRow:
  """One kernel (all its instances) in the report.

  Attributes:
    name: kernel name (scope path or op pattern).
    count: instances (e.g. layers of a ``scan``).
    samples_per_sec: the rate this kernel alone would allow (pipeline: its slowest instance;
      weight streaming: the batch over the kernel's share of the step); None where nothing limits it.
    compute_samples_per_sec, transmission_samples_per_sec: the same for compute alone and for data
      movement alone (fabric transfers, or weight streaming I/O); None where the kernel has none.
    active_pes: PEs of all its instances (weight streaming: the rectangle, time-shared).
    compute_utilization: the fraction of its time it computes.
    flops_per_sample: matrix-product FLOP per sample, all instances, forward + backward.
    weight_bytes: parameter bytes of all instances (in the compute format).
    time_share: its fraction of the step (weight streaming) or of the PEs (pipeline); the rows'
      shares add up to 1 (weight streaming has rows for the layers' latencies and the step boundary).
  """

  name: str
  count: int
  samples_per_sec: float | None
  compute_samples_per_sec: float | None
  transmission_samples_per_sec: float | None
  active_pes: int
  compute_utilization: float
  flops_per_sample: float
  weight_bytes: float
  time_share: float

  def to_dict(self) -> dict[str, Any]:
    return {k: _jsonable(v) for k, v in dataclasses.asdict(self).items()}


@dataclasses.dataclass(frozen=True)
class Report:
  """A performance estimate of one step on a Cerebras system.

  Attributes:
    name: what was estimated (a workload name or the function's name).
    system, system_name, chip: ``"wse2"``, ``"CS-2"``, ``"WSE-2"``.
    release: the Cerebras software release costed (``"2.x"``, ``"1.8"``...), which decides the mode.
    mode: ``"pipeline"`` or ``"weight_streaming"``; ``mode_reason`` says how it was chosen.
    fits: False when the model does not fit in ``mode``: then it has no rate (the rate fields,
      ``step_time_s``, ``model_flops_per_sec`` and ``flops_utilization`` are None), ``reason`` says why and ``remedy`` what would make it fit; ``details`` has
      the memory it needs and has, the factor over and the assumption that decides it.
    batch_size: samples per step (all systems); ``num_csx``: systems in data parallel.
    micro_batch_size: samples per micro-batch (weight streaming) or per pipeline wave; 0 where none
      fits (None in `to_dict`).
    samples_per_sec: the estimate: ``min`` of compute and transmission in a pipeline, the
      overlapped step in weight streaming (None: the model does not fit).
    compute_samples_per_sec: the rate if data movement were free (None: no compute, or no fit).
    transmission_samples_per_sec: the rate if compute were free (fabric transfers, I/O; None: none).
    active_pes: PEs doing work; ``total_pes``: PEs of the chip's fabric (per system).
    compute_utilization: the fraction of time the active PEs compute.
    flops_per_sample: matrix-product FLOP per sample (forward + backward; forward only for an
      inference step), the model FLOPs.
    peak_flops_per_sec: dense peak of all systems in the compute format at the calibrated clock.
    step_time_s: seconds per step (None when it does not fit).
    kernels: one row per kernel.
    placement: kernel rectangles (pipeline), or the one rectangle all layers share (weight streaming).
    grid: ``(width, height)`` of the usable rectangle; ``fabric``: of the whole fabric; ``offset``:
      where the usable rectangle starts in the fabric.
    alternatives: ``mode -> samples/s`` (or the reason it does not fit) for the other mode.
    compute_format, accumulate_format: format names; ``clock_hz``: the clock used.
    calibration: the parameters used.
    details: mode-specific numbers (micro-batches, I/O seconds, memory...), and ``sequence_length``
      (axis 1 of the batch's token ids, for tokens/s), ``sequence_source`` (where that length comes
      from: a params file's key, or the batch array) and ``training`` (False: forward only). With a
      searched micro-batch, ``micro_batch_range``: the feasible sizes and the rates they give, and
      ``token_cap`` where the search's cap in tokens (`Calibration.max_micro_batch_tokens`) left
      larger sizes out.
    notes: approximations the estimate made.
    batch_arguments: the step's arguments taken as the batch (axis 0 = samples).
    accuracy: the cost model's accuracy on runs it was not fitted to, for ``expected_range``.
    remedy: when it does not fit, what would make it fit (empty otherwise).
  """

  name: str
  system: str
  system_name: str
  chip: str
  release: str
  mode: str
  mode_reason: str
  fits: bool
  reason: str
  batch_size: int
  num_csx: int
  micro_batch_size: int
  samples_per_sec: float | None
  compute_samples_per_sec: float | None
  transmission_samples_per_sec: float | None
  active_pes: int
  total_pes: int
  compute_utilization: float
  flops_per_sample: float
  peak_flops_per_sec: float
  step_time_s: float | None
  kernels: tuple[KernelRow, ...]
  placement: tuple[Rect, ...]
  grid: tuple[int, int]
  fabric: tuple[int, int]
  offset: tuple[int, int]
  alternatives: dict[str, Any]
  compute_format: str
  accumulate_format: str
  clock_hz: float
  calibration: Calibration
  details: dict[str, Any]
  notes: tuple[str, ...]
  batch_arguments: tuple[str, ...] = ()
  accuracy: Accuracy | None = None
  remedy: str = ""

  @property
  def expected_range(self) -> tuple[float, float] | None:
    """``(low, high)`` samples/s a measured run is expected in: the estimate times the band of the
    cost model's errors on published runs whose model family it was not fitted to, for the
    fraction of runs `wafer.costmodel.ACCURACY` claims (``ACCURACY.coverage``)."""
    if self.accuracy is None or not self.samples_per_sec:
      return None
    lo, hi = self.accuracy.band
    return self.samples_per_sec * lo, self.samples_per_sec * hi

  @property
  def active_pes_fraction(self) -> float:
    return self.active_pes / self.total_pes if self.total_pes else 0.0

  @property
  def model_flops_per_sec(self) -> float | None:
    """Matrix-product FLOP per second achieved (all systems); None when the model does not fit."""
    return None if self.samples_per_sec is None else self.samples_per_sec * self.flops_per_sample

  @property
  def flops_utilization(self) -> float | None:
    """Achieved model FLOP/s over the dense peak (model FLOPs utilization); None when it does not fit."""
    flops = self.model_flops_per_sec
    if flops is None:
      return None
    return flops / self.peak_flops_per_sec if self.peak_flops_per_sec else 0.0

  @property
  def tokens_per_sec(self) -> float | None:
    seq = self.details.get("sequence_length")
    return self.samples_per_sec * seq if seq and self.fits else None

  # -- outputs ----------------------------------------------------------------------------------
  def table_rows(self) -> list[KernelRow]:
    """The rows the kernel table shows: `kernels`, with those under `FOLD_SHARE` of the step (weight
    streaming) or of the PEs (pipeline) folded into one "other" row (its rates ``None``: it limits
    nothing), so that trivial kernels do not show rates far above the model's."""
    small = self.folded_kernels()
    if not small:
      return list(self.kernels)
    other = KernelRow(
      f"other: {len(small)} small kernel{'s' if len(small) > 1 else ''}",
      sum(k.count for k in small),
      None,
      None,
      None,
      sum(k.active_pes for k in small) if self.mode == "pipeline" else max(k.active_pes for k in small),
      sum(k.compute_utilization * k.time_share for k in small) / (sum(k.time_share for k in small) or 1.0),
      sum(k.flops_per_sample for k in small),
      sum(k.weight_bytes for k in small),
      sum(k.time_share for k in small),
    )
    return [k for k in self.kernels if k not in small] + [other]

  def folded_kernels(self) -> list[KernelRow]:
    """The kernels the table folds into its "other" row: under `FOLD_SHARE` of the step (weight
    streaming) or of the PEs (pipeline), or with a rate over ``1 / FOLD_SHARE`` times the model's
    (it limits nothing: a pipeline's embedding lookup at millions of samples/s)."""
    limit = self.samples_per_sec / FOLD_SHARE if self.fits and self.samples_per_sec else math.inf
    return [
      k
      for k in self.kernels
      if k.time_share < FOLD_SHARE or (k.samples_per_sec is not None and k.samples_per_sec > limit)
    ]

  def kernel_table(self) -> Table:
    """The per-kernel rows as a `Table` (Cerebras' columns plus the instance count and share; small
    kernels folded: `table_rows`)."""
    share = "Step Share" if self.mode == "weight_streaming" else "PE Share"
    rows = [
      [
        k.name + (f" (x{k.count})" if k.count > 1 and not k.name.startswith("other:") else ""),
        _rate(k.samples_per_sec),
        _rate(k.compute_samples_per_sec),
        _rate(k.transmission_samples_per_sec),
        f"{k.active_pes:,}",
        f"{100 * k.compute_utilization:.0f}%",
        f"{100 * k.time_share:.1f}%",
      ]
      for k in self.table_rows()
    ]
    return Table(
      [
        "Kernel Name",
        "Samples/s",
        "Compute Samples/s",
        "Transmission Samples/s",
        "Active PEs",
        "Compute Utilization",
        share,
      ],
      rows,
    )

  def to_text(self) -> str:
    """The report in the style of Cerebras' ``compile_report.txt``. A model that does not fit has no
    rate lines: the report says why and what would make it fit."""
    lines = ["Estimated Overall Performance"]
    d = self.details
    if self.fits:
      lines += [
        f" {label + ':':<30}{value}"
        for label, value in (
          ("Samples/s", _rate(self.samples_per_sec)),
          ("Compute Samples/s", _rate(self.compute_samples_per_sec)),
          ("Transmission Samples/s", _rate(self.transmission_samples_per_sec)),
          ("Active PEs", f"{100 * self.active_pes_fraction:.0f}%"),
          ("Compute Utilization", f"{100 * self.compute_utilization:.0f}%"),
        )
      ]
    band = self.expected_range
    if band is not None and self.accuracy is not None:
      a = self.accuracy
      lines.append(f" {'Expected range:':<30}{_rate(band[0])} - {_rate(band[1])} samples/s ({a.describe()})")
    if not self.fits:
      over = d.get("over_factor")
      by = f" (x{over:.2f} over)" if over else ""
      lines.append(f" Does not fit in {_mode_name(self.mode)} mode{by}: {self.reason}")
      if d.get("deciding_assumption"):
        lines.append(f" {'Deciding assumption:':<30}{d['deciding_assumption']}")
      if self.remedy:
        lines.append(f" {'Would fit:':<30}{self.remedy}")
    if self.kernels:
      lines += ["", str(self.kernel_table())]
      small = [k.name for k in self.folded_kernels()]
      if small:
        what = "of the step" if self.mode == "weight_streaming" else "of the PEs"
        lines.append(
          f" other: under {100 * FOLD_SHARE:g}% {what} or over {1 / FOLD_SHARE:g}x the model's rate each "
          f"(they limit nothing), no rate shown: {', '.join(small)}"
        )
    lines += ["", "Estimate details"]
    usable = f"{self.grid[0]} x {self.grid[1]}"
    lines.append(f" {'Model:':<16}{self.name}")
    lines.append(
      f" {'System:':<16}{self.num_csx} x {self.system_name} ({self.chip}, {usable} PEs used, "
      f"{self.clock_hz / 1e9:g} GHz clock)"
    )
    lines.append(f" {'Release:':<16}{self.release} (Cerebras software; it decides the mode)")
    lines.append(f" {'Mode:':<16}{_mode_name(self.mode)} ({self.mode_reason})")
    if self.mode == "weight_streaming":
      given = " as given" if d.get("micro_batch_given") or d.get("requested_micro_batch") else ""
      mb = f"micro-batch {self.micro_batch_size}{given}" if self.micro_batch_size else "no micro-batch fits"
      asked = d.get("micro_batch_requested")
      if given and asked and self.micro_batch_size and asked != self.micro_batch_size:
        costed = "run" if self.fits else "costed"
        mb = f"micro-batch {asked} requested, {self.micro_batch_size} {costed}: the nearest supported size"
      per = f" ({d['micro_batches']} per step)" if "micro_batches" in d else ""
      batch_line = f"{self.batch_size} per step ({self.batch_size // self.num_csx} per system); {mb}{per}"
    else:
      batch_line = f"{self.batch_size} per step; pipeline waves of {self.micro_batch_size}"
    lines.append(f" {'Batch:':<16}{batch_line}")
    span = d.get("micro_batch_range")
    if span:
      (lo_mb, hi_mb), (lo, hi) = span["sizes"], span["samples_per_sec"]
      cap, seq = span.get("token_cap"), d.get("sequence_length") or 0
      capped = f"; the compiler's search takes at most {cap:,} tokens per micro-batch" if cap else ""
      if cap and seq > cap:
        capped += f" (one sample, {seq:,} tokens, is over it: one sample per micro-batch)"
      if span["count"] == 1:
        lines.append(f" {'Micro-batch:':<16}searched: {self.micro_batch_size}, the one feasible size{capped}")
      else:
        lines.append(
          f" {'Micro-batch:':<16}searched: {self.micro_batch_size} is the fastest of {span['count']} feasible "
          f"sizes ({lo_mb}-{hi_mb}), which give {_rate(lo)}-{_rate(hi)} samples/s{capped}"
        )
    if self.batch_arguments:
      lines.append(f" {'Batch args:':<16}{', '.join(self.batch_arguments)}")
    if d.get("sequence_length"):
      source = f" ({d['sequence_source']})" if d.get("sequence_source") else ""
      lines.append(f" {'Sequence:':<16}{d['sequence_length']:,} tokens per sample{source}")
    lines.append(f" {'Formats:':<16}{self.compute_format} operands, {self.accumulate_format} accumulation")
    passes = "forward + backward" if d.get("training", True) else "forward only"
    lines.append(
      f" {'Work:':<16}{self.flops_per_sample / 1e12:.4g} TFLOP per sample (matrix products, {passes})"
    )
    if self.fits:
      lines.append(
        f" {'Model FLOP/s:':<16}{self.model_flops_per_sec / 1e15:.3g} PFLOP/s = "
        f"{100 * self.flops_utilization:.1f}% of the {self.peak_flops_per_sec / 1e15:.3g} PFLOP/s dense peak"
      )
    if self.tokens_per_sec:
      lines.append(f" {'Tokens/s:':<16}{self.tokens_per_sec:,.0f}")
    if self.fits and self.step_time_s is not None:
      if self.mode == "weight_streaming":
        lines.append(
          f" {'Step:':<16}{self.step_time_s:.4g} s (compute {d['compute_s']:.4g} s, weight and data "
          f"I/O {d['io_s']:.4g} s, overlapped; layer latencies {d.get('layer_latencies_s', 0.0):.3g} s; "
          f"boundary {d['boundary_s'] * 1e3:.3g} ms)"
        )
        lines.append(
          f" {'Resident:':<16}{d['resident_bytes'] / 1e9:.3g} GB of activations between forward and backward"
        )
      else:
        lines.append(
          f" {'Step:':<16}{self.step_time_s:.4g} s; {len(self.placement)} rectangles hold "
          f"{d['memory_bytes'] / 1e9:.3g} GB"
        )
    for mode, alt in self.alternatives.items():
      text = _rate(alt) + " samples/s" if isinstance(alt, (int, float)) else f"does not fit: {alt}"
      lines.append(f" {'Other mode:':<16}{_mode_name(mode)}: {text}")
    for note in self.notes:
      lines.append(f" {'Note:':<16}{note}")
    return "\n".join(lines) + "\n"

  def __str__(self) -> str:
    return self.to_text()

  def _repr_html_(self) -> str:
    head = "".join(f"<li>{line.strip()}</li>" for line in self.to_text().split("\n\n")[0].splitlines()[1:])
    return f"<b>Estimated Overall Performance</b><ul>{head}</ul>" + self.kernel_table()._repr_html_()

  def to_dict(self) -> dict[str, Any]:
    """Every field, JSON-ready (the rectangles as dicts)."""
    out: dict[str, Any] = {}
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if field.name == "kernels":
        value = [k.to_dict() for k in value]
      elif field.name == "placement":
        value = [r.to_dict() for r in value]
      elif field.name == "calibration":
        value = value.to_dict()
      elif field.name == "accuracy" and value is not None:
        value = dataclasses.asdict(value)
      out[field.name] = _jsonable(value)
    out["active_pes_fraction"] = self.active_pes_fraction
    out["model_flops_per_sec"] = self.model_flops_per_sec if self.fits else None
    out["flops_utilization"] = self.flops_utilization if self.fits else None
    out["expected_range"] = _jsonable(self.expected_range)
    if not self.fits:  # no rate: None, not 0 samples/s
      for key in (
        "samples_per_sec",
        "compute_samples_per_sec",
        "transmission_samples_per_sec",
        "step_time_s",
      ):
        out[key] = None
    if not self.micro_batch_size:  # (0: no micro-batch fits)
      out["micro_batch_size"] = None
    out["tokens_per_sec"] = _jsonable(self.tokens_per_sec)
    return out

  def to_json(self, indent: int = 2) -> str:
    """`to_dict` as strict JSON (no ``Infinity`` / ``NaN``: a value that is not a number is ``null``)."""
    return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

  def plot(self, path: str | os.PathLike[str]) -> str:
    """Write a PNG of the placement on the wafer to ``path`` (``.png`` added where it names no
    extension); returns the path written."""
    from wafer.costmodel.placement_plot import plot_report  # matplotlib only when asked for

    return plot_report(self, os.fspath(path))

  def save(self, model_dir: str | os.PathLike[str]) -> dict[str, str]:
    """Write ``compile_report.txt``, ``compile_report.json`` and ``placement.png`` into ``model_dir``.

    Each file is written beside its name and renamed into place, so a failed write (a full disk)
    leaves the previous report whole and no partial file.

    Returns:
      ``{"text": path, "json": path, "png": path}``.

    Raises:
      wafer.errors.EstimateError: ``model_dir`` is a file, cannot be created or is not writable.
    """
    model_dir = os.fspath(model_dir)
    problem = make_writable_dir(model_dir, "model_dir", "the report")
    if problem is not None:  # the message `wafer estimate --model_dir` gives
      raise EstimateError(f"Report.save: {problem}; give a directory wafer can write")
    paths = {
      "text": os.path.join(model_dir, "compile_report.txt"),
      "json": os.path.join(model_dir, "compile_report.json"),
      "png": os.path.join(model_dir, "placement.png"),
    }

    write_text_atomically(paths["text"], self.to_text())
    write_text_atomically(paths["json"], self.to_json() + "\n")
    replace_atomically(paths["png"], self.plot)
    return paths


def _mode_name(mode: str) -> str:
  return {"pipeline": "layer pipelined", "weight_streaming": "weight streaming"}.get(mode, mode)


def _rate(v: float | None) -> str:
  """A rate as the report prints it; ``-`` for none (a row with nothing that limits it)."""
  if v is None or not math.isfinite(v):
    return "-"
  return f"{v:,.1f}" if v >= 100 else f"{v:.4g}"


def _jsonable(v: Any) -> Any:
  if isinstance(v, float):
    return None if math.isinf(v) or math.isnan(v) else v
  if isinstance(v, dict):
    return {str(k): _jsonable(x) for k, x in v.items()}
  if isinstance(v, (list, tuple)):
    return [_jsonable(x) for x in v]
  if dataclasses.is_dataclass(v) and not isinstance(v, type):
    return _jsonable(dataclasses.asdict(v))
  return v
