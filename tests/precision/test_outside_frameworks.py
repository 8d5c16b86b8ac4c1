"""`precision` on programs we did not write: the defects that probing them found, one test each.

Each test says what used to happen. Programs: sharded code over the 4 forced CPU devices
(``shard_map`` with collectives, as data-parallel training scripts write it).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import precision
from precision.testing import assert_same_floats


def _normal(seed: int, shape: tuple[int, ...], scale: float = 1.0) -> jax.Array:
  return scale * jax.random.normal(jax.random.key(seed), shape, jnp.float32)


def _data_parallel_loss():
  """A data-parallel MLP loss: each device takes 2 of the 8 examples, the loss is a pmean."""
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("data",))

  @functools.partial(jax.shard_map, mesh=mesh, in_specs=(P(), P("data")), out_specs=P())
  def loss(w, x):
    h = jnp.tanh(x @ w["w1"])
    return lax.pmean(jnp.mean((h @ w["w2"]) ** 2), "data")

  w = {"w1": _normal(1, (16, 32), 0.3), "w2": _normal(2, (32, 4), 0.3)}
  return loss, w, _normal(3, (8, 16))


def test_numerics_report_through_shard_map():
  """The report's callbacks were ordered, and JAX refuses ordered effects on more than one
  device: ``ValueError: The following ordered effects are not supported for more than 1
  device``. Each shard now reports under its mesh position and the two runs are matched shard
  by shard: nothing is left unmatched, the float32 policy is exact everywhere, every equation's
  elements are those of the whole batch, and the outputs are jit(autocast(f))'s."""
  loss, w, x = _data_parallel_loss()
  vg = jax.value_and_grad(loss)
  exact = precision.numerics_report(vg, "c=f32", w, x)
  assert exact.unmatched == 0 and len(exact.rows) > 5
  assert all(math.isinf(r.sqnr_db) and r.sqnr_db > 0 for r in exact.rows)
  report = precision.numerics_report(vg, "c=bf16", w, x)
  assert report.unmatched == 0
  assert_same_floats(report.outputs, jax.jit(precision.autocast(vg, "c=bf16"))(w, x))
  tanh = [r for r in report.rows if r.primitive == "tanh"]
  assert len(tanh) == 1 and tanh[0].calls == 4 and tanh[0].elements == 8 * 32  # 4 shards of 2 x 32
  assert math.isfinite(tanh[0].sqnr_db) and 20 < tanh[0].sqnr_db < 80  # rounded to bfloat16, not exact


# ---- Flax NNX modules passed to an autocast function ----


def _nnx_model():
  nnx = pytest.importorskip("flax.nnx")

  class Net(nnx.Module):
    def __init__(self, rngs):
      self.l1 = nnx.Linear(8, 16, rngs=rngs)
      self.bn = nnx.BatchNorm(16, rngs=rngs)
      self.drop = nnx.Dropout(0.5, rngs=rngs)
      self.l2 = nnx.Linear(16, 2, rngs=rngs)

    def __call__(self, x):
      return self.l2(self.drop(nnx.relu(self.bn(self.l1(x)))))

  return nnx, Net(nnx.Rngs(0, dropout=1))


def _loss(model, x):
  return jnp.mean(model(x) ** 2)


def _state_leaves(nnx, model):
  return [
    jax.random.key_data(v) if jnp.issubdtype(v.dtype, jax.dtypes.prng_key) else v
    for v in jax.tree.leaves(nnx.state(model))
  ]


def test_an_nnx_module_argument_keeps_its_updates():
  """An NNX module passed to the autocast function was a copy inside the trace: under a mixed
  policy its BatchNorm statistics and the dropout stream's count were silently not updated
  (every step drew the same dropout mask), while the float32 policy, which calls the function
  itself, updated them. The module's state now goes through the pass and is written back, as
  ``nnx.jit`` does; it is not rounded to ``output``."""
  nnx, model = _nnx_model()
  _, reference = _nnx_model()
  x = _normal(4, (4, 8))
  # compute float32 with a bfloat16 output goes through the pass: the identity but for the output
  policy = precision.Policy(compute="float32", output="bfloat16")
  loss = nnx.jit(precision.autocast(_loss, policy))(model, x)
  want = nnx.jit(_loss)(reference, x)
  assert float(loss) == float(precision.round(want, "bfloat16"))
  assert_same_floats(_state_leaves(nnx, model), _state_leaves(nnx, reference))  # stats, counts, weights

  nnx, model = _nnx_model()
  kernel = np.asarray(model.l1.kernel[...])
  mixed = precision.autocast(_loss, "c=bf16")
  first, second = mixed(model, x), mixed(model, x)
  assert float(first) != float(second)  # the dropout stream moved on: a new mask
  assert not np.array_equal(np.asarray(model.bn.mean[...]), np.zeros(16, np.float32))
  grads = nnx.grad(mixed)(model, x)  # inside nnx's own transforms too
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))
  assert np.array_equal(np.asarray(model.l1.kernel[...]), kernel)  # weights written back as they were
