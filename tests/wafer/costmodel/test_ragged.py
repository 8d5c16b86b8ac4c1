"""Grouped products (``lax.ragged_dot``: a mixture of experts' expert FFNs, tokens sorted by expert)
are matrix products: each token meets one expert's weight, so a step's FLOPs are those of the dense
FFN it routes through, while every expert's weight is a parameter, streamed and updated. Before,
the ragged product was element-wise work of 0 FLOP and the step ran 1.6x the dense rate."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wafer
from tests.wafer.costmodel.helpers import sds, sgd_step
from wafer.costmodel import CALIBRATION
from wafer.costmodel import graph as G


def _moe(experts: int):
  def loss(p, x):
    tokens = x.reshape(-1, x.shape[-1])
    sizes = jnp.full((experts,), tokens.shape[0] // experts, jnp.int32)
    h = jax.nn.gelu(jax.lax.ragged_dot(tokens, p["w1"], sizes))
    return jnp.mean(jax.lax.ragged_dot(h, p["w2"], sizes) ** 2)

  return loss


def _dense(p, x):  # every token through expert 0: the same products per token
  return jnp.mean((jax.nn.gelu(x @ p["w1"][0]) @ p["w2"][0]) ** 2)


@settings(max_examples=6, deadline=None)
@given(
  experts=st.sampled_from([2, 4, 8]),
  d=st.sampled_from([32, 64]),
  f=st.sampled_from([64, 128]),
  seq=st.sampled_from([16, 32]),
)
def test_a_grouped_product_costs_the_dense_products_of_its_tokens(experts, d, f, seq):
  batch = 8
  params = {"w1": sds(experts, d, f), "w2": sds(experts, f, d)}
  x = sds(batch, seq, d)
  moe = G.extract(sgd_step(_moe(experts)), (params, x), batch_argnums=(1,), compute_bits=16)
  dense = G.extract(sgd_step(_dense), (params, x), batch_argnums=(1,), compute_bits=16)
  # forward 2 products, backward 3 (x needs no gradient): 5 x 2 d f FLOP per token
  assert moe.flops_per_sample() == pytest.approx(5 * 2 * d * f * seq, rel=1e-6)
  assert moe.flops_per_sample() == pytest.approx(dense.flops_per_sample(), rel=1e-6)
  assert moe.param_elements == experts * 2 * d * f  # every expert is a parameter
  report = wafer.costmodel.estimate_graph(moe, batch_size=batch, mode="weight_streaming")
  assert sum(k.weight_bytes for k in report.kernels) == pytest.approx(experts * 2 * d * f * 2)
  assert report.fits and math.isfinite(report.samples_per_sec)


def test_the_weight_gradient_of_a_grouped_product_is_a_product_over_the_tokens():
  """The backward's ``ragged_dot_general`` with the tokens contracted (one sum per expert) is
  costed as ``experts`` products of ``tokens / experts`` each, whose tokens grow with the batch."""
  params = {"w1": sds(4, 32, 64), "w2": sds(4, 64, 32)}
  graph = G.extract(sgd_step(_moe(4)), (params, sds(8, 16, 32)), batch_argnums=(1,), compute_bits=16)
  products = [mm for k in graph.kernels for mm in k.matmuls if mm.phase == "bwd" and not mm.weight]
  grads = [mm for mm in products if mm.k.exponent > 0]  # contracted over the tokens
  assert len(grads) == 2 and all(mm.instances.at(1.0) == 4 and mm.instances.exponent == 0 for mm in grads)
  # no attention rows: the estimate does not move with their cost
  rates = [
    wafer.costmodel.estimate_graph(
      graph, batch_size=8, mode="weight_streaming", calibration=CALIBRATION.replace(attention_row_cycles=c)
    ).samples_per_sec
    for c in (0.0, 10.0)
  ]
  assert rates[0] == pytest.approx(rates[1], rel=1e-12)
