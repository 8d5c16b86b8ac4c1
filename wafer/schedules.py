"""Cerebras' learning-rate scheduler catalogue as pure jnp functions of a traced int32 step.

Every schedule is a `Schedule`: an optax-compatible callable ``step -> float32 learning rate``
(so it plugs into ``optax.scale_by_learning_rate``) carrying the metadata that chaining needs
(``initial_value``, ``total_iters``). The value is a closed form in the step ``t`` written with
jnp operations only: no Python branching on ``t``, so one compiled graph serves every step.

Stepping semantics (``docs/references.md``, "Learning-rate schedulers"): the optimizer step with
0-based index ``k`` uses ``f(k)``; on a skipped (non-finite) step ``t`` does not advance (the
caller holds it, see `wafer.optim.apply_gradients`).

Notation below: ``i`` = initial_learning_rate, ``e`` = end_learning_rate, ``T`` = total_iters.
`build_schedule` turns the YAML (legacy ``optimizer.learning_rate`` or v2 ``schedulers``) into a
`Schedule`.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from wafer.errors import ScheduleError

__all__ = (
  "SCHEDULERS",
  "Schedule",
  "ScheduleError",
  "build_schedule",
  "chained_lr",
  "constant_lr",
  "cosine_annealing_lr",
  "cosine_annealing_warm_restarts",
  "cosine_decay_lr",
  "cyclic_lr",
  "exponential_lr",
  "inverse_exponential_time_decay_lr",
  "inverse_square_root_decay_lr",
  "linear_lr",
  "multi_step_lr",
  "multiplicative_lr",
  "one_cycle_lr",
  "piecewise_constant_lr",
  "polynomial_lr",
  "sequential_lr",
  "step_lr",
)


@dataclasses.dataclass(frozen=True)
class Schedule:
  """A learning-rate schedule: ``schedule(step) -> float32`` (an optax ``Schedule``).

  Attributes:
    name: the Cerebras class name (``"LinearLR"``, ...).
    fn: the closed form, called with an int32 array ``t``.
    initial_value: the value chaining divides by (``initial_learning_rate``, ``base_lr``, ...).
    total_iters: the steps the schedule lasts, used for SequentialLR milestones; None if the
      scheduler has no such argument.
  """

  name: str
  fn: Callable[[jax.Array], jax.Array]
  initial_value: float
  total_iters: int | None = None

  def __call__(self, step: jax.typing.ArrayLike) -> jax.Array:
    t = jnp.asarray(step)
    if not jnp.issubdtype(t.dtype, jnp.integer):
      raise TypeError(f"{self.name}: the step must be an integer array, got dtype {t.dtype}")
    return jnp.asarray(self.fn(t.astype(jnp.int32)), jnp.float32)


# ----------------------------------------------------------------------------- argument checks


def _err(name: str, key: str, value: Any, allowed: str) -> ScheduleError:
  shown = repr(value)
  shown = shown if len(shown) <= 60 else f"{shown[:40]}...({len(shown)} characters)"
  return ScheduleError(f"{name}: {key}={shown}; allowed: {allowed}")


FLOAT32_MAX = 3.4028234663852886e38
"""The largest finite float32: schedules compute in float32, where a larger argument is inf."""


def _num(name: str, key: str, value: Any) -> float:
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise _err(name, key, value, "a finite number")
  try:
    v = float(value)  # an int beyond float64 (a YAML literal of 400 digits) raises OverflowError
  except OverflowError:
    v = math.inf
  if not abs(v) <= FLOAT32_MAX:
    raise _err(name, key, value, "a finite number (|x| <= 3.4e38: schedules compute in float32)")
  return v


def _rate(name: str, key: str, value: Any) -> float:
  """A learning rate (or a factor of one): a negative value would turn descent into ascent."""
  v = _num(name, key, value)
  if v < 0:
    raise _err(name, key, value, "a finite number >= 0 (a negative learning rate climbs the loss)")
  return v


def _positive(name: str, key: str, value: Any) -> float:
  v = _num(name, key, value)
  if not v > 0:
    raise _err(name, key, value, "a number > 0")
  return v


MAX_ITERS = 2**30 - 1
"""The largest step count a schedule argument takes: the step is int32, and some forms double it."""


def _int(name: str, key: str, value: Any, minimum: int = 1) -> int:
  if isinstance(value, float) and value.is_integer():
    value = int(value)
  if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_ITERS:
    raise _err(name, key, value, f"an int >= {minimum} and <= 2**30 - 1 (the step counter is int32)")
  return value


def _milestones(name: str, key: str, value: Any) -> tuple[int, ...]:
  if not isinstance(value, (list, tuple)) or not all(
    isinstance(m, int) and not isinstance(m, bool) and 0 <= m <= MAX_ITERS for m in value
  ):
    raise _err(name, key, value, "a list of ints from 0 to 2**30 - 1 (the step counter is int32)")
  if any(b <= a for a, b in zip(value, value[1:])):
    raise _err(name, key, value, "strictly increasing ints")
  return tuple(value)


def _tf(t: jax.Array) -> jax.Array:
  return t.astype(jnp.float32)


def _f32(x: float) -> jax.Array:
  return jnp.float32(x)


def _cosine(start: float, end: float, fraction: jax.Array) -> jax.Array:
  """``end + (start - end) * (1 + cos(pi * fraction)) / 2`` in float32."""
  return _f32(end) + _f32(start - end) * (1 + jnp.cos(_f32(math.pi) * fraction)) / 2


def _count_at_or_below(milestones: Sequence[int], t: jax.Array) -> jax.Array:
  """Number of milestones ``m`` with ``m <= t`` (int32, elementwise in ``t``)."""
  count = jnp.zeros_like(t)
  for m in milestones:
    count = count + (t >= m).astype(jnp.int32)
  return count


# ----------------------------------------------------------------------------- the catalogue


def constant_lr(learning_rate: float, total_iters: int | None = None) -> Schedule:
  """ConstantLR: ``lr(t) = learning_rate``; ``total_iters`` only feeds SequentialLR milestones."""
  lr = _rate("ConstantLR", "learning_rate", learning_rate)
  if total_iters is not None:
    total_iters = _int("ConstantLR", "total_iters", total_iters)
  return Schedule("ConstantLR", lambda t: jnp.zeros(t.shape, jnp.float32) + _f32(lr), lr, total_iters)


def polynomial_lr(
  initial_learning_rate: float,
  end_learning_rate: float,
  total_iters: int,
  power: float = 1.0,
  cycle: bool = False,
  *,
  name: str = "PolynomialLR",
) -> Schedule:
  """PolynomialLR: ``e`` if ``t >= T``, else ``(1 - t/(T*a))^power * (i - e) + e``.

  ``a = 1``, or ``ceil((t+1)/T)`` with ``cycle``. Cerebras applies the ``t >= T`` guard even when
  ``cycle`` is set, and for ``t < T`` the ceiling is 1, so ``cycle`` does not change the values;
  it is accepted for parity. ``1 - t/T`` is computed as ``(T - t) / T`` from the integers, the value
  as ``i w + e (1 - w)`` with ``w = (1 - t/T)^power``, and it is ``i`` itself at 0 and ``e`` itself
  from ``T`` on: inside a compiled step XLA rewrites ``1 - t/T`` and ``(i - e) w + e`` so that they
  can come out just below 0, which made a fractional power NaN past ``T`` and a decay to 0 (or a
  warm-up from 0) a negative learning rate. ``power >= 0`` (a negative one grows without bound).

  >>> s = polynomial_lr(0.1, 0.0, total_iters=10, power=2.5)
  >>> [float(v) for v in jax.jit(s)(jnp.array([10, 11, 10**6]))]
  [0.0, 0.0, 0.0]
  """
  i = _rate(name, "initial_learning_rate", initial_learning_rate)
  e = _rate(name, "end_learning_rate", end_learning_rate)
  T = _int(name, "total_iters", total_iters)
  p = _num(name, "power", power)
  if p < 0:
    raise _err(name, "power", power, "a finite number >= 0")
  if not isinstance(cycle, bool):
    raise _err(name, "cycle", cycle, "true or false")

  def fn(t: jax.Array) -> jax.Array:
    w = (_tf(T - jnp.clip(t, 0, T)) / _f32(T)) ** p  # the weight of i: 1 at t = 0, 0 from T on
    value = _f32(i) * w + _f32(e) * (1 - w)  # a convex combination of rates >= 0: never negative
    return jnp.where(t >= T, _f32(e), jnp.where(t <= 0, _f32(i), value))

  return Schedule(name, fn, i, T)


def linear_lr(
  initial_learning_rate: float, end_learning_rate: float, total_iters: int, cycle: bool = False
) -> Schedule:
  """LinearLR: `polynomial_lr` with ``power = 1``: ``i + (e - i) * min(t, T) / T``."""
  return polynomial_lr(initial_learning_rate, end_learning_rate, total_iters, 1.0, cycle, name="LinearLR")


def exponential_lr(
  initial_learning_rate: float, total_iters: int, decay_rate: float, staircase: bool = False
) -> Schedule:
  """ExponentialLR: ``i * decay_rate^(t/T)``, the exponent floored with ``staircase``; no clamp."""
  name = "ExponentialLR"
  i = _rate(name, "initial_learning_rate", initial_learning_rate)
  T = _int(name, "total_iters", total_iters)
  rate = _positive(name, "decay_rate", decay_rate)

  def fn(t: jax.Array) -> jax.Array:
    p = _tf(t) / _f32(T)
    p = jnp.floor(p) if staircase else p
    return _f32(i) * jnp.power(_f32(rate), p)

  return Schedule(name, fn, i, T)


def inverse_exponential_time_decay_lr(
  initial_learning_rate: float,
  step_exponent: float,
  total_iters: int,
  decay_rate: float,
  staircase: bool = False,
) -> Schedule:
  """InverseExponentialTimeDecayLR: ``i / (1 + decay_rate * r)``, ``r = t^step_exponent / T``,
  floored with ``staircase``."""
  name = "InverseExponentialTimeDecayLR"
  i = _rate(name, "initial_learning_rate", initial_learning_rate)
  k = _num(name, "step_exponent", step_exponent)
  T = _int(name, "total_iters", total_iters)
  rate = _rate(name, "decay_rate", decay_rate)

  def fn(t: jax.Array) -> jax.Array:
    r = jnp.power(_tf(t), _f32(k)) / _f32(T)
    r = jnp.floor(r) if staircase else r
    return _f32(i) / (1 + _f32(rate) * r)

  return Schedule(name, fn, i, T)


def inverse_square_root_decay_lr(
  initial_learning_rate: float = 1.0, scale: float = 1.0, warmup_steps: int = 1
) -> Schedule:
  """InverseSquareRootDecayLR: ``i * scale / sqrt(max(t, warmup_steps))``."""
  name = "InverseSquareRootDecayLR"
  i = _rate(name, "initial_learning_rate", initial_learning_rate)
  s = _rate(name, "scale", scale)
  w = _int(name, "warmup_steps", warmup_steps)
  return Schedule(name, lambda t: _f32(i * s) / jnp.sqrt(_tf(jnp.maximum(t, w))), i)


def cosine_decay_lr(initial_learning_rate: float, end_learning_rate: float, total_iters: int) -> Schedule:
  """CosineDecayLR: ``e + (i - e) * (1 + cos(pi * min(t, T) / T)) / 2`` (flat at ``e`` after T)."""
  name = "CosineDecayLR"
  i = _rate(name, "initial_learning_rate", initial_learning_rate)
  e = _rate(name, "end_learning_rate", end_learning_rate)
  T = _int(name, "total_iters", total_iters)
  return Schedule(
    name, lambda t: jnp.where(t >= T, _f32(e), _cosine(i, e, _tf(jnp.clip(t, 0, T)) / _f32(T))), i, T
  )


def cosine_annealing_lr(initial_learning_rate: float, T_max: int, eta_min: float = 0.0) -> Schedule:
  """CosineAnnealingLR: ``eta_min + (i - eta_min) * (1 + cos(pi * t / T_max)) / 2`` (periodic)."""
  name = "CosineAnnealingLR"
  i = _rate(name, "initial_learning_rate", initial_learning_rate)
  T = _int(name, "T_max", T_max)
  lo = _rate(name, "eta_min", eta_min)
  # cos is 2*T_max-periodic in t: reduce t in integers first so large t keeps float32 accuracy
  return Schedule(name, lambda t: _cosine(i, lo, _tf(t % (2 * T)) / _f32(T)), i)


def cosine_annealing_warm_restarts(
  initial_learning_rate: float, T_0: int, T_mult: int = 1, eta_min: float = 0.0
) -> Schedule:
  """CosineAnnealingWarmRestarts with Cerebras' ``T_cur``, reproduced for parity.

  ``lr = eta_min + (i - eta_min) * (1 + cos(pi * T_cur / T_0)) / 2`` with ``T_cur = t`` for
  ``t < T_0`` and ``T_cur = (floor(t / T_0) - 1) * T_0`` for ``t >= T_0`` (cstorch 1.9.1 and
  2.10.0; PyTorch would use ``t mod T_0``). After the first period the value therefore alternates
  per period between ``i`` (odd periods) and ``eta_min`` (even ones). ``T_mult`` other than 1
  raises, as in Cerebras.
  """
  name = "CosineAnnealingWarmRestarts"
  i = _rate(name, "initial_learning_rate", initial_learning_rate)
  T = _int(name, "T_0", T_0)
  if isinstance(T_mult, bool) or T_mult != 1:
    raise _err(name, "T_mult", T_mult, "1 only (Cerebras does not support other values)")
  lo = _rate(name, "eta_min", eta_min)

  def fn(t: jax.Array) -> jax.Array:
    t_cur = jnp.where(t < T, t, (t // T - 1) * T)
    return _cosine(i, lo, _tf(t_cur) / _f32(T))

  return Schedule(name, fn, i)


def step_lr(initial_learning_rate: float, step_size: int, gamma: float) -> Schedule:
  """StepLR: ``i * gamma^floor(t / step_size)``."""
  name = "StepLR"
  i = _rate(name, "initial_learning_rate", initial_learning_rate)
  n = _int(name, "step_size", step_size)
  g = _rate(name, "gamma", gamma)
  return Schedule(name, lambda t: _f32(i) * jnp.power(_f32(g), _tf(t // n)), i)


def multi_step_lr(initial_learning_rate: float, gamma: float, milestones: Sequence[int]) -> Schedule:
  """MultiStepLR: ``i * gamma^(number of milestones <= t)``."""
  name = "MultiStepLR"
  i = _rate(name, "initial_learning_rate", initial_learning_rate)
  g = _rate(name, "gamma", gamma)
  ms = _milestones(name, "milestones", milestones)
  return Schedule(name, lambda t: _f32(i) * jnp.power(_f32(g), _tf(_count_at_or_below(ms, t))), i)


def multiplicative_lr(initial_learning_rate: float, coefficient: float) -> Schedule:
  """MultiplicativeLR: ``i * coefficient^t``."""
  name = "MultiplicativeLR"
  i = _rate(name, "initial_learning_rate", initial_learning_rate)
  c = _rate(name, "coefficient", coefficient)
  return Schedule(name, lambda t: _f32(i) * jnp.power(_f32(c), _tf(t)), i)


def piecewise_constant_lr(learning_rates: Sequence[float], milestones: Sequence[int]) -> Schedule:
  """PiecewiseConstantLR: ``learning_rates[j]`` for ``m_{j-1} <= t < m_j``; the last holds after."""
  name = "PiecewiseConstantLR"
  ms = _milestones(name, "milestones", milestones)
  if not isinstance(learning_rates, (list, tuple)) or len(learning_rates) != len(ms) + 1:
    raise _err(
      name, "learning_rates", learning_rates, f"a list of len(milestones) + 1 = {len(ms) + 1} numbers"
    )
  lrs = [_rate(name, "learning_rates", v) for v in learning_rates]
  table = jnp.asarray(lrs, jnp.float32)
  return Schedule(name, lambda t: table[_count_at_or_below(ms, t)], lrs[0])


def cyclic_lr(
  base_lr: float,
  max_lr: float,
  step_size_up: int = 2000,
  step_size_down: int | None = None,
  mode: str = "triangular",
  gamma: float = 1.0,
  scale_mode: str = "cycle",
) -> Schedule:
  """CyclicLR: ``base + (max - base) * f * scale``.

  ``tot = up + down``, ``r = up / tot``, ``cycle = floor(1 + t/tot)``, ``x = 1 + t/tot - cycle``,
  ``f = x/r`` if ``x <= r`` else ``(x - 1)/(r - 1)``. ``scale`` is 1 (triangular),
  ``1 / 2^(cycle - 1)`` (triangular2) or ``gamma^t`` (exp_range); the mode forces ``scale_mode``.
  """
  name = "CyclicLR"
  lo = _rate(name, "base_lr", base_lr)
  hi = _rate(name, "max_lr", max_lr)
  up = _int(name, "step_size_up", step_size_up)
  down = up if step_size_down is None else _int(name, "step_size_down", step_size_down)
  modes = ("triangular", "triangular2", "exp_range")
  if mode not in modes:
    raise _err(name, "mode", mode, " | ".join(modes))
  g = _rate(name, "gamma", gamma)
  if scale_mode not in ("cycle", "iterations"):
    raise _err(name, "scale_mode", scale_mode, "cycle | iterations")
  tot = up + down

  def fn(t: jax.Array) -> jax.Array:
    # cycle = floor(1 + t/tot) and x = 1 + t/tot - cycle, from integers so large t stays exact
    cycle = _tf(t // tot + 1)
    x = _tf(t % tot) / _f32(tot)
    r = _f32(up / tot)
    f = jnp.where(x <= r, x / r, (x - 1) / (r - 1))
    if mode == "triangular":
      scale = jnp.ones_like(x)
    elif mode == "triangular2":
      scale = 1 / jnp.power(_f32(2.0), cycle - 1)
    else:
      scale = jnp.power(_f32(g), _tf(t))
    return _f32(lo) + _f32(hi - lo) * f * scale

  return Schedule(name, fn, lo)


def one_cycle_lr(
  initial_learning_rate: float,
  max_lr: float,
  total_steps: int = 1000,
  pct_start: float = 0.3,
  final_div_factor: float = 1e4,
  three_phase: bool = False,
  anneal_strategy: str = "cos",
) -> Schedule:
  """OneCycleLR: anneal ``i -> max_lr -> min`` (``min = i / final_div_factor``) over phases.

  Phase ends are ``[pct*N - 1, N - 1]``, or ``[pct*N - 1, 2*pct*N - 2, N - 1]`` with
  ``three_phase`` (``i -> max_lr -> i -> min``). In a phase from ``s`` to ``E``,
  ``p = (t - s)/(E - s)`` and the value is ``end + (start - end) * (1 + cos(pi*p))/2`` (cos) or
  ``start + (end - start) * p`` (linear). Past ``N - 1`` the value holds at ``min`` (PyTorch
  raises there; Cerebras' behaviour past the end is not documented).
  """
  name = "OneCycleLR"
  i = _rate(name, "initial_learning_rate", initial_learning_rate)
  hi = _rate(name, "max_lr", max_lr)
  n = _int(name, "total_steps", total_steps, minimum=2)
  pct = _num(name, "pct_start", pct_start)
  if not 0 < pct < 1:
    raise _err(name, "pct_start", pct_start, "a number in (0, 1)")
  lo = i / _positive(name, "final_div_factor", final_div_factor)
  if anneal_strategy not in ("cos", "linear"):
    raise _err(name, "anneal_strategy", anneal_strategy, "cos | linear")
  if three_phase:
    ends = [pct * n - 1, 2 * pct * n - 2, n - 1]
    values = [i, hi, i, lo]
  else:
    ends = [pct * n - 1, n - 1]
    values = [i, hi, lo]
  starts = [0.0, *ends[:-1]]
  if any(e <= s for s, e in zip(starts, ends)):
    raise _err(
      name, "pct_start", pct_start, f"a value giving phases of at least one step for total_steps={n}"
    )

  def anneal(start: float, end: float, p: jax.Array) -> jax.Array:
    if anneal_strategy == "cos":
      return _cosine(start, end, p)
    return _f32(start) + _f32(end - start) * p

  def fn(t: jax.Array) -> jax.Array:
    tf = _tf(t)
    out = jnp.zeros(t.shape, jnp.float32) + _f32(lo)
    for j in reversed(range(len(ends))):
      p = jnp.clip((tf - _f32(starts[j])) / _f32(ends[j] - starts[j]), 0, 1)
      out = jnp.where(tf <= _f32(ends[j]), anneal(values[j], values[j + 1], p), out)
    return out

  return Schedule(name, fn, i, n)


def sequential_lr(
  schedulers: Sequence[Schedule], milestones: Sequence[int], reset_steps: bool = True
) -> Schedule:
  """SequentialLR: ``sched_0(t)`` for ``t < m_0``; ``sched_{j+1}(max(0, t - m_j))`` for ``t >= m_j``.

  Like ``optax.join_schedules``, with the local step clamped at 0. ``reset_steps=False`` (legacy
  ``disable_lr_steps_reset: true``) gives every sub-schedule the global ``t`` instead.
  """
  name = "SequentialLR"
  scheds = list(schedulers)
  if not scheds or not all(isinstance(s, Schedule) for s in scheds):
    raise _err(name, "schedulers", schedulers, "a non-empty list of schedulers")
  if not isinstance(milestones, (list, tuple)) or not all(
    isinstance(m, int) and not isinstance(m, bool) for m in milestones
  ):
    raise _err(name, "milestones", milestones, "a list of ints")
  ms = _milestones(name, "milestones", milestones)
  if len(ms) != len(scheds) - 1:
    raise _err(
      name,
      "milestones",
      list(ms),
      f"len(schedulers) - 1 = {len(scheds) - 1} milestones for {len(scheds)} schedulers",
    )

  def fn(t: jax.Array) -> jax.Array:
    out = scheds[0](t)
    for m, sched in zip(ms, scheds[1:]):
      local = jnp.maximum(t - m, 0) if reset_steps else t
      out = jnp.where(t < m, out, sched(local))
    return out

  totals = [s.total_iters for s in scheds]
  total = None if None in totals else (ms[-1] if ms else 0) + totals[-1]
  return Schedule(name, fn, scheds[0].initial_value, total)


def chained_lr(schedulers: Sequence[Schedule]) -> Schedule:
  """ChainedScheduler: ``sched_0(t) * prod_{j>=1} sched_j(t) / sched_j.initial_value``; all share t."""
  name = "ChainedScheduler"
  scheds = list(schedulers)
  if not scheds or not all(isinstance(s, Schedule) for s in scheds):
    raise _err(name, "schedulers", schedulers, "a non-empty list of schedulers")
  for s in scheds:
    if s.name == "OneCycleLR":
      raise _err(name, "schedulers", s.name, "chainable schedulers (OneCycleLR is not chainable)")
  for s in scheds[1:]:
    if s.initial_value == 0:
      raise _err(
        name,
        "schedulers",
        f"{s.name} with initial value 0",
        "schedulers after the first with a non-zero initial value (the chain divides by it)",
      )

  def fn(t: jax.Array) -> jax.Array:
    out = scheds[0](t)
    for s in scheds[1:]:
      out = out * (s(t) / _f32(s.initial_value))
    return out

  return Schedule(name, fn, scheds[0].initial_value)


# ----------------------------------------------------------------------------- the YAML builder

SCHEDULERS: dict[str, Callable[..., Schedule]] = {
  "ConstantLR": constant_lr,
  "LinearLR": linear_lr,
  "PolynomialLR": polynomial_lr,
  "ExponentialLR": exponential_lr,
  "InverseExponentialTimeDecayLR": inverse_exponential_time_decay_lr,
  "InverseSquareRootDecayLR": inverse_square_root_decay_lr,
  "CosineDecayLR": cosine_decay_lr,
  "CosineAnnealingLR": cosine_annealing_lr,
  "CosineAnnealingWarmRestarts": cosine_annealing_warm_restarts,
  "StepLR": step_lr,
  "MultiStepLR": multi_step_lr,
  "MultiplicativeLR": multiplicative_lr,
  "PiecewiseConstantLR": piecewise_constant_lr,
  "CyclicLR": cyclic_lr,
  "OneCycleLR": one_cycle_lr,
  "SequentialLR": sequential_lr,
  "ChainedScheduler": chained_lr,
}
"""Cerebras class name -> builder; the builder's keyword arguments are the YAML keys."""

_NAME_ALIASES = {"chainedlr": "ChainedScheduler"}
_LOWER_NAMES = {n.lower(): n for n in SCHEDULERS} | _NAME_ALIASES
# 1.x YAML keys -> the class argument they stand for.
_LEGACY_KEYS = {
  "steps": "total_iters",
  "decay_steps": "total_iters",
  "t_max": "T_max",
  "t_0": "T_0",
  "t_mult": "T_mult",
  "values": "learning_rates",
  "boundaries": "milestones",
}
_STRING_KEYS = frozenset({"mode", "scale_mode", "anneal_strategy"})
_INTERNAL_ARGS = frozenset({"name", "reset_steps"})


def first_overflow(schedule: Schedule, last_step: int, samples: int = 1 << 12) -> tuple[int, float] | None:
  """``(step, value)`` of the first checked step in ``0..last_step`` whose rate is not finite in float32, or None.

  Steps ``0 .. samples-1`` are all checked (the first such step exactly), later ones at ``samples`` evenly
  spaced points and ``last_step``: a growing schedule (ExponentialLR with ``decay_rate > 1``) is caught at
  most ``last_step / samples`` steps after it overflows.

  >>> first_overflow(build_schedule({"scheduler": "ExponentialLR", "initial_learning_rate": 0.1,
  ...   "decay_rate": 1e10, "total_iters": 1}), 10)
  (4, inf)
  >>> first_overflow(build_schedule(0.1), 10**9) is None
  True
  """
  import numpy as np

  if schedule.name == "ConstantLR":  # its rate was checked finite when it was built
    return None
  dense = np.arange(min(last_step, samples - 1) + 1)
  spread = np.linspace(0, last_step, samples).astype(np.int64) if last_step >= samples else dense[:0]
  steps = np.unique(np.concatenate([dense, spread, [last_step]])).astype(np.int32)
  # one small compile (~40 ms); evaluated op by op, each op compiled for these shapes took ~0.5 s
  values = np.asarray(jax.jit(schedule)(jnp.asarray(steps)))
  bad = np.flatnonzero(~np.isfinite(values))
  return None if not bad.size else (int(steps[bad[0]]), float(values[bad[0]]))


def _did_you_mean(word: str, options: Sequence[str]) -> str:
  lower = {o.lower(): o for o in options}
  close = difflib.get_close_matches(word.lower(), list(lower), n=1, cutoff=0.6)
  return f" Did you mean {lower[close[0]]!r}?" if close else ""


def _resolve_name(name: Any, path: str) -> str:
  """The class name for a YAML scheduler name: case-insensitive, with an optional ``LR`` suffix."""
  if isinstance(name, str):
    key = name.strip().lower()
    for candidate in (key, key + "lr"):
      if candidate in _LOWER_NAMES:
        return _LOWER_NAMES[candidate]
  hint = _did_you_mean(name, [*SCHEDULERS, "ChainedLR"]) if isinstance(name, str) else ""
  raise ScheduleError(
    f"{path}: Invalid lr_scheduler type {name!r}.{hint} Expected one of "
    f"[{', '.join(SCHEDULERS)}] (case-insensitive, the 'LR' suffix optional)"
  )


def _is_v2_item(node: Any) -> bool:
  return (
    isinstance(node, dict)
    and len(node) == 1
    and "scheduler" not in node
    and (isinstance(next(iter(node.values())), dict) or next(iter(node.values())) is None)
  )


def _coerce(key: str, value: Any) -> Any:
  """YAML reads ``1e-4`` as a string; numeric strings become floats (except string-valued keys)."""
  if isinstance(value, str) and key not in _STRING_KEYS:
    try:
      return float(value)
    except ValueError:
      return value
  return value


def _make(name: str, args: dict[str, Any], path: str, reset_steps: bool) -> Schedule:
  """Build scheduler ``name`` from its YAML arguments (legacy key names accepted)."""
  builder = SCHEDULERS[name]
  params = {p.name: p for p in inspect.signature(builder).parameters.values() if p.name not in _INTERNAL_ARGS}
  kwargs: dict[str, Any] = {}
  written: dict[str, str] = {}  # argument -> the 1.x key the file wrote for it (errors name that key)
  for key, value in args.items():
    target = _LEGACY_KEYS.get(key, key) if key not in params else key
    if target != key:
      written[target] = key
    if target == "param_group_tags" or target == "adjust_learning_rate":
      if value is None:
        continue
      raise ScheduleError(
        f"{path}.{key}={value!r}: {name}: not supported (wafer has one param group); "
        "allowed: null or leave it out"
      )
    if target not in params:
      raise ScheduleError(
        f"{path}.{key}: {name}: unknown key {key!r}.{_did_you_mean(key, list(params))} "
        f"Allowed keys: {', '.join(params)}"
      )
    if target in kwargs:
      raise ScheduleError(f"{path}: {name}: {key!r} repeats {target!r}; give only one of them")
    kwargs[target] = _coerce(target, value)
  optional = {"milestones"} if name == "SequentialLR" else set()  # computed from total_iters
  missing = [
    p
    for p, spec in params.items()
    if spec.default is inspect.Parameter.empty and p not in kwargs and p not in optional
  ]
  if missing:
    raise ScheduleError(
      f"{path}: {name}: missing required key(s) {', '.join(missing)}; allowed keys: {', '.join(params)}"
    )
  if name in ("SequentialLR", "ChainedScheduler"):
    subs = kwargs["schedulers"]
    if not isinstance(subs, list) or not subs:
      raise ScheduleError(f"{path}.schedulers={subs!r}: {name}: allowed: a non-empty list of schedulers")
    kwargs["schedulers"] = [
      _build_node(s, f"{path}.schedulers[{k}]", reset_steps) for k, s in enumerate(subs)
    ]
    if name == "SequentialLR":
      kwargs["milestones"] = _check_milestones(
        kwargs["schedulers"], kwargs.get("milestones"), path, f"{path}.schedulers"
      )
      kwargs["reset_steps"] = reset_steps
  try:
    return builder(**kwargs)
  except ScheduleError as err:
    text = str(err)
    for target, key in written.items():  # this scheduler's arguments, as the file spelled them
      text = re.sub(rf"\b{target}\b", key, text)
    raise ScheduleError(f"{path}: {text}") from None


def _check_milestones(scheds: list[Schedule], given: Any, path: str, items_path: str) -> list[int]:
  """SequentialLR milestones: the cumulative ``total_iters`` of all but the last sub-scheduler."""
  totals = [s.total_iters for s in scheds[:-1]]
  computed = None if None in totals else [int(sum(totals[: k + 1])) for k in range(len(totals))]
  if given is None:
    if computed is None:
      k = totals.index(None)
      raise ScheduleError(
        f"{items_path}[{k}]: {scheds[k].name} has no total_iters, so SequentialLR "
        "cannot compute its milestones; add total_iters (steps) or give milestones"
      )
    return computed
  if computed is not None and list(given) != computed:
    raise ScheduleError(f"{path}: Expected SequentialLR to have milestones {computed}, but got {list(given)}")
  return list(given)


def _build_list(items: list[Any], path: str, reset_steps: bool) -> Schedule:
  """Legacy list: SequentialLR, or ChainedScheduler if an element says ``main_scheduler: chained``."""
  if not items:
    raise ScheduleError(f"{path}=[]: allowed: a number, a scheduler, or a non-empty list of schedulers")
  if all(_is_v2_item(item) for item in items) and len(items) > 1:
    raise ScheduleError(
      f"{path}: {len(items)} top-level schedulers; allowed: one (wrap several in "
      "SequentialLR: {schedulers: [...]} or ChainedScheduler: {schedulers: [...]})"
    )
  mains = set()
  for k, item in enumerate(items):
    if isinstance(item, dict) and item.get("main_scheduler") is not None:
      raw = str(item["main_scheduler"]).lower()
      kind = {
        "chained": "chained",
        "chainedlr": "chained",
        "chainedscheduler": "chained",
        "sequential": "sequential",
        "sequentiallr": "sequential",
      }.get(raw)
      if kind is None:
        raise ScheduleError(
          f"{path}[{k}].main_scheduler={item['main_scheduler']!r}: allowed: chained | sequential"
        )
      mains.add(kind)
  if len(mains) > 1:
    raise ScheduleError(
      f"{path}: conflicting main_scheduler values {sorted(mains)}; allowed: one kind per list"
    )
  scheds = [_build_node(item, f"{path}[{k}]", reset_steps) for k, item in enumerate(items)]
  if len(scheds) == 1:
    return scheds[0]
  if mains == {"chained"}:
    return chained_lr(scheds)
  return sequential_lr(scheds, _check_milestones(scheds, None, path, path), reset_steps=reset_steps)


def _build_node(node: Any, path: str, reset_steps: bool) -> Schedule:
  if isinstance(node, Schedule):
    return node
  if isinstance(node, str):
    node = _coerce("learning_rate", node)
  if isinstance(node, (int, float)) and not isinstance(node, bool):
    return constant_lr(node)
  if isinstance(node, list):
    return _build_list(node, path, reset_steps)
  if isinstance(node, dict) and "scheduler" in node:
    args = {k: v for k, v in node.items() if k not in ("scheduler", "main_scheduler")}
    return _make(_resolve_name(node["scheduler"], f"{path}.scheduler"), args, path, reset_steps)
  if _is_v2_item(node):
    ((raw, args),) = node.items()
    name = _resolve_name(raw, path)
    return _make(name, args or {}, f"{path}.{raw}", reset_steps)
  raise ScheduleError(
    f"{path}={node!r}: allowed: a number, {{scheduler: NAME, ...}}, {{NAME: {{...}}}}, "
    "or a list of schedulers"
  )


def build_schedule(
  spec: Any, *, path: str = "optimizer.learning_rate", disable_lr_steps_reset: bool = False
) -> Schedule:
  """A `Schedule` from the YAML, either layout.

  * legacy ``optimizer.learning_rate``: a number (ConstantLR); ``{scheduler: NAME, ...args}``; a
    list of those, which is a SequentialLR with milestones the cumulative ``total_iters`` of all
    but the last element, or a ChainedScheduler if an element has ``main_scheduler: chained``. A
    one-element list is that scheduler. 1.x keys (``steps``, ``decay_steps``, ``t_max``, ``t_0``,
    ``t_mult``, ``values``, ``boundaries``) are accepted.
  * v2 ``trainer.init.schedulers``: ``[{SequentialLR: {schedulers: [{LinearLR: {...}}, ...]}}]`` or
    one ``{NAME: {...}}``; missing SequentialLR milestones are computed as above, and given ones
    must equal the computed ones.

  Names are case-insensitive with an optional ``LR`` suffix (``linear``, ``CosineDecay``).

  Args:
    spec: the YAML value (already parsed).
    path: the key path named in error messages.
    disable_lr_steps_reset: the 1.x flag: sub-schedules of a SequentialLR see the global step.

  Raises:
    ScheduleError: naming the key path, the scheduler, the bad key or value and what is allowed.
  """
  return _build_node(spec, path, not disable_lr_steps_reset)
