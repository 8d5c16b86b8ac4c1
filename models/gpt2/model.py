"""GPT-2 / GPT-3-style decoder LM in Flax NNX, following modelzoo's ``gpt2`` and ``gpt3`` models.

Learned position embeddings, pre-LN blocks (``x + Drop(Attn(LN(x)))``, ``x + Drop(FFN(LN(x)))``),
causal self-attention, a final LayerNorm and an output layer tied to the word embeddings
(``share_embedding_weights``). The GPT-3 configs (Cerebras-GPT shapes) use the same model with
dense attention. Float32 with no casts; precision comes from `precision.autocast`.

Shapes: input_ids int32[batch, seq] -> logits float32[batch, seq, vocab].
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import jax
import jax.numpy as jnp
from flax import nnx
from pydantic import ConfigDict, Field, model_validator

from models.common import (
  MultiHeadAttention,
  activation,
  cross_entropy,
  position_ids,
  run_layers,
  truncated_normal,
)
from models.mup import MupConfig


class GPT2Config(MupConfig):
  """``model:`` of gpt2 / gpt3 (closed: an unknown key is an error). Defaults are GPT-2 small's.

  muP keys and learning-rate groups: `models.mup`.
  """

  model_config = ConfigDict(extra="forbid")
  learning_rate_groups: ClassVar[tuple[str, ...]] = (
    "embedding",
    "decoder_kernel",
    "decoder_attention",
    "decoder_input_ffn",
    "decoder_output_ffn",
  )
  kernel_groups: ClassVar[dict[str, tuple[str, ...]]] = {
    "attention": ("decoder_attention", "decoder_kernel"),
    "ffn_in": ("decoder_input_ffn", "decoder_kernel"),
    "ffn_out": ("decoder_output_ffn", "decoder_kernel"),
  }

  name: str | None = "gpt2"
  vocab_size: int = Field(default=50257, ge=1)
  hidden_size: int = Field(default=768, ge=1)
  num_hidden_layers: int = Field(default=12, ge=1)
  num_heads: int = Field(default=12, ge=1)
  filter_size: int = Field(default=3072, ge=1)
  max_position_embeddings: int = Field(default=1024, ge=1)
  position_embedding_type: Literal["learned"] = "learned"
  share_embedding_weights: bool = True
  dropout_rate: float = Field(default=0.1, ge=0.0, lt=1.0)
  embedding_dropout_rate: float | None = Field(default=None, ge=0.0, lt=1.0)
  attention_dropout_rate: float | None = Field(default=None, ge=0.0, lt=1.0)
  layer_norm_epsilon: float = Field(default=1.0e-5, gt=0.0)
  attention_type: Literal["scaled_dot_product"] = "scaled_dot_product"
  use_projection_bias_in_attention: bool = True
  use_ffn_bias_in_attention: bool = True
  use_ffn_bias: bool = True
  use_bias_in_output: bool = False
  nonlinearity: Literal["gelu", "gelu_new", "relu", "silu"] = "gelu"
  loss_scaling: Literal["num_tokens", "batch_size"] = "num_tokens"
  loss_weight: float = Field(default=1.0, gt=0.0)
  embedding_initializer: dict[str, Any] | None = None
  initializer: dict[str, Any] | None = None
  output_layer_initializer: dict[str, Any] | None = None
  output_logits_scale: float | None = Field(default=None, gt=0.0)
  initializer_range: float = Field(default=0.02, gt=0.0)

  @model_validator(mode="after")
  def _one_output_scale(self) -> GPT2Config:
    if self.output_logits_scale is not None and self.is_mup:
      raise ValueError(
        "output_logits_scale (the 1.x - 2.2 muP key) and the muP base sizes cannot both be set (modelzoo's "
        "rule): with base sizes the multiplier is output_logits_alpha / (hidden_size / mup_base_hidden_size)"
      )
    return self

  def output_logits_multiplier(self) -> float | None:
    """muP's ``alpha / w``, or the legacy ``output_logits_scale`` as given (`models.mup`)."""
    return super().output_logits_multiplier() if self.is_mup else self.output_logits_scale

  def mup_learning_rate_scales(self) -> dict[str, float]:
    if not self.is_mup:
      return {}
    w, f = self.width_multiplier, self.filter_multiplier
    return {"decoder_attention": 1 / w, "decoder_input_ffn": 1 / w, "decoder_output_ffn": 1 / f}

  def parameter_name(self, names: tuple[str, ...]) -> str:
    """Modelzoo's torch name of the parameter at ``names`` (what ``sparsity`` filters match).

    Modules as in modelzoo's GPT-2/3 (``gpt2_model.py``, ``TransformerDecoderLayer.py``,
    ``AttentionLayer.py``, ``FeedForwardNetwork.py`` of releases 2.1 to 2.10, under the wrapper's
    ``model``); a torch ``weight`` is a Flax ``kernel``, ``embedding`` or norm ``scale``.

    >>> GPT2Config().parameter_name(("layers", "3", "attention", "query", "kernel"))
    'model.transformer_decoder.layers.3.self_attn.proj_q_dense_layer.weight'
    >>> GPT2Config().parameter_name(("layers", "3", "ffn_out", "bias"))
    'model.transformer_decoder.layers.3.ffn.ffn.1.linear_layer.bias'
    """
    if not names:
      return "model"
    leaf = "bias" if names[-1] == "bias" else "weight"
    head, rest = names[0], names[1:-1]
    if head == "layers" and len(rest) >= 2:
      i, module = rest[0], rest[1:]
      layer = f"model.transformer_decoder.layers.{i}."
      if module[0] == "attention" and len(module) == 2:
        proj = {"query": "q", "key": "k", "value": "v", "output": "output"}.get(module[1], module[1])
        return f"{layer}self_attn.proj_{proj}_dense_layer.{leaf}"
      local = {"attention_norm": "norm1", "ffn_norm": "norm3", "ffn_in": "ffn.ffn.0.linear_layer"}
      local["ffn_out"] = "ffn.ffn.1.linear_layer"
      return f"{layer}{local.get(module[0], '.'.join(module))}.{leaf}"
    top = {
      "word_embeddings": "model.embedding_layer.word_embeddings",
      "position_embeddings": "model.embedding_layer.position_embeddings",
      "final_norm": "model.ln_f",
      "lm_head": "model.lm_head",
    }
    if head == "output_bias":
      return "model.lm_head.bias"
    return f"{top.get(head, 'model.' + head)}.{leaf}" if not rest else "model." + ".".join(names)

  def initializer_std(self, which: str) -> float:
    """The std of ``which`` (an initializer key), modelzoo's defaults when it is absent, scaled for
    muP (`models.mup`): ``initializer`` (q/k/v, first FFN layer), ``output_layer_initializer``
    (attention output, and the second FFN layer without muP), ``ffn_output_layer_initializer``
    (the second FFN layer), ``embedding_initializer``.

    Only the ``std`` of a ``normal`` / ``truncated_normal`` spec is used (cut at ±2 std); an
    absent one is modelzoo's default initializer, ``initializer_range`` (0.02).
    """
    depth = (2 * self.num_hidden_layers) ** -0.5
    r = self.initializer_range
    if which == "ffn_output_layer_initializer":
      if self.is_mup:  # modelzoo's default initializer, not the file's
        return r * self.filter_multiplier**-0.5 * depth
      which = "output_layer_initializer"
    spec = getattr(self, which)
    if spec is None:
      std = r * depth if which == "output_layer_initializer" and not self.is_mup else r
    elif spec.get("name") not in ("normal", "truncated_normal"):
      raise ValueError(
        f"model.{which}.name: only normal and truncated_normal are supported, got {spec.get('name')!r}"
      )
    else:
      std = float(spec.get("std", r))
    if self.is_mup and which == "initializer":
      return std * self.width_multiplier**-0.5
    if self.is_mup and which == "output_layer_initializer":
      return std * self.width_multiplier**-0.5 * depth
    return std


class GPT2Block(nnx.Module):
  """Pre-LN decoder block. x float32[batch, seq, hidden], mask bool[batch, seq, seq] -> same as x."""

  def __init__(self, c: GPT2Config, *, rngs: nnx.Rngs):
    d = c.hidden_size
    init = truncated_normal(c.initializer_std("initializer"))
    out_init = truncated_normal(c.initializer_std("output_layer_initializer"))
    ffn_out_init = truncated_normal(c.initializer_std("ffn_output_layer_initializer"))
    attention_dropout = c.dropout_rate if c.attention_dropout_rate is None else c.attention_dropout_rate
    self.attention_norm = nnx.LayerNorm(d, epsilon=c.layer_norm_epsilon, rngs=rngs)
    self.attention = MultiHeadAttention(
      d,
      c.num_heads,
      dropout_rate=attention_dropout,
      use_bias=c.use_projection_bias_in_attention,
      use_output_bias=c.use_ffn_bias_in_attention,
      kernel_init=init,
      output_init=out_init,
      score_scale=c.attention_scale(d // c.num_heads),
      rngs=rngs,
    )
    self.ffn_norm = nnx.LayerNorm(d, epsilon=c.layer_norm_epsilon, rngs=rngs)
    self.ffn_in = nnx.Linear(d, c.filter_size, use_bias=c.use_ffn_bias, kernel_init=init, rngs=rngs)
    self.ffn_out = nnx.Linear(c.filter_size, d, use_bias=c.use_ffn_bias, kernel_init=ffn_out_init, rngs=rngs)
    self.dropout = nnx.Dropout(c.dropout_rate, rngs=rngs)
    self.nonlinearity = c.nonlinearity

  def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
    with jax.named_scope("attention"):  # kernel names for the wafer cost model
      x = x + self.dropout(self.attention(self.attention_norm(x), mask))
    with jax.named_scope("ffn"):
      ffn = self.ffn_out(activation(self.nonlinearity)(self.ffn_in(self.ffn_norm(x))))
      return x + self.dropout(ffn)


class GPT2LMHeadModel(nnx.Module):
  """The decoder LM: input_ids int32[batch, seq] -> logits float32[batch, seq, vocab]."""

  def __init__(self, c: GPT2Config, *, rngs: nnx.Rngs):
    d = c.hidden_size
    embed_init = truncated_normal(c.initializer_std("embedding_initializer"))
    self.word_embeddings = nnx.Embed(c.vocab_size, d, embedding_init=embed_init, rngs=rngs)
    self.position_embeddings = nnx.Embed(c.max_position_embeddings, d, embedding_init=embed_init, rngs=rngs)
    embedding_dropout = c.dropout_rate if c.embedding_dropout_rate is None else c.embedding_dropout_rate
    self.embedding_dropout = nnx.Dropout(embedding_dropout, rngs=rngs)
    self.layers = nnx.List([GPT2Block(c, rngs=rngs) for _ in range(c.num_hidden_layers)])
    self.final_norm = nnx.LayerNorm(d, epsilon=c.layer_norm_epsilon, rngs=rngs)
    self.lm_head = (
      None
      if c.share_embedding_weights
      else nnx.Linear(  # modelzoo: normal(0, initializer_range), untruncated (gpt2_model.py reset_parameters)
        d, c.vocab_size, use_bias=False, kernel_init=nnx.initializers.normal(c.initializer_range), rngs=rngs
      )
    )
    self.output_bias = nnx.Param(jnp.zeros((c.vocab_size,), jnp.float32)) if c.use_bias_in_output else None
    self.scan_layers = c.scan_layers
    self.embeddings_scale = c.embeddings_scale
    self.logits_scale = c.output_logits_multiplier()

  def __call__(self, input_ids: jax.Array) -> jax.Array:
    b, s = input_ids.shape
    positions = position_ids(input_ids, self.position_embeddings)
    with jax.named_scope("embeddings"):
      x = self.word_embeddings(input_ids) + self.position_embeddings(positions)[None]
      if self.embeddings_scale != 1.0:  # muP
        x = x * jnp.float32(self.embeddings_scale)
      x = self.embedding_dropout(x)
    causal = jnp.tril(jnp.ones((s, s), jnp.bool_))
    mask = jnp.broadcast_to(causal[None], (b, s, s))
    x = run_layers(self.layers, x, mask, scope="decoder", scan=self.scan_layers)
    with jax.named_scope("lm_head"):
      x = self.final_norm(x)
      logits = self.word_embeddings.attend(x) if self.lm_head is None else self.lm_head(x)
      if self.output_bias is not None:
        logits = logits + self.output_bias[...][None, None]
      if self.logits_scale is not None:  # muP
        logits = logits * jnp.float32(self.logits_scale)
      return logits


def gpt2_loss(
  model: GPT2LMHeadModel,
  batch: dict[str, jax.Array],
  *,
  loss_scaling: str = "num_tokens",
  loss_weight: float = 1.0,
) -> jax.Array:
  """Next-token cross-entropy (float32 scalar).

  ``batch`` (modelzoo's GPT features): ``input_ids`` and ``labels`` int32[b, s] (labels are the
  inputs shifted by one), ``attention_mask`` [b, s] (1 = the position counts in the loss; all
  ones when absent). ``num_tokens``: ``sum(CE * mask) / sum(mask)``; ``batch_size``:
  ``sum(CE * mask) * loss_weight / b``.
  """
  logits = model(batch["input_ids"])
  with jax.named_scope("loss"):
    ce = cross_entropy(logits, batch["labels"])
  mask = batch.get("attention_mask")
  weights = jnp.ones_like(ce) if mask is None else mask.astype(jnp.float32)
  total = jnp.sum(ce * weights)
  if loss_scaling == "num_tokens":
    return total / jnp.maximum(jnp.sum(weights), jnp.float32(1.0))
  if loss_scaling == "batch_size":
    return total * jnp.float32(loss_weight / ce.shape[0])
  raise ValueError(f"loss_scaling must be 'num_tokens' or 'batch_size', not {loss_scaling!r}")


def random_batch(key: jax.Array, batch_size: int, seq_len: int, vocab_size: int) -> dict[str, jax.Array]:
  """A synthetic batch in the shape of modelzoo's GPT features (labels = inputs shifted by one)."""
  tokens = jax.random.randint(key, (batch_size, seq_len + 1), 0, vocab_size, jnp.int32)
  return {
    "input_ids": tokens[:, :-1],
    "labels": tokens[:, 1:],
    "attention_mask": jnp.ones((batch_size, seq_len), jnp.int32),
  }
