"""What ``model.scan_layers`` costs and saves: a GPT-2 train step with its layers scanned against
the same step unrolled (`models.common.run_layers`), in one run.

For each: the seconds to trace + lower and to compile the jitted step (value_and_grad + SGD,
parameters donated), XLA's ``memory_analysis`` of the compiled step (temporaries, the parameters'
bytes for scale) and the median seconds per step over alternating rounds (`_timing`). The
baseline of every ratio is the unrolled loop. Results go to benchmarks/results/scan_layers.json.

    python benchmarks/scan_layers.py [--layers 8] [--hidden 512] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import jax
from _timing import alternating_rounds, summary

ROOT = Path(__file__).resolve().parents[1]


def build(layers: int, hidden: int, scan: bool, batch: int, seq: int):
  """The jitted step, its arguments (concrete) and the seconds of lowering and of compiling it."""
  sys.path.insert(0, str(ROOT))
  import models
  from models import gpt2
  from wafer.config import load_params

  base = load_params(ROOT / "models/gpt2/configs/params_gpt2_tiny.yaml").model
  config = base.model_copy(
    update={
      "hidden_size": hidden,
      "filter_size": 4 * hidden,
      "num_heads": max(1, hidden // 64),
      "num_hidden_layers": layers,
      "vocab_size": 1024,
      "scan_layers": scan,
    }
  )
  init, loss = models.functional(config)
  params = init(jax.random.key(0))
  data = gpt2.random_batch(jax.random.key(1), batch, seq, 1024)

  def step(p, b):
    value, grads = jax.value_and_grad(loss)(p, b)
    return jax.tree.map(lambda w, g: w - 0.01 * g, p, grads), value

  t0 = time.perf_counter()
  lowered = jax.jit(step, donate_argnums=0).lower(params, data)
  t1 = time.perf_counter()
  compiled = lowered.compile()
  t2 = time.perf_counter()
  return compiled, params, data, t1 - t0, t2 - t1


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--layers", type=int, default=8)
  parser.add_argument("--hidden", type=int, default=512)
  parser.add_argument("--batch", type=int, default=2)
  parser.add_argument("--seq", type=int, default=64)
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/scan_layers.json")
  args = parser.parse_args()

  variants, results = {}, {}
  for name, scan in (("loop", False), ("scan", True)):
    compiled, params, data, lower_s, compile_s = build(args.layers, args.hidden, scan, args.batch, args.seq)
    memory = compiled.memory_analysis()
    param_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
    state = {"params": params}

    def run(compiled=compiled, state=state, data=data):
      state["params"], value = compiled(state["params"], data)  # (donated: the new params go on)
      return value

    run()  # warm
    variants[name] = run
    results[name] = {
      "trace_and_lower_s": lower_s,
      "compile_s": compile_s,
      "temp_bytes": getattr(memory, "temp_size_in_bytes", None),
      "param_bytes": param_bytes,
    }
  times = alternating_rounds(variants, args.rounds)
  ratios = summary(times, "loop")
  for name in variants:
    results[name]["step_s_median"] = ratios[name]["median_s"]
    results[name]["step_ratio_vs_loop"] = ratios[name]["ratio"]
  print(
    f"GPT-2 train step, {args.layers} layers, d={args.hidden}, batch {args.batch} x {args.seq}, {jax.devices()[0]}"
  )
  print(f"{'':6s} {'lower s':>8s} {'compile s':>10s} {'temp MiB':>9s} {'params MiB':>11s} {'step ms':>8s}")
  for name, r in results.items():
    temp = "-" if r["temp_bytes"] is None else f"{r['temp_bytes'] / 2**20:.1f}"
    print(
      f"{name:6s} {r['trace_and_lower_s']:8.2f} {r['compile_s']:10.2f} {temp:>9s} "
      f"{r['param_bytes'] / 2**20:11.1f} {1e3 * r['step_s_median']:8.2f}"
    )
  loop, scan = results["loop"], results["scan"]
  print(
    f"scan / loop: lower x{scan['trace_and_lower_s'] / loop['trace_and_lower_s']:.2f}, compile "
    f"x{scan['compile_s'] / loop['compile_s']:.2f}, step x{scan['step_s_median'] / loop['step_s_median']:.2f}"
  )
  record = {
    "benchmark": "scan_layers",
    "command": "python benchmarks/scan_layers.py " + " ".join(sys.argv[1:]),
    "config": vars(args) | {"out": str(args.out)},
    "device": str(jax.devices()[0]),
    "machine": {"platform": platform.platform(), "python": platform.python_version()},
    "results": results,
  }
  args.out.parent.mkdir(parents=True, exist_ok=True)
  args.out.write_text(json.dumps(record, indent=1) + "\n")
  print(f"wrote {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
