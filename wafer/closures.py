"""Step closures: host code that runs after a step, on that step's values.

Inside a step compiled by `wafer.compile`, calling a `step_closure`-decorated function (or
`add_step_closure`) does not run it: its array arguments become extra outputs of the compiled
graph and the call is queued. After the step, `CompiledStep.run_closures()` (the executor calls
it at log, activation and checkpoint steps) fetches those outputs to the host and calls the closures
in the order they were queued, with NumPy values in place of the arrays; other arguments pass through.
The step itself never waits for the host. Step closures run at log and activation steps; checkpoint
closures at every checkpoint step (whether or not it is a log step), and only there.

A closure may be called anywhere in the step's code:

* at the step's top level, its arrays become outputs of the step (no host callback at all);
* inside ``jax.grad`` / ``jax.value_and_grad``, a ``lax.scan`` / ``lax.while_loop`` body, a
  ``lax.cond`` / ``lax.switch`` branch, or a loss run by `precision.autocast`, its arrays leave
  through a ``jax.debug.callback`` that only stores them on the host; at a log step the closure runs
  once with the latest values stored since the previous log step (the last scan iteration; the last
  step whose ``cond`` branch called it; the primal values under ``grad``);
* inside ``jax.vmap`` it is refused at compile time (`wafer.StaticGraphError`, naming your line):
  return the value from the vmapped function and call the closure on the batched result.

Outside a compiled step, a closure is called at once with host values; inside another trace
(a plain ``jax.jit``) it becomes a ``jax.debug.callback``, which runs on every call.

>>> import wafer
>>> @wafer.step_closure
... def log_loss(loss, step):
...   print(f"step {int(step)}: loss {float(loss):.4f}")
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from precision import _jax_compat as compat
from wafer.errors import ClosureError, StaticGraphError, with_article

STEP, CHECKPOINT = "step", "checkpoint"


@dataclasses.dataclass
class QueuedClosure:
  """A closure call recorded while tracing: ``fn(*args, **kwargs)`` with array leaves lifted out."""

  fn: Callable[..., Any]
  treedef: Any  # of (args, kwargs)
  leaves: list[Any]  # non-array leaves; None where an array was lifted out
  array_slots: list[int]  # positions in ``leaves`` of the lifted arrays
  kind: str

  def call(self, arrays: list[Any]) -> Any:
    leaves = list(self.leaves)
    for slot, value in zip(self.array_slots, arrays):
      leaves[slot] = value
    args, kwargs = jax.tree.unflatten(self.treedef, leaves)
    return self.fn(*args, **kwargs)


@dataclasses.dataclass
class InnerClosure:
  """A closure called inside a nested transform: its host values arrive through a debug callback.

  ``latest`` holds the ``(args, kwargs)`` host values of the last callback since the closure last ran.
  """

  fn: Callable[..., Any]
  kind: str
  latest: tuple[tuple, dict] | None = None

  def store(self, args: tuple, kwargs: dict) -> None:
    self.latest = (args, kwargs)

  def call_latest(self) -> None:
    if self.latest is not None:
      args, kwargs = self.latest
      self.latest = None
      self.fn(*args, **kwargs)


class _Collector:
  def __init__(self) -> None:
    self.closures: list[QueuedClosure | InnerClosure] = []
    self.arrays: list[Any] = []
    self.trace: Any = _current_trace()


def _current_trace() -> Any:
  return compat.current_trace()


def _user_line() -> str:
  """``file:line`` and source of the innermost caller outside the libraries (JAX, installed packages,
  the standard library, wafer: `precision._jax_compat.library_file`), for error messages."""
  import traceback

  found = None
  for frame in traceback.extract_stack():
    if not compat.library_file(frame.filename):
      found = frame
  if found is None:
    return "<unknown>"
  return f"{found.filename}:{found.lineno}\n    {(found.line or '').strip()}"


def _is_batched(leaf: Any) -> bool:
  return compat.is_batch_tracer(leaf)


_ACTIVE: list[_Collector] = []


@contextlib.contextmanager
def collecting() -> Iterator[_Collector]:
  """Collect the closures called while tracing a step (used by `wafer.compile`)."""
  collector = _Collector()
  _ACTIVE.append(collector)
  try:
    yield collector
  finally:
    _ACTIVE.pop()


def add_step_closure(
  fn: Callable[..., Any], args: tuple = (), kwargs: dict | None = None, *, kind: str = STEP
) -> None:
  """Queue ``fn(*args, **kwargs)`` to run after the step, on the step's values of ``args``.

  Args:
    fn: a host function (prints, logging, checks); its return value is discarded.
    args, kwargs: may hold JAX arrays (traced values of the step); they arrive as NumPy arrays.
    kind: ``"step"`` (log and activation steps) or ``"checkpoint"`` (checkpoint steps only).
  """
  _check_fn(fn, "add_step_closure")
  if kind not in (STEP, CHECKPOINT):
    raise ClosureError(f"add_step_closure: kind={kind!r}; allowed: 'step', 'checkpoint'")
  if not isinstance(args, (tuple, list)):  # add_step_closure(log, loss) would unpack the array's rows
    raise ClosureError(
      f"add_step_closure({getattr(fn, '__name__', fn)}, args=...): args is {with_article(type(args).__name__)}; allowed: "
      "a tuple of the closure's arguments, e.g. add_step_closure(log, (loss,)) or args=(loss, step)"
    )
  if kwargs is not None and not isinstance(kwargs, dict):
    raise ClosureError(
      f"add_step_closure({getattr(fn, '__name__', fn)}, kwargs=...): kwargs is {with_article(type(kwargs).__name__)}; "
      "allowed: a dict of keyword arguments, or None"
    )
  kwargs = {} if kwargs is None else kwargs
  leaves, treedef = jax.tree.flatten((tuple(args), kwargs))
  if not _ACTIVE:
    if any(isinstance(leaf, jax.core.Tracer) for leaf in leaves):
      # traced outside wafer.compile (a plain jax.jit, the cost model): a host callback
      jax.debug.callback(lambda a, k: fn(*a, **k), tuple(args), kwargs)
    else:  # eager: run now on host values
      fn(*jax.device_get(tuple(args)), **jax.device_get(kwargs))
    return
  collector = _ACTIVE[-1]
  tracers = [leaf for leaf in leaves if isinstance(leaf, jax.core.Tracer)]
  if any(_is_batched(leaf) for leaf in tracers):
    raise StaticGraphError(
      f"a step closure ({getattr(fn, '__name__', fn)}) is called inside jax.vmap at {_user_line()}\n"
      "A closure runs once per step on host values; inside vmap there is one value per batch element.\n"
      "Fix: return the value from the vmapped function and call the closure on the batched result, "
      "outside jax.vmap."
    )
  if collector.trace is not None and any(leaf._trace is not collector.trace for leaf in tracers):
    inner = InnerClosure(fn, kind)
    jax.debug.callback(lambda a, k: inner.store(a, k), tuple(args), kwargs)
    collector.closures.append(inner)
    return
  slots = [i for i, leaf in enumerate(leaves) if isinstance(leaf, (jax.Array, np.ndarray))]
  kept = [None if i in slots else leaf for i, leaf in enumerate(leaves)]
  collector.arrays.extend(leaves[i] for i in slots)
  collector.closures.append(QueuedClosure(fn, treedef, kept, slots, kind))


def _check_fn(fn: Any, where: str) -> None:
  if not callable(fn):
    raise ClosureError(
      f"{where}: {_short(fn)} is not callable; allowed: the host function to run after the step "
      "(use @wafer.step_closure without parentheses, on a def)"
    )


def _short(value: Any, limit: int = 60) -> str:
  text = repr(value)
  return text if len(text) <= limit else text[: limit - 3] + "..."


def step_closure(fn: Callable[..., Any]) -> Callable[..., None]:
  """Decorator: calls inside a compiled step are queued to run after it (see the module doc)."""
  _check_fn(fn, "step_closure")

  @functools.wraps(fn)
  def queued(*args: Any, **kwargs: Any) -> None:
    add_step_closure(fn, args, kwargs, kind=STEP)

  return queued


def checkpoint_closure(fn: Callable[..., Any]) -> Callable[..., None]:
  """Decorator: like `step_closure`, but the body runs only at checkpoint steps."""
  _check_fn(fn, "checkpoint_closure")

  @functools.wraps(fn)
  def queued(*args: Any, **kwargs: Any) -> None:
    add_step_closure(fn, args, kwargs, kind=CHECKPOINT)

  return queued
