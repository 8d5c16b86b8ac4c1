"""The train and eval steps under the precision `Policy`; both are compiled through `wafer.compile`.

The train step: scaled loss -> gradients (autocast) -> unscale -> skip-or-update -> loss-scale
adjust, returning ``(state, metrics)``; metrics are device scalars the loop fetches only at log
steps. The eval step runs the task's eval metric (default: its loss) under the same policy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

import precision
from wafer.errors import ExecutorError, where_defined, with_article
from wafer.optim import scale_by_learning_rate_multipliers, unscale_gradients
from wafer.train.state import TrainState, schedule_counts
from wafer.train.task import Task


def _under_policy(fn: Callable, policy: precision.Policy, what: str) -> Callable:
  checked = _returns_a_float_scalar(fn, what)
  return precision.autocast(checked, policy) if policy.is_mixed else checked


def _returns_a_float_scalar(fn: Callable, what: str) -> Callable:
  """``fn``, checked (while traced) to return one floating-point scalar: JAX's errors for a vector, a tuple
  or an int loss name its own frames, not the task's function."""

  def checked(params: Any, batch: Any) -> Any:
    out = fn(params, batch)
    shape, dtype = getattr(out, "shape", None), getattr(out, "dtype", None)
    if shape != () or dtype is None or not jnp.issubdtype(dtype, jnp.floating):
      got = (
        f"{dtype}{list(shape)}"
        if shape is not None and dtype is not None
        else with_article(type(out).__name__)
      )
      raise ExecutorError(
        f"Task.{what} {where_defined(fn)} returned {got}; it must return one floating-point scalar (e.g. the "
        "batch mean: jnp.mean(per_example_losses)). Report other values from a step closure (@wafer.step_closure)."
      )
    return out

  return checked


def make_train_step(
  task: Task, optimizer: optax.GradientTransformation, policy: precision.Policy
) -> Callable[[TrainState, Any], tuple[TrainState, dict[str, jax.Array]]]:
  """``train_step(state, batch) -> (state, metrics)``.

  The gradients are unscaled in float32 and cast to their parameters' dtypes
  (`wafer.optim.unscale_gradients`, as `wafer.optim.apply_gradients` does) before the finiteness
  test and the optimizer, so 16-bit parameters train and their optimizer state keeps their dtype.

  ``metrics``: ``loss`` (float32, unscaled), ``loss_scale`` (the scale this step used),
  ``skipped`` (bool: non-finite gradients, so params, optimizer state and the schedule's count
  were held) and ``optimizer_step`` (int32, the schedule's count this step used; absent for an
  optimizer without one). ``state.step`` and ``state.data_position`` advance by one on every step.
  The task's ``learning_rate_multipliers`` scale the optimizer's updates, per parameter
  (`wafer.optim.scale_by_learning_rate_multipliers`), outside the optimizer state: a run resumes
  whatever factors it had. An optimizer with an ``after_step(params, opt_state, grads)`` (weight
  sparsity, `wafer.sparsity.sparsify`) ends each applied step with it (given the dense gradients);
  its ``mask_gradients`` comes before the finiteness test.
  """
  loss_fn = _under_policy(task.loss_fn, policy, "loss_fn")
  after_step = getattr(optimizer, "after_step", None)
  mask_gradients = getattr(optimizer, "mask_gradients", None)

  def train_step(state: TrainState, batch: Any) -> tuple[TrainState, dict[str, jax.Array]]:
    ls = state.loss_scale
    scaled, grads = jax.value_and_grad(lambda p: ls.scale(loss_fn(p, batch)))(state.params)
    grads = unscale_gradients(ls, grads, state.params)  # float32 unscaling, then each param's dtype
    dense = grads
    if mask_gradients is not None:  # weight sparsity: pruned weights' gradients count for nothing
      grads = mask_gradients(grads, state.opt_state)
    finite = precision.all_finite(grads)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    if task.learning_rate_multipliers is not None:  # per-group learning rates (muP): stateless
      updates, _ = scale_by_learning_rate_multipliers(task.learning_rate_multipliers).update(
        updates, optax.EmptyState()
      )
    params = optax.apply_updates(state.params, updates)
    if after_step is not None:  # weight sparsity: prune, count the step, update dynamic masks
      params, opt_state = after_step(params, opt_state, dense)
    params, opt_state = precision.select_tree(finite, (params, opt_state), (state.params, state.opt_state))
    metrics = {
      "loss": scaled / ls.loss_scale,
      "loss_scale": ls.loss_scale,
      "skipped": jnp.logical_not(finite),
    }
    counts = schedule_counts(state.opt_state)
    if counts:
      metrics["optimizer_step"] = counts[0]
    new = TrainState(params, opt_state, ls.adjust(finite), state.step + 1, state.data_position + 1)
    return new, metrics

  return train_step


def make_eval_step(task: Task, policy: precision.Policy) -> Callable[[Any, Any], jax.Array]:
  """``eval_step(params, batch) -> float32 scalar``: the eval metric (or the loss) under ``policy``."""
  return _under_policy(
    task.eval_metric or task.loss_fn, policy, "eval_metric" if task.eval_metric else "loss_fn"
  )
