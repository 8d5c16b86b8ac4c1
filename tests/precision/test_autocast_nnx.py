"""autocast on a Flax NNX transformer: loss and gradients against float32, per compute format."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import precision
from models.encoder import Encoder, EncoderConfig, token_loss
from tests.tolerances import AUTOCAST_TRANSFORMER

CONFIG = EncoderConfig(
  vocab_size=128,
  max_position_embeddings=32,
  hidden_size=64,
  num_hidden_layers=2,
  num_heads=4,
  filter_size=128,
)


@pytest.fixture(scope="module")
def setup():
  graphdef, params = nnx.split(Encoder(CONFIG, rngs=nnx.Rngs(0)))
  tokens = jax.random.randint(jax.random.key(1), (4, 32), 0, CONFIG.vocab_size, jnp.int32)
  targets = jnp.roll(tokens, 1, axis=1)

  def loss(params, tokens, targets):  # plain float32 model code: no casts anywhere
    return token_loss(nnx.merge(graphdef, params), tokens, targets)

  reference = jax.jit(jax.value_and_grad(loss))(params, tokens, targets)
  return loss, params, (tokens, targets), reference


def _flat(tree):
  return jnp.concatenate([x.ravel() for x in jax.tree.leaves(tree)])


CASES = [
  (fmt, transform, 1)
  for fmt in sorted(AUTOCAST_TRANSFORMER)
  for transform in ("grad(autocast)", "autocast(grad)")
]
CASES += [("cbfloat16", "grad(autocast)", 0), ("cbfloat16", "grad(autocast)", 2)]


@pytest.mark.parametrize(
  "fmt, transform, level",
  [  # cbfloat16 at level 1 both ways by default; the other formats and levels are slow (2 s each)
    pytest.param(*case, marks=() if case[::2] == ("cbfloat16", 1) else pytest.mark.slow) for case in CASES
  ],
)
def test_loss_and_gradients_against_float32(setup, fmt, transform, level):
  loss, params, batch, (loss32, grads32) = setup
  tol = AUTOCAST_TRANSFORMER[fmt]
  policy = precision.Policy(compute=fmt, level=level, accumulation_block=32)  # chunks at d=64 and 128
  if transform == "grad(autocast)":
    value_and_grad = jax.value_and_grad(precision.autocast(loss, policy))
  else:
    value_and_grad = precision.autocast(jax.value_and_grad(loss), policy)
  value, grads = jax.jit(value_and_grad)(params, *batch)
  assert jax.tree.structure(grads) == jax.tree.structure(grads32)
  assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(grads))  # weights update in float32
  loss_error = abs(float(value) - float(loss32)) / abs(float(loss32))
  g, g32 = _flat(grads), _flat(grads32)
  grad_error = float(jnp.linalg.norm(g - g32) / jnp.linalg.norm(g32))
  assert loss_error <= tol.loss_rtol, (loss_error, tol.reason)
  assert grad_error <= tol.grad_rtol, (grad_error, tol.reason)
  # Rounding happened: the gradients are far from float32's, and are compute-format values
  # wherever the last operation was a rounding (matmul weight gradients).
  assert grad_error > 0.5 * tol.grad_rtol / 8
  kernel = grads["layers"][0]["ffn_in"]["kernel"][...]
  np.testing.assert_array_equal(kernel, precision.round(kernel, fmt))
  assert np.any(np.asarray(kernel) != np.asarray(grads32["layers"][0]["ffn_in"]["kernel"][...]))


def test_cast_report_on_the_transformer(setup):
  loss, params, batch, _ = setup
  report = precision.cast_report(jax.value_and_grad(loss), precision.Policy(level=1), params, *batch)
  assert report.unknown_primitives == {}
  assert report.by_class["matmul"].rounded > 0 and report.by_class["attention_matmul"].rounded > 0
  assert report.by_class["attention_softmax"].kept_float32 > 0  # level 1: softmax in float32
  assert report.by_class["reduction"].kept_float32 > 0


def test_a_module_given_as_the_function_keeps_its_state_changes():
  """``autocast(model, p)(x)`` and ``autocast(model.__call__, p)(x)`` of a module with BatchNorm or
  Dropout failed with Flax's bare TraceContextError; a closure over one now says to pass it."""
  from flax import nnx

  class Net(nnx.Module):
    def __init__(self, rngs):
      self.l1 = nnx.Linear(16, 8, rngs=rngs)
      self.bn = nnx.BatchNorm(8, rngs=rngs)
      self.do = nnx.Dropout(0.5, rngs=rngs)

    def __call__(self, x):
      return self.do(self.bn(self.l1(x)))

  x = jax.random.normal(jax.random.key(1), (4, 16))
  ref = Net(nnx.Rngs(0))
  want = precision.autocast(lambda m, x: m(x), "c=cb16")(ref, x)
  for how in ("module", "bound method"):
    net = Net(nnx.Rngs(0))
    fn = net if how == "module" else net.__call__
    got = precision.autocast(fn, "c=cb16")(x)
    assert np.array_equal(got, want), how
    assert np.array_equal(net.bn.mean[...], ref.bn.mean[...]) and net.bn.mean[...].any(), how
    assert int(net.do.rngs.count[...]) == int(ref.do.rngs.count[...]) > 0, how
  closed = Net(nnx.Rngs(0))
  with pytest.raises(
    TypeError, match=r"pass the module as an argument.*autocast\(lambda model, x: model\(x\)"
  ):
    precision.autocast(lambda x: closed(x), "c=cb16")(x)
  # the two reports take a module as the function too (they raised Flax's bare error)
  net = Net(nnx.Rngs(0))
  want = precision.cast_report(lambda m, x: m(x), "c=cb16", net, x).to_dict()
  assert precision.cast_report(net, "c=cb16", x).to_dict() == want
  assert precision.cast_report(net.__call__, "c=cb16", x).to_dict() == want
  assert len(precision.numerics_report(net, "c=cb16", x).rows) > 0
  with pytest.raises(TypeError, match=r"cast_report\(<lambda>\): .*pass the module as an argument"):
    precision.cast_report(lambda x: closed(x), "c=cb16", x)


def test_a_module_changed_inside_a_jax_jit_that_was_not_given_it_says_to_use_nnx_jit():
  """``jax.jit(autocast(model, p))`` of a module with BatchNorm raised Flax's bare TraceContextError
  when autocast wrote the new statistics back; it now says what to write instead, and that works."""

  class Net(nnx.Module):
    def __init__(self, rngs):
      self.l1 = nnx.Linear(16, 8, rngs=rngs)
      self.bn = nnx.BatchNorm(8, rngs=rngs)

    def __call__(self, x):
      return self.bn(self.l1(x))

  x = jax.random.normal(jax.random.key(1), (4, 16))
  net = Net(nnx.Rngs(0))
  with pytest.raises(
    TypeError,
    match=r"autocast\(Net\) runs inside a JAX transformation.*Pass the module as an argument.*nnx\.jit",
  ):
    jax.jit(precision.autocast(net, "c=cb16"))(x)
  fixed = Net(nnx.Rngs(0))
  got = nnx.jit(lambda model, x: precision.autocast(model, "c=cb16")(x))(fixed, x)
  ref = Net(nnx.Rngs(0))
  want = precision.autocast(ref, "c=cb16")(x)
  assert np.array_equal(got, want)
  assert np.array_equal(fixed.bn.mean[...], ref.bn.mean[...]) and fixed.bn.mean[...].any()
  net.eval()  # the other way out the message names: nothing changes, so nothing is written back
  assert jax.jit(precision.autocast(net, "c=cb16"))(x).shape == (4, 8)


def test_a_module_given_as_the_function_keeps_its_static_arguments_in_place():
  """``static_argnums`` counts the module's own arguments: shifted past the module for positions
  from the front, unchanged from the end (a -1 became 0, the module's slot)."""

  class Scaled(nnx.Module):
    def __init__(self, rngs):
      self.l1 = nnx.Linear(4, 4, rngs=rngs)
      self.bn = nnx.BatchNorm(4, rngs=rngs)

    def __call__(self, *args):  # (no named positions: a -1 stays -1)
      return self.bn(self.l1(args[0])) * args[-1]

  x = jax.random.normal(jax.random.key(0), (2, 4))
  want = precision.autocast(lambda m, x, s: m(x, s), "c=cb16", static_argnums=2)(Scaled(nnx.Rngs(0)), x, 3.0)
  for nums in (1, -1):
    got = precision.autocast(Scaled(nnx.Rngs(0)), "c=cb16", static_argnums=nums)(x, 3.0)
    assert np.array_equal(got, want), nums
