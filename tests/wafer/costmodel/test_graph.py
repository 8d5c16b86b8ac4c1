"""Graph extraction: exact FLOP counts, kernels by name and by pattern, loops, casts, abstract tracing."""

import resource

import jax
import jax.numpy as jnp
import pytest
from flax import linen as nn
from jax import lax

import precision
from tests.wafer.costmodel.helpers import batch_args, mlp_params, mlp_train_step, sds
from wafer.costmodel import extract
from wafer.costmodel.workloads import get_workload


def _flops(graph, phases=("fwd", "bwd")):
  """Matrix-product FLOP of the whole traced step (all kernels and instances, at the traced batch)."""
  return sum(k.count * k.matmul_flops(1.0, phases) for k in graph.kernels)


def test_plain_matmul_flops():
  b, k, n = 8, 16, 32
  g = extract(lambda x, w: x @ w, (sds(b, k), sds(k, n)), batch_argnums=(0,), compute_bits=16)
  assert _flops(g, ("fwd",)) == 2 * b * k * n
  assert _flops(g, ("bwd",)) == 0
  assert g.flops_per_sample(("fwd",)) == 2 * k * n
  [kernel] = g.kernels
  [mm] = kernel.matmuls
  assert (mm.m.at_trace, mm.k.at_trace, mm.n.at_trace) == (b, k, n)
  assert (mm.m.exponent, mm.k.exponent, mm.n.exponent) == (1, 0, 0)  # only m grows with the batch
  assert mm.weight and kernel.weight_elements() == k * n


def test_mlp_train_step_flops():
  b, t, d, h, o = 4, 8, 16, 64, 8
  step = mlp_train_step([d, h, o])
  g = extract(step, (mlp_params([d, h, o]), *batch_args(b, t, d, o)), batch_argnums=(1, 2), compute_bits=16)
  tokens = b * t
  # forward 2TDH + 2THO; backward dW2 = 2HTO, dh = 2TOH, dW1 = 2DTH (no gradient for the input)
  assert _flops(g, ("fwd",)) == 2 * tokens * d * h + 2 * tokens * h * o
  assert _flops(g, ("bwd",)) == 2 * tokens * h * o * 2 + 2 * tokens * d * h
  assert g.flops_per_sample() == (4 * d * h + 6 * h * o) * t
  assert g.param_elements == d * h + h * o


def test_attention_flops():
  b, s, nh, dh = 2, 16, 4, 8
  d = nh * dh

  def attention(w, x):
    q, k, v = (jnp.einsum("bsd,de->bse", x, w[i]).reshape(x.shape[0], s, nh, dh) for i in range(3))
    p = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k), axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", p, v)

  g = extract(attention, (sds(3, d, d), sds(b, s, d)), batch_argnums=(1,), compute_bits=16)
  expected = 3 * 2 * b * s * d * d + 2 * (2 * b * nh * s * s * dh)
  assert _flops(g, ("fwd",)) == expected
  products = [mm for k in g.kernels for mm in k.matmuls]
  batched = [mm for mm in products if mm.instances.at_trace > 1]
  assert len(batched) == 2 and all(
    mm.instances.at_trace == b * nh and mm.instances.exponent == 1 for mm in batched
  )


def test_a_step_that_fixes_its_batch_falls_back_to_linear_scaling():
  g = extract(
    lambda w, x: (x.reshape(4, 2, 8) @ w).sum(), (sds(8, 8), sds(4, 16)), batch_argnums=(1,), compute_bits=16
  )
  assert not g.exact_scaling and any("linear" in note for note in g.notes)
  assert _flops(g, ("fwd",)) == 2 * 4 * 2 * 8 * 8
  assert g.flops_per_sample(("fwd",)) * 8 == pytest.approx(2 * _flops(g, ("fwd",)))  # linear in the batch


def test_elementwise_counts_and_what_is_not_work():
  n = 1000

  def f(x, i):
    y = jnp.tanh(x) * 2.0 + 1.0  # 3 float ops per element
    j = (i + 3) * 2  # integer index arithmetic: not work
    return y, j

  g = extract(f, (sds(n), sds(n, dtype=jnp.int32)), batch_argnums=(0, 1), compute_bits=16)
  assert sum(k.vector_ops(1.0) for k in g.kernels) == 3 * n
  kinds = {key[1] for k in g.kernels for key in k.vector}
  assert "transcendental" in kinds


def test_fake_cast_costs_one_cast_and_precision_round_nothing():
  n = 256

  @jax.jit
  def truncate_to_bfloat16(x):  # another library's emulated format: float -> bits -> float in a call
    bits = lax.bitcast_convert_type(x, jnp.uint32) & jnp.uint32(0xFFFF0000)
    return lax.bitcast_convert_type(bits, jnp.float32)

  g = extract(lambda x: truncate_to_bfloat16(x) * 2.0, (sds(n),), batch_argnums=(0,), compute_bits=16)
  work = {key[1]: v[0] for k in g.kernels for key, v in k.vector.items()}
  assert work == {"cast": n, "vector": n}  # the call's integer ops are not counted
  g = extract(lambda x: precision.round(x, "cbfloat16") * 2.0, (sds(n),), batch_argnums=(0,), compute_bits=16)
  work = {key[1]: v[0] for k in g.kernels for key, v in k.vector.items()}
  assert work == {"vector": n}  # the format the wafer computes in, not an op


def test_scan_multiplies_by_length_and_keeps_one_kernel_with_a_count():
  n_layers, b, d = 6, 4, 32

  def f(ws, x):
    def body(h, w):
      with jax.named_scope("block"):
        return jnp.tanh(h @ w), None

    return lax.scan(body, x, ws)[0].sum()

  g = extract(jax.grad(f), (sds(n_layers, d, d), sds(b, d)), batch_argnums=(1,), compute_bits=16)
  [block] = [k for k in g.kernels if k.name == "block"]
  assert block.count == n_layers
  assert block.weight_elements() == d * d  # one layer's slice per instance
  assert _flops(g) == n_layers * (2 * b * d * d + 2 * (2 * b * d * d))  # fwd + dW + dX


def test_cond_counts_the_most_expensive_branch_and_while_once():
  d = 16

  def f(w, x):
    y = lax.cond(x[0, 0] > 0, lambda: x @ w @ w, lambda: x * 2.0)
    return lax.while_loop(lambda c: c[0, 0] < 10.0, lambda c: c @ w, y)

  g = extract(f, (sds(d, d), sds(4, d)), batch_argnums=(1,), compute_bits=16)
  assert _flops(g, ("fwd",)) == 3 * 2 * 4 * d * d
  assert any("while" in note for note in g.notes)


def test_kernels_grouped_by_named_scope_with_their_backward():
  widths = [32, 64, 64, 8]
  g = extract(
    mlp_train_step(widths),
    (mlp_params(widths), *batch_args(2, 4, 32, 8)),
    batch_argnums=(1, 2),
    compute_bits=16,
  )
  names = [k.name for k in g.kernels if k.matmuls]
  assert names == ["layer0", "layer1", "layer2"]  # dataflow order
  for k in g.kernels:
    if k.matmuls:
      phases = {mm.phase for mm in k.matmuls}
      assert phases == {"fwd", "bwd"}, k.name
  assert any(k.name == "weight_update" for k in g.kernels)  # unnamed SGD update, batch independent


def test_kernels_grouped_by_flax_module_path_and_depth():
  class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
      x = nn.Dense(64, name="up")(x)
      return nn.Dense(16, name="down")(nn.relu(x))

  class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
      return Block(name="block")(x)

  net = Net()
  params = jax.eval_shape(lambda: net.init(jax.random.key(0), jnp.ones((2, 16))))

  def loss(p, x):
    return jnp.sum(net.apply(p, x) ** 2)

  g = extract(jax.grad(loss), (params, sds(2, 16)), batch_argnums=(1,), compute_bits=16)
  names = {k.name for k in g.kernels if k.matmuls}
  assert names == {"Net/block/up", "Net/block/down"}
  g2 = extract(jax.grad(loss), (params, sds(2, 16)), batch_argnums=(1,), compute_bits=16, kernel_depth=2)
  assert {k.name for k in g2.kernels if k.matmuls} == {"Net/block"}


def test_unnamed_steps_group_by_op_pattern():
  widths = [16, 32, 8]
  g = extract(
    mlp_train_step(widths, names=False),
    (mlp_params(widths), *batch_args(2, 4, 16, 8)),
    batch_argnums=(1, 2),
    compute_bits=16,
  )
  kernels = [k for k in g.kernels if k.matmuls]
  assert [k.name for k in kernels] == ["dot_general_0", "dot_general_1"]
  # each backward product joined the kernel whose weight (or input) it shares
  assert [sorted(mm.phase for mm in k.matmuls) for k in kernels] == [["bwd", "fwd"], ["bwd", "bwd", "fwd"]]


def test_compute_bits_follow_the_format_and_narrow_dtypes():
  x, w = sds(4, 8), sds(8, 8)
  assert (
    extract(lambda x, w: x @ w, (x, w), batch_argnums=(0,), compute_bits=32).kernels[0].matmuls[0].bits == 32
  )
  xb, wb = sds(4, 8, dtype=jnp.bfloat16), sds(8, 8, dtype=jnp.bfloat16)
  assert (
    extract(lambda x, w: x @ w, (xb, wb), batch_argnums=(0,), compute_bits=32).kernels[0].matmuls[0].bits
    == 16
  )


def test_gpt3_175b_traces_abstractly_without_memory():
  before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  fn, args = get_workload("gpt3_175b").example()
  g = extract(fn, args, batch_argnums=(2,), compute_bits=16)
  grown_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
  assert g.param_elements == pytest.approx(175e9, rel=0.02)
  assert grown_kb < 1_000_000  # far below the 700 GB the fp32 parameters alone would take
  assert g.exact_scaling
  layers = [k for k in g.kernels if k.count == 96]
  assert {k.name for k in layers} == {"layers/attn", "layers/mlp"}
  # 6 x params x tokens for the weights plus the attention products, per sample
  n_params_layers = 96 * 12 * 12288**2
  attn = 96 * 3 * 4 * 2048 * 2048 * 12288
  expected = 6 * n_params_layers * 2048 + attn + 6 * 12288 * 50257 * 2048
  assert g.flops_per_sample() == pytest.approx(expected, rel=1e-3)


def test_trace_errors_are_reported():
  from wafer.costmodel import TraceError

  with pytest.raises(TraceError, match="could not trace"):
    extract(lambda x: x.reshape(7, -1), (sds(4, 4),), batch_argnums=(0,), compute_bits=16)
  with pytest.raises(TraceError, match=r"mismatch: argument 1 has axis 0 of size 5 but argument 0 has 4"):
    extract(lambda x, y: x, (sds(4, 2), sds(5, 2)), batch_argnums=(0, 1), compute_bits=16)


def test_a_step_that_cannot_run_on_its_arguments_names_the_users_line():
  from wafer.costmodel import TraceError

  def step(w, x, y):  # x has 64 rows, y 32: the step itself cannot run
    return jnp.mean((x @ w - y[:, None]) ** 2)

  with pytest.raises(TraceError) as info:
    extract(step, (sds(8, 4), sds(64, 8), sds(32)), batch_argnums=(1,), compute_bits=16)
  line = step.__code__.co_firstlineno + 1
  assert f"{__file__}:{line}\n    return jnp.mean((x @ w - y[:, None]) ** 2)" in str(info.value)
  assert "incompatible shapes" in str(info.value)


@pytest.mark.parametrize(
  "policy", ["c=cbfloat16,level=0", "c=bfloat16,level=2", "c=cbfloat16,sr=elementwise"]
)
def test_autocast_roundings_are_the_compute_format_not_work(policy):
  n, d = 8, 32
  f = lambda x, w: jnp.tanh(x @ w)
  mixed = precision.autocast(f, policy)
  if "sr=" in policy:  # stochastic roundings take a key (``precision_round_bits``)
    mixed = lambda x, w, mixed=mixed: mixed(x, w, rounding_key=jax.random.key(0))
  g = extract(mixed, (sds(n, d), sds(d, d)), batch_argnums=(0,), compute_bits=16)
  plain = extract(f, (sds(n, d), sds(d, d)), batch_argnums=(0,), compute_bits=16)
  work: dict[str, float] = {}
  for k in g.kernels:
    for key, v in k.vector.items():
      work[key[1]] = work.get(key[1], 0) + v[0]
  # the roundings of x, w, the product and tanh's result cost nothing; tanh's n*d elements remain
  assert "cast" not in work and sum(work.values()) == n * d
  # w seen through its rounding is still the weight
  assert [k.weight_bytes() for k in g.kernels] == [k.weight_bytes() for k in plain.kernels]
  assert sum(k.weight_bytes() for k in g.kernels) == d * d * 2


def test_prng_keys_in_the_step_and_in_its_arguments():
  """Dropout-style steps: typed PRNG keys (extended dtypes) inside the step and among its arguments."""
  import wafer

  def step(w, x, key):
    mask = jax.random.bernoulli(jax.random.fold_in(key, 1), 0.9, x.shape)
    return jnp.sum(jnp.where(mask, x, 0.0) @ w)

  w, x = jnp.ones((64, 64)), jnp.ones((16, 64))
  report = wafer.estimate(jax.grad(step), w, x, jax.random.key(0), batch_size=16, batch_argnums=1)
  assert report.samples_per_sec > 0
  raw = wafer.estimate(
    jax.grad(lambda w, x, k: step(w, x, jax.random.wrap_key_data(k))),
    w,
    x,
    jax.random.key_data(jax.random.key(0)),
    batch_size=16,
    batch_argnums=1,
  )
  assert raw.samples_per_sec > 0
