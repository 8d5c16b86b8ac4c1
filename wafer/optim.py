"""Optimizers, gradient clipping and loss scaling from the YAML ``optimizer`` section.

`build_optimizer` returns an optax ``GradientTransformation`` (clipping, weight decay, the
optimizer and the learning-rate `wafer.schedules.Schedule`) and the loss-scale state of the
mixed-precision core. `apply_gradients` is Cerebras' conditional update
(``../shared/reference/cerebras.md`` section 3): unscale, test finiteness on the global norm,
update, and on a non-finite step keep parameters, optimizer state (including the schedule's step
counter) and the step; then adjust the loss scale. Everything is ``jnp.where``, no Python branching.

Update rules, with ``g`` the (clipped) gradient, ``lr = schedule(k)`` for the k-th applied step:

* sgd / momentum: ``g += wd * p``; ``buf = momentum * buf + g``; ``p -= lr * buf``
  (``g + momentum * buf`` with nesterov);
* adam: ``g += wd * p``; ``m = b1 m + (1 - b1) g``; ``v = b2 v + (1 - b2) g^2``;
  ``p -= lr * m_hat / (sqrt(v_hat) + eps)`` with ``m_hat = m / (1 - b1^k)``, ``v_hat = v / (1 - b2^k)``;
* adamw: as adam without the coupled decay, then ``p -= lr * wd * p`` (decoupled);
* lamb: ``u = m_hat / (sqrt(v_hat) + eps) + wd * p``; ``p -= lr * (||p|| / ||u||) * u`` (ratio 1 if
  either norm is 0), optax's LAMB.

Clipping comes first: ``max_gradient_norm`` scales by ``min(1, max_norm / (||g|| + 1e-6))`` (torch's
``clip_grad_norm_``), ``max_gradient_value`` clamps to ``[-v, v]``.

optax's own ``adam``/``adamw``/``lamb`` raise under strict dtype promotion (``b1 ** count`` mixes a
Python float and int32), so `scale_by_adam` here is the same rule with float32 bias corrections computed as
``1 - b^k = -expm1(k ln b)`` (accurate where the direct float32 form cancels).
"""

from __future__ import annotations

import difflib
import logging
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from precision.formats import FloatFormat, get_format
from precision.loss_scale import DynamicLossScale, StaticLossScale, all_finite, select_tree
from wafer.errors import WaferError
from wafer.schedules import Schedule, build_schedule

__all__ = (
  "OptimizerError",
  "StepResult",
  "apply_gradients",
  "build_optimizer",
  "clip_by_global_norm",
  "scale_by_adam",
)

log = logging.getLogger(__name__)

OPTIMIZERS = ("sgd", "momentum", "adam", "adamw", "lamb")
KEYS = (
  "optimizer_type",
  "learning_rate",
  "weight_decay",
  "weight_decay_rate",
  "max_gradient_norm",
  "max_gradient_value",
  "betas",
  "beta1",
  "beta2",
  "eps",
  "momentum",
  "nesterov",
  "correct_bias",
  "loss_scaling_factor",
  "initial_loss_scale",
  "steps_per_increase",
  "min_loss_scale",
  "max_loss_scale",
  "disable_lr_steps_reset",
  "log_summaries",
)
# ASSUMPTION: cstorch's Adam/AdamW/Lamb default eps is 1e-6 (HF-style); the configs in cerebras.md
# section 8 that care set eps explicitly.
DEFAULT_EPS = 1e-6


class OptimizerError(WaferError, ValueError):
  """A bad ``optimizer`` section; the message names the key path, the value and what is allowed."""


def scale_by_adam(
  b1: float = 0.9, b2: float = 0.999, eps: float = DEFAULT_EPS
) -> optax.GradientTransformation:
  """``m_hat / (sqrt(v_hat) + eps)`` (see module docstring), float32-exact under strict promotion.

  The state is ``optax.ScaleByAdamState(count, mu, nu)``, so it checkpoints like optax's.
  """

  def init(params: Any) -> optax.ScaleByAdamState:
    zeros = jax.tree.map(jnp.zeros_like, params)
    return optax.ScaleByAdamState(
      count=jnp.zeros((), jnp.int32), mu=zeros, nu=jax.tree.map(jnp.zeros_like, params)
    )

  def update(
    updates: Any, state: optax.ScaleByAdamState, params: Any = None
  ) -> tuple[Any, optax.ScaleByAdamState]:
    del params
    count = state.count + 1
    k = count.astype(jnp.float32)
    # 1 - b^k as -expm1(k * ln b): the direct float32 form cancels (for b2 = 0.999, k = 2 it is
    # off by 3e-5 relative); this one stays within a few float32 ulps of the float64 value.
    bc1 = -jnp.expm1(k * jnp.float32(math.log(b1))) if b1 > 0 else jnp.float32(1)
    bc2 = -jnp.expm1(k * jnp.float32(math.log(b2))) if b2 > 0 else jnp.float32(1)

    def c(x: float, like: jax.Array) -> jax.Array:
      return jnp.asarray(x, like.dtype)

    mu = jax.tree.map(lambda m, g: c(b1, g) * m + c(1 - b1, g) * g, state.mu, updates)
    nu = jax.tree.map(lambda v, g: c(b2, g) * v + c(1 - b2, g) * g * g, state.nu, updates)
    out = jax.tree.map(
      lambda m, v: (m / bc1.astype(m.dtype)) / (jnp.sqrt(v / bc2.astype(v.dtype)) + c(eps, v)), mu, nu
    )
    return out, optax.ScaleByAdamState(count=count, mu=mu, nu=nu)

  return optax.GradientTransformation(init, update)


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
  """torch ``clip_grad_norm_``: ``g * min(1, max_norm / (||g||_2 + 1e-6))``, the norm in float32."""

  def update(updates: Any, state: optax.EmptyState, params: Any = None) -> tuple[Any, optax.EmptyState]:
    del params
    leaves = jax.tree.leaves(updates)
    norm = (
      jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in leaves)) if leaves else jnp.float32(0)
    )
    coef = jnp.minimum(jnp.float32(max_norm) / (norm + jnp.float32(1e-6)), jnp.float32(1))
    return jax.tree.map(lambda g: g * coef.astype(g.dtype), updates), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def _fail(path: str, key: str, value: Any, allowed: str) -> OptimizerError:
  return OptimizerError(f"{path}.{key}={value!r}; allowed: {allowed}")


def _number(
  section: dict[str, Any],
  key: str,
  path: str,
  default: float | None,
  *,
  positive: bool = False,
  unit: bool = False,
) -> float | None:
  value = section.get(key, default)
  if value is None:
    return None
  if isinstance(value, str):
    try:
      value = float(value)
    except ValueError:
      pass
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise _fail(path, key, section.get(key), "a number")
  if positive and not value > 0:
    raise _fail(path, key, value, "a number > 0")
  if unit and not 0 <= value < 1:
    raise _fail(path, key, value, "a number in [0, 1)")
  if not positive and not unit and value < 0:
    raise _fail(path, key, value, "a number >= 0")
  return float(value)


def _loss_scale(section: dict[str, Any], fmt: FloatFormat, path: str) -> StaticLossScale | DynamicLossScale:
  factor = section.get("loss_scaling_factor", 1.0)
  dynamic = isinstance(factor, str) and factor.lower() == "dynamic"
  if (
    not dynamic and factor is not None and (isinstance(factor, bool) or not isinstance(factor, (int, float)))
  ):
    raise OptimizerError(
      f"{path}.loss_scaling_factor={factor!r}: Optimizer param 'loss_scaling_factor' must be "
      "a float, None, or 'dynamic'."
    )
  if fmt.name == "bfloat16":
    if dynamic or factor not in (None, 1.0):
      log.info("No need to use loss scaling when half dtype is bfloat16. Disabling gradient scaling.")
    return StaticLossScale.create(1.0)
  if fmt.name == "cbfloat16" and not dynamic:
    raise OptimizerError(
      f"{path}.loss_scaling_factor={factor!r}: cbfloat16 needs dynamic loss scaling, or "
      "gradients may underflow or overflow and produce NaNs; set loss_scaling_factor: dynamic"
    )
  if not dynamic:
    try:
      return StaticLossScale.create(1.0 if factor is None else float(factor))
    except ValueError as err:
      raise OptimizerError(f"{path}.loss_scaling_factor: {err}") from None
  spi = section.get("steps_per_increase", 2000)
  try:
    return DynamicLossScale.create(
      fmt,
      initial_loss_scale=_number(section, "initial_loss_scale", path, None, positive=True),
      steps_per_increase=spi,
      min_loss_scale=_number(section, "min_loss_scale", path, None, positive=True),
      max_loss_scale=_number(section, "max_loss_scale", path, None, positive=True),
    )
  except ValueError as err:
    raise OptimizerError(f"{path}: {err}") from None


def _betas(section: dict[str, Any], path: str) -> tuple[float, float]:
  if "betas" in section and ("beta1" in section or "beta2" in section):
    raise OptimizerError(f"{path}: give either betas or beta1/beta2, not both")
  betas = section.get("betas", [section.get("beta1", 0.9), section.get("beta2", 0.999)])
  if not isinstance(betas, (list, tuple)) or len(betas) != 2:
    raise _fail(path, "betas", betas, "a list of two numbers in [0, 1)")
  pair = {"beta1": betas[0], "beta2": betas[1]}
  return _number(pair, "beta1", path, None, unit=True), _number(pair, "beta2", path, None, unit=True)


def build_optimizer(
  optimizer_section: dict[str, Any], *, half_dtype: FloatFormat | str = "float16", path: str = "optimizer"
) -> tuple[optax.GradientTransformation, StaticLossScale | DynamicLossScale]:
  """The optax transformation and the initial loss-scale state for an ``optimizer`` section.

  Args:
    optimizer_section: the YAML ``optimizer`` mapping (legacy layout; see `KEYS`).
    half_dtype: the run's half-precision format; bfloat16 disables loss scaling (as Cerebras),
      cbfloat16 requires ``loss_scaling_factor: dynamic``.
    path: the key path named in error messages.

  Returns:
    ``(tx, loss_scale)``. ``tx.init(params)`` builds all optimizer state before tracing.

  Raises:
    OptimizerError / ScheduleError: naming the key, the value and what is allowed.
  """
  section = dict(optimizer_section)
  for key in section:
    if key not in KEYS:
      close = difflib.get_close_matches(key, KEYS, n=1, cutoff=0.6)
      hint = f" Did you mean {close[0]!r}?" if close else ""
      raise OptimizerError(f"{path}: unknown key {key!r}.{hint} Allowed keys: {', '.join(KEYS)}")
  raw_type = section.get("optimizer_type")
  kind = raw_type.lower() if isinstance(raw_type, str) else None
  if kind not in OPTIMIZERS:
    close = difflib.get_close_matches(str(raw_type).lower(), OPTIMIZERS, n=1, cutoff=0.6)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise OptimizerError(
      f"{path}.optimizer_type={raw_type!r}.{hint} Allowed (case-insensitive): {', '.join(OPTIMIZERS)}"
    )
  if "learning_rate" not in section:
    raise OptimizerError(f"{path}: missing required key 'learning_rate'")
  schedule: Schedule = build_schedule(
    section["learning_rate"],
    path=f"{path}.learning_rate",
    disable_lr_steps_reset=bool(section.get("disable_lr_steps_reset", False)),
  )
  if "weight_decay" in section and "weight_decay_rate" in section:
    raise OptimizerError(f"{path}: give either weight_decay or weight_decay_rate (1.x name), not both")
  wd_key = "weight_decay_rate" if "weight_decay_rate" in section else "weight_decay"
  wd = _number(section, wd_key, path, 0.0) or 0.0
  norm = _number(section, "max_gradient_norm", path, None, positive=True)
  value = _number(section, "max_gradient_value", path, None, positive=True)
  if norm is not None and value is not None:
    raise OptimizerError(
      f"{path}: Gradients can be clipped by norm(={norm}) or by value(={value}), but not both. "
      "Do not set both `max_gradient_norm` and `max_gradient_value`."
    )
  eps = _number(section, "eps", path, DEFAULT_EPS, positive=True)
  if section.get("correct_bias", True) is not True:
    raise _fail(path, "correct_bias", section["correct_bias"], "true (bias correction is always applied)")

  parts: list[optax.GradientTransformation] = []
  if norm is not None:
    parts.append(clip_by_global_norm(norm))
  if value is not None:
    parts.append(optax.clip(value))
  if kind in ("sgd", "momentum"):
    momentum = _number(section, "momentum", path, 0.9 if kind == "momentum" else 0.0, unit=True)
    if wd:
      parts.append(optax.add_decayed_weights(wd))
    if momentum:
      parts.append(optax.trace(decay=momentum, nesterov=bool(section.get("nesterov", False))))
  else:
    b1, b2 = _betas(section, path)
    if kind == "adam" and wd:
      parts.append(optax.add_decayed_weights(wd))
    parts.append(scale_by_adam(b1, b2, eps))
    if kind in ("adamw", "lamb") and wd:
      parts.append(optax.add_decayed_weights(wd))
    if kind == "lamb":
      parts.append(optax.scale_by_trust_ratio())
  parts.append(optax.scale_by_learning_rate(schedule))
  return optax.chain(*parts), _loss_scale(section, get_format(half_dtype), path)


class StepResult(NamedTuple):
  """What `apply_gradients` returns."""

  params: Any
  opt_state: Any
  loss_scale: StaticLossScale | DynamicLossScale
  step: jax.Array
  grads_finite: jax.Array


def apply_gradients(
  tx: optax.GradientTransformation,
  params: Any,
  opt_state: Any,
  loss_scale: StaticLossScale | DynamicLossScale,
  step: jax.Array,
  grads: Any,
) -> StepResult:
  """Cerebras' optimizer step with a conditional update, jit-safe.

  ``grads`` are the gradients of the **scaled** loss (``loss_scale.scale(loss)``); they are
  unscaled here (reciprocal in float32). The step is finite when the global L2 norm of the
  unscaled gradients is below inf. A finite step applies the update and advances ``step``; a
  non-finite one keeps ``params``, ``opt_state`` (so the schedule's counter too) and ``step``.
  The loss scale is then adjusted (DLS halves on overflow, grows after ``steps_per_increase``).
  """
  grads = loss_scale.unscale(grads)
  grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
  finite = all_finite(grads)
  updates, new_state = tx.update(grads, opt_state, params)
  new_params = optax.apply_updates(params, updates)
  params, opt_state, step = select_tree(finite, (new_params, new_state, step + 1), (params, opt_state, step))
  return StepResult(params, opt_state, loss_scale.adjust(finite), step, finite)
