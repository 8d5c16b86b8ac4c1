"""Wafer-scale engines and the systems around them: the numbers that have a published source.

Every number here carries its source (see ``docs/references.md``, "Hardware", for the full
citations and the confidence labels). Numbers nobody publishes — the clock, the per-instruction
overhead, how much SRAM the runtime keeps — are *not* here: they are the named calibration
parameters of `wafer.costmodel.calibration`.

Units: PEs (processing elements, "cores"), bytes, cycles, bits per second for network links.
A chip's fabric is ``width x height`` PEs (SDK convention: x across, y down).
"""

from __future__ import annotations

import dataclasses

__all__ = ("SYSTEMS", "Chip", "System", "get_system", "system_names")


@dataclasses.dataclass(frozen=True)
class Chip:
  """One wafer-scale engine (WSE): its PE grid, per-PE memory and datapath.

  Attributes:
    name: ``"WSE-2"`` etc.
    fabric_width, fabric_height: the PE grid software sees (SDK fabric dims), in PEs.
    io_margin_width, io_margin_height: PEs along the edges taken by the host-I/O (memcpy)
      infrastructure, so the user rectangle is ``(fabric_width - io_margin_width) x
      (fabric_height - io_margin_height)``.
    sram_bytes_per_pe: local SRAM of one PE.
    simd16: 16-bit FMAC lanes per PE per cycle (one FMAC = 2 FLOP), i.e. 16-bit FLOP/cycle = 2*simd16.
    fp32_lanes: FP32 FMAC lanes per PE per cycle.
    sram_read_bytes_per_cycle, sram_write_bytes_per_cycle: SRAM port widths of one PE.
    link_bytes_per_cycle: payload one fabric link carries per direction per cycle.
    router_ports: router ports per PE (N, S, E, W, RAMP).
    hop_latency_cycles: cycles per fabric hop (alpha in WaferLLM's PLMR model).
    overlapped_setup: whether hardware microthreads set up the next tensor instruction while the
      current one runs, so an instruction costs ``max(work, setup)`` rather than ``work + setup``.
    source: where the numbers come from.
  """

  name: str
  fabric_width: int
  fabric_height: int
  io_margin_width: int
  io_margin_height: int
  sram_bytes_per_pe: int
  simd16: int
  fp32_lanes: int
  sram_read_bytes_per_cycle: int
  sram_write_bytes_per_cycle: int
  link_bytes_per_cycle: int
  router_ports: int
  hop_latency_cycles: float
  source: str
  overlapped_setup: bool = False

  @property
  def usable_width(self) -> int:
    """PE columns left for user kernels."""
    return self.fabric_width - self.io_margin_width

  @property
  def usable_height(self) -> int:
    """PE rows left for user kernels."""
    return self.fabric_height - self.io_margin_height

  @property
  def usable_pes(self) -> int:
    return self.usable_width * self.usable_height

  @property
  def fabric_pes(self) -> int:
    return self.fabric_width * self.fabric_height

  def lanes(self, bits: int) -> int:
    """FMAC lanes per cycle for operands of ``bits`` bits (16-bit SIMD or the FP32 path)."""
    return self.simd16 if bits <= 16 else self.fp32_lanes

  def peak_flops_per_cycle(self, bits: int) -> int:
    """Dense FLOP per PE per cycle: 2 FLOP per FMAC lane."""
    return 2 * self.lanes(bits)


@dataclasses.dataclass(frozen=True)
class System:
  """A CS-X system: one chip plus its I/O, and the cluster it can join.

  Attributes:
    name: ``"CS-2"`` etc.; ``key``: the short name accepted by ``system=`` (``"wse2"``).
    chip: the wafer.
    io_bits_per_sec: Ethernet bandwidth into the wafer, per direction (the same out).
    memoryx: MemoryX capacity options (text).
    max_systems: largest SwarmX cluster (data-parallel systems).
    source: where the numbers come from.
  """

  key: str
  name: str
  chip: Chip
  io_bits_per_sec: float
  memoryx: str
  max_systems: int
  source: str

  @property
  def io_bytes_per_sec(self) -> float:
    """Weight (or data) bytes per second into the wafer; the same out (full duplex)."""
    return self.io_bits_per_sec / 8.0


# All entries: docs/references.md, "Hardware" (and each spec's source=).
WSE1 = Chip(
  name="WSE-1",
  fabric_width=633,
  fabric_height=633,  # VERIFIED: cerebras.net/ispd-2020-contest (633 x 633 tiles)
  io_margin_width=7,
  io_margin_height=2,  # same SDK memcpy margin as WSE-2 (assumed)
  sram_bytes_per_pe=48 * 1024,  # VERIFIED: tweakers.net WSE-1, 48 KB per core
  simd16=4,  # DERIVED: Rocki et al. SC20, 0.86 PF = 1/3 of 380k x 8 FLOP x 0.85 GHz
  fp32_lanes=1,  # UNCONFIRMED: >= 1 FP32 FMAC per cycle
  sram_read_bytes_per_cycle=16,
  sram_write_bytes_per_cycle=8,  # SECONDARY: HC34 digest (2x64b read, 1x64b write)
  link_bytes_per_cycle=4,  # VERIFIED: one 32-bit wavelet per link per direction per cycle
  router_ports=5,  # VERIFIED: SDK (N, S, E, W, RAMP)
  hop_latency_cycles=1.0,  # VERIFIED indirectly: csl-examples bandwidth-test corrects by (px+py) cycles
  source="ISPD 2020 contest page; Rocki et al. SC20",
)

WSE2 = Chip(
  name="WSE-2",
  fabric_width=757,
  fabric_height=996,  # VERIFIED: SDK tutorial "running-system" (most CS-2s)
  io_margin_width=7,
  io_margin_height=2,  # a CSL GEMM run script uses P=750 at offset (4, 1) in 757 x 996
  sram_bytes_per_pe=48 * 1024,  # VERIFIED: csl-examples pe.csl "Main memory (48KB)"
  simd16=4,  # VERIFIED: 3.4M FP units / 850k cores = 4-wide FP16 FMAC
  fp32_lanes=1,  # UNCONFIRMED: inferred from WaferLLM's 32-bit operand description
  sram_read_bytes_per_cycle=16,
  sram_write_bytes_per_cycle=8,  # SECONDARY: HC34 digest
  link_bytes_per_cycle=4,  # VERIFIED: WaferLLM §7, 32-bit message per cycle per neighbour
  router_ports=5,  # VERIFIED: SDK
  hop_latency_cycles=1.0,  # VERIFIED indirectly (see WSE1)
  source="SDK tutorial running-system; WaferLLM OSDI'25 §7; HC34",
)

WSE3 = Chip(
  name="WSE-3",
  fabric_width=762,
  fabric_height=1176,  # VERIFIED: SDK tutorial (WaferLLM scripts use 762 x 1172)
  io_margin_width=7,
  io_margin_height=2,  # same SDK memcpy margin as WSE-2 (assumed)
  sram_bytes_per_pe=48 * 1024,  # VERIFIED: csl-examples wse3 pe.csl; ALCF CS-3 docs
  simd16=8,  # SECONDARY: SDK-derived SIMD table, "max SIMD width (16-bit) WSE-3 8"
  # The matmul datapath, from Cerebras' WSE-3 announcement (2024-03-13: "2x the performance of the
  # WSE-2 at the same power and price"; 125 PF peak vs the WSE-2's 75 PF on 900k vs 850k cores) and
  # the measured CS-3 / CS-2 gains of matmul-bound models (GPT-J 6B 2.26x, DiT-2B 2.14x): a 16-bit
  # AXPY into FP32 accumulators runs at twice the WSE-2's rate per PE per cycle, i.e. the 8-wide SIMD
  # is fed by twice the WSE-2's SRAM ports (read 2 x 128 b, write 128 b). DERIVED, not published as
  # port widths; the aggregate "21 PB/s" memory bandwidth quoted for the WSE-3 (20 PB/s for the
  # WSE-2) does not show it (docs/cost-model-accuracy.md, "Constants").
  fp32_lanes=1,  # UNCONFIRMED
  sram_read_bytes_per_cycle=32,
  sram_write_bytes_per_cycle=16,
  link_bytes_per_cycle=4,  # assumed unchanged (214 Pb/s aggregate ~ WSE-2's 220 Pb/s)
  router_ports=5,
  hop_latency_cycles=1.0,
  source="SDK tutorial; Cerebras WSE-3 announcement 2024-03-13 (2x WSE-2 performance, 125 PF)",
  # SECONDARY: 8 hardware microthreads, explicit on WSE-3 (SDK-derived notes): the
  # descriptor setup of one thread's instruction overlaps another's vector work.
  overlapped_setup=True,
)

SYSTEMS: dict[str, System] = {
  "wse1": System(
    key="wse1",
    name="CS-1",
    chip=WSE1,
    io_bits_per_sec=1.2e12,  # VERIFIED: 12 x 100 GbE = 1.2 Tb/s (tweakers; Tom's Hardware)
    memoryx="none (CS-1 predates weight streaming)",
    max_systems=1,
    source="CS-1: 12 x 100 GbE (tweakers; Tom's Hardware)",
  ),
  "wse2": System(
    key="wse2",
    name="CS-2",
    chip=WSE2,
    io_bits_per_sec=1.2e12,  # VERIFIED: 1.2 Tb/s per CS system (Argonne SC24 tutorial)
    memoryx="4 TB - 2.4 PB, up to 120T parameters",
    max_systems=192,  # VERIFIED: glossary; HC33
    source="CS-2 I/O 1.2 Tb/s: Argonne SC24 tutorial (argonne-lcf/AIaccelerators-SC24-tutorial); MemoryX: cerebras.net glossary",
  ),
  "wse3": System(
    key="wse3",
    name="CS-3",
    chip=WSE3,
    io_bits_per_sec=1.56e12,  # DERIVED, UNCONFIRMED: "~30 % more ingress/egress than CS-2"
    memoryx="1.5 TB, 12 TB or 1.2 PB, up to 24T parameters",
    max_systems=2048,  # VERIFIED: Tom's Hardware
    source="docs.cerebras.net how-cerebras-works (CS-3: about 30 % more I/O than CS-2)",
  ),
}

_ALIASES = {
  "cs1": "wse1",
  "cs-1": "wse1",
  "cs2": "wse2",
  "cs-2": "wse2",
  "cs3": "wse3",
  "cs-3": "wse3",
  "wse-1": "wse1",
  "wse-2": "wse2",
  "wse-3": "wse3",
}


def system_names() -> tuple[str, ...]:
  """The accepted ``system=`` keys (aliases such as ``"cs2"`` are accepted too)."""
  return tuple(SYSTEMS)


def get_system(system: str | System) -> System:
  """``"wse2"`` (or ``"cs2"``, ``"CS-2"``, ``"WSE-2"``) -> the `System`.

  Raises:
    ValueError: an unknown name; the message lists the accepted ones.
  """
  if isinstance(system, System):
    return system
  key = "-".join(str(system).strip().lower().replace("_", " ").split())  # "WSE 3", "cs_2": "wse-3", "cs-2"
  key = _ALIASES.get(key, key)
  if key not in SYSTEMS:
    raise ValueError(
      f"system={system!r} is not a known system; allowed: {', '.join(repr(k) for k in SYSTEMS)}"
      " (aliases: cs1, cs2, cs3)"
    )
  return SYSTEMS[key]
