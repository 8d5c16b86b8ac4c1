"""The core of ``wafer analyze-input`` (the analogue of cs_input_analyzer): measure, then recommend.

:func:`measure_samples_per_s` times an input pipeline with 1..N input workers;
:func:`recommend_workers` compares those rates with the rate the model consumes samples (from
the cost model, or a measured step rate times the batch size) and picks ``num_workers_per_csx``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from wafer.data.pipeline import GrainBatchSource

HEADROOM = 1.2  # a pipeline "keeps up" at this multiple of the consumption rate


@dataclasses.dataclass
class WorkerRate:
  """Measured throughput with one worker count."""

  num_workers: int
  samples_per_s: float
  batches: int
  seconds: float
  first_batch_s: float


def measure_samples_per_s(
  make_source: Callable[[int], GrainBatchSource],
  worker_counts: Sequence[int],
  *,
  seconds: float = 3.0,
  warmup_batches: int = 4,
  batch_size: int | None = None,
) -> list[WorkerRate]:
  """Samples/s of the pipeline ``make_source(num_workers)`` for each worker count.

  The first ``warmup_batches`` (worker start-up included) are not timed; their time is reported
  as ``first_batch_s``. Then batches are drawn for ``seconds``.
  """
  out = []
  for w in worker_counts:
    src = make_source(w)
    bs = batch_size or src.batch_size
    try:
      t0 = time.perf_counter()
      for _ in range(warmup_batches):
        next(src)
      t1 = time.perf_counter()
      n = 0
      while True:
        next(src)
        n += 1
        t = time.perf_counter() - t1
        if t >= seconds:
          break
    finally:
      src.close()
    out.append(WorkerRate(w, n * bs / t, n, t, t1 - t0))
  return out


def recommend_workers(
  rates: Sequence[WorkerRate], consumption_samples_per_s: float, *, headroom: float = HEADROOM
) -> dict[str, Any]:
  """The fewest workers whose rate is at least ``headroom`` times the consumption rate.

  Returns:
    ``{"num_workers_per_csx", "input_bound", "reason"}``. When no measured count keeps up, the
    fastest one is recommended and ``input_bound`` is True.
  """
  if not rates:
    raise ValueError("no measurements")
  need = consumption_samples_per_s * headroom
  for r in sorted(rates, key=lambda r: r.num_workers):
    if r.samples_per_s >= need:
      return {
        "num_workers_per_csx": r.num_workers,
        "input_bound": False,
        "reason": f"{r.num_workers} worker(s) give {r.samples_per_s:,.0f} samples/s >= {headroom:g} x "
        f"{consumption_samples_per_s:,.0f} consumed",
      }
  best = max(rates, key=lambda r: r.samples_per_s)
  return {
    "num_workers_per_csx": best.num_workers,
    "input_bound": True,
    "reason": f"no worker count keeps up: the best, {best.num_workers}, gives {best.samples_per_s:,.0f} "
    f"samples/s < {need:,.0f} needed; training will wait on input",
  }
