"""Loss scaling with Cerebras semantics (``cstorch.amp.GradScaler``), as pytrees that run in jit.

Use in a train step::

  scaled_loss, grads = jax.value_and_grad(lambda p: ls.scale(loss_fn(p)))(params)
  grads = ls.unscale(grads)  # float32; with 16-bit params, cast each to its param's dtype
  finite = precision.all_finite(grads)
  new_params, new_opt_state = ...optimizer update...
  params, opt_state = precision.select_tree(finite, (new_params, new_opt_state), (params, opt_state))
  step = step + 1  # the global step counts every step, skipped or not
  ls = ls.adjust(finite)

(``wafer.optim.apply_gradients`` is this step, with the casts.)

Every update is tensor arithmetic (``jnp.where``), never Python branching on traced values.
The rules (``docs/references.md``, "Dynamic loss scaling"):

* defaults: initial and maximum scale ``2^31`` for cbfloat16 and ``2^15`` otherwise, minimum
  ``2^-14``, ``steps_per_increase = 2000``, ``overflow_tolerance = 0``; the initial scale is
  ``min(max_loss_scale, initial_loss_scale)``;
* per step: ``steps_since_rescale += 1``; ``overflows_since_rescale += not finite``; if
  ``overflows / steps > overflow_tolerance`` the scale halves and both counters reset; then if
  ``steps_since_rescale > steps_per_increase`` (strictly: the 2001st clean step) it doubles and
  both reset; finally it is clamped to ``[min_loss_scale, max_loss_scale]``;
* a step is finite when the global L2 norm of the unscaled gradients, computed in float32, is
  below inf (so NaN, inf, and gradients whose squares overflow float32 all count as overflow);
  a non-finite step is skipped: parameters and optimizer state (with it the schedule's count)
  stay; the global step still advances, as on a Cerebras system.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from precision.formats import FloatFormat, get_format
from precision.policy import _as_int

MIN_LOSS_SCALE = 2.0**-14


def _setting(name: str, value: Any, *, zero: bool = False) -> float:
  """A loss-scaling setting as a float: a finite number > 0 (``>= 0`` with ``zero``), else a
  ValueError naming it (a string or a bool is a mistake, not a number)."""
  allowed = "a finite number >= 0" if zero else "a finite positive number"
  if isinstance(value, (str, bytes, bool)) or value is None:
    raise ValueError(f"{name}={value!r}; allowed: {allowed}")
  try:
    out = float(value)
  except (TypeError, ValueError):
    raise ValueError(f"{name}={value!r}; allowed: {allowed}") from None
  if not (math.isfinite(out) and (out >= 0 if zero else out > 0)):
    raise ValueError(f"{name}={value!r}; allowed: {allowed}")
  if out > _FLOAT32_MAX:  # finite in Python, inf once the scale is a float32 array
    raise ValueError(
      f"{name}={value!r} exceeds float32's largest number ({_FLOAT32_MAX:.4g}): the loss scale is a float32 "
      f"array, so it would be inf and every loss NaN; allowed: a finite positive number up to {_FLOAT32_MAX:.4g} "
      "(Cerebras' largest default is 2^31)"
    )
  return out


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _scale_floats(tree: Any, factor: jax.Array) -> Any:
  """Multiply every floating or complex leaf by the float32 ``factor``; real leaves narrower than
  float32 are promoted to float32 first (cstorch's ``loss.float() * scale``); a complex leaf has
  its real and imaginary parts scaled (a complex product would turn ``inf * 0`` into NaN); other
  leaves (integers, ``float0`` gradients, PRNG keys) are unchanged."""

  def scale_leaf(leaf: Any) -> Any:
    leaf = jnp.asarray(leaf)
    if jnp.issubdtype(leaf.dtype, jnp.complexfloating):
      part = factor.astype(leaf.real.dtype)
      return jax.lax.complex(leaf.real * part, leaf.imag * part)
    if not jnp.issubdtype(leaf.dtype, jnp.floating):
      return leaf
    if jnp.finfo(leaf.dtype).bits < 32:
      leaf = leaf.astype(jnp.float32)
    return leaf * factor.astype(leaf.dtype)

  return jax.tree.map(scale_leaf, tree)


def all_finite(grads: Any) -> jax.Array:
  """Cerebras' overflow test: ``sqrt(sum of |g|^2 over all leaves) < inf`` in float32 (bool scalar).

  Every floating leaf counts (float64 and 16-bit ones are converted to float32 first), and a
  complex leaf by its real and imaginary parts. Leaves that cannot overflow are left out:
  integers and booleans, the ``float0`` gradients of integer inputs
  (``jax.grad(..., allow_int=True)``) and PRNG keys.

  >>> import jax.numpy as jnp, precision
  >>> bool(precision.all_finite({"w": jnp.ones(3), "step": jnp.int32(7), "z": jnp.array([1j])}))
  True
  >>> bool(precision.all_finite({"w": jnp.ones(3), "z": jnp.array([complex(1, float("inf"))])}))
  False
  """
  parts = []
  for g in jax.tree.leaves(grads):
    g = jnp.asarray(g)
    if jnp.issubdtype(g.dtype, jnp.complexfloating):
      parts += [g.real, g.imag]
    elif jnp.issubdtype(g.dtype, jnp.floating):
      parts.append(g)
  if not parts:
    return jnp.asarray(True)
  squares = sum(jnp.sum(jnp.square(p.astype(jnp.float32))) for p in parts)
  return jnp.sqrt(squares) < jnp.float32(jnp.inf)


def _one_boolean(what: str, flag: Any, otherwise: str) -> None:
  """A ``ValueError`` unless ``flag`` is one boolean (0-d): ``jnp.isfinite(grads)`` for
  ``all_finite(grads)`` is the usual mistake; ``otherwise`` says what it would do."""
  shape = jnp.shape(flag)
  if shape != ():
    raise ValueError(
      f"{what} must be one boolean (a 0-d array such as all_finite(grads)); got shape {shape}, {otherwise}"
    )
  dtype = jnp.result_type(flag)
  if dtype != jnp.bool_:  # a gradient norm passed for the flag: NaN would count as finite
    raise ValueError(
      f"{what} must be one boolean (a 0-d array such as all_finite(grads)); got a {dtype} value "
      "(a gradient norm? NaN would be read as true): pass a boolean, e.g. jnp.isfinite(norm)"
    )


def select_tree(pred: jax.Array, on_true: Any, on_false: Any) -> Any:
  """Leafwise ``jnp.where(pred, a, b)`` over two pytrees of the same structure (skipping updates).

  ``pred`` is one boolean (a 0-d boolean array or a Python bool; a float, such as a gradient norm,
  is refused: a NaN would read as true): the whole tree is taken from one side.
  Leaves that are not arrays (an Equinox module's activation function, a string) must be the same
  object on both sides and are returned as they are.

  The two trees must hold arrays of one shape and dtype at each key path (a Python number takes
  the other side's dtype): ``jnp.where`` would broadcast or promote them, so the state would come
  back changed.

  Raises:
    ValueError: ``pred`` is not one boolean, the trees differ in structure (the message names the
      first key path that differs), two array leaves differ in shape or dtype (the message names the
      key path), or a non-array leaf differs between the two trees.
  """
  _one_boolean("select_tree: pred", pred, "which would mix the two trees element by element")
  true_paths, true_def = jax.tree_util.tree_flatten_with_path(on_true)
  false_paths, false_def = jax.tree_util.tree_flatten_with_path(on_false)
  if true_def != false_def:
    names_t = [jax.tree_util.keystr(k) for k, _ in true_paths]
    names_f = [jax.tree_util.keystr(k) for k, _ in false_paths]
    first = next((a for a, b in zip(names_t, names_f) if a != b), None)
    where = f"first at {first}" if first is not None else f"{len(names_t)} and {len(names_f)} leaves"
    raise ValueError(
      f"select_tree: on_true and on_false must have the same structure; they differ ({where}): "
      f"{true_def} vs {false_def}"
    )

  def pick(path: Any, a: Any, b: Any) -> Any:
    if _is_array_like(a) and _is_array_like(b):
      _check_same_kind(path, a, b)
      return jnp.where(pred, a, b)
    if a is b or (not _is_array_like(a) and not _is_array_like(b) and _same_object(a, b)):
      return a
    raise ValueError(
      f"select_tree: the leaf at {jax.tree_util.keystr(path)} is not an array ({type(a).__name__} and "
      f"{type(b).__name__}) and differs between on_true and on_false; only arrays can be selected by a "
      "traced predicate (partition the tree first, e.g. eqx.partition(model, eqx.is_array))"
    )

  return jax.tree_util.tree_map_with_path(pick, on_true, on_false)


def _check_same_kind(path: Any, a: Any, b: Any) -> None:
  """A ``ValueError`` naming ``path`` unless leaves ``a`` and ``b`` have one shape and (both being
  arrays) one dtype: ``jnp.where`` would broadcast the one or promote the other, so the state would
  come back another shape or dtype than the one it had. A Python number takes the array's dtype."""
  if np.shape(a) != np.shape(b):
    raise ValueError(
      f"select_tree: the leaf at {jax.tree_util.keystr(path)} has shape {np.shape(a)} in on_true and "
      f"{np.shape(b)} in on_false; the two trees must hold arrays of the same shape and dtype at every "
      "key (jnp.where would broadcast them). Fix: build on_true from on_false's arrays (the update of the "
      "same state)."
    )
  dtype_a, dtype_b = getattr(a, "dtype", None), getattr(b, "dtype", None)
  if dtype_a is None or dtype_b is None:
    return
  # dtypes as JAX holds them (NumPy float64 state is float32 to JAX); a weak-typed value of the same kind
  # takes the other side's dtype: only what would change the state's dtype is refused
  if jax.dtypes.issubdtype(dtype_a, jax.dtypes.extended) or jax.dtypes.issubdtype(
    dtype_b, jax.dtypes.extended
  ):
    canonical_a, canonical_b = dtype_a, dtype_b  # PRNG keys: compared as they are
  else:
    canonical_a, canonical_b = jax.dtypes.canonicalize_dtype(dtype_a), jax.dtypes.canonicalize_dtype(dtype_b)
  if canonical_a == canonical_b or (
    bool(getattr(a, "weak_type", False)) and _kind(canonical_a) == _kind(canonical_b)
  ):
    return
  raise ValueError(
    f"select_tree: the leaf at {jax.tree_util.keystr(path)} is {dtype_a} in on_true and {dtype_b} in "
    "on_false; the two trees must hold arrays of the same shape and dtype at every key (jnp.where would "
    f"promote them). Fix: cast the update to the state's dtype (e.g. x.astype({dtype_b})); for gradients, "
    "to each parameter's dtype."
  )


def _kind(dtype: Any) -> str:
  """``"bool"``, ``"int"``, ``"float"`` or ``"complex"`` (bfloat16 and cbfloat16 storage included)."""
  for name, group in (("bool", jnp.bool_), ("int", jnp.integer), ("float", jnp.floating)):
    if jnp.issubdtype(dtype, group):
      return name
  return "complex"


def _is_array_like(x: Any) -> bool:
  return isinstance(x, (jax.Array, np.ndarray, np.generic, int, float, complex))


def _same_object(a: Any, b: Any) -> bool:
  try:
    return bool(a == b)
  except Exception:  # noqa: BLE001  (an object whose == is not a bool: not the same)
    return False


def _scale_array(value: Any) -> Any:
  """A loss scale given as a Python or NumPy number: checked (`_setting`) and made a float32 scalar
  array; anything else (an array, a tracer) as it is."""
  if isinstance(value, (int, float, np.number)) and not isinstance(value, bool):
    return jnp.asarray(_setting("loss_scale", value), jnp.float32)
  return value


def _counter_array(name: str, value: Any) -> Any:
  """A counter given as a Python or NumPy integer: checked (``>= 0``) and made an int32 scalar array;
  anything else that is not a number (an array, a tracer) as it is.

  Raises:
    ValueError: a bool, a float or a negative integer.
  """
  if isinstance(value, (bool, np.bool_, float, np.floating)) or (
    isinstance(value, (int, np.integer)) and not 0 <= value <= np.iinfo(np.int32).max
  ):
    raise ValueError(f"{name}={value!r}; allowed: an int >= 0 (or an int32 scalar array)")
  if isinstance(value, (int, np.integer)):
    return jnp.asarray(value, jnp.int32)
  return value


@dataclasses.dataclass(frozen=True)
class StaticLossScale:
  """A fixed loss scale (``loss_scaling_factor: <float>``); ``adjust`` returns it unchanged.

  ``StaticLossScale(128.0)`` is ``StaticLossScale.create(128.0)``: a Python number given for
  ``loss_scale`` becomes a float32 scalar array (checked as by `create`).
  """

  loss_scale: jax.Array

  def __post_init__(self) -> None:
    object.__setattr__(self, "loss_scale", _scale_array(self.loss_scale))

  @classmethod
  def create(cls, loss_scale: float = 1.0) -> StaticLossScale:
    """A loss scale of ``loss_scale`` (float32); 1.0 scales nothing.

    Raises:
      ValueError: ``loss_scale`` is not a finite positive number up to float32's largest.
    """
    return cls(jnp.asarray(_setting("loss_scale", loss_scale), jnp.float32))

  def scale(self, tree: Any) -> Any:
    """``tree * loss_scale`` (the loss, before differentiation)."""
    return _scale_floats(tree, self.loss_scale)

  def unscale(self, tree: Any) -> Any:
    """``tree * (1 / loss_scale)``, the reciprocal computed in float32 (as Cerebras does)."""
    return _scale_floats(tree, jnp.float32(1.0) / self.loss_scale)

  def adjust(self, grads_finite: jax.Array) -> StaticLossScale:
    """``self``, unchanged: a static scale is the same whatever the step's gradients were."""
    del grads_finite
    return self

  def state_dict(self) -> dict[str, jax.Array]:
    """The checkpointed state, under Cerebras' names: ``{"loss_scale": float32 scalar}``."""
    return {"loss_scale": self.loss_scale}

  def load_state_dict(self, state: dict[str, Any]) -> StaticLossScale:
    """A copy with the arrays of ``state`` (a `state_dict`; the inverse of it).

    Raises:
      ValueError: ``state``'s keys are not `state_dict`'s (the message names the missing and unknown ones).
    """
    return dataclasses.replace(self, **_state_arrays(type(self), state))


@dataclasses.dataclass(frozen=True)
class DynamicLossScale:
  """Dynamic loss scaling state: four arrays (checkpointed) and its static settings.

  Build it with `DynamicLossScale.create`; see the module docstring for the rules. Built directly,
  its Python numbers become the arrays the fields name (``loss_scale`` a float32 scalar, checked as
  by `create`; the counters int32 scalars, ``>= 0``); the settings are not checked (`create` checks
  them).
  """

  loss_scale: jax.Array  # float32 scalar
  steps_since_rescale: jax.Array  # int32 scalar
  overflows_since_rescale: jax.Array  # int32 scalar
  num_skipped_steps: jax.Array  # int32 scalar
  steps_per_increase: int = 2000
  min_loss_scale: float = MIN_LOSS_SCALE
  max_loss_scale: float = 2.0**15
  overflow_tolerance: float = 0.0

  def __post_init__(self) -> None:
    object.__setattr__(self, "loss_scale", _scale_array(self.loss_scale))
    for name in _DYNAMIC_COUNTERS:
      object.__setattr__(self, name, _counter_array(name, getattr(self, name)))

  @classmethod
  def create(
    cls,
    half_dtype: FloatFormat | str = "float16",
    initial_loss_scale: float | None = None,
    steps_per_increase: int = 2000,
    min_loss_scale: float | None = None,
    max_loss_scale: float | None = None,
    overflow_tolerance: float = 0.0,
  ) -> DynamicLossScale:
    """The state before the first step, with the defaults of ``half_dtype``'s format.

    Args:
      half_dtype: the 16-bit format (``float16``, ``bfloat16``, ``cbfloat16`` or an alias): decides the
        default initial and maximum scale (2^31 for cbfloat16, 2^15 otherwise).
      initial_loss_scale: the first scale; default the maximum; a larger one is clamped to it.
      steps_per_increase: clean steps after which the scale doubles (on the next one: strictly more).
      min_loss_scale: the smallest scale, at least 2^-14 (the default).
      max_loss_scale: the largest scale.
      overflow_tolerance: the share, from 0 up to (not including) 1, of the steps since the last
        rescale that may overflow before the scale halves.

    Raises:
      ValueError: a setting outside what Cerebras allows (the message says which and why).
    """
    fmt = get_format(half_dtype)
    default = 2.0**31 if fmt.name == "cbfloat16" else 2.0**15
    max_scale = default if max_loss_scale is None else _setting("max_loss_scale", max_loss_scale)
    min_scale = MIN_LOSS_SCALE if min_loss_scale is None else _setting("min_loss_scale", min_loss_scale)
    initial = default if initial_loss_scale is None else _setting("initial_loss_scale", initial_loss_scale)
    overflow_tolerance = _setting("overflow_tolerance", overflow_tolerance, zero=True)
    if overflow_tolerance >= 1:
      raise ValueError(
        f"overflow_tolerance={overflow_tolerance!r}; allowed: a fraction from 0 up to, not including, 1 (the "
        "share of the steps since the last rescale that may overflow before the scale is halved: at 1 or more "
        "it never is, and every step could be skipped)"
      )
    if min_scale < MIN_LOSS_SCALE:
      raise ValueError(f"min_loss_scale={min_scale!r} is too small; allowed: at least 2^-14")
    if not min_scale <= max_scale:
      raise ValueError(f"min_loss_scale={min_scale!r} exceeds max_loss_scale={max_scale!r}")
    if initial < min_scale:
      raise ValueError(
        f"initial_loss_scale={initial!r} is below min_loss_scale={min_scale!r}; allowed: "
        f"{min_scale!r} to {max_scale!r} (a larger one is clamped to max_loss_scale)"
      )
    steps = _as_int(steps_per_increase)  # (a NumPy integer: a Python int, as the field says)
    if steps is None or steps < 1:
      raise ValueError(f"steps_per_increase={steps_per_increase!r}; allowed: an int >= 1")
    zero = jnp.asarray(0, jnp.int32)
    return cls(
      loss_scale=jnp.asarray(min(max_scale, initial), jnp.float32),
      steps_since_rescale=zero,
      overflows_since_rescale=zero,
      num_skipped_steps=zero,
      steps_per_increase=steps,
      min_loss_scale=min_scale,
      max_loss_scale=max_scale,
      overflow_tolerance=overflow_tolerance,
    )

  scale = StaticLossScale.scale
  unscale = StaticLossScale.unscale

  def adjust(self, grads_finite: jax.Array) -> DynamicLossScale:
    """The state after a step whose gradients were ``grads_finite`` (a bool scalar).

    Raises:
      ValueError: ``grads_finite`` is not one boolean (``jnp.isfinite(grads)`` instead of
        ``all_finite(grads)`` would make the scale a vector).
    """
    _one_boolean(
      "adjust: grads_finite", grads_finite, "which would make the loss scale an array of that shape"
    )
    overflow = jnp.logical_not(grads_finite).astype(jnp.int32)
    steps = self.steps_since_rescale + 1
    overflows = self.overflows_since_rescale + overflow
    scale = self.loss_scale
    back_off = overflows.astype(jnp.float32) / steps.astype(jnp.float32) > self.overflow_tolerance
    scale = jnp.where(back_off, scale / 2, scale)
    steps = jnp.where(back_off, 0, steps)
    overflows = jnp.where(back_off, 0, overflows)
    grow = steps > self.steps_per_increase
    scale = jnp.where(grow, scale * 2, scale)
    steps = jnp.where(grow, 0, steps)
    overflows = jnp.where(grow, 0, overflows)
    scale = jnp.clip(scale, jnp.float32(self.min_loss_scale), jnp.float32(self.max_loss_scale))
    return dataclasses.replace(
      self,
      loss_scale=scale,
      steps_since_rescale=steps,
      overflows_since_rescale=overflows,
      num_skipped_steps=self.num_skipped_steps + overflow,
    )

  def state_dict(self) -> dict[str, jax.Array]:
    """The checkpointed state, under Cerebras' names: ``loss_scale`` (float32), ``steps_since_rescale``,
    ``overflows_since_rescale`` and ``num_skipped_steps`` (int32 scalars). The settings
    (``steps_per_increase``, the bounds, the tolerance) are not in it: they come from the config."""
    return {"loss_scale": self.loss_scale, **{name: getattr(self, name) for name in _DYNAMIC_COUNTERS}}

  def load_state_dict(self, state: dict[str, Any]) -> DynamicLossScale:
    """A copy with the arrays of ``state`` (a `state_dict`; the inverse of it), keeping these settings.

    >>> ls = DynamicLossScale.create("float16")
    >>> float(ls.load_state_dict({**ls.state_dict(), "loss_scale": 64.0}).loss_scale)
    64.0

    Raises:
      ValueError: ``state``'s keys are not `state_dict`'s (the message names the missing and unknown
        ones), or a value is not a valid loss scale or counter.
    """
    return dataclasses.replace(self, **_state_arrays(type(self), state))


_DYNAMIC_COUNTERS = ("steps_since_rescale", "overflows_since_rescale", "num_skipped_steps")
"""`DynamicLossScale`'s int32 counters (its arrays besides ``loss_scale``)."""

_DATA_FIELDS: dict[type, tuple[str, ...]] = {
  StaticLossScale: ("loss_scale",),
  DynamicLossScale: ("loss_scale", *_DYNAMIC_COUNTERS),
}
"""Each loss scale's arrays (pytree leaves, its `state_dict` keys); its other fields are settings."""


def _state_arrays(cls: type, state: dict[str, Any]) -> dict[str, Any]:
  """``state``'s entries, checked to be exactly ``cls``'s arrays (`_DATA_FIELDS`)."""
  want = _DATA_FIELDS[cls]
  missing, unknown = [k for k in want if k not in state], sorted(set(state) - set(want))
  if missing or unknown:
    raise ValueError(
      f"{cls.__name__}.load_state_dict: the state must have the keys {', '.join(want)}"
      + (f"; missing: {', '.join(missing)}" if missing else "")
      + (f"; unknown: {', '.join(map(str, unknown))}" if unknown else "")
      + ". Fix: pass the state_dict() of a "
      + cls.__name__
      + " (a state saved by the other loss-scale type does not load)."
    )
  return {k: state[k] for k in want}


def _register_pytree(cls: type) -> None:
  """Register ``cls`` as a pytree: its arrays (`_DATA_FIELDS`) are the leaves, under their attribute
  names (``GetAttrKey``, as ``jax.tree_util.register_dataclass`` names them: checkpoints keep their
  paths), and the other fields are static. Unflattening does not call ``__init__``, so not
  ``__post_init__``: a transformation rebuilds the state from whatever leaves it carries (tracers,
  ``ShapeDtypeStruct``, None, the ints of a ``vmap`` ``in_axes`` tree), and they come back as they
  went in, not as checked arrays."""
  data = _DATA_FIELDS[cls]
  meta = tuple(f.name for f in dataclasses.fields(cls) if f.name not in data)

  def flatten_with_keys(x: Any) -> tuple[tuple[tuple[Any, Any], ...], tuple[Any, ...]]:
    return tuple((jax.tree_util.GetAttrKey(n), getattr(x, n)) for n in data), tuple(
      getattr(x, n) for n in meta
    )

  def flatten(x: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    return tuple(getattr(x, n) for n in data), tuple(getattr(x, n) for n in meta)

  def unflatten(settings: tuple[Any, ...], leaves: Any) -> Any:
    out = object.__new__(cls)
    for name, value in (*zip(meta, settings), *zip(data, leaves)):
      object.__setattr__(out, name, value)
    return out

  jax.tree_util.register_pytree_with_keys(cls, flatten_with_keys, unflatten, flatten)


_register_pytree(StaticLossScale)
_register_pytree(DynamicLossScale)
