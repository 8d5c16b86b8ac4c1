"""Pieces shared by the reference models: attention, activations, initializers, counting.

Every function is plain float32 JAX with no casts: mixed precision comes from
`precision.autocast`, which classifies ops by data flow. In particular the softmax here is an
``attention_softmax`` op for the policy (it follows a batched ``dot_general``), so modelzoo's
``model.attention_softmax_fp32`` acts through ``Params.policy()`` (the ``attention_softmax``
rule: "float32" or "round"), never through a cast in model code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from pydantic import ValidationInfo, field_validator

from wafer.config import ModelConfig

ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
  "relu": jax.nn.relu,
  "gelu": lambda x: jax.nn.gelu(x, approximate=False),
  "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
  "tanh": jnp.tanh,
  "sigmoid": jax.nn.sigmoid,
  "silu": jax.nn.silu,
  "swish": jax.nn.silu,
  "leaky_relu": jax.nn.leaky_relu,
}


def activation(name: str) -> Callable[[jax.Array], jax.Array]:
  """The activation function called ``name`` (modelzoo spelling, case-insensitive)."""
  try:
    return ACTIVATIONS[name.lower()]
  except KeyError:
    raise ValueError(f"unknown activation {name!r}; known: {', '.join(sorted(ACTIVATIONS))}") from None


def truncated_normal(std: float) -> Any:
  """Truncated normal at ±2 std (modelzoo's ``truncated_normal`` with ``a=-2std, b=2std``)."""
  return nnx.initializers.truncated_normal(stddev=std, lower=-2.0, upper=2.0)


def dot_product_attention(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  mask: jax.Array | None,
  dropout: nnx.Dropout | None = None,
  scale: float | None = None,
) -> jax.Array:
  """Scaled dot-product attention.

  Args:
    q, k, v: float32[batch, seq, heads, head_dim].
    mask: bool[batch, seq_q, seq_k] (True = attend) or None.
    dropout: applied to the attention probabilities, when given.
    scale: the factor on ``q.k`` (muP's ``alpha / head_dim``, `models.mup`); None: ``1 / sqrt(head_dim)``.

  Returns:
    float32[batch, seq, heads, head_dim].
  """
  head_dim = q.shape[-1]
  scores = jnp.einsum("bqhd,bkhd->bhqk", q, k)
  scores = scores / jnp.sqrt(jnp.float32(head_dim)) if scale is None else scores * jnp.float32(scale)
  if mask is not None:
    scores = jnp.where(mask[:, None, :, :], scores, jnp.float32(-1e4))
  probs = jax.nn.softmax(scores, axis=-1)
  if dropout is not None:
    probs = dropout(probs)
  return jnp.einsum("bhqk,bkhd->bqhd", probs, v)


def position_ids(input_ids: jax.Array, table: nnx.Embed) -> jax.Array:
  """``int32[seq]`` positions of ``input_ids[batch, seq]``, or a ValueError when the sequence is
  longer than the position table (its lookup would read past the table: NaN under jit)."""
  seq = input_ids.shape[1]
  if seq > table.num_embeddings:
    raise ValueError(
      f"input_ids has {seq} tokens per sequence, more than model.max_position_embeddings="
      f"{table.num_embeddings}: raise max_position_embeddings or shorten the sequences"
    )
  return jnp.arange(seq, dtype=jnp.int32)


def check_heads(hidden_size: int, num_heads: int) -> None:
  """Raise ``ValueError`` unless ``num_heads`` divides ``hidden_size`` (each head gets ``hidden_size / num_heads``
  features); the message lists the head counts that fit. Model configs check it at load time.

  >>> check_heads(128, 3)
  Traceback (most recent call last):
  ...
  ValueError: num_heads=3 does not divide hidden_size=128 (each head gets hidden_size / num_heads features); num_heads that fit: 1, 2, 4, 8, 16, 32, 64, 128
  """
  if hidden_size % num_heads:
    fit = [n for n in range(1, hidden_size + 1) if hidden_size % n == 0]
    shown = ", ".join(map(str, fit[:12])) + (", ..." if len(fit) > 12 else "")
    raise ValueError(
      f"num_heads={num_heads} does not divide hidden_size={hidden_size} (each head gets hidden_size / "
      f"num_heads features); num_heads that fit: {shown}"
    )


class AttentionConfig(ModelConfig):
  """A model config with ``hidden_size`` and ``num_heads``: `check_heads` runs when it loads.

  ``scan_layers`` (wafer's key, not modelzoo's): run the identical layers as one ``jax.lax.scan``
  (True, the default) or as a Python loop (False); the parameters and the values are the same
  either way (`run_layers`).
  """

  scan_layers: bool = True

  @field_validator("num_heads", mode="after", check_fields=False)
  @classmethod
  def _heads_divide_hidden(cls, num_heads: int, info: ValidationInfo) -> int:
    if "hidden_size" in info.data:  # else hidden_size has its own error
      check_heads(info.data["hidden_size"], num_heads)
    return num_heads


class MultiHeadAttention(nnx.Module):
  """Self-attention with separate q, k, v projections and an output projection.

  ``use_bias`` is the q/k/v projections' bias; ``use_output_bias`` the output projection's
  (defaults to ``use_bias``); ``score_scale`` the factor on ``q.k`` (`dot_product_attention`).

  Shapes: x float32[batch, seq, hidden], mask bool[batch, seq, seq] -> float32[batch, seq, hidden].
  """

  def __init__(
    self,
    hidden_size: int,
    num_heads: int,
    *,
    dropout_rate: float,
    use_bias: bool = True,
    use_output_bias: bool | None = None,
    kernel_init: Any,
    output_init: Any | None = None,
    score_scale: float | None = None,
    rngs: nnx.Rngs,
  ):
    check_heads(hidden_size, num_heads)
    self.num_heads = num_heads
    self.score_scale = score_scale
    bias_init = nnx.initializers.zeros_init()
    dense = {"use_bias": use_bias, "kernel_init": kernel_init, "bias_init": bias_init, "rngs": rngs}
    self.query = nnx.Linear(hidden_size, hidden_size, **dense)
    self.key = nnx.Linear(hidden_size, hidden_size, **dense)
    self.value = nnx.Linear(hidden_size, hidden_size, **dense)
    self.output = nnx.Linear(
      hidden_size,
      hidden_size,
      use_bias=use_bias if use_output_bias is None else use_output_bias,
      kernel_init=output_init or kernel_init,
      bias_init=bias_init,
      rngs=rngs,
    )
    self.dropout = nnx.Dropout(dropout_rate, rngs=rngs)

  def __call__(self, x: jax.Array, mask: jax.Array | None) -> jax.Array:
    b, s, d = x.shape
    h = self.num_heads
    q, k, v = (proj(x).reshape(b, s, h, d // h) for proj in (self.query, self.key, self.value))
    context = dot_product_attention(q, k, v, mask, self.dropout, self.score_scale).reshape(b, s, d)
    return self.output(context)


def run_layers(layers: nnx.List, x: jax.Array, *args: Any, scope: str, scan: bool = True) -> jax.Array:
  """``layers[n-1](... layers[0](x, *args) ..., *args)``: a stack of identical layers.

  ``scan=True`` runs them as one ``jax.lax.scan`` over their state stacked on a leading axis
  (``jnp.stack`` inside the function: the model keeps one module, and one parameter tree entry,
  per layer, so checkpoints, optimizers with per-tensor norms (LAMB) and ``model.layers[i]`` are
  the same either way). A scan is traced and transformed (``autocast``, ``grad``) once, not once
  per layer: validating a 48-layer GPT-2 XL step takes seconds instead of tens of seconds. It is
  lowered unrolled (``unroll=True``), so XLA compiles the loop's program: the stacking and
  unstacking slices fold away, and the compiled step has the loop's memory and speed
  (``benchmarks/scan_layers.py``; a rolled ``while`` loop kept the stacked copies: 4x the
  temporaries and 1.4x the step time of a small GPT-2 on CPU). ``scan=False`` unrolls a Python
  loop. Each layer runs under the name scope ``{scope}/layer_{i}``
  (unrolled) or ``{scope}/layer`` (scanned: `precision.numerics_report` then sums the layers'
  iterations into one row per equation, and the cost model names the kernels
  ``{scope}/layer/attention``). The values are the same; the bits may differ where XLA fuses the
  unrolled layers differently.

  What a layer changes in its own state (the counts of its dropout RNG streams, a running statistic) is
  written back to each layer, as the loop does. The loop runs instead of the scan where the layers
  are not copies of one structure: different module structure or parameter shapes, or a module or
  variable shared between layers (the same layer applied twice must draw new dropout masks).

  Args:
    layers: the layers, each called as ``layer(x, *args) -> x`` (same shape and dtype as ``x``).
    x: the input of the first layer.
    *args: passed to every layer unchanged (a mask).
    scope: the name scope of the stack (``"decoder"``).
    scan: scan (True) or unroll (False).
  """
  split = _stackable(layers) if scan and len(layers) > 1 else None
  if split is None:
    for i, layer in enumerate(layers):
      with jax.named_scope(f"{scope}/layer_{i}"):
        x = layer(x, *args)
    return x
  graphdef, states = split
  stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *states)

  def body(h: jax.Array, state: Any) -> tuple[jax.Array, Any]:
    with jax.named_scope(f"{scope}/layer"):  # inside the body: its equations carry the name
      layer = nnx.merge(graphdef, state)
      before = {
        path: jax.tree.leaves(v) for path, v in nnx.to_flat_state(nnx.state(layer, nnx.Not(nnx.Param)))
      }
      h = layer(h, *args)
      # only what the layer changed or added: writing an unchanged variable back would still be
      # a mutation, which NNX refuses across trace levels
      changed = [
        (path, v)
        for path, v in nnx.to_flat_state(nnx.state(layer, nnx.Not(nnx.Param)))
        if path not in before or any(a is not b for a, b in zip(jax.tree.leaves(v), before[path]))
      ]
      return h, nnx.from_flat_state(changed)

  x, changed = jax.lax.scan(body, x, stacked, unroll=True)
  if jax.tree.leaves(changed):
    for i, layer in enumerate(layers):
      nnx.update(layer, jax.tree.map(lambda leaf, i=i: leaf[i], changed))
  return x


def _stackable(layers: nnx.List) -> tuple[Any, list[Any]] | None:
  """``(graphdef, states)`` of layers that are copies of one structure with their own state, or None."""
  nodes = [
    id(node)
    for layer in layers
    for _, node in nnx.iter_graph(layer)
    if nnx.graph.is_graph_node(node) or isinstance(node, nnx.Variable)  # (not interned Python leaves)
  ]
  if len(nodes) != len(set(nodes)):  # a layer, module or variable shared between layers
    return None
  graphdefs, states = zip(*(nnx.split(layer) for layer in layers))
  if any(g != graphdefs[0] for g in graphdefs[1:]):
    return None
  shapes = [jax.tree.map(lambda a: (jnp.shape(a), jnp.result_type(a)), s) for s in states]
  if any(s != shapes[0] for s in shapes[1:]):
    return None
  return graphdefs[0], list(states)


def parameter_count(model: nnx.Module) -> int:
  """Number of scalars in the model's ``nnx.Param`` leaves (works on `nnx.eval_shape` models)."""
  return sum(int(x.size) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def abstract_parameter_count(build: Callable[[], nnx.Module]) -> int:
  """Parameter count of ``build()`` without materialising it (abstract shapes only)."""
  return parameter_count(nnx.eval_shape(build))


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Per-position softmax cross-entropy: logits float32[..., vocab], labels int32[...] -> float32[...]."""
  log_probs = jax.nn.log_softmax(logits, axis=-1)
  picked = jnp.take_along_axis(log_probs, labels[..., None].astype(jnp.int32), axis=-1)
  return -picked[..., 0]
