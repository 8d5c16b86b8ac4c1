"""``model.scan_layers``: the reference models' layer stack run as one ``jax.lax.scan`` equals the
unrolled Python loop (same parameters, same values, same dropout masks, same RNG state after),
and the cost model estimates the same rate for both (`models.common.run_layers`).

The float32 comparisons run under ``jax.default_matmul_precision("highest")`` (no TF32 or bf16
passes on a GPU). They are not bit for bit: XLA may fuse an unrolled loop's layers across layer
boundaries (contracted multiply-adds, another summation order), which `docs/invariants.md` bounds
by `tests.tolerances.TRANSFORM_EQUALITY`'s ``float32_ulps`` of the scale ("a scan body vs its
unrolled copies"). The scale is each leaf's own largest magnitude, but at least 2^-6 of the largest
over all gradients: a leaf whose gradient is zero in exact arithmetic (the key projection's bias:
softmax ignores a constant added to every score) holds float32 noise of ~1e-9 that no ulp of its
own scale can bound. Measured on CPU: at most 3.5 ulps of a leaf's own scale.
"""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

import models
import wafer
from models import bert, gpt2
from tests.tolerances import transform_tolerance
from wafer.config import load_params

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = {
  "bert": ROOT / "models" / "bert" / "configs" / "params_bert_tiny.yaml",
  "gpt2": ROOT / "models" / "gpt2" / "configs" / "params_gpt2_tiny.yaml",
}


@pytest.fixture(autouse=True, scope="module")
def _true_float32():
  """Scanned and unrolled runs are compared in float32 ulps (`_close`), so their products are true
  float32 on every device: on a GPU the default precision is TF32, whose 10-bit operands make
  the two forms differ by about 2^-11 wherever XLA orders a sum differently."""
  with jax.default_matmul_precision("highest"):
    yield


def _batch(name: str, config, key: jax.Array, b: int = 2, s: int = 16) -> dict[str, jax.Array]:
  if name == "bert":
    return bert.random_batch(key, b, s, config.vocab_size, 3)
  return gpt2.random_batch(key, b, s, config.vocab_size)


def _configs(name: str, layers: int, dropout: float):
  base = load_params(TINY[name]).model
  update = {"num_hidden_layers": layers, "dropout_rate": dropout}
  return (base.model_copy(update={**update, "scan_layers": s}) for s in (True, False))


def _close(a, b) -> None:
  """Every leaf of ``a`` within float32_ulps float32 ulps of its scale in ``b`` (its largest
  magnitude), the scale at least 2^-6 of the tree's (module docstring: an analytically zero leaf)."""
  leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(leaves_a) == len(leaves_b)
  ulps = transform_tolerance().float32_ulps
  tree = max(float(np.max(np.abs(np.asarray(y, np.float64)))) for y in leaves_b)
  for x, y in zip(leaves_a, leaves_b):
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    scale = max(float(np.max(np.abs(y))), tree * 2.0**-6)
    diff = float(np.max(np.abs(x - y)))
    assert diff <= ulps * scale * 2.0**-23, f"{diff} > {ulps} ulps of {scale}"


def _check_scan_equals_loop(
  name: str, layers: int, dropout: float, seed: int, eval_mode: bool = True
) -> None:
  """Loss and gradients of the functional form (the executor's), train mode and (``eval_mode``) eval mode."""
  scanned, unrolled = _configs(name, layers, dropout)
  init, loss_scan = models.functional(scanned)
  init_loop, loss_loop = models.functional(unrolled)
  params = init(jax.random.key(seed))
  # one parameter layout: the loop's initialisation gives the very same tree and values
  np.testing.assert_array_equal(
    *(
      np.concatenate([np.ravel(x) for x in jax.tree.leaves(p)])
      for p in (params, init_loop(jax.random.key(seed)))
    )
  )
  batch = _batch(name, scanned, jax.random.key(seed + 1))
  with jax.default_matmul_precision("highest"):
    train = {**batch, "dropout_key": np.array([seed, 7], np.uint32)}
    for b in (train, batch) if eval_mode else (train,):
      a = jax.jit(jax.value_and_grad(loss_scan))(params, b)
      c = jax.jit(jax.value_and_grad(loss_loop))(params, b)
      _close(a[0], c[0])
      _close(a[1], c[1])
  assert jax.tree.structure(a[1]) == jax.tree.structure(c[1])


def test_scan_equals_the_unrolled_loop():
  """GPT-2, train mode, with dropout (BERT and eval mode: the generated cases below, in the slow stage)."""
  _check_scan_equals_loop("gpt2", 2, 0.3, 0, eval_mode=False)


@pytest.mark.slow  # ~80 s on 2 cores: 4 compilations per example
@settings(max_examples=6, deadline=None)
@given(
  name=st.sampled_from(sorted(TINY)),
  layers=st.integers(1, 4),
  dropout=st.sampled_from([0.0, 0.3]),
  seed=st.integers(0, 2**16),
)
def test_scan_equals_the_unrolled_loop_generated(name, layers, dropout, seed):
  _check_scan_equals_loop(name, layers, dropout, seed)


@pytest.mark.parametrize(
  "name", [pytest.param("bert", marks=pytest.mark.slow), "gpt2"]
)  # BERT: 11 s; the same scan code
def test_scan_writes_back_the_rng_state(name):
  """A module called twice in train mode draws new dropout masks the second time, and the layers'
  RNG counts after a scanned call are the loop's."""
  scanned, unrolled = _configs(name, 3, 0.3)
  batch = _batch(name, scanned, jax.random.key(0))
  outs, states = [], []
  for config in (scanned, unrolled):
    model = models.build_model(config, rngs=nnx.Rngs(0))
    model.train()
    first, second = (model(batch["input_ids"]) for _ in range(2))
    first, second = (x[0] if isinstance(x, tuple) else x for x in (first, second))
    assert not np.allclose(first, second)  # the counts moved on between the calls
    outs.append(second)
    states.append(nnx.state(model, nnx.RngCount))
  _close(outs[0], outs[1])
  for x, y in zip(jax.tree.leaves(states[0]), jax.tree.leaves(states[1]), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("name", sorted(TINY))
def test_the_estimate_does_not_depend_on_scanning(name):
  """The cost model folds the unrolled layers into one repeated layer: same micro-batch, rate within
  1 %, and the same weights (the scan's layers, stacked inside the step, are weights too)."""
  rates, weights = [], []
  for config in _configs(name, 4, 0.0):
    init, loss = models.functional(config)
    params = jax.eval_shape(init, jax.random.key(0))
    batch = jax.eval_shape(lambda c=config: _batch(name, c, jax.random.key(0), b=8, s=64))

    def step(params, batch, loss=loss):
      value, grads = jax.value_and_grad(loss)(params, batch)
      return jax.tree.map(lambda w, g: w - 0.01 * g, params, grads), value

    report = wafer.estimate(step, params, batch, batch_size=8)
    rates.append((report.micro_batch_size, report.samples_per_sec))
    weights.append(sum(k.weight_bytes for k in report.kernels))
  (mb_scan, rate_scan), (mb_loop, rate_loop) = rates
  assert mb_scan == mb_loop
  assert rate_scan == pytest.approx(rate_loop, rel=0.01)
  assert weights[0] == pytest.approx(weights[1])


class _Block(nnx.Module):
  """x float32[b, 4] -> same; ``width`` inner features, dropout, and a running sum of its output
  (state it changes, as BatchNorm's statistics)."""

  def __init__(self, width: int, rngs: nnx.Rngs):
    self.inner = nnx.Linear(4, width, rngs=rngs)
    self.outer = nnx.Linear(width, 4, rngs=rngs)
    self.drop = nnx.Dropout(0.5, rngs=rngs)
    self.total = nnx.BatchStat(jnp.zeros((4,), jnp.float32))

  def __call__(self, x: jax.Array) -> jax.Array:
    y = x + self.drop(self.outer(self.inner(x)))
    self.total[...] = self.total[...] + jnp.sum(y, axis=0)
    return y


@pytest.mark.parametrize("case", ["copies", "shared", "widths"])
def test_run_layers_equals_the_loop_for_any_stack(case):
  """Copies of one structure are scanned; a layer applied twice (shared parameters and dropout
  stream, ALBERT-style) and layers of different parameter shapes run as the loop; what the
  layers change (a running sum, dropout counts) is written back either way."""
  from models.common import run_layers

  def stack():
    if case == "shared":
      block = _Block(8, nnx.Rngs(0))
      return nnx.List([block, block, block])
    widths = [8, 8, 8] if case == "copies" else [8, 16, 8]
    return nnx.List([_Block(w, nnx.Rngs(i)) for i, w in enumerate(widths)])

  x = jnp.linspace(-1.0, 1.0, 8, dtype=jnp.float32).reshape(2, 4)
  outs, sown, counts = [], [], []
  for scan in (True, False):
    layers = stack()
    layers.train()
    outs.append(run_layers(layers, x, scope="s", scan=scan))
    sown.append([np.asarray(layer.total[...]) for layer in layers])
    counts.append([int(layer.drop.rngs.count[...]) for layer in layers])
  _close(outs[0], outs[1])
  for a, b in zip(*sown, strict=True):
    _close(a, b)
  assert counts[0] == counts[1]
  if case == "shared":
    assert counts[0] == [3, 3, 3]  # one stream, drawn three times: three different masks
