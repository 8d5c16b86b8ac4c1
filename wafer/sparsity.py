"""Weight sparsity as Cerebras trains it: static, SET and RigL masks, held in the optimizer state.

Cerebras' sparsity library (``cerebras.pytorch.sparse``, configured by a params file's ``sparsity``
section, `wafer.config.sparsity`) trains a subset of each chosen weight tensor and keeps the rest at
exactly zero. wafer does the same with one boolean mask per tensor:

* **Masks start** (a dynamic group whose cadence does not include step 0, e.g. ``start: 500``, starts
  dense and is first pruned by its first update) with ``k = floor((1 - s) N)`` of a tensor's ``N`` weights kept (``s`` the
  sparsity): the ``k`` largest of uniform random scores (``init_method: random``, an exactly-``k``
  uniformly random subset), of ``|W|`` (``topk``), or the non-zero weights (``from_zeros``). The
  initial weights are multiplied by their mask before the first forward pass.
* **Every step** (`sparsify`'s ``update``, then its ``after_step``): the gradients of pruned weights
  are set to 0 before the loss scaling's finiteness test, clipping and the update rule (a select: a
  NaN or inf there is dropped, so it skips no step), the update runs, and then the weights are set to
  0 where the mask is 0 and every optimizer-state tensor of a weight's shape to its initial value
  (Cerebras zeroes them: 0 for Adam's moments and momentum; Rprop's step sizes restart at the initial
  step). So a pruned weight and its moments are exactly 0 at the end of every step, and weight decay
  does nothing to it.
* **Dynamic sparsity** (``set``, ``rigl``): after optimizer step ``s`` (1-based: the steps applied;
  a step skipped for non-finite gradients does not count), when ``s`` is an update step
  (``(s - start) % freq == 0``, ``start <= s < stop``, or ``s`` in a list), each tensor keeps its
  ``floor((1 - d) K)`` largest ``|W|`` (``K`` kept weights, ``d`` the drop fraction at ``s``) and
  grows back to ``K`` among the others (those just dropped included): SET at random, RigL where
  ``|dL/dW|`` of that step (the dense gradient, before masking) is largest. A grown weight that was
  pruned before starts at 0 with zero moments; one dropped and grown back in the same update keeps
  its value and moments. The new mask serves from the next step's forward pass on.

The drop fraction is a number or ``{"type": "cosine", "init": a, "half_period": h, "minimum": m}``:
``d(s) = (a - o) cos(pi s / h) + o`` with ``o = (a + m) / 2`` (periodic, not clamped).

On a CS-2 the sparse weights are stored compressed and multiplications by pruned weights are skipped;
here the masked weights are dense arrays, so a sparse run costs what a dense one does. The random
masks have Cerebras' distribution, not its bits (those come from torch's generator).

Sources (cerebras_pytorch 2.10.0 ``cerebras/pytorch/sparse``: ``init.py`` random/topk init,
``base.py`` the gradient, pre- and post-step hooks, ``dynamic.py`` the 1-based update counter,
``set.py`` / ``rigl.py`` / ``utils.py`` the update and the cosine drop fraction; the 2.1 package
``cerebras_pytorch.sparse`` has the same arithmetic): ``docs/guides/sparsity.md``.

Example: three of four weights pruned, the pruned ones stay 0 through an Adam step:

>>> import jax, jax.numpy as jnp, optax
>>> tx = sparsify(optax.adam(0.1), lambda params: {"w": 0.75}, Group(), seed=0)
>>> params = {"w": jnp.arange(1.0, 9.0)}
>>> state = tx.init(params)
>>> params = tx.prune(params, state)
>>> int(jnp.sum(params["w"] != 0))
2
>>> grads = {"w": jnp.ones(8)}
>>> updates, state = tx.update(grads, state, params)
>>> params, state = tx.after_step(optax.apply_updates(params, updates), state, grads)
>>> int(jnp.sum(params["w"] != 0)), int(jnp.sum(masks(state)["w"]))
(2, 2)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

__all__ = (
  "DropFraction",
  "Group",
  "SparsityState",
  "UpdateSchedule",
  "Sparsified",
  "keep_count",
  "masks",
  "sparsify",
  "top_mask",
)

ALGORITHMS = ("static", "set", "rigl")
_STREAM = 0x73706172  # "spar": the masks' keys, folded into the run's seed
INIT_METHODS = ("random", "topk", "from_zeros")


@dataclasses.dataclass(frozen=True)
class UpdateSchedule:
  """The optimizer steps ``s`` (1-based) after which a dynamic mask changes.

  ``steps`` given: exactly those; else ``(s - start) % freq == 0`` and ``start <= s`` and, with a
  ``stop``, ``s < stop`` (Cerebras' ``FreqSchedule`` and ``ListSchedule``).

  >>> [s for s in range(1, 400) if UpdateSchedule(freq=100, stop=300).is_update(s)]
  [100, 200]
  """

  freq: int = 1
  start: int = 0
  stop: int | None = None
  steps: tuple[int, ...] | None = None

  def describe(self) -> str:
    """In words, e.g. ``100, 200, ... before 3584``."""
    if self.steps is not None:
      return ", ".join(map(str, self.steps)) or "none"
    first = self.start + self.freq if self.start == 0 else self.start
    text = f"{first}, {first + self.freq}, ..."
    return text + (f" before {self.stop}" if self.stop is not None else "")

  def is_update(self, s: Any) -> Any:
    """Whether step ``s`` (an int or an int32 array) updates the mask (a bool of the same kind)."""
    if self.steps is not None:
      if isinstance(s, int):
        return s in self.steps
      return jnp.isin(s, jnp.asarray(self.steps, jnp.int32)) if self.steps else jnp.zeros((), bool)
    hit = (s - self.start) % self.freq == 0
    hit = hit & (s >= self.start) if self.start else hit
    return hit & (s < self.stop) if self.stop is not None else hit


@dataclasses.dataclass(frozen=True)
class DropFraction:
  """The fraction of a tensor's kept weights a dynamic update drops, at optimizer step ``s``.

  ``half_period`` None: the constant ``init``; else the cosine ``(init - o) cos(pi s / half_period) + o``
  with ``o = (init + minimum) / 2``, in float32 as Cerebras computes it.

  >>> round(float(DropFraction(0.3, half_period=3584)(100)), 4)
  0.2994
  """

  init: float = 0.3
  half_period: float | None = None
  minimum: float = 0.0

  def describe(self) -> str:
    """In words, e.g. ``0.3 of the kept weights, cosine over 3584 steps``."""
    if self.half_period is None:
      return f"{self.init:g} of the kept weights"
    return f"{self.init:g} of the kept weights, cosine to {self.minimum:g} over {self.half_period:g} steps"

  def __call__(self, s: Any) -> jax.Array:
    if self.half_period is None:
      return jnp.float32(self.init)
    offset = (self.init + self.minimum) / 2
    amplitude = self.init - offset
    angle = jnp.asarray(s, jnp.float32) * jnp.float32(math.pi / self.half_period)
    return jnp.float32(amplitude) * jnp.cos(angle) + jnp.float32(offset)


@dataclasses.dataclass(frozen=True)
class Group:
  """How the tensors of one sparsity group are masked and updated.

  Attributes:
    algorithm: ``"static"`` (the initial mask for ever), ``"set"`` or ``"rigl"``.
    init_method: ``"random"``, ``"topk"`` (largest ``|W|``) or ``"from_zeros"`` (``W != 0``).
    drop_fraction: `DropFraction` (dynamic algorithms).
    update: `UpdateSchedule` (dynamic algorithms).
    rounding: how the kept count is rounded (`keep_count`): ``"floor"`` (2.x) or ``"round"`` (1.x sideband).
  """

  algorithm: Literal["static", "set", "rigl"] = "static"
  init_method: Literal["random", "topk", "from_zeros"] = "random"
  drop_fraction: DropFraction = DropFraction()
  update: UpdateSchedule = UpdateSchedule()
  rounding: Literal["floor", "round"] = "floor"

  def __post_init__(self) -> None:
    if self.algorithm not in ALGORITHMS:
      raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}, not {self.algorithm!r}")
    if self.init_method not in INIT_METHODS:
      raise ValueError(f"init_method must be one of {', '.join(INIT_METHODS)}, not {self.init_method!r}")

  @property
  def dynamic(self) -> bool:
    return self.algorithm != "static"


class SparsityState(NamedTuple):
  """The optimizer state of `sparsify`.

  Attributes:
    masks: a pytree like the params: bool arrays of the parameter's shape (True = kept), or a
      bool scalar True for a dense parameter.
    step: int32 scalar, the optimizer steps applied (Cerebras' 1-based update counter before the
      next step).
    key: uint32 array, the raw PRNG key data (``jax.random.key_data``) SET's regrowth draws from
      (with ``step`` folded in).
    inner: the wrapped transformation's state.
  """

  masks: Any
  step: jax.Array
  key: jax.Array
  inner: Any


def keep_count(numel: int, sparsity: float, rounding: str = "floor") -> int:
  """How many of ``numel`` weights a mask of ``sparsity`` keeps: ``floor(float32((1 - s) N))`` (2.x),
  or ``N - round(s N)`` with ``rounding="round"`` (1.x sideband sparsity, NumPy's round).

  >>> keep_count(768 * 768, 0.75), keep_count(10, 0.75), keep_count(7, 0.0)
  (147456, 2, 7)
  >>> keep_count(64, 0.3), keep_count(64, 0.3, "round")
  (44, 45)
  """
  if rounding == "round":
    return numel - int(np.round(sparsity * numel))
  return int(np.float32(np.float32(1.0 - sparsity) * np.float32(numel)))


def top_mask(scores: jax.Array, k: Any) -> jax.Array:
  """True at the ``k`` largest entries of ``scores`` (flattened; ties to the lower index), same shape.

  ``k`` may be traced. ``-inf`` scores are never chosen while ``k`` is at most the number of finite ones.

  >>> top_mask(jnp.array([[0.1, 0.9], [0.5, 0.2]]), 2).tolist()
  [[False, True], [True, False]]
  """
  flat = scores.reshape(-1)
  order = jnp.argsort(-flat, stable=True)
  ranks = jnp.zeros(flat.shape, jnp.int32).at[order].set(jnp.arange(flat.size, dtype=jnp.int32))
  return (ranks < k).reshape(scores.shape)


def _initial_mask(group: Group, sparsity: float, param: jax.Array, key: jax.Array) -> jax.Array:
  if group.dynamic and not group.update.is_update(0):  # Cerebras: dense until the first update
    return jnp.ones(param.shape, bool)
  if group.init_method == "from_zeros":
    return param != 0
  k = keep_count(param.size, sparsity, group.rounding)
  scores = (
    jnp.abs(param) if group.init_method == "topk" else jax.random.uniform(key, param.shape, jnp.float32)
  )
  return top_mask(scores, k)


def _dense(x: Any) -> bool:
  return getattr(x, "ndim", 0) == 0


def sparsify(
  inner: optax.GradientTransformation,
  levels: Callable[[Any], Any],
  groups: Group | Sequence[Group],
  *,
  seed: int = 0,
  group_of: Callable[[Any], Any] | None = None,
) -> Sparsified:
  """``inner`` on masked gradients, with the masks in its state (`SparsityState`).

  Args:
    inner: the optimizer (clipping, update rule, learning rate): it sees only the kept gradients.
    levels: ``params -> pytree of floats`` (same structure; it may read only paths and shapes): each
      parameter's sparsity in ``[0, 1)``, 0 (or None) for a dense one.
    groups: one `Group` for every sparse parameter, or one per group (then ``group_of``).
    seed: the key of the random initial masks and of SET's regrowth.
    group_of: ``params -> pytree of ints``: each sparse parameter's index in ``groups``.

  Returns:
    A `Sparsified` transformation: ``init`` draws the masks, ``update`` masks the gradients and runs
    ``inner``; its `Sparsified.prune` masks the initial parameters and `Sparsified.after_step` ends
    every step (`wafer.train` calls both).
  """
  groups = (groups,) if isinstance(groups, Group) else tuple(groups)
  if not groups:
    raise ValueError("sparsify needs at least one Group")
  if len(groups) > 1 and group_of is None:
    raise ValueError("several sparsity groups need group_of (each sparse parameter's group)")

  def indices(params: Any) -> Any:
    return group_of(params) if group_of is not None else jax.tree.map(lambda _: 0, params)

  def init(params: Any) -> SparsityState:
    key = jax.random.fold_in(jax.random.key(seed), _STREAM)  # not the weights' stream of the same seed
    leaves, treedef = jax.tree.flatten(params)
    level_leaves = treedef.flatten_up_to(levels(params))
    index_leaves = treedef.flatten_up_to(indices(params))
    out = []
    for i, (param, level, g) in enumerate(zip(leaves, level_leaves, index_leaves, strict=True)):
      if not level:
        out.append(jnp.ones((), bool))
      else:
        out.append(_initial_mask(groups[int(g)], float(level), param, jax.random.fold_in(key, i)))
    return SparsityState(
      masks=treedef.unflatten(out),
      step=jnp.zeros((), jnp.int32),
      key=jax.random.key_data(jax.random.fold_in(key, len(leaves))),
      inner=inner.init(params),
    )

  def update(grads: Any, state: SparsityState, params: Any = None) -> tuple[Any, SparsityState]:
    updates, inner_state = inner.update(_apply(grads, state.masks), state.inner, params)
    return updates, state._replace(inner=inner_state)

  def after_step(params: Any, state: SparsityState, grads: Any) -> tuple[Any, SparsityState]:
    step = state.step + 1
    mask_tree = state.masks
    if any(g.dynamic for g in groups):
      leaves, treedef = jax.tree.flatten(mask_tree)
      p_leaves = treedef.flatten_up_to(params)
      g_leaves = treedef.flatten_up_to(grads)
      i_leaves = treedef.flatten_up_to(indices(params))
      s_leaves = treedef.flatten_up_to(levels(params))
      key = jax.random.fold_in(jax.random.wrap_key_data(state.key), step)
      new = []
      for i, (m, w, g, gi, level) in enumerate(
        zip(leaves, p_leaves, g_leaves, i_leaves, s_leaves, strict=True)
      ):
        group = groups[int(gi)]
        if _dense(m) or not group.dynamic:
          new.append(m)
          continue
        w = jnp.where(m, w, jnp.zeros_like(w))  # the post-step prune comes first
        regrown = jax.lax.cond(
          group.update.is_update(step),
          lambda m=m, w=w, g=g, i=i, group=group, level=level: _regrow(
            group,
            m,
            w,
            g,
            jax.random.fold_in(key, i),
            group.drop_fraction(step),
            keep_count(m.size, level, group.rounding),
          ),
          lambda m=m: m,
        )
        new.append(regrown)
      mask_tree = treedef.unflatten(new)
    pruned = _apply(params, mask_tree)
    inner_state = _prune_inner(state.inner, inner.init(pruned), mask_tree)
    return pruned, state._replace(masks=mask_tree, step=step, inner=inner_state)

  def prune(params: Any, state: SparsityState) -> Any:
    return _apply(params, state.masks)

  def mask_gradients(grads: Any, state: SparsityState) -> Any:
    return _apply(grads, state.masks)

  def describe(params: Any) -> str:
    leaves, treedef = jax.tree.flatten(params)
    level_leaves = treedef.flatten_up_to(levels(params))
    index_leaves = treedef.flatten_up_to(indices(params))
    parts = []
    for gi, group in enumerate(groups):
      chosen = [
        (math.prod(p.shape), float(s))
        for p, s, i in zip(leaves, level_leaves, index_leaves, strict=True)
        if s and int(i) == gi
      ]
      if not chosen:  # a level of 0 (or a selection that names no tensor): the group does nothing
        if len(groups) == 1:
          parts.append(
            f"no tensor of {len(leaves)} is sparse (sparsity 0 or none selected): {group.algorithm} has no effect"
          )
        else:
          parts.append(f"group {gi} ({group.algorithm}) makes no tensor sparse (sparsity 0 or none selected)")
        continue
      total = sum(n for n, _ in chosen)
      kept = sum(keep_count(n, s, group.rounding) for n, s in chosen)
      levels_text = "/".join(sorted({f"{s:.4g}" for _, s in chosen}))
      text = (
        f"{len(chosen)} tensors of {len(leaves)} at sparsity {levels_text} ({kept:,} of {total:,} weights kept), "
        f"{group.algorithm}, {group.init_method} initial masks"
      )
      if group.dynamic:
        text += f"; masks change after optimizer steps {group.update.describe()}, dropping {group.drop_fraction.describe()}"
      parts.append(text)
    if not any(level_leaves):
      return "note: sparsity: " + "; ".join(parts) + "; the run is the dense model's"
    return (
      "note: sparsity: "
      + "; ".join(parts)
      + ". Pruned weights are exact zeros in dense arrays: the run costs what the dense model does, and the wafer "
      "estimate is the dense model's"
    )

  return Sparsified(init, update, prune, after_step, groups, describe, mask_gradients)


class Sparsified(NamedTuple):
  """A `sparsify` transformation: optax's ``init`` and ``update``, and the two steps around them.

  Attributes:
    init: ``params -> SparsityState`` (the initial masks).
    update: ``(grads, state, params) -> (updates, state)``: ``inner``'s update of the masked gradients.
    prune: ``(params, state) -> params``: each pruned weight set to 0 (the initial parameters).
    after_step: ``(params, state, grads) -> (params, state)``: after ``optax.apply_updates``, prune
      the parameters and the optimizer state and count the step; on an update step, update the
      dynamic masks first (``grads``: the step's dense gradients, RigL's scores).
    groups: the `Group` of each sparsity group.
    describe: ``params -> str``: one line for a run's notes (tensors, weights kept, updates).
    mask_gradients: ``(grads, state) -> grads``: 0 where pruned (a select: a NaN or inf there is
      dropped), what the loss scaling's finiteness test and ``update`` see.
  """

  init: Callable[..., Any]
  update: Callable[..., Any]
  prune: Callable[..., Any]
  after_step: Callable[..., Any]
  groups: tuple[Group, ...]
  describe: Callable[[Any], str]
  mask_gradients: Callable[..., Any]


def masks(opt_state: Any) -> Any:
  """The masks of a `sparsify` optimizer state (a pytree like the params), or None for another state."""
  return opt_state.masks if isinstance(opt_state, SparsityState) else None


def _apply(tree: Any, mask_tree: Any) -> Any:
  """``tree`` with 0 where a mask is False (a select: a NaN there is dropped too)."""
  return jax.tree.map(lambda x, m: x if _dense(m) else jnp.where(m, x, jnp.zeros_like(x)), tree, mask_tree)


def _prune_inner(inner: Any, fresh: Any, mask_tree: Any) -> Any:
  """Every subtree of ``inner`` shaped like the params: its leaves of a weight's shape reset to their
  initial value (``fresh``, the same optimizer's ``init``) where the mask is False.

  Cerebras zeroes every optimizer-state tensor of a weight's shape there; the initial value is 0 for
  Adam's moments, SGD's momentum and the other accumulators, and a reset keeps the state usable where
  it is not (Rprop's step sizes start at the initial step, and a zero step size never grows again)."""
  treedef = jax.tree.structure(mask_tree)
  mask_leaves = jax.tree.leaves(mask_tree)

  def like_params(x: Any) -> bool:
    return jax.tree.structure(x) == treedef

  def prune_subtree(x: Any, start: Any) -> Any:
    if not like_params(x):
      return x
    leaves = [
      leaf
      if _dense(m) or getattr(leaf, "shape", None) != m.shape
      else jnp.where(m, leaf, jnp.broadcast_to(s, leaf.shape).astype(leaf.dtype))
      for leaf, s, m in zip(jax.tree.leaves(x), jax.tree.leaves(start), mask_leaves, strict=True)
    ]
    return treedef.unflatten(leaves)

  return jax.tree.map(prune_subtree, inner, fresh, is_leaf=like_params)


def _regrow(
  group: Group, mask: jax.Array, w: jax.Array, grad: jax.Array, key: jax.Array, d: jax.Array, target: int
) -> jax.Array:
  """One tensor's dynamic update: keep the ``floor((1 - d) K)`` largest ``|w|`` of its ``K`` kept
  weights, grow to ``target`` where the score is largest among the others (those just dropped too)."""
  kept = jnp.sum(mask, dtype=jnp.int32)
  keep = jnp.floor((jnp.float32(1.0) - d) * kept.astype(jnp.float32)).astype(jnp.int32)
  keep = jnp.clip(keep, 0, kept)
  survivors = top_mask(jnp.where(mask, jnp.abs(w).astype(jnp.float32), -jnp.inf), keep)
  if group.algorithm == "rigl":
    score = jnp.abs(grad).astype(jnp.float32)
  else:
    score = jax.random.uniform(key, w.shape, jnp.float32)
  return survivors | top_mask(jnp.where(survivors, -jnp.inf, score), jnp.maximum(target - keep, 0))
