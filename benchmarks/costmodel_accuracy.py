"""Cost-model accuracy against the published measurements of docs/references.md ("Published measurements").

Builds each published workload as a JAX step (forward + backward + AdamW; forward only for the
WaferLLM prefill row), and scores predictions in log space, |ln(pred / meas)|:

* a grid of the three calibrated parameters (clock, instruction overhead, cycles per attention
  row) is evaluated once for every point;
* **in sample**: the parameters minimising the sum of squared log errors over all points;
* **leave one out**: for each point, the parameters are refitted on all the *other* points and
  the point is predicted with them. Its median and worst |ln ratio| are the accuracy to expect on
  a run the model was not fitted to (targets: median <= ln 1.15, worst <= ln 1.25);
* **held out**: published runs collected after the model and its calibration were settled
  (`Measurement.held_out`: GPT-J 6B on 1 x CS-2, 2 x CS-2 and 1 x CS-3, DiT-2B and LLaMA-2 7B on
  CS-2 / CS-3, BERT-large at batch 1024), never fitted, predicted with the in-sample calibration.

Results go to benchmarks/results/costmodel_accuracy.json.

``--fit_step_overhead`` also fits `Calibration.step_overhead_s` (a fixed cost per training step,
grid 0-100 ms), a fourth parameter the shipped calibration does not use: the comparison that
decided against it (results in benchmarks/results/costmodel_accuracy_step_overhead.json; about
five times as long).

    python benchmarks/costmodel_accuracy.py [--fit_step_overhead] [--out PATH]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import statistics
import sys
import time
from typing import Any

import jax

from precision._table import Table
from wafer.costmodel import CALIBRATION, estimate_graph, extract
from wafer.costmodel.workloads import WORKLOADS

TARGET_EACH = math.log(1.25)
TARGET_MEDIAN = math.log(1.15)
CLOCKS = (0.85e9, 0.95e9, 1.1e9)  # the published range: SDK scripts 850 MHz, WaferLLM/HC34 1.1 GHz
OVERHEADS = (4.0, 6.0, 8.0, 12.0)
ROW_CYCLES = tuple(2 ** (i / 4) for i in range(-2, 3))  # 0.71-1.41 cycles per row, steps of 2**0.25
STEP_OVERHEADS = (0.0, 0.025, 0.05, 0.075, 0.1)  # seconds per training step (--fit_step_overhead)
PARAMS = ("clock_hz", "instruction_overhead_cycles", "attention_row_cycles", "step_overhead_s")


def _points(held_out: bool = False) -> list[tuple[Any, Any]]:
  """``(workload, graph)`` of the calibration measurements, or of the held-out ones."""
  out = []
  for w in WORKLOADS.values():
    if w.measurement is None or w.measurement.held_out != held_out:
      continue
    fn, args = w.example()
    out.append((w, extract(fn, args, batch_argnums=(len(args) - 1,), compute_bits=16)))
  return out


def _rates(points: list[tuple[Any, Any]], params: tuple[Any, ...]) -> list[float]:
  """The rate of each point at ``(clock, overhead, cycles per attention row[, step overhead])``."""
  clock, overhead, row_cycles, *rest = params
  step_overhead = rest[0] if rest else CALIBRATION.step_overhead_s
  rates = []
  for w, graph in points:
    kw = dict(w.estimate_kwargs)
    fixed_clock = kw.pop("clock_hz", None)  # WaferLLM converted cycles at 1.1 GHz: not calibrated
    calib = CALIBRATION.replace(
      clock_hz=fixed_clock or clock,
      instruction_overhead_cycles=overhead,
      attention_row_cycles=row_cycles,
      step_overhead_s=step_overhead,
    )
    rates.append(estimate_graph(graph, batch_size=w.batch_size, calibration=calib, **kw).samples_per_sec)
  return rates


def _grid(
  points: list[tuple[Any, Any]], axes: tuple[tuple[float, ...], ...]
) -> dict[tuple[Any, ...], list[float]]:
  """``(clock, overhead, cycles per attention row[, step overhead]) -> [rate of each point]``."""
  return {p: _rates(points, p) for p in itertools.product(*axes)}


def _fit(
  table: dict[Any, Any], points: list[tuple[Any, Any]], use: list[int]
) -> tuple[tuple[Any, ...], float]:
  """The grid point with the least sum of squared log errors on the points ``use``."""
  best, best_cost = None, math.inf
  for key, row in table.items():
    cost = sum(math.log(row[i] / points[i][0].measurement.value) ** 2 for i in use)
    if cost < best_cost:
      best, best_cost = key, cost
  assert best is not None
  return best, best_cost


def _predict(table: dict[Any, Any], points: list[tuple[Any, Any]], params: tuple[Any, ...], i: int) -> float:
  return table[params][i]


def _describe(p: tuple[Any, ...]) -> str:
  text = f"{p[0] / 1e9:g} GHz, {p[1]:g} cycles, {p[2]:.3g} cycles/row"
  return text + (f", {p[3] * 1e3:g} ms/step" if len(p) > 3 else "")


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    "--fit_step_overhead",
    action="store_true",
    help="also fit a fixed cost per training step (grid 0-100 ms); writes a separate JSON",
  )
  parser.add_argument("--out", default=None, help="JSON path (default under benchmarks/results/)")
  args = parser.parse_args(argv)
  name = "costmodel_accuracy_step_overhead.json" if args.fit_step_overhead else "costmodel_accuracy.json"
  out = args.out or os.path.join(os.path.dirname(__file__), "results", name)
  axes = (CLOCKS, OVERHEADS, ROW_CYCLES) + ((STEP_OVERHEADS,) if args.fit_step_overhead else ())
  fitted_names = PARAMS[: len(axes)]

  t0 = time.perf_counter()
  points = _points()
  table = _grid(points, axes)
  n = len(points)
  full, _ = _fit(table, points, list(range(n)))
  rows = []
  for i, (w, _) in enumerate(points):
    loo_params, _ = _fit(table, points, [j for j in range(n) if j != i])
    meas = w.measurement.value
    pin = _predict(table, points, full, i)
    pout = _predict(table, points, loo_params, i)
    rows.append(
      {
        "id": w.measurement.id,
        "workload": w.name,
        "system": w.estimate_kwargs.get("system", "wse2"),
        "mode": w.estimate_kwargs.get("mode", "auto"),
        "measured": meas,
        "in_sample": pin,
        "in_sample_abs_log_ratio": abs(math.log(pin / meas)),
        "leave_one_out": pout,
        "leave_one_out_abs_log_ratio": abs(math.log(pout / meas)),
        "leave_one_out_params": _describe(loo_params),
        "what": w.measurement.what,
        "source": w.measurement.source,
      }
    )
  elapsed = time.perf_counter() - t0
  print(
    Table(
      ["id", "workload", "measured", "in-sample", "|ln|", "leave-one-out", "|ln|", "refit without it"],
      [
        [
          r["id"],
          r["workload"],
          f"{r['measured']:.4g}",
          f"{r['in_sample']:.4g}",
          f"{r['in_sample_abs_log_ratio']:.3f}",
          f"{r['leave_one_out']:.4g}",
          f"{r['leave_one_out_abs_log_ratio']:.3f}",
          r["leave_one_out_params"],
        ]
        for r in rows
      ],
      title="Cost model vs published measurements (samples/s; V11: prompts/s = tokens/s / 4096)",
    )
  )
  ins = [r["in_sample_abs_log_ratio"] for r in rows]
  loo = [r["leave_one_out_abs_log_ratio"] for r in rows]
  summary = {
    "in_sample_median": statistics.median(ins),
    "in_sample_worst": max(ins),
    "leave_one_out_median": statistics.median(loo),
    "leave_one_out_worst": max(loo),
  }
  met = summary["leave_one_out_median"] <= TARGET_MEDIAN and summary["leave_one_out_worst"] <= TARGET_EACH
  print(
    f"\nin sample ({n} points, fitted {_describe(full)}): median |ln ratio| {summary['in_sample_median']:.3f}, "
    f"worst {summary['in_sample_worst']:.3f}"
  )
  print(
    f"leave one out: median |ln ratio| {summary['leave_one_out_median']:.3f} (target <= {TARGET_MEDIAN:.3f}), "
    f"worst {summary['leave_one_out_worst']:.3f} (target <= {TARGET_EACH:.3f}): {'met' if met else 'NOT met'}"
  )
  # the model without its one non-derived term (attention_row_cycles = 0, the rest as fitted): how
  # far the hardware-derived mapping alone is from each measurement
  derived = _rates(points, full[:2] + (0.0,) + full[3:])
  for r, rate in zip(rows, derived):
    r["without_row_term"] = rate
  print(
    "without the fitted attention-row term (attention_row_cycles = 0): "
    + ", ".join(f"{r['id']} x{r['without_row_term'] / r['measured']:.2f}" for r in rows)
    + " of the measured rate"
  )
  held = []
  held_points = _points(held_out=True)
  for (w, _), rate in zip(held_points, _rates(held_points, full)):
    meas = w.measurement.value
    held.append(
      {
        "id": w.measurement.id,
        "workload": w.name,
        "system": w.estimate_kwargs.get("system", "wse2"),
        "num_csx": w.estimate_kwargs.get("num_csx", 1),
        "measured": meas,
        "predicted": rate,
        "log_ratio": math.log(rate / meas),
        "what": w.measurement.what,
        "source": w.measurement.source,
      }
    )
  if held:
    print(
      "\n"
      + str(
        Table(
          ["id", "workload", "measured", "predicted", "ln(pred/meas)", "measured on"],
          [
            [
              r["id"],
              r["workload"],
              f"{r['measured']:.4g}",
              f"{r['predicted']:.4g}",
              f"{r['log_ratio']:+.3f}",
              r["what"],
            ]
            for r in held
          ],
          title="Held out: published runs never fitted, predicted with the in-sample calibration",
        )
      )
    )
    held_abs = [abs(r["log_ratio"]) for r in held]
    summary["held_out_median"] = statistics.median(held_abs)
    summary["held_out_worst"] = max(held_abs)
    print(
      f"held out ({len(held)} points): median |ln ratio| {summary['held_out_median']:.3f}, "
      f"worst {summary['held_out_worst']:.3f}\n"
    )
  # every run not fitted (left out, held out): a measured run is expected within
  # [exp(-max over), exp(max under)] x the prediction
  signed = sorted(
    [math.log(r["leave_one_out"] / r["measured"]) for r in rows] + [r["log_ratio"] for r in held]
  )
  summary["band"] = [math.exp(-max(0.0, signed[-1])), math.exp(max(0.0, -signed[0]))]
  by_id = {r["id"]: r for r in rows}
  ratio = None
  if "V08" in by_id and "H01" in by_id:  # the same ESM-2 35M step on a CS-2 and a CS-3
    ratio = {
      "measured": by_id["H01"]["measured"] / by_id["V08"]["measured"],
      "in_sample": by_id["H01"]["in_sample"] / by_id["V08"]["in_sample"],
    }
    print(
      f"ESM-2 35M, CS-3 over CS-2 (H01 / V08): predicted {ratio['in_sample']:.2f}x in sample, "
      f"measured {ratio['measured']:.2f}x"
    )
  print(
    f"uncertainty band from the {len(signed)} runs not fitted ({n} left out, {len(held)} held out): "
    f"a measured run lies within x{summary['band'][0]:.2f}-x{summary['band'][1]:.2f} of the prediction"
  )
  defaults = tuple(getattr(CALIBRATION, name) for name in fitted_names)
  same = all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15) for a, b in zip(defaults, full))
  print(
    f"defaults in wafer/costmodel/calibration.py: {_describe(defaults)} "
    f"({'= the in-sample fit' if same else 'DIFFER from the in-sample fit'}); {elapsed:.0f} s"
  )
  print("\n" + str(CALIBRATION.describe()))

  result = {
    "command": "python benchmarks/costmodel_accuracy.py"
    + (" --fit_step_overhead" if args.fit_step_overhead else ""),
    "rows": rows,
    "held_out_rows": held,
    **summary,
    "target_median": TARGET_MEDIAN,
    "target_each": TARGET_EACH,
    "targets_met": met,
    "esm2_cs3_over_cs2": ratio,
    "fitted": dict(zip(fitted_names, full)),
    "defaults_equal_fit": same,
    "grid": dict(zip(fitted_names, axes)),
    "seconds": elapsed,
    "platform": {"python": platform.python_version(), "jax": jax.__version__, "machine": platform.machine()},
  }
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out, "w") as fh:
    json.dump(result, fh, indent=2)
  print(f"\nwrote {out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
