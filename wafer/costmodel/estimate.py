"""`wafer.estimate`: how fast a JAX step would train on a Cerebras system, and where the time goes."""

from __future__ import annotations

import dataclasses
import itertools
import math
import numbers
import operator
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

import precision
from wafer.config.schema import batch_split_problem
from wafer.costmodel import graph as graph_mod
from wafer.costmodel.calibration import ACCURACY, CALIBRATION, Calibration
from wafer.costmodel.hardware import WSE3, Chip, System, get_system
from wafer.costmodel.mesh import ALGORITHMS, Machine, clock_field
from wafer.costmodel.pipeline import PipelineResult, layer_pipelined
from wafer.costmodel.placement import Rect
from wafer.costmodel.release import DEFAULT_RELEASE, PIPELINE_MAX_PARAMS, SPEEDUP_2_0, Release, parse_release
from wafer.costmodel.report import KernelRow, Report
from wafer.costmodel.streaming import (
  Rejection,
  StreamingResult,
  cost_micro_batches,
  micro_batch_candidates,
  ordinal,
  searched_micro_batches,
  supported_micro_batch,
)
from wafer.errors import EstimateError, TraceError

__all__ = ("MODES", "EstimateError", "estimate", "estimate_graph", "run_inputs")

MODES = ("auto", "fastest", "pipeline", "weight_streaming")
"""``auto``: the mode the release runs the model in (`wafer.costmodel.release`); ``fastest``: the
faster of the two modes that fits (a what-if: no release chooses by speed); ``pipeline`` / ``weight_streaming``:
that mode, whatever the release."""
_MODE_ALIASES = {
  "layer_pipelined": "pipeline",
  "pipelined": "pipeline",
  "ws": "weight_streaming",
  "weight-streaming": "weight_streaming",
}


def run_inputs(params: Any) -> dict[str, Any]:
  """`estimate` arguments a params file (a `wafer.config.Params`) decides, as given.

  ``micro_batch_size``: ``train_input.micro_batch_size`` (the trainer layout's
  ``csx.performance.micro_batch_size`` lands there) when it is an integer; ``"auto"``, ``"explore"``,
  ``{explore: ...}`` or None leave it out (searched). ``release``: the software release the file says
  it runs on, only where it names one (``runconfig.modelzoo_release``, or a ``release`` string on the
  file or its ``runconfig``); else the default, today's 2.x stack. The release the loader infers from
  a file's layout (``Params.release``: "1.x", "2.4+", ...) decides the meaning of the file's keys
  (its half type), not the stack it would run on today: a 1.x file estimated as a 1.x (layer
  pipelined) run would answer for software no longer shipped, and "1.x" cannot tell 1.8 (layer
  pipelined) from 1.9 (weight streaming). ``sequence_source``: the key that sets the batch's sequence
  length, ``train_input.max_sequence_length``; where the file has none, the model's
  ``max_position_embeddings`` stands for it (modelzoo's data fixes the length; the reference models'
  tasks default to it), and the report says so.

  >>> from types import SimpleNamespace as NS
  >>> run_inputs(NS(train_input=NS(micro_batch_size=88), runconfig=NS()))
  {'micro_batch_size': 88}
  >>> run_inputs(NS(train_input=NS(max_sequence_length=None), model=NS(max_position_embeddings=2048)))
  {'sequence_source': 'train_input.max_sequence_length not set: model.max_position_embeddings = 2048'}
  >>> run_inputs(NS(train_input=NS(micro_batch_size="auto"), runconfig=NS(release="1.8")))
  {'release': '1.8'}
  >>> run_inputs(NS(train_input=None, runconfig=NS(modelzoo_release="Release_1.8.0")))
  {'release': 'Release_1.8.0'}
  >>> run_inputs(NS(train_input=NS(micro_batch_size=None), release=NS(name="1.x"), runconfig=NS()))
  {}
  """
  out: dict[str, Any] = {}
  train_input = getattr(params, "train_input", None)
  mb = getattr(train_input, "micro_batch_size", None)
  if isinstance(mb, int) and not isinstance(mb, bool):
    out["micro_batch_size"] = mb
  positions = getattr(getattr(params, "model", None), "max_position_embeddings", None)
  if getattr(train_input, "max_sequence_length", None) is not None:
    out["sequence_source"] = "train_input.max_sequence_length"
  elif isinstance(positions, int):
    out["sequence_source"] = (
      f"train_input.max_sequence_length not set: model.max_position_embeddings = {positions}"
    )
  runconfig = getattr(params, "runconfig", None)
  for release in (
    getattr(runconfig, "modelzoo_release", None),
    getattr(params, "release", None),
    getattr(runconfig, "release", None),
  ):
    if isinstance(release, (str, int, float, Release)) and not isinstance(release, bool):
      out["release"] = release
      break
  return out


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


SEARCHED_MICRO_BATCH = ("auto", "explore", "none")
"""``micro_batch_size`` values (any case) that mean searched, as None does: the words of a params
file's ``micro_batch_size`` and of ``wafer estimate --micro_batch_size``."""


def _micro_batch_size(value: Any) -> int | None:
  """A positive integer (used as given), or None for None / ``"auto"`` / ``"explore"`` (searched)."""
  if value is None or (isinstance(value, str) and value.strip().lower() in SEARCHED_MICRO_BATCH):
    return None
  try:
    return _positive_int("micro_batch_size", value)
  except EstimateError:
    raise EstimateError(
      f"micro_batch_size={value!r}; allowed: a positive integer (used as given), or None, 'auto' or "
      "'explore' (searched)"
    ) from None


def _format(name: str, value: Any) -> precision.FloatFormat:
  if isinstance(value, precision.FloatFormat):
    return value
  try:
    return precision.get_format(value)
  except (ValueError, TypeError) as exc:
    raise EstimateError(f"{name}={value!r} is not a float format: {exc}") from None


def _accumulate_format(value: Any, compute: precision.FloatFormat) -> precision.FloatFormat:
  """The accumulator format: 16 bits or wider (the WSE's FMAC accumulates in FP16 or FP32), and not
  narrower than the ``compute`` format of the products' operands."""
  fmt = _format("accumulate_format", value)
  if fmt.bits < 16:
    raise EstimateError(
      f"accumulate_format={value!r}: the WSE has no {fmt.bits}-bit accumulator (its FMAC accumulates in 16 "
      "or 32 bits); allowed: 'float32' (Cerebras mixed precision) or a 16-bit format such as 'float16'"
    )
  if fmt.bits < compute.bits:
    raise EstimateError(
      f"accumulate_format={value!r} ({fmt.bits} bits) is narrower than compute_format={compute.name!r} "
      f"({compute.bits} bits): products of {compute.bits}-bit operands accumulate in at least "
      f"{compute.bits} bits; allowed: accumulate_format='float32', or a 16-bit compute format (such as "
      "'cbfloat16') with a 16-bit accumulator"
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
  release: str | Release = DEFAULT_RELEASE,
  num_csx: int = 1,
  compute_format: str | precision.FloatFormat | None = None,
  policy: Any = None,
  accumulate_format: str | precision.FloatFormat = "float32",
  micro_batch_size: int | str | None = None,
  batch_argnums: int | Sequence[int] | None = None,
  kernel_depth: int | None = None,
  rect: tuple[int, int] | None = None,
  gemm_algorithm: str = "search",
  calibration: Calibration | None = None,
  clock_hz: float | None = None,
  name: str | None = None,
  scaling: str = "traced",
  sequence_source: str | None = None,
) -> Report:
  """Estimate the training (or inference) rate of ``step_fn`` on a Cerebras wafer.

  The step is traced with abstract inputs (nothing is computed or allocated), its equations are
  grouped into kernels, and the kernels are costed on the wafer's PE grid in layer-pipelined mode
  (a rectangle per kernel) or weight-streaming mode (every layer over the whole wafer, weights
  streamed from MemoryX). See ``wafer/costmodel/*.py`` for the formulas.

  The software ``release`` decides the mode, as on a real system (`wafer.costmodel.release`): from
  1.9 on (every 2.x release, the default) every model runs in weight streaming; the 1.x releases
  before it ran models under 1B parameters layer pipelined on one system.

  Args:
    step_fn: any JAX function, typically ``step(params, opt_state, batch)``. A function wrapped by
      ``precision.autocast`` (it has ``.policy`` and ``.__wrapped__``) is unwrapped and its policy's
      compute format is used.
    *example_args: arrays or `jax.ShapeDtypeStruct` pytrees with the shapes of one step.
    batch_size: samples per step (all systems); default: axis 0 of the batch arguments.
    system: ``"wse2"`` (CS-2), ``"wse3"`` (CS-3) or ``"wse1"`` (CS-1).
    mode: ``"auto"`` (default): the mode ``release`` runs the model in (weight streaming under 2.x);
      ``"fastest"``: the faster of the two modes that fits, a what-if no release does;
      ``"pipeline"`` (layer pipelined) or ``"weight_streaming"``: that mode, whatever the release.
    release: the Cerebras software release: ``"2.x"`` (default, the current stack), ``"1.x"`` (before
      1.9), or a release number (``"2.4"``, ``"R1.9.1"``, ``"Release_2.10.0"``). The report states it,
      the mode and why (``Report.release``, ``Report.mode_reason``). A 1.x release also computes at
      1 / 1.5 of the 2.x stack's rate (`wafer.costmodel.Release.compute_speed`; a report note says so).
    num_csx: systems in data parallel (weight streaming only); ``batch_size`` must divide evenly.
    compute_format: format of matrix-product operands and activations (name or
      `precision.FloatFormat`): 16-bit formats run at the 16-bit SIMD rate, wider ones at the FP32
      rate. Default: the policy's compute format, else ``"cbfloat16"``; given with a policy, it wins
      (the same step as it would run in another format: ``wafer estimate --compute_format``).
    policy: a ``precision.Policy`` (anything with ``.compute``) or a policy string (``"c=bf16"``,
      `precision.Policy.parse`) giving the compute format.
    accumulate_format: accumulator format of matrix products (``"float32"``: Cerebras mixed
      precision; ``"float16"``: half-precision FMAC).
    micro_batch_size: the micro-batch (weight streaming) or wave size (pipeline), at most the
      samples per system, used as given (a params file's ``micro_batch_size``): weight streaming runs
      the supported size nearest it, ``ceil(B / n)`` for ``B`` samples per system (as Cerebras does;
      the report's notes say when it differs). When it does not fit, the report says by how much,
      which assumption decides it and the largest micro-batch that fits; it is never replaced.
      None (default), ``"auto"`` or ``"explore"`` (any case; a params file's words): searched, and
      the report gives the range of rates over the feasible sizes.
    batch_argnums: which arguments carry the batch on axis 0. Default: every argument whose arrays
      all have, as axis 0, the batch size (axis 0 of the last argument with arrays): data, labels,
      masks, per-sample keys; but not one the step returns (an updated copy or a gradient: parameters
      or optimizer state), nor one the step does not trace with when its axis 0 is doubled with the
      batch (the report's notes name such arguments); the step must trace with the default batch
      arguments doubled (else an `EstimateError`). The report lists them (``Report.batch_arguments``).
    kernel_depth: keep at most this many scope names per kernel (coarser kernels).
    rect: ``(width, height)`` of the PE rectangle to use (default: the chip's usable grid).
    gemm_algorithm: ``"search"`` (best mapping, as the Cerebras compiler explores layouts) or
      ``"meshgemm"`` (WaferLLM's MeshGEMM).
    calibration: calibration parameters (default `CALIBRATION`); ``clock_hz`` overrides the clock of
      the system's chip (`Calibration.clock`: the WSE-2 and the WSE-3 each have their own).
    name: name shown in the report.
    scaling: ``"traced"`` (default: the step is traced at two batch sizes to find how each size
      grows with the batch) or ``"dataflow"`` (traced once where the batch can be followed through
      its equations, the same graph: `wafer.costmodel.graph.extract`).
    sequence_source: where the batch's sequence length comes from, as the report states it beside
      the length (a params file's key: `run_inputs` gives it). Default: the batch array it is
      read from (``axis 1 of batch['input_ids']``).

  Returns:
    A `Report` (``samples_per_sec``, ``compute_samples_per_sec``, ``transmission_samples_per_sec``,
    ``active_pes``, ``compute_utilization``, ``kernels``...). A model that does not fit in the
    requested mode gives a report with ``fits=False``, the reason and what would make it fit
    (``Report.remedy``); it has no rate.

  Raises:
    EstimateError: an unusable argument (the message names it, the value and what is allowed).
    wafer.errors.TraceError: the function could not be traced.
  """
  sys_, mode, num_csx, rel = _check_run(system, mode, num_csx, gemm_algorithm, release)  # before tracing
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
  accumulate = _accumulate_format(accumulate_format, compute)
  if (
    scaling not in graph_mod.SCALINGS
  ):  # (extract's own check is a TraceError: an argument here is an EstimateError)
    raise EstimateError(f"scaling={scaling!r}; allowed: {', '.join(map(repr, graph_mod.SCALINGS))}")
  calib = calibration or CALIBRATION
  if not isinstance(calib, Calibration):
    raise EstimateError(f"calibration={calib!r}; allowed: a wafer.costmodel.Calibration")
  if clock_hz is not None:
    if (
      not isinstance(clock_hz, numbers.Real)
      or isinstance(clock_hz, (bool, np.bool_))
      or not clock_hz > 0
      or not math.isfinite(clock_hz)
    ):
      raise EstimateError(f"clock_hz={clock_hz!r}; allowed: a positive, finite frequency in Hz")
    calib = calib.replace(**{clock_field(calib, sys_.chip)[0]: float(clock_hz)})
  names = _arg_names(step_fn, len(example_args))
  argnums = _argnums(batch_argnums, example_args, names)
  left_out: list[str] = []
  if batch_argnums is None:
    argnums, left_out = _default_argnums(step_fn, example_args, names, argnums)
  width, height = _rect(rect, sys_.chip.usable_width, sys_.chip.usable_height)
  if batch_size is not None:
    batch_size = _positive_int("batch_size", batch_size)
  micro_batch_size = _micro_batch_size(micro_batch_size)

  compute_bits = 16 if compute.bits <= 16 else 32
  graph = graph_mod.extract(
    step_fn,
    example_args,
    batch_argnums=argnums,
    compute_bits=compute_bits,
    kernel_depth=kernel_depth,
    arg_names=names,
    scaling=scaling,
    strict_batch=batch_argnums is None,
  )
  format_notes = []
  policy_compute = getattr(policy, "compute", None)
  policy_format = getattr(policy_compute, "name", policy_compute)
  if policy_compute is not None and policy_format != compute.name:
    format_notes.append(
      f"compute_format {compute.name} given with a policy computing in {policy_format}: the compute "
      "format wins (the step as it would run in it)"
    )
  narrower = sorted({mm.bits for k in graph.kernels for mm in k.matmuls if mm.bits < compute_bits})
  if narrower:
    format_notes.append(
      f"the step's own casts give some products {'/'.join(map(str, narrower))}-bit operands, narrower than "
      f"compute_format {compute.name}: they are costed at their width"
    )
  graph.notes = [*left_out, *format_notes, *graph.notes]
  if sequence_source is not None and not isinstance(sequence_source, str):
    raise EstimateError(f"sequence_source={sequence_source!r}; allowed: a string, or None")
  graph.sequence_source = sequence_source or graph.sequence_source
  return estimate_graph(
    graph,
    batch_size=batch_size,
    system=sys_,
    mode=mode,
    release=rel,
    num_csx=num_csx,
    compute_format=compute,
    accumulate_format=accumulate,
    micro_batch_size=micro_batch_size,
    rect=(width, height),
    gemm_algorithm=gemm_algorithm,
    calibration=calib,
    name=name or getattr(step_fn, "__name__", "step"),
  )


_PATTERN_NAME = re.compile(r"(dot_general_(\d+|\*)|ops)(#\d+)?")


def _check_run(
  system: Any, mode: Any, num_csx: Any, gemm_algorithm: Any, release: Any
) -> tuple[System, str, int, Release]:
  """Validate the arguments that describe the run; returns ``(system, mode, num_csx, release)``."""
  sys_ = _system(system)
  mode = _mode(mode)
  rel = parse_release(release)
  num_csx = _positive_int("num_csx", num_csx)
  if num_csx > sys_.max_systems:
    raise EstimateError(
      f"num_csx={num_csx}; allowed: 1 to {sys_.max_systems} {sys_.name} systems (SwarmX limit)"
      if sys_.max_systems > 1
      else f"num_csx={num_csx}; allowed: 1 (a {sys_.name} runs alone: no SwarmX cluster of them)"
    )
  if mode == "pipeline" and num_csx > 1:
    raise EstimateError(
      f"num_csx={num_csx} with mode='pipeline'; layer-pipelined execution runs on one system "
      "(use mode='weight_streaming' for data parallel systems)"
    )
  if gemm_algorithm not in ALGORITHMS:
    raise EstimateError(f"gemm_algorithm={gemm_algorithm!r}; allowed: {', '.join(map(repr, ALGORITHMS))}")
  return sys_, mode, num_csx, rel


def estimate_graph(
  graph: graph_mod.Graph,
  *,
  batch_size: int | None = None,
  system: str | System = "wse2",
  mode: str = "auto",
  release: str | Release = DEFAULT_RELEASE,
  num_csx: int = 1,
  compute_format: str | precision.FloatFormat = "cbfloat16",
  accumulate_format: str | precision.FloatFormat = "float32",
  micro_batch_size: int | str | None = None,
  rect: tuple[int, int] | None = None,
  gemm_algorithm: str = "search",
  calibration: Calibration | None = None,
  name: str = "step",
) -> Report:
  """`estimate` for an already extracted `Graph` (no tracing): cost it under other systems, modes or
  calibrations. ``compute_format`` only names the format in the report here: the operand widths were
  fixed at extraction. Arguments as in `estimate`."""
  sys_, mode, num_csx, rel = _check_run(system, mode, num_csx, gemm_algorithm, release)
  compute = _format("compute_format", compute_format)
  accumulate = _accumulate_format(accumulate_format, compute)
  calib = calibration or CALIBRATION
  chip = sys_.chip
  width, height = _rect(rect, chip.usable_width, chip.usable_height)
  batch = graph.traced_batch if batch_size is None else _positive_int("batch_size", batch_size)
  problem = batch_split_problem(batch, num_csx, "num_csx")
  if problem is not None:
    raise EstimateError(f"batch_size={batch}: {problem}")
  per_system = batch // num_csx
  notes_extra = []
  micro_batch_size = _micro_batch_size(micro_batch_size)
  ws_micro_batch = micro_batch_size
  if micro_batch_size is not None:
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
  machine = Machine(chip, calib, 16 if accumulate.bits <= 16 else 32, gemm_algorithm, rel.compute_speed)
  if not clock_field(calib, chip)[1]:
    notes_extra.append(
      f"chip {chip.name!r} has no calibrated clock of its own: it runs at the WSE-2's "
      f"({calib.clock_hz / 1e9:g} GHz, Calibration.clock_hz)"
    )
  if rel.compute_speed != 1.0:
    notes_extra.append(
      f"release {rel.label}: the 1.x software computes at 1/{SPEEDUP_2_0:g} of the 2.x stack's rate "
      "(Cerebras' R2.0 announcement: 50% faster on large GPT models; transfers unchanged)"
    )

  params = graph.param_elements
  release_pipelines = not rel.streams_every_model and num_csx == 1 and params < PIPELINE_MAX_PARAMS
  pipe: PipelineResult | None = None
  ws: _Streaming | None = None
  if num_csx == 1 and (mode in ("pipeline", "fastest") or (mode == "auto" and release_pipelines)):
    pipe = layer_pipelined(graph, machine, sys_, width, height, batch, micro_batch_size)
  if mode in ("weight_streaming", "fastest") or pipe is None or not pipe.fits:
    ws = _stream(graph, machine, sys_, width, height, per_system, num_csx, ws_micro_batch)

  chosen, reason, alternatives = _choose(mode, rel, pipe, ws, num_csx, params, batch)
  common = dict(
    name=name,
    system=sys_.key,
    system_name=sys_.name,
    chip=chip.name,
    release=rel.label,
    batch_size=batch,
    num_csx=num_csx,
    total_pes=chip.fabric_pes,
    grid=(width, height),
    fabric=(chip.fabric_width, chip.fabric_height),
    offset=(chip.io_margin_width // 2 + 1, chip.io_margin_height // 2),
    compute_format=compute.name,
    accumulate_format=accumulate.name,
    clock_hz=machine.chip_clock_hz,
    calibration=calib,
    flops_per_sample=graph.flops_per_sample(),
    peak_flops_per_sec=num_csx
    * width
    * height
    * chip.peak_flops_per_cycle(graph.compute_bits)
    * machine.chip_clock_hz,
    alternatives=alternatives,
    mode_reason=reason,
    batch_arguments=graph.batch_arguments,
    accuracy=ACCURACY,
  )
  notes = list(graph.notes) + notes_extra
  if not graph.training:
    notes.append("no backward pass: costed as inference (forward only, no weight update)")
  with_products = [k for k in graph.kernels if k.matmuls]
  if with_products and all(_PATTERN_NAME.fullmatch(k.name) for k in with_products):
    notes.append(
      "the kernels are named by op pattern (dot_general_N: the step has no jax.named_scope or Flax module "
      "names); wrap each layer's parts in jax.named_scope('attn') etc. for rows named after the code"
    )
  if chosen != "pipeline" and sys_.memoryx.startswith("none"):
    notes.append(f"a what-if: the {sys_.name} has no MemoryX, so it never streamed weights")
  if chip.name == WSE3.name and rel.major == 1:
    notes.append(f"a what-if: the {sys_.name} never ran a 1.x release (the CS-3 came with 2.x software)")
  seq = graph.sequence_length
  if chosen == "pipeline":
    assert pipe is not None
    fed = pipe.input_samples_per_sec
    if (
      pipe.fits
      and fed <= pipe.transmission_samples_per_sec * (1 + 1e-9)
      and fed <= pipe.compute_samples_per_sec
    ):
      notes.append(
        f"the rate is the system's input I/O, not a kernel's: {graph.input_bytes_per_sample:,.0f} B of input "
        f"per sample at {sys_.io_bytes_per_sec / 1e9:,.0f} GB/s feed {fed:,.1f} samples/s, below "
        "every kernel's rate"
      )
    return _pipeline_report(pipe, ws, graph, common, notes, seq)
  assert ws is not None
  return _streaming_report(
    ws, graph, machine, common, notes, seq, width, height, per_system, micro_batch_size
  )


@dataclasses.dataclass(frozen=True)
class _Streaming:
  """Weight streaming at the given micro-batch, or searched.

  ``result`` is None when it does not fit (``reason`` says why, ``rejection`` the numbers: the given
  micro-batch's, else the smallest one's); ``requested`` the micro-batch the caller gave (None:
  searched); ``feasible`` the step seconds of every feasible searched size (empty when the given size
  fits: nothing was searched), ``rejected`` why the others are not; ``token_cap``: the search's cap in
  tokens per micro-batch (`Calibration.max_micro_batch_tokens`) where it left larger sizes out.
  """

  result: StreamingResult | None
  reason: str
  requested: int | None
  feasible: dict[int, float]
  rejected: dict[int, Rejection]
  rejection: Rejection | None = None
  token_cap: int | None = None


def _stream(
  graph: graph_mod.Graph,
  machine: Machine,
  sys_: System,
  width: int,
  height: int,
  per_system: int,
  num_csx: int,
  requested: int | None,
) -> _Streaming:
  """Weight streaming at ``requested`` as given; when it is None, the compiler's search is costed
  (`searched_micro_batches`: the supported sizes, capped in tokens), the fastest is the run and the
  feasible ones give the range of rates; when ``requested`` does not fit, every supported size is
  costed (`micro_batch_candidates`, not capped) for the largest that fits."""
  args = (graph, machine, sys_, width, height, per_system)
  if requested is not None:
    given, why = cost_micro_batches(*args, [requested], num_csx)
    if given:
      return _Streaming(given[requested], "", requested, {}, {})
    searched, cap = micro_batch_candidates(per_system), None  # every size: the largest that fits
  else:
    searched, cap = searched_micro_batches(graph, machine, per_system)  # the compiler's search
  fits, rejected = cost_micro_batches(*args, searched, num_csx)
  feasible = {mb: res.step_s for mb, res in fits.items()}
  if requested is not None:
    no = why[requested]
    return _Streaming(None, f"micro-batch {requested}: {no}", requested, feasible, rejected, no)
  if not fits:
    smallest = min(rejected)
    no = rejected[smallest]
    return _Streaming(None, f"no micro-batch fits; at micro-batch {smallest}: {no}", None, {}, rejected, no)
  best = min(fits.values(), key=lambda r: r.step_s)  # the first of the fastest, in candidate order
  return _Streaming(dataclasses.replace(best, rejected=rejected), "", None, feasible, rejected, token_cap=cap)


def _system(system: Any) -> System:
  try:
    return get_system(system)
  except ValueError as exc:
    raise EstimateError(str(exc)) from None


def canonical_mode(mode: Any) -> Any:
  """A mode's name as `MODES` spells it (``"layer_pipelined"`` -> ``"pipeline"``, any case); a value
  that is not a string is returned as it is (`_mode` says what is allowed)."""
  return _MODE_ALIASES.get(mode.lower(), mode.lower()) if isinstance(mode, str) else mode


def _mode(mode: Any) -> str:
  key = canonical_mode(mode)
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
  bad = EstimateError(
    f"batch_argnums={batch_argnums!r}; allowed: positions 0..{n_args - 1} of the example arguments "
    f"(or -{n_args}..-1, counted from the end)"
  )
  try:
    nums = (batch_argnums,) if isinstance(batch_argnums, int) else tuple(batch_argnums)
  except TypeError:  # (not a sequence: 1.0)
    raise bad from None
  out = []
  for i in nums:
    if isinstance(i, bool) or not isinstance(i, int) or not -n_args <= i < n_args:
      raise bad
    out.append(i % n_args)
  return tuple(sorted(set(out)))


_MAX_TRIES = 8
"""At most this many traces at twice the batch choose the default batch arguments (`_default_argnums`)."""


def _default_argnums(
  step_fn: Callable[..., Any], args: Sequence[Any], names: Sequence[str], candidates: tuple[int, ...]
) -> tuple[tuple[int, ...], list[str]]:
  """The default batch arguments among ``candidates`` (`_argnums`'s: the last argument with arrays
  and every other whose arrays all have its axis 0), and a note for each other candidate left out.

  Another candidate that the step returns (its output holds a pytree of its structure, shapes and
  dtypes: an updated copy or a gradient) is state, parameters or optimizer state whose axis 0 equals
  the batch by chance. The batch arguments are the first set, with the fewest such arguments and then
  the most arguments, that the step traces with at twice the batch (`jax.eval_shape`: nothing is
  computed; at most `_MAX_TRIES` traces) and whose doubling changes the step's outputs beyond axis 0
  no more than doubling the last argument alone does (`_same_trailing_axes`: ``tanh(x @ w.T)`` with
  ``w`` of shape ``(B, d)`` traces with ``w`` doubled too, but its output then grows on axis 1 where
  ``x`` alone lengthens axis 0 only: ``w`` is a weight); the last argument is always one of them.
  Where no set traces, the last argument alone cannot be doubled: an `EstimateError`
  (`graph.undoubled_batch`).
  """
  last = candidates[-1]
  others = candidates[:-1]
  if not others:  # (nothing to choose; `graph.extract` checks that the last argument can be doubled)
    return candidates, []
  try:
    out = graph_mod.output_shapes(step_fn, args, names)
  except TraceError:  # (`graph.extract` says where the step fails)
    return candidates, []
  returned = {i for i in others if graph_mod.holds(out, args[i])}
  subsets = (
    [c for r in range(len(others), -1, -1) for c in itertools.combinations(others, r)]
    if len(others) <= 10
    else [others, tuple(i for i in others if i not in returned)]
  )
  order = sorted(
    set(subsets), key=lambda c: (len(returned.intersection(c)), -len(c), tuple(-i for i in reversed(c)))
  )
  tries = order[: _MAX_TRIES - 1] + ([()] if () not in order[: _MAX_TRIES - 1] else [])
  b = next(a for a in _leading_axes(args[last]) if a is not None)
  error: TraceError | None = None
  widened = False  # a set left out because doubling it widened an output beyond axis 0
  alone: list[Any] = []  # the outputs with the last argument alone doubled (None: it does not trace)

  def last_alone() -> Any:
    if not alone:
      try:
        alone.append(graph_mod.output_shapes(step_fn, args, names, doubled=(last,)))
      except TraceError:
        alone.append(None)
    return alone[0]

  for subset in tries:
    chosen = (*subset, last)
    try:
      doubled = graph_mod.output_shapes(step_fn, args, names, doubled=chosen)
    except TraceError as exc:
      error = exc
      continue
    if subset and last_alone() is not None and not _same_trailing_axes(last_alone(), doubled):
      widened = True
      continue
    break
  else:
    assert error is not None
    raise graph_mod.undoubled_batch(names, (last,), b, error) from error
  notes = []
  for i in others:
    if i in chosen:
      continue
    if i in returned:
      what = (
        "an array of its shape (parameters or their gradient)"
        if hasattr(args[i], "shape")
        else "arrays of its shapes (parameters, optimizer state or their gradients)"
      )
      why = f"the step returns {what}"
    elif widened:
      why = (
        "doubling it along with the batch changes the step's outputs beyond axis 0 (a weight whose "
        "axis 0 equals the batch, not samples)"
      )
    else:
      why = "the step does not trace with its axis 0 doubled along with the batch"
    notes.append(
      f"{names[i]} has {b} on axis 0 like the batch but {why}, so it is not a batch argument; pass "
      "batch_argnums= to override"
    )
  return tuple(sorted(chosen)), notes


def _same_trailing_axes(a: Any, b: Any) -> bool:
  """Whether the step's outputs ``a`` and ``b`` (`graph.output_shapes` at two choices of doubled
  arguments) differ at most on axis 0. With the last argument alone doubled and with other
  candidates doubled too: data only lengthens what the batch already lengthens (a per-sample output,
  a contrastive ``B x B`` logits matrix both of whose axes the batch makes), a weight widens more."""
  x, y = jax.tree.leaves(a), jax.tree.leaves(b)
  if len(x) != len(y):
    return False
  return all(
    len(getattr(p, "shape", ())) == len(getattr(q, "shape", ()))
    and tuple(getattr(p, "shape", ())[1:]) == tuple(getattr(q, "shape", ())[1:])
    for p, q in zip(x, y)
  )


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


def _size(params: int) -> str:
  return f"{params / 1e9:.3g}B parameters" if params >= 1e9 else f"{params / 1e6:.3g}M parameters"


def _choose(
  mode: str,
  rel: Release,
  pipe: PipelineResult | None,
  ws: _Streaming | None,
  num_csx: int,
  params: int,
  batch: int,
) -> tuple[str, str, dict[str, Any]]:
  """The mode, a sentence saying why (the release's rule, the request, or the what-if's comparison),
  and the other mode's rate or why it does not fit, where it was costed.

  The releases' rule is `wafer.costmodel.release`'s: from 1.9 on weight streaming for every model;
  before, layer pipelined for models under 1B parameters on one system.
  """
  size = _size(params)
  ws_rate = None if ws is None or ws.result is None else batch / ws.result.step_s
  alt_ws: dict[str, Any] = {} if ws is None else {"weight_streaming": ws_rate if ws_rate else ws.reason}
  alt_pipe: dict[str, Any] = (
    {} if pipe is None else {"pipeline": pipe.samples_per_sec if pipe.fits else pipe.reason}
  )
  if mode == "pipeline":
    what_if = (
      f"; release {rel.label} has no layer-pipelined mode (every model streams weights from 1.9 on): a what-if"
      if rel.streams_every_model
      else ""
    )
    return "pipeline", "requested" + what_if, alt_ws
  if mode == "weight_streaming":
    return "weight_streaming", "requested", alt_pipe
  if mode == "auto":
    if rel.streams_every_model:
      return (
        "weight_streaming",
        f"release {rel.label} runs every model in weight streaming (layer pipelining was dropped in 1.9; "
        "mode='fastest' or 'pipeline' cost it as a what-if)",
        {},
      )
    if num_csx > 1:
      return "weight_streaming", f"release {rel.label}: {num_csx} systems run only in weight streaming", {}
    if params >= PIPELINE_MAX_PARAMS:
      return (
        "weight_streaming",
        f"release {rel.label} streams the weights of models of 1B parameters or more (this one: {size})",
        {},
      )
    assert pipe is not None
    if pipe.fits:
      return (
        "pipeline",
        f"release {rel.label} runs models under 1B parameters ({size}) layer pipelined",
        alt_ws,
      )
    return (
      "weight_streaming",
      f"release {rel.label} runs models under 1B parameters ({size}) layer pipelined, but this one does not "
      "fit pipelined: weight streaming",
      alt_pipe,
    )
  # "fastest": the what-if of choosing by speed
  what_if = f"the faster mode (a what-if: release {rel.label} " + (
    "streams every model)" if rel.streams_every_model else "pipelines models under 1B parameters)"
  )
  if pipe is None:
    return "weight_streaming", f"{what_if}: {num_csx} systems run data parallel only in weight streaming", {}
  if not pipe.fits:
    return "weight_streaming", f"{what_if}: layer pipelined does not fit ({size})", alt_pipe
  if ws_rate is None:
    return "pipeline", f"{what_if}: weight streaming does not fit", alt_ws
  if pipe.samples_per_sec >= ws_rate:
    return (
      "pipeline",
      f"{what_if}: layer pipelined is {pipe.samples_per_sec / ws_rate:.2f}x faster than weight streaming ({size})",
      alt_ws,
    )
  return (
    "weight_streaming",
    f"{what_if}: weight streaming is {ws_rate / pipe.samples_per_sec:.2f}x faster than layer pipelined ({size})",
    alt_pipe,
  )


def _finite(v: float) -> float | None:
  """``v``, or None where it is not a finite number (a rate with nothing to limit it)."""
  return v if math.isfinite(v) else None


def _pipeline_report(
  pipe: PipelineResult,
  ws: _Streaming | None,
  graph: graph_mod.Graph,
  common: dict[str, Any],
  notes: list[str],
  seq: int | None,
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
        _finite(min(comp, trans)),
        _finite(comp),
        _finite(trans),
        area,
        util,
        k.count * k.model_flops(1 / graph.traced_batch),
        k.count * k.weight_bytes(),
        area / total_area,
      )
    )
  fits = pipe.fits
  rate = pipe.samples_per_sec if fits else None
  details = {
    "sequence_length": seq,
    "sequence_source": graph.sequence_source if seq else None,
    "training": graph.training,
    "memory_bytes": pipe.memory_bytes,
    "needed_pes": pipe.needed_pes,
    "update_s": pipe.update_s,
    "wave": pipe.wave,
  }
  remedy = ""
  if not fits:
    if pipe.available_pes:  # not enough PEs for the memory (the only way a pipeline does not fit)
      needed, available = pipe.needed_pes, pipe.available_pes
      details.update(
        memory_required_pes=needed, memory_available_pes=available, over_factor=needed / available
      )
      details["deciding_assumption"] = (
        "layer pipelined keeps every layer's weights, optimizer state and gradients in SRAM for the whole "
        "run, with the activations of the waves in flight between each layer's forward and backward pass"
      )
    if ws is not None and ws.result is not None:
      remedy = (
        f"weight streaming (mode='weight_streaming', or the default under release 2.x) runs it at "
        f"{common['batch_size'] / ws.result.step_s:,.1f} samples/s"
        + (f" under release {common['release']}" if common["release"].startswith("1.") else "")
      )
    else:
      chip = get_system(common["system"]).chip
      remedy = "a smaller model (fewer or narrower layers)" + _more_room(chip, common["grid"])
  return Report(
    mode="pipeline",
    fits=fits,
    reason=pipe.reason,
    micro_batch_size=pipe.wave,
    samples_per_sec=rate,
    compute_samples_per_sec=pipe.compute_samples_per_sec if fits else None,
    transmission_samples_per_sec=pipe.transmission_samples_per_sec if fits else None,
    active_pes=sum(u.rect.area for u in pipe.units),
    compute_utilization=busy / total_area if fits else 0.0,
    step_time_s=common["batch_size"] / rate if rate else None,
    kernels=tuple(rows),
    placement=tuple(u.rect for u in pipe.units),
    details=details,
    notes=tuple(notes),
    remedy=remedy,
    **common,
  )


def _more_room(chip: Chip, grid: tuple[int, int]) -> str:
  """The remedy's ", or ..." for more SRAM: the whole wafer when ``rect=`` gave a smaller rectangle,
  else a chip with more SRAM (a WSE-3) unless this is one."""
  if grid[0] * grid[1] < 0.9 * chip.fabric_width * chip.fabric_height:
    return f", or a larger rect= than {grid[0]} x {grid[1]} PEs (the whole wafer is the default)"
  return ", or a chip with more SRAM (wse3)" if chip.name != WSE3.name else ""


def _not_fitting(
  ws: _Streaming, machine: Machine, batch: int, grid: tuple[int, int]
) -> tuple[str, dict[str, Any]]:
  """What would make a weight-streaming run fit, and the numbers behind it: the memory it needs and has,
  the factor over, the assumption that decides it and the largest micro-batch that fits."""
  out: dict[str, Any] = {"requested_micro_batch": ws.requested}
  no = ws.rejection
  pes = grid[0] * grid[1]
  if no is not None and no.kind == "memory" and no.required_bytes is not None and no.available_bytes:
    # the least the activations take: all kept, or recomputing attention's scores or whole layers
    need, have = no.required_bytes, no.available_bytes
    out.update(memory_required_bytes=need, memory_available_bytes=have, over_factor=need / have)
    out["deciding_assumption"] = (
      f"the activations the backward pass reads (at least the layer boundaries, recomputing the rest) are "
      f"kept on the wafer between forward and backward, in the SRAM left for tensors "
      f"({machine.sram_data_bytes / 1024:.3g} KiB of each of {pes:,} PEs)"
    )
  elif no is not None and no.kind == "tile":
    out["deciding_assumption"] = (
      f"a GEMM tile of one micro-batch must fit in one PE's SRAM for tensors ({machine.sram_data_bytes / 1024:.3g} KiB)"
    )
  else:
    out["deciding_assumption"] = ws.reason
  if ws.feasible:
    largest = max(ws.feasible)
    rate = batch / ws.feasible[largest]
    out.update(largest_fitting_micro_batch=largest, largest_fitting_samples_per_sec=rate)
    remedy = f"micro_batch_size {largest}, the largest that fits, runs at {rate:,.1f} samples/s"
  else:
    room = _more_room(machine.chip, grid)
    if no is not None and no.kind == "tile":  # one layer's weight, not the activations, is too large
      remedy = (
        f"no micro-batch fits: the weight tile of {no.reason.split(':')[0]} does not fit a PE even at micro-batch 1; "
        f"split that layer into smaller products (its output or contraction axis){room}"
      )
    else:
      remedy = (
        f"no micro-batch fits: a shorter sequence, or fewer activations kept for the backward pass{room}"
      )
  return remedy, out


def _streaming_report(
  ws: _Streaming,
  graph: graph_mod.Graph,
  machine: Machine,
  common: dict[str, Any],
  notes: list[str],
  seq: int | None,
  width: int,
  height: int,
  per_system: int,
  requested: int | None = None,
) -> Report:
  """The weight-streaming report; ``requested``: the micro-batch the caller gave (``ws.requested`` is
  the supported size nearest it, the one costed)."""
  batch = common["batch_size"]
  rect = Rect(0, 0, width, height, "all layers, one after another")
  if ws.result is None:
    remedy, extra = _not_fitting(ws, machine, batch, (width, height))
    return Report(
      mode="weight_streaming",
      fits=False,
      reason=ws.reason,
      micro_batch_size=ws.requested or 0,
      samples_per_sec=None,
      compute_samples_per_sec=None,
      transmission_samples_per_sec=None,
      active_pes=0,
      compute_utilization=0.0,
      step_time_s=None,
      kernels=(),
      placement=(rect,),
      details={
        "sequence_length": seq,
        "sequence_source": graph.sequence_source if seq else None,
        "training": graph.training,
        "per_system_batch": per_system,
        "micro_batch_requested": requested,
        **extra,
      },
      notes=tuple(notes),
      remedy=remedy,
      **common,
    )
  res = ws.result
  rows = []
  by_name = {k.name: k for k in graph.kernels}
  for r in res.kernels:
    if r.time_s <= 0 and r.flops <= 0:
      continue
    k = by_name[r.name]
    rows.append(
      KernelRow(
        r.name,
        r.count,
        batch / r.time_s if r.time_s else None,
        batch / r.compute_s if r.compute_s else None,
        batch / r.io_s if r.io_s else None,
        width * height,
        r.compute_s / r.time_s if r.time_s else 0.0,
        k.count * k.model_flops(1 / graph.traced_batch),
        r.weight_bytes,
        r.time_s / res.step_s,
      )
    )
  if res.latency_s > 0:
    rows.append(
      KernelRow(
        f"layer latencies ({res.layer_passes} layer passes x {res.n_micro} "
        f"micro-batch{'es' if res.n_micro != 1 else ''})",
        1,
        batch / res.latency_s,
        None,
        None,
        0,
        0.0,
        0.0,
        0.0,
        res.latency_s / res.step_s,
      )  # fmt: skip
    )
  rest_s = res.step_s - sum(r.time_s for r in res.kernels) - res.latency_s
  if rest_s > 1e-9 * res.step_s:  # the boundary bubble, SwarmX and any wait for input data
    rows.append(
      KernelRow(
        "step boundary (weight update wait, SwarmX, input)",
        1,
        batch / rest_s,
        None,
        batch / rest_s,
        0,
        0.0,
        0.0,
        0.0,
        rest_s / res.step_s,
      )  # fmt: skip
    )
  if res.rejected and ws.requested is None:
    smallest = max(res.rejected)
    notes.append(f"micro-batch {smallest} rejected: {res.rejected[smallest]}")
  if res.recompute:  # (selective or at segment boundaries: `streaming.activation_memory`)
    what = {
      "attention": "attention runs fused: its scores are never stored and each layer's backward recomputes them",
      "layers": "only the layer boundaries and the head's input are kept and each layer's forward runs again "
      "before its backward",
      "spans": f"even the layer boundaries do not fit: only every {ordinal(res.span)} is kept, each span of "
      f"{res.span} layers runs forward again to rebuild its boundaries, and each layer once more before its "
      "backward (Chen et al. 2016, https://arxiv.org/abs/1604.06174)",
    }[res.recomputed]
    notes.append(
      f"recomputing activations: +{100 * res.recompute_fraction:.0f} % FLOPs (keeping every layer's "
      f"activations would take {res.full_activation_bytes / 1e9:.3g} GB; {what})"
    )
  if graph.training:  # (an inference step has no weight update to place)
    notes.append("the weight update runs on MemoryX, overlapped with streaming (not on the wafer)")
  details: dict[str, Any] = {
    "sequence_length": seq,
    "sequence_source": graph.sequence_source if seq else None,
    "training": graph.training,
    "micro_batches": res.n_micro,
    "compute_s": res.compute_s,
    "io_s": res.io_s,
    "boundary_s": res.boundary_s,
    "swarmx_s": res.swarmx_s,
    "layer_latencies_s": res.latency_s,
    "layer_passes": res.layer_passes,
    "resident_bytes": res.resident_bytes,
    "recompute_fraction": res.recompute_fraction,
    "per_system_batch": per_system,
    "micro_batch_given": ws.requested is not None,
    "micro_batch_requested": requested,
  }
  if ws.feasible:
    sizes = sorted(ws.feasible)
    rates = [batch / ws.feasible[m] for m in sizes]
    details["micro_batch_range"] = {
      "sizes": [sizes[0], sizes[-1]],
      "count": len(sizes),
      "samples_per_sec": [min(rates), max(rates)],
    }
    if ws.token_cap:
      details["micro_batch_range"]["token_cap"] = ws.token_cap
  return Report(
    mode="weight_streaming",
    fits=True,
    reason="",
    micro_batch_size=res.micro_batch,
    samples_per_sec=batch / res.step_s,
    compute_samples_per_sec=batch / res.compute_s if res.compute_s else None,
    transmission_samples_per_sec=batch / res.io_s if res.io_s else None,
    active_pes=width * height,
    compute_utilization=min(1.0, res.compute_s / res.step_s),
    step_time_s=res.step_s,
    kernels=tuple(rows),
    placement=(rect,),
    details=details,
    notes=tuple(notes),
    **common,
  )
