"""How long ``wafer run --params FILE --validate_only`` takes, cold, as a user runs it.

Each run is a fresh Python process running this checkout's ``wafer`` command line (``PYTHONPATH`` is
the repository root) with a fresh ``--model_dir``, so nothing is cached: the imports, loading the
file, the model's shapes, the trace and lowering of the train step, and the cost model's estimate
(the compile report) are all in the time. Issue 26 asks for at most 10 s per file on 2 CPU cores for
the GPT-2 XL and GPT-3 20B params files of Cerebras' modelzoo.

The baseline, measured in the same run and in alternating order with the files (ABBA rounds,
``benchmarks/_timing.py``), is the same command on a small shipped file (GPT-2 tiny): a ratio
against it says how much of a file's time is more than the fixed cost of any validation. Wall
seconds depend on the machine's load (other processes on the same cores), so the child processes'
CPU seconds (user + system) and the load average are recorded too.

    python benchmarks/validate_speed.py [FILE ...] [--rounds N] [--compile_only] [--breakdown] [--root DIR]
        [--out PATH]

Without files: the real modelzoo files ``tests/data/modelzoo/**/params_gpt2_xl.yaml`` and
``tests/data/modelzoo/**/params_gpt3_20b.yaml`` (every release copied there). ``--compile_only``
also times ``--compile_only`` (the XLA compile too) of each file once, for contrast; ``--breakdown``
times the stages of each file's validation apart, in this process (of this checkout).
Results go to benchmarks/results/validate_speed.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _timing import alternating_rounds, summary

ROOT = Path(__file__).resolve().parents[1]
BUDGET_S = 10.0
DEFAULTS = ("tests/data/modelzoo/**/params_gpt2_xl.yaml", "tests/data/modelzoo/**/params_gpt3_20b.yaml")
BASELINE = "models/gpt2/configs/params_gpt2_tiny.yaml"
_CLI = "import sys; from wafer.cli import main; sys.exit(main())"


def default_files() -> list[Path]:
  """The modelzoo files of `DEFAULTS` that exist; says which patterns found none."""
  files = []
  for pattern in DEFAULTS:
    found = sorted(ROOT.glob(pattern))
    if not found:
      print(
        f"note: no file matches {pattern} (the unchanged modelzoo files of issue 26 item 1); "
        "pass params files as arguments instead",
        file=sys.stderr,
      )
    files += found
  return files


def run_once(path: Path, flag: str, log: dict[str, list[dict]], key: str, root: Path = ROOT) -> None:
  """One cold ``wafer run --params path flag`` of the checkout ``root``, in a fresh process; appends its
  record to ``log[key]``."""
  env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
  with tempfile.TemporaryDirectory(prefix="validate_speed_") as model_dir:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
      [sys.executable, "-c", _CLI, "run", "--params", str(path), flag, "--model_dir", model_dir],
      cwd=root,
      env=env,
      capture_output=True,
      text=True,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
  cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
  record = {
    "wall_s": wall,
    "cpu_s": cpu,
    "returncode": done.returncode,
    "load_average_1min": os.getloadavg()[0],
  }
  if done.returncode != 0:
    lines = done.stderr.strip().splitlines() or ["(no message)"]
    first = next((i for i, line in enumerate(lines) if "error:" in line), len(lines) - 1)
    record["error"] = " ".join(lines[first:])[:500]  # the CLI's message (a traceback: its last line)
  else:
    record["last_line"] = next(
      (line for line in done.stdout.splitlines() if "completed successfully" in line), ""
    )
  log.setdefault(key, []).append(record)
  status = "ok" if done.returncode == 0 else f"FAILED ({record['error'][:120]})"
  print(
    f"  {key:60s} {wall:7.1f} s wall {cpu:7.1f} s cpu  load {record['load_average_1min']:.1f}  {status}",
    flush=True,
  )


def breakdown(path: Path) -> dict[str, dict[str, float]]:
  """Seconds (wall, CPU) of each stage of the validation of ``path``, in this process, timed apart.

  The stages as ``--validate_only`` runs them (`wafer.train.loop`): the imports, loading and planning
  (plugins, config, the model's template), the state's shapes (``jax.eval_shape`` of the
  initialisation), the train step's trace and lowering, the estimate (whose trace at the run's batch
  is jax.jit's cached one) and the report's files.
  """
  stages: dict[str, dict[str, float]] = {}
  last = [time.perf_counter(), time.process_time()]

  def lap(name: str) -> None:
    now = [time.perf_counter(), time.process_time()]
    stages[name] = {"wall_s": now[0] - last[0], "cpu_s": now[1] - last[1]}
    print(f"  {name:40s} {stages[name]['wall_s']:6.2f} s wall {stages[name]['cpu_s']:6.2f} s cpu", flush=True)
    last[:] = now

  sys.path.insert(0, str(ROOT))  # this checkout's wafer, not an installed one
  import jax

  import wafer
  from wafer import runner, train
  from wafer.compile import cheap_sharding_probes

  lap("imports")
  with tempfile.TemporaryDirectory(prefix="validate_speed_") as model_dir:
    plan = runner.load_plan(path, [f"runconfig.model_dir={model_dir}", "runconfig.validate_only=true"])
    lap("load and plan")
    with cheap_sharding_probes():
      state, batch = train.step_shapes(plan.task, plan.optimizer, plan.loss_scale, plan.seed)
      lap("state shapes")
      step = jax.jit(train.make_train_step(plan.task, plan.optimizer, plan.policy))
      traced = step.trace(state, batch)
      lap("trace")
      traced.lower()
      lap("lower")
      kwargs = {"batch_size": plan.task.batch_size, "num_csx": plan.runconfig.num_csx, "policy": plan.policy}
      report = wafer.estimate(step, state, batch, **kwargs)
      lap("estimate")
      report.save(model_dir)
      lap("report files")
  return stages


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    "files", nargs="*", type=Path, help="params files (default: the modelzoo GPT-2 XL / GPT-3 20B)"
  )
  parser.add_argument(
    "--baseline", type=Path, default=ROOT / BASELINE, help=f"the small file (default {BASELINE})"
  )
  parser.add_argument(
    "--rounds", type=int, default=1, help="runs of each file, in alternating order (default 1)"
  )
  parser.add_argument(
    "--compile_only", action="store_true", help="also time --compile_only of each file once"
  )
  parser.add_argument(
    "--root",
    type=Path,
    default=ROOT,
    help="the checkout whose wafer runs (default: this one; e.g. a `git worktree` of an older commit)",
  )
  parser.add_argument(
    "--breakdown",
    action="store_true",
    help="also time the stages of each file's validation apart (in-process)",
  )
  parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "validate_speed.json")
  args = parser.parse_args()
  files = [f.resolve() for f in args.files] or default_files()
  if not files:
    print("no params files to time: pass them as arguments (python benchmarks/validate_speed.py FILE ...)")
    return 2
  missing = [f for f in [*files, args.baseline] if not f.is_file()]
  if missing:
    print(f"not a file: {', '.join(map(str, missing))}", file=sys.stderr)
    return 2

  def name(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)

  log: dict[str, list[dict]] = {}
  root = args.root.resolve()
  runs = {
    name(f): (lambda f=f: run_once(f, "--validate_only", log, name(f), root)) for f in [args.baseline, *files]
  }
  print(f"wafer run --validate_only, cold, {args.rounds} round(s), {os.cpu_count()} CPU(s):", flush=True)
  times = alternating_rounds(runs, args.rounds)
  stats = summary(times, name(args.baseline))
  results = {}
  for key, row in stats.items():
    records = log[key]
    ok = all(r["returncode"] == 0 for r in records)
    results[key] = {
      **row,
      "ratio_vs_baseline": row.pop("ratio"),
      "ratio_vs_budget": row["median_s"] / BUDGET_S,
      "median_cpu_s": statistics.median(r["cpu_s"] for r in records),
      "validated": ok,
      "runs": records,
    }
  contrast = {}
  if args.compile_only:
    print("wafer run --compile_only, cold, once each:", flush=True)
    for f in files:
      run_once(f, "--compile_only", contrast, name(f), root)
  stages = {}
  if args.breakdown:
    for f in files:
      print(f"stages of {name(f)} (in this process, once):", flush=True)
      stages[name(f)] = breakdown(f)
  print(f"\n{'file':60s} {'median s':>9s} {'cpu s':>7s} {'x baseline':>10s} {'x 10 s':>7s}")
  for key, row in results.items():
    flag = "" if row["validated"] else "  (refused: see error)"
    print(
      f"{key:60s} {row['median_s']:9.1f} {row['median_cpu_s']:7.1f} {row['ratio_vs_baseline']:10.2f} "
      f"{row['ratio_vs_budget']:7.2f}{flag}"
    )
  report = {
    "benchmark": "validate_speed",
    "command": "wafer run --params FILE --validate_only --model_dir <fresh temporary directory>",
    "budget_s": BUDGET_S,
    "baseline": name(args.baseline),
    "rounds": args.rounds,
    "root": str(root),
    "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
    "results": results,
    "compile_only": contrast,
    "stages": stages,
  }
  args.out.parent.mkdir(parents=True, exist_ok=True)
  args.out.write_text(json.dumps(report, indent=2) + "\n")
  print(f"\nwrote {args.out}")
  return 0 if all(row["validated"] for row in results.values()) else 1


if __name__ == "__main__":
  sys.exit(main())
