"""What a run trains: the `Task` bundle, the `BatchSource` protocol, and the loop's error type."""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import jax

from wafer.errors import ExecutorError


class BatchSource(Protocol):
  """Batches for consecutive steps; its position survives a restart.

  ``get_state()`` is a JSON-serialisable dict whose ``"next_batch"`` is the number of the batch
  ``next()`` returns; the other keys identify the pipeline. ``set_state`` seeks (and refuses a
  state saved by another pipeline with ``ValueError``).
  """

  def __next__(self) -> Any: ...

  def get_state(self) -> dict[str, Any]: ...

  def set_state(self, state: dict[str, Any]) -> None: ...


@dataclasses.dataclass
class Task:
  """What to train and evaluate.

  Attributes:
    name: shown in logs and reports.
    init_params: ``key -> params`` (float32 pytree).
    loss_fn: ``(params, batch) -> float32 scalar``, written in float32 (autocast applies the policy).
    train_data: ``seed -> BatchSource`` of fixed-size training batches, repeating forever.
    eval_data: ``() -> iterable of batches`` (one pass), or None.
    eval_metric: ``(params, batch) -> float32 scalar`` averaged over eval batches (default: the loss).
    eval_metric_name: its name in logs and metrics (``loss``, ``accuracy``, ``perplexity``...).
    batch_size: global batch size (samples per step).
    batch_spec: ``() -> pytree of jax.ShapeDtypeStruct``: one training batch's shapes and dtypes from
      the config alone, or None. With it, ``validate_only`` / ``compile_only`` read no data and
      build no state (the step is traced on shapes); without it they take the first batch.
    eval_batch_spec: ``() -> pytree of jax.ShapeDtypeStruct``: one eval batch's shapes and dtypes
      from the config alone, or None. ``validate_only`` / ``compile_only`` in an eval mode check the
      eval step on it (without it, on the first eval batch).
    learning_rate_multipliers: ``params -> pytree of floats`` (same structure; it may read only
      paths and shapes), or None: each parameter's learning rate is the schedule's times its
      multiplier (modelzoo's ``adjust_learning_rate`` groups, muP). `make_train_step` applies
      `wafer.optim.scale_by_learning_rate_multipliers` to the optimizer's updates.
  """

  name: str
  init_params: Callable[[jax.Array], Any]
  loss_fn: Callable[[Any, Any], jax.Array]
  train_data: Callable[[int], BatchSource]
  batch_size: int
  eval_data: Callable[[], Any] | None = None
  eval_metric: Callable[[Any, Any], jax.Array] | None = None
  eval_metric_name: str = "loss"
  batch_spec: Callable[[], Any] | None = None
  learning_rate_multipliers: Callable[[Any], Any] | None = None
  eval_batch_spec: Callable[[], Any] | None = None

  def __post_init__(self) -> None:
    if (
      isinstance(self.batch_size, bool)
      or not isinstance(self.batch_size, numbers.Integral)
      or self.batch_size < 1
    ):
      raise ExecutorError(f"Task.batch_size={self.batch_size!r}; allowed: an int >= 1 (samples per step)")


def next_batch(data: Any, step: int) -> Any:
  """``next(data)``, the batch of step ``step + 1``; a source that ends is an `ExecutorError`.

  >>> next_batch(iter([]), 3)
  Traceback (most recent call last):
  ...
  wafer.errors.ExecutorError: the training data ended before step 4: its source (list_iterator) raised StopIteration. Task.train_data must give a batch for every step, repeating forever: wafer.train.IndexedBatches(lambda k: batches[k % len(batches)]) cycles a list; or lower runconfig.max_steps.
  """
  try:
    return next(data)
  except StopIteration:
    raise ExecutorError(
      f"the training data ended before step {step + 1}: its source ({type(data).__name__}) raised "
      "StopIteration. Task.train_data must give a batch for every step, repeating forever: "
      "wafer.train.IndexedBatches(lambda k: batches[k % len(batches)]) cycles a list; or lower "
      "runconfig.max_steps."
    ) from None


class IndexedBatches:
  """A `BatchSource` from ``batch_of(k)``: its position is the next batch number, so resuming is exact.

  >>> src = IndexedBatches(lambda k: k * 10)
  >>> next(src), next(src), src.get_state()
  (0, 10, {'next_batch': 2})
  >>> src.set_state({"next_batch": 7}); next(src)
  70
  """

  def __init__(self, batch_of: Callable[[int], Any]):
    self.batch_of = batch_of
    self.next_batch = 0

  def __iter__(self) -> Iterator[Any]:
    return self

  def __next__(self) -> Any:
    batch = self.batch_of(self.next_batch)
    self.next_batch += 1
    return batch

  def get_state(self) -> dict[str, Any]:
    return {"next_batch": self.next_batch}

  def set_state(self, state: dict[str, Any]) -> None:
    self.next_batch = int(state["next_batch"])
