"""Samples/s of the BERT MSL128 input pipeline on pre-tokenised data, with 1, 2 and 4 input workers.

Subject: :class:`wafer.data.GrainBatchSource` over modelzoo-style pre-tokenised BERT features
(HDF5, read into memory; layout in :mod:`models.bert.data`): per-worker shards, per-worker
shuffles, fixed global batches, repeating. Without ``--data`` a synthetic HDF5 file of
``--examples`` MSL128 examples (MMP 20) is written to a temporary directory first.

Each worker count is measured twice: with every input worker a grain worker process
(``num_processes = workers``, the wafer model of input workers), and in-process
(``num_processes = 0``, the same batches computed by the consumer). The first
``--warmup`` batches (worker start-up) are not timed. Target (issue 5): at least 20,000
samples/s on 2 cores.

  python benchmarks/input_pipeline.py                      # about a minute
  python benchmarks/input_pipeline.py --data DIR_OR_FILE --batch 256 --seconds 5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from models.bert import data as bert
from wafer.data.analyze import measure_samples_per_s
from wafer.data.pipeline import ArraySource, GrainBatchSource

RESULTS = Path(__file__).resolve().parent / "results"
TARGET = 20_000


def synthetic_features(n: int, msl: int = 128, mmp: int = 20, vocab: int = 30522, seed: int = 0) -> dict:
  """Random BERT features with realistic structure (variable lengths, 15% masked)."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(msl // 2, msl + 1, size=n)
  mask = (np.arange(msl)[None, :] < lengths[:, None]).astype(np.int32)
  ids = rng.integers(5, vocab, size=(n, msl), dtype=np.int32) * mask
  ids[:, 0] = 2
  a_len = lengths // 2
  tt = ((np.arange(msl)[None, :] > a_len[:, None]) & (mask == 1)).astype(np.int32)
  pos = np.sort(rng.integers(1, msl // 2, size=(n, mmp)), axis=1).astype(np.int32)
  return {
    "input_ids": ids,
    "attention_mask": mask,
    "token_type_ids": tt,
    "masked_lm_positions": pos,
    "masked_lm_labels": rng.integers(5, vocab, size=(n, mmp), dtype=np.int32),
    "masked_lm_weights": np.ones((n, mmp), np.float32),
    "next_sentence_label": rng.integers(0, 2, size=n, dtype=np.int32),
  }


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--data", help="pre-tokenised BERT HDF5/CSV file or directory (default: synthetic HDF5)")
  ap.add_argument("--examples", type=int, default=65_536, help="synthetic examples")
  ap.add_argument("--batch", type=int, default=256, help="global batch size")
  ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
  ap.add_argument("--seconds", type=float, default=4.0)
  ap.add_argument("--warmup", type=int, default=8)
  ap.add_argument("--output", type=Path)
  args = ap.parse_args()

  with tempfile.TemporaryDirectory() as tmp:
    data = args.data
    if data is None:
      data = os.path.join(tmp, "bert_msl128.h5")
      bert.write_hdf5(data, synthetic_features(args.examples))
    t = time.perf_counter()
    feats = bert.read_features(data)
    load_s = time.perf_counter() - t
  source = ArraySource(feats, name=str(args.data or "synthetic"))
  msl = feats["input_ids"].shape[1]
  print(
    f"data: {args.data or 'synthetic HDF5'}: {len(source):,} examples, MSL {msl}, read in {load_s:.2f} s; "
    f"batch {args.batch}; {os.cpu_count()} CPUs"
  )

  rows = []
  for procs in ("workers", 0):
    for w in args.workers:
      n_proc = w if procs == "workers" else 0

      def make(w: int, n_proc: int = n_proc) -> GrainBatchSource:
        return GrainBatchSource(source, args.batch, seed=1, num_workers_per_csx=w, num_processes=n_proc)

      (r,) = measure_samples_per_s(make, [w], seconds=args.seconds, warmup_batches=args.warmup)
      rows.append(
        {
          "workers": w,
          "processes": n_proc,
          "samples_per_s": round(r.samples_per_s),
          "batches": r.batches,
          "seconds": round(r.seconds, 3),
          "startup_s": round(r.first_batch_s, 3),
          "meets_target": r.samples_per_s >= TARGET,
        }
      )
      print(
        f"  workers={w} processes={n_proc}: {r.samples_per_s:>10,.0f} samples/s  (startup {r.first_batch_s:.2f} s)"
      )

  # baseline measured in this run: one worker computed in the consumer's process (no worker processes)
  base = next(r["samples_per_s"] for r in rows if r["processes"] == 0 and r["workers"] == min(args.workers))
  for r in rows:
    r["ratio_vs_in_process_1_worker"] = round(r["samples_per_s"] / base, 3)
  print(
    f"\n| workers | processes | samples/s | vs in-process, {min(args.workers)} worker | >= {TARGET:,} |"
    "\n|---:|---:|---:|---:|:---:|"
  )
  for r in rows:
    print(
      f"| {r['workers']} | {r['processes']} | {r['samples_per_s']:,} | {r['ratio_vs_in_process_1_worker']:.2f}x | "
      f"{'yes' if r['meets_target'] else 'no'} |"
    )
  report = {
    "benchmark": "input_pipeline",
    "target_samples_per_s": TARGET,
    "msl": int(msl),
    "batch": args.batch,
    "examples": len(source),
    "data": args.data or "synthetic",
    "cpus": os.cpu_count(),
    "machine": platform.machine(),
    "python": platform.python_version(),
    "results": rows,
  }
  output = args.output or RESULTS / "input_pipeline.json"
  output.parent.mkdir(parents=True, exist_ok=True)
  output.write_text(json.dumps(report, indent=2) + "\n")
  print(f"\nwrote {output}")


if __name__ == "__main__":
  main()
