"""From a validated ``model:`` section to a model and its loss (the hook for registry builders).

Example:

>>> import jax.numpy as jnp
>>> from flax import nnx
>>> from wafer.config import load_params
>>> params = load_params("models/fc_mnist/configs/params_fc_mnist.yaml")
>>> model = build_model(params.model, rngs=nnx.Rngs(params.runconfig.seed or 0))
>>> loss = loss_function(params.model)       # loss(model, batch) -> float32 scalar
>>> batch = {"images": jnp.zeros((2, 784), jnp.float32), "labels": jnp.zeros((2,), jnp.int32)}
>>> loss(model, batch).dtype
dtype('float32')
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
  """``(init_params, loss_fn)`` in the executor's `Task` form.

  ``init_params(key) -> nnx.State`` of the float32 ``nnx.Param`` leaves; ``loss_fn(params,
  batch) -> float32 scalar``. Dropout follows the batch: with a ``dropout_key`` entry (uint32[2]
  raw key data, or uint32[batch, 2] with the step's key on every row, as
  `wafer.data.GrainBatchSource` makes it) the model runs in train mode with dropout drawn from
  that key; without one it runs in eval mode (no dropout).
  """
  init_params = functools.partial(_init_params, config)
  model_of = bind(config)
  loss = loss_function(config)

  def loss_fn(params: Any, batch: Any) -> jax.Array:
    key = batch.get("dropout_key") if hasattr(batch, "get") else None
    model_batch = {k: v for k, v in batch.items() if k != "dropout_key"} if key is not None else batch
    if key is not None and not jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key) and key.ndim == 2:
      key = key[0]
    return loss(model_of(params, dropout_key=key), model_batch)

  return init_params, loss_fn


def _init_params(config: ModelConfig, key: jax.Array) -> Any:
  model = build_model(config, rngs=nnx.Rngs(params=key, dropout=0))
  model.eval()
  return nnx.split(model, nnx.Param, ...)[1]


def bind(config: ModelConfig) -> Callable[..., nnx.Module]:
  """``model_of(params, dropout_key=None) -> nnx.Module`` around a pytree of ``nnx.Param`` leaves.

  Without ``dropout_key`` the model is in eval mode (no dropout). With one (a typed
  ``jax.random`` key or a uint32[2] raw key) it is in train mode, and dropout layer ``i`` draws
  from ``fold_in(dropout_key, i)``. Pure: usable inside jit and grad (``model_of(params)(x)``).
  """
  template = nnx.eval_shape(lambda: build_model(config, rngs=nnx.Rngs(0)))
  template.eval()
  graphdef, _, abstract_rest = nnx.split(template, nnx.Param, ...)

  leaves, treedef = jax.tree.flatten(abstract_rest)

  def keyed(dropout_key: jax.Array) -> Any:
    if not jax.dtypes.issubdtype(dropout_key.dtype, jax.dtypes.prng_key):
      dropout_key = jax.random.wrap_key_data(jnp.asarray(dropout_key, jnp.uint32))
    out = []
    for i, leaf in enumerate(leaves):
      if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        k = jax.random.fold_in(dropout_key, i)
        out.append(jax.random.split(k, leaf.shape) if leaf.shape else k)
      else:
        out.append(jnp.zeros(leaf.shape, leaf.dtype))
    return jax.tree.unflatten(treedef, out)

  rest = keyed(jax.random.key(0))  # RNG stream keys and counts of eval mode (unused: no dropout)

  def model_of(params: Any, dropout_key: jax.Array | None = None) -> nnx.Module:
    if dropout_key is None:
      return nnx.merge(graphdef, params, rest)
    model = nnx.merge(graphdef, params, keyed(dropout_key))
    model.train()
    return model

  return model_of
