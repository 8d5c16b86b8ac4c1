"""The backward products of ``jax.grad(autocast(f))`` on native tensor cores (bfloat16, float16).

On GPUs, autocast binds the tangent products of a rounded product with the native dtype's
algorithm preset (`precision._matmul.NATIVE_ALGORITHMS`: float32 arrays read as bfloat16 /
float16 by the GEMM, float32 accumulation). Their transposes, the backward products, keep it.
That is exact only if every operand of such a product is a value of the native dtype: a rounded
forward operand, or a cotangent that the product's result rounding has rounded.

Checked without a GPU by evaluating the program as a GPU would choose its branches: each
``platform_dependent`` takes its ``cuda`` branch, and each product bound with a preset is
computed in true float32 after checking that its operands are exactly values of the preset's
dtype. Since every product is then exact, the result is bit for bit the CPU program's (which
takes the TF32 branches): the same products summed in the same order.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import precision
from precision import _jax_compat as compat
from precision import _matmul
from precision.testing import assert_same_floats
from tests.devices import cpu_devices
from tests.values import examples

_PRESET_DTYPES = {preset: dtype for dtype, preset in _matmul.NATIVE_ALGORITHMS.items()}


class _Gpu:
  """Evaluates a jaxpr as lowered for ``cuda``; counts the products bound with a preset."""

  def __init__(self) -> None:
    self.preset_products = 0
    self.tf32_products = 0

  def run(self, jaxpr, consts, args):
    env = {}
    for var, value in zip(compat.binders(jaxpr), [*consts, *args]):
      env[var] = value

    def read(atom):
      return atom.val if isinstance(atom, compat.Literal) else env[atom]

    for eqn in jaxpr.eqns:
      values = [read(v) for v in eqn.invars]
      outs = self.eqn(eqn, values)
      for var, value in zip(eqn.outvars, outs):
        env[var] = value
    return [read(v) for v in jaxpr.outvars]

  def closed(self, j, args):
    jaxpr, consts = compat.split_closed(j)
    return self.run(jaxpr, consts, args)

  def eqn(self, eqn, values):
    name, params = eqn.primitive.name, eqn.params
    if name == "platform_index":
      return [None]  # the branch is chosen where the cond reads it
    if name == "cond" and params.get("branches_platforms"):
      platforms = params["branches_platforms"]
      index = next(i for i, p in enumerate(platforms) if p is not None and "cuda" in p)
      return self.closed(compat.cond_branches(params)[index], values[1:])
    if (
      name in ("pjit", "jit", "closed_call", "custom_jvp_call", "custom_vjp_call")
      or name in compat.CALL_PRIMITIVES
    ):
      body = compat.call_jaxpr(eqn)
      if body is not None:
        return self.closed(body, values)
    if name == "dot_general":
      preset = params.get("precision")
      if preset in _PRESET_DTYPES:
        dtype = _PRESET_DTYPES[preset]
        for v in values:
          v = np.asarray(v, np.float32)
          exact = v.astype(dtype).astype(np.float32)
          assert np.array_equal(v, exact, equal_nan=True), f"a preset product's operand is not {dtype}"
        self.preset_products += 1
        return compat.bind(eqn, values, precision=_matmul.TRUE_FLOAT32)
      if params.get("precision") == _matmul.ROUNDED_OPERANDS:
        self.tf32_products += 1
      if values[0].dtype != jnp.float32:  # the forward native product: exact in float32
        f32 = [jnp.asarray(v, jnp.float32) for v in values]
        return compat.bind(eqn, f32, precision=_matmul.TRUE_FLOAT32, preferred_element_type=jnp.float32)
    return compat.bind(eqn, values)


def _mlp(params, x):
  w1, w2, w3 = params
  h = jnp.tanh(x @ w1)
  a = jax.nn.softmax(h @ h.T / 4.0)  # attention-like: products of two activations
  h = (a @ h) @ w2 + h
  return jnp.mean(jnp.square(h @ w3))


def _case(seed: int, batch: int, width: int):
  keys = jax.random.split(jax.random.key(seed), 4)
  params = [jax.random.normal(keys[i], (width, width), jnp.float32) / width**0.5 for i in range(3)]
  return params, jax.random.normal(keys[3], (batch, width), jnp.float32)


def _check(policy: str, seed: int, batch: int, width: int) -> _Gpu:
  (cpu_device,) = cpu_devices(1)  # both evaluations on a CPU device, whatever the default backend
  with jax.default_device(cpu_device):
    params, x = _case(seed, batch, width)
    grad = jax.grad(precision.autocast(_mlp, policy))
    closed = jax.make_jaxpr(grad)(params, x)
    gpu = _Gpu()
    simulated = gpu.closed(closed, jax.tree.leaves((params, x)))
    cpu = jax.tree.leaves(jax.jit(grad)(params, x))
  for got, want in zip(simulated, cpu):
    assert_same_floats(np.asarray(got), np.asarray(want))
  return gpu


POLICIES = ["c=bf16,level=0", "c=bf16,level=1,block=8", "c=f16,level=1,block=8", "c=e4m3fn,level=1,block=8"]


@pytest.mark.parametrize("policy", POLICIES)
def test_backward_products_run_on_native_tensor_cores_and_are_exact(policy):
  """Every product of a bfloat16-native gradient (forward and backward) is native on a GPU; the
  backward ones (preset products) get operands of bfloat16, and the gradient equals the CPU's
  bit for bit. float16 keeps TF32 backward products (`NATIVE_ALGORITHMS`)."""
  gpu = _check(policy, seed=0, batch=6, width=16)
  # 5 forward products, two transposes each, but x (not differentiated) needs none in x @ w1
  if policy.startswith("c=f16"):
    assert (gpu.preset_products, gpu.tf32_products) == (0, 9)
  else:
    assert (gpu.preset_products, gpu.tf32_products) == (9, 0)


_GENERATED = given(
  policy=st.sampled_from(POLICIES),
  seed=st.integers(0, 2**16),
  batch=st.integers(1, 9),
  width=st.sampled_from([1, 3, 16, 33]),
)


def _generated_case(policy, seed, batch, width):
  _check(policy, seed, batch, width)


test_backward_native_products_are_exact_on_generated_cases = settings(max_examples=examples(2))(
  _GENERATED(_generated_case)
)
test_backward_native_products_are_exact_on_many_generated_cases = pytest.mark.slow(
  settings(max_examples=examples(30))(_GENERATED(_generated_case))
)


def _cuda_dots(fn, *args) -> list[str]:
  lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
  return [line for line in lowered.as_text().splitlines() if "stablehlo.dot_general" in line]


_BF16_PRESET = "lhs_precision_type = bf16, rhs_precision_type = bf16"


def test_cuda_lowering_of_grad_of_autocast_has_no_tf32_products():
  """Lowered for CUDA, ``jax.grad(autocast(f))`` (wafer's train step) binds its bfloat16 forward
  products on bfloat16 operands and its backward products with the bfloat16 algorithm (float32
  in and out)."""
  params, x = _case(0, 4, 8)
  dots = _cuda_dots(jax.grad(precision.autocast(_mlp, "c=bf16")), params, x)
  native = [d for d in dots if re.search(r"\(tensor<[\dx]*xbf16>, tensor<[\dx]*xbf16>\)", d)]
  preset = [d for d in dots if _BF16_PRESET in d]
  assert len(native) == 5 and len(preset) == 9 and len(dots) == 14, dots


def test_float16_matrix_vector_cbfloat16_and_products_tf32_keep_tf32_backward():
  """No preset where XLA GPU may refuse it or no native dtype exists: float16 (XLA GPU rejects
  ``F16_F16_F32`` in its multiply-and-reduce rewrite of small dots), matrix-vector and outer
  products (rewritten that way), cbfloat16, and ``products=tf32``."""
  params, x = _case(0, 4, 8)
  for policy in ("c=f16", "c=cb16", "c=bf16,products=tf32"):
    dots = _cuda_dots(jax.grad(precision.autocast(_mlp, policy)), params, x)
    assert len(dots) == 14 and not any("algorithm" in d for d in dots), (policy, dots)

  def regression(w, x):  # x @ w is matrix-vector; its transposes an outer product and a mat-vec
    return jnp.sum(jnp.square(x @ w))

  dots = _cuda_dots(jax.grad(precision.autocast(regression, "c=bf16")), params[0][0], x)
  assert dots and not any("algorithm" in d for d in dots), dots
