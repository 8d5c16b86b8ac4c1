"""Timing shared by the benchmarks: rounds that run every variant once, in alternating order.

On a shared machine the load drifts while a benchmark runs. Running every variant once per
round, in an order that alternates (ABBA: ``a b c``, ``c b a``, ...), spreads the drift over
all variants alike, and the median over rounds drops the rounds a burst of load hit. Ratios
are then ratios of medians measured in the same run.

  >>> times = alternating_rounds({"a": lambda: 1, "b": lambda: 2}, rounds=3)
  >>> [len(t) for t in times.values()]
  [3, 3]
  >>> sorted(summary(times, "a"))
  ['a', 'b']
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax

__all__ = ("alternating_rounds", "summary")


def alternating_rounds(
  runs: Mapping[str, Callable[[], Any]],
  rounds: int,
  on_round: Callable[[int, dict[str, list[float]]], None] | None = None,
) -> dict[str, list[float]]:
  """Seconds per call of each of ``runs``, ``rounds`` times, in alternating order.

  Each call's result is waited for (``jax.block_until_ready``) inside its timing.
  ``on_round(r, times)`` is called after each round (for progress lines).

  Returns:
    ``{name: [seconds of round 0, round 1, ...]}`` in the order of ``runs``.
  """
  names = list(runs)
  times: dict[str, list[float]] = {name: [] for name in names}
  for r in range(rounds):
    for name in names if r % 2 == 0 else names[::-1]:
      start = time.perf_counter()
      jax.block_until_ready(runs[name]())
      times[name].append(time.perf_counter() - start)
    if on_round is not None:
      on_round(r, times)
  return times


def summary(times: Mapping[str, list[float]], baseline: str) -> dict[str, dict[str, float]]:
  """Per variant: the median, the ratio of medians against ``baseline``, and the spread
  (``min / median`` and ``max / median`` over the rounds)."""
  base = statistics.median(times[baseline])
  out = {}
  for name, values in times.items():
    median = statistics.median(values)
    out[name] = {
      "median_s": median,
      "ratio": median / base,
      "spread_low": min(values) / median,
      "spread_high": max(values) / median,
    }
  return out
