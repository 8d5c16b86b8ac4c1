"""BERT pre-training (MLM + NSP) in Flax NNX, following modelzoo's ``bert`` model.

* Embeddings: word + learned position + token type (``num_segments``), then LayerNorm and dropout.
* Encoder: post-LN blocks as in the original BERT (modelzoo's BERT is post-LN):
  ``x = LN(x + Drop(Attn(x)))``, ``x = LN(x + Drop(FFN(x)))``.
* MLM head: dense + ``encoder_nonlinearity`` + LayerNorm, then a decoder tied to the word
  embeddings (``share_embedding_weights``) plus a per-token bias.
* NSP head: pooler (dense + ``pooler_nonlinearity`` on the first token) and a 2-way classifier.

All float32, no casts: ``attention_softmax_fp32`` and the precision level act through
``Params.policy()`` (see `models.common`).

Shapes: input_ids, token_type_ids int32[batch, seq]; attention_mask int32/bool[batch, seq]
(1 = real token) -> mlm_logits float32[batch, P, vocab] (P = max_predictions_per_seq when
``masked_lm_positions`` is given, else seq), nsp_logits float32[batch, 2].
"""

from __future__ import annotations

from typing import ClassVar, Literal

import jax
import jax.numpy as jnp
from flax import nnx
from pydantic import ConfigDict, Field

from models.common import (
  MultiHeadAttention,
  activation,
  cross_entropy,
  position_ids,
  run_layers,
  truncated_normal,
)
from models.mup import MupConfig

Nonlinearity = Literal["gelu", "gelu_new", "relu", "tanh", "silu"]


class BertConfig(MupConfig):
  """``model:`` of bert (closed: an unknown key is an error). Defaults are BERT-base's.

  muP keys and learning-rate groups: `models.mup` (muP does not rescale BERT's initializers, as in
  every modelzoo release with a BERT muP config).
  """

  model_config = ConfigDict(extra="forbid")
  learning_rate_groups: ClassVar[tuple[str, ...]] = (
    "embedding",
    "encoder_attention",
    "encoder_input_ffn",
    "encoder_output_ffn",
    "pooler",
  )
  kernel_groups: ClassVar[dict[str, tuple[str, ...]]] = {
    "attention": ("encoder_attention",),
    "ffn_in": ("encoder_input_ffn",),
    "ffn_out": ("encoder_output_ffn",),
    "pooler": ("pooler",),
  }

  name: str | None = "bert"
  vocab_size: int = Field(default=30522, ge=1)
  hidden_size: int = Field(default=768, ge=1)
  num_hidden_layers: int = Field(default=12, ge=1)
  num_heads: int = Field(default=12, ge=1)
  filter_size: int = Field(default=3072, ge=1)
  encoder_nonlinearity: Nonlinearity = "gelu"
  pooler_nonlinearity: Nonlinearity | None = None
  dropout_rate: float = Field(default=0.1, ge=0.0, lt=1.0)
  attention_dropout_rate: float | None = Field(default=None, ge=0.0, lt=1.0)
  max_position_embeddings: int = Field(default=512, ge=1)
  position_embedding_type: Literal["learned"] = "learned"
  # modelzoo 2.x RoBERTa: the position table has one more row; the tokens of a sequence take rows
  # 1..seq and its padding (id 0, at the end) row 0 (modelzoo's LearnedPositionEmbeddingLayer)
  mask_padding_in_positional_embed: bool = False
  num_segments: int | None = Field(default=2, ge=1)
  layer_norm_epsilon: float = Field(default=1.0e-5, gt=0.0)
  share_embedding_weights: bool = True
  disable_nsp: bool = False
  mlm_loss_weight: float = Field(default=1.0, gt=0.0)
  mlm_loss_scaling: Literal["batch_size", "num_masked"] = "batch_size"
  initializer_range: float = Field(default=0.02, gt=0.0)
  enable_vts: bool = False

  def mup_learning_rate_scales(self) -> dict[str, float]:
    if not self.is_mup:
      return {}
    w, f = self.width_multiplier, self.filter_multiplier
    return {
      "encoder_attention": 1 / w,
      "encoder_input_ffn": 1 / w,
      "pooler": 1 / w,
      "encoder_output_ffn": 1 / f,
    }


class BertLayer(nnx.Module):
  """Post-LN block. x float32[batch, seq, hidden], mask bool[batch, seq, seq] -> same shape as x."""

  def __init__(self, c: BertConfig, *, rngs: nnx.Rngs):
    d, init = c.hidden_size, truncated_normal(c.initializer_range)
    attention_dropout = c.dropout_rate if c.attention_dropout_rate is None else c.attention_dropout_rate
    self.attention = MultiHeadAttention(
      d,
      c.num_heads,
      dropout_rate=attention_dropout,
      kernel_init=init,
      score_scale=c.attention_scale(d // c.num_heads),
      rngs=rngs,
    )
    self.attention_norm = nnx.LayerNorm(d, epsilon=c.layer_norm_epsilon, rngs=rngs)
    self.ffn_in = nnx.Linear(d, c.filter_size, kernel_init=init, rngs=rngs)
    self.ffn_out = nnx.Linear(c.filter_size, d, kernel_init=init, rngs=rngs)
    self.ffn_norm = nnx.LayerNorm(d, epsilon=c.layer_norm_epsilon, rngs=rngs)
    self.dropout = nnx.Dropout(c.dropout_rate, rngs=rngs)
    self.nonlinearity = c.encoder_nonlinearity

  def __call__(self, x: jax.Array, mask: jax.Array | None) -> jax.Array:
    with jax.named_scope("attention"):  # kernel names for the wafer cost model
      x = self.attention_norm(x + self.dropout(self.attention(x, mask)))
    with jax.named_scope("ffn"):
      ffn = self.ffn_out(activation(self.nonlinearity)(self.ffn_in(x)))
      return self.ffn_norm(x + self.dropout(ffn))


class BertForPreTraining(nnx.Module):
  """BERT with MLM and NSP heads; see the module docstring for shapes."""

  def __init__(self, c: BertConfig, *, rngs: nnx.Rngs):
    d, init = c.hidden_size, truncated_normal(c.initializer_range)
    self.word_embeddings = nnx.Embed(c.vocab_size, d, embedding_init=init, rngs=rngs)
    rows = c.max_position_embeddings + (1 if c.mask_padding_in_positional_embed else 0)
    self.position_embeddings = nnx.Embed(rows, d, embedding_init=init, rngs=rngs)
    self.mask_padding = c.mask_padding_in_positional_embed
    self.token_type_embeddings = (
      nnx.Embed(c.num_segments, d, embedding_init=init, rngs=rngs) if c.num_segments else None
    )
    self.embedding_norm = nnx.LayerNorm(d, epsilon=c.layer_norm_epsilon, rngs=rngs)
    self.embedding_dropout = nnx.Dropout(c.dropout_rate, rngs=rngs)
    self.layers = nnx.List([BertLayer(c, rngs=rngs) for _ in range(c.num_hidden_layers)])
    # MLM head
    self.mlm_dense = nnx.Linear(d, d, kernel_init=init, rngs=rngs)
    self.mlm_norm = nnx.LayerNorm(d, epsilon=c.layer_norm_epsilon, rngs=rngs)
    self.mlm_decoder = (
      None
      if c.share_embedding_weights
      else nnx.Linear(d, c.vocab_size, use_bias=False, kernel_init=init, rngs=rngs)
    )
    self.mlm_bias = nnx.Param(jnp.zeros((c.vocab_size,), jnp.float32))
    # NSP head
    self.pooler = None if c.disable_nsp else nnx.Linear(d, d, kernel_init=init, rngs=rngs)
    self.nsp_classifier = None if c.disable_nsp else nnx.Linear(d, 2, kernel_init=init, rngs=rngs)
    self.encoder_nonlinearity = c.encoder_nonlinearity
    self.scan_layers = c.scan_layers
    self.pooler_nonlinearity = c.pooler_nonlinearity or "tanh"
    self.embeddings_scale = c.embeddings_scale
    self.logits_scale = c.output_logits_multiplier()

  def encode(
    self,
    input_ids: jax.Array,
    token_type_ids: jax.Array | None = None,
    attention_mask: jax.Array | None = None,
  ) -> jax.Array:
    """int32[batch, seq] inputs -> hidden states float32[batch, seq, hidden]."""
    with jax.named_scope("embeddings"):
      if self.mask_padding:  # tokens at rows 1..seq, padding (id 0, [PAD]) at row 0
        seq, most = input_ids.shape[1], self.position_embeddings.num_embeddings - 1
        if seq > most:
          raise ValueError(
            f"input_ids has {seq} tokens per sequence, more than model.max_position_embeddings={most}: "
            "raise max_position_embeddings or shorten the sequences"
          )
        positions = jnp.where(input_ids != 0, jnp.arange(1, seq + 1, dtype=jnp.int32), 0)
        position_embeddings = self.position_embeddings(positions)
      else:
        position_embeddings = self.position_embeddings(position_ids(input_ids, self.position_embeddings))[
          None
        ]
      x = self.word_embeddings(input_ids) + position_embeddings
      if self.token_type_embeddings is not None:
        if token_type_ids is None:
          token_type_ids = jnp.zeros_like(input_ids)
        x = x + self.token_type_embeddings(token_type_ids)
      if self.embeddings_scale != 1.0:  # muP: before the LayerNorm, as modelzoo's BERT
        x = x * jnp.float32(self.embeddings_scale)
      x = self.embedding_dropout(self.embedding_norm(x))
    mask = None
    if attention_mask is not None:
      keep = attention_mask.astype(jnp.bool_)
      mask = jnp.broadcast_to(keep[:, None, :], (keep.shape[0], keep.shape[1], keep.shape[1]))
    x = run_layers(self.layers, x, mask, scope="encoder", scan=self.scan_layers)
    return x

  def mlm_logits(self, hidden: jax.Array) -> jax.Array:
    """float32[..., hidden] -> float32[..., vocab] (decoder tied to the word embeddings)."""
    with jax.named_scope("mlm_head"):
      return self._mlm_logits(hidden)

  def _mlm_logits(self, hidden: jax.Array) -> jax.Array:
    h = self.mlm_norm(activation(self.encoder_nonlinearity)(self.mlm_dense(hidden)))
    logits = self.word_embeddings.attend(h) if self.mlm_decoder is None else self.mlm_decoder(h)
    bias = self.mlm_bias[...]
    logits = logits + bias.reshape((1,) * (logits.ndim - 1) + bias.shape)
    return logits if self.logits_scale is None else logits * jnp.float32(self.logits_scale)  # muP

  def __call__(
    self,
    input_ids: jax.Array,
    token_type_ids: jax.Array | None = None,
    attention_mask: jax.Array | None = None,
    masked_lm_positions: jax.Array | None = None,
  ) -> tuple[jax.Array, jax.Array | None]:
    """Returns (mlm_logits float32[batch, P, vocab], nsp_logits float32[batch, 2] or None)."""
    hidden = self.encode(input_ids, token_type_ids, attention_mask)
    nsp = None
    if self.pooler is not None and self.nsp_classifier is not None:
      with jax.named_scope("nsp_head"):
        pooled = activation(self.pooler_nonlinearity)(self.pooler(hidden[:, 0]))
        nsp = self.nsp_classifier(pooled)
        if self.logits_scale is not None:  # muP
          nsp = nsp * jnp.float32(self.logits_scale)
    if masked_lm_positions is not None:
      hidden = jnp.take_along_axis(hidden, masked_lm_positions.astype(jnp.int32)[..., None], axis=1)
    return self.mlm_logits(hidden), nsp


def bert_loss(
  model: BertForPreTraining,
  batch: dict[str, jax.Array],
  *,
  mlm_loss_weight: float = 1.0,
  mlm_loss_scaling: str = "num_masked",
) -> jax.Array:
  """MLM + NSP pre-training loss (float32 scalar).

  ``batch`` (modelzoo's BERT features): ``input_ids``, ``token_type_ids``, ``attention_mask``
  int32[b, s]; ``labels`` int32[b, P] and ``masked_lm_mask`` (weights, 1 = predicted) [b, P],
  with ``masked_lm_positions`` int32[b, P] (P = max_predictions_per_seq) or without it (P = s,
  labels per position); ``next_sentence_label`` int32[b] (ignored when NSP is disabled).

  MLM: ``sum(CE * weights)``, divided by the number of masked tokens (``num_masked``), or by the
  batch size and multiplied by ``mlm_loss_weight`` (``batch_size``, modelzoo's default, where
  ``mlm_loss_weight`` ~ 1 / masked tokens per sequence). NSP: mean cross-entropy.
  """
  mlm_logits, nsp_logits = model(
    batch["input_ids"],
    batch.get("token_type_ids"),
    batch.get("attention_mask"),
    batch.get("masked_lm_positions"),
  )
  weights = batch["masked_lm_mask"].astype(jnp.float32)
  mlm_sum = jnp.sum(cross_entropy(mlm_logits, batch["labels"]) * weights)
  if mlm_loss_scaling == "num_masked":
    mlm = mlm_sum / jnp.maximum(jnp.sum(weights), jnp.float32(1.0))
  elif mlm_loss_scaling == "batch_size":
    mlm = mlm_sum * jnp.float32(mlm_loss_weight / batch["input_ids"].shape[0])
  else:
    raise ValueError(f"mlm_loss_scaling must be 'num_masked' or 'batch_size', not {mlm_loss_scaling!r}")
  if nsp_logits is None:
    return mlm
  return mlm + jnp.mean(cross_entropy(nsp_logits, batch["next_sentence_label"]))


def random_batch(
  key: jax.Array, batch_size: int, seq_len: int, vocab_size: int, max_predictions: int
) -> dict[str, jax.Array]:
  """A synthetic batch in the shape of modelzoo's BERT features (for tests and smoke runs)."""
  k1, k2, k3, k4 = jax.random.split(key, 4)
  input_ids = jax.random.randint(k1, (batch_size, seq_len), 0, vocab_size, jnp.int32)
  positions = jnp.sort(jax.random.permutation(k2, jnp.arange(seq_len, dtype=jnp.int32))[:max_predictions])
  positions = jnp.broadcast_to(positions[None], (batch_size, max_predictions))
  return {
    "input_ids": input_ids,
    "token_type_ids": jnp.broadcast_to(
      (jnp.arange(seq_len, dtype=jnp.int32) >= seq_len // 2).astype(jnp.int32)[None], (batch_size, seq_len)
    ),
    "attention_mask": jnp.ones((batch_size, seq_len), jnp.int32),
    "masked_lm_positions": positions,
    "labels": jax.random.randint(k3, (batch_size, max_predictions), 0, vocab_size, jnp.int32),
    "masked_lm_mask": jnp.ones((batch_size, max_predictions), jnp.float32),
    "next_sentence_label": jax.random.randint(k4, (batch_size,), 0, 2, jnp.int32),
  }
