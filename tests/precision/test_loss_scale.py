"""Dynamic and static loss scaling with Cerebras semantics (docs/references.md, "Dynamic loss scaling")."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import precision
from precision import DynamicLossScale, StaticLossScale


def test_defaults_per_format():
  cb = DynamicLossScale.create("cbfloat16")
  f16 = DynamicLossScale.create("float16")
  assert float(cb.loss_scale) == cb.max_loss_scale == 2.0**31
  assert float(f16.loss_scale) == f16.max_loss_scale == 2.0**15
  assert cb.min_loss_scale == 2.0**-14 and cb.steps_per_increase == 2000 and cb.overflow_tolerance == 0
  # the initial scale is min(max_loss_scale, initial_loss_scale)
  assert float(DynamicLossScale.create("fp16", initial_loss_scale=2.0**20).loss_scale) == 2.0**15


def run_sequence(ls, finite_flags):
  """Scales after each step, under jit + scan (no Python branching on traced values)."""

  @jax.jit
  def run(ls, flags):
    def body(state, finite):
      new = state.adjust(finite)
      return new, (new.loss_scale, new.num_skipped_steps)

    return jax.lax.scan(body, ls, flags)

  final, (scales, skipped) = run(ls, jnp.asarray(finite_flags))
  return final, np.asarray(scales).tolist(), np.asarray(skipped).tolist()


def test_injected_overflows_give_the_hand_computed_scales():
  ls = DynamicLossScale.create("float16", initial_loss_scale=8.0, steps_per_increase=3, max_loss_scale=64.0)
  flags = [True, True, True, True, False, True, True, True, True, False, False]
  # Counter +1 then a strict '>': growth on the 4th clean step; each overflow halves and resets.
  expected = [8, 8, 8, 16, 8, 8, 8, 8, 16, 8, 4]
  final, scales, skipped = run_sequence(ls, flags)
  assert scales == expected
  assert skipped == [0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 3]
  assert set(final.state_dict()) == {
    "loss_scale",
    "steps_since_rescale",
    "overflows_since_rescale",
    "num_skipped_steps",
  }


def test_doubles_on_the_2001st_clean_step_and_clamps():
  ls = DynamicLossScale.create("float16", initial_loss_scale=2.0**10)
  _, scales, _ = run_sequence(ls, [True] * 2001)
  assert scales[1999] == 2.0**10 and scales[2000] == 2.0**11
  low = DynamicLossScale.create("float16", initial_loss_scale=2.0**-13)
  _, scales, skipped = run_sequence(low, [False] * 3)
  assert scales == [2.0**-14] * 3 and skipped == [1, 2, 3]
  top = DynamicLossScale.create("cbfloat16")
  _, scales, _ = run_sequence(top, [True] * 2001)
  assert scales[-1] == 2.0**31  # already at the maximum


def test_overflow_tolerance():
  ls = DynamicLossScale.create("float16", initial_loss_scale=16.0, overflow_tolerance=0.5)
  _, scales, _ = run_sequence(ls, [True, False, False])  # 1/2 is not > 0.5; 2/3 is
  assert scales == [16, 16, 8]


@pytest.mark.parametrize(
  "kwargs, fragment",
  [
    (dict(min_loss_scale=2.0**-15), "too small"),
    (dict(overflow_tolerance=-1.0), "overflow_tolerance"),
    (dict(steps_per_increase=0), "steps_per_increase"),
    (dict(min_loss_scale=4.0, max_loss_scale=2.0), "exceeds max_loss_scale"),
    (dict(half_dtype="fp17"), "unknown float format"),
    # a string or a non-finite number is named, not a bare TypeError / "could not convert string"
    (dict(initial_loss_scale="2**15"), r"initial_loss_scale='2\*\*15'; allowed: a finite positive number"),
    (dict(initial_loss_scale=float("inf")), "initial_loss_scale=inf; allowed"),
    (dict(initial_loss_scale=float("nan")), "initial_loss_scale=nan; allowed"),
    (dict(max_loss_scale="big"), "max_loss_scale='big'; allowed"),
    (dict(min_loss_scale=None, max_loss_scale=True), "max_loss_scale=True; allowed"),
    (dict(overflow_tolerance="0.5"), "overflow_tolerance='0.5'; allowed: a finite number >= 0"),
    (
      dict(half_dtype="float16", initial_loss_scale=2.0**-20),
      r"initial_loss_scale=9.5\d*e-07 is below min_loss_scale",
    ),
    # finite in Python, inf as the float32 scale: every loss NaN, and the skip advice misleading
    (dict(initial_loss_scale=1e40, max_loss_scale=1e40), r"max_loss_scale=1e\+40 exceeds float32's largest"),
    (dict(initial_loss_scale=1e39), r"initial_loss_scale=1e\+39 exceeds float32's largest"),
    # a tolerance of 1 or more never backs off: every step could be skipped
    (
      dict(overflow_tolerance=1.0),
      r"overflow_tolerance=1.0; allowed: a fraction from 0 up to, not including, 1",
    ),
    (dict(overflow_tolerance=2), r"overflow_tolerance=2.0; allowed"),
  ],
)
def test_bad_settings_are_explained(kwargs, fragment):
  with pytest.raises(ValueError, match=fragment):
    DynamicLossScale.create(**kwargs)


def test_all_finite_uses_the_global_norm():
  assert bool(precision.all_finite({"a": jnp.ones(3), "b": (jnp.zeros(2),)}))
  assert not bool(precision.all_finite({"a": jnp.array([1.0, jnp.nan])}))
  assert not bool(precision.all_finite([jnp.array([jnp.inf])]))
  # Finite gradients whose squares overflow float32 count as overflow, as on Cerebras.
  assert not bool(precision.all_finite([jnp.array([1e20], jnp.float32)]))


def test_scale_and_unscale():
  ls = StaticLossScale.create(1024.0)
  tree = {"w": jnp.full((2,), 3.0), "n": jnp.arange(2), "h": jnp.ones(2, jnp.float16)}
  scaled = ls.scale(tree)
  assert scaled["w"].tolist() == [3072.0, 3072.0] and scaled["n"].dtype == jnp.int32
  assert scaled["h"].dtype == jnp.float32 and scaled["h"].tolist() == [1024.0, 1024.0]  # loss.float()
  assert ls.unscale(scaled)["w"].tolist() == [3.0, 3.0]
  assert ls.adjust(jnp.asarray(False)) is ls
  with pytest.raises(ValueError, match="positive"):
    StaticLossScale.create(0.0)


@pytest.mark.parametrize("bad", ["1024", None, True, float("inf"), float("nan"), -2.0, [8.0]])
def test_static_loss_scale_names_a_bad_value(bad):
  """StaticLossScale.create("1024") was a bare TypeError ('>' not supported between str and int)."""
  with pytest.raises(ValueError, match=r"loss_scale=.*; allowed: a finite positive number"):
    StaticLossScale.create(bad)


def test_a_scale_beyond_float32_is_refused_and_float32_max_is_not():
  with pytest.raises(ValueError, match=r"loss_scale=1e\+40 exceeds float32's largest number"):
    StaticLossScale.create(1e40)
  top = float(np.finfo(np.float32).max)
  assert np.isfinite(StaticLossScale.create(top).loss_scale)
  assert np.isfinite(
    DynamicLossScale.create("float16", initial_loss_scale=top, max_loss_scale=top).loss_scale
  )


def test_nonfinite_step_keeps_params_and_optimizer_state():
  params = {"w": jnp.ones(3)}
  opt = optax.sgd(0.1, momentum=0.9)  # optax.adam is not clean under strict dtype promotion
  opt_state = opt.init(params)
  grads = {"w": jnp.array([1.0, jnp.inf, 0.0])}
  finite = precision.all_finite(grads)
  updates, new_opt_state = opt.update(grads, opt_state, params)
  new = (optax.apply_updates(params, updates), new_opt_state)
  kept = precision.select_tree(finite, new, (params, opt_state))
  for a, b in zip(jax.tree.leaves(kept), jax.tree.leaves((params, opt_state))):
    np.testing.assert_array_equal(a, b)


def _train(loss_scale, steps=60, skip_nonfinite=True):
  """Linear regression under autocast(float16): the forward pass and, through the cast VJPs of
  the inserted roundings, the backward pass run in float16 (overflowing to inf beyond 65504);
  gradients are unscaled and applied in float32."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((64, 4)).astype(np.float32))
  y = x @ jnp.asarray([1.0, -2.0, 3.0, 0.5]) + 40.0
  params = {"w": jnp.zeros(4), "b": jnp.zeros(())}
  opt = optax.sgd(0.05)
  loss_fn = lambda p: jnp.mean((x @ p["w"] + p["b"] - y) ** 2)
  half_loss = precision.autocast(loss_fn, precision.Policy(compute="float16"))

  @jax.jit
  def step(params, opt_state, ls):
    grads = ls.unscale(jax.grad(lambda p: ls.scale(half_loss(p)))(params))
    finite = precision.all_finite(grads) if skip_nonfinite else jnp.asarray(True)
    updates, new_opt_state = opt.update(grads, opt_state, params)
    params, opt_state = precision.select_tree(
      finite, (optax.apply_updates(params, updates), new_opt_state), (params, opt_state)
    )
    return params, opt_state, ls.adjust(finite), loss_fn(params)

  opt_state = opt.init(params)
  for _ in range(steps):
    params, opt_state, loss_scale, loss = step(params, opt_state, loss_scale)
  return float(loss), loss_scale


def test_float16_training_diverges_without_dls_and_converges_with_it():
  # The first gradients are ~80; times the float16 default scale 2^15 they overflow float16.
  without_dls, _ = _train(StaticLossScale.create(2.0**15), skip_nonfinite=False)
  with_dls, ls = _train(DynamicLossScale.create("float16"))
  assert not np.isfinite(without_dls)  # inf gradients reached the weights
  assert with_dls < 1.0  # from ~1570
  assert int(ls.num_skipped_steps) > 0 and float(ls.loss_scale) < 2.0**15


# ---- gradients of programs written by others: complex weights, integer inputs, keys ----


def test_all_finite_skips_float0_gradients_and_keys():
  """``jax.grad(..., allow_int=True)`` gives integer inputs a float0 gradient, and a train state
  holds PRNG keys: all_finite raised ValueError ("setting an array element with a sequence",
  "Cannot convert_element_type from key<fry>") instead of testing the float leaves."""
  grads = jax.grad(lambda w, n: jnp.sum(w * w), argnums=(0, 1), allow_int=True)(jnp.ones(3), jnp.int32(4))
  assert grads[1].dtype == jax.dtypes.float0
  tree = {"grads": grads, "key": jax.random.key(0), "step": jnp.int32(3)}
  assert bool(precision.all_finite(tree))
  assert not bool(precision.all_finite({**tree, "bad": jnp.array([jnp.inf])}))
  assert bool(jax.jit(precision.all_finite)(tree))


@pytest.mark.parametrize("bad", [complex(1, float("inf")), complex(float("nan"), 0), complex(0, 3e20)])
def test_all_finite_sees_the_imaginary_part(bad):
  """The leaves were converted to float32 with jnp.asarray(g, float32): a complex gradient lost
  its imaginary part (an inf there counted as finite) and NumPy's ComplexWarning, an error under
  pytest's filterwarnings=error, was raised."""
  ok = jnp.array([1 + 2j, -3j], jnp.complex64)
  assert bool(precision.all_finite({"z": ok}))
  assert not bool(precision.all_finite({"z": ok.at[1].set(bad)}))  # 3e20: |g|^2 overflows float32


@pytest.mark.parametrize("ls", [StaticLossScale.create(2.0**20), DynamicLossScale.create("cbfloat16")])
def test_scale_and_unscale_complex_leaves_both_parts(ls):
  """Complex gradients were left as they were: unscale returned them still multiplied by the loss
  scale (2^31 for cbfloat16), a silently wrong update for complex-valued weights."""
  s = float(ls.loss_scale)
  z = jnp.array([1.5 - 2j, complex(float("inf"), 1.0), complex(0.0, -0.0)], jnp.complex64)
  scaled = ls.scale({"z": z, "r": jnp.float32(1.5)})
  assert scaled["z"].dtype == jnp.complex64
  np.testing.assert_array_equal(np.asarray(scaled["z"]).real, np.asarray(z).real * np.float32(s))
  np.testing.assert_array_equal(np.asarray(scaled["z"]).imag, np.asarray(z).imag * np.float32(s))
  back = ls.unscale(scaled)["z"]
  np.testing.assert_array_equal(np.asarray(back), np.asarray(z))  # inf stays inf: no inf * 0 = NaN
  assert np.signbit(np.asarray(back).imag[2])


def test_select_tree_checks_the_predicate_and_passes_non_array_leaves():
  """A predicate of shape (n,) mixed the trees element by element (jnp.where broadcasts), a
  non-array leaf (an Equinox module's activation function) was a TypeError from jnp.where, and a
  structure mismatch was tree_map's message without the key path."""
  new = {"w": jnp.ones(3), "act": jax.nn.gelu, "name": "mlp", "step": jnp.int32(1)}
  old = {"w": jnp.zeros(3), "act": jax.nn.gelu, "name": "mlp", "step": jnp.int32(0)}
  out = jax.jit(lambda p: {k: precision.select_tree(p, new, old)[k] for k in ("w", "step")})(jnp.bool_(False))
  assert out["w"].tolist() == [0.0, 0.0, 0.0] and int(out["step"]) == 0
  assert precision.select_tree(True, new, old)["act"] is jax.nn.gelu
  assert precision.select_tree(True, new, old)["name"] == "mlp"
  with pytest.raises(ValueError, match=r"pred must be one boolean .* shape \(3,\)"):
    precision.select_tree(jnp.array([True, False, True]), new, old)
  with pytest.raises(ValueError, match=r"\['act'\] is not an array .*differs"):
    precision.select_tree(True, new, {**old, "act": jax.nn.relu})
  with pytest.raises(ValueError, match=r"same structure.*first at \['v'\]"):
    precision.select_tree(True, {"v": jnp.ones(1), "w": jnp.ones(1)}, {"u": jnp.ones(1), "w": jnp.ones(1)})


def test_select_tree_refuses_leaves_of_another_shape_or_dtype_naming_the_key():
  """jnp.where broadcast a (1,) leaf against a (2, 3) one and promoted bfloat16 against float32,
  silently: the selected state came back another shape or dtype than it had."""
  with pytest.raises(
    ValueError, match=r"leaf at \['w'\] has shape \(1,\) in on_true and \(2, 3\) in on_false"
  ):
    precision.select_tree(jnp.bool_(True), {"w": jnp.ones(1)}, {"w": jnp.zeros((2, 3))})
  with pytest.raises(
    ValueError, match=r"leaf at \['b'\] is bfloat16 in on_true and float32 in on_false.*astype"
  ):
    precision.select_tree(
      jnp.bool_(False), {"b": jnp.ones(2, jnp.bfloat16)}, {"b": jnp.zeros(2, jnp.float32)}
    )
  # a Python number takes the array's dtype; PRNG keys are selected as arrays
  out = precision.select_tree(
    True, {"s": 1.0, "k": jax.random.key(0)}, {"s": jnp.zeros((), jnp.bfloat16), "k": jax.random.key(1)}
  )
  assert out["s"].dtype == jnp.bfloat16 and float(out["s"]) == 1.0


def test_adjust_refuses_a_flag_per_element():
  """``jnp.isfinite(grads)`` for ``all_finite(grads)`` would make the scale a vector, silently."""
  ls = DynamicLossScale.create("float16")
  grads = jnp.array([1.0, jnp.inf])
  with pytest.raises(ValueError, match=r"grads_finite must be one boolean .* got shape \(2,\)"):
    ls.adjust(jnp.isfinite(grads))
  assert ls.adjust(jnp.all(jnp.isfinite(grads))).loss_scale.shape == ()


@pytest.mark.parametrize("flag", [jnp.float32(jnp.nan), jnp.float32(0.0), 1.5, jnp.int32(1)])
def test_adjust_and_select_tree_refuse_a_flag_that_is_not_a_boolean(flag):
  """A gradient norm passed for ``all_finite(grads)``: a NaN norm counted as a clean step (the scale
  kept, no step skipped) and select_tree took the NaN update; a zero norm counted as an overflow."""
  ls = DynamicLossScale.create("float16")
  with pytest.raises(ValueError, match=r"grads_finite must be one boolean .* got a (float|int)"):
    ls.adjust(flag)
  with pytest.raises(ValueError, match=r"pred must be one boolean .* got a (float|int)"):
    precision.select_tree(flag, {"a": jnp.ones(())}, {"a": jnp.zeros(())})
  assert float(ls.adjust(jnp.bool_(False)).loss_scale) == float(ls.loss_scale) / 2


def test_create_takes_numpy_integers():
  import numpy as np

  ls = DynamicLossScale.create("float16", steps_per_increase=np.int64(3))
  assert ls.steps_per_increase == 3 and type(ls.steps_per_increase) is int


def test_python_numbers_given_to_the_constructors_become_the_documented_arrays():
  """``StaticLossScale(128.0).scale(x)`` and a ``DynamicLossScale`` built from Python numbers (the
  constructor docs/api shows) failed with AttributeError: 'float' object has no attribute 'astype'."""
  assert float(StaticLossScale(128.0).scale(jnp.float32(2))) == 256.0
  ls = DynamicLossScale(
    loss_scale=1024.0, steps_since_rescale=0, overflows_since_rescale=0, num_skipped_steps=0
  )
  assert [(x.dtype, x.shape) for x in jax.tree.leaves(ls)] == [(jnp.float32, ())] + [(jnp.int32, ())] * 3
  assert float(ls.scale(jnp.float32(2))) == 2048.0
  assert float(jax.jit(lambda s: s.adjust(jnp.bool_(False)))(ls).loss_scale) == 512.0
  with pytest.raises(ValueError, match=r"loss_scale=-1.0; allowed: a finite positive number"):
    StaticLossScale(-1.0)
  with pytest.raises(ValueError, match=r"steps_since_rescale=0.5; allowed: an int >= 0"):
    DynamicLossScale(1.0, 0.5, 0, 0)


def test_transformations_rebuild_the_state_from_their_leaves_unchecked():
  """Unflattening bypasses the constructor's coercion: a tree of vmap in_axes (ints, None), eval_shape's
  ShapeDtypeStructs and device_get's NumPy arrays come back as they went in."""
  ls = DynamicLossScale.create("float16")
  assert jax.tree.leaves(jax.tree.map(lambda _: 0, ls)) == [0, 0, 0, 0]
  axes = jax.tree.map(lambda _: None, ls)
  assert jax.vmap(lambda s, x: s.scale(x), in_axes=(axes, 0))(ls, jnp.ones(2)).tolist() == [2.0**15] * 2
  shapes = jax.eval_shape(lambda s: s.adjust(jnp.bool_(True)), ls)
  assert isinstance(shapes.loss_scale, jax.ShapeDtypeStruct)
  assert isinstance(jax.device_get(ls).loss_scale, np.ndarray)
  assert [p for p, _ in jax.tree_util.tree_flatten_with_path(ls)[0]] == [
    (jax.tree_util.GetAttrKey(n),)
    for n in ("loss_scale", "steps_since_rescale", "overflows_since_rescale", "num_skipped_steps")
  ]  # the checkpoint's paths, as before


@pytest.mark.parametrize(
  "ls", [StaticLossScale.create(8.0), DynamicLossScale.create("float16", steps_per_increase=3)]
)
def test_load_state_dict_is_the_inverse_of_state_dict(ls):
  stepped = ls.adjust(jnp.bool_(False))
  loaded = ls.load_state_dict(jax.device_get(stepped.state_dict()))
  assert {k: float(v) for k, v in loaded.state_dict().items()} == {
    k: float(v) for k, v in stepped.state_dict().items()
  }
  assert jax.tree.structure(loaded) == jax.tree.structure(ls)  # the settings kept
  other = DynamicLossScale.create() if isinstance(ls, StaticLossScale) else StaticLossScale.create()
  with pytest.raises(ValueError, match=r"load_state_dict: the state must have the keys .*(missing|unknown)"):
    ls.load_state_dict(other.state_dict())


def test_select_tree_accepts_what_jnp_where_returns_in_the_states_dtype():
  """Only a real promotion is refused: a weak-typed scalar takes bfloat16, and NumPy float64 state is
  float32 to JAX (review: raw dtypes refused both)."""
  pick = jnp.bool_(True)
  out = precision.select_tree(pick, {"w": jnp.asarray(1.0)}, {"w": jnp.ones((), jnp.bfloat16)})
  assert out["w"].dtype == jnp.bfloat16
  out = precision.select_tree(pick, {"w": jnp.zeros(2)}, {"w": np.ones(2)})
  assert out["w"].dtype == jnp.float32
  with pytest.raises(ValueError, match=r"\['w'\] is float32 in on_true and bfloat16 in on_false"):
    precision.select_tree(pick, {"w": jnp.ones(2)}, {"w": jnp.ones(2, jnp.bfloat16)})
