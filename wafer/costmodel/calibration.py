"""The cost model's calibration parameters: the few numbers no one publishes, in one place.

Each parameter has a physical meaning, a unit and the reason for its value. They are the same for
every workload: there are no per-model constants. `benchmarks/costmodel_accuracy.py` evaluates a
grid of the fitted ones against the published measurements whose role is ``"fit"``
(`wafer.costmodel.workloads.Measurement`; ``docs/references.md``, "Published measurements"), picks
the point with the least sum of squared log errors (the values below), and reports in-sample,
leave-one-out and leave-one-family-out errors (every constant refitted without a whole model family).
Each constant's mechanism and the evidence that pins it: ``docs/cost-model-accuracy.md``, "Constants".

`ACCURACY` holds that benchmark's leave-one-family-out summary and the uncertainty band calibrated on
it (`calibrate_band`); reports quote the band with the coverage it claims.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from precision._table import Table

__all__ = (
  "ACCURACY",
  "BAND_MAX_WIDTH",
  "CALIBRATION",
  "Accuracy",
  "Calibration",
  "calibrate_band",
  "coverage_of",
  "cross_validated_coverage",
  "place_band",
)


_CLOCKS = {"wse1": "clock_hz", "wse2": "clock_hz", "wse3": "wse3_clock_hz"}
"""Each chip's clock parameter, by the key of its system in `wafer.costmodel.hardware.SYSTEMS`."""


@dataclasses.dataclass(frozen=True)
class Calibration:
  """Named calibration parameters (frozen; change one with `replace`).

  Attributes:
    clock_hz: PE clock in Hz of the WSE-2 (and the WSE-1). Published figures conflict: the SDK
      benchmark scripts convert cycles at 850 MHz, WaferLLM and HC34 say "up to 1.1 GHz".
      Calibrated (grid 0.85 / 0.95 / 1.1 GHz) on the CS-2 runs: 1.1 GHz. The published 2.x runs of
      6-20B-parameter models need it: GPT-3 20B at 7.7 samples/s of 2,048 tokens (HPEC 2024) is
      2.0 PFLOP/s of model FLOPs, 2.7 with each layer recomputed, more than the 2.5 PFLOP/s that
      745,500 PEs at 0.85 GHz can do when a 16-bit AXPY into FP32 accumulators is bound by the
      8-byte write port (`wafer.costmodel.mesh`). (WaferLLM's tokens/s were converted from cycles
      at 1.1 GHz too.) ``replace(clock_hz=...)`` sets the WSE-2's and the WSE-1's, not the WSE-3's.
    wse3_clock_hz: PE clock in Hz of the WSE-3, which no one publishes either (Cerebras gives its
      peak, "2x the WSE-2 at the same power"). Calibrated on the CS-3 runs, with the same grid:
      0.85 GHz (the WSE-2's when no CS-3 run is fitted), the grid's lower end, as the WSE-2's is at
      its upper end. The two clocks are separate unknowns because one clock served neither chip:
      the CS-3 runs held it at 0.85 GHz while the large CS-2 runs need more (`clock_hz`), and with
      one clock the model put the CS-3 / CS-2 gains of ESM-2 35M and DiT-2B (measured 1.69x and
      2.14x, each CS-3 run on a newer release) 11-19 % too high. A consequence: a step bound by latency rather than by the datapath
      (a toy model) comes out up to 1.3x slower on a CS-3. `clock` picks a chip's.
    instruction_overhead_cycles: fixed cycles a PE spends per tensor (DSD) instruction, on top of
      the vector work: loading the descriptor registers, the loop step, task dispatch. It sets the
      efficiency of short vectors: an AXPY of length L costs ``ceil(L / lanes) + this``.
      Calibrated (grid 4 / 6 / 8): 4 cycles, the grid's lower end (6 before the per-layer latency
      below took the fixed costs of small models). Pinned by small models against large ones
      (short tiles per PE: GPT-2 small, ESM-2 35M, BERT-large against the 6-7B models).
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
      (`wafer.costmodel.mesh.attention_cycles`). Fitted (grid 0.71-1.0 in steps of 2**0.25; 0.71-1.41 before round 26):
      2**-0.5 = 0.71, the grid's lower end (with attention fused, its recomputed core is charged
      in every backward: `wafer.costmodel.streaming`; a grid extended to 0.59 keeps 0.71 in sample,
      but the leave-one-family-out refits then pick 0.59 without ESM-2 and its error grows to
      x1.42, so the constant is weakly pinned). The one term whose form comes from the published runs rather than from a
      hardware figure; pinned by the long-sequence runs (GPT-2 small at 2048 tokens, ESM-2 35M at
      1026), which BERT-large's 128 tokens do not move.
    optimizer_bytes_per_param: the iteration-boundary bubble of weight streaming per parameter,
      in bytes at the system's I/O rate: MemoryX runs AdamW over every parameter once all gradients
      are in (global-norm clipping, the modelzoo default, needs every gradient first). AdamW on FP32
      master weights moves about 32 B per parameter (weight, two moments and the gradient read,
      16 B; weight and moments written, 12 B; rounded up), but the pass is sharded over MemoryX's
      weight servers, each with its own memory: a LLaMA-2 7B run's log waits for "all Weight pods
      to be running, current running: 17/18" (ALCF ai-science-training-series llama2-7b.md), so
      the pass takes about 32 / 18, i.e. 2 B per parameter at the system's I/O rate, not 32. Set, not
      fitted. Physical consequence, checked by the benchmark: a 7B model's weight-streaming rate
      rises by tens of percent, not 2x, from a batch of 32 to 2048 (the published sweeps are nearly
      flat); at 32 B per parameter the bubble (1.5 s for 7B parameters on a CS-2) made them 2x.
    step_overhead_s: fixed runtime cost per weight-streaming training step, whatever the model's
      size: the round trip through MemoryX and the host at the iteration boundary (the gradient
      norm, the wait for the updated first layer, the runtime's synchronisation). Layer-pipelined
      mode keeps and updates the weights on the wafer and does not pay it. Fitted (grid 0-200 ms):
      50 ms (100 ms before `layer_latency_s` took the part that grows with the layers). Pinned by
      the BERT-large batch sweep at one system (C2, E14, C3: 340 M parameters, 2.3x faster per
      sample at batch 2048 than at 512), where the per-parameter bubble above is only 5 ms.
    layer_latency_s: fixed latency of one layer's pass over a micro-batch in weight streaming,
      paid per layer (each repetition of a block, and each other segment with weights: the
      embedding, the head), per pass (forward, backward, and a span's rebuild), per micro-batch:
      the wafer runs one layer at a time, and each layer waits for its weights' first rows to
      stream in from MemoryX, its kernel to be dispatched over the rectangle and its results to
      drain before the next layer starts. Layer-pipelined mode keeps every layer resident and does
      not pay it. Fitted (grid 0 / 1 / 2 / 3 ms): 1 ms. The form was chosen on HPEC 2024's sweeps
      (one CS-2, one paper): at batch 128 BERT-base's step takes 56 ms and BERT-large's 123 ms,
      about the ratio of their layers (12, 24), not one cost per step nor one per parameter
      (3.5x); and GPT-3 256M-20B at 2,048 tokens run at one rate from batch 128 to 1024, with no
      visible cost per step, because their micro-batches each pay it again. Its evidence, as
      predicted before being read: `docs/cost-model-accuracy.md`, "Fifth blind set".
    max_micro_batch_tokens: the most tokens (samples x sequence length) per micro-batch the
      compiler's own micro-batch search takes in weight streaming, a what-if (a step with no
      sequence axis is not capped; a micro-batch the user or a params file gives is run as given,
      and where it does not fit, the largest that does is looked for without the cap).
      Default 0: no cap, the search takes the fastest micro-batch whose activations fit. Tried at
      2**18 = 262,144 and not adopted (round 27): every micro-batch Cerebras publishes for its own
      models is below it (modelzoo GPT-3 XL / 2.7B / 6.7B / 13B at 2,048 tokens: 88, 88, 104, 90; a
      LLaMA 7B log's "per-box batch size 99" at 2,048), and HPEC 2024's sweeps stop amortizing the
      per-micro-batch costs at about it (BERT-large at 128 tokens: 1.33x from batch 1024 to 2048,
      1.5 % from 2048 to 4096; GPT-3 256M at 2,048 tokens flat from batch 128 to 1024), but refitted
      it moved the leave-one-family-out median from x1.089 to x1.093 (worst unchanged) and the
      batch-sweep pairs within 10 % stayed 10 of 16 (`docs/cost-model-accuracy.md`, "Known limits").
  """

  clock_hz: float = 1.1e9
  wse3_clock_hz: float = 0.85e9
  instruction_overhead_cycles: float = 4.0
  sram_reserved_bytes_per_pe: int = 12 * 1024
  transcendental_ops: float = 8.0
  gradient_bytes: int = 4
  swarmx_level_latency_s: float = 20e-6
  max_lanes: int = 4096
  attention_row_cycles: float = 2**-0.5
  optimizer_bytes_per_param: float = 2.0
  step_overhead_s: float = 0.05
  layer_latency_s: float = 0.001
  max_micro_batch_tokens: int = 0

  def __post_init__(self) -> None:
    clocks = set(_CLOCKS.values())
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      number = isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
      if field.name in clocks:
        if not number or not 0 < value < math.inf:
          raise ValueError(f"Calibration.{field.name}={value!r}; allowed: a positive, finite frequency in Hz")
      elif not number or not 0 <= value < math.inf:
        raise ValueError(f"Calibration.{field.name}={value!r}; allowed: a finite number >= 0")
      if field.type in ("int", int):  # a count (lanes, bytes, tokens): a whole number
        if value != int(value):
          raise ValueError(f"Calibration.{field.name}={value!r}; allowed: a whole number >= 0")
        object.__setattr__(self, field.name, int(value))
      elif type(value) not in (int, float):  # a NumPy scalar, a Fraction...: a Python number
        object.__setattr__(self, field.name, value.item() if isinstance(value, np.generic) else float(value))

  @staticmethod
  def clock_field(chip: Any) -> str:
    """The name of the clock parameter of ``chip``: ``"wse3_clock_hz"`` for the WSE-3,
    ``"clock_hz"`` for the WSE-2 and the WSE-1.

    ``chip``: a chip or system name (``"WSE-3"``, ``"wse3"``, ``"CS-3"``), a `Chip` or a `System`.

    Raises:
      ValueError: anything else (the message lists the names allowed).

    >>> Calibration.clock_field("wse3"), Calibration.clock_field("CS-2")
    ('wse3_clock_hz', 'clock_hz')
    """
    from wafer.costmodel.hardware import get_system

    system_chip = getattr(chip, "chip", None)  # a System
    name = getattr(system_chip if system_chip is not None else chip, "name", chip)
    try:  # the names `--system` takes, resolved where they are defined
      key = get_system(name).key if isinstance(name, str) else None
    except ValueError:
      key = None
    field = _CLOCKS.get(key)
    if field is None:
      raise ValueError(
        f"no clock for chip {chip!r}; allowed: WSE-1, WSE-2, WSE-3 (or wse1/wse2/wse3, CS-1/CS-2/CS-3, "
        "a Chip or a System)"
      )
    return field

  def clock(self, chip: Any) -> float:
    """The PE clock of ``chip`` in Hz (``chip`` as in `clock_field`).

    >>> CALIBRATION.clock("WSE-2") == CALIBRATION.clock_hz, CALIBRATION.clock("wse3") == CALIBRATION.wse3_clock_hz
    (True, True)
    """
    return float(getattr(self, self.clock_field(chip)))

  def replace(self, **changes: Any) -> Calibration:
    """A copy with some parameters changed, e.g. ``CALIBRATION.replace(wse3_clock_hz=1.1e9)``.

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
        "WSE-2 (and WSE-1) PE clock (SDK scripts: 850 MHz; WaferLLM, HC34: up to 1.1 GHz)",
      ],
      ["wse3_clock_hz", f"{self.wse3_clock_hz / 1e9:g} GHz", "calibrated", "WSE-3 PE clock (not published)"],
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
        "max_micro_batch_tokens",
        f"{self.max_micro_batch_tokens:,}" if self.max_micro_batch_tokens else "none",
        "set",
        "most tokens per micro-batch the compiler's micro-batch search takes",
      ],
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
        "MemoryX optimizer pass per parameter, bytes at the system's I/O rate (sharded)",
      ],
      ["step_overhead_s", f"{self.step_overhead_s * 1e3:g} ms", "calibrated", "fixed runtime cost per step"],
      [
        "layer_latency_s",
        f"{self.layer_latency_s * 1e3:g} ms",
        "calibrated",
        "fixed latency per layer pass per micro-batch (weight streaming)",
      ],
      [
        "swarmx_level_latency_s",
        f"{self.swarmx_level_latency_s * 1e6:g} us",
        "set",
        "SwarmX latency per tree level at the iteration boundary",
      ],
    ]
    return Table(["parameter", "value", "kind", "meaning"], rows, title="Cost-model calibration")


CALIBRATION = Calibration()


BAND_MAX_WIDTH = 1.6
"""Widest band a report may quote, as ``high / low``."""

_ROUNDING = 0.0025
"""ln width kept back for rounding the band outwards to 4 significant figures (at most ln 1.001 on
each side, 0.0020 in all), so that the rounded band is still at most its ``max_width``."""


def _round(x: float, up: bool) -> float:
  """``x > 0`` rounded up or down to 4 significant figures."""
  scale = 10.0 ** (3 - math.floor(math.log10(x)))
  return (math.ceil(x * scale) if up else math.floor(x * scale)) / scale


def place_band(log_errors: Sequence[float], max_width: float = BAND_MAX_WIDTH) -> tuple[float, float]:
  """The ``(low, high)`` factor band, ``high / low <= max_width``, that holds the most runs.

  ``log_errors`` are ``ln(measured / predicted)``; a run lies in the band when ``low * predicted
  <= measured <= high * predicted``. The band always holds the prediction itself (``low <= 1 <=
  high``) and uses its whole width. Candidates are the windows that start at a run (or at the
  prediction) with the room the runs they hold leave split evenly on both sides; among those
  holding equally many runs, the one centred nearest the prediction. Rounded outwards to 4
  significant figures, within ``max_width``.

  >>> place_band([-0.5, -0.1, 0.0, 0.05, 0.1, 0.6])
  (0.7915, 1.264)
  """
  if not log_errors:
    raise ValueError("place_band: no errors; allowed: one or more ln(measured / predicted)")
  if not all(math.isfinite(x) for x in log_errors):
    raise ValueError(f"place_band: errors {list(log_errors)!r}; allowed: finite ln(measured / predicted)")
  if not max_width >= 1.01:
    raise ValueError(f"place_band: max_width={max_width!r}; allowed: a factor of 1.01 or more")
  e = sorted(float(x) for x in log_errors)
  w = math.log(max_width) - _ROUNDING
  best: tuple[int, float, float] | None = None  # (runs held, -|centre|, low)
  for start in [*e, 0.0]:  # a window from each run (or from the prediction) upwards
    held = [x for x in e if start <= x <= start + w]
    lo, hi = min([start, 0.0] + held[:1]), max([0.0] + held[-1:])
    if hi - lo > w:
      continue
    lo -= (w - (hi - lo)) / 2  # the room left, split evenly on both sides
    count = sum(lo - 1e-12 <= x <= lo + w + 1e-12 for x in e)
    key = (count, -abs(lo + w / 2), lo)
    if best is None or key[:2] > best[:2]:
      best = key
  assert best is not None  # the window from the prediction always qualifies
  lo = best[2]
  return _round(math.exp(lo), up=False), _round(math.exp(lo + w), up=True)


def cross_validated_coverage(
  log_errors: Sequence[float], groups: Sequence[str], max_width: float = BAND_MAX_WIDTH
) -> float:
  """The fraction of runs inside the band `place_band` places without their group's errors.

  ``groups[i]`` is run ``i``'s model family: a band placed on the other families' errors is scored
  on each family's runs, the claim checked on errors the band did not see. (The errors themselves
  are each family's errors with that family left out of the fit; the other families' errors come
  from fits that included the family scored, so only the band's placement is fully held out.)

  >>> cross_validated_coverage([-0.3, -0.1, 0.0, 0.1, 0.2], ["a", "a", "b", "c", "c"])
  0.4
  """
  if len(log_errors) != len(groups):
    raise ValueError(
      f"cross_validated_coverage: {len(log_errors)} errors but {len(groups)} groups; allowed: one group per error"
    )
  if len(set(groups)) < 2:
    raise ValueError(
      f"cross_validated_coverage: errors of {len(set(groups))} model family; allowed: two or more (each "
      "family is scored against a band placed on the others)"
    )
  inside = 0
  for g in set(groups):
    rest = [x for x, h in zip(log_errors, groups) if h != g]
    own = [x for x, h in zip(log_errors, groups) if h == g]
    inside += round(coverage_of(place_band(rest, max_width), own) * len(own))
  return inside / len(log_errors)


def calibrate_band(
  log_errors: Sequence[float], groups: Sequence[str], max_width: float = BAND_MAX_WIDTH
) -> tuple[float, tuple[float, float]]:
  """``(coverage, band)``: the band `place_band` places on ``log_errors`` and the coverage it
  claims, which is its `cross_validated_coverage` (each family scored against a band placed
  without it): the share of a new model family's runs it can be expected to hold, not the share
  of the runs it was placed on (which is higher: errors of one family move together).

  >>> calibrate_band([-0.3, -0.1, 0.0, 0.1, 0.2], ["a", "a", "b", "c", "c"])
  (0.4, (0.8321, 1.329))
  """
  return cross_validated_coverage(log_errors, groups, max_width), place_band(log_errors, max_width)


def coverage_of(band: tuple[float, float], log_errors: Sequence[float]) -> float:
  """Fraction of runs with ``ln(measured / predicted)`` in ``log_errors`` that fall in ``band``."""
  lo, hi = math.log(band[0]) - 1e-9, math.log(band[1]) + 1e-9
  return sum(lo <= e <= hi for e in log_errors) / len(log_errors)


@dataclasses.dataclass(frozen=True)
class Accuracy:
  """Accuracy of the calibrated model on published runs it was not fitted to, from
  ``python benchmarks/costmodel_accuracy.py`` (``benchmarks/results/costmodel_accuracy.json``).

  Attributes:
    points: published measurements scored (fitted, structure-only and held-out ones).
    median, worst: median and worst |ln(predicted / measured)| when each run's whole model family
      is left out of the fit (leave-one-family-out: every constant refitted without it).
    band: ``(low, high)``: a measured run is expected within ``low x .. high x`` the prediction
      for a fraction ``coverage`` of runs; placed on the leave-one-family-out errors by
      `place_band` (`BAND_MAX_WIDTH` wide).
    coverage: the fraction of runs the band claims: its `cross_validated_coverage`, each family's
      runs against the band placed without that family's errors (`calibrate_band`).
    placed_coverage: the fraction of the runs it was placed on that fall in it (higher than the
      claim: a band placed on a family's errors fits them).
    held_out: how many of the ``points`` were neither fitted nor used to choose structure, collected
      blind and used for no choice since (``held_out_median``, ``held_out_worst``: their errors under the shipped
      calibration, which never saw them; 0 when there is none): the cleanest test of the model on
      runs it has not seen.
    command: the command that produced the numbers.
  """

  points: int
  median: float
  worst: float
  band: tuple[float, float]
  coverage: float
  placed_coverage: float
  held_out: int = 0
  held_out_median: float = 0.0
  held_out_worst: float = 0.0
  command: str = "python benchmarks/costmodel_accuracy.py"

  @property
  def runs(self) -> int:
    """Published runs behind ``band``."""
    return self.points

  def describe(self) -> str:
    """One line for a report: the band, what it claims and what it rests on."""
    return (
      f"x{self.band[0]:.2f}-x{self.band[1]:.2f}: holds {100 * self.coverage:.0f} % of {self.runs} published runs "
      f"when their model family is left out of the fit and of the band ({100 * self.placed_coverage:.0f} % "
      f"of the runs it was placed on); median |ln ratio| {self.median:.2f}, worst {self.worst:.2f}"
      + (
        f"; on the {self.held_out} runs never fitted nor looked at: median {self.held_out_median:.2f}, "
        f"worst {self.held_out_worst:.2f}"
        if self.held_out
        else ""
      )
    )


ACCURACY = Accuracy(
  points=73,
  median=0.085,
  worst=0.857,
  band=(0.819, 1.308),
  coverage=54 / 73,
  placed_coverage=60 / 73,
  held_out=7,
  held_out_median=0.082,
  held_out_worst=0.857,
)
