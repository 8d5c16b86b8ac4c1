"""Random JAX programs for testing `precision.autocast` by invariants (a hypothesis strategy).

A program is a short list of *steps* drawn from `STEPS`. Each step maps the activation ``h``
(float32, ``S x D``) to a new one of the same shape, written the way other people's JAX code
is written: elementwise and transcendental ops, ``dot_general`` / ``einsum`` with batch
dimensions, convolutions, reductions, cumulative ops, data movement (gather, scatter-add,
dynamic slices, padding), sorting, ``custom_jvp`` activations, ``checkpoint``, ``cond`` /
``switch``, ``scan`` / ``fori_loop`` / ``while_loop``, nested ``jit``, ``custom_vjp``,
``jax.random`` draws (dropout, noise), integer and bool intermediates, float16/bfloat16 inputs
mixed in, Python scalars, 0-d and size-0 arrays. Besides ``h`` the program returns values that autocast must not change:
an integer result and a 16-bit float result computed without any float32 value, and
others that it may change (an ``argmax``, a 0-d float32 sum).

Steps whose result can jump under a small change of their input (comparisons, ``argmax``,
``sort`` order, ``log`` of a value near 0) are listed in `DISCONTINUOUS`: a program with one
of them is checked for everything except closeness to float32.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st
from jax import lax

import precision

S, D = 4, 8
F32 = jnp.float32


def _args(seed: int, low: str) -> dict:
  """The program's inputs: float32 activations and weights, a 16-bit input, a 0-d weight,
  integer indices, a 0-d index, and a size-0 array."""
  rng = np.random.default_rng(seed)

  def normal(*shape: int, scale: float = 1.0) -> jax.Array:
    return jnp.asarray((rng.standard_normal(shape) * scale).astype(np.float32))

  return {
    "x": normal(S, D),
    "w": normal(D, D, scale=D**-0.5),
    "wb": normal(2, D, D, scale=D**-0.5),
    "k": normal(3, D, D, scale=(3 * D) ** -0.5),
    "s": normal(scale=0.8),
    "lo": normal(S, D).astype(low),
    "idx": jnp.asarray(rng.integers(0, D, (S,)).astype(np.int32)),
    "perm": jnp.asarray(rng.permutation(D).astype(np.int32)),
    "i0": jnp.asarray(np.int32(rng.integers(0, S))),
    "e": jnp.zeros((0, D), F32),
  }


@jax.custom_vjp
def _clip_grad_tanh(x: jax.Array) -> jax.Array:
  return jnp.tanh(x) * 1.5


def _clip_fwd(x: jax.Array) -> tuple[jax.Array, jax.Array]:
  return _clip_grad_tanh(x), x


def _clip_bwd(x: jax.Array, g: jax.Array) -> tuple[jax.Array]:
  return (jnp.clip(g * 1.5 * (1 - jnp.tanh(x) ** 2), -1.0, 1.0),)


_clip_grad_tanh.defvjp(_clip_fwd, _clip_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _scaled_tanh(c: float, x: jax.Array) -> jax.Array:
  return jnp.tanh(x) * c


def _scaled_fwd(c: float, x: jax.Array) -> tuple[jax.Array, jax.Array]:
  return _scaled_tanh(c, x), x


def _scaled_bwd(c: float, x: jax.Array, g: jax.Array) -> tuple[jax.Array]:
  return (g * c * (1 - jnp.tanh(x) ** 2),)


_scaled_tanh.defvjp(_scaled_fwd, _scaled_bwd)


@jax.custom_jvp
def _softsign(x: jax.Array) -> jax.Array:
  return x / (1 + jnp.abs(x))


@_softsign.defjvp
def _softsign_jvp(primals: tuple, tangents: tuple) -> tuple:
  (x,), (t,) = primals, tangents
  return _softsign(x), t / (1 + jnp.abs(x)) ** 2


@functools.partial(jax.jit, donate_argnums=0)
def _donating(v: jax.Array, w: jax.Array) -> jax.Array:
  return jnp.tanh(v @ w)


def _conv(h: jax.Array, k: jax.Array, **kw) -> jax.Array:
  spec = ("NWC", "WIO", "NWC")
  return lax.conv_general_dilated(h[None], k, (1,), "SAME", dimension_numbers=spec, **kw)[0]


def _key(a: dict, salt: int) -> jax.Array:
  """A PRNG key of the program's integer input (traced): a draw inside the function."""
  return jax.random.fold_in(jax.random.key(salt), a["i0"])


def _low_mix(h: jax.Array, a: dict) -> jax.Array:
  lo = a["lo"]
  return (h.astype(lo.dtype) * lo).astype(F32) + h


STEPS: dict = {
  # elementwise and transcendental
  "tanh": lambda h, a: jnp.tanh(h),
  "gauss": lambda h, a: jnp.exp(-h * h),
  "log1p_sq": lambda h, a: jnp.log(1 + h * h),
  "sqrt": lambda h, a: jnp.sqrt(h * h + 1),
  "rsqrt": lambda h, a: lax.rsqrt(h * h + 0.5),
  "logistic": lambda h, a: jax.nn.sigmoid(h * 2),
  "erf": lambda h, a: lax.erf(h),
  "integer_pow": lambda h, a: lax.integer_pow(jnp.tanh(h), 3) + h,
  "affine": lambda h, a: h * 1.1 + 2,  # Python scalars: weak-typed constants
  "scalar_weight": lambda h, a: h * a["s"],  # a 0-d argument
  "clamp": lambda h, a: lax.clamp(F32(-1.5), h * 1.3, F32(1.5)),
  "clip": lambda h, a: jnp.clip(h, -1.0, 1.0) * 1.3,
  "max_min": lambda h, a: jnp.maximum(h, a["s"]) + jnp.minimum(h * 0.7, 0.5),
  "where": lambda h, a: jnp.where(h > 0.1, h, 0.3 * h),
  "select_n": lambda h, a: lax.select_n((a["idx"] % 2 == 0)[:, None] & (h > 0), h * 0.5, h * 1.5),
  # matrix products
  "matmul": lambda h, a: h @ a["w"],
  "einsum_batch": lambda h, a: jnp.einsum("bsd,bde->bse", h.reshape(2, -1, h.shape[-1]), a["wb"]).reshape(
    h.shape
  ),
  "dot_general_batch": lambda h, a: lax.dot_general(
    h.reshape(2, -1, h.shape[-1]), a["wb"], (((2,), (1,)), ((0,), (0,)))
  ).reshape(h.shape),
  "bilinear": lambda h, a: h * jnp.einsum("sd,de,se->s", h, a["w"], h)[:, None] * 0.1,
  "conv": lambda h, a: _conv(h, a["k"]),
  "conv_grouped_dilated": lambda h, a: _conv(
    h, a["k"][:, : D // 2], rhs_dilation=(2,), feature_group_count=2
  ),
  "empty_contraction": lambda h, a: h + h @ (a["e"].T @ a["e"]) + jnp.sum(a["e"]),
  # reductions and cumulative ops
  "sum": lambda h, a: h / (1 + jnp.sum(jnp.abs(h), -1, keepdims=True)),
  "max_sub": lambda h, a: h - jnp.max(h, -1, keepdims=True),
  "mean": lambda h, a: h + jnp.mean(h, 0, keepdims=True),
  "argmax": lambda h, a: h * (jnp.argmax(h, -1)[:, None] + 1).astype(F32),
  "cumsum": lambda h, a: jnp.cumsum(h, -1) * 0.3,
  "cumprod": lambda h, a: jnp.cumprod(1 + 0.1 * jnp.tanh(h), -1),
  "layernorm": lambda h, a: (
    (h - jnp.mean(h, -1, keepdims=True)) * lax.rsqrt(jnp.var(h, -1, keepdims=True) + 1e-5)
  ),
  # data movement
  "reshape_transpose": lambda h, a: h.reshape(h.shape[::-1]).T * 1.3,
  "broadcast": lambda h, a: h + jnp.broadcast_to(h[:1], h.shape),
  "roll_concat": lambda h, a: jnp.concatenate([h[:, 1:], h[:, :1]], -1) - 0.5 * h,
  "pad": lambda h, a: jnp.pad(h, ((0, 0), (1, 0)), constant_values=0.25)[:, :-1] + h,
  "dynamic_slice": lambda h, a: lax.dynamic_slice_in_dim(jnp.concatenate([h, h * 2]), a["i0"], h.shape[0]),
  "gather": lambda h, a: jnp.take(h, a["perm"], axis=-1) * 0.9 + h,
  "scatter_add": lambda h, a: h.at[:, a["perm"][:3]].add(h[:, :3] * 0.7),
  "dynamic_update": lambda h, a: lax.dynamic_update_slice_in_dim(h, jnp.tanh(h[:1]), a["i0"], 0),
  # sorting
  "sort": lambda h, a: jnp.sort(h, -1) + h,
  "top_k": lambda h, a: lax.top_k(h, h.shape[-1])[0] * 0.5 + h,
  # custom_jvp activations (jax.nn) and custom rules
  "softmax": lambda h, a: jax.nn.softmax(h, -1),
  "logsumexp": lambda h, a: h - jax.nn.logsumexp(h, -1, keepdims=True),
  "gelu": lambda h, a: jax.nn.gelu(h),
  "relu": lambda h, a: jax.nn.relu(h),
  "silu": lambda h, a: jax.nn.silu(h),  # a jit inside
  "custom_jvp": lambda h, a: _softsign(h * 2),
  "custom_vjp": lambda h, a: _clip_grad_tanh(h),
  # control flow
  "remat": lambda h, a: jax.checkpoint(lambda v: jnp.sin(v @ a["w"]))(h),
  "cond": lambda h, a: lax.cond(jnp.sum(h) > 0, lambda v: jnp.sin(v) * 2.0, lambda v: jnp.tanh(v) + 0.5, h),
  "switch": lambda h, a: lax.switch(a["i0"] % 3, [jnp.sin, lambda v: v @ a["w"], jnp.cos], h),
  "scan": lambda h, a: lax.scan(lambda c, w: (jnp.tanh(c @ w), None), h, a["wb"])[0],
  "fori": lambda h, a: lax.fori_loop(0, 2, lambda i, c: jnp.tanh(c @ a["w"]) + 0.1, h),
  "while": lambda h, a: lax.while_loop(lambda c: c[0] < 2, lambda c: (c[0] + 1, jnp.sin(c[1])), (0, h))[1],
  "jit": lambda h, a: jax.jit(lambda v, w: jnp.tanh(v @ w))(h, a["w"]),
  "jit_donated": lambda h, a: _donating(h * 1.0, a["w"]),
  "scan_reverse": lambda h, a: lax.scan(
    lambda c, w: (jnp.tanh(c @ w), c[0]), h, a["wb"], reverse=True, unroll=2
  )[0],
  "cond_constant": lambda h, a: lax.cond(a["i0"] > 1, lambda v: jnp.full_like(v, 0.1), lambda v: v * 1.3, h),
  "custom_vjp_nondiff": lambda h, a: _scaled_tanh(1.7, h),
  "stop_gradient": lambda h, a: jnp.tanh(lax.stop_gradient(h * 1.3)) + h,
  "conv_transpose": lambda h, a: lax.conv_transpose(
    h[None], a["k"], (1,), "SAME", dimension_numbers=("NWC", "WIO", "NWC")
  )[0],
  "solve": lambda h, a: jnp.linalg.solve(4 * jnp.eye(h.shape[-1]) + a["w"], h.T).T,  # unknown primitives
  "reduce_precision": lambda h, a: lax.reduce_precision(h * 1.3, 5, 10) + h,  # a cast the user wrote
  # random draws inside the function (a key from an integer input): dropout, noise, a random scale
  "dropout": lambda h, a: jnp.where(jax.random.bernoulli(_key(a, 3), 0.8, h.shape), h / 0.8, 0.0),
  "noise": lambda h, a: h + 0.1 * jax.random.normal(_key(a, 5), h.shape),
  "random_scale": lambda h, a: h * jax.random.uniform(_key(a, 7), h.shape, minval=0.5, maxval=1.5),
  # integer, bool and 16-bit intermediates
  "low_dot": lambda h, a: lax.dot_general(
    h.astype(a["lo"].dtype),
    a["w"].astype(a["lo"].dtype),
    (((1,), (0,)), ((), ())),
    preferred_element_type=F32,
  ),
  "int_scale": lambda h, a: h * (a["idx"][:, None] % 3 + 1).astype(F32),
  "bool_mask": lambda h, a: jnp.where((h > 0) & (a["idx"][:, None] > 2), h, -h),
  "low_mix": _low_mix,
  "low_input": lambda h, a: h + a["lo"].astype(F32),
}

DISCONTINUOUS = frozenset(
  (
    "where",
    "select_n",
    "argmax",
    "sort",
    "top_k",
    "cond",
    "bool_mask",
    "max_min",
    "relu",
    "max_sub",
    "clamp",
    "clip",
    "cond_constant",
  )
)


def program(steps: tuple[str, ...]):
  """The program of ``steps``: ``f(x, a) -> dict`` of outputs (``a`` the other inputs)."""

  def f(x: jax.Array, a: dict) -> dict:
    h = x
    for name in steps:
      h = STEPS[name](h, a)
    lo = a["lo"]
    return {
      "h": h,
      "total": jnp.sum(h * h),  # a 0-d float32 result
      "argmax": jnp.argmax(h, -1),  # integer, computed from floats
      "int": jnp.cumsum(jnp.sort(a["idx"]) * a["i0"]) % 7,  # integer only: never changed
      "low": jnp.tanh(lo @ lo.T) * lo[:, :1] + jnp.exp(lo[:, :S] * 0.5),  # 16-bit only: never changed
    }

  f.__name__ = "_".join(steps) or "identity"
  return f


def continuous(steps: tuple[str, ...]) -> bool:
  return not DISCONTINUOUS.intersection(steps)


steps = st.lists(st.sampled_from(sorted(STEPS)), min_size=1, max_size=4).map(tuple)
lows = st.sampled_from(["float16", "bfloat16"])
seeds = st.integers(0, 2**16)
mixed_policies = st.builds(
  precision.Policy,
  compute=st.sampled_from(["cbfloat16", "bfloat16", "float16"]),
  level=st.sampled_from([0, 1, 2]),
  accumulation_block=st.sampled_from([4, 1024]),
)
float32_policies = st.builds(
  precision.Policy,
  compute=st.just("float32"),
  level=st.sampled_from([0, 1, 2]),
  accumulation_block=st.sampled_from([4, 1024]),
)


def case(names: tuple[str, ...], seed: int, low: str) -> tuple:
  """(program, x, other inputs)."""
  a = _args(seed, low)
  return program(names), a.pop("x"), a
