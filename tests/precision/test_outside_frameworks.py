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
from tests.devices import cpu_devices


def _normal(seed: int, shape: tuple[int, ...], scale: float = 1.0) -> jax.Array:
  return scale * jax.random.normal(jax.random.key(seed), shape, jnp.float32)


def _data_parallel_loss():
  """A data-parallel MLP loss: each device takes 2 of the 8 examples, the loss is a pmean."""
  mesh = jax.sharding.Mesh(np.array(cpu_devices(4)), ("data",))  # CPU devices: a GPU has one

  @functools.partial(jax.shard_map, mesh=mesh, in_specs=(P(), P("data")), out_specs=P())
  def loss(w, x):
    h = jnp.tanh(x @ w["w1"])
    return lax.pmean(jnp.mean((h @ w["w2"]) ** 2), "data")

  w = {"w1": _normal(1, (16, 32), 0.3), "w2": _normal(2, (32, 4), 0.3)}
  return loss, w, _normal(3, (8, 16))


@pytest.mark.slow  # about 7 s on the 2-core machine
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


@pytest.mark.slow  # about 10 s on the 2-core machine
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
  with jax.default_matmul_precision("highest"):  # the float32 policy's products (TF32 on GPUs otherwise)
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


# ---- Python bools and Equinox hyperparameters are not traced ----


def test_a_python_bool_flag_is_not_traced():
  """``f(x, training=True)`` failed under a mixed policy (TracerBoolConversionError at
  ``if training:``): Python bools were traced like numbers. A float32 policy, which calls the
  function itself, ran it."""

  def f(x, training):
    return jnp.tanh(x) * 1.1 if training else x

  x = _normal(5, (4,))
  for policy in ("c=f32", "c=bf16"):
    assert_same_floats(jax.jit(precision.autocast(f, policy), static_argnums=1)(x, False), x)
    assert_same_floats(precision.autocast(f, policy)(x, False), x)
    assert_same_floats(precision.autocast(f, policy)(x, training=False), x)
  assert precision.autocast(lambda x: (x * 1.1, True), "c=bf16")(x)[1] is True


def _equinox_model():
  eqx = pytest.importorskip("equinox")

  class Net(eqx.Module):
    conv: eqx.nn.Conv1d
    bn: eqx.nn.BatchNorm
    attn: eqx.nn.MultiheadAttention
    drop: eqx.nn.Dropout

    def __init__(self, key):
      k1, k2 = jax.random.split(key)
      self.conv = eqx.nn.Conv1d(4, 8, kernel_size=3, stride=2, padding=1, key=k1)  # int hyperparameters
      self.bn = eqx.nn.BatchNorm(8, "batch", momentum=0.9, mode="batch")  # a float and a bool (inference)
      self.attn = eqx.nn.MultiheadAttention(num_heads=2, query_size=8, key=k2)  # num_heads: a reshape
      self.drop = eqx.nn.Dropout(0.25)

    def __call__(self, x, state, key):
      h, state = self.bn(jax.nn.gelu(self.conv(x)), state)
      h = self.drop(h.T, key=key)
      return self.attn(h, h, h), state

  with jax.numpy_dtype_promotion("standard"):  # equinox's BatchNorm mixes int and float
    model, state = eqx.nn.make_with_state(Net)(jax.random.key(0))
  return eqx, model, state


@pytest.mark.slow  # about 15 s on the 2-core machine
def test_equinox_hyperparameters_and_batch_norm_state():
  """Inside an Equinox module, Python numbers were traced: a mixed policy failed on
  ``BatchNorm(inference=False)`` (TracerBoolConversionError) and would have on a convolution's
  stride or the number of heads; ``eqx.filter_jit`` keeps them static. The float32 policy is the
  identity and bfloat16 rounds."""
  eqx, model, state = _equinox_model()
  x, key = _normal(6, (2, 4, 16)), jax.random.key(1)

  def loss(model, state, x, key):
    batched = jax.vmap(model, axis_name="batch", in_axes=(0, None, None), out_axes=(0, None))
    out, state = batched(x, state, key)
    return jnp.mean(out**2), state

  step = eqx.filter_value_and_grad(loss, has_aux=True)
  with jax.numpy_dtype_promotion("standard"):
    with jax.default_matmul_precision("highest"):  # the float32 policy's products (TF32 on GPUs otherwise)
      exact = eqx.filter_jit(step)(model, state, x, key)
    same = eqx.filter_jit(precision.autocast(step, "c=f32,level=2"))(model, state, x, key)
    mixed = eqx.filter_jit(eqx.filter_value_and_grad(precision.autocast(loss, "c=bf16"), has_aux=True))(
      model, state, x, key
    )
  assert_same_floats(eqx.filter(same, eqx.is_array), eqx.filter(exact, eqx.is_array))
  (value, _), grads = mixed
  (want, _), _ = exact
  assert float(value) != float(want) and abs(float(value) - float(want)) < 0.05 * abs(float(want))
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(eqx.filter(grads, eqx.is_array)))


def test_equinox_module_fields_that_are_python_numbers_stay_static():
  """The fast check of the same rule: a module's int (a reshape), float and bool fields."""
  eqx = pytest.importorskip("equinox")

  class Heads(eqx.Module):
    w: jax.Array
    heads: int = 2
    rate: float = 0.5
    inference: bool = False

    def __call__(self, x):
      h = (x @ self.w).reshape(x.shape[0], self.heads, -1)
      return h if self.inference else jnp.tanh(h) * self.rate

  module, x = Heads(_normal(7, (4, 8))), _normal(8, (3, 4))
  for policy in ("c=f32", "c=bf16"):
    out = eqx.filter_jit(precision.autocast(lambda m, x: m(x), policy))(module, x)
    assert out.shape == (3, 2, 4)
  same = precision.autocast(lambda m: m, "c=bf16")(module)  # returned as given, numbers included
  assert same.heads == 2 and isinstance(same.heads, int) and same.inference is False


def test_an_nnx_batch_norm_keeps_its_statistics():
  """The fast check of the NNX rule: one BatchNorm called eagerly under bfloat16."""
  nnx = pytest.importorskip("flax.nnx")
  bn, x = nnx.BatchNorm(4, rngs=nnx.Rngs(0)), _normal(9, (8, 4), 3.0)
  precision.autocast(lambda m, x: jnp.sum(m(x)), "c=bf16")(bn, x)
  want = precision.round((1 - 0.99) * jnp.mean(precision.round(x, "bfloat16"), axis=0), "bfloat16")
  assert not np.array_equal(np.asarray(bn.mean[...]), np.zeros(4, np.float32))
  np.testing.assert_allclose(
    np.asarray(bn.mean[...]), np.asarray(want), rtol=2**-6
  )  # momentum 0.99; a few bfloat16 roundings
