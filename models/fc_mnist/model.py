"""fc_mnist: modelzoo's fully connected MNIST classifier, in Flax NNX.

``depth`` hidden layers of ``hidden_size`` units (or one size per layer when ``hidden_size`` is
a list), each ``activation_fn`` then dropout, and a final linear layer to 10 classes.

Shapes: images float32[batch, 784] (or [batch, 28, 28], flattened) -> logits float32[batch, 10].
"""

from __future__ import annotations

import itertools
from typing import Any, Literal

import jax
import jax.numpy as jnp
from flax import nnx
from pydantic import ConfigDict, Field, field_validator, model_validator

from models.common import activation, cross_entropy
from wafer.config import ModelConfig

NUM_CLASSES = 10
INPUT_SIZE = 784


class FCMnistConfig(ModelConfig):
  """``model:`` of fc_mnist (closed: an unknown key is an error)."""

  model_config = ConfigDict(extra="forbid")

  name: str | None = "fc_mnist"
  depth: int = Field(default=10, ge=1)
  hidden_size: int | list[int] = 50  # > 0, each entry too (`_positive_widths`)
  dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
  activation_fn: Literal["relu", "gelu", "tanh", "sigmoid", "silu", "leaky_relu"] = "relu"
  to_float16: bool = False
  input_size: int = Field(default=INPUT_SIZE, ge=1)
  num_classes: int = Field(default=NUM_CLASSES, ge=2)

  @field_validator("hidden_size", mode="before")
  @classmethod
  def _positive_widths(cls, v: Any) -> Any:
    """Widths are positive integers (0 was a ZeroDivisionError at the trace, -3 a negative shape)."""
    widths = v if isinstance(v, list) else [v]
    for i, w in enumerate(widths):
      if isinstance(w, bool) or not isinstance(w, int):
        where = f"entry {i} is {w!r}; " if isinstance(v, list) else ""
        raise ValueError(f"{where}must be a positive integer, or a list of them (one width per hidden layer)")
      if w < 1:
        where = f"entry {i} is {w}; every entry " if isinstance(v, list) else ""
        raise ValueError(f"{where}must be greater than or equal to 1")
    if not widths:
      raise ValueError("must have at least 1 item(s): one width per hidden layer, or one number for all")
    return v

  @model_validator(mode="after")
  def _one_width_per_layer(self) -> FCMnistConfig:
    try:
      self.hidden_sizes()
    except ValueError as error:  # "key=value: why" locates the problem at hidden_size (wafer.config.errors)
      raise ValueError(f"hidden_size={self.hidden_size}: {error}") from None
    return self

  @field_validator("to_float16")
  @classmethod
  def _to_float16(cls, v: bool) -> bool:
    """modelzoo 2.x casts the whole model, weights included, to the half type when it is true
    (``model.to(cstorch.amp.get_half_dtype())``, Release_2.10.0 fc_mnist/model.py; 1.x refused it): no
    float32 weights, which wafer always keeps. Refused rather than silently trained in mixed precision."""
    if v:
      raise ValueError(
        "true (the whole model, its weights too, in the half type, as modelzoo 2.x's fc_mnist does) is not "
        "available: wafer keeps the weights in float32 and computes in the half type with "
        "model.mixed_precision: true (and model.fp16_type); set model.to_float16: false"
      )
    return v

  def hidden_sizes(self) -> list[int]:
    """One width per hidden layer."""
    if isinstance(self.hidden_size, list):
      if len(self.hidden_size) != self.depth:
        raise ValueError(
          f"has {len(self.hidden_size)} entries, depth is {self.depth}: give one width per hidden layer "
          f"({self.depth}), or one number for all, or set model.depth={len(self.hidden_size)}"
        )
      return list(self.hidden_size)
    return [self.hidden_size] * self.depth


class FCMnist(nnx.Module):
  """The MLP. Call with images float32[batch, 784] -> logits float32[batch, num_classes]."""

  def __init__(self, config: FCMnistConfig, *, rngs: nnx.Rngs):
    sizes = [config.input_size, *config.hidden_sizes()]
    self.activation_fn = config.activation_fn
    self.layers = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in itertools.pairwise(sizes)])
    self.dropout = nnx.Dropout(config.dropout, rngs=rngs)
    self.last_layer = nnx.Linear(sizes[-1], config.num_classes, rngs=rngs)

  def __call__(self, images: jax.Array) -> jax.Array:
    x = images.reshape(images.shape[0], -1)
    act = activation(self.activation_fn)
    for i, layer in enumerate(self.layers):
      with jax.named_scope(f"layer_{i}"):  # kernel names for the wafer cost model
        x = self.dropout(act(layer(x)))
    with jax.named_scope("last_layer"):
      return self.last_layer(x)


def fc_mnist_loss(model: FCMnist, batch: dict[str, jax.Array]) -> jax.Array:
  """Mean cross-entropy. ``batch``: ``images`` float32[b, 784], ``labels`` int32[b] -> float32 scalar."""
  logits = model(batch["images"])
  return jnp.mean(cross_entropy(logits, batch["labels"]))
