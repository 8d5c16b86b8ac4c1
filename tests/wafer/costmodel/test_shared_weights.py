"""Weights a loop shares across its iterations (issue 25, item 3: one canonical layer graph).

A weight that a loop closes over is the same array in every iteration: an RNN's weights over time,
one transformer layer applied ALBERT-style. It is one parameter, so the step's parameter count
(which picks the mode under releases before 1.9 and sizes MemoryX's optimizer pass) holds it once,
and weight streaming brings it in once per micro-batch, not once per iteration. A loop over stacked
weights (``lax.scan`` over ``xs``, or ``fori_loop`` indexing them by its counter) reads a new weight
every iteration. Whichever way the loop is written (``lax.scan``, ``fori_loop``, a Python loop), the
counts and the rate agree."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wafer
from tests.wafer.costmodel.helpers import sds, sgd_step
from wafer.costmodel import graph as G


def _cell(p, carry, xt):
  h, c = carry
  z = xt @ p["wx"] + h @ p["wh"] + p["b"][None]
  i, f, g, o = jnp.split(z, 4, -1)
  c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
  h = jax.nn.sigmoid(o) * jnp.tanh(c)
  return (h, c), h


def _lstm_loss(way: str, steps: int):
  def loss(p, x):
    z = jnp.zeros((x.shape[0], p["wh"].shape[0]))
    if way == "scan":
      _, hs = jax.lax.scan(lambda c, xt: _cell(p, c, xt), (z, z), jnp.swapaxes(x, 0, 1))
      return jnp.mean(hs**2)
    if way == "fori":

      def body(t, acc):
        c, total = acc
        c, h = _cell(p, c, jax.lax.dynamic_index_in_dim(x, t, 1, keepdims=False))
        return c, total + jnp.mean(h**2)

      return jax.lax.fori_loop(0, steps, body, ((z, z), 0.0))[1] / steps
    carry, total = (z, z), 0.0
    for t in range(steps):
      carry, h = _cell(p, carry, x[:, t])
      total = total + jnp.mean(h**2)
    return total / steps

  return loss


def _lstm(hidden: int):
  return {"wx": sds(hidden, 4 * hidden), "wh": sds(hidden, 4 * hidden), "b": sds(4 * hidden)}


def _count(tree) -> int:
  return sum(math.prod(a.shape) for a in jax.tree.leaves(tree))


@settings(max_examples=4, deadline=None)
@given(hidden=st.sampled_from([32, 64, 128]), steps=st.integers(8, 12), batch=st.sampled_from([8, 64]))
def test_an_rnn_over_time_holds_its_weights_once_however_the_loop_is_written(hidden, steps, batch):
  params, x = _lstm(hidden), sds(batch, steps, hidden)
  graphs, reports = {}, {}
  for way in ("scan", "loop"):
    graphs[way] = G.extract(
      sgd_step(_lstm_loss(way, steps)), (params, x), batch_argnums=(1,), compute_bits=16
    )
    reports[way] = wafer.costmodel.estimate_graph(graphs[way], batch_size=batch, mode="weight_streaming")
  for way, graph in graphs.items():
    assert graph.param_elements == _count(params), way
    streamed = sum(k.weight_bytes for k in reports[way].kernels)
    assert streamed == pytest.approx(_count(params) * 2, rel=1e-6), way  # 16-bit, once per micro-batch
  # the loop drops the first step's product with the zero initial state (no per-sample work)
  assert reports["scan"].flops_per_sample == pytest.approx(reports["loop"].flops_per_sample, rel=1 / steps)
  ratio = reports["scan"].samples_per_sec / reports["loop"].samples_per_sec
  assert abs(math.log(ratio)) <= math.log(1.1), ratio


def test_a_fori_loop_over_time_holds_its_weights_once():
  params, x = _lstm(64), sds(16, 12, 64)
  graph = G.extract(sgd_step(_lstm_loss("fori", 12)), (params, x), batch_argnums=(1,), compute_bits=16)
  assert graph.param_elements == _count(params)


def _layer(p, h):
  return h + jnp.tanh(h @ p["w1"] + p["b1"][None, None]) @ p["w2"]


def _albert_loss(way: str, layers: int):
  """A stack of ``layers`` applications of a layer: shared (one ``p``) or stacked (``p`` per layer)."""

  def loss(p, x):
    h = x
    if way == "shared_scan":
      h, _ = jax.lax.scan(lambda h, _: (_layer(p, h), None), h, None, length=layers)
    elif way == "shared_fori":
      h = jax.lax.fori_loop(0, layers, lambda i, h: _layer(p, h), h)
    elif way == "shared_loop":
      for _ in range(layers):
        h = _layer(p, h)
    elif way == "stacked_scan":
      h, _ = jax.lax.scan(lambda h, q: (_layer(q, h), None), h, p)
    elif way == "stacked_fori":  # the counter indexes the stacked weights: a new layer each iteration
      h = jax.lax.fori_loop(0, layers, lambda i, h: _layer(jax.tree.map(lambda a: a[i], p), h), h)
    return jnp.mean(h**2)

  return loss


@pytest.mark.parametrize("way", ["shared_scan", "shared_fori", "shared_loop", "stacked_scan", "stacked_fori"])
def test_one_layer_applied_many_times_is_one_layer_of_parameters(way):
  layers, d, f = 6, 64, 256
  layer = {"w1": sds(d, f), "b1": sds(f), "w2": sds(f, d)}
  stacked = {k: sds(layers, *v.shape) for k, v in layer.items()}
  params = stacked if way.startswith("stacked") else layer
  x = sds(16, 32, d)
  graph = G.extract(sgd_step(_albert_loss(way, layers)), (params, x), batch_argnums=(1,), compute_bits=16)
  assert graph.param_elements == _count(params)
  # (an unrolled loop drops the first layer's unused input gradient, 1 of 36 products)
  assert graph.flops_per_sample() == pytest.approx(6 * 32 * layers * 2 * d * f, rel=0.03)


def test_a_weight_shared_inside_each_scanned_layer_counts_once_per_layer():
  """An outer scan over stacked layers (``xs``) whose body runs an inner loop over time closing
  over its layer's weights: one weight per layer, not one per (layer, step)."""
  layers, d, steps = 3, 32, 10
  params = {"w": sds(layers, d, d)}

  def loss(p, x):
    def layer(h, w):
      h, _ = jax.lax.scan(lambda c, _: (jnp.tanh(c @ w), None), h, None, length=steps)
      return h, None

    h, _ = jax.lax.scan(layer, x, p["w"])
    return jnp.mean(h**2)

  graph = G.extract(sgd_step(loss), (params, sds(8, d)), batch_argnums=(1,), compute_bits=16)
  assert graph.param_elements == layers * d * d


@pytest.mark.parametrize("layers", [2, 4])
def test_a_shared_bias_beside_stacked_weights_keeps_every_layer_a_layer(layers):
  """A scan over stacked matrices that also reads one array every layer shares (a bias, a position
  table) has ``layers`` distinct weight sets, not one: each layer pays its pass latency
  (`Calibration.layer_latency_s`); the RNN's time steps, which read one array, are one layer."""
  from wafer.costmodel.streaming import _layer_passes

  d = 32

  def loss(p, x):
    def body(h, w):
      return jnp.tanh(h @ w + p["b"][None, :]), None

    h, _ = jax.lax.scan(body, x, p["w"])
    return jnp.mean(h**2)

  params = {"w": sds(layers, d, d), "b": sds(d)}
  graph = G.extract(sgd_step(loss), (params, sds(8, d)), batch_argnums=(1,), compute_bits=16)
  blocks = [k for k in graph.kernels if k.count == layers and k.weights]
  assert blocks and max(k.weight_instances for k in blocks) == layers
  assert _layer_passes(graph, "layers") == 2 * layers
  rnn = G.extract(
    sgd_step(_lstm_loss("scan", 8)), (_lstm(32), sds(8, 8, 32)), batch_argnums=(1,), compute_bits=16
  )
  assert _layer_passes(rnn, "layers") == 2
