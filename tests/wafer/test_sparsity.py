"""Weight sparsity (`wafer.sparsity`): the invariants Cerebras' library keeps, over generated tensors,
optimizers and schedules, and a run that resumes bit for bit.

The reference semantics are cerebras_pytorch 2.10.0's ``sparse`` package (``docs/guides/sparsity.md``):
exactly ``floor((1 - s) N)`` weights kept per tensor; pruned weights, their gradients and their
optimizer state exactly 0 after every step; a dynamic update keeps the count, drops the smallest
``|W|`` and grows where the score (RigL: ``|dL/dW|``) is largest.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models.mlp import example_run
from tests.values import examples
from wafer.config.optimizer import _standard_promotion  # optax's transforms under standard promotion
from wafer.sparsity import (
  DropFraction,
  Group,
  SparsityState,
  UpdateSchedule,
  keep_count,
  masks,
  sparsify,
  top_mask,
)
from wafer.train import run

shapes = st.sampled_from([(1,), (7,), (3, 5), (2, 9), (8, 8), (1, 4, 3), (5, 2, 7)])  # few: each compiles
levels_st = st.sampled_from([0.0, 0.1, 0.5, 0.75, 0.9, 0.99])


def _levels(level):
  return lambda params: jax.tree.map(lambda x: level if x.ndim > 1 else 0.0, params)


@settings(max_examples=examples(4), deadline=None)
@given(shape=shapes, level=levels_st, seed=st.integers(0, 2**16), method=st.sampled_from(["random", "topk"]))
def test_a_mask_keeps_exactly_floor_of_one_minus_s_times_n(shape, level, seed, method):
  params = {"w": jax.random.normal(jax.random.key(seed), (2, *shape))}
  tx = sparsify(_standard_promotion(optax.sgd(0.1)), _levels(level), Group(init_method=method), seed=seed)
  m = masks(tx.init(params))["w"]
  n = math.prod(m.shape)
  assert int(jnp.sum(m)) == keep_count(n, level) == int(np.float32(np.float32(1 - level) * np.float32(n)))
  if method == "topk":  # the kept weights are the largest |W|
    w = np.abs(np.asarray(params["w"]))
    kept, pruned = w[np.asarray(m)], w[~np.asarray(m)]
    assert kept.size == 0 or pruned.size == 0 or kept.min() >= pruned.max()


def test_random_masks_are_uniform_subsets_and_differ_by_seed():
  params = {"w": jnp.ones((64, 64))}
  draws = [
    np.asarray(
      masks(sparsify(_standard_promotion(optax.sgd(0.1)), _levels(0.75), Group(), seed=s).init(params))["w"]
    )
    for s in range(8)
  ]
  assert all(d.sum() == 1024 for d in draws)
  assert len({d.tobytes() for d in draws}) == 8
  frequency = np.mean(draws, axis=0)  # each position kept with probability 1/4: no row or column bias
  assert abs(frequency.mean(axis=0) - 0.25).max() < 0.12 and abs(frequency.mean(axis=1) - 0.25).max() < 0.12


@settings(max_examples=examples(20), deadline=None)
@given(scores=st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=40), k=st.integers(0, 45))
def test_top_mask_chooses_the_k_largest(scores, k):
  x = jnp.asarray(scores, jnp.float32)
  m = np.asarray(top_mask(x, k))
  assert m.sum() == min(k, len(scores))
  chosen, rest = np.asarray(x)[m], np.asarray(x)[~m]
  assert chosen.size == 0 or rest.size == 0 or chosen.min() >= rest.max()


def _loss(params, batch):
  h = jnp.tanh(batch @ params["a"] + params["b"][None])
  return jnp.mean((h @ params["c"]) ** 2)


def _params(seed):
  k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
  return {
    "a": jax.random.normal(k1, (6, 8)),
    "b": jax.random.normal(k2, (8,)),
    "c": jax.random.normal(k3, (8, 3)),
  }


def _train(tx, params, steps, seed=0, *, jit=True):
  """``steps`` steps as `wafer.train` runs them: prune, update, apply, after_step (jitted, or op by op
  for a bit-for-bit comparison with a reference run op by op)."""
  state = tx.init(params)
  params = tx.prune(params, state)

  def step(params, state, batch):
    grads = jax.grad(_loss)(params, batch)
    updates, state = tx.update(grads, state, params)
    params, state = tx.after_step(optax.apply_updates(params, updates), state, grads)
    return params, state, grads

  step = jax.jit(step) if jit else step
  history = []
  for t in range(steps):
    params, state, grads = step(
      params, state, jax.random.normal(jax.random.fold_in(jax.random.key(seed), t), (5, 6))
    )
    history.append((params, state, grads))
  return params, state, history


OPTIMIZERS = {
  "sgd+momentum": lambda: _standard_promotion(optax.sgd(0.1, momentum=0.9)),
  "adam": lambda: _standard_promotion(optax.adam(0.05)),
  "sgd+clip": lambda: _standard_promotion(
    optax.chain(optax.clip_by_global_norm(0.1), optax.sgd(0.1))
  ),  # clips masked grads
  "adamw+decay+clip": lambda: _standard_promotion(
    optax.chain(optax.clip_by_global_norm(0.5), optax.adamw(0.05, weight_decay=0.1))
  ),
}


@settings(max_examples=examples(4), deadline=None)
@given(
  name=st.sampled_from(sorted(OPTIMIZERS)),
  level=st.sampled_from([0.25, 0.5, 0.9]),
  seed=st.integers(0, 1000),
)
def test_static_sparsity_is_the_dense_optimizer_on_the_masked_model(name, level, seed):
  """Static masks: the run equals, bit for bit, the plain optimizer training ``W * M`` from ``W0 * M``
  (its gradients are ``g * M``, so pruned entries never move), and Adam's moments are 0 where pruned."""
  tx = sparsify(OPTIMIZERS[name](), _levels(level), Group(), seed=seed)
  params, state, _ = _train(tx, _params(seed), 6, seed, jit=False)
  m = masks(state)

  ref_tx = OPTIMIZERS[name]()
  m_float = jax.tree.map(lambda k: k.astype(jnp.float32), m)
  ref = jax.tree.map(lambda p, k: p * k, _params(seed), m_float)
  ref_state = ref_tx.init(ref)
  for t in range(6):
    batch = jax.random.normal(jax.random.fold_in(jax.random.key(seed), t), (5, 6))
    grads = jax.grad(lambda p, b: _loss(jax.tree.map(lambda x, k: x * k, p, m_float), b))(ref, batch)
    updates, ref_state = ref_tx.update(grads, ref_state, ref)
    ref = optax.apply_updates(ref, updates)
  for key in params:
    np.testing.assert_array_equal(np.asarray(params[key]), np.asarray(ref[key]), err_msg=key)
  for key in ("a", "c"):
    assert not np.any(np.asarray(params[key])[~np.asarray(m[key])])
  for leaf_tree in jax.tree.leaves(
    state.inner, is_leaf=lambda x: isinstance(x, dict) and set(x) == {"a", "b", "c"}
  ):
    if isinstance(leaf_tree, dict):
      for key in ("a", "c"):
        assert not np.any(np.asarray(leaf_tree[key])[~np.asarray(m[key])]), (name, key)


def test_sparsity_zero_is_the_inner_optimizer_bit_for_bit():
  inner = _standard_promotion(optax.adamw(0.05, weight_decay=0.1))
  params, _, _ = _train(sparsify(inner, _levels(0.0), Group(algorithm="rigl")), _params(3), 5, 3, jit=False)
  ref, state = _params(3), inner.init(_params(3))
  for t in range(5):
    batch = jax.random.normal(jax.random.fold_in(jax.random.key(3), t), (5, 6))
    updates, state = inner.update(jax.grad(_loss)(ref, batch), state, ref)
    ref = optax.apply_updates(ref, updates)
  for key in params:
    np.testing.assert_array_equal(np.asarray(params[key]), np.asarray(ref[key]))


@settings(max_examples=examples(6), deadline=None)
@given(
  algorithm=st.sampled_from(["set", "rigl"]),
  level=st.sampled_from([0.25, 0.5, 0.75]),
  freq=st.integers(1, 3),
  seed=st.integers(0, 1000),
)
def test_a_dynamic_update_keeps_the_count_and_follows_its_rule(algorithm, level, freq, seed):
  """On update steps only: the count per tensor is unchanged; the survivors are the largest |W| of
  the old mask; grown weights are 0 with zero moments; RigL grows where |dL/dW| is largest."""
  d = 0.3
  group = Group(algorithm=algorithm, drop_fraction=DropFraction(d), update=UpdateSchedule(freq=freq, stop=7))
  tx = sparsify(_standard_promotion(optax.adam(0.05)), _levels(level), group, seed=seed)
  params0 = _params(seed)
  state0 = tx.init(params0)
  _, _, history = _train(tx, params0, 8, seed)
  before = masks(state0)
  for s, (params, state, grads) in enumerate(history, start=1):
    after = masks(state)
    assert int(state.step) == s
    for key in ("a", "c"):
      old, new = np.asarray(before[key]), np.asarray(after[key])
      assert new.sum() == old.sum() == keep_count(old.size, level)
      updated = s % freq == 0 and s < 7
      if not updated:
        assert (old == new).all(), (s, key)
        continue
      k_keep = int(np.floor(np.float32(1 - d) * np.float32(old.sum())))
      w_prev = np.abs(np.asarray(history[s - 2][0][key] if s > 1 else tx.prune(params0, state0)[key]))
      survivors = old & new
      assert survivors.sum() >= k_keep
      grown = new & ~old
      assert not np.any(np.asarray(params[key])[grown])  # newly grown weights start at 0
      mu = state.inner[0].mu[key]  # optax.adam: chain(scale_by_adam, scale)
      assert not np.any(np.asarray(mu)[~new]) and not np.any(np.asarray(mu)[grown])
      if algorithm == "rigl" and grown.any():
        g = np.abs(np.asarray(grads[key]))
        outside = ~new & ~old
        assert outside.sum() == 0 or g[grown].min() >= g[outside].max()
      del w_prev
    before = after


def test_survivors_are_the_largest_weights_of_the_old_mask():
  """One RigL update by hand: W = 1..8, all kept but the last two; drop fraction 1/2 keeps 3 of 6."""
  params = {"w": jnp.arange(1.0, 9.0).reshape(2, 4)}
  group = Group(
    algorithm="rigl", init_method="topk", drop_fraction=DropFraction(0.5), update=UpdateSchedule(freq=1)
  )
  tx = sparsify(_standard_promotion(optax.sgd(0.0)), _levels(0.25), group)
  state = tx.init(params)
  assert np.asarray(masks(state)["w"]).tolist() == [[False, False, True, True], [True, True, True, True]]
  params = tx.prune(params, state)
  grads = {"w": jnp.array([[9.0, 8.0, 0.0, 100.0], [0.0, 0.0, 0.0, 7.0]])}
  updates, state = tx.update(grads, state, params)
  params, state = tx.after_step(optax.apply_updates(params, updates), state, grads)
  # keep |W| 8, 7, 6; grow the 3 largest |g| among the rest, the just-dropped 4 included: 100 (W = 4 keeps
  # its value), 9, 8 (pruned before: they start at 0)
  assert np.asarray(masks(state)["w"]).tolist() == [[True, True, False, True], [False, True, True, True]]
  assert np.asarray(params["w"]).tolist() == [[0.0, 0.0, 0.0, 4.0], [0.0, 6.0, 7.0, 8.0]]


def test_the_cosine_drop_fraction_gives_cerebras_counts():
  """``floor((1 - d(s)) K)`` kept of a 768 x 768 tensor at 75 %, for the modelzoo files' cosine
  (init 0.3, half period 3584): dropped counts computed from the formula in exact arithmetic."""
  df = DropFraction(0.3, half_period=3584)
  k = keep_count(768 * 768, 0.75)
  for s in (100, 1800, 3500):
    exact = 0.15 * math.cos(math.pi * s / 3584) + 0.15
    dropped = k - int(np.floor(np.float32(1 - df(s)) * np.float32(k)))
    assert dropped == k - math.floor((1 - exact) * k), s
  assert k - int(np.floor(np.float32(1 - df(100)) * np.float32(k))) == 44152
  assert UpdateSchedule(freq=100, stop=3584).describe() == "100, 200, ... before 3584"
  assert [s for s in range(1, 4000) if UpdateSchedule(freq=100, stop=3584).is_update(s)][-1] == 3500


def test_a_dynamic_group_starting_later_is_dense_until_its_first_update():
  """Cerebras starts such a group dense; each update keeps ``floor((1 - d) K)`` and grows only up to
  the target, so the 6 x 8 tensor at 50 % goes 48 -> 33 -> 24 (``floor(0.7 * 33) = 23``, one grown)."""
  group = Group(algorithm="set", update=UpdateSchedule(freq=2, start=2))
  tx = sparsify(_standard_promotion(optax.sgd(0.1)), _levels(0.5), group)
  _, _, history = _train(tx, _params(0), 4)
  counts = [int(jnp.sum(masks(state)["a"])) for _, state, _ in history]
  assert counts == [48, 33, 33, 24]


def _sparse_example(model_dir, **overrides):
  task, runconfig, _, loss_scale, policy = example_run(str(model_dir), **overrides)
  group = Group(
    algorithm="rigl", drop_fraction=DropFraction(0.3, half_period=20), update=UpdateSchedule(freq=3)
  )
  tx = sparsify(_standard_promotion(optax.adam(0.01)), _levels(0.5), group, seed=7)
  return task, runconfig, tx, loss_scale, policy


@pytest.mark.slow  # three short runs
def test_a_sparse_run_resumes_bit_for_bit_with_its_masks(tmp_path):
  whole = run(
    *_sparse_example(tmp_path / "whole", max_steps=12, checkpoint_steps=5, log_steps=4), progress=False
  )
  run(*_sparse_example(tmp_path / "parts", max_steps=7, checkpoint_steps=5, log_steps=4), progress=False)
  resumed = run(
    *_sparse_example(tmp_path / "parts", max_steps=12, checkpoint_steps=5, log_steps=4), progress=False
  )
  assert resumed["final_step"] == 12
  for x, y in zip(jax.tree.leaves(resumed["params"]), jax.tree.leaves(whole["params"]), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  kernels = [x for x in jax.tree.leaves(whole["params"]) if x.ndim > 1]
  assert kernels and all(int(jnp.sum(x != 0)) <= keep_count(x.size, 0.5) for x in kernels)


def test_a_skipped_step_neither_counts_nor_updates_the_masks():
  """Non-finite gradients (dynamic loss scaling): params, masks and the update counter are held."""
  import precision
  from wafer.train import Task, initial_state, make_train_step

  task = Task("t", lambda key: _params(0), lambda p, b: _loss(p, b) * b[0, 0], lambda seed: None, 5)
  group = Group(algorithm="set", update=UpdateSchedule(freq=1))
  tx = sparsify(_standard_promotion(optax.adam(0.05)), _levels(0.5), group)
  state = initial_state(task, tx, precision.DynamicLossScale.create("float16"), jax.random.key(0))
  for key in ("a", "c"):  # the initial weights are pruned
    assert not np.any(np.asarray(state.params[key])[~np.asarray(masks(state.opt_state)[key])])
  step = jax.jit(make_train_step(task, tx, precision.Policy(compute="float32")))
  bad = jnp.full((5, 6), jnp.inf)
  held, metrics = step(state, bad)
  assert bool(metrics["skipped"])
  assert int(held.opt_state.step) == 0
  for x, y in zip(
    jax.tree.leaves(masks(held.opt_state)), jax.tree.leaves(masks(state.opt_state)), strict=True
  ):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  good, metrics = step(state, jnp.ones((5, 6)))
  assert not bool(metrics["skipped"]) and int(good.opt_state.step) == 1
  assert isinstance(good.opt_state, SparsityState)


@jax.custom_vjp
def _sum_inf_where_zero(w):
  return jnp.sum(w)


_sum_inf_where_zero.defvjp(
  lambda w: (jnp.sum(w), w), lambda w, g: (jnp.where(w == 0, jnp.float32(jnp.inf), g * jnp.ones_like(w)),)
)


def test_non_finite_gradients_of_pruned_weights_skip_no_step():
  """Cerebras selects the pruned gradients away before the loss scaling sees them: an inf there (here
  every zero weight's gradient) neither skips the step nor reaches a weight."""
  import precision
  from wafer.train import Task, initial_state, make_train_step

  def loss(p, batch):
    return _sum_inf_where_zero(p["a"]) * batch[0, 0] + _loss(p, batch)

  task = Task("t", lambda key: _params(1), loss, lambda seed: None, 5)
  tx = sparsify(_standard_promotion(optax.adam(0.05)), _levels(0.5), Group())
  state = initial_state(task, tx, precision.DynamicLossScale.create("float16"), jax.random.key(0))
  new, metrics = jax.jit(make_train_step(task, tx, precision.Policy(compute="float32")))(
    state, jnp.ones((5, 6))
  )
  assert not bool(metrics["skipped"]) and int(new.opt_state.step) == 1
  assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(new.params))
  assert not np.array_equal(np.asarray(new.params["a"]), np.asarray(state.params["a"]))


def test_rprop_weights_grown_from_zero_train_again():
  """Rprop's step sizes of pruned weights restart at the initial step (a zero step size never grows):
  the weights SET grows at its update move off 0 in the next steps, as with Adam."""
  group = Group(algorithm="set", update=UpdateSchedule(freq=3, stop=4))
  for inner in (optax.rprop(0.01), optax.adam(0.01)):
    tx = sparsify(_standard_promotion(inner), _levels(0.5), group, seed=2)
    _, state, history = _train(tx, _params(2), 10, 2)
    before, after = np.asarray(masks(history[1][1])["a"]), np.asarray(masks(history[2][1])["a"])
    grown = after & ~before
    assert grown.any()
    final = np.asarray(history[-1][0]["a"])
    assert np.count_nonzero(final[grown]) >= 0.75 * grown.sum(), (
      inner
    )  # all stayed 0 when the step sizes were


def test_bad_groups_are_refused():
  with pytest.raises(ValueError, match="algorithm must be one of static, set, rigl"):
    Group(algorithm="gmp")
  with pytest.raises(ValueError, match="several sparsity groups need group_of"):
    sparsify(_standard_promotion(optax.sgd(0.1)), _levels(0.5), [Group(), Group()])


def test_the_note_of_sparsity_zero_says_nothing_is_sparse():
  """``sparsity: 0`` described a RigL schedule for "0 tensors ... at sparsity  (0 of 0 weights
  kept)", with the level blank; it now says that no tensor is sparse."""
  params = {"w": jnp.ones((4, 4)), "b": jnp.ones(4)}
  note = sparsify(_standard_promotion(optax.sgd(0.1)), _levels(0.0), Group(algorithm="rigl")).describe(params)
  assert "no tensor of 2 is sparse" in note and "rigl has no effect" in note, note
  assert "at sparsity  (" not in note and "masks change" not in note, note
  dense = sparsify(_standard_promotion(optax.sgd(0.1)), _levels(0.5), Group()).describe(params)
  assert "at sparsity 0.5" in dense and "no tensor" not in dense, dense
  # with several groups, an empty one is named as a group (it said "no tensor of 3 is sparse" next to
  # "1 tensors of 3 at sparsity 0.5")
  two = sparsify(
    _standard_promotion(optax.sgd(0.1)),
    lambda p: {"w": 0.5, "b": 0.0},
    [Group(algorithm="rigl"), Group()],
    group_of=lambda p: {"w": 1, "b": 0},
  ).describe(params)
  assert "group 0 (rigl) makes no tensor sparse" in two and "no tensor of" not in two, two
  assert "1 tensors of 2 at sparsity 0.5" in two, two
