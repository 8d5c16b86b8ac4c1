"""Throughput of `precision.round` under jax.jit against XLA's native cast, gfloat and ml_dtypes.

Input: 2^24 float32 values N(0,1) * 2^U(-45, 40) (the cbfloat16 subnormal, normal and overflow
ranges) plus specials. Baseline, measured in the same run: XLA's native round trip
``x.astype(bfloat16).astype(float32)`` under jax.jit, compiled with
``xla_allow_excess_precision=False`` (for the baseline only: `BASELINE_OPTIONS`). With that
option on (XLA's default), XLA's GPU compiler removes ``f32 -> bf16 -> f32`` convert pairs
(its SimplifyFPConversions pass), so on a GPU the default baseline would not round at all and
would time a copy; the benchmark checks that the compiled baseline rounds. `precision.round`
itself needs no option: it rounds with integer bit operations and ``reduce_precision``, which
excess precision does not remove (see docs/gpu.md).

This machine is noisy, so each candidate is timed in paired rounds: the baseline and the
candidate back to back, alternating which goes first. The headline ratio is the median over rounds of
baseline_time / candidate_time (> 1 means faster than the baseline); the ratio of the best
(minimum) times is printed too. Targets (issue "Foundation and the precision core"):
cbfloat16 nearest_even >= 1.0x, stochastic >= 0.3x.

  python benchmarks/rounding.py                  # writes benchmarks/results/rounding.json
  python benchmarks/rounding.py --rounds 5 --size 20 --skip-slow
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import gfloat
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

import precision
from precision.testing import gfloat_format_info, same_floats

RESULTS = Path(__file__).resolve().parent / "results"
BASELINE_OPTIONS = {"xla_allow_excess_precision": False}  # XLA keeps the convert pair: it rounds
BASELINE = "jit x.astype(bfloat16).astype(float32), compiled with xla_allow_excess_precision=False"


def make_baseline(x: jax.Array) -> Callable:
  """XLA's native bfloat16 round trip, compiled for ``x``'s shape so that it rounds on every backend."""
  fn = jax.jit(lambda v: v.astype(jnp.bfloat16).astype(jnp.float32))
  return fn.lower(x).compile(compiler_options=BASELINE_OPTIONS)


TARGETS = {"precision cbfloat16 nearest_even": 1.0, "precision cbfloat16 stochastic": 0.3}


def make_input(log2_size: int) -> np.ndarray:
  n = 1 << log2_size
  rng = np.random.default_rng(0)
  x = (rng.standard_normal(n) * 2.0 ** rng.uniform(-45, 40, n)).astype(np.float32)
  x[:8] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, 2.0**-39, 2.0**-40]
  return x


def gfloat_jit(fmt: precision.FloatFormat) -> Callable:
  info = gfloat_format_info(fmt)

  @jax.jit
  def f(x):
    with warnings.catch_warnings():
      warnings.filterwarnings("ignore", "Explicitly requested dtype int64", UserWarning)
      return gfloat.round_ndarray(info, x)

  return f


def candidates(key: jax.Array, skip_slow: bool) -> dict[str, tuple[Callable, str]]:
  """name -> (function of the input, 'jax' or 'numpy' for which array it takes)."""
  cb, bf = precision.cbfloat16, precision.bfloat16
  out: dict[str, tuple[Callable, str]] = {
    "precision cbfloat16 nearest_even": (jax.jit(lambda x: precision.round(x, cb)), "jax"),
    "precision cbfloat16 stochastic": (
      jax.jit(lambda x: precision.round(x, cb, "stochastic", key=key)),
      "jax",
    ),
    "precision cbfloat16 toward_zero": (jax.jit(lambda x: precision.round(x, cb, "toward_zero")), "jax"),
    "precision bfloat16 nearest_even": (jax.jit(lambda x: precision.round(x, bf)), "jax"),
    "precision bfloat16 stochastic": (
      jax.jit(lambda x: precision.round(x, bf, "stochastic", key=key)),
      "jax",
    ),
    "precision cbfloat16 stochastic, threefry bits": (
      jax.jit(
        lambda x: precision.round(x, cb, "stochastic", rbits=jax.random.bits(key, x.shape, jnp.uint32))
      ),
      "jax",
    ),
    "lax.reduce_precision(6, 9) (flushes subnormals)": (
      jax.jit(lambda x: jax.lax.reduce_precision(x, 6, 9)),
      "jax",
    ),
    "gfloat cbfloat16 (jax.jit)": (gfloat_jit(cb), "jax"),
    "gfloat bfloat16 (jax.jit)": (gfloat_jit(bf), "jax"),
    "ml_dtypes bfloat16 cast (NumPy)": (lambda x: x.astype(ml_dtypes.bfloat16).astype(np.float32), "numpy"),
  }
  if not skip_slow:
    out["gfloat cbfloat16 (NumPy)"] = (lambda x: gfloat.round_ndarray(gfloat_format_info(cb), x), "numpy")
    out["gfloat bfloat16 (NumPy)"] = (lambda x: gfloat.round_ndarray(gfloat_format_info(bf), x), "numpy")
  return out


SLOW = {"gfloat cbfloat16 (NumPy)", "gfloat bfloat16 (NumPy)"}  # seconds per call: fewer rounds


def timed(fn: Callable, x) -> float:
  t0 = time.perf_counter()
  result = fn(x)
  if isinstance(result, jax.Array):
    result.block_until_ready()
  return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--size", type=int, default=24, help="log2 of the number of values (default 24)")
  parser.add_argument("--rounds", type=int, default=16, help="paired timing rounds per candidate")
  parser.add_argument("--skip-slow", action="store_true", help="skip gfloat on NumPy (seconds per call)")
  parser.add_argument("--out", type=Path, default=RESULTS / "rounding.json")
  args = parser.parse_args(argv)

  x_np = make_input(args.size)
  x = jnp.asarray(x_np)
  n = x_np.size
  baseline = make_baseline(x)
  baseline(x).block_until_ready()
  if same_floats(baseline(x), x).all():
    raise SystemExit(f"the baseline does not round (XLA removed its convert pair): {BASELINE}")
  # Sanity: the timed kernels give the references' results on this input (bitwise, NaN == NaN;
  # NaNs aside, since GPUs may return their canonical NaN).
  for name, ours, reference in [
    ("bfloat16 vs the baseline", precision.round(x, "bf16"), baseline(x)),
    ("cbfloat16 vs gfloat", precision.round(x, "cb16"), gfloat_jit(precision.cbfloat16)(x)),
  ]:
    agree = same_floats(ours, reference) | (jnp.isnan(ours) & jnp.isnan(reference))
    if not agree.all():
      raise SystemExit(
        f"benchmark input: precision.round disagrees with its reference ({name}); not timing it"
      )

  rows = []
  print(f"{n} float32 values; baseline: {BASELINE}; {args.rounds} paired rounds")
  print(f"{'candidate':50s} {'M values/s':>11s} {'ratio (median)':>15s} {'ratio (best)':>13s}")
  for name, (fn, kind) in candidates(jax.random.key(0), args.skip_slow).items():
    arg = x if kind == "jax" else x_np
    with np.errstate(all="ignore"):
      timed(fn, arg)  # compile / warm up
      rounds = max(2, args.rounds // 5) if name in SLOW else args.rounds
      base_t, cand_t = [], []
      for i in range(rounds):  # alternate which goes first (ABBA), so order effects cancel
        if i % 2 == 0:
          base_t.append(timed(baseline, x))
          cand_t.append(timed(fn, arg))
        else:
          cand_t.append(timed(fn, arg))
          base_t.append(timed(baseline, x))
    ratios = [b / c for b, c in zip(base_t, cand_t)]
    row = dict(
      candidate=name,
      values_per_s_median=n / statistics.median(cand_t),
      values_per_s_best=n / min(cand_t),
      baseline_values_per_s_median=n / statistics.median(base_t),
      ratio_median=statistics.median(ratios),
      ratio_best=min(base_t) / min(cand_t),
      rounds=rounds,
    )
    if name in TARGETS:
      row["target"] = TARGETS[name]
      row["meets_target"] = row["ratio_median"] >= TARGETS[name]
    rows.append(row)
    mark = (
      ""
      if name not in TARGETS
      else (f" (target {TARGETS[name]:.1f}x: {'met' if row['meets_target'] else 'MISSED'})")
    )
    print(
      f"{name:50s} {row['values_per_s_median'] / 1e6:11.0f} {row['ratio_median']:14.2f}x "
      f"{row['ratio_best']:12.2f}x{mark}",
      flush=True,
    )

  args.out.parent.mkdir(parents=True, exist_ok=True)
  args.out.write_text(
    json.dumps(
      dict(
        benchmark="rounding",
        values=n,
        baseline=BASELINE,
        baseline_compiler_options=BASELINE_OPTIONS,
        jax=jax.__version__,
        devices=str(jax.devices()),
        rows=rows,
      ),
      indent=2,
    )
    + "\n"
  )
  print(f"wrote {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
