"""The scheduler catalogue against float64 closed forms written here, the no-recompile rule and
the YAML builder (``docs/references.md``, "Learning-rate schedulers" and "Example configs")."""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.samples import bert_base_optimizer
from wafer import schedules as S


def around(*milestones: int) -> list[int]:
  """0, every milestone and its neighbours, and a step far past the end."""
  ts = {0, 1, 10 * max(milestones) + 12345}
  for m in milestones:
    ts |= {max(m - 1, 0), m, m + 1}
  return sorted(ts)


# ----------------------------------------------------------------------------- float64 references


def ref_poly(i, e, T, power=1.0, cycle=False):
  def f(t):
    if t >= T:
      return e
    alpha = math.ceil((t + 1) / T) if cycle else 1.0
    return (1 - t / (T * alpha)) ** power * (i - e) + e

  return f


def ref_cos(start, end, p):
  return end + (start - end) * (1 + math.cos(math.pi * p)) / 2


def ref_warm_restarts(i, T0, eta):
  def f(t):
    t_cur = t if t < T0 else (t // T0 - 1) * T0
    return ref_cos(i, eta, t_cur / T0)

  return f


def ref_cyclic(base, top, up, down, mode, gamma=1.0):
  def f(t):
    tot = up + down
    cycle = math.floor(1 + t / tot)
    x = 1 + t / tot - cycle
    r = up / tot
    frac = x / r if x <= r else (x - 1) / (r - 1)
    scale = {"triangular": 1.0, "triangular2": 1 / 2 ** (cycle - 1), "exp_range": gamma**t}[mode]
    return base + (top - base) * frac * scale

  return f


def ref_one_cycle(i, top, n, pct, fdf, three, strategy):
  lo = i / fdf
  if three:
    ends, vals = [pct * n - 1, 2 * pct * n - 2, n - 1], [i, top, i, lo]
  else:
    ends, vals = [pct * n - 1, n - 1], [i, top, lo]

  def f(t):
    start = 0.0
    for j, end in enumerate(ends):
      if t <= end:
        p = (t - start) / (end - start)
        a, b = vals[j], vals[j + 1]
        return ref_cos(a, b, p) if strategy == "cos" else a + (b - a) * p
      start = end
    return lo

  return f


def ref_sequential(refs, milestones):
  def f(t):
    out = refs[0](t)
    for m, r in zip(milestones, refs[1:]):
      if t >= m:
        out = r(max(0, t - m))
    return out

  return f


CASES: list[tuple[str, Callable[[], S.Schedule], Callable[[int], float], list[int]]] = [
  ("constant", lambda: S.constant_lr(0.25), lambda t: 0.25, around(5)),
  ("linear_up", lambda: S.linear_lr(0.0, 1e-3, 100), ref_poly(0.0, 1e-3, 100), around(100)),
  ("linear_down", lambda: S.linear_lr(2e-3, 1e-4, 77), ref_poly(2e-3, 1e-4, 77), around(77)),
  (
    "polynomial",
    lambda: S.polynomial_lr(1.0, 0.1, 50, power=2.0),
    ref_poly(1.0, 0.1, 50, 2.0),
    around(25, 50),
  ),
  (
    "polynomial_cycle",
    lambda: S.polynomial_lr(1.0, 0.1, 50, 0.5, cycle=True),
    ref_poly(1.0, 0.1, 50, 0.5, cycle=True),
    around(50, 100),
  ),
  ("exponential", lambda: S.exponential_lr(0.1, 30, 0.5), lambda t: 0.1 * 0.5 ** (t / 30), around(30, 60)),
  (
    "exponential_staircase",
    lambda: S.exponential_lr(0.1, 30, 0.8, staircase=True),
    lambda t: 0.1 * 0.8 ** math.floor(t / 30),
    around(30, 60),
  ),
  (
    "inv_exp_time",
    lambda: S.inverse_exponential_time_decay_lr(0.5, 1.5, 40, 0.3),
    lambda t: 0.5 / (1 + 0.3 * (t**1.5 / 40)),
    around(40),
  ),
  (
    "inv_exp_time_staircase",
    lambda: S.inverse_exponential_time_decay_lr(0.5, 1.0, 40, 0.3, staircase=True),
    lambda t: 0.5 / (1 + 0.3 * math.floor(t / 40)),
    around(40, 80),
  ),
  (
    "inv_sqrt",
    lambda: S.inverse_square_root_decay_lr(2.0, 0.5, 16),
    lambda t: 2.0 * 0.5 / math.sqrt(max(t, 16)),
    around(16),
  ),
  (
    "cosine_decay",
    lambda: S.cosine_decay_lr(1e-3, 1e-5, 90),
    lambda t: ref_cos(1e-3, 1e-5, min(t, 90) / 90),
    around(45, 90),
  ),
  (
    "cosine_annealing",
    lambda: S.cosine_annealing_lr(1e-3, 60, 1e-4),
    lambda t: ref_cos(1e-3, 1e-4, t / 60),
    around(30, 60, 120),
  ),
  (
    "warm_restarts",
    lambda: S.cosine_annealing_warm_restarts(1.0, 20, 1, 0.1),
    ref_warm_restarts(1.0, 20, 0.1),
    around(10, 20, 30, 40, 60),
  ),
  ("step", lambda: S.step_lr(1.0, 7, 0.5), lambda t: 0.5 ** (t // 7), around(7, 14)),
  (
    "multistep",
    lambda: S.multi_step_lr(1.0, 0.1, [10, 25, 60]),
    lambda t: 0.1 ** sum(m <= t for m in (10, 25, 60)),
    around(10, 25, 60),
  ),
  ("multiplicative", lambda: S.multiplicative_lr(0.3, 0.999), lambda t: 0.3 * 0.999**t, around(100)),
  (
    "piecewise",
    lambda: S.piecewise_constant_lr([0.1, 0.05, 0.01], [100, 300]),
    lambda t: [0.1, 0.05, 0.01][sum(m <= t for m in (100, 300))],
    around(100, 300),
  ),
  (
    "cyclic_triangular",
    lambda: S.cyclic_lr(0.1, 1.0, 10, 5),
    ref_cyclic(0.1, 1.0, 10, 5, "triangular"),
    around(10, 15, 25, 30),
  ),
  (
    "cyclic_triangular2",
    lambda: S.cyclic_lr(0.1, 1.0, 8, mode="triangular2"),
    ref_cyclic(0.1, 1.0, 8, 8, "triangular2"),
    around(8, 16, 24, 32),
  ),
  (
    "cyclic_exp_range",
    lambda: S.cyclic_lr(0.1, 1.0, 8, 12, mode="exp_range", gamma=0.99),
    ref_cyclic(0.1, 1.0, 8, 12, "exp_range", 0.99),
    around(8, 20, 28, 40),
  ),
  (
    "one_cycle_cos",
    lambda: S.one_cycle_lr(0.04, 1.0, 100, 0.3, 1e4),
    ref_one_cycle(0.04, 1.0, 100, 0.3, 1e4, False, "cos"),
    around(29, 99),
  ),
  (
    "one_cycle_linear3",
    lambda: S.one_cycle_lr(0.04, 1.0, 100, 0.25, 100.0, True, "linear"),
    ref_one_cycle(0.04, 1.0, 100, 0.25, 100.0, True, "linear"),
    around(24, 48, 99),
  ),
  (
    "sequential",
    lambda: S.sequential_lr(
      [S.linear_lr(0.0, 1e-3, 50), S.cosine_decay_lr(1e-3, 1e-4, 200), S.constant_lr(1e-4)], [50, 250]
    ),
    ref_sequential(
      [ref_poly(0.0, 1e-3, 50), lambda t: ref_cos(1e-3, 1e-4, min(t, 200) / 200), lambda t: 1e-4], [50, 250]
    ),
    around(50, 150, 250),
  ),
  (
    "chained",
    lambda: S.chained_lr(
      [S.step_lr(1.0, 10, 0.5), S.exponential_lr(2.0, 40, 0.5), S.linear_lr(4.0, 1.0, 30)]
    ),
    lambda t: 0.5 ** (t // 10) * (2.0 * 0.5 ** (t / 40) / 2.0) * (ref_poly(4.0, 1.0, 30)(t) / 4.0),
    around(10, 30, 40),
  ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_schedule_matches_float64_closed_form(case) -> None:
  _, make, ref, ts = case
  sched = make()
  got = np.asarray(jax.jit(sched)(jnp.asarray(ts, jnp.int32)))
  want = np.array([ref(t) for t in ts], np.float64)
  assert got.dtype == np.float32
  scale = np.max(np.abs(want))
  np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6 * scale)


def test_compiled_once_across_every_milestone() -> None:
  """One AOT compile of a schedule covering the catalogue; every milestone runs on that graph."""
  cases = [c for c in CASES if c[0] != "constant"]
  scheds = [make() for _, make, _, _ in cases]
  traces = []

  def all_lrs(t: jax.Array) -> jax.Array:
    traces.append(1)
    return jnp.stack([s(t) for s in scheds])

  compiled = jax.jit(all_lrs).lower(jax.ShapeDtypeStruct((), jnp.int32)).compile()
  jitted = jax.jit(all_lrs)
  steps = sorted({t for c in cases for t in c[3]})
  inputs = [np.int32(t) for t in steps]
  jitted(inputs[0])  # the one compile of the jitted path
  traced_before = len(traces)
  compiles: list[str] = []
  listener = lambda name, *_, **__: compiles.append(name) if "backend_compile" in name else None
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    rows = [(np.asarray(compiled(x)), np.asarray(jitted(x))) for x in inputs]
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert compiles == []  # nothing was compiled while stepping through the milestones
  assert len(traces) == traced_before and jitted._cache_size() == 1  # no retrace, one cached graph
  for (_, _, ref, _), column in zip(cases, zip(*[a for a, _ in rows])):
    want = np.array([ref(t) for t in steps])
    np.testing.assert_allclose(column, want, rtol=2e-5, atol=2e-6 * np.max(np.abs(want)))
  for aot, jit_value in rows:
    np.testing.assert_array_equal(aot, jit_value)


def test_schedule_rejects_float_steps_and_plugs_into_optax() -> None:
  import optax

  sched = S.linear_lr(1.0, 0.0, 4)
  with pytest.raises(TypeError, match="integer"):
    sched(jnp.float32(1.0))
  tx = optax.sgd(sched)
  params = {"w": jnp.ones(2, jnp.float32)}
  state = tx.init(params)
  for k in range(3):
    updates, state = tx.update({"w": jnp.ones(2, jnp.float32)}, state)
    np.testing.assert_allclose(np.asarray(updates["w"]), -(1.0 - k / 4) * np.ones(2), rtol=1e-6)


# ----------------------------------------------------------------------------- the YAML builder

BERT_LR = bert_base_optimizer()["learning_rate"]  # the shipped BERT-base schedule


def _values(sched: S.Schedule, ts: list[int]) -> np.ndarray:
  return np.asarray(jax.jit(sched)(jnp.asarray(ts, jnp.int32)))


def test_bert_base_legacy_list_is_sequential_with_milestone_3200() -> None:
  peak = 0.0001767766952966369
  ref = ref_sequential([ref_poly(0.0, peak, 3200), ref_poly(peak, 0.0, 77600)], [3200])
  ts = around(3200, 80800)
  sched = S.build_schedule(BERT_LR)
  assert sched.name == "SequentialLR" and sched.total_iters == 80800
  np.testing.assert_allclose(_values(sched, ts), [ref(t) for t in ts], rtol=2e-5, atol=1e-11)
  # the 1.9.1 spelling (steps) gives the same schedule
  legacy = [
    {**{k: v for k, v in d.items() if k != "total_iters"}, "steps": d["total_iters"]} for d in BERT_LR
  ]
  np.testing.assert_array_equal(_values(S.build_schedule(legacy), ts), _values(sched, ts))


def test_v2_sequential_computes_and_checks_milestones() -> None:
  spec = [
    {
      "SequentialLR": {
        "schedulers": [
          {"LinearLR": {"initial_learning_rate": 0.0, "end_learning_rate": 2e-4, "total_iters": 346}},
          {"CosineDecayLR": {"initial_learning_rate": 2e-4, "end_learning_rate": 2e-5, "total_iters": 23988}},
        ]
      }
    }
  ]
  ref = ref_sequential(
    [ref_poly(0.0, 2e-4, 346), lambda t: ref_cos(2e-4, 2e-5, min(t, 23988) / 23988)], [346]
  )
  ts = around(346, 346 + 23988)
  sched = S.build_schedule(spec, path="trainer.init.schedulers")
  np.testing.assert_allclose(_values(sched, ts), [ref(t) for t in ts], rtol=2e-5, atol=1e-11)
  spec[0]["SequentialLR"]["milestones"] = [300]
  with pytest.raises(
    S.ScheduleError, match=r"Expected SequentialLR to have milestones \[346\], but got \[300\]"
  ):
    S.build_schedule(spec, path="trainer.init.schedulers")


@pytest.mark.parametrize("name", ["linear", "LINEAR", "LinearLR", "linearlr"])
def test_names_are_case_insensitive_with_optional_lr_suffix(name: str) -> None:
  sched = S.build_schedule(
    {"scheduler": name, "initial_learning_rate": 1.0, "end_learning_rate": 0.0, "total_iters": 10}
  )
  assert sched.name == "LinearLR"


def test_number_and_numeric_string_are_constant() -> None:
  assert float(S.build_schedule(0.001)(jnp.int32(7))) == np.float32(0.001)
  assert float(S.build_schedule("1e-4")(jnp.int32(7))) == np.float32(1e-4)


def test_main_scheduler_chained() -> None:
  spec = [
    {
      "scheduler": "Step",
      "initial_learning_rate": 1.0,
      "step_size": 5,
      "gamma": 0.5,
      "main_scheduler": "chained",
    },
    {"scheduler": "Exponential", "initial_learning_rate": 3.0, "total_iters": 10, "decay_rate": 0.1},
  ]
  ts = around(5, 10)
  want = [0.5 ** (t // 5) * 0.1 ** (t / 10) for t in ts]
  np.testing.assert_allclose(_values(S.build_schedule(spec), ts), want, rtol=2e-5, atol=1e-30)


def test_disable_lr_steps_reset_gives_the_global_step() -> None:
  spec = [
    {"scheduler": "Constant", "learning_rate": 1.0, "steps": 10},
    {"scheduler": "Linear", "initial_learning_rate": 1.0, "end_learning_rate": 0.0, "steps": 20},
  ]
  ts = [0, 9, 10, 15, 20, 30]
  np.testing.assert_allclose(
    _values(S.build_schedule(spec, disable_lr_steps_reset=True), ts), [1, 1, 0.5, 0.25, 0, 0], atol=1e-7
  )
  np.testing.assert_allclose(_values(S.build_schedule(spec), ts), [1, 1, 1, 0.75, 0.5, 0], atol=1e-7)


ERROR_CASES = [
  (
    {"scheduler": "Linaer", "initial_learning_rate": 1.0},
    r"Invalid lr_scheduler type 'Linaer'\. "
    r"Did you mean 'LinearLR'\?.*Expected one of \[ConstantLR",
  ),
  (
    {"scheduler": "Linear", "initial_learning_rate": 1.0, "end_learnig_rate": 0.0, "total_iters": 5},
    r"optimizer\.learning_rate\.end_learnig_rate: LinearLR: unknown key 'end_learnig_rate'\. Did you mean 'end_learning_rate'\?",
  ),
  (
    {"scheduler": "Linear", "initial_learning_rate": 1.0, "end_learning_rate": 0.0},
    r"LinearLR: missing required key\(s\) total_iters",
  ),
  (
    {"scheduler": "Linear", "initial_learning_rate": 1.0, "end_learning_rate": 0.0, "total_iters": 0},
    r"LinearLR: total_iters=0; allowed: an int >= 1",
  ),
  (
    {"scheduler": "CosineAnnealingWarmRestarts", "initial_learning_rate": 1.0, "t_0": 10, "t_mult": 2},
    r"CosineAnnealingWarmRestarts: t_mult=2; allowed: 1 only",  # the key as the file wrote it
  ),
  (
    {"scheduler": "Cyclic", "base_lr": 0.1, "max_lr": 1.0, "mode": "triangle"},
    r"CyclicLR: mode='triangle'; allowed: triangular \| triangular2 \| exp_range",
  ),
  (
    [
      {"scheduler": "Step", "initial_learning_rate": 1.0, "step_size": 5, "gamma": 0.5},
      {"scheduler": "Constant", "learning_rate": 0.1},
    ],
    r"learning_rate\[0\]: StepLR has no total_iters",
  ),
  (
    [
      {"scheduler": "Constant", "learning_rate": 1.0, "total_iters": 3, "main_scheduler": "chained"},
      {"scheduler": "Constant", "learning_rate": 0.1, "main_scheduler": "sequential"},
    ],
    r"conflicting main_scheduler values",
  ),
  (
    {"scheduler": "PiecewiseConstant", "values": [1.0, 0.5], "boundaries": [10, 20]},
    r"PiecewiseConstantLR: values=\[1\.0, 0\.5\]; allowed: a list of len\(boundaries\) \+ 1 = 3",
  ),
  (
    {
      "SequentialLR": {
        "schedulers": [
          {"ConstantLR": {"learning_rate": 1.0, "total_iters": 4}},
          {"ConstantLR": {"learning_rate": 2.0}},
        ],
        "milestones": [4, 8],
      }
    },
    r"Expected SequentialLR to have milestones \[4\], but got \[4, 8\]",
  ),
  (
    {"scheduler": "Linear", "initial_learning_rate": "fast", "end_learning_rate": 0.0, "total_iters": 5},
    r"LinearLR: initial_learning_rate='fast'; allowed: a finite number",
  ),
]


@pytest.mark.parametrize("spec,message", ERROR_CASES)
def test_builder_errors_name_the_key_value_and_what_is_allowed(spec, message: str) -> None:
  with pytest.raises(S.ScheduleError, match=message):
    S.build_schedule(spec)


def test_direct_builder_errors() -> None:
  with pytest.raises(S.ScheduleError, match=r"milestones=\[\]; allowed: len\(schedulers\) - 1 = 1"):
    S.sequential_lr([S.constant_lr(1.0), S.constant_lr(2.0)], [])
  with pytest.raises(S.ScheduleError, match="OneCycleLR is not chainable"):
    S.chained_lr([S.constant_lr(1.0), S.one_cycle_lr(0.1, 1.0, 100)])
  with pytest.raises(S.ScheduleError, match="pct_start=1.5; allowed: a number in"):
    S.one_cycle_lr(0.1, 1.0, 100, pct_start=1.5)


@pytest.mark.parametrize(
  "spec, key",
  [
    (
      {"scheduler": "Exponential", "initial_learning_rate": 0.1, "decay_steps": 0, "decay_rate": 0.5},
      "decay_steps",
    ),
    ({"scheduler": "Linear", "initial_learning_rate": 0.1, "end_learning_rate": 0.0, "steps": 0}, "steps"),
    (
      {"scheduler": "CosineDecay", "initial_learning_rate": 0.1, "end_learning_rate": 0.0, "steps": -3},
      "steps",
    ),
  ],
)
def test_an_error_names_the_1x_key_the_file_wrote(spec, key):
  """decay_steps: 0 was reported as 'total_iters=0', a key the file does not have."""
  with pytest.raises(S.ScheduleError, match=rf"{key}={spec[key]}; allowed") as caught:
    S.build_schedule(spec)
  assert "total_iters" not in str(caught.value)
