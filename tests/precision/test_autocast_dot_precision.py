"""The precision config autocast gives matrix products: TF32-eligible on rounded operands.

Products on rounded operands carry ``precision=HIGH`` (TF32 tensor cores on NVIDIA GPUs, exact
for compute-format values) where they are lowered for a CPU, and for cbfloat16 everywhere (for
bfloat16 and float16 a GPU runs them on native tensor cores: test_autocast_native_products.py);
products the policy keeps float32 carry ``HIGHEST``, products autocast leaves alone keep what
the user wrote. On CPU the config does not change a bit: checked here against the same pass
with every product at ``HIGHEST``. The programs are lowered for the CPU explicitly, so the
checks hold on any default backend.
"""

import importlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import precision
from tests.devices import CPU_ONLY, on_cpu

autocast_module = importlib.import_module("precision._matmul")  # where products get their precision


def mlp_loss(x, w1, w2, k):
  h = jnp.tanh(x @ w1)
  conv = jax.lax.conv_general_dilated(h[:, None, :], k, (1,), "SAME", dimension_numbers=("NCH", "OIH", "NCH"))
  return jnp.sum((conv[:, 0, :] @ w2) ** 2)


SHAPES = ((4, 64), (64, 64), (64, 8), (1, 1, 3))


def args(seed: int):
  keys = jax.random.split(jax.random.key(seed), len(SHAPES))
  return [jax.random.normal(k, s, jnp.float32) for k, s in zip(keys, SHAPES)]


def product_precisions(fn, *xs, platform: str = "cpu") -> list[str]:
  """The precision attribute of every dot_general and convolution in the StableHLO lowered for
  ``platform``."""
  text = jax.jit(fn).trace(*xs).lower(lowering_platforms=(platform,)).as_text()
  lines = [
    line for line in text.splitlines() if "stablehlo.dot_general" in line or "stablehlo.convolution" in line
  ]
  found = []
  for line in lines:  # dot_general: "precision = [HIGH, HIGH]"; convolution: "#stablehlo<precision HIGH>"
    config = re.findall(r"precision = \[(\w+), \w+\]|#stablehlo<precision (\w+)>", line)
    found.append("".join(config[0]) if config else "DEFAULT")
  return found


@pytest.mark.parametrize("policy", ["c=cb16,level=0", "c=cb16,level=1", "c=bf16,level=2", "c=f16"])
def test_products_on_rounded_operands_are_tf32_eligible(policy):
  for fn in (
    precision.autocast(mlp_loss, policy),
    precision.autocast(jax.grad(mlp_loss, argnums=(1, 2)), policy),
  ):
    found = product_precisions(fn, *args(0))
    assert found and set(found) == {"HIGH"}, (policy, found)
  if "cb16" in policy:  # no native dtype holds cbfloat16: TF32 on GPUs too
    found = product_precisions(precision.autocast(mlp_loss, policy), *args(0), platform="cuda")
    assert found and set(found) == {"HIGH"}, (policy, found)


@pytest.mark.parametrize("platform", ["cpu", "cuda"])
def test_float32_products_are_true_float32(platform):
  found = product_precisions(precision.autocast(mlp_loss, "c=f32"), *args(0), platform=platform)
  assert found and set(found) == {"HIGHEST"}
  plain = product_precisions(mlp_loss, *args(0), platform=platform)
  assert set(plain) == {"DEFAULT"}  # the user's own products, without autocast (TF32 on GPUs)


def test_region_products_keep_the_users_precision():
  def f(x, w):
    with precision.float32_region():
      return jnp.sum(x @ w)

  assert set(product_precisions(precision.autocast(f, "c=cb16"), *args(0)[:2])) == {"DEFAULT"}


STEPS = {
  policy: jax.jit(precision.autocast(jax.value_and_grad(mlp_loss, argnums=(1, 2)), policy))
  for policy in ("c=cb16,level=0", "c=cb16,level=1", "c=f32")
}


@pytest.mark.skipif(not on_cpu(), reason=f"{CPU_ONLY}; on a GPU HIGH is TF32 and HIGHEST true float32")
@settings(max_examples=10)
@given(st.sampled_from(sorted(STEPS)), st.integers(0, 2**31 - 1))
def test_cpu_results_do_not_depend_on_the_product_precision(policy, seed):
  xs = args(seed)
  got = STEPS[policy](*xs)
  highest = autocast_module.TRUE_FLOAT32
  try:
    autocast_module.ROUNDED_OPERANDS, saved = highest, autocast_module.ROUNDED_OPERANDS
    want = jax.jit(precision.autocast(jax.value_and_grad(mlp_loss, argnums=(1, 2)), policy))(*xs)
  finally:
    autocast_module.ROUNDED_OPERANDS = saved
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))
