"""A plain pre-LN Transformer encoder in Flax NNX, written in float32 with no casts.

It is the common body of the reference models (BERT builds its heads on it) and the test
and benchmark subject of `precision.autocast`: mixed precision comes from the pass, never
from this code.

Shapes: tokens ``int32[batch, seq]`` -> hidden ``float32[batch, seq, hidden]`` -> logits
``float32[batch, seq, vocab]`` (a dense output layer over the vocabulary).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax
from flax import nnx


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
  """Sizes of the encoder. Defaults are BERT-base's (110M parameters with its heads)."""

  vocab_size: int = 30522
  max_position_embeddings: int = 512
  hidden_size: int = 768
  num_hidden_layers: int = 12
  num_heads: int = 12
  filter_size: int = 3072
  layer_norm_epsilon: float = 1e-12

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads


class EncoderLayer(nnx.Module):
  """Pre-LN block: ``x + Attn(LN(x))`` then ``x + FFN(LN(x))``, GELU FFN."""

  def __init__(self, config: EncoderConfig, *, rngs: nnx.Rngs):
    d, f = config.hidden_size, config.filter_size
    self.config = config
    self.attention_norm = nnx.LayerNorm(d, epsilon=config.layer_norm_epsilon, rngs=rngs)
    self.qkv = nnx.Linear(d, 3 * d, rngs=rngs)
    self.attention_output = nnx.Linear(d, d, rngs=rngs)
    self.ffn_norm = nnx.LayerNorm(d, epsilon=config.layer_norm_epsilon, rngs=rngs)
    self.ffn_in = nnx.Linear(d, f, rngs=rngs)
    self.ffn_out = nnx.Linear(f, d, rngs=rngs)

  def __call__(self, x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """x: float32[batch, seq, hidden]; mask: bool[batch, seq] (True = attend) or None."""
    c = self.config
    b, s, _ = x.shape
    q, k, v = jnp.split(self.qkv(self.attention_norm(x)), 3, axis=-1)
    q, k, v = (t.reshape(b, s, c.num_heads, c.head_dim) for t in (q, k, v))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(c.head_dim))
    if mask is not None:
      scores = jnp.where(mask[:, None, None, :], scores, jnp.float32(-1e9))
    probs = jax.nn.softmax(scores, axis=-1)
    context = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, c.hidden_size)
    x = x + self.attention_output(context)
    return x + self.ffn_out(jax.nn.gelu(self.ffn_in(self.ffn_norm(x)), approximate=False))


class Encoder(nnx.Module):
  """Token + position embeddings, ``num_hidden_layers`` blocks, a final LayerNorm, logits."""

  def __init__(self, config: EncoderConfig, *, rngs: nnx.Rngs):
    self.config = config
    self.token_embedding = nnx.Embed(config.vocab_size, config.hidden_size, rngs=rngs)
    self.position_embedding = nnx.Embed(config.max_position_embeddings, config.hidden_size, rngs=rngs)
    self.layers = nnx.List([EncoderLayer(config, rngs=rngs) for _ in range(config.num_hidden_layers)])
    self.final_norm = nnx.LayerNorm(config.hidden_size, epsilon=config.layer_norm_epsilon, rngs=rngs)
    self.output = nnx.Linear(config.hidden_size, config.vocab_size, rngs=rngs)

  def __call__(self, tokens: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """tokens: int32[batch, seq] -> logits float32[batch, seq, vocab]."""
    positions = jnp.arange(tokens.shape[1], dtype=jnp.int32)
    x = self.token_embedding(tokens) + self.position_embedding(positions)[None]
    for layer in self.layers:
      x = layer(x, mask)
    return self.output(self.final_norm(x))


def token_loss(model: Encoder, tokens: jax.Array, targets: jax.Array) -> jax.Array:
  """Mean softmax cross-entropy of ``model(tokens)`` against int32 ``targets`` (float32 scalar)."""
  logits = model(tokens)
  return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def parameter_count(model: nnx.Module) -> int:
  """Number of scalars in the model's ``nnx.Param`` leaves."""
  return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
