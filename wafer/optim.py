"""The optimizer transforms the ``optimizer`` section builds, and Cerebras' conditional update.

The section's config classes (`wafer.config.optimizer`, one per ``optimizer_type``) build the optax
``GradientTransformation`` (clipping, weight decay, the update rule and the learning-rate
`wafer.schedules.Schedule`) and the loss-scale state from the transforms here. `apply_gradients` is Cerebras' conditional update
(``docs/references.md``, "Dynamic loss scaling"): unscale (`unscale_gradients`), test finiteness on the
global norm, update, and on a non-finite step keep parameters and optimizer state (including the
schedule's step counter); the global step advances on every step, skipped or not; then adjust the
loss scale. Everything is ``jnp.where``, no Python branching.

Update rules, with ``g`` the (clipped) gradient, ``lr = schedule(k)`` for the k-th applied step:

* sgd / momentum: ``g += wd * p``; ``buf = momentum * buf + g``; ``p -= lr * buf``
  (``g + momentum * buf`` with nesterov);
* adam: ``g += wd * p``; ``m = b1 m + (1 - b1) g``; ``v = b2 v + (1 - b2) g^2``;
  ``p -= lr * m_hat / (sqrt(v_hat) + eps)`` with ``m_hat = m / (1 - b1^k)``, ``v_hat = v / (1 - b2^k)``;
* adamw: as adam without the coupled decay, then ``p -= lr * wd * p`` (decoupled);
* lamb: ``u = m_hat / (sqrt(v_hat) + eps) + wd * p``; ``p -= lr * (||p|| / ||u||) * u`` (ratio 1 if
  either norm is 0), optax's LAMB.

Weight decay (``wd``) applies to kernels and embeddings, not to biases or normalization layers'
parameters (`decays`: modelzoo's rule, by parameter name). Per-group learning rates (muP,
``optimizer.adjust_learning_rate``) multiply a parameter's whole update
(`scale_by_learning_rate_multipliers`).

Clipping comes first: ``max_gradient_norm`` scales by ``min(1, max_norm / (||g|| + 1e-6))`` (torch's
``clip_grad_norm_``), ``max_gradient_value`` clamps to ``[-v, v]``.

optax's own ``adam``/``adamw``/``lamb`` raise under strict dtype promotion (``b1 ** count`` mixes a
Python float and int32), so `scale_by_adam` here is the same rule with float32 bias corrections computed as
``1 - b^k = -expm1(k ln b)`` (accurate where the direct float32 form cancels).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from precision.loss_scale import DynamicLossScale, StaticLossScale, all_finite, select_tree
from wafer.errors import OptimizerError, with_article

__all__ = (
  "OptimizerError",
  "StepResult",
  "add_decayed_weights",
  "apply_gradients",
  "decays",
  "clip_by_global_norm",
  "path_names",
  "scale_by_adam",
  "scale_by_adamax",
  "scale_by_learning_rate_multipliers",
  "unscale_gradients",
)

# ASSUMPTION: cstorch's Adam/AdamW/Lamb default eps is 1e-6 (HF-style); the configs in docs/references.md
# section 8 that care set eps explicitly.
DEFAULT_EPS = 1e-6


def scale_by_adam(
  b1: float = 0.9, b2: float = 0.999, eps: float = DEFAULT_EPS, *, bias_correction: bool = True
) -> optax.GradientTransformation:
  """``m_hat / (sqrt(v_hat) + eps)`` (see module docstring), float32-exact under strict promotion.

  With ``bias_correction=False`` (HF AdamW's ``correct_bias: false``) it is ``m / (sqrt(v) + eps)``.
  The state is ``optax.ScaleByAdamState(count, mu, nu)``, so it checkpoints like optax's.
  """
  if not bias_correction:
    b1_corr = b2_corr = 0.0
  else:
    b1_corr, b2_corr = b1, b2

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
    bc1 = -jnp.expm1(k * jnp.float32(math.log(b1_corr))) if b1_corr > 0 else jnp.float32(1)
    bc2 = -jnp.expm1(k * jnp.float32(math.log(b2_corr))) if b2_corr > 0 else jnp.float32(1)

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


def path_names(path: Sequence[Any]) -> tuple[str, ...]:
  """The names on a `jax.tree_util` key path: dict keys, attributes and sequence indices as strings,
  without the ``value`` attribute of an nnx variable.

  >>> from jax.tree_util import DictKey, GetAttrKey, SequenceKey
  >>> path_names((DictKey("layers"), SequenceKey(0), DictKey("kernel"), GetAttrKey("value")))
  ('layers', '0', 'kernel')
  """
  names = []
  for k in path:
    if isinstance(k, jax.tree_util.DictKey):
      names.append(str(k.key))
    elif isinstance(k, jax.tree_util.GetAttrKey):
      if k.name != "value":
        names.append(k.name)
    elif isinstance(k, jax.tree_util.SequenceKey):
      names.append(str(k.idx))
  return tuple(names)


def decays(path: Sequence[Any]) -> bool:
  """Whether weight decay applies to the parameter at ``path`` (a `jax.tree_util` key path).

  Modelzoo's rule (``common/optim_utils.py`` ``_should_apply_weight_decay``, in every release from
  1.9 to 2.10, both layouts): no decay for a parameter whose name contains ``bias``, nor for the
  parameters of a normalization module (LayerNorm, BatchNorm, InstanceNorm, GroupNorm; RMSNorm
  joins the list in 2.10). Flax names a normalization layer's gain ``scale`` and its shift
  ``bias``, so here, by name: a name on the path containing ``bias``, or a parameter called
  ``scale``. Kernels and embeddings decay. Limits of a rule by name: an RMSNorm gain is never
  decayed (modelzoo before 2.10 decayed it), nor is any other parameter called ``scale``; a bias
  named otherwise (``b``) is decayed.

  >>> from jax.tree_util import DictKey
  >>> [decays((DictKey("mlp"), DictKey(n))) for n in ("kernel", "bias", "scale", "embedding")]
  [True, False, False, True]
  """
  names = path_names(path) or ("",)
  return not any("bias" in n for n in names) and names[-1] != "scale"


def add_decayed_weights(weight_decay: float) -> optax.GradientTransformation:
  """``u += weight_decay * p`` for the parameters that decay (`decays`), ``u`` elsewhere.

  Coupled decay before an update rule (torch SGD/Adam's ``g += wd p``), decoupled after it (AdamW's
  ``p -= lr wd p``). Stateless, as optax's ``add_decayed_weights``.
  """

  def update(updates: Any, state: optax.EmptyState, params: Any = None) -> tuple[Any, optax.EmptyState]:
    if params is None:
      raise ValueError("add_decayed_weights: update() needs params (the weights it decays)")
    out = jax.tree_util.tree_map_with_path(
      lambda path, u, p: u + weight_decay * p if decays(path) else u, updates, params
    )
    return out, state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def scale_by_learning_rate_multipliers(multipliers: Callable[[Any], Any]) -> optax.GradientTransformation:
  """Each leaf's update times its learning-rate multiplier: per-group learning rates.

  ``multipliers(tree)`` maps a pytree shaped like the parameters to a pytree of the same structure
  of Python floats (it may read only the tree's paths and shapes: it runs on the updates). Chained
  after a whole optimizer (learning rate and weight decay included), it gives each leaf the
  learning rate ``schedule(k) * multiplier``, exactly what a torch parameter group with that
  ``lr`` gives for every update rule here: each one's step is ``lr`` times a direction, decoupled
  decay included (``p -= lr * wd * p``). Modelzoo's ``adjust_learning_rate`` groups (muP) are such
  multipliers.

  >>> tx = optax.chain(optax.sgd(0.1), scale_by_learning_rate_multipliers(lambda t: {"a": 1.0, "b": 0.25}))
  >>> params = {"a": jnp.ones(2), "b": jnp.ones(2)}
  >>> updates, _ = tx.update({"a": jnp.ones(2), "b": jnp.ones(2)}, tx.init(params), params)
  >>> [round(float(updates[k][0]), 6) for k in "ab"]
  [-0.1, -0.025]
  """

  def update(updates: Any, state: optax.EmptyState, params: Any = None) -> tuple[Any, optax.EmptyState]:
    del params
    factors = multipliers(updates)
    return jax.tree.map(lambda u, f: u if f == 1.0 else u * jnp.asarray(f, u.dtype), updates, factors), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def scale_by_adamax(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> optax.GradientTransformation:
  """torch Adamax: ``m = b1 m + (1-b1) g``; ``u = max(b2 u, |g| + eps)``; update ``m / ((1 - b1^k) u)``.

  The state is ``optax.ScaleByAdamState(count, mu, nu)`` with ``nu`` the infinity norm ``u``.
  """

  def init(params: Any) -> optax.ScaleByAdamState:
    zeros = lambda: jax.tree.map(jnp.zeros_like, params)
    return optax.ScaleByAdamState(count=jnp.zeros((), jnp.int32), mu=zeros(), nu=zeros())

  def update(
    updates: Any, state: optax.ScaleByAdamState, params: Any = None
  ) -> tuple[Any, optax.ScaleByAdamState]:
    del params
    count = state.count + 1
    bc1 = -jnp.expm1(count.astype(jnp.float32) * jnp.float32(math.log(b1))) if b1 > 0 else jnp.float32(1)
    c = lambda x, like: jnp.asarray(x, like.dtype)
    mu = jax.tree.map(lambda m, g: c(b1, g) * m + c(1 - b1, g) * g, state.mu, updates)
    nu = jax.tree.map(lambda u, g: jnp.maximum(c(b2, g) * u, jnp.abs(g) + c(eps, g)), state.nu, updates)
    out = jax.tree.map(lambda m, u: m / (bc1.astype(m.dtype) * u), mu, nu)
    return out, optax.ScaleByAdamState(count=count, mu=mu, nu=nu)

  return optax.GradientTransformation(init, update)


def unscale_gradients(loss_scale: StaticLossScale | DynamicLossScale, grads: Any, params: Any) -> Any:
  """The gradients of the scaled loss, unscaled and cast to their parameters' dtypes.

  ``loss_scale.unscale`` divides in float32 (a 16-bit gradient comes back float32); each gradient is
  then cast to its parameter's dtype, so that the finiteness test sees what the update will use (a
  float16 gradient beyond 65504 is inf) and an optimizer state built from 16-bit parameters keeps
  their dtype (a float32 gradient would make it float32, and a compiled step would see another
  dtype on its next call). The one unscaling of `apply_gradients` and of ``wafer run``'s train step
  (`wafer.train.step.make_train_step`).

  >>> import precision
  >>> ls = precision.StaticLossScale.create(8.0)
  >>> g = unscale_gradients(ls, {"w": jnp.full(2, 4.0, jnp.bfloat16)}, {"w": jnp.ones(2, jnp.bfloat16)})
  >>> g["w"].dtype, g["w"].tolist()
  (dtype(bfloat16), [0.5, 0.5])

  Raises:
    ValueError: a parameter is not a floating-point array (an integer one, whose gradient is
      ``float0`` under ``jax.grad(..., allow_int=True)``): an optimizer cannot update it. The
      message names the parameter's key path.
  """

  def cast(path: Any, g: Any, p: Any) -> Any:
    dtype = jnp.result_type(p)
    if not jnp.issubdtype(dtype, jnp.inexact):
      raise ValueError(
        f"params{jax.tree_util.keystr(path)} is {with_article(str(dtype))} array (its gradient is "
        f"{_dtype_name(g)}); an optimizer updates floating-point parameters only. Fix: keep integer "
        "arrays out of the parameters (close over them in the loss function, or pass them beside params)."
      )
    return jnp.asarray(g).astype(dtype)

  return jax.tree_util.tree_map_with_path(cast, loss_scale.unscale(grads), params)


def _dtype_name(x: Any) -> str:
  """``x``'s dtype as a name ("float0" for the gradient of an integer, whose NumPy name is a struct)."""
  dtype = getattr(x, "dtype", None)
  if dtype is None:
    return type(x).__name__
  return "float0" if dtype == jax.dtypes.float0 else str(dtype)


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
  unscaled here (reciprocal in float32) and cast to their parameters' dtypes (`unscale_gradients`).
  The step is finite when the global L2 norm of the unscaled gradients is below inf. A finite step
  applies the update; a non-finite one keeps ``params`` and ``opt_state`` (so the schedule's counter
  too). ``step``, the global step, advances by one on every step, skipped or not (Cerebras' global
  step, as ``wafer run``'s). The loss scale is then adjusted (DLS halves on overflow, grows after
  ``steps_per_increase``).

  Raises:
    ValueError: a parameter is not a floating-point array (`unscale_gradients`).
  """
  grads = unscale_gradients(loss_scale, grads, params)
  finite = all_finite(grads)
  updates, new_state = tx.update(grads, opt_state, params)
  new_params = optax.apply_updates(params, updates)
  params, opt_state = select_tree(finite, (new_params, new_state), (params, opt_state))
  return StepResult(params, opt_state, loss_scale.adjust(finite), jnp.asarray(step) + 1, finite)
