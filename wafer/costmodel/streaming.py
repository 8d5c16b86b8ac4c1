"""Weight-streaming mode: the layers run one after another over the whole rectangle.

Per micro-batch of ``mb`` samples and per kernel instance (``docs/references.md``, "Execution modes"):

    T_fwd = max(C_fwd / f, W / B_in)                  W: weight bytes, streamed in from MemoryX
    T_bwd = max(C_bwd / f, W / B_in, G / B_out)        G: gradient bytes, streamed out
    T_step = n_micro * sum_k count_k * (T_fwd + T_bwd) + T_boundary + T_swarmx

``C`` are the kernel's cycles on the rectangle from the mesh model, ``B_in = B_out`` the system's
I/O bandwidth, ``n_micro = ceil(batch_per_system / mb)``. Streaming the next layer's weights overlaps the
current layer's compute, hence the ``max``. The weight update runs on MemoryX; the only bubble is
at the iteration boundary (``T_boundary``): the first layer waits for its updated weights, and
MemoryX's optimizer pass over all ``P`` parameters, which cannot start before the last gradient
has arrived when the step clips by the global gradient norm (the modelzoo default), takes
``P * optimizer_bytes_per_param / B_memoryx`` with MemoryX's bandwidth taken equal to the system's
I/O bandwidth (the MemoryX glossary: its I/O "matches or exceeds" the CS-2's).

With ``num_csx`` systems the batch is split evenly (pure data parallelism); SwarmX broadcasts the
weights and reduces the gradients at line rate, adding ``2 * ceil(log2(num_csx))`` tree-level
latencies per step.

The micro-batch is searched, as the Cerebras compiler does: every candidate must keep its
activations resident (the kernels' boundary inputs for all layers, to be read again by the
backward pass) and its GEMM tiles within each PE's SRAM; the fastest feasible one wins. The
candidates are the sizes Cerebras supports (releases 2.5 on, "approximately even" micro-batches):
``mb = ceil(B / n)`` for ``n = 1 .. B`` micro-batches of the ``B`` samples per system, so the size
need not divide ``B`` (``B = 1168`` can run 20 micro-batches of 59 or 58). Every micro-batch is
costed at ``mb`` samples, an upper bound that is off by less than one sample per micro-batch.
"""

from __future__ import annotations

import dataclasses
import math

from wafer.costmodel.graph import Graph
from wafer.costmodel.hardware import System
from wafer.costmodel.mesh import Machine, kernel_cycles

__all__ = (
  "StreamingKernel",
  "StreamingResult",
  "micro_batch_candidates",
  "supported_micro_batch",
  "supported_micro_batches",
  "weight_streaming",
)


@dataclasses.dataclass(frozen=True)
class StreamingKernel:
  """Per-step timing of one kernel (all its instances, all micro-batches), in seconds."""

  name: str
  count: int
  compute_s: float
  io_s: float
  time_s: float
  flops: float
  weight_bytes: float


@dataclasses.dataclass(frozen=True)
class StreamingResult:
  """A weight-streaming estimate for one step.

  Attributes:
    micro_batch: samples per micro-batch (per system).
    n_micro: micro-batches per step (per system).
    step_s: seconds per step; ``compute_s`` and ``io_s`` the compute-only and I/O-only times.
    boundary_s, swarmx_s: the iteration-boundary bubble and the SwarmX latency in ``step_s``.
    resident_bytes: activation bytes kept on the wafer between forward and backward.
    kernels: per-kernel timings.
    rejected: micro-batches that were not feasible, with why.
  """

  micro_batch: int
  n_micro: int
  step_s: float
  compute_s: float
  io_s: float
  boundary_s: float
  swarmx_s: float
  resident_bytes: float
  kernels: list[StreamingKernel]
  rejected: dict[int, str]


def supported_micro_batches(batch: int) -> list[int]:
  """The micro-batch sizes Cerebras runs ``batch`` samples per system in: ``ceil(batch / n)``.

  ``n = 1 .. batch`` micro-batches of approximately even size (they differ by at most one sample).
  There are about ``2 sqrt(batch)`` distinct sizes; every divisor of ``batch`` is one of them.

  >>> supported_micro_batches(10)
  [1, 2, 3, 4, 5, 10]
  >>> supported_micro_batches(133)[-6:]  # the Cerebras docs' example: 133, 67, 45, 34, 27, 23, ...
  [23, 27, 34, 45, 67, 133]
  """
  root = math.isqrt(batch) + 1
  sizes = {-(-batch // n) for n in range(1, root + 1)}
  sizes |= {v for v in range(1, root + 1) if -(-batch // -(-batch // v)) == v}
  return sorted(sizes)


def supported_micro_batch(batch: int, requested: int) -> int:
  """The supported size (`supported_micro_batches`) nearest ``requested``, the larger on a tie.

  Cerebras overrides a requested size that is not supported the same way (its docs: 168 of 337
  samples per system becomes 169).

  >>> supported_micro_batch(337, 168), supported_micro_batch(1024, 256), supported_micro_batch(8, 3)
  (169, 256, 3)
  """
  return min(supported_micro_batches(batch), key=lambda v: (abs(v - requested), -v))


def micro_batch_candidates(batch: int, limit: int = 200) -> list[int]:
  """`supported_micro_batches`, thinned to about ``limit`` roughly log-spaced sizes (``batch`` included)."""
  sizes = supported_micro_batches(batch)
  if len(sizes) <= limit:
    return sizes
  picked = {sizes[0], sizes[-1]}
  for i in range(limit):
    target = math.exp(math.log(batch) * i / (limit - 1))
    picked.add(min(sizes, key=lambda d: abs(math.log(d) - math.log(target))))
  return sorted(picked)


def _evaluate(
  graph: Graph, machine: Machine, system: System, width: int, height: int, batch: int, mb: int, num_csx: int
) -> StreamingResult | str:
  f = machine.calib.clock_hz
  b_in = b_out = system.io_bytes_per_sec
  ratio = mb / graph.traced_batch
  n_micro = -(-batch // mb)
  resident = sum(k.count * k.activation_in_bytes(ratio) for k in graph.kernels)
  capacity = width * height * machine.sram_data_bytes
  if resident > capacity:
    return (
      f"activations kept for the backward pass ({resident / 1e9:.3g} GB) exceed the rectangle's "
      f"SRAM for tensors ({capacity / 1e9:.3g} GB)"
    )
  rows = []
  compute_total = io_total = time_total = 0.0
  for k in graph.kernels:
    c_fwd = kernel_cycles(machine, k, width, height, ratio, ("fwd",))
    c_bwd = kernel_cycles(machine, k, width, height, ratio, ("bwd",))
    if math.isinf(c_fwd) or math.isinf(c_bwd):
      return f"kernel {k.name!r}: no GEMM tile of this micro-batch fits in a PE's SRAM"
    w_bytes = k.weight_bytes()
    g_bytes = k.weight_elements() * machine.calib.gradient_bytes
    io_fwd = w_bytes / b_in
    has_bwd = k.has_phase("bwd")
    io_bwd = max(w_bytes / b_in, g_bytes / b_out) if has_bwd else 0.0
    t = max(c_fwd / f, io_fwd) + (max(c_bwd / f, io_bwd) if has_bwd else 0.0)
    compute = (c_fwd + c_bwd) / f
    scale = n_micro * k.count
    flops = scale * k.matmul_flops(ratio, ("fwd", "bwd"))
    rows.append(
      StreamingKernel(
        k.name, k.count, compute * scale, (io_fwd + io_bwd) * scale, t * scale, flops, w_bytes * k.count
      )
    )
    compute_total += compute * scale
    io_total += (io_fwd + io_bwd) * scale
    time_total += t * scale
  data_s = graph.input_bytes_per_sample * batch / b_in
  io_total += data_s
  time_total = max(time_total, data_s)
  first = next((k for k in graph.kernels if k.weights), None)
  boundary = 0.0
  # training, whichever kernel its backward work landed in (an embedding's gradient may be
  # grouped with the next layer's backward): every weight is updated
  if first is not None and graph.training:
    boundary = first.weight_bytes() / b_in + first.weight_elements() * machine.calib.gradient_bytes / b_out
    params = sum(k.count * k.weight_elements() for k in graph.kernels)
    boundary += params * machine.calib.optimizer_bytes_per_param / b_in + machine.calib.step_overhead_s
  swarmx = 2 * math.ceil(math.log2(num_csx)) * machine.calib.swarmx_level_latency_s if num_csx > 1 else 0.0
  return StreamingResult(
    micro_batch=mb,
    n_micro=n_micro,
    step_s=time_total + boundary + swarmx,
    compute_s=compute_total,
    io_s=io_total,
    boundary_s=boundary,
    swarmx_s=swarmx,
    resident_bytes=resident,
    kernels=rows,
    rejected={},
  )


def weight_streaming(
  graph: Graph,
  machine: Machine,
  system: System,
  width: int,
  height: int,
  batch_per_system: int,
  num_csx: int = 1,
  micro_batch: int | None = None,
) -> StreamingResult | str:
  """The fastest feasible micro-batch, or a string saying why none is feasible.

  Args:
    graph: the extracted kernels.
    machine: chip, calibration and numeric choices.
    system: the CS-X system (its I/O bandwidth).
    width, height: the rectangle every layer runs on.
    batch_per_system: samples per step on one system.
    num_csx: systems in data parallel (for the SwarmX latency).
    micro_batch: force this micro-batch (a supported size: see `supported_micro_batch`).
  """
  candidates = [micro_batch] if micro_batch else micro_batch_candidates(batch_per_system)
  best: StreamingResult | None = None
  rejected: dict[int, str] = {}
  for mb in candidates:
    res = _evaluate(graph, machine, system, width, height, batch_per_system, mb, num_csx)
    if isinstance(res, str):
      rejected[mb] = res
      continue
    if best is None or res.step_s < best.step_s:
      best = res
  if best is None:
    smallest = min(candidates)
    return f"no micro-batch fits on the wafer; at micro-batch {smallest}: {rejected[smallest]}"
  return dataclasses.replace(best, rejected=rejected)
