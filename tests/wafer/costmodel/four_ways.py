"""One pre-norm transformer LM written the ways users write a stack of layers (issue 25, item 3).

``WAYS[name](cfg, batch) -> (step, params, tokens)``: a Flax linen Python loop over blocks, plain JAX
``lax.scan`` over stacked block parameters, plain JAX over a list of per-block parameter trees (a
Python loop under shared scope names, or stacked inside the step and scanned), Flax linen
``nn.scan``, Flax NNX with a Python loop over an ``nnx.List`` of blocks, and Flax NNX with
``nnx.vmap``-made stacked blocks run by ``nnx.scan``.
Every way computes the same function with the same parameters (attention written out, the same
LayerNorm, GELU MLP and SGD step); only the arguments' abstract shapes are built, nothing is
allocated, so GPT-J-sized networks cost no memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from tests.wafer.costmodel.helpers import Net, sgd_step

GPTJ = Net(layers=28, d=4096, heads=16, ffn=16384, vocab=50400, seq=2048)
TINY = Net(layers=4, d=64, heads=4, ffn=256, vocab=300, seq=32)


def _attend(net: Net, qkv: jax.Array) -> jax.Array:
  """Causal multi-head attention of a fused ``qkv[b, s, 3d]`` -> ``[b, s, d]``."""
  b, s, _ = qkv.shape
  dh = net.d // net.heads
  q, k, v = (t.reshape(b, s, net.heads, dh) for t in jnp.split(qkv, 3, axis=-1))
  scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(dh)
  mask = jnp.tril(jnp.ones((s, s), jnp.bool_))
  probs = jax.nn.softmax(jnp.where(mask[None, None], scores, -1e9), axis=-1)
  return jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, net.d)


def _xent(logits: jax.Array, tokens: jax.Array) -> jax.Array:
  logp = jax.nn.log_softmax(logits, axis=-1)
  return -jnp.mean(jnp.take_along_axis(logp, tokens[..., None], axis=-1))


def _tokens(net: Net, batch: int) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct((batch, net.seq), jnp.int32)


def _linen_block(net: Net) -> Any:
  import flax.linen as nn

  class Block(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array, _: Any = None) -> Any:
      x = x + nn.Dense(net.d)(_attend(net, nn.Dense(3 * net.d)(nn.LayerNorm()(x))))
      x = x + nn.Dense(net.d)(nn.gelu(nn.Dense(net.ffn)(nn.LayerNorm()(x))))
      return x

  return Block


def _linen(net: Net, batch: int, scan: bool) -> tuple[Callable[..., Any], Any, Any]:
  import flax.linen as nn

  block = _linen_block(net)

  class Scanned(nn.Module):  # nn.scan wants (carry, x) -> (carry, y)
    @nn.compact
    def __call__(self, x: jax.Array, _: Any) -> tuple[jax.Array, None]:
      return block()(x), None

  class LM(nn.Module):
    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
      x = nn.Embed(net.vocab, net.d)(tokens)
      if scan:
        stack = nn.scan(Scanned, variable_axes={"params": 0}, split_rngs={"params": True}, length=net.layers)
        x, _ = stack()(x, None)
      else:
        for _ in range(net.layers):
          x = block()(x)
      return nn.Dense(net.vocab)(nn.LayerNorm()(x))

  model = LM()
  tokens = _tokens(net, batch)
  params = jax.eval_shape(model.init, jax.random.key(0), tokens)
  return sgd_step(lambda p, t: _xent(model.apply(p, t), t), lr=0.01), params, tokens


def linen_loop(net: Net, batch: int) -> tuple[Callable[..., Any], Any, Any]:
  """Flax linen, a Python loop over ``net.layers`` blocks (one parameter tree per block)."""
  return _linen(net, batch, scan=False)


def linen_scan(net: Net, batch: int) -> tuple[Callable[..., Any], Any, Any]:
  """Flax linen, ``nn.scan`` over the blocks (stacked parameters)."""
  return _linen(net, batch, scan=True)


def jax_scan(net: Net, batch: int) -> tuple[Callable[..., Any], Any, Any]:
  """Plain JAX: ``lax.scan`` over stacked block parameters, the block applied as a pure function."""
  import flax.linen as nn

  block = _linen_block(net)()
  x0 = jax.ShapeDtypeStruct((batch, net.seq, net.d), jnp.float32)
  one = jax.eval_shape(block.init, jax.random.key(0), x0)["params"]
  params = {
    "embed": jax.ShapeDtypeStruct((net.vocab, net.d), jnp.float32),
    "blocks": jax.tree.map(lambda a: jax.ShapeDtypeStruct((net.layers, *a.shape), a.dtype), one),
    "ln_f": jax.eval_shape(nn.LayerNorm().init, jax.random.key(0), x0)["params"],
    "head": {"kernel": jax.ShapeDtypeStruct((net.d, net.vocab), jnp.float32),
             "bias": jax.ShapeDtypeStruct((net.vocab,), jnp.float32)},
  }  # fmt: skip

  def loss(p: Any, tokens: jax.Array) -> jax.Array:
    x = jnp.take(p["embed"], tokens, axis=0)
    x, _ = jax.lax.scan(lambda c, bp: (block.apply({"params": bp}, c), None), x, p["blocks"])
    x = nn.LayerNorm().apply({"params": p["ln_f"]}, x)
    return _xent(x @ p["head"]["kernel"] + p["head"]["bias"][None, None], tokens)

  return sgd_step(loss, lr=0.01), params, _tokens(net, batch)


def _per_layer(net: Net, batch: int, stack: bool) -> tuple[Callable[..., Any], Any, Any]:
  """`jax_scan`'s network with one parameter tree per block (a list), run as a Python loop (every
  block under the same names, ``Block/Dense_0``...) or stacked inside the step and scanned."""
  import flax.linen as nn

  block = _linen_block(net)()
  _, stacked, tokens = jax_scan(net, batch)
  one = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), stacked["blocks"])
  params = {**stacked, "blocks": [one] * net.layers}

  def loss(p: Any, tokens: jax.Array) -> jax.Array:
    x = jnp.take(p["embed"], tokens, axis=0)
    if stack:  # as models/common.py's run_layers: the layers' trees stacked inside the step
      blocks = jax.tree.map(lambda *leaves: jnp.stack(leaves), *p["blocks"])
      x, _ = jax.lax.scan(lambda c, bp: (block.apply({"params": bp}, c), None), x, blocks)
    else:
      for bp in p["blocks"]:
        x = block.apply({"params": bp}, x)
    x = nn.LayerNorm().apply({"params": p["ln_f"]}, x)
    return _xent(x @ p["head"]["kernel"] + p["head"]["bias"][None, None], tokens)

  return sgd_step(loss, lr=0.01), params, tokens


def jax_loop(net: Net, batch: int) -> tuple[Callable[..., Any], Any, Any]:
  """Plain JAX: a Python loop over a list of per-block parameter trees; every block runs under the
  same scope names (``Block``, ``Block/Dense_0``...)."""
  return _per_layer(net, batch, stack=False)


def jax_stack_scan(net: Net, batch: int) -> tuple[Callable[..., Any], Any, Any]:
  """Plain JAX: a list of per-block parameter trees stacked inside the step (``jnp.stack``), then
  ``lax.scan`` over them."""
  return _per_layer(net, batch, stack=True)


def _nnx_block(net: Net) -> Any:
  from flax import nnx

  class Block(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
      self.ln1, self.ln2 = nnx.LayerNorm(net.d, rngs=rngs), nnx.LayerNorm(net.d, rngs=rngs)
      self.qkv, self.out = nnx.Linear(net.d, 3 * net.d, rngs=rngs), nnx.Linear(net.d, net.d, rngs=rngs)
      self.up, self.down = nnx.Linear(net.d, net.ffn, rngs=rngs), nnx.Linear(net.ffn, net.d, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
      x = x + self.out(_attend(net, self.qkv(self.ln1(x))))
      return x + self.down(nnx.gelu(self.up(self.ln2(x))))

  return Block


def _nnx(net: Net, batch: int, scan: bool) -> tuple[Callable[..., Any], Any, Any]:
  from flax import nnx

  block = _nnx_block(net)

  class LM(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
      self.embed = nnx.Embed(net.vocab, net.d, rngs=rngs)
      if scan:

        @nnx.split_rngs(splits=net.layers)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def make(r: nnx.Rngs) -> Any:
          return block(r)

        self.blocks = make(rngs)
      else:
        self.blocks = nnx.List([block(rngs) for _ in range(net.layers)])
      self.ln_f, self.head = nnx.LayerNorm(net.d, rngs=rngs), nnx.Linear(net.d, net.vocab, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
      x = self.embed(tokens)
      if scan:

        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        def run(c: jax.Array, b: Any) -> jax.Array:
          return b(c)

        x = run(x, self.blocks)
      else:
        for b in self.blocks:
          x = b(x)
      return self.head(self.ln_f(x))

  graphdef, state = nnx.split(nnx.eval_shape(lambda: LM(nnx.Rngs(0))))
  return sgd_step(lambda s, t: _xent(nnx.merge(graphdef, s)(t), t), lr=0.01), state, _tokens(net, batch)


def nnx_loop(net: Net, batch: int) -> tuple[Callable[..., Any], Any, Any]:
  """Flax NNX, a Python loop over an ``nnx.List`` of blocks."""
  return _nnx(net, batch, scan=False)


def nnx_scan(net: Net, batch: int) -> tuple[Callable[..., Any], Any, Any]:
  """Flax NNX, blocks made by ``nnx.vmap`` (stacked state) and run by ``nnx.scan``."""
  return _nnx(net, batch, scan=True)


WAYS: dict[str, Callable[[Net, int], tuple[Callable[..., Any], Any, Any]]] = {
  "linen_loop": linen_loop,
  "jax_scan": jax_scan,
  "jax_loop": jax_loop,
  "jax_stack_scan": jax_stack_scan,
  "linen_scan": linen_scan,
  "nnx_loop": nnx_loop,
  "nnx_scan": nnx_scan,
}
