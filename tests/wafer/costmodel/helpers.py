"""Small JAX steps for the cost-model tests (abstract shapes only; nothing is computed)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp


def sds(*shape: int, dtype: Any = jnp.float32) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(tuple(shape), dtype)


def sgd_step(loss: Callable[[Any, Any], jax.Array], lr: float = 1e-3) -> Callable[..., Any]:
  """``step(params, batch)``: one SGD update of ``params`` on ``loss(params, batch)``."""

  def step(params: Any, batch: Any) -> Any:
    return jax.tree.map(lambda p, g: p - lr * g, params, jax.grad(loss)(params, batch))

  return step


def unrolled_layers(cfg: Any, naming: str) -> Callable[[jax.Array, Any], jax.Array]:
  """``layers(x, layer_params)`` for `wafer.costmodel.workloads.loss_fn`: the transformer layers in a
  Python loop over the stacked parameters instead of ``lax.scan``. ``naming``: ``"indexed"`` (each
  layer under ``layer_{i}``), ``"shared"`` (every layer under the same scope names: attn, mlp) or
  ``"nested"`` (each layer a nested ``jax.jit`` call, as Flax modules and the reference models)."""
  from wafer.costmodel import workloads as W

  def layers(x: jax.Array, layer_params: Any) -> jax.Array:
    for i in range(cfg.layers):
      p = jax.tree.map(lambda a, i=i: a[i], layer_params)
      if naming == "indexed":
        with jax.named_scope(f"layer_{i}"):
          x = W._layer(cfg, x, p)
      elif naming == "nested":
        x = jax.jit(functools.partial(W._layer, cfg))(x, p)
      else:
        x = W._layer(cfg, x, p)
    return x

  return layers


def mlp_train_step(widths: Sequence[int], *, names: bool = True, lr: float = 0.1) -> Callable[..., Any]:
  """``step(params, x, y)``: an MLP on ``x[b, t, widths[0]]`` (tanh between layers), mean squared error,
  plain SGD. Layer ``i`` is named ``layer{i}`` when ``names``."""

  def loss(params: list[dict[str, jax.Array]], x: jax.Array, y: jax.Array) -> jax.Array:
    h = x
    for i, p in enumerate(params):
      if names:
        with jax.named_scope(f"layer{i}"):
          h = jnp.einsum("btd,df->btf", h, p["w"])
      else:
        h = jnp.einsum("btd,df->btf", h, p["w"])
      if i < len(params) - 1:
        h = jnp.tanh(h)
    return jnp.mean(jnp.square(h - y))

  def step(params: list[dict[str, jax.Array]], x: jax.Array, y: jax.Array) -> list[dict[str, jax.Array]]:
    grads = jax.grad(loss)(params, x, y)
    return jax.tree.map(lambda p, g: p - lr * g, params, grads)

  return step


def mlp_params(widths: Sequence[int]) -> list[dict[str, jax.ShapeDtypeStruct]]:
  return [{"w": sds(a, b)} for a, b in zip(widths[:-1], widths[1:])]


def batch_args(
  batch: int, tokens: int, d_in: int, d_out: int
) -> tuple[jax.ShapeDtypeStruct, jax.ShapeDtypeStruct]:
  return sds(batch, tokens, d_in), sds(batch, tokens, d_out)


@dataclasses.dataclass(frozen=True)
class Net:
  """Shape of a small pre-norm transformer LM in the costmodel tests."""

  layers: int
  d: int
  heads: int
  ffn: int
  vocab: int
  seq: int
