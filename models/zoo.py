"""From a validated ``model:`` section to a model and its loss (the hook for registry builders).

Example::

  params = wafer.config.load_params("models/bert/configs/params_bert_tiny.yaml")
  model = build_model(params.model, rngs=nnx.Rngs(params.runconfig.seed or 0))
  loss = loss_function(params.model)       # loss(model, batch) -> float32 scalar
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from models.bert.model import BertConfig, BertForPreTraining, bert_loss
from models.fc_mnist.model import FCMnist, FCMnistConfig, fc_mnist_loss
from models.gpt2.model import GPT2Config, GPT2LMHeadModel, gpt2_loss
from wafer.config import ModelConfig

Loss = Callable[[nnx.Module, dict[str, jax.Array]], jax.Array]


def build_model(config: ModelConfig, *, rngs: nnx.Rngs) -> nnx.Module:
  """The NNX model of a registered schema's ``model:`` section (float32 weights)."""
  if isinstance(config, BertConfig):
    return BertForPreTraining(config, rngs=rngs)
  if isinstance(config, GPT2Config):
    return GPT2LMHeadModel(config, rngs=rngs)
  if isinstance(config, FCMnistConfig):
    return FCMnist(config, rngs=rngs)
  raise TypeError(f"no reference model for model section {type(config).__name__} (name={config.name!r})")


def loss_function(config: ModelConfig) -> Loss:
  """``loss(model, batch) -> float32 scalar`` with the section's loss keys bound."""
  if isinstance(config, BertConfig):
    return functools.partial(
      bert_loss, mlm_loss_weight=config.mlm_loss_weight, mlm_loss_scaling=config.mlm_loss_scaling
    )
  if isinstance(config, GPT2Config):
    return functools.partial(gpt2_loss, loss_scaling=config.loss_scaling, loss_weight=config.loss_weight)
  if isinstance(config, FCMnistConfig):
    return fc_mnist_loss
  raise TypeError(f"no reference loss for model section {type(config).__name__} (name={config.name!r})")


def abstract_model(config: ModelConfig) -> Any:
  """The model with abstract (shape-only) parameters: no memory, for counts and cost models."""
  return nnx.eval_shape(lambda: build_model(config, rngs=nnx.Rngs(0)))


def functional(config: ModelConfig) -> tuple[Callable[[jax.Array], Any], Callable[[Any, Any], jax.Array]]:
  """``(init_params, loss_fn)`` in the executor's `Task` form, with dropout off (eval mode).

  ``init_params(key) -> nnx.State`` of the float32 ``nnx.Param`` leaves; ``loss_fn(params,
  batch) -> float32 scalar``. Dropout is off because a pure ``loss_fn(params, batch)`` has no
  per-step key; wiring one in (e.g. a ``dropout_key`` batch entry) is left to the Task builders.
  """
  init_params = functools.partial(_init_params, config)
  model_of = bind(config)
  loss = loss_function(config)

  def loss_fn(params: Any, batch: Any) -> jax.Array:
    return loss(model_of(params), batch)

  return init_params, loss_fn


def _init_params(config: ModelConfig, key: jax.Array) -> Any:
  model = build_model(config, rngs=nnx.Rngs(params=key, dropout=0))
  model.eval()
  return nnx.split(model, nnx.Param, ...)[1]


def bind(config: ModelConfig) -> Callable[[Any], nnx.Module]:
  """``model_of(params) -> nnx.Module`` (eval mode): the model around a pytree of its ``nnx.Param`` leaves.

  Pure: usable inside jit and grad (``model_of(params)(inputs)``).
  """
  template = nnx.eval_shape(lambda: build_model(config, rngs=nnx.Rngs(0)))
  template.eval()
  graphdef, _, abstract_rest = nnx.split(template, nnx.Param, ...)

  def concrete(leaf: jax.ShapeDtypeStruct) -> jax.Array:  # RNG stream keys and counts (unused in eval)
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
      return jax.random.split(jax.random.key(0), leaf.shape) if leaf.shape else jax.random.key(0)
    return jnp.zeros(leaf.shape, leaf.dtype)

  rest = jax.tree.map(concrete, abstract_rest)

  def model_of(params: Any) -> nnx.Module:
    return nnx.merge(graphdef, params, rest)

  return model_of
