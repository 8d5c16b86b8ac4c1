"""The train state: one pytree holding everything a restart needs.

``step`` is the global step (iterations done, skipped ones included): the log step, the
checkpoint's number and the ``max_steps`` counter all read it. The learning-rate schedule's
``t`` is optax's ``count`` inside ``opt_state``; it is held on a skipped (non-finite) step, as
on a Cerebras system (``docs/references.md``, "Learning-rate schedulers"), so
``count == step - skipped steps`` always (`schedule_counts` reads it). ``data_position`` is the number of the next training batch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from wafer.errors import ExecutorError, where_defined, with_article
from wafer.train.task import Task, next_batch


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainState:
  """Params, optimizer state, loss-scale state, the global step and the data position.

  Attributes:
    params: the model's floating-point parameters (pytree; float32 as a rule, 16-bit ones train too).
    opt_state: the optax state (its ``count`` is the schedule's step).
    loss_scale: `precision.StaticLossScale` or `precision.DynamicLossScale` state.
    step: int32 scalar, the global step (steps done; 0 before the first).
    data_position: int32 scalar, the number of the next training batch.
  """

  params: Any
  opt_state: Any
  loss_scale: Any
  step: jax.Array
  data_position: jax.Array


def initial_state(
  task: Task, optimizer: optax.GradientTransformation, loss_scale: Any, key: jax.Array
) -> TrainState:
  """Step 0: ``task.init_params(key)``, the optimizer's initial state, ``loss_scale``, step 0, batch 0.

  An optimizer with a ``prune(params, opt_state)`` (weight sparsity, `wafer.sparsity.sparsify`) masks
  the initial parameters. Every leaf is its own buffer (the train step donates the state, and a buffer cannot be donated
  twice).
  """
  params = task.init_params(key)
  _check_params(task, params)
  opt_state = optimizer.init(params)
  prune = getattr(optimizer, "prune", None)  # weight sparsity: the initial weights masked
  if prune is not None:
    params = prune(params, opt_state)
  state = TrainState(params, opt_state, loss_scale, jnp.asarray(0, jnp.int32), jnp.asarray(0, jnp.int32))
  return jax.tree.map(lambda x: x.copy() if isinstance(x, jax.Array) else x, state)


def _check_params(task: Task, params: Any) -> None:
  """Refuse parameters the optimizer cannot train: a leaf that is not a floating-point array."""
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    dtype = getattr(leaf, "dtype", None)
    if dtype is None or not jnp.issubdtype(dtype, jnp.inexact):  # what jax.grad differentiates
      what = (
        f"{with_article(str(dtype))} array"
        if dtype is not None
        else f"{with_article(type(leaf).__name__)} ({leaf!r:.40})"
      )
      raise ExecutorError(
        f"Task.init_params {where_defined(task.init_params)} returned params{jax.tree_util.keystr(path)} = "
        f"{what}; every parameter must be a floating-point array (float32: autocast applies the policy). "
        "Keep constants and integer tables out of the params: close over them in loss_fn."
      )


def schedule_counts(opt_state: Any) -> list[jax.Array]:
  """Every ``count`` in the optimizer state (the schedule's and, e.g., Adam's bias-correction step).

  >>> import optax
  >>> tx = optax.chain(optax.trace(0.9), optax.scale_by_learning_rate(optax.linear_schedule(0.1, 0.0, 9)))
  >>> [int(c) for c in schedule_counts(tx.init({"w": jnp.zeros(2)}))]
  [0]
  """
  return [leaf for _, leaf in optax.tree_utils.tree_get_all_with_path(opt_state, "count")]


def abstract(state: Any) -> Any:
  """``jax.ShapeDtypeStruct`` leaves with the state's shardings (orbax's restore target)."""

  def one(x: Any) -> Any:
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None))

  return jax.tree.map(one, state)


def step_shapes(
  task: Task, optimizer: optax.GradientTransformation, loss_scale: Any, seed: int
) -> tuple[Any, Any]:
  """The train step's arguments ``(state, batch)`` as ``jax.ShapeDtypeStruct`` pytrees, no weights built.

  The state is ``jax.eval_shape`` of `initial_state`; the batch is the task's ``batch_spec()`` (from
  the config alone, no data read), or the shapes of its first batch when it declares none. What
  ``validate_only`` / ``compile_only`` and ``wafer estimate --params`` trace.
  """
  state = jax.eval_shape(lambda key: initial_state(task, optimizer, loss_scale, key), jax.random.key(seed))
  if task.batch_spec is not None:
    return state, task.batch_spec()
  batch = next_batch(task.train_data(seed), 0)
  return state, jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype), batch)
