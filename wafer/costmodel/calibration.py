"""The cost model's calibration parameters: the few numbers no one publishes, in one place.

Each parameter has a physical meaning, a unit and the reason for its value. They are the same for
every workload: there are no per-model constants. `benchmarks/costmodel_accuracy.py` checks the
resulting predictions against the published measurements of ``../shared/reference/wafer.md`` §2.

How the values were chosen: the clock and the instruction overhead were scanned on a grid (clock
0.85, 0.95, 1.0, 1.1 GHz; overhead 6, 8, 10, 12, 16, 20, 24 cycles) against the three CS-2 training
rates and the WaferLLM prefill row, keeping the point with the smallest worst-case |ln(pred/meas)|
(`benchmarks/costmodel_accuracy.py` prints the scan): 0.85 GHz and 12 cycles. The two parameters
act on different rows: the clock scales the training rows (long vectors, where the overhead matters
little), the overhead sets the prefill row (tiles of 6 x 6 values per PE, where it dominates). So
the three training rows test one fitted number; they agree within 7 %. Both values are physically
plausible: 850 MHz is the clock the Cerebras SDK scripts use, and ~12 cycles per tensor instruction
is a handful of descriptor-register loads plus a loop step. The other parameters were set from their
physical reasoning and not tuned.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from precision._table import Table

__all__ = ("CALIBRATION", "Calibration")


@dataclasses.dataclass(frozen=True)
class Calibration:
  """Named calibration parameters (frozen; change one with `replace`).

  Attributes:
    clock_hz: PE clock in Hz, for every WSE. Published figures conflict: the SDK benchmark
      scripts convert cycles at 850 MHz, WaferLLM and HC34 say "up to 1.1 GHz". Calibrated: 0.85 GHz.
      (WaferLLM's tokens/s were converted from cycles at 1.1 GHz; to compare with them, use
      ``replace(clock_hz=1.1e9)``.)
    instruction_overhead_cycles: fixed cycles a PE spends per tensor (DSD) instruction, on top of
      the vector work: loading the descriptor registers, the loop step, task dispatch. It sets the
      efficiency of short vectors: an AXPY of length L costs ``ceil(L / lanes) + this``.
      Calibrated: 12 cycles.
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
  """

  clock_hz: float = 0.85e9
  instruction_overhead_cycles: float = 12.0
  sram_reserved_bytes_per_pe: int = 12 * 1024
  transcendental_ops: float = 8.0
  gradient_bytes: int = 4
  swarmx_level_latency_s: float = 20e-6

  def __post_init__(self) -> None:
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
        raise ValueError(f"Calibration.{field.name}={value!r}; allowed: a number >= 0")
    if self.clock_hz <= 0:
      raise ValueError(f"Calibration.clock_hz={self.clock_hz!r}; allowed: a positive frequency in Hz")

  def replace(self, **changes: Any) -> Calibration:
    """A copy with some parameters changed, e.g. ``CALIBRATION.replace(clock_hz=1.1e9)``."""
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
      [
        "swarmx_level_latency_s",
        f"{self.swarmx_level_latency_s * 1e6:g} us",
        "set",
        "SwarmX latency per tree level at the iteration boundary",
      ],
    ]
    return Table(["parameter", "value", "kind", "meaning"], rows, title="Cost-model calibration")


CALIBRATION = Calibration()
