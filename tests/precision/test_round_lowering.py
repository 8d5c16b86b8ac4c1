"""``precision_round``'s CPU lowering: one HLO ``map`` around the kernel (`precision.rounding`).

Two properties: the map gives the same bits as the kernel inlined (every predefined format,
both deterministic modes, NaN payloads and signed zeros included), and XLA computes each
rounding once, however many fusions read it (the inlined kernel is copied into each).
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import precision
from precision import _kernel
from precision.formats import PREDEFINED
from precision.rounding import round_p
from tests import values as V
from tests.devices import cpu_devices

MODES = ("nearest_even", "toward_zero")


@pytest.fixture(autouse=True, scope="module")
def _on_a_cpu_device():
  """The CPU lowering is under test: every program runs on a CPU device, whatever the default
  backend (on a GPU, ``JAX_PLATFORMS=cuda,cpu``); skipped where the CPU backend is missing."""
  (cpu,) = cpu_devices(1)
  with jax.default_device(cpu):
    yield


NARROW = [f.name for f in PREDEFINED if f.bits < 32]


def _rounded_by_map(x: np.ndarray, fmt: precision.FloatFormat, mode: str) -> np.ndarray:
  fn = jax.jit(lambda v: round_p.bind(v, fmt=fmt, mode=mode))
  assert " map(" in fn.lower(x).compile().as_text()  # the lowering under test
  return np.asarray(fn(x))


def _rounded_inline(x: np.ndarray, fmt: precision.FloatFormat, mode: str) -> np.ndarray:
  return np.asarray(jax.jit(lambda v: _kernel.round_bits(v, fmt, mode, None))(x))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", NARROW)
def test_the_map_gives_the_bits_of_the_inlined_kernel(name, mode):
  fmt = precision.get_format(name)
  x = np.concatenate([V.exhaustive_candidates(fmt), V.special_values(fmt), V.random_patterns(2**16, seed=15)])
  by_map = _rounded_by_map(x, fmt, mode)
  np.testing.assert_array_equal(V.bits_of(by_map), V.bits_of(_rounded_inline(x, fmt, mode)))
  assert not np.array_equal(V.bits_of(by_map), V.bits_of(x))  # rounding happened


@settings(max_examples=10)  # each new shape compiles both lowerings: the many-input test is above
@given(
  hnp.arrays(
    np.uint32, hnp.array_shapes(min_dims=0, max_dims=3, max_side=5), elements=st.integers(0, 2**32 - 1)
  ),
  st.sampled_from(["cbfloat16", "bfloat16", "float16", "float8_e4m3fn"]),
)
def test_the_map_keeps_every_shape_and_bit(bits, name):
  x = bits.view(np.float32)
  fmt = precision.get_format(name)
  by_map = _rounded_by_map(x, fmt, "nearest_even")
  assert by_map.shape == x.shape
  np.testing.assert_array_equal(V.bits_of(by_map), V.bits_of(_rounded_inline(x, fmt, "nearest_even")))


def _rounding_sites(jaxpr) -> int:
  return sum(eqn.primitive.name == "precision_round" for eqn in jaxpr.eqns)


def test_a_rounding_read_by_two_fusions_is_computed_once():
  # h = round(x * w[:1]) is read by two products, each rounded in a fusion of its own: XLA
  # copies the inlined kernel of h into both (4 reduce-precision for 3 roundings), the map not.
  def f(x, w):
    h = x * w[:1]
    return h * x, h * w[1:2]

  fn = precision.autocast(f, precision.Policy(compute="cbfloat16", level=0))
  x = jax.random.normal(jax.random.key(0), (64, 32), jnp.float32)
  w = jax.random.normal(jax.random.key(1), (32, 32), jnp.float32)
  sites = _rounding_sites(jax.make_jaxpr(fn)(x, w).jaxpr)
  hlo = jax.jit(fn).lower(x, w).compile().as_text()
  ops = re.findall(r"^\s*(?:ROOT )?%\S+ = \S+ ([\w-]+)\(", hlo, re.MULTILINE)
  assert sites == 3
  assert ops.count("map") == sites
  assert ops.count("reduce-precision") == sites  # one per map body: none copied
