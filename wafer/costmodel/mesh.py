"""Cycles of a kernel on a ``width x height`` rectangle of PEs: the mesh-GEMM and vector models.

**Matrix products** (``C[m x n] = A[m x k] @ B[k x n]``, in cycles of one PE):

* The output is tiled over the rectangle (``m`` along one side, ``n`` along the other), each PE
  owning an ``Xt x Yt`` tile; a dimension smaller than its side leaves PEs idle.
* The contraction runs as ``k`` rank-1 updates: per ``k`` the PE issues ``min(Xt, Yt)`` AXPY
  tensor instructions of length ``L = max(Xt, Yt)`` into SRAM accumulators. One instruction costs
  ``max(ceil(L / lanes), L * acc_bytes / write_port, L * (in_bytes + acc_bytes) / read_ports)``
  cycles plus the fixed ``instruction_overhead_cycles``: with FP32 accumulators a 16-bit AXPY is
  bound by the 8-byte SRAM write port at half the FMAC rate.
* The search also splits the contraction over ``c`` groups of the rectangle (``c`` a power of two),
  then adds the partial tiles in a ``log2(c)``-level reduction over the fabric links (4 bytes per
  cycle); this is what makes weight-gradient products (huge ``k`` = tokens) efficient.
* Operands stream in along rows and columns at ``link_bytes`` per cycle (overlapped with compute);
  the wave fills the PEs holding tiles in ``hop_latency * (rows + columns)`` of them, cycles (a
  dimension shorter than its side leaves the PEs beyond it idle, and the wave does not cross them).
* A mapping whose accumulator tile and operand buffers do not fit in a PE's SRAM is not allowed.
* ``algorithm="meshgemm"`` instead fixes WaferLLM's MeshGEMM: a square ``P x P`` mesh, ``P``
  compute-shift steps, vectors along ``m`` (their ``@fmach`` over the sequence tile), no split.

**Batched products** (``instances > 1``, e.g. samples x heads in attention) are parallel work:
the rectangle is split into ``g`` groups (searched over powers of two), each computing
``ceil(instances / g)`` of them one after another on its sub-rectangle with the model above; the
fabric fill latency is paid once per group, since the next instance's operands follow the last.

**Attention rows.** A batched product whose operands are both activations (``Q K^T`` and ``P V`` of
attention, and their four backward products) has no weight to keep stationary: each (sample, head)
instance forms its ``s_q x s_k`` score matrix across the fabric and reduces every query row (the
softmax's max and sum) before the next product can use it. On top of the mesh cycles above, the
model charges each instance's query rows one after another, ``row_cycles`` cycles per row and
product at the 4-wide SIMD of a WSE-2 PE (`Calibration.attention_row_cycles`; halved on the 8-wide
WSE-3). Instances run side by side as far as their score matrices fit on the rectangle at one score
per PE, so the cycles of ``instances`` products on ``P`` PEs are::

    row_cycles * (4 / simd) * instances * rows / max(1, P / scores)

with ``scores = s_q s_k`` and ``rows = sqrt(s_q s_k)`` (``s`` for self-attention) times the fraction
of the scores a mask keeps (`Matmul.kept`: (s + 1) / (2 s) for a causal mask, about w / s for a
sliding window of w, 1 / blocks for a block-diagonal one; 1 without a mask). Long sequences
(``s^2 >= P``: GPT-2's 2048 tokens, ESM-2's 1026) therefore cost a fixed time per (sample, head)
row, whatever the head width; short ones (BERT's 128: about 46 instances side by side on a CS-2)
almost nothing.

This is the term that is *fitted* rather than derived (about one cycle per row). Its form comes
from the published runs, not from a hardware figure: the time they leave unexplained by the mesh
model is the same per (sample, head) instance for GPT-2 small (2048 causal tokens, heads of 64) and
ESM-2 35M (1026 tokens, heads of 24) within 4 %, which a cost per score element or per FLOP misses
by 2x, while BERT-large (128 tokens) leaves no per-sample residual at all. The mesh model alone puts
ESM-2 35M at about 7,500 samples/s on a CS-2; the published run does 586.

**Element-wise, reductions, casts and data movement**: per equation, ``elements / min(PEs,
elements)`` per PE at ``lanes`` per cycle (transcendentals ``transcendental_ops`` times), moves at
the write port's bytes per cycle, reductions plus one traversal of the PEs holding the elements
(``hop_latency`` times the long side of as square a region of them as fits), each plus
``instruction_overhead_cycles``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

from wafer.costmodel.calibration import Calibration
from wafer.costmodel.graph import PHASES, Kernel
from wafer.costmodel.hardware import Chip

__all__ = (
  "GemmPlan",
  "Machine",
  "PeParams",
  "attention_cycles",
  "clock_field",
  "gemm_cycles",
  "kernel_cycles",
)

ALGORITHMS = ("search", "meshgemm")


def clock_field(calib: Calibration, chip: Chip) -> tuple[str, bool]:
  """The `Calibration` parameter holding ``chip``'s clock (`Calibration.clock_field`), and whether it
  is the chip's own: a chip the calibration has no clock for (a user's own `Chip`, renamed) runs at
  the WSE-2's, ``clock_hz``.

  >>> from wafer.costmodel.hardware import get_system
  >>> clock_field(Calibration(), get_system("cs3").chip)
  ('wse3_clock_hz', True)
  """
  try:
    return calib.clock_field(chip.name), True
  except ValueError:
    return "clock_hz", False


@dataclasses.dataclass(frozen=True)
class Machine:
  """What a cost evaluation needs: the chip, the calibration and the numeric choices.

  Attributes:
    chip: the wafer.
    calib: the calibration parameters.
    acc_bits: accumulator width of matrix products (32 for Cerebras mixed precision).
    algorithm: ``"search"`` (best mapping, as the Cerebras compiler explores layouts) or
      ``"meshgemm"`` (WaferLLM's fixed MeshGEMM).
    speed: the software's compute rate as a fraction of the 2.x stack's
      (`wafer.costmodel.release.Release.compute_speed`: 1, or 1 / 1.5 for a 1.x release).
  """

  chip: Chip
  calib: Calibration
  acc_bits: int = 32
  algorithm: str = "search"
  speed: float = 1.0

  @property
  def chip_clock_hz(self) -> float:
    """The chip's clock (`clock_field`)."""
    return float(getattr(self.calib, clock_field(self.calib, self.chip)[0]))

  @property
  def clock_hz(self) -> float:
    """Compute cycles per second: the chip's clock times ``speed`` (the fabric's links run at the
    chip's clock whatever the software)."""
    return self.chip_clock_hz * self.speed

  @property
  def sram_data_bytes(self) -> int:
    """SRAM per PE available to tensors."""
    return self.chip.sram_bytes_per_pe - self.calib.sram_reserved_bytes_per_pe

  def pe(self, bits: int) -> PeParams:
    """The per-PE parameters of a product with ``bits``-bit operands."""
    chip = self.chip
    return PeParams(
      bits=bits,
      acc_bits=self.acc_bits,
      lanes=chip.lanes(bits),
      read_bytes=chip.sram_read_bytes_per_cycle,
      write_bytes=chip.sram_write_bytes_per_cycle,
      link_bytes=chip.link_bytes_per_cycle,
      alpha=chip.hop_latency_cycles,
      c_op=self.calib.instruction_overhead_cycles,
      overlap=chip.overlapped_setup,
      sram=self.sram_data_bytes,
    )


@dataclasses.dataclass(frozen=True)
class PeParams:
  """The per-PE facts one product's cost depends on (hashable: the mesh searches are cached on it).

  Attributes:
    bits, acc_bits: operand and accumulator widths.
    lanes: FMAC lanes per cycle at ``bits`` (`Chip.lanes`).
    read_bytes, write_bytes: SRAM read and write port widths, bytes per cycle.
    link_bytes: fabric link payload per direction per cycle.
    alpha: cycles per fabric hop.
    c_op: fixed cycles per tensor instruction (`Calibration.instruction_overhead_cycles`).
    overlap: whether instruction setup overlaps the previous instruction's work (`Chip.overlapped_setup`).
    sram: SRAM bytes per PE for tensors.
  """

  bits: int
  acc_bits: int
  lanes: int
  read_bytes: int
  write_bytes: int
  link_bytes: int
  alpha: float
  c_op: float
  overlap: bool
  sram: float

  @property
  def in_bytes(self) -> float:
    return self.bits / 8

  @property
  def acc_bytes(self) -> float:
    return self.acc_bits / 8

  def issue(self, work: float) -> float:
    """Cycles of one tensor instruction doing ``work`` cycles of vector work (`_issue`)."""
    return _issue(work, self.c_op, self.overlap)

  def axpy(self, length: int) -> float:
    """Cycles of one AXPY of ``length`` into accumulators, setup included (`_vec_cycles`)."""
    return self.issue(
      _vec_cycles(length, self.lanes, self.in_bytes, self.acc_bytes, self.read_bytes, self.write_bytes)
    )


@dataclasses.dataclass(frozen=True)
class GemmPlan:
  """The chosen mapping of one product: cycles, split factor, tile and vector length, and the
  fabric fill latency included in ``cycles`` (``alpha`` times the rows plus columns of PEs holding
  tiles: the wave does not cross idle PEs beyond a short dimension)."""

  cycles: float
  split: int
  tile: tuple[int, int]
  vector_length: int
  fill: float = 0.0


def _vec_cycles(length: int, lanes: int, in_b: float, acc_b: float, read_b: int, write_b: int) -> int:
  return max(
    math.ceil(length / lanes),
    math.ceil(length * acc_b / write_b),
    math.ceil(length * (in_b + acc_b) / read_b),
  )


def _issue(work: float, c_op: float, overlap: bool) -> float:
  """Cycles of one tensor instruction: its vector work plus the fixed setup, or, where hardware
  microthreads set up the next instruction while this one runs (WSE-3), the longer of the two."""
  return max(work, c_op) if overlap else work + c_op


def _halve(width: int, height: int, groups: int) -> tuple[int, int]:
  """The sub-rectangle of one of ``groups`` (a power of two) equal parts: halve the longer side."""
  w, h = width, height
  while groups > 1:
    if h >= w:
      h = max(1, h // 2)
    else:
      w = max(1, w // 2)
    groups //= 2
  return w, h


@functools.lru_cache(maxsize=200_000)
def _gemm(m: int, k: int, n: int, width: int, height: int, pe: PeParams, algorithm: str) -> GemmPlan:
  in_b, acc_b = pe.in_bytes, pe.acc_bytes
  if algorithm == "meshgemm":
    p = max(1, min(width, height))
    mt, nt = math.ceil(m / min(p, m)), math.ceil(n / min(p, n))
    kt = math.ceil(k / p)
    step_compute = kt * nt * pe.axpy(mt)
    step_comm = math.ceil((mt * kt + kt * nt) * in_b / pe.link_bytes) + 2 * pe.alpha
    cycles = p * max(step_compute, step_comm) + pe.alpha * 2 * p
    return GemmPlan(float(cycles), 1, (mt, nt), mt, pe.alpha * 2 * p)
  best: GemmPlan | None = None
  pes = width * height
  for rows_dim, cols_dim in ((m, n), (n, m)):
    c = 1
    while c <= max(1, min(k, pes)):
      w, h = _halve(width, height, c)
      xt = math.ceil(rows_dim / min(h, rows_dim))
      yt = math.ceil(cols_dim / min(w, cols_dim))
      if xt * yt * acc_b + 2 * (xt + yt) * in_b <= pe.sram:
        kg = math.ceil(k / c)
        length, short = max(xt, yt), min(xt, yt)
        per_k = short * pe.axpy(length)
        comm_k = math.ceil((xt + yt) * in_b / pe.link_bytes)
        fill = pe.alpha * (math.ceil(rows_dim / xt) + math.ceil(cols_dim / yt))  # PEs holding tiles
        cycles = kg * max(per_k, comm_k) + fill
        if c > 1:
          tile = xt * yt
          level = pe.issue(max(math.ceil(tile * acc_b / pe.link_bytes), math.ceil(tile / pe.lanes)))
          # the partial tiles meet across the c groups: as far as the groups' tiles reach, at most the rectangle
          reach = min(height + width, c * fill / pe.alpha) if pe.alpha else 0.0
          cycles += math.ceil(math.log2(c)) * level + pe.alpha * reach / 2
        if best is None or cycles < best.cycles:
          best = GemmPlan(float(cycles), c, (xt, yt), length, fill)
      c *= 2
  if best is None:  # no tile fits: report it as infinitely slow (the caller shrinks the batch)
    return GemmPlan(math.inf, 1, (0, 0), 0)
  return best


def _in_passes(mi: int, ki: int, ni: int, width: int, height: int, pe: PeParams, algorithm: str) -> GemmPlan:
  """The product, computed in ``2^j`` passes over ``m`` or ``n`` when one pass's tiles do not fit in SRAM."""
  plan = _gemm(mi, ki, ni, width, height, pe, algorithm)
  passes = 1
  while math.isinf(plan.cycles) and passes < max(mi, ni):
    passes *= 2
    a = _gemm(math.ceil(mi / passes), ki, ni, width, height, pe, algorithm)
    b = _gemm(mi, ki, math.ceil(ni / passes), width, height, pe, algorithm)
    best = a if a.cycles <= b.cycles else b
    plan = dataclasses.replace(best, cycles=best.cycles * passes)
  return plan


@functools.lru_cache(maxsize=200_000)
def _streamed(a: int, b: int, tokens: int, width: int, height: int, pe: PeParams, max_lanes: int) -> GemmPlan:
  """A weight-stationary product: the static ``a x b`` matrix (a weight, or a weight gradient being
  accumulated) is tiled over ``g`` copies of a sub-rectangle (*lanes*, ``g`` a power of two up to
  ``max_lanes``), and ``tokens`` stream through in time, ``tokens / g`` per lane. Per token a PE
  issues ``a_t`` AXPYs of length ``b_t`` over its ``a_t x b_t`` tile (either orientation)."""
  in_b, acc_b = pe.in_bytes, pe.acc_bytes
  best: GemmPlan | None = None
  g = 1
  while g <= min(max_lanes, tokens):
    w, h = _halve(width, height, g)
    for rows, cols in ((a, b), (b, a)):
      at, bt = math.ceil(rows / min(h, rows)), math.ceil(cols / min(w, cols))
      while at * bt * acc_b + 2 * (at + bt) * in_b <= pe.sram:
        length, short = max(at, bt), min(at, bt)
        per_token = short * pe.axpy(length)
        comm = math.ceil((at + bt) * in_b / pe.link_bytes)
        fill = pe.alpha * (math.ceil(rows / at) + math.ceil(cols / bt))  # the PEs holding tiles
        work = math.ceil(tokens / g) * max(per_token, comm)
        if best is None or work + fill < best.cycles:
          best = GemmPlan(float(work + fill), g, (at, bt), length, fill)
        # fill-bound (a small product on many PEs): try fewer PEs, twice the tile along the longer reach
        if fill <= work or (at >= rows and bt >= cols):
          break
        if (math.ceil(rows / at) >= math.ceil(cols / bt) and at < rows) or bt >= cols:
          at = min(rows, 2 * at)
        else:
          bt = min(cols, 2 * bt)
    if w == 1 and h == 1:
      break
    g *= 2
  return best if best is not None else GemmPlan(math.inf, 1, (0, 0), 0)


def gemm_cycles(
  machine: Machine,
  m: float,
  k: float,
  n: float,
  width: int,
  height: int,
  bits: int,
  instances: float = 1.0,
  stream: str | None = None,
  max_lanes: int | None = None,
) -> GemmPlan:
  """Cycles of ``instances`` products ``[m x k] @ [k x n]`` on a ``width x height`` rectangle.

  ``stream`` names the one dimension that grows with the batch when the two others do not (a
  weight product, or a weight gradient contracted over tokens): such a product is weight
  stationary (`_streamed`). Other products are tiled over the rectangle (`_gemm`); one whose output
  tiles do not fit in SRAM runs in several passes over ``m`` or ``n``.
  """
  mi, ki, ni, inst = (max(1, math.ceil(v - 1e-9)) for v in (m, k, n, instances))
  pe = machine.pe(bits)
  if stream is not None and inst == 1 and machine.algorithm == "search":
    a, b, tokens = {"m": (ki, ni, mi), "k": (mi, ni, ki), "n": (mi, ki, ni)}[stream]
    lanes = (
      int(machine.calib.max_lanes)
      if max_lanes is None
      else max(1, min(int(machine.calib.max_lanes), max_lanes))
    )
    return _streamed(a, b, tokens, width, height, pe, lanes)
  if inst == 1:
    return _in_passes(mi, ki, ni, width, height, pe, machine.algorithm)
  return _batched(mi, ki, ni, inst, width, height, pe, machine.algorithm)


def _batched(
  m: int, k: int, n: int, inst: int, width: int, height: int, pe: PeParams, algorithm: str
) -> GemmPlan:
  """``inst`` independent products (samples x heads): parallel work. The rectangle is split into
  ``g`` groups (``g`` a power of two, searched); each group computes ``ceil(inst / g)`` instances one
  after another on its sub-rectangle, the operand wave of the next instance following the last
  (the fill latency, ``GemmPlan.fill``, is paid once per group). ``g`` may exceed ``inst`` (groups
  left idle) while a group still has a PE for every element of an instance's largest matrix: a few
  small instances need not pay the fill latency of a group larger than they use (4 heads of 64
  tokens took longer than 8)."""
  best: GemmPlan | None = None
  largest = max(m * n, m * k, k * n)
  g = 1
  while g <= min(inst, width * height) or (g <= width * height and width * height // g >= largest):
    w, h = _halve(width, height, g)
    if algorithm == "search":  # one operand stationary on the group, the other streams through
      a = _streamed(k, n, m, w, h, pe, 1)
      b = _streamed(m, k, n, w, h, pe, 1)
      plan = a if a.cycles <= b.cycles else b
    else:
      plan = _in_passes(m, k, n, w, h, pe, algorithm)
    if not math.isinf(plan.cycles):
      fill = plan.fill
      per = max(plan.cycles - fill, 1.0)
      cycles = math.ceil(inst / g) * per + fill
      if best is None or cycles < best.cycles:
        best = dataclasses.replace(plan, cycles=cycles)
    if w == 1 and h == 1:
      break
    g *= 2
  return best if best is not None else GemmPlan(math.inf, 1, (0, 0), 0)


def vector_cycles(
  machine: Machine, kind: str, elements: float, instructions: float, bits: int, width: int, height: int
) -> float:
  """Cycles of ``instructions`` non-matmul equations with ``elements`` in total on the rectangle."""
  if instructions <= 0 or elements <= 0:
    return 0.0
  chip, calib = machine.chip, machine.calib
  pes = width * height
  per_instr = elements / instructions
  used = max(1.0, min(pes, per_instr))
  if kind == "move":
    work = math.ceil(per_instr / used / chip.sram_write_bytes_per_cycle)
  else:
    ops = calib.transcendental_ops if kind == "transcendental" else 1.0
    work = math.ceil(per_instr / used / chip.lanes(bits)) * ops
  cycles = instructions * _issue(work, calib.instruction_overhead_cycles, chip.overlapped_setup)
  if kind == "reduce":  # one traversal of the PEs holding the elements (as square a region as fits)
    short = min(width, height, math.ceil(math.sqrt(used)))
    cycles += instructions * chip.hop_latency_cycles * min(max(width, height), math.ceil(used / short))
  return float(cycles)


def attention_cycles(
  machine: Machine,
  instances: float,
  m: float,
  k: float,
  n: float,
  kept: float,
  width: int,
  height: int,
  bits: int,
) -> float:
  """Cycles of the row work of ``instances`` activation x activation products ``[m x k] @ [k x n]``
  (attention) on a ``width x height`` rectangle, on top of their mesh cycles (see the module text).

  The instance's score matrix is its largest, ``max(m n, m k, k n)`` elements; the row work scales
  with ``kept``, the fraction of the scores a mask keeps (1.0 without a mask, about 0.5 for causal).

  >>> from wafer.costmodel import CALIBRATION
  >>> from wafer.costmodel.hardware import WSE2, WSE3
  >>> m2, m3 = Machine(WSE2, CALIBRATION), Machine(WSE3, CALIBRATION)
  >>> long = attention_cycles(m2, 20, 1026, 24, 1026, 1.0, 750, 994, 16)  # 20 heads, 1026 tokens
  >>> round(long / (20 * 1026 * CALIBRATION.attention_row_cycles))  # one row after another
  1
  >>> attention_cycles(m3, 20, 1026, 24, 1026, 1.0, 750, 994, 16) == long / 2  # 8-wide SIMD
  True
  >>> attention_cycles(m2, 20, 128, 64, 128, 1.0, 750, 994, 16) < long / 100  # 46 side by side
  True
  >>> attention_cycles(m2, 20, 1026, 24, 1026, 0.25, 750, 994, 16) == long / 4  # a mask keeps 1/4
  True
  """
  scores = max(m * n, m * k, k * n)
  rows = math.sqrt(scores) * kept
  concurrent = max(1.0, width * height / scores)
  simd = machine.chip.lanes(bits)
  return machine.calib.attention_row_cycles * (4 / simd) * instances * rows / concurrent


def kernel_cycles(
  machine: Machine,
  kernel: Kernel,
  width: int,
  height: int,
  ratio: float,
  phases: Sequence[str] = PHASES,
  max_lanes: int | None = None,
) -> float:
  """Cycles one instance of ``kernel`` takes on ``width x height`` PEs for ``ratio * b0`` samples.

  ``phases`` selects forward, backward and/or the (batch-independent) update work. ``max_lanes``
  caps the copies of a weight-stationary layout (default `Calibration.max_lanes`; layer-pipelined
  mode passes the copies its rectangle's SRAM can hold). Results are cached on the kernel.
  """
  cache: dict[tuple[object, ...], float] = kernel.__dict__.setdefault("_cycles_cache", {})
  key = (machine, width, height, ratio, tuple(phases), max_lanes)
  hit = cache.get(key)
  if hit is not None:
    return hit
  total = 0.0
  for mm in kernel.matmuls:
    if mm.phase in phases:
      # attention: activation x activation products, one per (sample, head): their instances grow
      # with the batch (a grouped product's weight gradient has one instance per expert: not attention)
      if not mm.weight and mm.instances.exponent > 0 and mm.instances.at(ratio) > 1:
        total += attention_cycles(
          machine,
          mm.instances.at(ratio),
          mm.m.at(ratio),
          mm.k.at(ratio),
          mm.n.at(ratio),
          mm.kept,
          width,
          height,
          mm.bits,
        )
      growing = [d for d, size in (("m", mm.m), ("k", mm.k), ("n", mm.n)) if size.exponent > 0]
      stream = growing[0] if len(growing) == 1 and mm.instances.exponent == 0 else None
      total += gemm_cycles(
        machine,
        mm.m.at(ratio),
        mm.k.at(ratio),
        mm.n.at(ratio),
        width,
        height,
        mm.bits,
        mm.instances.at(ratio),
        stream,
        max_lanes,
      ).cycles
  for (phase, kind, exponent, bits), (elements, instructions) in kernel.vector.items():
    if phase in phases:
      total += vector_cycles(machine, kind, elements * ratio**exponent, instructions, bits, width, height)
  cache[key] = total
  return total
