"""How long estimating a GPT-3 175B-shaped train step takes, end to end.

GPT-3 175B: 96 layers, d=12288, 96 heads, FFN 49152, seq 2048, vocab 50257, batch 1536, AdamW, on
one CS-2 with the default mode (release 2.x: weight streaming, the micro-batch search over every
supported size). Timed: building the abstract arguments, `wafer.estimate` (two abstract traces,
kernel extraction, the search, the report), the text and JSON, and the PNG.

Each repetition runs in a fresh Python process (cold caches; the JAX import is not timed). The
target is at most 10 s for the whole, on 2 CPU cores. Results go to
benchmarks/results/costmodel_speed.json.

    python benchmarks/costmodel_speed.py [--repeats N] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

TARGET_S = 10.0


def once() -> dict[str, object]:
  import jax

  import wafer
  from wafer.costmodel.workloads import get_workload

  w = get_workload("gpt3_175b")
  t0 = time.perf_counter()
  fn, args = w.example()
  t1 = time.perf_counter()
  report = wafer.estimate(fn, *args, batch_size=w.batch_size, name=w.name, **w.estimate_kwargs)
  t2 = time.perf_counter()
  text = report.to_text()
  report.to_json()
  t3 = time.perf_counter()
  with tempfile.TemporaryDirectory() as tmp:
    report.plot(os.path.join(tmp, "placement.png"))
  t4 = time.perf_counter()
  return {
    "args_s": t1 - t0,
    "estimate_s": t2 - t1,
    "text_json_s": t3 - t2,
    "png_s": t4 - t3,
    "total_s": t4 - t0,
    "samples_per_sec": report.samples_per_sec,
    "mode": report.mode,
    "mode_reason": report.mode_reason,
    "micro_batch": report.micro_batch_size,
    "fits": report.fits,
    "jax": jax.__version__,
    "report_head": text.split("\n\n")[0],
  }


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--once", action="store_true", help=argparse.SUPPRESS)
  parser.add_argument(
    "--out", default=os.path.join(os.path.dirname(__file__), "results", "costmodel_speed.json")
  )
  args = parser.parse_args(argv)
  if args.once:
    print(json.dumps(once()))
    return 0
  runs = []
  for _ in range(args.repeats):
    out = subprocess.run(
      [sys.executable, os.path.abspath(__file__), "--once"],
      check=True,
      capture_output=True,
      text=True,
      env={**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")},
    )
    runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
  totals = [r["total_s"] for r in runs]
  worst, median = max(totals), statistics.median(totals)
  first = runs[0]
  print("GPT-3 175B train step (96 x d12288, seq 2048, batch 1536) on 1 x CS-2, mode=auto")
  print(first["report_head"])
  print(f"mode: {first['mode']} ({first['mode_reason']}), micro-batch {first['micro_batch']}")
  for key in ("args_s", "estimate_s", "text_json_s", "png_s", "total_s"):
    print(
      f"{key:<12} "
      + "  ".join(f"{r[key]:7.2f}" for r in runs)
      + f"   median {statistics.median(r[key] for r in runs):.2f} s"
    )
  ok = worst <= TARGET_S
  print(
    f"end to end: median {median:.2f} s, worst {worst:.2f} s over {len(runs)} cold runs "
    f"(target <= {TARGET_S:.0f} s on {os.cpu_count()} CPU cores: {'met' if ok else 'MISSED'})"
  )
  result = {
    "command": "python benchmarks/costmodel_speed.py",
    "runs": runs,
    "median_total_s": median,
    "worst_total_s": worst,
    "target_s": TARGET_S,
    "target_met": ok,
    "cpu_count": os.cpu_count(),
    "platform": {"python": platform.python_version(), "machine": platform.machine()},
  }
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as fh:
    json.dump(result, fh, indent=2)
  print(f"wrote {args.out}")
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
