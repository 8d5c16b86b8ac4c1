"""`wafer.estimate`: how fast a JAX step would train on a Cerebras system, and where the time goes."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import precision
from wafer.config.schema import batch_split_problem
from wafer.costmodel import graph as graph_mod
from wafer.costmodel.calibration import ACCURACY, CALIBRATION, Calibration
from wafer.costmodel.hardware import System, get_system
from wafer.costmodel.mesh import ALGORITHMS, Machine
from wafer.costmodel.pipeline import PipelineResult, layer_pipelined
from wafer.costmodel.placement import Rect
from wafer.costmodel.report import KernelRow, Report
from wafer.costmodel.streaming import StreamingResult, supported_micro_batch, weight_streaming
from wafer.errors import EstimateError

__all__ = ("MODES", "EstimateError", "estimate", "estimate_graph")

MODES = ("auto", "pipeline", "weight_streaming")
_MODE_ALIASES = {
  "layer_pipelined": "pipeline",
  "pipelined": "pipeline",
  "ws": "weight_streaming",
  "weight-streaming": "weight_streaming",
}


def _positive_int(name: str, value: Any) -> int:
  if isinstance(value, bool):
    raise EstimateError(f"{name}={value!r}; allowed: a positive integer")
  try:
    out = operator.index(value)
  except TypeError:
    raise EstimateError(f"{name}={value!r}; allowed: a positive integer") from None
  if out < 1:
    raise EstimateError(f"{name}={value!r}; allowed: a positive integer")
  return out


def _format(name: str, value: Any) -> precision.FloatFormat:
  if isinstance(value, precision.FloatFormat):
    return value
  try:
    return precision.get_format(value)
  except (ValueError, TypeError) as exc:
    raise EstimateError(f"{name}={value!r} is not a float format: {exc}") from None


def _accumulate_format(value: Any) -> precision.FloatFormat:
  """The accumulator format: 16 bits or wider (the WSE's FMAC accumulates in FP16 or FP32)."""
  fmt = _format("accumulate_format", value)
  if fmt.bits < 16:
    raise EstimateError(
      f"accumulate_format={value!r}: the WSE has no {fmt.bits}-bit accumulator (its FMAC accumulates in 16 "
      "or 32 bits); allowed: 'float32' (Cerebras mixed precision) or a 16-bit format such as 'float16'"
    )
  return fmt


def _policy(policy: Any) -> Any:
  """A policy string parsed (``"c=bf16"``), a policy object as it is; anything else an `EstimateError`."""
  if isinstance(policy, str):
    try:
      return precision.Policy.parse(policy)
    except ValueError as exc:
      raise EstimateError(f"policy={policy!r} is not a precision policy: {exc}") from None
  if policy is not None and getattr(policy, "compute", None) is None:
    raise EstimateError(
      f"policy={policy!r}; allowed: a precision.Policy (anything with .compute) or a policy string such "
      "as 'c=bf16'"
    )
  return policy


def estimate(
  step_fn: Callable[..., Any],
  *example_args: Any,
  batch_size: int | None = None,
  system: str | System = "wse2",
  mode: str = "auto",
  num_csx: int = 1,
  compute_format: str | precision.FloatFormat | None = None,
  policy: Any = None,
  accumulate_format: str | precision.FloatFormat = "float32",
  micro_batch_size: int | None = None,
  batch_argnums: int | Sequence[int] | None = None,
  kernel_depth: int | None = None,
  rect: tuple[int, int] | None = None,
  gemm_algorithm: str = "search",
  calibration: Calibration | None = None,
  clock_hz: float | None = None,
  name: str | None = None,
) -> Report:
  """Estimate the training (or inference) rate of ``step_fn`` on a Cerebras wafer.

  The step is traced with abstract inputs (nothing is computed or allocated), its equations are
  grouped into kernels, and the kernels are costed on the wafer's PE grid in layer-pipelined mode
  (a rectangle per kernel) or weight-streaming mode (every layer over the whole wafer, weights
  streamed from MemoryX). See ``wafer/costmodel/*.py`` for the formulas.

  Args:
    step_fn: any JAX function, typically ``step(params, opt_state, batch)``. A function wrapped by
      ``precision.autocast`` (it has ``.policy`` and ``.__wrapped__``) is unwrapped and its policy's
      compute format is used.
    *example_args: arrays or `jax.ShapeDtypeStruct` pytrees with the shapes of one step.
    batch_size: samples per step (all systems); default: axis 0 of the batch arguments.
    system: ``"wse2"`` (CS-2), ``"wse3"`` (CS-3) or ``"wse1"`` (CS-1).
    mode: ``"auto"`` (the faster mode that fits), ``"pipeline"`` (layer pipelined) or
      ``"weight_streaming"``.
    num_csx: systems in data parallel (weight streaming only); ``batch_size`` must divide evenly.
    compute_format: format of matrix-product operands and activations (name or
      `precision.FloatFormat`): 16-bit formats run at the 16-bit SIMD rate, wider ones at the FP32
      rate. Default: the policy's compute format, else ``"cbfloat16"``.
    policy: a ``precision.Policy`` (anything with ``.compute``) or a policy string (``"c=bf16"``,
      `precision.Policy.parse`) giving the compute format.
    accumulate_format: accumulator format of matrix products (``"float32"``: Cerebras mixed
      precision; ``"float16"``: half-precision FMAC).
    micro_batch_size: force the micro-batch (weight streaming) or wave size (pipeline), at most the
      samples per system. Weight streaming runs the supported size nearest it, ``ceil(B / n)`` for
      ``B`` samples per system (as Cerebras does; the report's notes say when it differs).
    batch_argnums: which arguments carry the batch on axis 0. Default: every argument whose arrays
      all have, as axis 0, the batch size (axis 0 of the last argument with arrays): data, labels,
      masks, per-sample keys. The report lists them (``Report.batch_arguments``).
    kernel_depth: keep at most this many scope names per kernel (coarser kernels).
    rect: ``(width, height)`` of the PE rectangle to use (default: the chip's usable grid).
    gemm_algorithm: ``"search"`` (best mapping, as the Cerebras compiler explores layouts) or
      ``"meshgemm"`` (WaferLLM's MeshGEMM).
    calibration: calibration parameters (default `CALIBRATION`); ``clock_hz`` overrides its clock.
    name: name shown in the report.

  Returns:
    A `Report` (``samples_per_sec``, ``compute_samples_per_sec``, ``transmission_samples_per_sec``,
    ``active_pes``, ``compute_utilization``, ``kernels``...). A model that does not fit in the
    requested mode gives a report with ``fits=False`` and the reason.

  Raises:
    EstimateError: an unusable argument (the message names it, the value and what is allowed).
    wafer.errors.TraceError: the function could not be traced.
  """
  sys_, mode, num_csx = _check_run(system, mode, num_csx, gemm_algorithm)  # fail fast, before tracing
  if kernel_depth is not None:
    kernel_depth = _positive_int("kernel_depth", kernel_depth)
  if hasattr(step_fn, "policy") and hasattr(step_fn, "__wrapped__"):  # precision.autocast wrapper
    policy = step_fn.policy if policy is None else policy
    step_fn = step_fn.__wrapped__
  if not callable(step_fn):
    raise EstimateError(f"step_fn={step_fn!r} is not callable")
  policy = _policy(policy)
  if compute_format is None:
    compute_format = getattr(policy, "compute", None) or "cbfloat16"
  compute = _format("compute_format", compute_format)
  accumulate = _accumulate_format(accumulate_format)
  calib = calibration or CALIBRATION
  if not isinstance(calib, Calibration):
    raise EstimateError(f"calibration={calib!r}; allowed: a wafer.costmodel.Calibration")
  if clock_hz is not None:
    if not isinstance(clock_hz, (int, float)) or isinstance(clock_hz, bool) or not clock_hz > 0:
      raise EstimateError(f"clock_hz={clock_hz!r}; allowed: a positive frequency in Hz")
    calib = calib.replace(clock_hz=float(clock_hz))
  names = _arg_names(step_fn, len(example_args))
  argnums = _argnums(batch_argnums, example_args, names)
  width, height = _rect(rect, sys_.chip.usable_width, sys_.chip.usable_height)
  if batch_size is not None:
    batch_size = _positive_int("batch_size", batch_size)
  if micro_batch_size is not None:
    micro_batch_size = _positive_int("micro_batch_size", micro_batch_size)

  compute_bits = 16 if compute.bits <= 16 else 32
  graph = graph_mod.extract(
    step_fn,
    example_args,
    batch_argnums=argnums,
    compute_bits=compute_bits,
    kernel_depth=kernel_depth,
    arg_names=names,
  )
  graph.sequence_length = _sequence_length(example_args, argnums)
  return estimate_graph(
    graph,
    batch_size=batch_size,
    system=sys_,
    mode=mode,
    num_csx=num_csx,
    compute_format=compute,
    accumulate_format=accumulate,
    micro_batch_size=micro_batch_size,
    rect=(width, height),
    gemm_algorithm=gemm_algorithm,
    calibration=calib,
    name=name or getattr(step_fn, "__name__", "step"),
  )


def _check_run(system: Any, mode: Any, num_csx: Any, gemm_algorithm: Any) -> tuple[System, str, int]:
  """Validate the arguments that describe the run; returns ``(system, mode, num_csx)``."""
  sys_ = _system(system)
  mode = _mode(mode)
  num_csx = _positive_int("num_csx", num_csx)
  if num_csx > sys_.max_systems:
    raise EstimateError(
      f"num_csx={num_csx}; allowed: 1 to {sys_.max_systems} {sys_.name} systems (SwarmX limit)"
    )
  if mode == "pipeline" and num_csx > 1:
    raise EstimateError(
      f"num_csx={num_csx} with mode='pipeline'; layer-pipelined execution runs on one system "
      "(use mode='weight_streaming' for data parallel systems)"
    )
  if gemm_algorithm not in ALGORITHMS:
    raise EstimateError(f"gemm_algorithm={gemm_algorithm!r}; allowed: {', '.join(map(repr, ALGORITHMS))}")
  return sys_, mode, num_csx


def estimate_graph(
  graph: graph_mod.Graph,
  *,
  batch_size: int | None = None,
  system: str | System = "wse2",
  mode: str = "auto",
  num_csx: int = 1,
  compute_format: str | precision.FloatFormat = "cbfloat16",
  accumulate_format: str | precision.FloatFormat = "float32",
  micro_batch_size: int | None = None,
  rect: tuple[int, int] | None = None,
  gemm_algorithm: str = "search",
  calibration: Calibration | None = None,
  name: str = "step",
) -> Report:
  """`estimate` for an already extracted `Graph` (no tracing): cost it under other systems, modes or
  calibrations. ``compute_format`` only names the format in the report here: the operand widths were
  fixed at extraction. Arguments as in `estimate`."""
  sys_, mode, num_csx = _check_run(system, mode, num_csx, gemm_algorithm)
  compute = _format("compute_format", compute_format)
  accumulate = _accumulate_format(accumulate_format)
  calib = calibration or CALIBRATION
  chip = sys_.chip
  width, height = _rect(rect, chip.usable_width, chip.usable_height)
  batch = graph.traced_batch if batch_size is None else _positive_int("batch_size", batch_size)
  problem = batch_split_problem(batch, num_csx, "num_csx")
  if problem is not None:
    raise EstimateError(f"batch_size={batch}: {problem}")
  per_system = batch // num_csx
  notes_extra = []
  ws_micro_batch = micro_batch_size
  if micro_batch_size is not None:
    micro_batch_size = _positive_int("micro_batch_size", micro_batch_size)
    if micro_batch_size > per_system:
      raise EstimateError(
        f"micro_batch_size={micro_batch_size} is larger than the {per_system} samples per system; "
        f"allowed: 1 to {per_system} (batch_size / num_csx)"
      )
    ws_micro_batch = supported_micro_batch(per_system, micro_batch_size)
    if ws_micro_batch != micro_batch_size and mode != "pipeline":
      notes_extra.append(
        f"micro_batch_size={micro_batch_size} is not a size {per_system} samples split into evenly "
        f"(ceil({per_system} / n)); weight streaming uses {ws_micro_batch}, as Cerebras does"
      )
  if not any(k.has_phase("fwd") or k.has_phase("bwd") for k in graph.kernels):
    taken = ", ".join(graph.batch_arguments) or "none"
    raise EstimateError(
      f"the step does no work per sample: nothing it computes depends on its batch arguments ({taken}), "
      "so it has no rate; pass batch_argnums= naming the arguments that carry the data on axis 0"
    )
  if compute.bits < 16:
    notes_extra.append(
      f"compute format {compute.name}: the WSE has no {compute.bits}-bit floating-point datapath; "
      "its products are costed at the 16-bit SIMD rate"
    )
  machine = Machine(chip, calib, 16 if accumulate.bits <= 16 else 32, gemm_algorithm)

  pipe: PipelineResult | None = None
  ws: StreamingResult | str | None = None
  if mode in ("auto", "pipeline") and num_csx == 1:
    pipe = layer_pipelined(graph, machine, sys_, width, height, batch, micro_batch_size)
  if mode in ("auto", "weight_streaming"):
    ws = weight_streaming(graph, machine, sys_, width, height, per_system, num_csx, ws_micro_batch)

  chosen, reason, alternatives = _choose(mode, pipe, ws, num_csx, graph.param_elements, batch)
  common = dict(
    name=name,
    system=sys_.key,
    system_name=sys_.name,
    chip=chip.name,
    batch_size=batch,
    num_csx=num_csx,
    total_pes=chip.fabric_pes,
    grid=(width, height),
    fabric=(chip.fabric_width, chip.fabric_height),
    offset=(chip.io_margin_width // 2 + 1, chip.io_margin_height // 2),
    compute_format=compute.name,
    accumulate_format=accumulate.name,
    clock_hz=calib.clock_hz,
    calibration=calib,
    flops_per_sample=graph.flops_per_sample(),
    peak_flops_per_sec=num_csx
    * width
    * height
    * chip.peak_flops_per_cycle(graph.compute_bits)
    * calib.clock_hz,
    alternatives=alternatives,
    mode_reason=reason,
    batch_arguments=graph.batch_arguments,
    accuracy=ACCURACY,
  )
  notes = list(graph.notes) + notes_extra
  if not graph.training:
    notes.append("no backward pass: costed as inference (forward only, no weight update)")
  seq = graph.sequence_length
  if chosen == "pipeline":
    assert pipe is not None
    return _pipeline_report(pipe, graph, common, notes, seq)
  assert ws is not None
  return _streaming_report(ws, graph, common, notes, seq, width, height, per_system)


def _system(system: Any) -> System:
  try:
    return get_system(system)
  except ValueError as exc:
    raise EstimateError(str(exc)) from None


def _mode(mode: Any) -> str:
  key = _MODE_ALIASES.get(str(mode).lower(), str(mode).lower()) if isinstance(mode, str) else mode
  if key not in MODES:
    raise EstimateError(f"mode={mode!r}; allowed: {', '.join(map(repr, MODES))}")
  return key


def _arg_names(step_fn: Callable[..., Any], n_args: int) -> tuple[str, ...]:
  """The example arguments' names from the step's signature (``argument i`` where it has none)."""
  import inspect

  try:
    params = list(inspect.signature(step_fn).parameters.values())
  except (TypeError, ValueError):
    params = []
  names = []
  for i in range(n_args):
    p = params[i] if i < len(params) else None
    ok = p is not None and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    names.append(p.name if ok else f"argument {i}")
  return tuple(names)


def _leading_axes(arg: Any) -> list[int | None]:
  """Axis 0 of every array leaf of one argument (None where it has no batch axis:
  `wafer.costmodel.graph.batch_axis`)."""
  import jax

  return [graph_mod.batch_axis(leaf) for leaf in jax.tree.leaves(arg) if hasattr(leaf, "shape")]


def _argnums(
  batch_argnums: int | Sequence[int] | None, args: Sequence[Any], names: Sequence[str]
) -> tuple[int, ...]:
  """The batch arguments. Default: the batch size is axis 0 of the last argument that has arrays
  with a batch axis (scalars and a raw PRNG key beside them are per-step values, not samples), and
  every argument whose arrays all have that axis 0 is a batch argument (data, labels, masks,
  per-sample keys); the others (parameters, optimizer state, a shared key) are not."""
  n_args = len(args)
  if n_args == 0:
    raise EstimateError("estimate needs example arguments: estimate(step_fn, *example_args, ...)")
  if batch_argnums is None:
    axes = [_leading_axes(a) for a in args]
    last = next((i for i in reversed(range(n_args)) if any(a is not None for a in axes[i])), None)
    if last is None:
      raise EstimateError(
        "none of the example arguments holds an array with a batch axis, so there is no batch to cost; "
        "pass arrays or jax.ShapeDtypeStruct values with the batch on axis 0"
      )
    batched = [a for a in axes[last] if a is not None]
    b = batched[0]
    if any(a != b for a in batched):
      scalars = [names[i] for i in range(last + 1, n_args) if axes[i]]
      skipped = f" (skipped for holding no batch axis: {', '.join(scalars)})" if scalars else ""
      raise EstimateError(
        f"the last argument with arrays, {names[last]}, is taken as the batch{skipped} but its arrays do "
        f"not share an axis 0 (axis 0 sizes {sorted(set(batched))}); "
        "pass batch_argnums= naming the data arguments"
      )
    others = (i for i in range(n_args) if i != last and axes[i] and all(a == b for a in axes[i]))
    return tuple(sorted({last, *others}))
  nums = (batch_argnums,) if isinstance(batch_argnums, int) else tuple(batch_argnums)
  out = []
  for i in nums:
    if isinstance(i, bool) or not isinstance(i, int) or not -n_args <= i < n_args:
      raise EstimateError(
        f"batch_argnums={batch_argnums!r}; allowed: positions 0..{n_args - 1} of the example arguments"
      )
    out.append(i % n_args)
  return tuple(sorted(set(out)))


def _rect(rect: tuple[int, int] | None, max_w: int, max_h: int) -> tuple[int, int]:
  if rect is None:
    return max_w, max_h
  try:
    w, h = (operator.index(v) for v in rect)
  except (TypeError, ValueError):
    raise EstimateError(f"rect={rect!r}; allowed: (width, height) in PEs") from None
  if not (1 <= w <= max_w and 1 <= h <= max_h):
    raise EstimateError(f"rect={rect!r}; allowed: 1..{max_w} x 1..{max_h} PEs on this chip")
  return w, h


def _sequence_length(args: Sequence[Any], argnums: Sequence[int]) -> int | None:
  """Axis 1 of the first batch array that holds a sequence: integer token ids ``[batch, seq]`` or
  float ``[batch, seq, features]``. Other arrays have no sequence axis (a float ``[batch, features]``
  is an MLP's input, ``[batch, h, w, c]`` an image), and without a sequence there is no tokens/s."""
  import jax
  import jax.numpy as jnp

  for i in argnums:
    for leaf in jax.tree.leaves(args[i]):
      shape = getattr(leaf, "shape", ())
      dtype = getattr(leaf, "dtype", jnp.float32)
      if (len(shape) == 2 and jnp.issubdtype(dtype, jnp.integer)) or (
        len(shape) == 3 and jnp.issubdtype(dtype, jnp.floating)
      ):
        return int(shape[1])
  return None


def _choose(
  mode: str,
  pipe: PipelineResult | None,
  ws: StreamingResult | str | None,
  num_csx: int,
  params: int,
  batch: int,
) -> tuple[str, str, dict[str, Any]]:
  """The mode, a sentence saying which mode Cerebras would use and why, and the other mode's rate.

  Cerebras' rule (``docs/references.md``, "Execution modes"): layer pipelined when the whole model, its
  optimizer state and the activations in flight fit in the wafer's SRAM (a single system; "below
  ~1B parameters"), weight streaming otherwise or for several systems; where both fit, the faster.
  """
  size = f"{params / 1e9:.3g}B parameters" if params >= 1e9 else f"{params / 1e6:.3g}M parameters"
  if mode == "pipeline":
    alt: dict[str, Any] = {}
    return "pipeline", "requested", alt
  if mode == "weight_streaming":
    return "weight_streaming", "requested", {}
  ws_rate = None if ws is None or isinstance(ws, str) else ws.step_s
  if pipe is None:
    return (
      "weight_streaming",
      f"Cerebras would stream weights: {num_csx} systems run data parallel only in weight streaming",
      {},
    )
  if not pipe.fits:
    return (
      "weight_streaming",
      f"Cerebras would stream weights: layer pipelined does not fit ({size}; {pipe.reason})",
      {"pipeline": pipe.reason},
    )
  if ws_rate is None:
    return (
      "pipeline",
      f"Cerebras would pipeline the layers: weight streaming does not fit ({ws})",
      {"weight_streaming": ws},
    )
  assert isinstance(ws, StreamingResult)
  batch_rate = batch / ws.step_s  # one system here: the pipeline runs on one
  if pipe.samples_per_sec >= batch_rate:
    return (
      "pipeline",
      f"Cerebras would pipeline the layers: the model ({size}) fits on the wafer and pipelined is "
      f"{pipe.samples_per_sec / batch_rate:.2f}x faster than weight streaming",
      {"weight_streaming": batch_rate},
    )
  return (
    "weight_streaming",
    f"Cerebras would stream weights: the model ({size}) fits layer pipelined, but weight streaming "
    f"is {batch_rate / pipe.samples_per_sec:.2f}x faster at this batch",
    {"pipeline": pipe.samples_per_sec},
  )


def _pipeline_report(
  pipe: PipelineResult, graph: graph_mod.Graph, common: dict[str, Any], notes: list[str], seq: int | None
) -> Report:
  units_by_kernel: dict[str, list[Any]] = {}
  for u in pipe.units:
    units_by_kernel.setdefault(u.kernel, []).append(u)
  rows = []
  total_area = sum(u.rect.area for u in pipe.units) or 1
  busy = 0.0
  for k in graph.kernels:
    us = units_by_kernel.get(k.name)
    if not us:
      continue
    comp = min(u.compute_samples_per_sec for u in us)
    trans = min(u.transmission_samples_per_sec for u in us)
    area = sum(u.rect.area for u in us)
    util = sum(u.rect.area * min(1.0, pipe.samples_per_sec / u.compute_samples_per_sec) for u in us) / area
    busy += util * area
    rows.append(
      KernelRow(
        k.name,
        k.count,
        min(comp, trans),
        comp,
        trans,
        area,
        util,
        k.count * k.matmul_flops(1 / graph.traced_batch, ("fwd", "bwd")),
        k.count * k.weight_bytes(),
        area / total_area,
      )
    )
  fits = pipe.fits
  rate = pipe.samples_per_sec if fits else 0.0
  details = {
    "sequence_length": seq,
    "training": graph.training,
    "memory_bytes": pipe.memory_bytes,
    "needed_pes": pipe.needed_pes,
    "update_s": pipe.update_s,
    "wave": pipe.wave,
  }
  return Report(
    mode="pipeline",
    fits=fits,
    reason=pipe.reason,
    micro_batch_size=pipe.wave,
    samples_per_sec=rate,
    compute_samples_per_sec=pipe.compute_samples_per_sec if fits else 0.0,
    transmission_samples_per_sec=pipe.transmission_samples_per_sec if fits else 0.0,
    active_pes=sum(u.rect.area for u in pipe.units),
    compute_utilization=busy / total_area if fits else 0.0,
    step_time_s=common["batch_size"] / rate if rate else math.inf,
    kernels=tuple(rows),
    placement=tuple(u.rect for u in pipe.units),
    details=details,
    notes=tuple(notes),
    **common,
  )


def _streaming_report(
  ws: StreamingResult | str,
  graph: graph_mod.Graph,
  common: dict[str, Any],
  notes: list[str],
  seq: int | None,
  width: int,
  height: int,
  per_system: int,
) -> Report:
  batch = common["batch_size"]
  rect = Rect(0, 0, width, height, "all layers, one after another")
  if isinstance(ws, str):
    return Report(
      mode="weight_streaming",
      fits=False,
      reason=ws,
      micro_batch_size=0,
      samples_per_sec=0.0,
      compute_samples_per_sec=0.0,
      transmission_samples_per_sec=0.0,
      active_pes=0,
      compute_utilization=0.0,
      step_time_s=math.inf,
      kernels=(),
      placement=(rect,),
      details={"sequence_length": seq, "training": graph.training},
      notes=tuple(notes),
      **common,
    )
  rows = []
  by_name = {k.name: k for k in graph.kernels}
  for r in ws.kernels:
    if r.time_s <= 0 and r.flops <= 0:
      continue
    k = by_name[r.name]
    rows.append(
      KernelRow(
        r.name,
        r.count,
        batch / r.time_s if r.time_s else math.inf,
        batch / r.compute_s if r.compute_s else math.inf,
        batch / r.io_s if r.io_s else math.inf,
        width * height,
        r.compute_s / r.time_s if r.time_s else 0.0,
        k.count * k.matmul_flops(1 / graph.traced_batch, ("fwd", "bwd")),
        r.weight_bytes,
        r.time_s / ws.step_s,
      )
    )
  if ws.rejected:
    smallest = max(ws.rejected)
    notes.append(f"micro-batch {smallest} rejected: {ws.rejected[smallest]}")
  if ws.recompute:  # (selective or at segment boundaries: `streaming.activation_memory`)
    what = (
      "each layer recomputes its attention scores before its backward"
      if ws.recomputed == "attention"
      else "only the layer boundaries and the head's input are kept and each layer's forward runs again "
      "before its backward"
    )
    notes.append(
      f"recomputing activations: +{100 * ws.recompute_fraction:.0f} % FLOPs (keeping every layer's "
      f"activations would take {ws.full_activation_bytes / 1e9:.3g} GB; {what})"
    )
  if graph.training:  # (an inference step has no weight update to place)
    notes.append("the weight update runs on MemoryX, overlapped with streaming (not on the wafer)")
  details = {
    "sequence_length": seq,
    "training": graph.training,
    "micro_batches": ws.n_micro,
    "compute_s": ws.compute_s,
    "io_s": ws.io_s,
    "boundary_s": ws.boundary_s,
    "swarmx_s": ws.swarmx_s,
    "resident_bytes": ws.resident_bytes,
    "recompute_fraction": ws.recompute_fraction,
    "per_system_batch": per_system,
  }
  return Report(
    mode="weight_streaming",
    fits=True,
    reason="",
    micro_batch_size=ws.micro_batch,
    samples_per_sec=batch / ws.step_s,
    compute_samples_per_sec=batch / ws.compute_s if ws.compute_s else math.inf,
    transmission_samples_per_sec=batch / ws.io_s if ws.io_s else math.inf,
    active_pes=width * height,
    compute_utilization=min(1.0, ws.compute_s / ws.step_s),
    step_time_s=ws.step_s,
    kernels=tuple(rows),
    placement=(rect,),
    details=details,
    notes=tuple(notes),
    **common,
  )
