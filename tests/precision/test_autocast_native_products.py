"""Products of rounded operands on native tensor cores (bfloat16, float16) on GPUs; TF32 otherwise.

`precision.autocast` binds a product of two rounded operands on the native dtype that holds every
value of the compute format (`_native_dtype`), with float32 accumulation, where the program is
lowered for a GPU; lowered for a CPU it is the TF32-eligible float32 product, the same program
bit for bit as with ``products=tf32``. Checked without a GPU: on the HLO lowered for CUDA, and by
running the native branch on the CPU (``NATIVE_PLATFORMS`` patched), which must compute the same
products (exact) with float32 derivatives.
"""

from __future__ import annotations

import math
import re
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import precision
from precision import _matmul, _state  # noqa: E402  (the pass and its products)
from precision.testing import assert_same_floats
from tests.devices import CPU_ONLY, assert_same_up_to_summation_order, cpu_devices, on_cpu
from tests.values import examples


def _native(policy) -> object:
  policy = precision.Policy.parse(policy) if isinstance(policy, str) else policy
  return _matmul._native_dtype(_state.Pass(policy))


def test_which_formats_run_on_native_tensor_cores():
  assert _native("c=bf16") == jnp.bfloat16
  assert _native("c=f16") == jnp.float16
  assert _native("c=e4m3fn") == jnp.bfloat16  # float8 values are exact in bfloat16 (module docs)
  assert _native("c=e5m2") == jnp.bfloat16
  assert _native(precision.Policy(compute=precision.float16.replace(subnormals=False))) == jnp.float16
  assert _native("c=cb16") is None  # 6 exponent and 9 fraction bits: neither dtype holds it: TF32
  assert _native(precision.Policy(compute=precision.bfloat16.replace(mantissa_bits=8))) is None
  assert _native(precision.Policy(compute=precision.float16.replace(bias=13))) is None  # max 2^17 > 65504
  assert _native("c=bf16,products=tf32") is None
  assert _native("c=f32") is None


def test_products_key_parses_and_prints():
  p = precision.Policy.parse("c=bf16,products=tf32")
  assert p.products == "tf32" and str(p).endswith(",products=tf32")
  assert precision.Policy.parse(str(p)) == p
  assert "products" not in str(precision.Policy(compute="bf16"))
  with pytest.raises(precision.PolicyError, match="products='fp8'; allowed: native, tf32"):
    precision.Policy(products="fp8")


def _loss(x, w, k):
  h = jnp.tanh(x @ w)
  conv = jax.lax.conv_general_dilated(h[:, None, :], k, (1,), "SAME", dimension_numbers=("NCH", "OIH", "NCH"))
  return jnp.sum((conv[:, 0, :] @ w.T) ** 2)


def _args(seed: int = 0):
  keys = jax.random.split(jax.random.key(seed), 3)
  shapes = ((4, 64), (64, 64), (1, 1, 3))
  return [jax.random.normal(k, s, jnp.float32) for k, s in zip(keys, shapes)]


_PRODUCT = re.compile(
  r"stablehlo\.(dot_general|convolution).*: \(tensor<[\dx]*x(\w+)>, tensor<[\dx]*x(\w+)>\)"
)


def products(fn, *xs, platform: str) -> set[tuple[str, str]]:
  """(operand dtypes, precision) of every dot_general and convolution lowered for ``platform``."""
  text = jax.jit(fn).trace(*xs).lower(lowering_platforms=(platform,)).as_text()
  found = set()
  for line in text.splitlines():
    match = _PRODUCT.search(line)
    if match:
      config = re.findall(r"precision = \[(\w+), \w+\]|#stablehlo<precision (\w+)>", line)
      found.add((f"{match.group(2)}x{match.group(3)}", "".join(config[0]) if config else "DEFAULT"))
  return found


NATIVE = [("c=bf16", "bf16"), ("c=f16", "f16"), ("c=e4m3fn", "bf16")]


@pytest.mark.parametrize("level", [0, 1, 2])
@pytest.mark.parametrize(("policy", "dtype"), NATIVE)
def test_cuda_lowering_binds_native_operands(policy, dtype, level):
  """Every product of the forward and backward pass (autocast of value_and_grad, the training
  form) has native operands at DEFAULT precision, float32 results; chunked sums included."""
  step = precision.autocast(jax.value_and_grad(_loss, argnums=(1, 2)), f"{policy},level={level},block=16")
  found = products(step, *_args(), platform="cuda")
  assert found == {(f"{dtype}x{dtype}", "DEFAULT")}, found
  text = jax.jit(step).trace(*_args()).lower(lowering_platforms=("cuda",)).as_text()
  assert re.search(rf"tensor<[\dx]*x{dtype}>.*-> tensor<[\dx]*xf32>", text)  # float32 accumulation


@pytest.mark.parametrize("policy", ["c=cb16,level=1,block=16", "c=bf16,level=1,block=16,products=tf32"])
def test_cuda_lowering_keeps_tf32_for_emulated_formats_and_products_tf32(policy):
  step = precision.autocast(jax.value_and_grad(_loss, argnums=(1, 2)), policy)
  assert products(step, *_args(), platform="cuda") == {("f32xf32", "HIGH")}


@pytest.mark.parametrize("policy", ["c=bf16,level=0", "c=f16,level=1,block=16", "c=e5m2,level=2,block=16"])
def test_cpu_lowering_is_the_tf32_program(policy):
  """Lowered for a CPU the native form is the TF32 binding (XLA CPU would sum bfloat16 operands
  in another order), so the CPU program is the one of ``products=tf32``."""
  step = precision.autocast(jax.value_and_grad(_loss, argnums=(1, 2)), policy)
  assert products(step, *_args(), platform="cpu") == {("f32xf32", "HIGH")}
  plain = jax.jit(precision.autocast(jax.value_and_grad(_loss, argnums=(1, 2)), policy + ",products=tf32"))
  (cpu,) = cpu_devices(1)  # run on a CPU device on any default backend
  with jax.default_device(cpu):
    assert_same_floats(jax.jit(step)(*_args()), plain(*_args()))


@pytest.mark.parametrize("policy", ["c=bf16,level=0", "c=f16,level=1,block=16", "c=e4m3fn,level=2,block=16"])
def test_native_and_tf32_products_agree_on_the_default_device(policy):
  """On the default backend (a GPU: native tensor cores against TF32): the same products, so the
  same results up to the device's float32 summation order (tests/tolerances.py); bitwise on CPUs."""
  x, w, _ = _args(5)
  fn = lambda x, w: jnp.tanh(x @ w) @ w.T  # noqa: E731  (two products, a tanh between)
  got = jax.jit(precision.autocast(fn, policy))(x, w)
  want = jax.jit(precision.autocast(fn, policy + ",products=tf32"))(x, w)
  assert_same_up_to_summation_order(got, want, precision.Policy.parse(policy).compute, policy)


# ---- generated shapes and values: bit for bit on CPU; the native branch computes the same products ----


@st.composite
def dot_cases(draw):
  m, k, n = draw(st.integers(1, 5)), draw(st.one_of(st.just(1), st.integers(1, 70))), draw(st.integers(1, 5))
  batch = draw(st.sampled_from([(), (2,)]))
  seed = draw(st.integers(0, 2**31 - 1))
  # unit scale; float16's subnormals; large; beyond float16's range (bfloat16's values there); tiny
  scale = draw(st.sampled_from([1.0, 2.0**-20, 2.0**12, 2.0**40, 2.0**-40]))
  fmt = draw(st.sampled_from(["bf16", "f16", "e4m3fn", "e5m2"]))
  level = draw(st.sampled_from([0, 1, 2]))
  block = draw(st.sampled_from([1, 4, 16, 1024]))
  return (m, k, n), batch, seed, scale, f"c={fmt},level={level},block={block}"


def _operands(shape, batch, seed, scale):
  m, k, n = shape
  rng = np.random.default_rng(seed)
  x = jnp.asarray((rng.standard_normal((*batch, m, k)) * scale).astype(np.float32))
  w = jnp.asarray((rng.standard_normal((*batch, k, n)) * scale).astype(np.float32))
  return x, w


def _bits(tree):
  """Each leaf's bits, every NaN as the canonical quiet NaN (XLA keeps no NaN sign or payload)."""
  leaves = [np.asarray(leaf, np.float32) for leaf in jax.tree.leaves(tree)]
  return [np.where(np.isnan(leaf), np.float32(np.nan), leaf).view(np.uint32) for leaf in leaves]


def _bitwise_case(case):
  shape, batch, seed, scale, policy = case
  x, w = _operands(shape, batch, seed, scale)

  def loss(x, w):
    return jnp.sum(jnp.tanh(jnp.matmul(x, w)))

  for fn in (jnp.matmul, jax.value_and_grad(loss, argnums=(0, 1))):
    native = precision.autocast(fn, policy)
    tf32 = precision.autocast(fn, policy + ",products=tf32")
    want = _bits(jax.jit(tf32)(x, w))
    for got in (jax.jit(native)(x, w), native(x, w)):  # under jit and eagerly
      for a, b in zip(_bits(got), want):
        np.testing.assert_array_equal(a, b)
  outer = [  # jax.grad of the autocast function: its products' derivatives
    jax.grad(lambda x, w, p=p: jnp.sum(jnp.tanh(precision.autocast(jnp.matmul, p)(x, w))), argnums=(0, 1))
    for p in (policy, policy + ",products=tf32")
  ]
  for a, b in zip(_bits(jax.jit(outer[0])(x, w)), _bits(jax.jit(outer[1])(x, w))):
    np.testing.assert_array_equal(a, b)


_CPU_ONLY_BITWISE = pytest.mark.skipif(
  not on_cpu(), reason=f"{CPU_ONLY}; on GPUs see test_native_and_tf32_products_agree_*"
)
test_cpu_products_are_bitwise_those_of_products_tf32 = _CPU_ONLY_BITWISE(
  settings(max_examples=3)(given(dot_cases())(_bitwise_case))
)
test_cpu_products_are_bitwise_those_of_products_tf32_many = pytest.mark.slow(
  _CPU_ONLY_BITWISE(settings(max_examples=60)(given(dot_cases())(_bitwise_case)))
)


def _native_everywhere():
  """The native branch taken on CPUs too (and still on GPUs): converts to bfloat16 / float16 and
  binds them there. The tangent products keep TF32 (XLA CPU runs no algorithm preset); their
  native form is checked by `test_autocast_native_backward.py`."""
  return mock.patch.multiple(_matmul, NATIVE_PLATFORMS=("cpu", "cuda", "rocm"), NATIVE_ALGORITHMS={})


@pytest.fixture
def native_on_cpu():
  with _native_everywhere():
    yield


def _native_case(case):
  """Run on CPU, the native branch gives the TF32 binding's products: bitwise where the
  contraction is a single product (every product exact), and within float32 summation of the same
  exact products otherwise (XLA CPU sums bfloat16 operands in another order). Its derivative is
  float32's: a linear loss's gradient is bitwise that of ``products=tf32`` (a conversion's own
  derivative would round the cotangent to bfloat16 first: twice for the float8 formats)."""
  shape, batch, seed, scale, policy = case
  x, w = _operands(shape, batch, seed, scale)
  with _native_everywhere():
    _check_native_case(shape, x, w, policy)


def _check_native_case(shape, x, w, policy):
  got = np.asarray(jax.jit(precision.autocast(jnp.matmul, policy))(x, w))
  want = np.asarray(jax.jit(precision.autocast(jnp.matmul, policy + ",products=tf32"))(x, w))
  fmt = precision.Policy.parse(policy).compute
  if shape[1] == 1:
    assert_same_floats(got, want)
  else:
    rx, rw = (np.asarray(precision.round(v, fmt), np.float64) for v in (x, w))
    magnitude = np.matmul(np.abs(rx), np.abs(rw))
    gamma = shape[1] * 2.0**-24 / (1 - shape[1] * 2.0**-24)
    # Two float32 sums of the same exact products (each <= gamma * magnitude from the exact sum),
    # each rounded to the compute format (chunked sums: per chunk, bounded by the same gamma);
    # the rounded results differ by at most the rounding of that difference plus 2 quanta.
    ulp = np.asarray(fmt.ulp(jnp.asarray(np.maximum(np.abs(got), np.abs(want)), jnp.float32)), np.float64)
    chunks = math.ceil(shape[1] / max(1, precision.Policy.parse(policy).accumulation_block))
    bound = 2 * gamma * magnitude * (1 + 2.0**-fmt.mantissa_bits) ** chunks + 2 * chunks * ulp
    finite = np.isfinite(want)
    assert np.all(np.abs(got[finite] - want[finite]) <= bound[finite])
    assert_same_floats(got[~finite], want[~finite])
  loss = lambda p: lambda x, w: jnp.sum(precision.autocast(jnp.matmul, p)(x, w) * 0.75)  # noqa: E731
  native = jax.jit(jax.grad(loss(policy), argnums=(0, 1)))(x, w)
  tf32 = jax.jit(jax.grad(loss(policy + ",products=tf32"), argnums=(0, 1)))(x, w)
  for a, b in zip(_bits(native), _bits(tf32)):
    np.testing.assert_array_equal(a, b)


# Cases that failed variants of the implementation: a float8 gradient rounded twice (bfloat16, then
# e4m3) where the derivative went through the conversions; float16 taken to hold bfloat16 values.
_KNOWN = (((1, 27, 3), (), 1, 1.0, "c=e4m3fn,level=1,block=1024"), ((1, 1, 1), (), 0, 2.0**-20, "c=bf16"))
test_native_branch_computes_the_same_products = settings(max_examples=examples(4))(
  example(_KNOWN[0])(example(_KNOWN[1])(given(dot_cases())(_native_case)))
)
test_native_branch_computes_the_same_products_many = pytest.mark.slow(
  settings(max_examples=60)(given(dot_cases())(_native_case))
)


def test_native_branch_runs_convolutions(native_on_cpu):
  policy = "c=bf16,level=1,block=2"  # chunked: one grouped convolution per chunk sum
  got = jax.jit(precision.autocast(_loss, policy))(*_args(3))
  want = jax.jit(precision.autocast(_loss, policy + ",products=tf32"))(*_args(3))
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2.0**-7)
  text = jax.jit(precision.autocast(_loss, policy)).lower(*_args(3)).as_text()
  assert "stablehlo.convolution" in text and re.search(r"convolution.*tensor<[\dx]*xbf16>", text)
