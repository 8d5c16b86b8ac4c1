"""A convolution's work: the zeros that ``lhs_dilation`` puts between input elements (the input
gradient of a strided convolution) are not multiplied, so they are not FLOPs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wafer
from tests.values import examples
from wafer.costmodel import walk


@settings(max_examples=examples(30), deadline=None)
@given(
  size=st.integers(1, 12),
  taps=st.integers(1, 5),
  dilation=st.integers(1, 4),
  stride=st.integers(1, 3),
  rhs_dilation=st.integers(1, 2),
)
def test_the_real_tap_share_is_the_count_of_taps_on_input_elements(
  size, taps, dilation, stride, rhs_dilation
):
  """Against a convolution of ones (no padding: every tap lands inside the dilated input): its sum is
  the number of (output, tap) pairs that meet a real element."""
  extent = (size - 1) * dilation + 1
  if (taps - 1) * rhs_dilation + 1 > extent:
    return
  lhs, rhs = jnp.ones((1, 1, size)), jnp.ones((1, 1, taps))

  def conv(lhs, rhs):
    return jax.lax.conv_general_dilated(
      lhs, rhs, (stride,), [(0, 0)], lhs_dilation=(dilation,), rhs_dilation=(rhs_dilation,)
    )

  out = conv(lhs, rhs)
  eqn = next(
    e for e in jax.make_jaxpr(conv)(lhs, rhs).jaxpr.eqns if e.primitive.name == "conv_general_dilated"
  )
  want = float(out.sum()) / (out.shape[-1] * taps)
  assert walk._real_tap_fraction(eqn) == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("stride", [1, 2, 4])
def test_a_strided_convolutions_backward_costs_its_real_products(stride):
  """Two convolutions, the second strided: the train step's FLOPs are 3x the forward's less the first
  one's input gradient (none is needed), within the padding the gradient adds (it counted the zeros:
  1.6x at stride 2, 2.4x at stride 4)."""
  f32 = jnp.float32

  def step(ws, x):
    def loss(ws):
      dn = ("NHWC", "HWIO", "NHWC")
      y = jax.lax.conv_general_dilated(x, ws[0], (1, 1), "SAME", dimension_numbers=dn)
      y = jax.lax.conv_general_dilated(jnp.tanh(y), ws[1], (stride, stride), "SAME", dimension_numbers=dn)
      return jnp.mean(y**2)

    return jax.tree.map(lambda a, g: a - 1e-3 * g, ws, jax.grad(loss)(ws))

  S = jax.ShapeDtypeStruct
  ws = [S((3, 3, 16, 32), f32), S((3, 3, 32, 32), f32)]
  r = wafer.estimate(step, ws, S((8, 32, 32, 16), f32))
  o = 32 // stride
  first, second = 2 * 9 * 32 * 32 * 16 * 32, 2 * 9 * o * o * 32 * 32
  want = 2 * first + 3 * second
  assert np.isclose(r.flops_per_sample, want, rtol=0.06), (r.flops_per_sample / want, stride)
