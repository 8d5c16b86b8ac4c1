"""``wafer analyze-input --params FILE``: can the input pipeline feed the model? (cf. cs_input_analyzer)

1. Build the params file's training pipeline once (`wafer.runner.load_plan`), then measure its
   samples/s with 1..N input workers, each a grain worker process
   (`wafer.data.analyze.measure_samples_per_s`). The number of *processes* changes only the
   speed; the number of *workers* also shards the data, so it changes the batch order: set it
   before the first run of a model_dir (a checkpoint resumes only with the worker count it was
   written with).
2. The rate the model consumes samples: the wafer cost model's estimate for the params file's
   train step (``consumer="costmodel"``, the default: what a CS system would ask for), or the
   measured step rate of the compiled step on this machine (``consumer="measured"``).
3. Recommend ``num_workers_per_csx``: the fewest workers whose rate is at least ``headroom``
   (1.2) times the consumption (`wafer.data.analyze.recommend_workers`).

The analysis is written to ``model_dir/input_analysis.json``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax

from precision._table import Table
from wafer._io import write_text_atomically
from wafer.data.analyze import HEADROOM, WorkerRate, measure_samples_per_s, recommend_workers
from wafer.data.pipeline import GrainBatchSource
from wafer.errors import InputAnalysisError

CONSUMERS = ("costmodel", "measured")


def default_worker_counts(cpus: int | None = None) -> list[int]:
  """1, 2, 4, ... up to the machine's CPU count (at least 1 and 2)."""
  cpus = max(2, cpus or os.cpu_count() or 2)
  counts, w = [], 1
  while w <= cpus:
    counts.append(w)
    w *= 2
  return counts


@dataclasses.dataclass
class InputAnalysis:
  """What ``wafer analyze-input`` found (``to_dict`` is what it writes as JSON)."""

  model: str
  batch_size: int
  num_csx: int
  examples: int
  rates: list[WorkerRate]
  consumer: str
  consumption_samples_per_s: float
  recommendation: dict[str, Any]
  skipped: str = ""  # why the larger worker counts asked for were not measured ("" when all were)

  def to_dict(self) -> dict[str, Any]:
    return {
      "model": self.model,
      "batch_size": self.batch_size,
      "num_csx": self.num_csx,
      "examples": self.examples,
      "rates": [dataclasses.asdict(r) for r in self.rates],
      "consumer": self.consumer,
      "consumption_samples_per_s": self.consumption_samples_per_s,
      "recommendation": self.recommendation,
      "skipped": self.skipped or None,
    }

  def table(self) -> Table:
    need = self.consumption_samples_per_s
    rows = [
      [
        r.num_workers,
        f"{r.samples_per_s:,.0f}",
        f"{r.samples_per_s / need:,.1f}x" if need > 0 else "-",
        f"{r.first_batch_s:.2f}",
      ]
      for r in self.rates
    ]
    return Table(
      ["workers", "samples/s", "vs consumption", "start-up s"],
      rows,
      title=f"Input pipeline of {self.model} ({self.examples:,} examples, batch {self.batch_size})",
    )

  def to_text(self) -> str:
    source = (
      "wafer cost model estimate" if self.consumer == "costmodel" else "measured step rate on this machine"
    )
    rec = self.recommendation
    verdict = "INPUT-BOUND" if rec["input_bound"] else "keeps up"
    return (
      f"{self.table()}\n{f'Not measured: {self.skipped}' + chr(10) if self.skipped else ''}\nModel consumes {self.consumption_samples_per_s:,.1f} samples/s ({source}); "
      f"a pipeline keeps up at {HEADROOM:g}x that (headroom).\n"
      f"Recommendation: runconfig.num_workers_per_csx: {rec['num_workers_per_csx']}  ({verdict}: "
      f"{rec['reason']})\n"
      "Set it before the first run of a model_dir: workers shard the data, so checkpoints resume only with "
      "the worker count they were written with.\n"
      "The rates are of that many grain worker processes, as a Cerebras system's input workers run. wafer run "
      "itself computes batches in its own process (the workers shard the data the same way, so the batches "
      "are the same): on this machine it reads at about the 1-worker rate, whatever the count.\n"
    )


def consumption_rate(plan: Any, batch: Any, consumer: str, steps: int = 5) -> float:
  """Samples/s the train step of ``plan`` consumes: the cost-model estimate, or measured here."""
  from wafer import train

  if consumer not in CONSUMERS:
    raise InputAnalysisError(f"consumer={consumer!r}; allowed: {', '.join(CONSUMERS)}")
  state = train.initial_state(plan.task, plan.optimizer, plan.loss_scale, jax.random.key(0))
  step_fn = train.make_train_step(plan.task, plan.optimizer, plan.policy)
  if consumer == "costmodel":
    import wafer

    report = wafer.estimate(
      step_fn,
      state,
      batch,
      batch_argnums=(1,),  # the state (parameters, optimizer state) is never data
      batch_size=plan.task.batch_size,
      num_csx=plan.runconfig.num_csx,
      policy=plan.policy,
      name=plan.task.name,
    )
    if not report.fits:  # no rate to feed: not "0 samples/s"
      raise InputAnalysisError(
        f"the cost model finds no wafer rate to feed: the train step does not fit ({report.reason}); "
        f"would fit: {report.remedy}. Analyse against this machine's rate instead (consumer "
        "'measured', the CLI's --consumer measured), or change the model or batch"
      )
    return float(report.samples_per_sec)
  step = jax.jit(step_fn)
  state, loss = step(state, batch)  # compile and warm up
  jax.block_until_ready(loss)
  t0 = time.perf_counter()
  for _ in range(steps):
    state, loss = step(state, batch)
  jax.block_until_ready(loss)
  return steps * plan.task.batch_size / (time.perf_counter() - t0)


def check_settings(worker_counts: Sequence[int] | None, seconds: float) -> list[int]:
  """The worker counts to measure (sorted, default `default_worker_counts`), or an
  `InputAnalysisError` naming a bad count or ``seconds`` (checked before anything is measured)."""
  if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < math.inf:
    raise InputAnalysisError(
      f"--seconds {seconds!r}: allowed: seconds measured per worker count, > 0 (default 2)"
    )
  counts = sorted(set(worker_counts or default_worker_counts()))
  if not counts or counts[0] < 1:
    raise InputAnalysisError(f"worker counts must be positive integers (got {list(worker_counts or [])})")
  return counts


def analyze(
  plan: Any,
  *,
  worker_counts: Sequence[int] | None = None,
  seconds: float = 2.0,
  consumer: str = "costmodel",
  headroom: float = HEADROOM,
) -> InputAnalysis:
  """Measure the pipeline of ``plan`` (a `wafer.runner.Plan`) and recommend ``num_workers_per_csx``."""
  counts = check_settings(worker_counts, seconds)
  base = plan.task.train_data(plan.seed)
  if not isinstance(base, GrainBatchSource):
    raise InputAnalysisError(
      f"model {plan.task.name!r} does not read its data through a grain pipeline "
      f"({type(base).__name__}); analyze-input measures wafer.data.GrainBatchSource pipelines"
    )
  batch = base.batch_at(0)

  def make(w: int) -> GrainBatchSource:
    return base.with_workers(num_workers_per_csx=w, num_processes=w)

  need = consumption_rate(plan, batch, consumer)  # first: a step with no rate to feed stops before measuring
  rates: list[WorkerRate] = []
  skipped = ""
  for i, w in enumerate(counts):  # (ascending: a count whose workers' shards are too small ends the list)
    try:
      rates += measure_samples_per_s(make, [w], seconds=seconds)
    except ValueError as error:  # (GrainBatchSource: a worker's shard holds fewer examples than a batch)
      if not rates:
        raise InputAnalysisError(f"{w} worker(s): {error}") from None
      skipped = (
        f"{', '.join(map(str, counts[i:]))} workers: a worker would hold {str(error).split('holds ', 1)[-1]}"
      )
      break
  return InputAnalysis(
    model=plan.task.name,
    batch_size=plan.task.batch_size,
    num_csx=plan.runconfig.num_csx,
    examples=len(base.source),
    rates=rates,
    consumer=consumer,
    consumption_samples_per_s=need,
    recommendation=recommend_workers(rates, need, headroom=headroom),
    skipped=skipped,
  )


def save(analysis: InputAnalysis, model_dir: str | os.PathLike) -> Path:
  """Write ``model_dir/input_analysis.json``."""
  path = Path(model_dir) / "input_analysis.json"
  path.parent.mkdir(parents=True, exist_ok=True)
  write_text_atomically(path, json.dumps(analysis.to_dict(), indent=2) + "\n")
  return path
