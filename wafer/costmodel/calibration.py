"""The cost model's calibration parameters: the few numbers no one publishes, in one place.

Each parameter has a physical meaning, a unit and the reason for its value. They are the same for
every workload: there are no per-model constants. `benchmarks/costmodel_accuracy.py` evaluates a
grid of the fitted ones against the published measurements (``docs/references.md``, "Published
measurements"), picks the point with the least sum of squared log errors (the values below), and reports
the leave-one-out errors: each measurement predicted by a refit on all the others.

`ACCURACY` holds that benchmark's leave-one-out summary; the report turns it into an uncertainty band.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from precision._table import Table

__all__ = ("ACCURACY", "CALIBRATION", "Accuracy", "Calibration")


@dataclasses.dataclass(frozen=True)
class Calibration:
  """Named calibration parameters (frozen; change one with `replace`).

  Attributes:
    clock_hz: PE clock in Hz, for every WSE. Published figures conflict: the SDK benchmark
      scripts convert cycles at 850 MHz, WaferLLM and HC34 say "up to 1.1 GHz". Calibrated (grid
      0.85 / 0.95 / 1.1 GHz): 0.95 GHz.
      (WaferLLM's tokens/s were converted from cycles at 1.1 GHz; to compare with them, use
      ``replace(clock_hz=1.1e9)``.)
    instruction_overhead_cycles: fixed cycles a PE spends per tensor (DSD) instruction, on top of
      the vector work: loading the descriptor registers, the loop step, task dispatch. It sets the
      efficiency of short vectors: an AXPY of length L costs ``ceil(L / lanes) + this``.
      Calibrated (grid 4 / 6 / 8 / 12): 8 cycles.
    sram_reserved_bytes_per_pe: SRAM a PE keeps for code, stack, routing tables and runtime
      buffers; the rest holds tensors. Set, not fitted: a quarter of the 48 KB (12 KB), the order
      of a CSL program with a few kernels.
    transcendental_ops: vector operations per element for exp, log, tanh, erf, logistic, sqrt,
      rsqrt, division and powers (the PE has no transcendental unit; a polynomial or Newton
      sequence takes several FMAs). Set, not fitted: 8. Its effect on the calibration set is below 1 %.
    gradient_bytes: bytes per gradient element streamed out of the wafer in weight streaming
      (MemoryX applies the optimizer to FP32 master weights). Set: 4 (FP32).
    swarmx_level_latency_s: latency SwarmX adds per tree level to the broadcast of weights and
      the reduction of gradients at the iteration boundary (the tree depth is ceil(log2(num_csx))).
      Set, not fitted (no public figure): 20 microseconds, an Ethernet switch hop plus RoCE.
    max_lanes: most copies (*lanes*) of a weight-stationary layout the compiler makes, each lane
      taking its share of the tokens (Cerebras logs: "per-box batch size 99 with 9 lanes"). More
      lanes mean bigger weight tiles per PE, hence longer vectors and less instruction overhead.
      Set, not fitted: 4096, i.e. no cap below what helps (the compiler explores data layouts and
      keeps the fastest). In layer-pipelined mode a rectangle also keeps every copy's optimizer
      state, which caps the copies by its SRAM (`wafer.costmodel.pipeline`).
    attention_row_cycles: cycles per query row of one attention instance (sample x head), per
      activation x activation product, at the 4-wide SIMD of a WSE-2 PE (half on the 8-wide WSE-3);
      instances run side by side as far as their score matrices fit at one score per PE
      (`wafer.costmodel.mesh.attention_cycles`). Fitted (grid 0.71-1.41 in steps of 2**0.25): the
      one term whose form comes from the published runs rather than from a hardware figure.
    optimizer_bytes_per_param: bytes MemoryX reads and writes per parameter in its optimizer
      pass (AdamW on FP32 master weights: weight, two moments and the gradient read, 16 B;
      weight and moments written, 12 B; rounded up to 32 for the gradient's arrival). At MemoryX's
      bandwidth, which "matches or exceeds" the system's I/O (the CS-2's 150 GB/s,
      ``docs/references.md``, "Hardware"), the pass takes ``P * 32 / 150e9`` s, a bubble at the
      iteration boundary of weight streaming because global-norm clipping (the modelzoo default)
      needs every gradient first. Set, not fitted.
    step_overhead_s: fixed runtime cost per training step (host synchronisation). Set: 0 (no
      published figure; fitting it to the one pair of runs that shows a per-step cost did not
      predict that pair when left out).
  """

  clock_hz: float = 0.95e9
  instruction_overhead_cycles: float = 8.0
  sram_reserved_bytes_per_pe: int = 12 * 1024
  transcendental_ops: float = 8.0
  gradient_bytes: int = 4
  swarmx_level_latency_s: float = 20e-6
  max_lanes: int = 4096
  attention_row_cycles: float = 1.0
  optimizer_bytes_per_param: float = 32.0
  step_overhead_s: float = 0.0

  def __post_init__(self) -> None:
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
        raise ValueError(f"Calibration.{field.name}={value!r}; allowed: a number >= 0")
    if self.clock_hz <= 0:
      raise ValueError(f"Calibration.clock_hz={self.clock_hz!r}; allowed: a positive frequency in Hz")

  def replace(self, **changes: Any) -> Calibration:
    """A copy with some parameters changed, e.g. ``CALIBRATION.replace(clock_hz=1.1e9)``.

    An unknown name is an error that lists the parameters."""
    names = [field.name for field in dataclasses.fields(self)]
    unknown = sorted(set(changes) - set(names))
    if unknown:
      raise ValueError(
        f"Calibration has no parameter {', '.join(map(repr, unknown))}; allowed: {', '.join(names)}"
      )
    return dataclasses.replace(self, **changes)

  def to_dict(self) -> dict[str, float]:
    return dataclasses.asdict(self)

  def describe(self) -> Table:
    """The parameters, their values and meanings, as a printable table."""
    rows = [
      [
        "clock_hz",
        f"{self.clock_hz / 1e9:g} GHz",
        "calibrated",
        "PE clock (SDK scripts: 850 MHz; WaferLLM: 1.1 GHz)",
      ],
      [
        "instruction_overhead_cycles",
        f"{self.instruction_overhead_cycles:g} cycles",
        "calibrated",
        "fixed cost per tensor instruction (DSD setup, loop step)",
      ],
      [
        "sram_reserved_bytes_per_pe",
        f"{self.sram_reserved_bytes_per_pe} B",
        "set",
        "SRAM per PE kept for code, routes and runtime",
      ],
      [
        "transcendental_ops",
        f"{self.transcendental_ops:g} ops",
        "set",
        "vector ops per exp/log/tanh/rsqrt element",
      ],
      ["gradient_bytes", f"{self.gradient_bytes} B", "set", "bytes per gradient streamed out (FP32)"],
      ["max_lanes", f"{self.max_lanes}", "set", "most copies of a weight-stationary layer layout"],
      [
        "attention_row_cycles",
        f"{self.attention_row_cycles:g} cycles",
        "calibrated",
        "cycles per attention query row per (sample, head) and product, 4-wide SIMD",
      ],
      [
        "optimizer_bytes_per_param",
        f"{self.optimizer_bytes_per_param:g} B",
        "set",
        "MemoryX optimizer bytes per parameter (at the system's I/O rate)",
      ],
      ["step_overhead_s", f"{self.step_overhead_s * 1e3:g} ms", "set", "fixed runtime cost per step"],
      [
        "swarmx_level_latency_s",
        f"{self.swarmx_level_latency_s * 1e6:g} us",
        "set",
        "SwarmX latency per tree level at the iteration boundary",
      ],
    ]
    return Table(["parameter", "value", "kind", "meaning"], rows, title="Cost-model calibration")


CALIBRATION = Calibration()


@dataclasses.dataclass(frozen=True)
class Accuracy:
  """Accuracy of the calibrated model on runs it was not fitted to, from
  ``python benchmarks/costmodel_accuracy.py``.

  Attributes:
    points: published measurements used for calibration.
    median, worst: median and worst |ln(predicted / measured)| of their leave-one-out predictions.
    held_out: published runs never fitted (predicted with the calibration of all ``points``);
      ``held_out_median``, ``held_out_worst`` their median and worst |ln ratio|.
    band: ``(low, high)``: every run not fitted (the left-out predictions and the held-out runs)
      measured within ``low x .. high x`` its prediction.
    command: the command that produced the numbers (and ``benchmarks/results/costmodel_accuracy.json``).
  """

  points: int
  median: float
  worst: float
  band: tuple[float, float]
  held_out: int = 0
  held_out_median: float = 0.0
  held_out_worst: float = 0.0
  command: str = "python benchmarks/costmodel_accuracy.py"

  @property
  def runs(self) -> int:
    """Published runs behind ``band``: the left-out calibration points and the held-out runs."""
    return self.points + self.held_out


ACCURACY = Accuracy(
  points=8,
  median=0.095,
  worst=0.264,
  band=(0.65, 1.51),
  held_out=7,
  held_out_median=0.231,
  held_out_worst=0.433,
)
