"""Weight-streaming mode: the layers run one after another over the whole rectangle.

Per micro-batch of ``mb`` samples and per kernel instance (``docs/references.md``, "Execution modes"):

    T_fwd = max(C_fwd / f, W / B_in)                  W: weight bytes, streamed in from MemoryX
    T_bwd = max(C_bwd / f, W / B_in, G / B_out)        G: gradient bytes, streamed out
    T_step = n_micro * (sum_k count_k * (T_fwd + T_bwd) + N_pass * tau) + T_boundary + T_swarmx

``C`` are the kernel's cycles on the rectangle from the mesh model, ``B_in = B_out`` the system's
I/O bandwidth, ``n_micro = ceil(batch_per_system / mb)``. ``tau`` (`Calibration.layer_latency_s`)
is the fixed latency of one layer's pass over a micro-batch, and ``N_pass`` the passes of one
micro-batch: each layer (a block's repetition, or another segment with weights) forward and
backward, and forward once more under nested checkpointing; it is counted per layer, not per kernel,
so it does not depend on how the step's code is split into kernels. Streaming the next layer's weights overlaps the
current layer's compute, hence the ``max``. The weight update runs on MemoryX; the only bubble is
at the iteration boundary (``T_boundary``): the first layer waits for its updated weights, and
MemoryX's optimizer pass over all ``P`` parameters, which cannot start before the last gradient
has arrived when the step clips by the global gradient norm (the modelzoo default), takes
``P * optimizer_bytes_per_param / B_memoryx`` with MemoryX's bandwidth taken equal to the system's
I/O bandwidth (the MemoryX glossary: its I/O "matches or exceeds" the CS-2's).

With ``num_csx`` systems the batch is split evenly (pure data parallelism); SwarmX broadcasts the
weights and reduces the gradients at line rate, adding ``2 * ceil(log2(num_csx))`` tree-level
latencies per step.

**Activation memory** (what stays on the wafer between a layer's forward and its backward pass).
The weights are not resident: each layer's weights stream through the rectangle while it computes,
their gradients stream out, and the optimizer state lives in MemoryX. What stays is what autodiff
keeps for the backward pass (`Kernel.saved`: the values the backward reads again, counted once
each, however the step is written). The layers come from the canonical layer graph
(`wafer.costmodel.graph.fold_repeats`): a *block* is a run of kernels with one ``count = L > 1``
(a ``scan`` or a folded loop: one transformer layer), every other run of consecutive kernels with a
backward pass (the embedding; the final norm, head and loss) is a segment of its own. For ``mb`` samples per micro-batch, per block
``g`` with ``L_g`` layers, ``S_g(mb)``: one layer's saved activations, ``Q_g(mb)`` the part of them
attention's core makes (`Kernel.saved_core`: the ``h s^2`` scores and probabilities of an
activation x activation product and its softmax), ``X_g(mb)``: the layer's checkpoint, the largest
tensor entering it from outside (the residual stream; what else enters is either computed from it
by the previous layer's last kernel, such as a norm that an unnamed grouping placed there, or
shared by every layer, such as a mask); ``S_o``, ``X_o`` the same for the other segments:

    M_full(mb) = S_o(mb) + sum_g L_g * S_g(mb)                                 every activation kept
    M_attn(mb) = S_o(mb) + sum_g L_g * (S_g(mb) - Q_g(mb))                      attention's core recomputed
    M_ckpt(mb) = sum_g L_g * X_g(mb) + sum_o X_o(mb) + max(S'_g(1), S'_o(1))    every segment recomputed
    M_nest(mb) = sum_g ceil(L_g / k_g) * X_g(mb) + max_g k_g * X_g(mb)            and every span's boundaries
                 + sum_o X_o(mb) + max(S'_g(1), S'_o(1))

A recomputation runs just before the backward that consumes it and, like that backward, sample by
sample (the samples of a micro-batch are independent, and the segment's weights, streamed in for
its backward, serve all of them), so only one sample's recomputed values are live: ``S'(1)``, one
sample's saved activations without attention's core. The core itself is never whole in memory:
fused attention produces and consumes its scores block by block (FlashAttention's forward and
backward keep ``O(s)`` per query block, not ``h s^2``), so a sequence is not limited by one sample's
score matrix (GPT-2 small's shape at 24,576 tokens would need 29 GB for it). The compiler takes the cheapest of the three that fits in ``A * s`` (``A`` PEs of ``s``
bytes of SRAM for tensors):

* ``M_full``: nothing recomputed, only for a step without an attention core;
* ``M_attn`` (*selective* recomputation, Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models", https://arxiv.org/abs/2205.05198): each layer's
  backward first recomputes its attention core from the kept ``Q``, ``K``, ``V``: the activation x
  activation products' forward cycles ``C_core`` (their FLOPs ``F_core``) are added to the kernel's
  backward. This is the baseline of any step with an attention core, whether ``M_full`` fits or
  not: attention runs fused, its ``h s^2`` scores and probabilities are never stored for the
  backward, whose kernel recomputes them (FlashAttention's backward, Dao et al. 2022,
  https://arxiv.org/abs/2205.14135; Cerebras' modelzoo builds attention from one fused
  scaled-dot-product kernel, ``attention_type: scaled_dot_product``). Measured alone on the
  published runs, leave-one-family-out: median x1.28 -> x1.22, worst x1.96 -> x1.90, the
  ESM-2 35M CS-3/CS-2 ratio x1.48 -> x1.20 of the measured (``docs/cost-model-accuracy.md``);
* ``M_ckpt`` (activation checkpointing at segment boundaries, the loss and head included: they are
  recomputed from their input, as a fused cross entropy never keeps the logits): the forward pass
  keeps only the boundaries and each segment's whole forward runs again just before its backward;
  each such kernel's backward costs ``max((C_fwd + C_bwd) / f, W / B_in, G / B_out)`` (its weights,
  streamed in once for the backward, serve the recomputation too).

* ``M_nest`` (nested checkpointing, Chen et al. 2016, "Training Deep Nets with Sublinear Memory
  Cost", https://arxiv.org/abs/1604.06174), only when the layer boundaries themselves do not fit:
  a block keeps every ``k_g``-th boundary (``k_g = round(sqrt(L_g))``, near the least of
  ``ceil(L / k) + k``); before a span's backward its ``k_g`` layers run forward again, their weights
  streamed in again (``max(C_fwd / f, W / B_in)`` more per layer), to rebuild its boundaries, then
  each layer recomputes as in ``M_ckpt``. Evidence: Cerebras' own micro-batches for GPT-3 2.7B,
  6.7B and 13B at 2,048 tokens (modelzoo 2.1-2.3 params files: 88, 104, 90) keep 30.7, 58 and 78
  GB of layer boundaries, more than a CS-2's 27.5 GB for tensors; how the real stack keeps them is
  not public, and this is the cheapest published mechanism that fits them.

The recomputed FLOPs (``n_micro * sum_k count_k * F_fwd,k`` for whole segments, ``F_core`` for
attention) are reported as a fraction of the model's FLOPs (``+N %``; about +33 % for whole
transformer layers, since backward = 2 x forward). A micro-batch that fits in none is rejected, with
the sizes.

The micro-batch is searched, as the Cerebras compiler does: every candidate must keep its
activations resident (recomputing when it must) and its GEMM tiles within each PE's SRAM (and, as
a what-if, hold at most `Calibration.max_micro_batch_tokens` tokens: `searched_micro_batches`); the
fastest feasible one wins. The candidates are the sizes Cerebras supports (releases 2.5 on,
"approximately even" micro-batches): ``mb = ceil(B / n)`` for ``n = 1 .. B`` micro-batches of the
``B`` samples per system, so the size need not divide ``B`` (``B = 1168`` can run 20 micro-batches
of 59 or 58). Every micro-batch is costed at ``mb`` samples, an upper bound that is off by less
than one sample per micro-batch.
"""

from __future__ import annotations

import dataclasses
import math

from wafer.costmodel.graph import Graph, Kernel, layer_runs, stacks
from wafer.costmodel.hardware import System
from wafer.costmodel.mesh import Machine, kernel_cycles
from wafer.errors import EstimateError

__all__ = (
  "ActivationMemory",
  "Rejection",
  "StreamingKernel",
  "StreamingResult",
  "activation_memory",
  "cost_micro_batches",
  "micro_batch_candidates",
  "searched_micro_batches",
  "ordinal",
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
  recompute_flops: float = 0.0


@dataclasses.dataclass(frozen=True)
class ActivationMemory:
  """The activation bytes of one micro-batch (see the module docstring).

  Attributes:
    full: ``M_full``, every saved activation of every layer.
    checkpointed: ``M_ckpt``, layer-boundary checkpoints plus one layer's working set (equal to
      ``full`` when the step has no repeated block: nothing to recompute).
    boundary: the checkpoints, ``sum_g L_g * X_g + sum_o X_o``; ``working_set``: one sample's
      ``max(S_g, S_o)``.
    recomputable: names of the kernels a recomputation of every layer runs again.
    attention: ``M_attn``, attention's core recomputed (equal to ``full`` without one).
    nested: ``M_nest``, only every ``span``-th layer boundary kept (``math.inf`` when no block has
      4 or more layers: it would keep no less than ``checkpointed``).
    span: layers per span of ``nested``, the largest block's ``round(sqrt(L))``.
  """

  full: float
  checkpointed: float
  boundary: float
  working_set: float
  recomputable: tuple[str, ...]
  attention: float = math.inf
  nested: float = math.inf
  span: int = 1

  def levels(self) -> list[str]:
    """The recomputations this step can run, cheapest first: ``""`` (none: only without an
    attention core, which runs fused and is always recomputed), ``"attention"``, ``"layers"``,
    ``"spans"``."""
    fused = self.attention < self.full
    deeper = ["layers"] + (["spans"] if self.nested < self.checkpointed else [])
    return ["attention" if fused else ""] + (deeper if self.recomputable else [])

  def level(self, capacity: float) -> str | None:
    """The cheapest of `levels` that fits in ``capacity`` bytes; None when none does."""
    return next((level for level in self.levels() if self.resident(level) <= capacity), None)

  def least(self) -> float:
    """The fewest bytes any of `levels` keeps: what a rectangle needs for this step to fit."""
    return min(self.resident(level) for level in self.levels())

  def resident(self, level: str) -> float:
    return {"": self.full, "attention": self.attention, "layers": self.checkpointed, "spans": self.nested}[
      level
    ]


def ordinal(n: int) -> str:
  """``1st``, ``2nd``, ``3rd``, ``4th``, ``11th``, ``21st``: for "every 3rd boundary".

  >>> [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 102)]
  ['1st', '2nd', '3rd', '4th', '11th', '12th', '13th', '21st', '102nd']
  """
  suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
  return f"{n}{suffix}"


def _blocks(graph: Graph) -> list[list[Kernel]]:
  """Runs of consecutive kernels with one ``count > 1``: the repeated layers."""
  out: list[list[Kernel]] = []
  for i, k in enumerate(graph.kernels):
    if k.count <= 1:
      continue
    if out and out[-1][-1] is graph.kernels[i - 1] and out[-1][0].count == k.count:
      out[-1].append(k)
    else:
      out.append([k])
  return out


def _entering(kernels: list[Kernel], ratio: float) -> float:
  """Bytes of the largest tensor entering a segment from outside it (its checkpoint)."""
  made = {key for k in kernels for key in k.act_out}
  entering = [v for k in kernels for key, v in k.act_in.items() if key not in made]
  return max((e * ratio**x * bits / 8 for e, x, bits in entering), default=0.0)


def activation_memory(graph: Graph, ratio: float) -> ActivationMemory:
  """`ActivationMemory` at ``batch = ratio * b0`` (``b0``: the traced batch)."""
  one = 1.0 / graph.traced_batch  # (one sample: the working set of a recomputation)
  blocks = _blocks(graph)
  in_block = {id(k) for b in blocks for k in b}
  single: list[list[Kernel]] = []  # consecutive other kernels with a backward: one segment (the head)
  for i, k in enumerate(graph.kernels):
    if id(k) in in_block or not k.has_phase("bwd"):
      continue
    if single and single[-1][-1] is graph.kernels[i - 1]:
      single[-1].append(k)
    else:
      single.append([k])
  others = sum(k.count * k.saved_bytes(ratio) for k in graph.kernels if id(k) not in in_block)
  full = others
  boundary = working = attention = 0.0
  fused = False  # a block with attention's core: it runs fused, its scores are never kept whole
  for b in blocks:
    layers = b[0].count
    inner = sum(k.saved_bytes(ratio) for k in b)
    full += layers * inner
    attention += layers * sum(k.saved_bytes(ratio, core=False) for k in b)
    fused |= any(k.saved_bytes(one, core=True) > 0 for k in b)
  kept = rebuilt = 0.0  # M_nest: each block keeps every span-th boundary, one span's are rebuilt
  span = 1
  for seg in blocks + single:
    if not any(k.has_phase("bwd") for k in seg):
      continue  # forward-only pieces (an element-wise chain grouped apart): no backward, no checkpoint
    layers, x = seg[0].count, _entering(seg, ratio)
    boundary += layers * x
    per = max(1, round(math.sqrt(layers)))  # ceil(L / per) + per boundaries: least near sqrt(L)
    kept += -(-layers // per) * x
    rebuilt = max(rebuilt, per * x if per > 1 else 0.0)
    span = max(span, per)
    working = max(working, sum(k.saved_bytes(one, core=False) for k in seg))
  names = tuple(k.name for seg in blocks + single for k in seg if k.has_phase("bwd"))
  checkpointed = min(full, boundary + working) if names else full
  nested = kept + rebuilt + working if names and span > 1 and kept + rebuilt < boundary else math.inf
  selective = others + attention if fused else full
  return ActivationMemory(full, checkpointed, boundary, working, names, selective, nested, span)


def _layer_passes(graph: Graph, level: str | None) -> int:
  """Passes of a layer over one micro-batch: each layer of a repeated stack and each stretch of
  other kernels with weights before, between or after the stacks (the embedding, the head: one
  segment each) runs forward once and, in training, backward once; under ``"spans"`` a stack's
  layers run forward once more to rebuild their span's boundaries.

  A stack is a run of consecutive kernels repeated more than once (``count > 1``), whatever their
  counts: a layer's sub-kernels may repeat more often than the layer (two FFNs a layer, an inner
  scan, attention's per-head products). Its layers are its outermost repetition with distinct
  weights: ``min(least count, most weight_instances)`` over its kernels with weights
  (`Kernel.weight_instances`; an RNN over time, one weight array, is one layer). Layers that differ
  in width, left unfolded, are found by their layout (`graph.layer_runs`): one pass each too. Counted
  per layer, not per kernel, so the count does not depend on how the code is split into kernels nor
  on the layers' widths (the canonical layer graph; a wider layer is never fewer passes). Known
  limits: names that defeat folding and layout alike leave one segment; a stack without weights has
  no pass. Two stacks with no kernel between them are told apart where their layers differ in size
  only (`graph.stacks`); otherwise they are one."""

  key = f"_layer_passes_{level}"  # (one graph, one count: computed once, not per micro-batch)
  cached = graph.__dict__.get(key)
  if cached is not None:
    return cached

  def close(kernels: list[Kernel]) -> int:  # (a run or stack without weights streams nothing: 0)
    # training updates every weight: a backward pass, whichever kernel got its work
    bwd = graph.training or any(k.has_phase("bwd") for k in kernels)
    if kernels[0].count <= 1:
      return sum(layers * (1 + bwd) for run, layers in layer_runs(kernels) if any(k.weights for k in run))
    per_pass = 1 + bwd + (level == "spans" and bwd)
    total = 0
    for stack in stacks(kernels):
      weighted = [k for k in stack if k.weights]
      if weighted:
        total += min(min(k.count for k in weighted), max(k.weight_instances for k in weighted)) * per_pass
    return total

  passes = 0
  run: list[Kernel] = []  # the current stretch (count 1) or stack (count > 1)
  for k in graph.kernels:
    if run and (run[0].count > 1) != (k.count > 1):
      passes += close(run)
      run = []
    run.append(k)
  passes += close(run) if run else 0
  graph.__dict__[key] = passes
  return passes


def _core(kernel: Kernel) -> Kernel:
  """A kernel of the forward activation x activation products of ``kernel`` (attention's core), to
  cost their recomputation (cached on the kernel)."""
  got = kernel.__dict__.get("_core")
  if got is None:
    mms = [m for m in kernel.matmuls if m.phase == "fwd" and not m.weight and m.instances.at_trace > 1]
    got = Kernel(name=kernel.name, count=kernel.count, order=kernel.order, matmuls=mms)
    kernel.__dict__["_core"] = got
  return got


@dataclasses.dataclass(frozen=True)
class Rejection:
  """Why one micro-batch is not feasible, with the numbers that decide it.

  Attributes:
    reason: the sentence the report prints (``str(rejection)``).
    kind: ``"memory"`` (the activations kept for the backward pass do not fit, whatever is
      recomputed) or ``"tile"`` (no GEMM tile of this micro-batch fits in a PE's SRAM).
    required_bytes: memory: the least the activations take (every one kept, or recomputing
      attention's core, or whole layers: the smallest of the levels this step has); None for a tile.
    available_bytes: memory: the rectangle's SRAM for tensors; None for a tile.
  """

  reason: str
  kind: str
  required_bytes: float | None = None
  available_bytes: float | None = None

  def __str__(self) -> str:
    return self.reason


@dataclasses.dataclass(frozen=True)
class StreamingResult:
  """A weight-streaming estimate for one step.

  Attributes:
    micro_batch: samples per micro-batch (per system).
    n_micro: micro-batches per step (per system).
    step_s: seconds per step; ``compute_s`` and ``io_s`` the compute-only and I/O-only times.
    boundary_s, swarmx_s: the iteration-boundary bubble and the SwarmX latency in ``step_s``.
    latency_s: the layers' fixed pass latencies in ``step_s`` (``n_micro * N_pass * tau``);
      ``layer_passes``: ``N_pass``, the layer passes of one micro-batch.
    resident_bytes: activation bytes kept on the wafer between forward and backward.
    kernels: per-kernel timings.
    rejected: micro-batches that were not feasible, with why.
    recompute: whether activations are recomputed (they do not all fit); ``recomputed``: what,
      ``"attention"`` (attention's core, before each layer's backward), ``"layers"`` (every
      layer's forward, from its boundary), ``"spans"`` (as ``"layers"``, and each span's forward
      once more to rebuild its boundaries), ``""`` for nothing.
    recompute_flops: FLOP per step (per system) of the recomputed forward passes; ``model_flops``:
      the step's forward and backward matrix-product FLOP per system without them.
    full_activation_bytes: what keeping every activation would take (``M_full``).
    span: layers per span when ``recomputed == "spans"``.
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
  rejected: dict[int, Rejection]
  latency_s: float = 0.0
  layer_passes: int = 0
  recompute: bool = False
  recompute_flops: float = 0.0
  model_flops: float = 0.0
  recomputed: str = ""
  full_activation_bytes: float = 0.0
  span: int = 1

  @property
  def recompute_fraction(self) -> float:
    """Recomputed FLOPs over the model's FLOPs (0.0 without recomputation)."""
    return self.recompute_flops / self.model_flops if self.model_flops > 0 else 0.0


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
  # ceil(batch / n) falls as n grows: the sizes either side of ``requested`` are those of
  # n = ceil(batch / requested) (at most it) and n - 1 (above it); no list of every size is needed
  requested = min(max(int(requested), 1), batch)
  n = -(-batch // requested)
  sizes = [-(-batch // n)] + ([-(-batch // (n - 1))] if n > 1 else [])
  return min(sizes, key=lambda v: (abs(v - requested), -v))


_ENUMERATED = 10**7
"""Up to this many samples per system the micro-batch search thins the list of every supported size;
above it (a list of millions), it picks the sizes nearest log-spaced targets directly."""


def micro_batch_candidates(batch: int, limit: int = 200) -> list[int]:
  """`supported_micro_batches`, thinned to about ``limit`` roughly log-spaced sizes (``batch`` included)."""
  if batch > _ENUMERATED:  # (2 sqrt(batch) sizes: a batch of 10**12 took 90 s, 2**63 never ended)
    targets = (math.exp(math.log(batch) * i / (limit - 1)) for i in range(limit))
    return sorted({1, batch} | {supported_micro_batch(batch, round(t)) for t in targets})
  sizes = supported_micro_batches(batch)
  if len(sizes) <= limit:
    return sizes
  picked = {sizes[0], sizes[-1]}
  for i in range(limit):
    target = math.exp(math.log(batch) * i / (limit - 1))
    picked.add(min(sizes, key=lambda d: abs(math.log(d) - math.log(target))))
  return sorted(picked)


def searched_micro_batches(graph: Graph, machine: Machine, batch: int) -> tuple[list[int], int | None]:
  """``(sizes, cap)``: the micro-batches the compiler's own search tries for ``batch`` samples per
  system, `micro_batch_candidates` at most `Calibration.max_micro_batch_tokens` tokens each
  (``mb * graph.sequence_length``; ``[1]`` when even one sample is over it), and that cap where it
  left a larger size out (else None). A step without a sequence axis, or a cap of 0, is not capped;
  a micro-batch the user gives is not searched, so not capped either.

  >>> from types import SimpleNamespace as NS
  >>> m = NS(calib=NS(max_micro_batch_tokens=2**18))
  >>> sizes, cap = searched_micro_batches(NS(sequence_length=2048), m, 1024)
  >>> sizes[-3:], cap
  ([103, 114, 128], 262144)
  >>> searched_micro_batches(NS(sequence_length=None), m, 1024)[0][-1]
  1024
  """
  sizes = micro_batch_candidates(batch)
  cap, seq = machine.calib.max_micro_batch_tokens, graph.sequence_length
  if not cap or not seq:
    return sizes, None
  kept = [m for m in sizes if m * seq <= cap] or [1]
  return kept, (cap if kept[-1] < sizes[-1] else None)


def _evaluate(
  graph: Graph,
  machine: Machine,
  system: System,
  width: int,
  height: int,
  batch: int,
  mb: int,
  num_csx: int,
  recompute: bool | str | None = None,
) -> StreamingResult | Rejection:
  f = machine.clock_hz
  b_in = b_out = system.io_bytes_per_sec
  ratio = mb / graph.traced_batch
  n_micro = -(-batch // mb)
  capacity = width * height * machine.sram_data_bytes
  mem = activation_memory(graph, ratio)
  if recompute is None:
    level = mem.level(capacity)
  else:
    level = {False: "", True: "layers"}.get(recompute, recompute)  # type: ignore[call-overload]
    if level == "spans" and not mem.nested < mem.checkpointed:
      level = "layers"
    if (
      level in ("layers", "spans")
      and not mem.recomputable
      or level == "attention"
      and not mem.attention < mem.full
    ):
      level = ""
    if mem.resident(level) > capacity:
      level = None
  if level is None:
    how = f"; {mem.attention / 1e9:.3g} GB recomputing attention's scores" if mem.attention < mem.full else ""
    how += (
      f"; {mem.checkpointed / 1e9:.3g} GB recomputing each layer from its boundary"
      if mem.recomputable
      else "; nothing to recompute"
    )
    if mem.recomputable and mem.nested < mem.checkpointed:
      how += f"; {mem.nested / 1e9:.3g} GB keeping every {ordinal(mem.span)} boundary"
    return Rejection(
      f"activations kept for the backward pass ({mem.full / 1e9:.3g} GB{how}) exceed the rectangle's "
      f"SRAM for tensors ({capacity / 1e9:.3g} GB)",
      "memory",
      required_bytes=mem.least(),
      available_bytes=capacity,
    )
  resident = mem.resident(level)
  again = set(mem.recomputable) if level else set()
  # each layer's pass over the micro-batch starts after a fixed latency (Calibration.layer_latency_s)
  passes = _layer_passes(graph, level)
  latency = n_micro * passes * machine.calib.layer_latency_s
  rows = []
  compute_total = io_total = time_total = model_flops = recompute_flops = 0.0
  for k in graph.kernels:
    c_fwd = kernel_cycles(machine, k, width, height, ratio, ("fwd",))
    c_bwd = kernel_cycles(machine, k, width, height, ratio, ("bwd",))
    if math.isinf(c_fwd) or math.isinf(c_bwd):
      return Rejection(f"kernel {k.name!r}: no GEMM tile of this micro-batch fits in a PE's SRAM", "tile")
    has_bwd = k.has_phase("bwd")
    c_again, part = 0.0, k
    if k.name in again and has_bwd:
      part = _core(k) if level == "attention" else k
      c_again = c_fwd if part is k else kernel_cycles(machine, part, width, height, ratio, ("fwd",))
    w_bytes = k.weight_bytes()
    g_bytes = k.weight_elements() * machine.calib.gradient_bytes
    io_fwd = w_bytes / b_in
    io_bwd = max(w_bytes / b_in, g_bytes / b_out) if has_bwd else 0.0
    # "spans": a layer of a block runs forward once more, its weights streamed in again, to rebuild
    # its span's boundaries before the span's backward
    rebuild = 1 if level == "spans" and c_again and k.count > 1 else 0
    t = (1 + rebuild) * max(c_fwd / f, io_fwd) + (max((c_bwd + c_again) / f, io_bwd) if has_bwd else 0.0)
    compute = ((1 + rebuild) * c_fwd + c_bwd + c_again) / f
    scale = n_micro * k.count
    flops = scale * k.model_flops(ratio)  # (a jax.checkpoint recomputation is work, not model FLOPs)
    again_flops = (1 + rebuild) * scale * part.matmul_flops(ratio, ("fwd",)) if c_again else 0.0
    io = io_bwd + (1 + rebuild) * io_fwd
    rows.append(
      StreamingKernel(
        k.name,
        k.count,
        compute * scale,
        io * scale,
        t * scale,
        flops,
        w_bytes * k.count,
        again_flops,
      )
    )
    compute_total += compute * scale
    io_total += io * scale
    time_total += t * scale
    model_flops += flops
    recompute_flops += again_flops
  time_total += latency
  data_s = graph.input_bytes_per_sample * batch / b_in
  io_total += data_s
  time_total = max(time_total, data_s)
  first = next((k for k in graph.kernels if k.weights), None)
  boundary = 0.0
  # training, whichever kernel its backward work landed in (an embedding's gradient may be
  # grouped with the next layer's backward): every weight is updated
  if graph.training:  # every training step pays the per-step cost, whatever its kernels read
    params = graph.param_elements  # each parameter once (a tied embedding is read by two kernels)
    boundary = params * machine.calib.optimizer_bytes_per_param / b_in + machine.calib.step_overhead_s
    if first is not None:
      boundary += first.weight_bytes() / b_in + first.weight_elements() * machine.calib.gradient_bytes / b_out
  swarmx = 2 * math.ceil(math.log2(num_csx)) * machine.calib.swarmx_level_latency_s if num_csx > 1 else 0.0
  return StreamingResult(
    micro_batch=mb,
    n_micro=n_micro,
    step_s=time_total + boundary + swarmx,
    compute_s=compute_total,
    io_s=io_total,
    boundary_s=boundary,
    swarmx_s=swarmx,
    latency_s=latency,
    layer_passes=passes,
    resident_bytes=resident,
    kernels=rows,
    rejected={},
    recompute=bool(again),
    recomputed=level,
    span=mem.span,
    recompute_flops=recompute_flops,
    model_flops=model_flops,
    full_activation_bytes=mem.full,
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
  recompute: bool | str | None = None,
) -> StreamingResult | str:
  """The fastest feasible micro-batch of the compiler's search (`searched_micro_batches`), or a
  string saying why none is feasible.

  Args:
    graph: the extracted kernels.
    machine: chip, calibration and numeric choices.
    system: the CS-X system (its I/O bandwidth).
    width, height: the rectangle every layer runs on.
    batch_per_system: samples per step on one system.
    num_csx: systems in data parallel (for the SwarmX latency).
    micro_batch: force this micro-batch (a supported size: see `supported_micro_batch`).
    recompute: force recomputing every layer (True or ``"layers"``), every layer and the spans'
      boundaries (``"spans"``), attention's core (``"attention"``) or nothing (False); None, the
      compiler's choice: the cheapest that fits.
  """
  candidates = [micro_batch] if micro_batch else searched_micro_batches(graph, machine, batch_per_system)[0]
  fits, rejected = cost_micro_batches(
    graph, machine, system, width, height, batch_per_system, candidates, num_csx, recompute
  )
  if not fits:
    smallest = min(candidates)
    return f"no micro-batch fits on the wafer; at micro-batch {smallest}: {rejected[smallest]}"
  best = min(fits.values(), key=lambda r: r.step_s)  # the first of the fastest, in candidate order
  return dataclasses.replace(best, rejected=rejected)


def cost_micro_batches(
  graph: Graph,
  machine: Machine,
  system: System,
  width: int,
  height: int,
  batch_per_system: int,
  candidates: list[int],
  num_csx: int = 1,
  recompute: bool | str | None = None,
) -> tuple[dict[int, StreamingResult], dict[int, Rejection]]:
  """Every candidate micro-batch costed: ``(fits, rejected)``, the results of those that fit and why
  each other one does not, both in candidate order (arguments as in `weight_streaming`)."""
  if recompute not in (None, False, True, "attention", "layers", "spans"):
    raise EstimateError(
      f"recompute={recompute!r}; allowed: None, False, True, 'attention', 'layers', 'spans'"
    )
  fits: dict[int, StreamingResult] = {}
  rejected: dict[int, Rejection] = {}
  for mb in candidates:
    res = _evaluate(graph, machine, system, width, height, batch_per_system, mb, num_csx, recompute)
    if isinstance(res, Rejection):
      rejected[mb] = res
    else:
      fits[mb] = res
  return fits, rejected
