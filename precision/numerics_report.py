"""`numerics_report`: where a function loses precision under a `Policy`, equation by equation.

Method
======

The function is traced once to a jaxpr. The `precision.autocast` interpreter then runs it
twice on the same arguments, under ``jax.jit``:

1. the *shadow* run, with the float32 policy (the identity: every equation bound as
   written), which gives each equation's float32 output computed from float32 inputs;
2. the *policy* run, with the policy's rules (exactly what `autocast` computes).

The interpreter's observer hook sees every equation of both runs (inside ``jit``, ``scan``,
``while``, ``cond``, ``remat``, custom_jvp / custom_vjp rules, since those bodies are
interpreted by the same pass); for each equation with float inputs or outputs it sends the
inputs and outputs to the host (``jax.debug.callback``). The shadow run's arrays are kept
until the policy run delivers the same equation's arrays (matched by equation and by call
count, so iteration ``i`` of a scan meets iteration ``i``; inside a ``shard_map`` body each
shard calls back with its position on the mesh and is matched with the same shard's shadow,
and a row sums the shards). Statistics are accumulated in
float64 NumPy, summed over the calls of an equation (a scan's iterations aggregate into
one row):

* ``sqnr_db`` = ``10 log10(sum s^2 / sum (x - s)^2)``, ``s`` the float32 shadow output,
  ``x`` the policy output (+inf when they are equal, -inf when ``s`` is all zero and ``x``
  is not). Elements where the shadow is not finite are left out of the sums. An element
  finite in the shadow that the policy run makes inf or NaN (counted as ``overflow`` or
  ``nonfinite``) is a value lost: the row's ``sqnr_db`` is -inf.
* ``input_sqnr_db``: the worst SQNR over the equation's float inputs (policy inputs against
  shadow inputs); ``round_sqnr_db``: the SQNR of the shadow output rounded once to the
  compute format (what the format alone costs).
* ``drop_db`` = ``min(input_sqnr_db, round_sqnr_db) - sqnr_db``: the precision
  this equation itself lost beyond the format's own rounding and its inputs' error.
  +inf where the equation loses a value (above) that none of its inputs had lost: where a
  loss or gradient first becomes inf or NaN ranks first; 0 where an input had lost it already
  (whether or not the output still holds it).
  Rounding an exact value costs about 0 dB; a subtraction of two nearly equal rounded
  values (a catastrophic cancellation) drops by tens of dB and ranks first although every
  later equation inherits its error. 0 when the output is exact. Where the inputs and the
  rounded shadow are both exact (an exact op such as ``select_n`` whose predicate flipped),
  the reference is ``6.02 (m + 1) + 4.77`` dB (``m`` fraction bits: one rounding with a
  relative error uniform in +-2^-(m+1)).
* ``overflow``: finite shadow values that became inf (or, in a format without inf, a
  finite shadow value beyond the format's max that became its max or NaN; a value the policy keeps
  in float32, such as a reduction's sum, is not counted however large); ``underflow``: non-zero shadow values that
  became 0 because they lie below the format's range (one rounding to the format gives 0 too);
  ``cancelled``: non-zero shadow values that became exactly 0 though the format holds them (the
  rounded operands cancelled: ``a - b`` with ``a`` and ``b`` equal after rounding), not counting a
  zero an operand brought (an input already 0 where its shadow is not, element by element for
  elementwise ops, anywhere in the input for others: an upstream underflow, counted there);
  ``subnormal``:
  non-zero outputs below the format's smallest normal.
* ``flips``: decisions that differ from the shadow's: comparisons (``gt``, ``ge``, ... : a
  ReLU's gradient mask), ``max`` / ``min`` choices (ReLU, max-pooling written with
  ``max``: the order of the two operands, a tie included, so a ReLU input that cancels to
  exactly zero where float32's is positive is a flip, as the gradient mask changes), the
  predicate of ``select_n``, and ``argmax`` / ``argmin`` indices;
  ``flip_distance`` is the smallest ``|a - b|`` of the shadow operands among the flipped
  elements (for argmax: the shadow gap between the two chosen elements; for ``eq`` / ``ne``,
  as in the gradient of ``max``, among the flipped pairs that differ in float32: the gap
  between the float32 maximum and the element the policy run took for it). A flip at a small
  distance is a decision the float32 model itself barely made: one such element can carry
  a large share of a gradient.

Rows are per equation (and per name scope it was reached from), sorted by ``drop_db``,
worst first. ``data_movement`` equations and equations with neither float inputs nor float
outputs are not reported. Equations on values that are not float32 (a bfloat16 array the
program itself made) run the same in both runs, as `autocast` leaves them alone: their rows
are exact. ``NumericsReport.unmatched`` counts the calls of either run that had no call of the
same equation in the other (a ``cond`` that took the other branch: one on each side; a loop that
ran more or fewer times); ``table()`` and ``to_dict()`` show it.

Cost
====

Each equation is evaluated twice (the two runs), and every reported equation's inputs and
outputs of both runs cross to the host and are kept in host memory until matched: the
memory is about that of storing every activation of the program in float32 (the shadow
run's, for every scan iteration), plus float64 statistics. Measured on 2 shared CPU cores
(`benchmarks/numerics_report_examples.py`): the ``value_and_grad`` of the reference BERT-tiny
(2 layers, width 128, batch 8 x 128 tokens; 530 reported equations) takes 25-64 s per
report, a small ResNet (588 equations) 30-40 s. These are the largest models measured; the
time and the host memory grow with the number of activation elements per step (every one
crosses to the host twice), so report larger models on a small batch.

Example:
  >>> import jax.numpy as jnp, precision
  >>> def f(x, y):
  ...   return (x * 1.0001) - (y * 1.0001)  # two rounded values, nearly equal, subtracted
  >>> report = precision.numerics_report(f, "c=cb16", jnp.float32(1.0009765625), jnp.float32(1.0))
  >>> report.rows[0].primitive
  'sub'
  >>> report.rows[0].drop_db > 20
  True
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import html
import math
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from precision import _control_flow, _interpreter
from precision import _jax_compat as compat
from precision._op_classes import CONTROL_FLOW, PRIMITIVE_CLASSES
from precision._state import Pass
from precision._tracing import (
  Statics,
  as_policy,
  check_callable,
  module_as_argument,
  module_state_errors,
  trace_fn,
)
from precision.formats import FloatFormat
from precision.policy import Policy
from precision.rounding import _host_round

__all__ = ("NumericsReport", "Row", "numerics_report")

_COMPARISONS = ("gt", "ge", "lt", "le", "eq", "ne")
_CHOICES = ("max", "min")
_ARG = ("argmax", "argmin")


@dataclasses.dataclass
class Row:
  """One equation's statistics (summed over its calls: a scan's iterations, a function called twice).

  ``source`` is the user's ``file:line``; ``scope`` the name stack (``jax.named_scope``,
  Flax module paths, ``jvp(...)`` / ``transpose(...)`` for derivative equations).
  """

  primitive: str
  source: str
  scope: str
  op_class: str
  sqnr_db: float
  drop_db: float
  input_sqnr_db: float
  round_sqnr_db: float
  overflow: int
  underflow: int
  cancelled: int
  subnormal: int
  nonfinite: int
  flips: int
  flip_distance: float | None
  elements: int
  calls: int
  order: int  # the equation's position in the program (the order the interpreter met it)

  def to_dict(self) -> dict[str, Any]:
    return {k: _jsonable(v) for k, v in dataclasses.asdict(self).items()}


def _jsonable(v: Any) -> Any:
  if isinstance(v, float) and not math.isfinite(v):
    return str(v)
  return v


class _Acc:
  """Running float64 sums for one equation."""

  def __init__(self, meta: tuple[str, str, str, str], order: int, n_inputs: int):
    self.meta = meta
    self.order = order
    self.sig = self.noise = self.rsig = self.rnoise = 0.0
    self.in_sig = [0.0] * n_inputs
    self.in_noise = [0.0] * n_inputs
    self.in_lost = [0] * n_inputs  # elements finite in the shadow that the policy run lost
    self.lost = 0
    self.overflow = self.underflow = self.cancelled = self.subnormal = self.nonfinite = self.flips = 0
    self.flip_distance = math.inf
    self.elements = self.calls = 0


def _sqnr(sig: float, noise: float) -> float:
  if noise == 0.0:
    return math.inf
  if sig == 0.0:
    return -math.inf
  return 10.0 * math.log10(sig / noise)


def _is_float_dtype(dtype: Any) -> bool:
  return bool(jnp.issubdtype(dtype, jnp.floating))  # NumPy's own test misses ml_dtypes' bfloat16


def _lost(x: np.ndarray, s: np.ndarray) -> int:
  """Elements finite in the shadow ``s`` and not finite in the policy output ``x``."""
  x, s = np.broadcast_arrays(np.asarray(x, np.float64), np.asarray(s, np.float64))
  return int(np.sum(np.isfinite(s) & ~np.isfinite(x)))


_ELEMENTWISE_EXACT = frozenset({
  "max", "min", "neg", "abs", "sign", "select_n", "clamp", "floor", "ceil", "round", "copy", "copy_p",
  "convert_element_type", "reduce_precision",
})  # fmt: skip


def _inherited_zeros(name: str, x_in: tuple, s_in: tuple, shape: tuple) -> np.ndarray:
  """Where an output's zero may come from an input that was already 0 in the policy run but not in
  the shadow (an operand that underflowed or cancelled upstream): not a cancellation of this
  equation. Element by element for an elementwise op (``name``'s class, and an input that
  broadcasts to the output); for any other op (a product, a reduction, a cumulative sum, a sort:
  an output element reads many input elements) the whole output, when an input lost any value."""
  elementwise_op = (
    PRIMITIVE_CLASSES.get(name) in ("elementwise", "transcendental") or name in _ELEMENTWISE_EXACT
  )
  out = np.zeros(shape, bool)
  for x, s in zip(x_in, s_in):
    if not _is_float_dtype(x.dtype) or np.shape(s) != np.shape(x):
      continue
    lost = (x == 0) & (s != 0)
    if not lost.any():
      continue
    try:
      elementwise = elementwise_op and np.broadcast_shapes(x.shape, shape) == tuple(shape)
    except ValueError:
      elementwise = False
    out = out | (np.broadcast_to(lost, shape) if elementwise else np.ones(shape, bool))
  return out


def _energies(x: np.ndarray, s: np.ndarray) -> tuple[float, float]:
  x = np.asarray(x, np.float64)
  s = np.asarray(s, np.float64)
  x, s = np.broadcast_arrays(x, s)
  ok = np.isfinite(x) & np.isfinite(s)
  return float(np.sum(np.square(s[ok]))), float(np.sum(np.square(x[ok] - s[ok])))


class _Collector:
  """The two observers: the shadow run stores arrays, the policy run compares with them."""

  def __init__(self, fmt: FloatFormat):
    self.fmt = fmt
    # The SQNR of one rounding with a relative error uniform in +-u (u = 2^-(m+1)): the reference
    # of an equation whose inputs are exact and whose shadow output the format holds.
    self.ideal_db = 6.02 * (fmt.mantissa_bits + 1) + 4.77
    self.shadow: dict[Any, collections.deque] = collections.defaultdict(collections.deque)
    self.meta: dict[Any, tuple[str, str, str, str]] = {}
    self.accs: dict[Any, _Acc] = {}
    self.order: dict[Any, int] = {}  # key -> position in the program, set as the trace meets it
    self.missing = 0
    self.pending: list[Any] = []  # keys whose source is the next enclosing equation's
    self.lock = threading.Lock()

  def observer(self, run: str) -> Callable[..., None]:
    def observe(eqn: Any, values: list, in_tags: list, outs: list, out_tags: list) -> None:
      name = eqn.primitive.name
      op_class = "comparison" if name in _COMPARISONS else PRIMITIVE_CLASSES.get(name, "unknown")
      if self.pending and name in CONTROL_FLOW:  # observed after its body: give the body its line
        source = _user_source(eqn.source_info.traceback)
        if source != "?":
          outer = compat.full_name_stack(eqn)
          for key in self.pending:  # tracing a custom rule's body resets the name stack
            name_, _, scope_, class_ = self.meta[key]
            self.meta[key] = (name_, source, scope_ or outer, class_)
          self.pending.clear()
      if name in CONTROL_FLOW or op_class == "data_movement":
        return
      floats_in = [i for i, v in enumerate(eqn.invars) if _is_float(v.aval)]
      floats_out = [i for i, v in enumerate(eqn.outvars) if _is_float(v.aval)]
      decision = name in _COMPARISONS or name in _ARG or name == "select_n"
      if not floats_out and not (decision and floats_in):
        return
      scope = compat.full_name_stack(eqn)
      key = (id(eqn), scope)
      if key not in self.meta:
        source = _user_source(eqn.source_info.traceback)
        self.meta[key] = (name, source, scope, op_class)
        self.order.setdefault(key, len(self.order))
        if source == "?":  # inside a library function (jax.nn.relu): the calling equation's line
          self.pending.append(key)
      send_in = list(range(len(values))) if decision or name in _CHOICES else floats_in
      ins = [jnp.asarray(values[i]) for i in send_in]
      out_list = (
        [jnp.asarray(outs[i]) for i in range(len(outs))] if decision else [outs[i] for i in floats_out]
      )
      # Unordered callbacks: an ordered one threads a token through the program, which XLA's GPU
      # compiler can abort on (a CHECK in its fusion cost model, seen on an H100 with JAX 0.11.2),
      # and JAX refuses ordered effects on more than one device. Nothing here needs their order
      # across equations: the runs are matched per equation (and per shard), and the calls of one
      # equation arrive in program order, as a loop's iterations run one after another.
      axes = _control_flow.manual_axes()
      if axes:  # in a shard_map body: one call per shard, told apart by its position on the mesh
        receive = functools.partial(self._receive_shard, run, key, tuple(send_in), len(ins), len(axes))
      else:
        receive = functools.partial(self._receive, run, key, tuple(send_in), len(ins))
      jax.debug.callback(receive, *[jax.lax.axis_index(a) for a in axes], *ins, *out_list)

    return observe

  def _receive_shard(self, run: str, key: Any, in_index: tuple, n_in: int, n_axes: int, *arrays: Any) -> None:
    shard = tuple(int(i) for i in arrays[:n_axes])
    self._receive(run, key, in_index, n_in, *arrays[n_axes:], shard=shard)

  def _receive(self, run: str, key: Any, in_index: tuple, n_in: int, *arrays: Any, shard: Any = None) -> None:
    arrays = tuple(np.asarray(a) for a in arrays)
    with self.lock:  # the shards of a shard_map call back from several threads
      self._receive_locked(run, key, in_index, n_in, arrays, shard)

  def _receive_locked(
    self, run: str, key: Any, in_index: tuple, n_in: int, arrays: tuple, shard: Any
  ) -> None:
    queue_key = key if shard is None else (key, shard)
    if run == "shadow":
      self.shadow[queue_key].append(arrays)
      return
    queue = self.shadow.get(queue_key)
    if not queue:
      self.missing += 1
      return
    shadow = queue.popleft()
    acc = self.accs.get(key)
    if acc is None:
      acc = self.accs[key] = _Acc(self.meta[key], self.order[key], n_in)
    self._accumulate(acc, key, in_index, n_in, arrays, shadow)

  def _accumulate(self, acc: _Acc, key: Any, in_index: tuple, n_in: int, xs: tuple, ss: tuple) -> None:
    name = acc.meta[0]
    fmt = self.fmt
    acc.calls += 1
    x_in, s_in = xs[:n_in], ss[:n_in]
    x_out, s_out = xs[n_in:], ss[n_in:]
    for j, (x, s) in enumerate(zip(x_in, s_in)):
      if _is_float_dtype(x.dtype):
        sig, noise = _energies(x, s)
        acc.in_sig[j] += sig
        acc.in_noise[j] += noise
        acc.in_lost[j] += _lost(x, s)
    with np.errstate(over="ignore", invalid="ignore"):
      for x, s in zip(x_out, s_out):
        if not _is_float_dtype(x.dtype):
          continue
        inherited = _inherited_zeros(name, x_in, s_in, x.shape)
        acc.elements += x.size
        sig, noise = _energies(x, s)
        acc.sig += sig
        acc.noise += noise
        r = _host_round(np.asarray(s, np.float64), fmt, "nearest_even")
        r = np.where(np.abs(r) > fmt.max, np.sign(r) * (np.inf if fmt.has_inf else fmt.max), r)
        rsig, rnoise = _energies(r, s)
        acc.rsig += rsig
        acc.rnoise += rnoise
        finite_s = np.isfinite(s)
        # a format without inf saturates at its max or gives NaN (float8_e4m3fn); a value the policy
        # keeps in float32 beyond the format's max (a reduction's sum) is no overflow of the format
        saturated = (np.abs(x) == fmt.max) | np.isnan(x)
        over = finite_s & (np.isinf(x) | ((not fmt.has_inf) & (np.abs(s) > fmt.max) & saturated))
        acc.overflow += int(np.sum(over))
        zeroed = (s != 0) & finite_s & (x == 0)  # below the format's range, or cancelled to exactly 0
        acc.underflow += int(np.sum(zeroed & (r == 0)))
        acc.cancelled += int(np.sum(zeroed & (r != 0) & np.logical_not(inherited)))
        acc.subnormal += int(np.sum((x != 0) & (np.abs(x) < fmt.min_normal)))
        acc.nonfinite += int(np.sum(~np.isfinite(x) & finite_s & ~over))
        acc.lost += _lost(x, s)
      flipped, distance = _flips(name, x_in, s_in, x_out, s_out, self.meta[key])
      acc.flips += flipped
      if distance is not None:
        acc.flip_distance = min(acc.flip_distance, distance)

  def rows(self) -> list[Row]:
    rows = []
    for acc in self.accs.values():
      name, source, scope, op_class = acc.meta
      sqnr = _sqnr(acc.sig, acc.noise)
      ins = [_sqnr(s, n) for s, n in zip(acc.in_sig, acc.in_noise)]
      in_sqnr = min(ins) if ins else math.inf
      round_sqnr = _sqnr(acc.rsig, acc.rnoise)
      if acc.elements == 0:  # a decision (comparison, argmax): no float output
        sqnr = round_sqnr = math.inf
      if any(acc.in_lost):
        in_sqnr = -math.inf
      reference = min(in_sqnr, round_sqnr)
      if acc.lost:  # a value finite in float32 became inf or NaN: here, or in an input already
        sqnr = -math.inf
        drop = 0.0 if in_sqnr == -math.inf else math.inf
      elif in_sqnr == -math.inf:  # an input had lost values this output no longer holds (a select)
        drop = 0.0
      else:
        drop = 0.0 if sqnr == math.inf else (reference if reference < math.inf else self.ideal_db) - sqnr
      rows.append(
        Row(
          primitive=name,
          source=source,
          scope=scope,
          op_class=op_class,
          sqnr_db=sqnr,
          drop_db=drop,
          input_sqnr_db=in_sqnr,
          round_sqnr_db=round_sqnr,
          overflow=acc.overflow,
          underflow=acc.underflow,
          cancelled=acc.cancelled,
          subnormal=acc.subnormal,
          nonfinite=acc.nonfinite,
          flips=acc.flips,
          flip_distance=None if acc.flips == 0 or acc.flip_distance == math.inf else acc.flip_distance,
          elements=acc.elements,
          calls=acc.calls,
          order=acc.order,
        )
      )
    return sorted(rows, key=_rank)


def _rank(row: Row) -> tuple:
  drop = row.drop_db if not math.isnan(row.drop_db) else -math.inf
  return (-drop, -row.flips, row.sqnr_db, row.order)


def _flips(
  name: str, x_in: tuple, s_in: tuple, x_out: tuple, s_out: tuple, meta: Any
) -> tuple[int, float | None]:
  """(count of decisions that differ from the shadow's, smallest shadow distance among them)."""
  if name in _COMPARISONS and len(x_in) == 2:
    flipped = np.asarray(x_out[0]) != np.asarray(s_out[0])
    gap = np.abs(np.asarray(s_in[0], np.float64) - np.asarray(s_in[1], np.float64))
    if name in ("eq", "ne"):  # equal in float32 (gap 0) says nothing: report the pairs that were not
      count = int(np.sum(np.broadcast_arrays(flipped, gap)[0]))
      flipped, gap = np.broadcast_arrays(flipped, gap)
      far = flipped & (gap > 0)
      return count, (float(np.min(gap[far])) if np.any(far) else None)
  elif name in _CHOICES and len(x_in) == 2:
    # The decision is the operands' order, ties included: a tie picks the same value, but not the
    # same gradient (``max``'s derivative splits a tie, ``jax.nn.relu``'s sends none to its input).
    # A ReLU input that cancels to exactly zero where float32's is positive changes the mask.
    xa, xb = np.broadcast_arrays(*x_in)
    sa, sb = np.broadcast_arrays(*s_in)
    flipped = ((xa > xb) != (sa > sb)) | ((xa < xb) != (sa < sb))
    gap = np.abs(sa.astype(np.float64) - sb.astype(np.float64))
  elif name == "select_n":
    flipped = np.asarray(x_in[0]) != np.asarray(s_in[0])
    return int(np.sum(flipped)), None
  elif name in _ARG:
    xi, si = np.asarray(x_out[0]), np.asarray(s_out[0])
    flipped = xi != si
    if not np.any(flipped):
      return 0, None
    data = np.asarray(s_in[0], np.float64)
    return int(np.sum(flipped)), _arg_gap(data, xi, si, flipped)
  else:
    return 0, None
  flipped, gap = np.broadcast_arrays(flipped, gap)
  count = int(np.sum(flipped))
  return count, (float(np.min(gap[flipped])) if count else None)


def _arg_gap(data: np.ndarray, xi: np.ndarray, si: np.ndarray, flipped: np.ndarray) -> float | None:
  """Smallest shadow gap between the element the policy chose and the one the shadow chose."""
  if data.ndim != xi.ndim + 1:
    return None
  for axis in range(data.ndim):
    if np.delete(np.array(data.shape), axis).tolist() == list(xi.shape):
      a = np.take_along_axis(data, np.expand_dims(xi, axis).astype(np.int64), axis).squeeze(axis)
      b = np.take_along_axis(data, np.expand_dims(si, axis).astype(np.int64), axis).squeeze(axis)
      return float(np.min(np.abs(a - b)[flipped]))
  return None


def _is_float(aval: Any) -> bool:
  dtype = getattr(aval, "dtype", None)
  return dtype is not None and jnp.issubdtype(dtype, jnp.floating)


def _user_source(tb: Any) -> str:
  """The innermost frame of a traceback outside the libraries (`compat.library_file`): ``file:line``."""
  if tb is None:
    return "?"
  for frame in tb.frames:
    if not compat.library_file(frame.file_name) and "<" not in frame.file_name:
      return f"{_short(os.path.abspath(frame.file_name))}:{frame.line_num}"
  return "?"


def _short(path: str) -> str:
  try:
    rel = os.path.relpath(path)
  except ValueError:
    return path
  return path if rel.startswith("..") else rel


class NumericsReport:
  """The result of `numerics_report`: ``rows`` (worst ``drop_db`` first) and views of them.

  ``table(n)`` prints the top rows (rich), ``to_dict()`` gives JSON-able data, ``by_scope()``
  sums per name scope (which layer loses most), ``plot(path)`` draws SQNR along the program.
  """

  def __init__(self, policy: Policy, rows: list[Row], outputs: Any, unmatched: int = 0):
    self.policy = policy
    self.rows = rows
    self.outputs = outputs  # the policy's results: what jax.jit(autocast(fn, policy))(*args) returns
    self.unmatched = unmatched

  def __len__(self) -> int:
    return len(self.rows)

  def in_program_order(self) -> list[Row]:
    return sorted(self.rows, key=lambda r: r.order)

  def flips(self) -> list[Row]:
    """Rows whose decisions flipped, closest to the decision boundary (float32 distance) first."""
    rows = [r for r in self.rows if r.flips]
    return sorted(rows, key=lambda r: (r.flip_distance is None, r.flip_distance or 0.0, r.order))

  def by_scope(self, depth: int | None = None) -> list[dict[str, Any]]:
    """Per scope (cut to its first ``depth`` components): worst drop, lowest SQNR, counts.

    Sorted by the largest single ``drop_db`` of the scope, worst first.

    Raises:
      ValueError: ``depth`` is not None or an int >= 0.
    """
    if depth is not None:
      _count("depth", depth)
    groups: dict[str, list[Row]] = collections.defaultdict(list)
    for row in self.rows:
      scope = _scope_key(row.scope, depth)
      groups[scope].append(row)
    out = []
    for scope, rows in groups.items():
      worst = max(rows, key=lambda r: r.drop_db if not math.isnan(r.drop_db) else -math.inf)
      out.append(
        {
          "scope": scope,
          "equations": len(rows),
          "worst_drop_db": worst.drop_db,
          "worst_at": f"{worst.primitive} {worst.source}",
          "min_sqnr_db": min(r.sqnr_db for r in rows),
          "overflow": sum(r.overflow for r in rows),
          "nonfinite": sum(r.nonfinite for r in rows),
          "underflow": sum(r.underflow for r in rows),
          "cancelled": sum(r.cancelled for r in rows),
          "flips": sum(r.flips for r in rows),
        }
      )
    return sorted(out, key=lambda d: -d["worst_drop_db"])

  def to_dict(self) -> dict[str, Any]:
    return {
      "policy": str(self.policy),
      "unmatched": self.unmatched,
      "rows": [r.to_dict() for r in self.rows],
      "by_scope": [{k: _jsonable(v) for k, v in d.items()} for d in self.by_scope()],
    }

  _COLUMNS = ("drop_db", "sqnr_db", "primitive", "op_class", "source", "scope", "overflow", "nonfinite",
              "underflow", "cancelled", "subnormal", "flips", "flip_distance")  # fmt: skip

  def _title(self) -> str:
    title = f"numerics report, {self.policy} ({len(self.rows)} equations, worst drop first)"
    if self.unmatched:
      title += (
        f"; {self.unmatched} call(s) had no counterpart in the other run (a cond took the other "
        "branch or a loop ran a different number of times): not in the rows"
      )
    return title

  def _cells(self, n: int) -> list[list[str]]:
    return [[_fmt_cell(getattr(r, c)) for c in self._COLUMNS] for r in self.rows[: _count("n", n)]]

  def rich_table(self, n: int = 15) -> Any:
    from rich.table import Table

    table = Table(title=self._title())
    for c in self._COLUMNS:
      table.add_column(
        c, justify="right" if c not in ("primitive", "op_class", "source", "scope") else "left"
      )
    for cells in self._cells(n):
      table.add_row(*cells)
    return table

  def table(self, n: int = 15) -> None:
    """Print the ``n`` worst rows (rich)."""
    from rich.console import Console

    Console(width=200).print(self.rich_table(n))

  def __str__(self) -> str:
    lines = [self._title(), "  ".join(self._COLUMNS)]
    lines += ["  ".join(cells) for cells in self._cells(15)]
    return "\n".join(lines)

  def _repr_html_(self) -> str:
    head = "".join(f"<th>{c}</th>" for c in self._COLUMNS)
    body = "".join(
      "<tr>" + "".join(f"<td>{html.escape(x)}</td>" for x in cells) + "</tr>" for cells in self._cells(15)
    )
    return f"<table><caption>{html.escape(self._title())}</caption><tr>{head}</tr>{body}</table>"

  def plot(self, path: str | os.PathLike, depth: int = 2, title: str | None = None) -> None:
    """SQNR (dB) of each equation's output along the program, colored by scope; written to ``path``.

    Drawn on a bare ``matplotlib.figure.Figure``: pyplot, its backend (a notebook's inline one) and
    its list of open figures are left as they were.
    """
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    rows = [r for r in self.in_program_order() if r.elements]
    scopes = sorted({_scope_key(r.scope, depth) for r in rows})
    cmap = colormaps["tab20"]
    colors = {s: cmap(i % 20) for i, s in enumerate(scopes)}
    fig = Figure(figsize=(12, 4.5))
    ax = fig.subplots()
    finite = [r.sqnr_db for r in rows if math.isfinite(r.sqnr_db)]
    top = (max(finite) if finite else 100.0) + 10
    bottom = (min(finite) if finite else 0.0) - 10

    def y(r: Row) -> float:  # exact outputs at the top, lost values (inf or NaN) at the bottom
      return r.sqnr_db if math.isfinite(r.sqnr_db) else (top if r.sqnr_db > 0 else bottom)

    for s in scopes:
      pts = [(i, y(r)) for i, r in enumerate(rows) if _scope_key(r.scope, depth) == s]
      ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=8, color=colors[s], label=s or "(no scope)")
    flips = [(i, y(r)) for i, r in enumerate(rows) if r.flips]
    if flips:
      ax.scatter(
        [p[0] for p in flips], [p[1] for p in flips], s=40, facecolors="none", edgecolors="k", label="flips"
      )
    ax.set_xlabel("equation (program order; exact outputs drawn at the top, lost values at the bottom)")
    ax.set_ylabel("output SQNR vs float32 shadow (dB)")
    ax.set_title(title or f"numerics report: {self.policy}")
    if rows:  # (no float equation: an empty plot, and no legend to warn about)
      ax.legend(fontsize=6, ncol=2, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _scope_key(scope: str, depth: int | None) -> str:
  if depth is None:
    return scope
  return "/".join(scope.split("/")[: _count("depth", depth)])


def _count(name: str, value: Any) -> int:
  """``value`` as a count of rows or scope components: an int >= 0 (a negative one would count
  from the end, silently), else a ``ValueError`` naming the argument.

  >>> _count("n", 3), _count("depth", 0)
  (3, 0)
  >>> _count("n", -1)
  Traceback (most recent call last):
  ...
  ValueError: n=-1; allowed: an int >= 0
  """
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
    raise ValueError(f"{name}={value!r}; allowed: an int >= 0")
  return int(value)


def _fmt_cell(v: Any) -> str:
  if v is None:
    return "-"
  if isinstance(v, float):
    return (
      f"{v:.3g}"
      if math.isfinite(v) and abs(v) < 0.01 and v != 0
      else (f"{v:.1f}" if math.isfinite(v) else str(v))
    )
  return str(v)


def numerics_report(
  fn: Callable[..., Any],
  policy: Policy | str,
  *args: Any,
  static_argnums: int | Sequence[int] = (),
  static_argnames: str | Sequence[str] = (),
  **kwargs: Any,
) -> NumericsReport:
  """Run ``fn(*args, **kwargs)`` under ``policy`` beside a float32 shadow and report per equation.

  Args:
    fn: a function of arrays, as for `autocast` (``jax.value_and_grad(loss)`` reports the
      backward equations too; ``jit``, ``scan``, ``cond``, ``remat``, custom derivatives are
      interpreted through).
    policy: a `Policy` or its string form (``"c=cb16,level=1"``).
    *args, **kwargs: concrete arrays (pytrees of arrays); other arguments (a flag, a count)
      are marked with ``static_argnums`` / ``static_argnames`` as for `autocast`.
    static_argnums, static_argnames: arguments passed unchanged rather than traced.

  Returns:
    A `NumericsReport`; see the module docstring for the method, the columns and the cost.
  """
  check_callable(fn, "numerics_report")
  policy = as_policy(policy)
  call, args, statics = module_as_argument(fn, args, Statics.of(fn, static_argnums, static_argnames))
  with module_state_errors(fn, "numerics_report"):
    closed, outputs, flat = trace_fn(call, statics, args, kwargs, source=fn)
  collector = _Collector(policy.compute)
  identity = Policy.parse("c=f32")

  def observed(pol: Policy, mode: str) -> Any:
    p = Pass(pol, observer=collector.observer(mode))
    p.extreme = Pass(policy).extreme  # the shadow reads finfo(float32).min as the policy run does
    return jax.jit(lambda *xs: _interpreter.run(p, closed, xs))(*flat)

  jax.block_until_ready(observed(identity, "shadow"))
  jax.effects_barrier()
  jax.block_until_ready(observed(policy, "policy"))
  jax.effects_barrier()
  # The outputs of a run without the observer's callbacks, which change XLA's fusion and so
  # the last bit of some float32 results: exactly those of jax.jit(autocast(fn, policy)).
  outs = jax.jit(lambda *xs: _interpreter.run(Pass(policy), closed, xs))(*flat)
  # calls of either run without a counterpart: the policy run's (``missing``) and the shadow's left over
  unmatched = collector.missing + sum(len(queue) for queue in collector.shadow.values())
  return NumericsReport(policy, collector.rows(), outputs.unflatten(outs), unmatched)
