"""Graph extraction: the jaxpr of any JAX step -> kernels with their work, weights and activations.

The step is traced with abstract inputs (`jax.ShapeDtypeStruct`), so a GPT-3-sized step costs no
memory. It is traced twice, at the example batch ``b0`` and at ``2 * b0``; comparing the two tells
which sizes grow with the batch (``Size.exponent``), so the cost model can evaluate any micro-batch
without tracing again. Equations are walked recursively through ``jit``/``pjit``, ``closed_call``,
``custom_jvp``/``custom_vjp``, ``remat``, ``shard_map`` (times the mesh size), ``scan`` (times its
length), ``while`` (its body once) and ``cond`` (the most expensive branch).

Equations are grouped into *kernels*, the unit that gets a rectangle of PEs:

* by the Flax module path or `jax.named_scope` stack (``eqn.source_info.name_stack``), truncated to
  ``kernel_depth`` names; the backward equations carry the same scopes under a ``transpose``
  transform, so a kernel holds its forward and its backward;
* without names, by op pattern: each matrix product starts a kernel, a backward product joins the
  kernel whose weight (or input activation) it shares, and other ops join the kernel that produced
  their first input;
* ops that do not grow with the batch (the optimizer update, weight casts) form the phase
  ``"update"``; unnamed ones go to the kernel ``weight_update``;
* kernels with no matrix product and no weights (glue such as a residual add) merge into the
  kernel that produced their input;
* repeated layers fold into one kernel per layer part with a ``count`` (`fold_repeats`): the
  canonical layer graph, the same for a Python loop, ``lax.scan``, Flax ``nn.scan`` or NNX.

Each kernel also records the activations its forward pass keeps for the backward (`Kernel.saved`),
which the weight-streaming memory model adds up (`wafer.costmodel.streaming`).

What is counted (per equation): matrix products as ``2 * instances * m * k * n`` FLOP in the
compute format; float element-wise ops as one op per output element (transcendentals flagged);
reductions per input element; data movement (transpose, gather, concatenate...) in bytes.
Integer and boolean ops (index arithmetic, random bits, the bit-twiddling of emulated rounding)
are not work, nor are `precision`'s roundings (autocast's, `precision.round`): they emulate the
format the wafer computes in. A call whose body bitcasts a float to an integer and back — a *fake
cast* of another emulation library — costs one element-wise cast, what a real cast costs on the wafer.
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import itertools
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

import precision
from precision import _jax_compat as compat
from wafer.costmodel import walk
from wafer.costmodel.walk import Site, Walker
from wafer.errors import EstimateError, TraceError, user_frame

__all__ = (
  "PHASES",
  "Graph",
  "Kernel",
  "Matmul",
  "Size",
  "TraceError",
  "extract",
  "fold_repeats",
  "fuse_productless",
)

PHASES = ("fwd", "bwd", "update")
SCALINGS = ("traced", "dataflow")  # `extract`'s ways of finding how each size grows with the batch


@dataclasses.dataclass(frozen=True)
class Size:
  """A size measured at the traced batch ``b0`` that scales as ``(batch / b0) ** exponent``.

  ``exponent`` is 0 for sizes that do not depend on the batch (weights), 1 for per-sample sizes
  (tokens of a micro-batch) and 2 for sizes quadratic in the batch.
  """

  at_trace: float
  exponent: int

  def at(self, ratio: float) -> float:
    """The size at ``batch = ratio * b0``."""
    return self.at_trace * ratio**self.exponent


@dataclasses.dataclass(frozen=True)
class Matmul:
  """One matrix product (``dot_general`` or a convolution) of a kernel: ``instances`` independent
  products ``[m x k] @ [k x n]``.

  Attributes:
    phase: ``"fwd"``, ``"bwd"`` or ``"update"``.
    instances: product of the batch dimensions of ``dot_general`` (e.g. samples x heads in
      attention); 1 for an ordinary weight product.
    m, k, n: free dimension of the left operand, contracted dimension, free dimension of the right
      operand (products of the dimensions of each group).
    bits: operand width on the wafer (16 or 32): the compute format, or narrower operands.
    weight: whether one operand is a parameter of the step (a weight product).
    kept: the fraction of an activation x activation product's scores a mask keeps (1.0: no
      mask; found by data flow from where the mask is applied, ``jnp.where(mask, scores, -inf)`` or
      ``scores + bias``: `_masked_products`): (s + 1) / (2 s) for a causal mask of ``s`` positions,
      about w / s for a sliding window of w, 1 / blocks for a block-diagonal one; 0.5 for a causal
      mask whose value is not known at trace time. Its row work scales with it
      (`wafer.costmodel.mesh.attention_cycles`).
    recomputed: a product of a forward pass the step recomputes in its backward (``jax.checkpoint``):
      it takes time, but it is not one of the model's FLOPs (`Graph.flops_per_sample`).
  """

  phase: str
  instances: Size
  m: Size
  k: Size
  n: Size
  bits: int
  weight: bool
  kept: float = 1.0
  recomputed: bool = False

  @property
  def masked(self) -> bool:
    """Whether a mask keeps only part of the product's scores (`kept` < 1)."""
    return self.kept < 1.0

  @property
  def sizes(self) -> tuple[Size, Size, Size, Size, int]:
    """What makes two products the same product: instances, m, k, n and width."""
    return (self.instances, self.m, self.k, self.n, self.bits)

  def flops(self, ratio: float) -> float:
    """``2 * instances * m * k * n`` at ``batch = ratio * b0``."""
    return 2.0 * self.instances.at(ratio) * self.m.at(ratio) * self.k.at(ratio) * self.n.at(ratio)


@dataclasses.dataclass
class Kernel:
  """A group of equations that gets one rectangle of PEs (one instance per ``count``).

  All sizes are per instance (e.g. one layer of a ``scan`` over ``count`` layers).

  Attributes:
    name: scope path (``"block_3/attn"``) or an op-pattern name (``"dot_general_2"``).
    count: identical instances (the product of enclosing ``scan`` lengths).
    order: position of its first forward equation (dataflow order for placement).
    matmuls: its matrix products.
    vector: ``(phase, kind, exponent, bits) -> [elements, instructions]`` for the non-matmul work;
      ``kind`` is ``"vector"``, ``"transcendental"``, ``"reduce"``, ``"cast"`` (elements) or
      ``"move"`` (bytes).
    weights: ``root id -> (elements, bits)``: parameters it reads in its forward/backward, per
      instance (a weight its instances share counts its share: `_root_elements`).
    act_in, act_out: ``key -> (elements, exponent, bits)``: per-sample tensors crossing its
      boundary in the forward pass (inputs from other kernels or the data; outputs read by others).
    in_shapes, out_shapes: shapes (at the traced batch) of those boundary tensors.
    saved: ``key -> (elements, exponent, bits)``: per-sample values of its forward pass that the
      backward pass reads (what autodiff keeps for the backward, the *saved activations*), each
      counted once, in the kernel of its first forward reader (else of its producer): a layer's
      input belongs to the layer that reads it, however the loop is written.
    saved_core: the keys of `saved` that attention's core made (the scores and probabilities of
      an activation x activation product and the softmax after it): cheap to recompute from the
      layer's other saved values (Megatron's *selective* recomputation).
    instance_names: the names of the instances a folded loop had (``layer_0/attn``,
      ``layer_1/attn``...; `fold_repeats`), empty when they shared one name or came from a ``scan``.
    weight_instances: how many distinct weight sets its ``count`` instances read: ``count`` for
      layers with their own weights (a ``scan`` over stacked weights, a folded loop over layers), 1
      when every instance reads one array (a ``scan`` closing over its weights: an RNN over time, one
      layer applied ALBERT-style); the largest over its weights (a shared bias beside stacked
      matrices does not make the layers one).
    stack: which fold of `fold_repeats` made it (0: none, a ``scan``'s count or no repeat): two
      stacks folded one after the other (layers 0-2 at one width, 3-4 at another) are two stacks.
  """

  name: str
  count: int
  order: int
  scopes: tuple[str, ...] = ()
  matmuls: list[Matmul] = dataclasses.field(default_factory=list)
  vector: dict[tuple[str, str, int, int], list[float]] = dataclasses.field(default_factory=dict)
  weights: dict[int, tuple[float, int]] = dataclasses.field(default_factory=dict)
  act_in: dict[int, tuple[float, int, int]] = dataclasses.field(default_factory=dict)
  act_out: dict[int, tuple[float, int, int]] = dataclasses.field(default_factory=dict)
  in_shapes: list[tuple[int, ...]] = dataclasses.field(default_factory=list)
  out_shapes: list[tuple[int, ...]] = dataclasses.field(default_factory=list)
  saved: dict[int, tuple[float, int, int]] = dataclasses.field(default_factory=dict)
  instance_names: tuple[str, ...] = ()
  saved_core: set[int] = dataclasses.field(default_factory=set)
  weight_instances: int = 1
  stack: int = dataclasses.field(
    default=0, compare=False
  )  # (a label: kernels equal whatever their fold's number)

  def matmul_flops(self, ratio: float, phases: Sequence[str] = PHASES) -> float:
    """Matrix-product FLOP of one instance at ``batch = ratio * b0``: the work, recomputation included."""
    return sum(mm.flops(ratio) for mm in self.matmuls if mm.phase in phases)

  def model_flops(self, ratio: float, phases: Sequence[str] = ("fwd", "bwd")) -> float:
    """The model's matrix-product FLOP of one instance at ``batch = ratio * b0``: `matmul_flops`
    without a forward pass the step computes again (``jax.checkpoint``). A recomputed product counts
    once where it has no forward twin (a product of the same sizes in this kernel's forward): when
    the checkpointed forward's result feeds only the loss, the forward itself is dead code and the
    recomputation is the one forward left."""
    twins = collections.Counter(mm.sizes for mm in self.matmuls if mm.phase == "fwd" and not mm.recomputed)
    total = 0.0
    for mm in self.matmuls:
      if mm.phase not in phases:
        continue
      if mm.recomputed and twins[mm.sizes] > 0:
        twins[mm.sizes] -= 1
        continue
      total += mm.flops(ratio)
    return total

  def flops_by_format(self, ratio: float, phases: Sequence[str] = PHASES) -> dict[int, float]:
    """``bits -> FLOP`` (matrix products at 2 FLOP per MAC, element-wise ops at 1 per element)."""
    out: dict[int, float] = {}
    for mm in self.matmuls:
      if mm.phase in phases:
        out[mm.bits] = out.get(mm.bits, 0.0) + mm.flops(ratio)
    for (phase, kind, exponent, bits), (elements, _) in self.vector.items():
      if phase in phases and kind != "move":
        out[bits] = out.get(bits, 0.0) + elements * ratio**exponent
    return out

  def vector_ops(self, ratio: float, phases: Sequence[str] = PHASES) -> float:
    """Element-wise, reduction and cast operations (one per element) of one instance."""
    return sum(
      e * ratio**x for (p, kind, x, _), (e, _) in self.vector.items() if p in phases and kind != "move"
    )

  def weight_elements(self) -> int:
    return int(sum(e for e, _ in self.weights.values()))

  def weight_bytes(self) -> float:
    """Bytes of the parameters one instance reads, in their on-wafer width."""
    return float(sum(e * b / 8 for e, b in self.weights.values()))

  def activation_in_bytes(self, ratio: float) -> float:
    """Bytes of the forward boundary inputs of one instance at ``batch = ratio * b0``."""
    return sum(e * ratio**x * b / 8 for e, x, b in self.act_in.values())

  def activation_out_bytes(self, ratio: float) -> float:
    return sum(e * ratio**x * b / 8 for e, x, b in self.act_out.values())

  def saved_bytes(self, ratio: float, core: bool | None = None) -> float:
    """Bytes of the activations one instance keeps for its backward pass at ``batch = ratio * b0``
    (``core``: only attention's core values, True, or only the others, False; None: all)."""
    return sum(
      e * ratio**x * b / 8
      for key, (e, x, b) in self.saved.items()
      if core is None or (key in self.saved_core) == core
    )

  def has_phase(self, phase: str) -> bool:
    return any(mm.phase == phase for mm in self.matmuls) or any(k[0] == phase for k in self.vector)


@dataclasses.dataclass
class Graph:
  """The kernels of a traced step, and what the cost model needs to scale them.

  Attributes:
    kernels: in dataflow order.
    traced_batch: ``b0``, the batch of the example arguments.
    exact_scaling: True when the second trace (at ``2 * b0``) matched, so every size knows how
      it scales; False when it did not and everything is assumed linear in the batch.
    compute_bits: operand width used for matrix products (16 or 32).
    input_bytes_per_sample: bytes of the batch arguments per sample (data fed to the wafer).
    param_elements: elements of all parameters read by the forward/backward.
    state_bytes: bytes of all non-batch arguments (parameters, optimizer state, ...).
    eqn_count: equations walked (with ``scan`` bodies once).
    notes: things the extraction approximated.
    sequence_length: set by `extract`: axis 1 of the first batch array that looks like a sequence
      (integer ids ``[batch, seq]`` or floats ``[batch, seq, features]``; a float ``[batch, h, w]``
      image or an integer ``[batch, k]`` array listed first is read as one too), for tokens/s and
      `Calibration.max_micro_batch_tokens`; None without such an array.
    sequence_source: where that length comes from, as the report states it (a params file's key,
      or the batch array it was read from).
    batch_arguments: names of the arguments taken as the batch.
    param_arrays: parameter arrays of the arguments read as weights (a stacked array counts once,
      however many layers read slices of it): what an optimizer issues its instructions over.
  """

  kernels: list[Kernel]
  traced_batch: int
  exact_scaling: bool
  compute_bits: int
  input_bytes_per_sample: float
  param_elements: int
  state_bytes: float
  eqn_count: int
  notes: list[str]
  sequence_length: int | None = None
  sequence_source: str | None = None
  batch_arguments: tuple[str, ...] = ()
  param_arrays: int = 0

  def flops_per_sample(self, phases: Sequence[str] = ("fwd", "bwd")) -> float:
    """Matrix-product FLOP per sample (all kernel instances), the 'model FLOPs': a forward pass the
    step computes again (``jax.checkpoint``) is not counted twice (`Kernel.model_flops`)."""
    ratio = 1.0 / self.traced_batch
    return sum(k.count * k.model_flops(ratio, phases) for k in self.kernels)

  @property
  def training(self) -> bool:
    """Whether the step has a backward pass (a training step); else it is costed as inference."""
    return any(k.has_phase("bwd") for k in self.kernels)

  def state_bytes_per_param(self) -> float:
    """Bytes of persistent state per parameter (weights plus optimizer state), at least the weight."""
    if self.param_elements <= 0:
      return 4.0
    return max(4.0, self.state_bytes / self.param_elements)


# ----------------------------------------------------------------------------------------------
# Tracing and grouping


def _abstract(args: tuple[Any, ...], names: Sequence[str]) -> tuple[Any, ...]:
  """Arrays -> `jax.ShapeDtypeStruct`; Python numbers and functions stay (a function in a model's
  pytree, such as an Equinox module's activation, is part of the step: `_trace` closes over it, as
  ``eqx.filter_jit`` does); anything else cannot be costed."""

  def conv(path: Any, x: Any, name: str) -> Any:
    if isinstance(x, jax.ShapeDtypeStruct):
      return x
    if hasattr(x, "shape") and hasattr(x, "dtype"):
      return jax.ShapeDtypeStruct(tuple(x.shape), x.dtype)
    if isinstance(x, (bool, int, float, complex)) or x is None or _static(x):
      return x
    raise TraceError(
      f"{name}{jax.tree_util.keystr(path)} is a {type(x).__name__}, which the cost model cannot cost; "
      "allowed: arrays, jax.ShapeDtypeStruct or Python numbers (bind other values with functools.partial)"
    )

  return tuple(
    jax.tree_util.tree_map_with_path(lambda p, x, n=n: conv(p, x, n), a) for a, n in zip(args, names)
  )


def batch_axis(leaf: Any) -> int | None:
  """Axis 0 of an array leaf of a batch argument, or None where it has no batch axis: a scalar (a
  loss scale, a step count), a Python number, or one raw PRNG key (``jax.random.PRNGKey(0)``,
  uint32 of shape ``(2,)``; a batch of per-sample raw keys is ``(b, 2)``)."""
  shape = getattr(leaf, "shape", None)
  if shape is None or len(shape) == 0:
    return None
  if tuple(shape) == (2,) and getattr(leaf, "dtype", None) == np.uint32:
    return None
  return int(shape[0])


def _double_batch(tree: Any) -> Any:
  def conv(x: Any) -> Any:
    if isinstance(x, jax.ShapeDtypeStruct) and batch_axis(x) is not None:
      return jax.ShapeDtypeStruct((2 * x.shape[0],) + tuple(x.shape[1:]), x.dtype)
    return x

  return jax.tree.map(conv, tree)


def output_shapes(
  fn: Callable[..., Any], args: Sequence[Any], names: Sequence[str], doubled: Sequence[int] = ()
) -> Any:
  """``fn``'s output as `jax.ShapeDtypeStruct`s (a function leaf as None) at the example arguments,
  those at the positions ``doubled`` with their batch axes doubled: `jax.eval_shape`, nothing
  computed. A function leaf of an argument is closed over, as in `_trace`.

  Raises:
    TraceError: the step does not trace at these shapes.
  """
  a = _abstract(tuple(args), names)
  a = tuple(_double_batch(x) if i in doubled else x for i, x in enumerate(a))
  dynamic_args, rebuild = _close_static(a)

  def traced(*dynamic: Any) -> Any:
    return jax.tree.map(lambda x: None if _static(x) else x, fn(*rebuild(dynamic)))

  try:
    return jax.eval_shape(traced, *dynamic_args)
  except Exception as exc:
    raise TraceError(f"could not trace the step with abstract inputs: {type(exc).__name__}: {exc}") from exc


def holds(tree: Any, arg: Any) -> bool:
  """Whether ``tree`` (`output_shapes`) holds a pytree with the structure, leaf shapes and dtypes of
  the argument ``arg`` (a Python number matches a scalar): the step returns an updated copy of it or
  its gradient."""
  arg = jax.tree.map(lambda x: None if _static(x) else x, arg)
  want = jax.tree.structure(arg)
  want_leaves = jax.tree.leaves(arg)
  n = len(want_leaves)

  def same(a: Any, o: Any) -> bool:
    shape = tuple(getattr(o, "shape", ()))
    if hasattr(a, "shape"):
      return tuple(a.shape) == shape and a.dtype == getattr(o, "dtype", None)
    return shape == ()

  found = False

  def visit(node: Any) -> bool:  # (called on every node of the tree, the root first)
    nonlocal found
    if not found:
      leaves = jax.tree.leaves(node)
      found = len(leaves) == n and jax.tree.structure(node) == want and all(map(same, want_leaves, leaves))
    return found

  jax.tree.flatten(tree, is_leaf=visit)
  return found


def _undoubled(
  names: Sequence[str], batch_argnums: Sequence[int], exc: Exception
) -> tuple[str, BaseException]:
  """The batch arguments a second trace doubled (their names) and why that trace failed."""
  return ", ".join(names[i] for i in sorted(batch_argnums)), exc.__cause__ or exc


def undoubled_batch(
  names: Sequence[str], batch_argnums: Sequence[int], b0: int, exc: Exception
) -> EstimateError:
  """The error of default batch arguments the step cannot grow: it does not trace with their axis 0
  doubled (``exc`` says why), so they may not be data, or the step fixes its batch size."""
  taken, cause = _undoubled(names, batch_argnums, exc)
  return EstimateError(
    f"the batch was taken to be axis 0 ({b0}) of {taken} (the default batch arguments), but the step does "
    f"not trace with it doubled ({type(cause).__name__}: {cause}); so {taken} may not be per-sample data "
    "(a step with no per-sample work has no rate), or the step fixes its batch size; pass batch_argnums= "
    "naming the arguments that carry the data on axis 0 (a step that fixes its batch size is then costed "
    "with all its work linear in the batch)"
  )


def _batch_size_of(args: Sequence[Any], batch_argnums: Sequence[int], names: Sequence[str]) -> int:
  """The batch size shared by axis 0 of every array of the batch arguments; a disagreement is an
  error naming the argument and the key path."""
  first: tuple[str, int] | None = None
  for i in batch_argnums:
    leaves = jax.tree_util.tree_leaves_with_path(args[i])
    batched = [(path, leaf) for path, leaf in leaves if batch_axis(leaf) is not None]
    if not batched:  # (scalars, a raw key, numbers: per-step values, not samples, are fine beside data)
      shapes = sorted({str(tuple(getattr(leaf, "shape", ()))) for _, leaf in leaves})
      raise TraceError(
        f"batch argument {names[i]!r} has no array with a batch axis (shapes {', '.join(shapes) or 'none'}); "
        "a batch argument needs the batch as axis 0 of its arrays (leave this argument out of batch_argnums)"
      )
    for path, leaf in batched:
      where = names[i] + jax.tree_util.keystr(path)
      shape = leaf.shape
      if int(shape[0]) == 0:
        raise TraceError(
          f"batch argument {where!r} has an empty batch (shape {tuple(shape)}): there is no sample to "
          "cost; pass at least one sample on axis 0 (batch_size= then sets the batch to estimate)"
        )
      if first is None:
        first = (where, int(shape[0]))
      elif int(shape[0]) != first[1]:
        raise TraceError(
          f"batch argument mismatch: {where} has axis 0 of size {shape[0]} but {first[0]} has {first[1]}; every "
          "batch argument needs the same batch size on axis 0 (fix the shapes or batch_argnums)"
        )
  if first is None:
    raise TraceError(f"batch_argnums={tuple(batch_argnums)} name arguments with no arrays")
  return first[1]


def _static(x: Any) -> bool:
  """A function leaf of an argument (not an array, not a number): closed over, not traced."""
  return callable(x) and not isinstance(x, (jax.ShapeDtypeStruct, type))


def _close_static(args: tuple[Any, ...]) -> tuple[list[Any], Callable[[Sequence[Any]], tuple[Any, ...]]]:
  """The leaves of ``args`` a trace takes as inputs, and a function that rebuilds ``args`` from them:
  static leaves (an Equinox model's functions, `_static`) are closed over, not traced."""
  leaves, treedef = jax.tree.flatten(args)
  static = [_static(x) for x in leaves]

  def rebuild(dynamic: Sequence[Any]) -> tuple[Any, ...]:
    it = iter(dynamic)
    return jax.tree.unflatten(treedef, [x if st else next(it) for x, st in zip(leaves, static)])

  return [x for x, st in zip(leaves, static) if not st], rebuild


def _python_value_hint(
  fn: Callable[..., Any], args: Sequence[Any], names: Sequence[str], exc: Exception
) -> str:
  """For a step that used a traced value as a Python value: the fix, naming the Python numbers among
  the example arguments that JAX's message says the value depends on (``dynamic[i]``, the i-th traced
  leaf) bound to the step; for a value computed from arrays, ``jnp.where`` / ``lax.cond``."""
  if not isinstance(exc, (jax.errors.ConcretizationTypeError, jax.errors.TracerIntegerConversionError)):
    return ""
  text, first, culprits = str(exc), 0, []
  for name, a in zip(names, args):
    leaves = sum(not _static(x) for x in jax.tree.leaves(a))
    if isinstance(a, (bool, int, float)) and re.search(rf"\bdynamic\[{first}\]", text):
      culprits.append((name, a))
    first += leaves
  if not culprits:
    return (
      "\nThe step branches (or loops) in Python on a value computed from its arrays: a traced step "
      "cannot decide that while it is traced; use jnp.where or jax.lax.cond / jax.lax.while_loop"
    )
  fn_name = getattr(fn, "__name__", "step")
  try:
    parameters = inspect.signature(fn).parameters
  except (TypeError, ValueError):
    parameters = {}
  if all(n in parameters for n, _ in culprits):
    bound = f"functools.partial({fn_name}, {', '.join(f'{n}={a!r}' for n, a in culprits)})"
  else:  # (a *args step: bound by a lambda taking the other arguments)
    rest = [n if n.isidentifier() else f"a{i}" for i, n in enumerate(names) if n not in dict(culprits)]
    call = ", ".join(
      repr(a) if (n, a) in culprits else (n if n.isidentifier() else f"a{i}")
      for i, (n, a) in enumerate(zip(names, args))
    )
    bound = f"lambda {', '.join(rest)}: {fn_name}({call})"
  what = " and ".join(n for n, _ in culprits)
  return (
    f"\nThe cost model traces every example argument as an array, as jax.jit does, so {what}, a value "
    f"the step uses in Python (a flag, a loop count, a shape), must be bound to the step instead: "
    f"estimate({bound}, ...) without {'it' if len(culprits) == 1 else 'them'} among the example arguments"
  )


def _trace(
  fn: Callable[..., Any],
  args: Sequence[Any],
  batch_argnums: Sequence[int],
  batch: int | None = None,
  names: Sequence[str] = (),
) -> tuple[Walker, Any]:
  dynamic_args, rebuild = _close_static(tuple(args))

  def traced(*dynamic: Any) -> Any:  # the arguments come back too: a step that updates them in place
    a = rebuild(dynamic)  # (flax.nnx: nnx.jit with nnx.Optimizer) keeps its backward and its update
    out = fn(*a), a
    return [x for x in jax.tree.leaves(out) if not _static(x)]  # (an Equinox model's functions)

  try:
    # autocast's chunked accumulation emulates the wafer's numerics, it is not wafer work: the
    # products are traced whole (`precision.whole_products`), as the wafer runs them
    with precision.whole_products():
      closed = jax.make_jaxpr(traced)(*dynamic_args)
  except Exception as exc:  # the user's function failed to trace: say so, where, keep the cause
    frame = user_frame(exc.__traceback__)
    where = f" at {frame[0]}:{frame[1]}\n    {frame[2]}\n" if frame else ": "
    nones = [n for n, a in zip(names, args) if a is None]
    if nones:  # a None argument traces as nothing; the step then fails on it (as a str argument is refused)
      raise TraceError(
        f"{' and '.join(nones)} {'is' if len(nones) == 1 else 'are'} None, which the cost model cannot cost, "
        f"and tracing the step failed{where}{type(exc).__name__}: {exc}; allowed: arrays, "
        "jax.ShapeDtypeStruct or Python numbers (bind other values with functools.partial)"
      ) from exc
    hint = _python_value_hint(fn, args, names, exc)
    raise TraceError(
      f"could not trace the step with abstract inputs{where}{type(exc).__name__}: {exc}{hint}"
    ) from exc
  flat_is_param: list[bool] = []
  for i, a in enumerate(args):
    n = sum(not _static(x) for x in jax.tree.leaves(a))
    flat_is_param += [i not in batch_argnums] * n
  jaxpr, consts = compat.split_closed(closed)
  # dead code (e.g. the unused gradient of a max under value_and_grad) is not run on the wafer
  jaxpr = compat.dce(jaxpr)
  if len(flat_is_param) != len(jaxpr.invars):
    flat_is_param = [True] * len(jaxpr.invars)
  walker = Walker(len(jaxpr.invars), flat_is_param, batch)
  consts = consts if len(consts) == len(jaxpr.constvars) else ()
  walker.walk(jaxpr, walker.top_keys, (), False, 1, consts)
  return walker, closed


def _exponent(v1: float, v2: float) -> int | None:
  if v1 == v2:
    return 0
  if v1 <= 0 or v2 <= 0:
    return None
  e = math.log2(v2 / v1)
  r = round(e)
  return r if abs(e - r) < 1e-9 and r > 0 else None


def extract(
  fn: Callable[..., Any],
  args: Sequence[Any],
  *,
  batch_argnums: Sequence[int],
  compute_bits: int,
  kernel_depth: int | None = None,
  arg_names: Sequence[str] | None = None,
  canonical: bool = True,
  scaling: str = "traced",
  strict_batch: bool = False,
) -> Graph:
  """Trace ``fn(*args)`` abstractly (twice, or once) and group its equations into kernels.

  Args:
    fn: any JAX-traceable function (a train step, a forward pass...).
    args: example arguments: arrays or `jax.ShapeDtypeStruct`s (pytrees allowed).
    batch_argnums: positions of the data arguments; every array in them has the batch as axis 0.
    compute_bits: operand width of matrix products and element-wise work on the wafer (16 or 32).
    kernel_depth: keep at most this many scope names in a kernel name (None: all).
    arg_names: names of the arguments for messages and ``Graph.batch_arguments``.
    canonical: fold repeated layers into one kernel per layer part with a count (`fold_repeats`,
      `fuse_productless`), the graph the cost model uses; False keeps one kernel per written layer.
    scaling: how each size's growth with the batch is found: ``"traced"`` (default) traces the step
      a second time at ``2 * b0`` and compares the two; ``"dataflow"`` traces once and follows the
      batch axes from the batch arguments through the equations (`wafer.costmodel.batchflow`),
      and traces the second time only where an equation mixes the batch in a way it does not
      follow (a loop over per-sample data, a slice of the batch...). The same graph for the steps
      tested (``tests/wafer/costmodel/test_batchflow.py``) at half the tracing time.
    strict_batch: where the second trace fails, raise an `EstimateError` (`undoubled_batch`) instead
      of assuming all work linear in the batch: ``batch_argnums`` were guessed from the shapes
      (`wafer.estimate`'s default), and arguments the step cannot grow may not be data.

  Returns:
    The `Graph`.
  """
  names = tuple(arg_names) if arg_names is not None else tuple(f"argument {i}" for i in range(len(args)))
  user_args = tuple(args)
  args = _abstract(user_args, names)
  b0 = _batch_size_of(args, batch_argnums, names)
  # each trace gets its own abstract copy: a step that updates its arguments in place (flax.nnx)
  # leaves tracers in the copy it was given
  if scaling not in SCALINGS:
    raise TraceError(f"scaling={scaling!r}; allowed: {', '.join(map(repr, SCALINGS))}")
  w1, _ = _trace(fn, _abstract(user_args, names), batch_argnums, b0, names)
  notes = set(w1.notes)
  exact = True
  followed = scaling == "dataflow" and w1.batch_unknown is None
  sites2: list[Site] | None = None
  if not followed:
    fresh = _abstract(user_args, names)
    args2 = tuple(_double_batch(a) if i in batch_argnums else a for i, a in enumerate(fresh))
    try:
      w2, _ = _trace(fn, args2, batch_argnums)
      sites2 = w2.sites
    except TraceError as exc:
      if strict_batch:
        raise undoubled_batch(names, batch_argnums, b0, exc) from exc
      sites2 = None
      taken, cause = _undoubled(names, batch_argnums, exc)
      notes.add(
        f"the step does not trace with axis 0 of {taken} doubled ({type(cause).__name__}: "
        f"{str(cause).splitlines()[0] if str(cause) else ''}); all work is assumed linear in the batch. "
        f"If {taken} is not per-sample data, pass batch_argnums= naming the data arguments"
      )
    if sites2 is None:
      exact = False
    elif len(sites2) != len(w1.sites) or any(a.kind != b.kind for a, b in zip(w1.sites, sites2)):
      exact = False
      notes.add("the step traced differently at twice the batch; all work is assumed linear in the batch")
  sites = w1.sites
  exps: list[tuple[int, ...]] = []
  per_sample: list[bool] = []
  for i, s in enumerate(sites):
    if followed:
      exps.append(s.batch_exps if s.batch_exps is not None else tuple(1 for _ in s.measures))
      per_sample.append(s.batch_per_sample)
    elif exact:
      s2 = sites2[i]  # type: ignore[index]
      e = tuple(_exponent(a, b) for a, b in zip(s.measures, s2.measures))
      if any(x is None for x in e):
        notes.add("some sizes do not scale as a power of the batch; they are treated as linear")
      exps.append(tuple(1 if x is None else x for x in e))
      per_sample.append(s.in_shapes != s2.in_shapes or s.out_shapes != s2.out_shapes)
    else:
      dep = any(k in w1.data for k in s.in_keys)
      exps.append(
        tuple(1 if dep else 0 for _ in s.measures) if s.kind != "matmul" else (0, 1 if dep else 0, 0, 0)
      )
      per_sample.append(dep)
  kernels = _group(sites, exps, per_sample, w1, compute_bits, kernel_depth)
  input_bytes = 0.0
  state_bytes = 0.0
  for i, a in enumerate(args):
    for leaf in jax.tree.leaves(a):
      if not isinstance(leaf, jax.ShapeDtypeStruct):  # a Python number: traced as a constant
        continue
      nbytes = math.prod(leaf.shape) * walk.itemsize(leaf.dtype)
      if i in batch_argnums:
        input_bytes += nbytes / b0 if batch_axis(leaf) is not None else 0.0
      else:
        state_bytes += nbytes
  roots: dict[int, int] = {}
  for k in kernels:
    for r, (e, _) in k.weights.items():
      roots[r] = max(roots.get(r, 0), e * k.count)
  for r in list(roots):  # a parameter the step joined from others holds theirs: counted once
    for part in w1.parts.get(r, ()):
      roots.pop(part, None)
  # (a parameter the step joined from others is the arrays it joins: what the optimizer updates)
  param_arrays = len(
    {w1.origin.get(p, p) for k in kernels for r in k.weights for p in w1.parts.get(w1.origin.get(r, r), (r,))}
  )
  seq, seq_source = _sequence_length(user_args, batch_argnums, names)
  return Graph(
    kernels=_name(fuse_productless(fold_repeats(kernels)) if canonical else kernels),
    traced_batch=b0,
    exact_scaling=exact,
    compute_bits=compute_bits,
    input_bytes_per_sample=float(input_bytes),
    param_elements=int(sum(roots.values())),
    state_bytes=float(state_bytes),
    eqn_count=w1.eqn_count,
    notes=sorted(notes),
    batch_arguments=tuple(names[i] for i in sorted(batch_argnums)),
    param_arrays=param_arrays,
    sequence_length=seq,
    sequence_source=seq_source,
  )


def _sequence_length(
  args: Sequence[Any], argnums: Sequence[int], names: Sequence[str]
) -> tuple[int | None, str | None]:
  """``(length, where)``: axis 1 of the first batch array that holds a sequence, integer token ids
  ``[batch, seq]`` or float ``[batch, seq, features]``, and that array (``axis 1 of
  batch['input_ids']``). Other arrays have no sequence axis (a float ``[batch, features]`` is an
  MLP's input, ``[batch, h, w, c]`` an image), and without a sequence there is no tokens/s."""
  import jax.numpy as jnp

  for i in argnums:
    for path, leaf in jax.tree_util.tree_leaves_with_path(args[i]):
      shape = getattr(leaf, "shape", ())
      dtype = getattr(leaf, "dtype", jnp.float32)
      if (len(shape) == 2 and jnp.issubdtype(dtype, jnp.integer)) or (
        len(shape) == 3 and jnp.issubdtype(dtype, jnp.floating)
      ):
        return int(shape[1]), f"axis 1 of {names[i]}{jax.tree_util.keystr(path)}"
  return None, None


def _group(
  sites: list[Site],
  exps: list[tuple[int, ...]],
  per_sample: list[bool],
  walker: Walker,
  compute_bits: int,
  kernel_depth: int | None,
) -> list[Kernel]:
  """The kernels of the sites (`_group_once`); where a scope's forward pass holds the layers of a
  Python loop that never leaves it (`_loop_starts`), grouped again with one occurrence per layer."""
  kernels, assignment = _group_once(sites, exps, per_sample, walker, compute_bits, kernel_depth, frozenset())
  starts = _loop_starts(sites, assignment, per_sample, walker)
  if not starts:
    return kernels
  return _group_once(sites, exps, per_sample, walker, compute_bits, kernel_depth, starts)[0]


def _group_once(
  sites: list[Site],
  exps: list[tuple[int, ...]],
  per_sample: list[bool],
  walker: Walker,
  compute_bits: int,
  kernel_depth: int | None,
  starts: frozenset[int],
) -> tuple[list[Kernel], list[tuple[Any, ...]]]:
  """Group the sites into kernels: the kernels in dataflow order and each site's kernel id. A forward
  site in ``starts`` opens a new occurrence of its scope, as re-entering the scope does."""
  kernels: dict[tuple[Any, ...], Kernel] = {}
  producer: dict[int, tuple[Any, ...]] = {}  # key -> kernel id that produced it
  origin = walker.source

  def held_as(key: int) -> int:
    """The value a key holds when no work made it: the input of the free view or non-work op (a
    reshape, autocast's rounding) that returned it, followed across call boundaries (`Walker.source`),
    so a kernel reading a value it made itself, rounded or passed into a nested call, reads its own
    value, not one entering from outside."""
    return key if key in producer else origin(key)

  made_at: dict[int, int] = {}  # key -> index of the site that produced it
  forward: set[int] = set()  # keys made by the forward pass (saved activations)
  reader: dict[int, tuple[Any, ...]] = {}  # parameter root -> kernel of its first forward reader
  weight_owner: dict[int, tuple[Any, ...]] = {}  # parameter root -> kernel of its first product
  act_owner: dict[int, tuple[Any, ...]] = {}  # activation key -> kernel whose product read it
  assignment: list[tuple[Any, ...]] = []
  n_pattern = 0
  # A scope entered again after the forward pass left it (an unrolled loop whose layers share a
  # name) is a new occurrence: it gets its own kernel, as a scan's layers get their own instances.
  occurrence: dict[tuple[Any, ...], int] = {}
  left: set[tuple[Any, ...]] = set()
  last_fwd: tuple[Any, ...] | None = None
  in_backward = False
  last_bwd: dict[tuple[Any, ...], tuple[Any, ...]] = {}
  masked = _masked_products(sites, walker.flow, per_sample)

  def ahead(i: int, base: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The occurrence the next backward equations of ``base`` show by forward evidence alone (for
    an equation with none: the bias gradient ``sum(dy)`` that opens a layer's backward)."""
    for s in sites[i + 1 : i + 1 + _LOOKAHEAD]:
      scopes = s.scopes[:kernel_depth] if kernel_depth else s.scopes
      if (scopes, s.mult) != base or not s.transposed:
        continue
      found = _forward_evidence(base, s, producer, reader, act_owner, forward)
      if found is not None:
        return found
    return None

  def kernel(kid: tuple[Any, ...], name: str, mult: int, order: int, scopes: tuple[str, ...]) -> Kernel:
    if kid not in kernels:
      kernels[kid] = Kernel(name=name, count=mult, order=order, scopes=scopes)
    return kernels[kid]

  region, last_mult = 0, 1
  for i, s in enumerate(sites):
    if s.mult != last_mult:
      region, last_mult = region + 1, s.mult
    phase = "update" if not per_sample[i] else ("bwd" if s.transposed else "fwd")
    in_backward = in_backward or s.transposed
    scopes = s.scopes[:kernel_depth] if kernel_depth else s.scopes
    if scopes:
      base = (scopes, s.mult)
      name = "/".join(scopes)
      if phase == "fwd" and not in_backward:
        restart = i in starts and base in occurrence  # the next layer of a loop under one scope
        if base != last_fwd or restart:
          if last_fwd is not None and base != last_fwd:
            if not _nested(last_fwd[0], scopes):
              # leaving a scope leaves its enclosing scopes too, up to the one shared with the new
              # scope (equinox names each module call by its class: ``MultiheadAttention`` holds
              # ``MultiheadAttention/Linear`` and is left with it)
              prev, prev_mult = last_fwd
              for n in range(len(prev), 0, -1):
                if prev[:n] == scopes[:n]:
                  break
                if (prev[:n], prev_mult) in occurrence:
                  left.add((prev[:n], prev_mult))
            elif len(last_fwd[0]) > len(scopes) and s.kind not in ("move", "cast"):
              # back in an enclosing scope for arithmetic: its sub-scopes are left (equinox's ``MLP``
              # runs its activation between its ``MLP/Linear`` calls; each call is its own layer). A
              # copy or a cast there (autocast's roundings) leaves nothing.
              prev, prev_mult = last_fwd
              for n in range(len(prev), len(scopes), -1):
                if (prev[:n], prev_mult) in occurrence:
                  left.add((prev[:n], prev_mult))
          if base in left or restart:
            occurrence[base] = occurrence.get(base, 0) + 1
            left.discard(base)
          occurrence.setdefault(base, 0)
          last_fwd = base
        kid: tuple[Any, ...] = ("scope", scopes, s.mult, occurrence[base])
      elif phase == "update" and not in_backward:
        kid = ("scope", scopes, s.mult, occurrence.get(base, 0))
      else:
        kid = _backward_occurrence(
          base, s, producer, occurrence, last_bwd, reader, act_owner, forward, lambda i=i, b=base: ahead(i, b)
        )
    elif phase == "update":
      kid, name = ("update", s.mult), "weight_update"
    elif s.kind == "matmul":
      owner = next((weight_owner[r] for r in s.weight_roots if r in weight_owner), None)
      if owner is None:
        # (an input read across a loop boundary, a scan's residual, is the forward's value: `origin`)
        owner = next((act_owner[o] for o in map(origin, s.in_keys) if o in act_owner), None)
      if owner is None or kernels[owner].count != s.mult:
        kid, name = ("pattern", n_pattern, s.mult), f"dot_general_{n_pattern}"
        n_pattern += 1
      else:
        kid, name = owner, ""
    else:  # join the kernel that made the latest input (inside the same loop), else a misc kernel:
      # a residual add ``x + f(x)`` runs where ``f`` ends, not where the residual stream began
      # (a batch-independent input, a mask made once outside a loop, does not draw per-sample work)
      made = [
        (made_at[b], producer[b])
        for b in map(held_as, s.in_keys)
        if b in producer and kernels[producer[b]].count == s.mult and producer[b][0] != "update"
      ]
      # (an op with no such input starts the misc kernel of its stretch of equations between loop
      # boundaries: the final norm after a ``scan`` is not the embedding's before it)
      kid = max(made, key=lambda t: t[0])[1] if made else ("misc", s.mult, region)
      name = "ops"
    k = kernel(kid, name, s.mult, i if phase == "fwd" else i + len(sites), scopes)
    if phase == "fwd":
      k.order = min(k.order, i)
    assignment.append(kid)
    for o in s.out_keys:
      producer[o] = kid
      made_at[o] = i
      if not s.transposed:
        forward.add(o)
    if phase == "fwd":
      for r in s.weight_roots:  # the kernel whose forward pass first read this parameter
        reader.setdefault(r, kid)
    if s.kind == "matmul" and phase != "update":
      for r in s.weight_roots:
        weight_owner.setdefault(r, kid)
      for key in s.in_keys:
        if key not in walker.root:
          act_owner.setdefault(origin(key), kid)
    _add_site(k, s, exps[i], phase, compute_bits, walker, masked.get(i, 1.0))

  # boundary activations (forward, per-sample): inputs made elsewhere, outputs read elsewhere
  consumers: dict[int, set[tuple[Any, ...]]] = {}
  for kid, s in zip(assignment, sites):
    for key in s.in_keys:
      consumers.setdefault(key, set()).add(kid)
  for i, (kid, s) in enumerate(zip(assignment, sites)):
    if not per_sample[i] or s.transposed:
      continue
    k = kernels[kid]
    bits = min(s.bits, compute_bits)
    for pos, key in enumerate(s.in_keys):
      if key in walker.root or key in k.act_in:
        continue
      if producer.get(held_as(key)) != kid and (key in walker.data):
        shape = s.in_shapes[pos]
        e = _shape_exponent(shape, exps[i])
        k.act_in[key] = (walker.held(key, shape), e, bits)  # (a view enters as the value it views)
        k.in_shapes.append(tuple(shape))
    for pos, key in enumerate(s.out_keys):
      if key in k.act_out:
        continue
      if any(c != kid for c in consumers.get(key, ())) and key in walker.data:
        shape = s.out_shapes[pos]
        e = _shape_exponent(shape, exps[i])
        k.act_out[key] = (float(math.prod(shape)), e, bits)
        k.out_shapes.append(tuple(shape))

  _saved_activations(kernels, assignment, sites, per_sample, exps, walker, compute_bits)
  merged = _merge_update_only(_merge_glue(kernels, assignment, sites, producer))
  for k in merged:
    if not k.name:
      k.name = "ops"
  return sorted(merged, key=lambda k: k.order), assignment


def _loop_starts(
  sites: list[Site], assignment: list[tuple[Any, ...]], per_sample: list[bool], walker: Walker
) -> frozenset[int]:
  """The forward sites that begin a new layer of a Python loop whose layers run under one scope and
  never leave it (every layer's ops under ``mlp`` alone; or ``Block``'s own ops, its sub-scopes
  aside, when every layer is ``Block``), so that each layer gets its own kernel, as ``lax.scan``'s
  instances do (`_layer_loop`). What comes before the layers and after them in that scope (a first
  layer whose input needs no gradient differs from the others) gets its own kernel too."""
  members: dict[tuple[Any, ...], list[int]] = {}
  for i, (kid, s) in enumerate(zip(assignment, sites)):
    if s.transposed:
      break  # the backward pass began
    if per_sample[i] and kid[0] == "scope":
      members.setdefault(kid, []).append(i)
  starts: set[int] = set()
  for idx in members.values():
    found = _layer_loop(sites, idx, walker.source)
    if found is not None:
      start, p, reps = found
      starts.update(idx[c] for c in range(start, start + (reps + 1) * p, p) if 0 < c < len(idx))
  return frozenset(starts)


def _layer_loop(
  sites: list[Site], idx: list[int], source: Callable[[int], int]
) -> tuple[int, int, int] | None:
  """``(start, period, repeats)``, positions in ``idx``, of the layers of a loop among one scope
  kernel's forward sites ``idx``; None if there is none. The layers are the longest run of one period
  repeated (the same ops on the same shapes, a matrix product in each; then the shortest period),
  at least half the sites, each repeat reading what the one before made (a chain of layers, not the
  ``q``, ``k`` and ``v`` projections of one layer: `_chained`). Where the run could start at several
  sites (the tail of a different first layer is like the others'), a layer begins where the fewest
  values cross from the repeat before (the residual stream, not a norm's output beside it:
  `_crossing`)."""
  n = len(idx)
  table: dict[tuple[Any, ...], int] = {}
  ids = np.array([table.setdefault(_site_signature(sites[i]), len(table)) for i in idx])
  products = np.array([sites[i].kind == "matmul" for i in idx])
  if n < 4 or products.sum() < 2:
    return None
  runs: list[tuple[int, int, int, int]] = []  # (covered, period, first start, last start)
  for p in range(1, n // 2 + 1):
    same = np.concatenate(([False], ids[:-p] == ids[p:], [False])).astype(np.int8)
    edges = np.flatnonzero(np.diff(same))
    if not len(edges):
      continue
    lengths = edges[1::2] - edges[::2]
    j = int(np.argmax(lengths))
    a, span = int(edges[2 * j]), int(lengths[j]) + p  # sites a .. a + span - 1 repeat with period p
    reps = span // p
    if reps >= 2 and 2 * reps * p >= n:  # (a loop is most of its scope's work, not a detail of it)
      runs.append((reps * p, p, a, a + span - reps * p))
  for covered, p, first, last in sorted(runs, key=lambda r: (-r[0], r[1])):
    start = min(range(first, last + 1), key=lambda c: (_crossing(sites, idx, c, p, source), c))
    if products[start : start + p].any() and _chained(sites, idx, start, p, covered // p, source):
      return start, p, covered // p
  return None


def _crossing(sites: list[Site], idx: list[int], start: int, p: int, source: Callable[[int], int]) -> int:
  """How many values the repeat of ``p`` sites from ``idx[start]`` makes that the next repeat reads
  (the equations between them, another scope's, included)."""
  end = idx[start + 2 * p] if start + 2 * p < len(idx) else idx[-1] + 1
  made = {source(k) for i in range(idx[start], idx[start + p]) for k in sites[i].out_keys}
  return len({source(k) for i in range(idx[start + p], end) for k in sites[i].in_keys} & made)


def _site_signature(s: Site) -> tuple[Any, ...]:
  """What two layers' equations share: the work, its scopes and shapes, which operands are weights."""
  return (
    s.kind,
    s.scopes,
    s.mult,
    s.measures,
    s.in_shapes,
    s.out_shapes,
    s.bits,
    len(s.weight_roots),
    s.kept,
  )


def _chained(
  sites: list[Site], idx: list[int], start: int, p: int, reps: int, source: Callable[[int], int]
) -> bool:
  """Whether each of ``reps`` repeats of ``p`` of the sites ``idx`` from ``idx[start]`` reads (through
  any equations) a value the repeat before it made."""
  rep = {idx[start + pos]: pos // p for pos in range(reps * p)}
  linked = [r == 0 for r in range(reps)]
  dep: dict[int, int] = {}  # value -> the latest repeat it derives from
  for i in range(idx[start], idx[start + reps * p - 1] + 1):
    s = sites[i]
    d = max((dep.get(source(k), -1) for k in s.in_keys), default=-1)
    r = rep.get(i)
    if r is not None:
      linked[r] = linked[r] or d == r - 1
      d = max(d, r)
    if d >= 0:
      for k in s.out_keys:
        dep[source(k)] = d
  return all(linked)


def _saved_activations(
  kernels: dict[tuple[Any, ...], Kernel],
  assignment: list[tuple[Any, ...]],
  sites: list[Site],
  per_sample: list[bool],
  exps: list[tuple[int, ...]],
  walker: Walker,
  compute_bits: int,
) -> None:
  """Fill `Kernel.saved`: the per-sample values a forward equation reads or makes and a backward
  equation reads again, followed across loop boundaries (a ``scan``'s stacked residuals are its body's
  values: `Walker.flow`). Each belongs to the kernel of its first forward reader, else its producer."""

  origin = walker.source

  read_back = {origin(k) for i, s in enumerate(sites) if per_sample[i] and s.transposed for k in s.in_keys}
  # attention's core: values made by an activation x activation product (``Q K^T``, ``P V``) or
  # from one by element-wise work (the softmax), before the next product with a weight
  core: set[int] = set()
  for i, s in enumerate(sites):
    if not per_sample[i] or s.transposed:
      continue
    if s.kind == "matmul":
      made = not s.weight_roots and s.measures[0] > 1
    else:
      made = any(origin(k) in core for k in s.in_keys)
    if made:
      core.update(origin(k) for k in s.out_keys)
  owned: set[int] = set()
  for reads in (True, False):  # readers first, then producers of values no forward equation reads
    for i, (kid, s) in enumerate(zip(assignment, sites)):
      if not per_sample[i] or s.transposed:
        continue
      keys, shapes = (s.in_keys, s.in_shapes) if reads else (s.out_keys, s.out_shapes)
      for key, shape in zip(keys, shapes):
        o = origin(key)
        if o in owned or o not in read_back or key not in walker.data or key in walker.root:
          continue
        owned.add(o)
        e = _shape_exponent(tuple(shape), exps[i])
        # (a view is kept as the value it views, and viewed again for the backward)
        kernels[kid].saved[o] = (walker.held(o, shape), e, min(s.bits, compute_bits))
        if o in core:
          kernels[kid].saved_core.add(o)


def _name(kernels: list[Kernel]) -> list[Kernel]:
  """Unique names: a name several kernels share gets ``#1``, ``#2``... in dataflow order; the folds'
  stack numbers (`Kernel.stack`) renumbered 1, 2... in that order (the same graph, the same numbers)."""
  numbers: dict[int, int] = {}
  for k in kernels:
    if k.stack:
      k.stack = numbers.setdefault(k.stack, len(numbers) + 1)
  names: dict[str, int] = {}
  for k in kernels:
    names[k.name] = names.get(k.name, 0) + 1
  seen: dict[str, int] = {}
  for k in kernels:
    if names[k.name] > 1:
      seen[k.name] = seen.get(k.name, 0) + 1
      k.name = f"{k.name}#{seen[k.name]}"
  return kernels


# ----------------------------------------------------------------------------------------------
# The canonical layer graph: repeated blocks found by structure


_DIGITS = re.compile(r"(\d+)")


def _signature(k: Kernel) -> tuple[Any, ...]:
  """What makes two kernels instances of one layer: their names up to numbers (``layer_3/attn``,
  ``dot_general_7``: a layer's ``q`` and ``k`` projections are not two layers), count, matrix
  products (shapes, formats, masks) and parameter sizes; for a kernel with neither, the kinds of its
  element-wise work."""
  mms = tuple(
    sorted(
      (m.phase, m.bits, m.weight, m.kept)
      + tuple((z.at_trace, z.exponent) for z in (m.instances, m.m, m.k, m.n))
      for m in k.matmuls
    )
  )
  weights = tuple(sorted(k.weights.values()))
  kinds = () if (mms or weights) else tuple(sorted(k.vector))
  return (_DIGITS.sub("*", k.name), k.count, mms, weights, kinds)


def _best_repeat(ids: list[int]) -> tuple[int, int, int] | None:
  """``(start, period, repeats)`` of the longest run of ``ids`` made of one period repeated at least
  twice (most kernels covered, then the shortest period, then the latest start: where a first layer
  differs, its input being data with no gradient, the period starts at the second layer rather than
  half-way through the first); O(n^2)."""
  n = len(ids)
  best: tuple[int, int, int, int, int] | None = None
  for p in range(1, n // 2 + 1):
    run = 0
    for i in range(n - p - 1, -1, -1):
      run = run + 1 if ids[i] == ids[i + p] else 0
      reps = run // p + 1
      if reps < 2:
        continue
      key = (reps * p, -p, i, reps, p)
      if best is None or key > best:
        best = key
  if best is None:
    return None
  covered, _, start, reps, p = best
  return start, p, reps


_FOLDS = itertools.count(1)
"""Ids of `fold_repeats`'s folds (`Kernel.stack`)."""


def fold_repeats(kernels: list[Kernel]) -> list[Kernel]:
  """The canonical layer graph: consecutive runs of kernels that repeat one period of structure
  (`_signature`) at least twice become one period whose kernels have ``count`` times the repeats.

  This is what ``lax.scan`` (and Flax's ``nn.scan``/``nnx.scan``) give by construction; a Python loop
  over layers (Flax linen or NNX modules, equinox, plain JAX; not Haiku's default module names,
  numbered across layers: ``linear``, ``linear_1`` ...), named per layer, with shared
  names or with none, gives the same graph after folding, so the cost and the activation memory of a
  network do not depend on how its loop is written. A folded kernel keeps its first instance's
  products, weights and boundary tensors (identical by signature), the mean element-wise work and
  the mean saved activations of its instances (the totals are unchanged); its name is the first
  instance's, with the numbers in which the instances' names differ replaced by ``*``.
  """
  if len(kernels) < 2:
    return kernels
  table: dict[tuple[Any, ...], int] = {}
  ids = [table.setdefault(_signature(k), len(table)) for k in kernels]
  found = _best_repeat(ids)
  if found is None:
    return kernels
  start, p, reps = found
  instances = [kernels[start + j * p : start + (j + 1) * p] for j in range(reps)]
  block = [_merge_instances([inst[q] for inst in instances]) for q in range(p)]
  fold = next(_FOLDS)  # (a fold inside this block keeps this block's stack: one stack)
  block = [k if k.stack else dataclasses.replace(k, stack=fold) for k in block]
  # (a period may repeat inside itself: two identical sub-layers of a layer fold too)
  return fold_repeats(kernels[:start]) + fold_repeats(block) + fold_repeats(kernels[start + reps * p :])


_INSTANCE_SUFFIX = re.compile(r"_\d+(?=/|#|$)")
"""A module's instance number (Haiku names the second ``linear`` of a model ``linear_1``, its first
plain ``linear``): not part of a layer's layout."""


def _shape_class(m: Matmul) -> tuple[Any, ...]:
  """A product's shape up to its widths: which of ``m, k, n`` grow with the batch, and whether its
  fixed sizes (the weight's) widen, keep or narrow (``x @ W1`` of an FFN widens, ``h @ W2`` narrows)."""
  fixed = [z.at_trace for z in (m.m, m.k, m.n) if z.exponent == 0]
  order = tuple((a > b) - (a < b) for a, b in zip(fixed, fixed[1:]))
  return (m.phase, m.weight, m.m.exponent, m.k.exponent, m.n.exponent, order)


def _layout(k: Kernel) -> tuple[Any, ...]:
  """`_signature` without sizes: a kernel's name up to numbers and instance suffixes (Haiku's
  ``linear`` and ``linear_1`` are one name), its products' shapes up to their widths
  (`_shape_class`; the forward products only: the first layer, whose input is data, has no input
  gradient), and whether it has weights. Layers that differ only in width (OpenELM's
  per-layer feed-forward widths, a CNN's channel counts) share it; the two products of a layer split
  into kernels by op pattern (``dot_general_N``: one widens, one narrows) do not."""
  mms = tuple(sorted(_shape_class(m) for m in k.matmuls if m.phase == "fwd"))
  name = _DIGITS.sub("*", _INSTANCE_SUFFIX.sub("", k.name))
  return (name, mms, bool(k.weights), () if mms else tuple(sorted(k.vector)))


def layer_runs(kernels: list[Kernel]) -> list[tuple[list[Kernel], int]]:
  """``(kernels, layers)`` runs of consecutive kernels that `fold_repeats` left unfolded (count 1):
  a run that repeats one period of layout (`_layout`: the structure, whatever the sizes) at least
  twice is that many layers; each other stretch is one. Layers that differ in width are still
  layers: they stream their own weights one after another, as a folded stack's do.

  >>> def dense(name, width):  # one weight product [8 x width] @ [width x width]
  ...   product = Matmul("fwd", Size(1, 0), Size(8, 1), Size(width, 0), Size(width, 0), 16, True)
  ...   return Kernel(name=name, count=1, order=0, matmuls=[product], weights={width: (width**2, 16)})
  >>> runs = layer_runs([dense("embed", 4), dense("layer_0", 4), dense("layer_1", 6), dense("layer_2", 8)])
  >>> [([k.name for k in run], layers) for run, layers in runs]
  [(['embed'], 1), (['layer_0', 'layer_1', 'layer_2'], 3)]
  """
  if not kernels:
    return []
  table: dict[tuple[Any, ...], int] = {}
  found = _best_repeat([table.setdefault(_layout(k), len(table)) for k in kernels])
  if found is None:
    return [(kernels, 1)]
  start, p, reps = found
  end = start + p * reps
  return [*layer_runs(kernels[:start]), (kernels[start:end], reps), *layer_runs(kernels[end:])]


def stacks(kernels: list[Kernel]) -> list[list[Kernel]]:
  """A run of consecutive repeated kernels (``count > 1``) split into the stacks `fold_repeats`
  folded one after another (`Kernel.stack`): layers 0-2 at one width and 3-4 at another are two
  stacks (5 layers), not one of 2 or 3. A kernel no fold made (a ``scan``'s) stays with its
  neighbours: two products of a scanned layer folded into one are still that layer's."""
  out: list[list[Kernel]] = []
  for k in kernels:
    last = out[-1][-1].stack if out else None
    # (a kernel of no fold, 0, is a scan's: a fold inside a scanned layer does not split the scan)
    if out and (k.stack == last or not k.stack or not last):
      out[-1].append(k)
    else:
      out.append([k])
  return out


def fuse_productless(kernels: list[Kernel]) -> list[Kernel]:
  """Within a repeated layer (consecutive kernels of one ``count > 1``), a kernel with no matrix
  product (a norm, named as its own module or not) runs with the next kernel of the layer (the
  product it feeds), or the previous one when it ends the layer: how the layer is split into
  kernels then depends less on which library named which module."""
  out = list(kernels)
  i = 0
  while i < len(out):
    k = out[i]
    if k.count > 1 and not k.matmuls:
      nxt = out[i + 1] if i + 1 < len(out) and out[i + 1].count == k.count else None
      prev = out[i - 1] if i > 0 and out[i - 1].count == k.count else None
      dst = nxt if nxt is not None and nxt.matmuls else prev if prev is not None and prev.matmuls else None
      if dst is not None:
        _absorb(dst, k)
        del out[i]
        continue
    i += 1
  return out


def _add_work(dst: Kernel, k: Kernel) -> None:
  """Add ``k``'s element-wise work and saved activations to ``dst`` (same count)."""
  for key, val in k.vector.items():
    acc = dst.vector.setdefault(key, [0.0, 0.0])
    acc[0] += val[0]
    acc[1] += val[1]
  for key, val in k.saved.items():
    dst.saved.setdefault(key, val)
  dst.saved_core |= k.saved_core


def _absorb(dst: Kernel, k: Kernel) -> None:
  """Add ``k``'s work, weights and saved activations to ``dst`` (same count)."""
  _add_work(dst, k)
  for r, w in k.weights.items():
    dst.weights.setdefault(r, w)
  dst.weight_instances = max(dst.weight_instances, k.weight_instances)
  made = set(dst.act_out) | set(k.act_out)
  act_in = {key: v for key, v in {**k.act_in, **dst.act_in}.items() if key not in made}
  dst.act_out = {
    key: v for key, v in {**dst.act_out, **k.act_out}.items() if key not in dst.act_in and key not in k.act_in
  }
  dst.act_in = act_in
  dst.order = min(dst.order, k.order)


def _merge_instances(ks: list[Kernel]) -> Kernel:
  rep = ks[0]
  n = len(ks)
  vector: dict[tuple[str, str, int, int], list[float]] = {}
  for k in ks:
    for key, (e, ins) in k.vector.items():
      acc = vector.setdefault(key, [0.0, 0.0])
      acc[0] += e / n
      acc[1] += ins / n
  total = sum(k.saved_bytes(1.0) for k in ks) / n
  own = rep.saved_bytes(1.0)
  scale = total / own if own > 0 else 1.0
  saved = {key: (e * scale, x, b) for key, (e, x, b) in rep.saved.items()}
  core = set(rep.saved_core)
  if own <= 0 < total:  # (the first instance saves nothing of its own: take one that does)
    other = max(ks, key=lambda k: k.saved_bytes(1.0))
    saved, core = dict(other.saved), set(other.saved_core)
  parts = [_DIGITS.split(k.name) for k in ks]
  name = rep.name
  if len({len(x) for x in parts}) == 1 and len({k.name for k in ks}) > 1:
    cols = list(zip(*parts))
    if all(len(set(c)) == 1 or all(t.isdigit() for t in c) for c in cols):
      name = "".join(c[0] if len(set(c)) == 1 else "*" for c in cols)
  names = tuple(k.name for k in ks) if len({k.name for k in ks}) > 1 and rep.count == 1 else ()
  # the folded instances read one weight array each, or all the same ones (one layer applied again)
  own = len({frozenset(k.weights) for k in ks}) > 1
  return dataclasses.replace(
    rep,
    name=name,
    count=rep.count * n,
    vector=vector,
    saved=saved,
    saved_core=core,
    instance_names=names,
    weight_instances=rep.weight_instances * (n if own else 1),
  )


def _nested(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
  """Whether one scope path is a prefix of the other (a sub-scope does not leave its parent)."""
  n = min(len(a), len(b))
  return a[:n] == b[:n]


def _backward_occurrence(
  base: tuple[Any, ...],
  s: Site,
  producer: dict[int, tuple[Any, ...]],
  occurrence: dict[tuple[Any, ...], int],
  last_bwd: dict[tuple[Any, ...], tuple[Any, ...]],
  reader: dict[int, tuple[Any, ...]],
  act_owner: dict[int, tuple[Any, ...]],
  forward: set[int],
  ahead: Callable[[], tuple[Any, ...] | None],
) -> tuple[Any, ...]:
  """The kernel of a backward (or update) equation of a scope with several occurrences: the
  occurrence whose forward pass read one of its weights (``dx = dy W^T``, ``dy * scale``), whose forward pass
  produced one of its inputs (a saved activation), whose forward product read one of its inputs
  (``dW = x^T dy``), or that produced one of its inputs in the backward pass (a cotangent: the
  weakest evidence, since a cotangent crosses from the next layer); else the one the next backward
  equations of this scope show by forward evidence (``ahead``); else the one the previous backward
  equation of this scope went to."""
  scopes, mult = base
  n = occurrence.get(base)
  if n is None:
    return ("scope", scopes, mult, 0)
  if n == 0:
    return ("scope", scopes, mult, 0)
  src = _forward_evidence(base, s, producer, reader, act_owner, forward)
  if src is None:
    src = next((kid for kid in (producer.get(k) for k in s.in_keys) if _ours(kid, base)), None)
  if src is None:
    src = ahead()
  if src is not None:
    last_bwd[base] = src
    return src
  return last_bwd.get(base, ("scope", scopes, mult, n))


_LOOKAHEAD = 500  # equations searched ahead for the occurrence of an equation with no evidence


def _ours(kid: tuple[Any, ...] | None, base: tuple[Any, ...]) -> bool:
  return kid is not None and kid[0] == "scope" and (kid[1], kid[2]) == base


def _forward_evidence(
  base: tuple[Any, ...],
  s: Site,
  producer: dict[int, tuple[Any, ...]],
  reader: dict[int, tuple[Any, ...]],
  act_owner: dict[int, tuple[Any, ...]],
  forward: set[int],
) -> tuple[Any, ...] | None:
  """The occurrence of ``base`` the forward pass ties ``s`` to: by a parameter it read, a saved
  activation it made, or an activation its forward product read. For a product (a weight's gradient
  ``x^T dy``), the forward product that read its input comes before the input's maker: a layer's
  first product may read the residual stream the layer before made."""
  evidence = [reader.get(r) for r in s.weight_roots]
  made = [producer.get(key) for key in s.in_keys if key in forward]
  read = [act_owner.get(key) for key in s.in_keys]
  evidence += read + made if s.kind == "matmul" else made + read
  return next((kid for kid in evidence if _ours(kid, base)), None)


def _shape_exponent(shape: tuple[int, ...], exps: tuple[int, ...]) -> int:
  """A boundary tensor of a per-sample equation grows linearly with the batch, unless it is a scalar."""
  return 1 if max(exps, default=0) >= 1 and len(shape) > 0 else 0


def _masked_products(sites: list[Site], flow: dict[int, int], per_sample: list[bool]) -> dict[int, float]:
  """The activation x activation products a mask touches, whatever kernel each lands in, by index,
  with the fraction of their scores it keeps: from every equation that applies a mask (`Site.kept`
  < 1: the mask, and its transpose in the backward pass) along the data flow through non-product
  per-sample equations (across loop boundaries: `Walker.flow`), back to the products that made the masked scores
  (``Q K^T``, ``dO V^T``) and on to the products that read them (``P V``, ``P^T dO``, ``dS K``,
  ``dS^T Q``); a product ends the walk, and so does the weight update (a learned bias's gradient
  reaches the optimizer, whose step count every other parameter's update reads: through it the
  walk would reach every layer's backward, T5's unmasked encoder included). A product two masks
  reach keeps the smaller fraction (the walks start from the mask that keeps least)."""

  def origin(key: int) -> int:
    while key in flow:
      key = flow[key]
    return key

  made_by: dict[int, int] = {}
  read_by: dict[int, list[int]] = {}
  for i, s in enumerate(sites):
    for key in s.out_keys:
      made_by[origin(key)] = i
    for key in s.in_keys:
      read_by.setdefault(origin(key), []).append(i)
  found: dict[int, float] = {}
  seen: set[int] = set()
  for start in sorted((i for i, s in enumerate(sites) if s.masked), key=lambda i: sites[i].kept):
    kept = sites[start].kept
    todo = [start]
    while todo:
      i = todo.pop()
      if i in seen or not per_sample[i]:
        continue
      seen.add(i)
      s = sites[i]
      if s.kind == "matmul":
        if not s.weight_roots and s.measures[0] > 1:
          found[i] = kept
        continue
      near = [made_by[k] for k in map(origin, s.in_keys) if k in made_by]
      near += [j for k in map(origin, s.out_keys) for j in read_by.get(k, ())]
      todo.extend(j for j in near if j not in seen)
  return found


def _add_site(
  k: Kernel, s: Site, e: tuple[int, ...], phase: str, compute_bits: int, walker: Walker, kept: float
) -> None:
  """Add one equation's work to its kernel (its ``mult`` equals the kernel's ``count``)."""
  bits = min(s.bits, compute_bits)
  if s.kind == "matmul":
    inst, m, kk, n = s.measures
    k.matmuls.append(
      Matmul(
        phase,
        Size(inst, e[0]),
        Size(m, e[1]),
        Size(kk, e[2]),
        Size(n, e[3]),
        bits,
        weight=bool(s.weight_roots),
        kept=kept,
        recomputed=s.recomputed,
      )
    )
  else:
    acc = k.vector.setdefault((phase, s.kind, e[0], bits), [0.0, 0.0])
    acc[0] += s.measures[0] * s.ops
    acc[1] += 1
  if phase != "update":
    for r in s.weight_roots:
      elements = _root_elements(s, r, walker)
      whole = _root_elements(s, r, walker, share=False)
      if s.mult > 1 and whole > 0:
        k.weight_instances = max(k.weight_instances, round(s.mult * elements / whole))
      prev = k.weights.get(r)
      if prev is None or elements > prev[0]:
        k.weights[r] = (elements, min(s.bits, compute_bits))


def _root_elements(s: Site, root: int, walker: Walker, share: bool = True) -> float:
  """Elements of the parameter operand with this root, per instance of the site's kernel (the
  per-iteration slice inside a scan; a broadcast bias counts its own elements, not the broadcast
  shape's). A weight that the ``mult`` instances share (a loop closes over it: an RNN's weights
  over time, one layer applied ALBERT-style) is one array: each instance holds its share,
  ``elements * distinct / mult``, so the kernel's instances together count, stream and update it once
  (``share=False``: the elements one instance reads, whoever else reads them)."""
  for pos, key in enumerate(s.in_keys):
    if walker.root.get(key) == root:
      elements = min(math.prod(s.in_shapes[pos]), walker.param_size.get(key, math.inf))
      return elements * (min(1.0, walker.distinct.get(key, 1) / max(s.mult, 1)) if share else 1.0)
  return 0


def _merge_glue(
  kernels: dict[tuple[Any, ...], Kernel],
  assignment: list[tuple[Any, ...]],
  sites: list[Site],
  producer: dict[int, tuple[Any, ...]],
) -> list[Kernel]:
  """Fold kernels with no matrix product and no weights into the kernel that fed them."""

  def is_glue(kid: tuple[Any, ...]) -> bool:
    k = kernels[kid]
    return not k.matmuls and not k.weights and kid[0] != "update"

  target: dict[tuple[Any, ...], tuple[Any, ...]] = {}
  for kid, s in zip(assignment, sites):
    if kid in target or not is_glue(kid):
      continue
    for key in s.in_keys:
      src = producer.get(key)
      if src is not None and src != kid and kernels[src].count == kernels[kid].count:
        target[kid] = src
        break
  for kid in list(target):  # glue fed by glue: follow the chain to a kernel with work
    seen = {kid}
    dst = target[kid]
    while dst in target and dst not in seen:
      seen.add(dst)
      dst = target[dst]
    if is_glue(dst):
      del target[kid]
    else:
      target[kid] = dst
  # glue fed by nothing that costs (e.g. a sum over a constant mask): the kernel before it
  working = sorted((k.order, kid) for kid, k in kernels.items() if not is_glue(kid) and kid[0] != "update")
  for kid, k in kernels.items():
    if is_glue(kid) and kid not in target:
      same = [w for o, w in working if kernels[w].count == k.count]
      before = [w for o, w in working if o <= k.order and kernels[w].count == k.count]
      if same:
        target[kid] = before[-1] if before else same[0]
  out = []
  for kid, k in kernels.items():
    dst = target.get(kid)
    if dst is None:
      out.append(k)
      continue
    d = kernels[dst]
    _add_work(d, k)
    for key, val in k.act_out.items():
      d.act_out.setdefault(key, val)
    d.out_shapes.extend(k.out_shapes)
  return out


def _merge_update_only(kernels: list[Kernel]) -> list[Kernel]:
  """Fold kernels whose only work is batch-independent and that read no weights into ``weight_update``
  (e.g. position tables that JAX hoisted out of a loop)."""
  keep: list[Kernel] = []
  moved: list[Kernel] = []
  update: Kernel | None = None
  for k in kernels:
    if k.name == "weight_update" and k.count == 1:
      update = k
    only_update = not k.matmuls and all(key[0] == "update" for key in k.vector)
    if k is not update and only_update and not k.weights:
      moved.append(k)
    else:
      keep.append(k)
  if not moved:
    return keep
  if update is None:
    update = Kernel(name="weight_update", count=1, order=max((k.order for k in kernels), default=0) + 1)
    keep.append(update)
  for k in moved:
    for key, val in k.vector.items():
      acc = update.vector.setdefault(key, [0.0, 0.0])
      acc[0] += val[0] * k.count
      acc[1] += val[1] * k.count
  return keep
