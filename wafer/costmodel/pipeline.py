"""Layer-pipelined mode: every kernel instance gets its own rectangle; samples stream through.

For a wave of ``g`` samples (``g`` searched over powers of two up to the batch):

* **Memory.** A kernel's rectangle must hold its weights and their optimizer state and gradient
  (``weights x (state bytes per parameter + 4)``, the state ratio measured from the step's
  non-batch arguments) and its boundary inputs for every wave in flight between its forward and
  its backward pass (``2 x kernels downstream + 1`` waves; the kernel recomputes its internals).
  That fixes a minimum area ``A_min = bytes / SRAM-for-tensors-per-PE``.
* **Copies.** A kernel's rectangle may hold several copies (*lanes*) of its weight-stationary layout,
  each taking a share of the wave's tokens, but every copy keeps the weights with their optimizer
  state and gradient in SRAM: at most ``(A x SRAM - activations) / (weights x (state + 4))`` copies
  (and `Calibration.max_lanes`). Weight streaming has no such limit (one layer at a time, no
  optimizer state on the wafer).
* **Area.** The remaining PEs are shared in proportion to work: ``A_k = max(A_min_k, lambda * W_k)``,
  with ``W_k`` = cycles x PEs of the kernel (refined twice after placement).
* **Placement.** `wafer.costmodel.placement.pack` (shelves, snake order, no overlap).
* **Throughput.** Kernel ``k`` needs ``C_k`` cycles per wave for its forward and backward pass on
  its rectangle; fabric transfers to its neighbour carry ``2 x boundary bytes`` per wave over
  ``min(width, height)`` links of 4 bytes per cycle. The slowest kernel sets the rate:
  ``samples/s = g / max_k max(C_k / f_c, T_k / f)``, with ``f`` the chip's clock (the links) and
  ``f_c = f x`` the release's compute speed (1, or 1 / 1.5 for a 1.x release), plus the per-step
  weight update (run in every region at once) amortized over the batch, and the system's input
  bandwidth for the data.
* **Not fitting** (the sum of minimum areas exceeds the rectangle, or no packing exists) is a
  result with a reason, not an error.
"""

from __future__ import annotations

import dataclasses
import math

from wafer.costmodel.graph import Graph, Kernel
from wafer.costmodel.hardware import System
from wafer.costmodel.mesh import Machine, kernel_cycles, vector_cycles
from wafer.costmodel.placement import Rect, pack, pack_options

__all__ = ("PipelineResult", "PipelineUnit", "dataflow_units", "layer_pipelined")


@dataclasses.dataclass(frozen=True)
class PipelineUnit:
  """One placed kernel instance.

  Attributes:
    kernel: the kernel's name; ``instance``: which of its ``count`` instances.
    rect: where it sits.
    compute_samples_per_sec, transmission_samples_per_sec: its rates alone.
    memory_bytes: the bytes its rectangle holds.
  """

  kernel: str
  instance: int
  rect: Rect
  compute_samples_per_sec: float
  transmission_samples_per_sec: float
  memory_bytes: float


@dataclasses.dataclass(frozen=True)
class PipelineResult:
  """A layer-pipelined estimate, or why the model does not fit.

  Attributes:
    fits: whether every kernel got a rectangle.
    reason: why not (empty when it fits).
    wave: samples per pipeline wave.
    samples_per_sec, compute_samples_per_sec, transmission_samples_per_sec: the rates.
    units: placed kernel instances (empty when it does not fit).
    memory_bytes: bytes all rectangles hold; ``needed_pes``: the minimum area in PEs;
      ``available_pes``: the rectangle's, set when the model does not fit (0 when it fits).
    update_s: per-step weight-update time (all regions at once).
    input_samples_per_sec: the rate the system's input I/O feeds (its bytes per second over a
      sample's input bytes; ``inf`` for a step with no input); it caps the transmission rate.
  """

  fits: bool
  reason: str
  wave: int = 0
  samples_per_sec: float = 0.0
  compute_samples_per_sec: float = 0.0
  transmission_samples_per_sec: float = 0.0
  units: tuple[PipelineUnit, ...] = ()
  memory_bytes: float = 0.0
  needed_pes: int = 0
  update_s: float = 0.0
  available_pes: int = 0
  input_samples_per_sec: float = math.inf


def dataflow_units(kernels: list[Kernel]) -> list[tuple[Kernel, int]]:
  """Kernel instances in dataflow order: consecutive kernels of one loop (same ``count > 1``)
  interleave by instance (``attn[0], mlp[0], attn[1], ...``)."""
  units: list[tuple[Kernel, int]] = []
  i = 0
  while i < len(kernels):
    j = i + 1
    if kernels[i].count > 1:
      while j < len(kernels) and kernels[j].count == kernels[i].count:
        j += 1
    segment = kernels[i:j]
    for inst in range(segment[0].count):
      units += [(k, inst) for k in segment]
    i = j
  return units


def _memory(graph: Graph, units: list[tuple[Kernel, int]], ratio: float) -> list[float]:
  """Bytes each unit's rectangle holds. Training: weights, optimizer state and a gradient
  accumulator per parameter, and its inputs for every wave between its forward and its backward.
  Inference (no backward): the weights in their on-wafer width and the input of one wave."""
  n = len(units)
  out = []
  for pos, (k, _) in enumerate(units):
    if graph.training:
      in_flight = 2 * (n - 1 - pos) + 1
      weights = k.weight_elements() * (graph.state_bytes_per_param() + 4.0)
    else:
      in_flight = 1
      weights = k.weight_bytes()
    out.append(weights + k.activation_in_bytes(ratio) * in_flight)
  return out


def _lanes(graph: Graph, machine: Machine, kernel: Kernel, area: float, memory: float) -> int | None:
  """Copies of the kernel's weight-stationary layout its rectangle can hold: every copy keeps the
  weights with their optimizer state and gradient (the activations in flight are shared out)."""
  per_copy = kernel.weight_elements() * (graph.state_bytes_per_param() + 4.0)
  if not graph.training or per_copy <= 0:  # no weights (or only empty ones): no copies to keep
    return None
  acts = memory - per_copy
  return max(1, int((area * machine.sram_data_bytes - acts) // per_copy))


_SUB_RECTANGLES = (1.0, 0.75, 0.5, 0.35, 0.25)
"""Fractions of a placed rectangle's sides a kernel may run on, leaving the rest of its PEs idle."""


def _placed_cycles(
  graph: Graph, machine: Machine, kernel: Kernel, width: int, height: int, ratio: float, memory: float
) -> float:
  """Cycles of ``kernel`` on its placed ``width x height`` rectangle: the fewest over sub-rectangles
  of it (`_SUB_RECTANGLES`, the weights still spread over the whole), since the compiler need not
  spread a small kernel's work over every PE it holds when the fill and reduction across them cost
  more than they save. (The areas are refined and the chosen floorplan's rates computed with it;
  the floorplans are compared at their whole rectangles.)"""
  lanes = _lanes(graph, machine, kernel, width * height, memory)
  best = math.inf
  for f in _SUB_RECTANGLES:
    w, h = max(1, round(width * f)), max(1, round(height * f))
    best = min(best, kernel_cycles(machine, kernel, w, h, ratio, ("fwd", "bwd"), lanes))
  return best


def _evaluate(
  graph: Graph, machine: Machine, system: System, width: int, height: int, batch: int, wave: int
) -> PipelineResult:
  f = machine.chip_clock_hz  # fabric links: the chip's clock, whatever the software
  fc = machine.clock_hz  # compute: the clock times the release's compute speed
  sram = machine.sram_data_bytes
  ratio = wave / graph.traced_batch
  kernels = [k for k in graph.kernels if k.has_phase("fwd") or k.has_phase("bwd")]
  units = dataflow_units(kernels)
  memory = _memory(graph, units, ratio)
  a_min = [max(1, math.ceil(m / sram)) for m in memory]
  total = width * height
  needed = sum(a_min)
  if needed > total:
    gb = sum(memory) / 1e9
    weights = (
      sum(
        memory[j]
        - units[j][0].activation_in_bytes(ratio) * (2 * (len(units) - 1 - j) + 1 if graph.training else 1)
        for j in range(len(units))
      )
      / 1e9
    )
    return PipelineResult(
      False,
      f"needs {needed:,} PEs ({gb:.3g} GB: weights, optimizer state and gradients {weights:.3g} GB, "
      f"activations in flight {gb - weights:.3g} GB) but the rectangle has {total:,} PEs "
      f"({total * sram / 1e9:.3g} GB of SRAM for tensors)",
      wave=wave,
      memory_bytes=sum(memory),
      needed_pes=needed,
      available_pes=total,
    )
  # area in proportion to work, refined on the placed rectangles
  side = max(1, int(math.sqrt(total / len(units))))
  work = [
    kernel_cycles(machine, k, side, side, ratio, ("fwd", "bwd"), _lanes(graph, machine, k, side * side, mem))
    * side
    * side
    for (k, _), mem in zip(units, memory)
  ]
  rects: list[Rect] | None = None
  labels = [
    k.name if k.count == 1 else k.instance_names[i] if k.instance_names else f"{k.name}[{i}]"
    for k, i in units
  ]
  for _ in range(3):
    areas = _water_fill(work, a_min, total)
    placed = None
    shrink = 1.0
    while placed is None and shrink > 0.2:
      requested = [max(a_min[j], areas[j] * shrink) for j in range(len(areas))]
      placed = pack(requested, width, height, labels)
      shrink *= 0.97
    if placed is None:
      break
    rects = placed
    work = [
      _placed_cycles(graph, machine, k, r.width, r.height, ratio, mem) * r.area
      for (k, _), r, mem in zip(units, rects, memory)
    ]
  if rects is None:
    return PipelineResult(
      False,
      f"the {len(units)} kernel rectangles ({needed:,} PEs at least) cannot be packed "
      f"without overlap on {width} x {height} PEs",
      wave=wave,
      memory_bytes=sum(memory),
      needed_pes=needed,
    )
  # floorplans: every shelf count for the final areas; the one with the best bottleneck wins
  best_plan: tuple[float, list[Rect]] | None = None
  options = [rects]
  for scale in (1.0, 0.97, 0.94, 0.9):  # slightly smaller requests let other shelf counts fit
    options += pack_options([max(a, r * scale) for a, r in zip(a_min, requested)], width, height, labels)
  for option in options:
    slowest = 0.0
    for j, ((k, _), r, mem) in enumerate(zip(units, option, memory)):
      cycles = kernel_cycles(
        machine, k, r.width, r.height, ratio, ("fwd", "bwd"), _lanes(graph, machine, k, r.area, mem)
      )
      link = 2 * k.activation_in_bytes(ratio) / (_links(option, j) * machine.chip.link_bytes_per_cycle)
      slowest = max(slowest, cycles / fc, link / f)
    if best_plan is None or slowest < best_plan[0]:
      best_plan = (slowest, option)
  assert best_plan is not None
  rects = best_plan[1]
  placed_units = []
  worst_compute = worst_transmit = 0.0
  for j, ((k, i), r, mem) in enumerate(zip(units, rects, memory)):
    cycles = _placed_cycles(graph, machine, k, r.width, r.height, ratio, mem)
    transfer = 2 * k.activation_in_bytes(ratio) / (_links(rects, j) * machine.chip.link_bytes_per_cycle)
    worst_compute = max(worst_compute, cycles)
    worst_transmit = max(worst_transmit, transfer)
    placed_units.append(
      PipelineUnit(
        k.name,
        i,
        r,
        fc * wave / cycles if cycles else math.inf,
        f * wave / transfer if transfer else math.inf,
        mem,
      )
    )
  if math.isinf(worst_compute):
    slow = next(u for u in placed_units if u.compute_samples_per_sec == 0.0)
    return PipelineResult(
      False,
      f"no floorplan gives every kernel a rectangle it can run on: {slow.kernel} gets "
      f"{slow.rect.width} x {slow.rect.height} PEs, too thin for its layout",
      wave=wave,
      memory_bytes=sum(memory),
      needed_pes=needed,
    )
  update_cycles = _update_cycles(graph, machine, width, height, ratio)
  update_s = update_cycles / fc  # weights stay on the wafer: no MemoryX round trip per step
  compute = fc * wave / worst_compute if worst_compute else math.inf
  data_rate = (
    system.io_bytes_per_sec / graph.input_bytes_per_sample if graph.input_bytes_per_sample else math.inf
  )
  transmit = min(f * wave / worst_transmit if worst_transmit else math.inf, data_rate)
  rate = min(compute, transmit)
  rate = 1.0 / (1.0 / rate + update_s / batch)
  return PipelineResult(
    True,
    "",
    wave,
    rate,
    compute,
    transmit,
    tuple(placed_units),
    sum(memory),
    needed,
    update_s,
    input_samples_per_sec=data_rate,
  )


def _update_cycles(graph: Graph, machine: Machine, width: int, height: int, ratio: float) -> float:
  """Cycles of the per-step weight update. Every region updates the weights it holds, all regions at
  once, so the count of instructions a region issues is what it costs, not the step's total.

  * A kernel's own update work (e.g. a cast of its weights) runs in its region: the slowest kernel's
    counts (one instance; the others run beside it).
  * The optimizer's element-wise work over all parameters (kernels holding no weights:
    ``weight_update``) issues the same instructions for every parameter array: ``N / R`` per array
    for ``N`` instructions over ``R`` arrays, and a region holds at most ``r_max`` arrays (the kernel
    reading the most), so it costs ``N r_max / R`` instructions over its ``E`` elements spread on the
    rectangle. One stacked array per weight of a ``scan`` over layers and one array per layer of a
    Python loop then cost the same (summing every instruction made the loop's update 3x the scan's).
  * Matrix products in the update (an orthogonalizing optimizer) run on the whole rectangle, after.

  A step whose kernels hold no weights keeps every instruction (the sum over kernels)."""
  holders = [k for k in graph.kernels if k.weights]
  if not holders:
    return sum(kernel_cycles(machine, k, width, height, ratio, ("update",)) for k in graph.kernels)
  arrays = graph.param_arrays or len({root for k in holders for root in k.weights})
  per_region = min(1.0, max(len(k.weights) for k in holders) / arrays)
  cycles = max(kernel_cycles(machine, k, width, height, ratio, ("update",)) for k in holders)
  for k in graph.kernels:
    if k.weights:
      continue
    for (phase, kind, exponent, bits), (elements, instructions) in k.vector.items():
      if phase == "update":
        cycles += k.count * vector_cycles(
          machine, kind, elements * ratio**exponent, instructions * per_region, bits, width, height
        )
    if any(mm.phase == "update" for mm in k.matmuls):
      products = dataclasses.replace(k, vector={}, matmuls=[mm for mm in k.matmuls if mm.phase == "update"])
      cycles += k.count * kernel_cycles(machine, products, width, height, ratio, ("update",))
  return cycles


def _links(rects: list[Rect], j: int) -> int:
  """Fabric links into rectangle ``j`` from its dataflow predecessor: the length of the edge they
  share (side by side in a shelf: the shelf height; across a shelf turn: the overlap of their
  widths), at least ``min(width, height)`` (a thin strip is fed along its long edge, not its end)."""
  r = rects[j]
  own = min(r.width, r.height)
  if j == 0:
    return own
  p = rects[j - 1]
  if p.x + p.width == r.x or r.x + r.width == p.x:  # side by side
    shared = min(p.y + p.height, r.y + r.height) - max(p.y, r.y)
  elif p.y + p.height == r.y or r.y + r.height == p.y:  # one above the other
    shared = min(p.x + p.width, r.x + r.width) - max(p.x, r.x)
  else:
    shared = 0
  return max(own, shared)


def _water_fill(work: list[float], a_min: list[int], total: int) -> list[float]:
  """``A_k = max(a_min_k, lam * work_k)`` with ``sum A_k = total`` (bisection on ``lam``)."""
  if sum(work) <= 0:
    return [total / len(work)] * len(work)
  lo, hi = 0.0, total / min(w for w in work if w > 0) if any(w > 0 for w in work) else 1.0
  for _ in range(60):
    lam = 0.5 * (lo + hi)
    if sum(max(a, lam * w) for a, w in zip(a_min, work)) > total:
      hi = lam
    else:
      lo = lam
  return [max(a, lo * w) for a, w in zip(a_min, work)]


def layer_pipelined(
  graph: Graph, machine: Machine, system: System, width: int, height: int, batch: int, wave: int | None = None
) -> PipelineResult:
  """The best pipeline wave size, or the reason the model does not fit (at wave 1).

  Args:
    graph: the extracted kernels.
    machine: chip, calibration and numeric choices.
    system: the CS-X system (input bandwidth).
    width, height: the rectangle to place the kernels on.
    batch: samples per step (the weight update is amortized over it).
    wave: force this wave size.
  """
  waves = [wave] if wave else sorted({2**j for j in range(int(math.log2(batch)) + 1)} | {batch})
  best: PipelineResult | None = None
  first_fail: PipelineResult | None = None
  for g in waves:
    res = _evaluate(graph, machine, system, width, height, batch, g)
    if not res.fits:
      first_fail = first_fail or res
      break  # larger waves need more memory
    if best is None or res.samples_per_sec > best.samples_per_sec:
      best = res
  if best is None:
    assert first_fail is not None
    return first_fail
  return best
