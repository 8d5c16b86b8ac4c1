"""Cost of `precision.autocast` on a train step: step time and compile time against float32.

Subject: the train step (loss, gradients, AdamW update) of a Transformer encoder
(`models.encoder`), ``--size base`` BERT-base-shaped (12 layers, d=768, 12 heads, FFN 3072,
vocab 30522) or ``--size small`` (2 layers, d=256) for quick runs. Variants, all compiled
and timed in the same run:

* ``float32``: the baseline, no autocast;
* ``grad(autocast)``: ``jax.value_and_grad(autocast(loss, policy))``: rules on the forward
  pass, the backward pass rounded by the cast VJPs of the inserted roundings;
* ``autocast(grad)``: ``autocast(jax.value_and_grad(loss), policy)``: rules on every forward
  and backward equation.

The policy is cbfloat16 at ``--level`` (default 1). Steps are timed in rounds that run every
variant once, in an order that alternates (ABBA), and the script reports the median over
rounds of each variant's time, the ratio of medians against float32 and the spread (min and
max over median); `benchmarks/_timing.py` runs the rounds. Compile time is a cold trace +
autocast pass + lower + XLA compile of the jitted step (caches cleared each time), in
``--compile_rounds`` alternating rounds too, reported the same way. Targets (issue "The mixed-precision core"): step <= 1.15x, compile <= 1.3x.

Load-independent evidence, also reported per variant: the rounding sites of the step's jaxpr
(``precision_round`` equations, counted inside loops and calls once each) and, in the optimized
HLO, the instruction count, the roundings XLA runs (``reduce-precision`` instructions: one
per nearest-even rounding to cbfloat16, counted once per fusion that computes it when the kernel
is inlined) and the ``map`` instructions (on CPU each rounding site lowers to one ``map`` whose
body holds the kernel, see `precision.rounding`: a value read by several fusions is rounded once).

``--size`` takes a comma-separated list: ``--size small,base`` measures both in one run, each
against its own float32 baseline. The JSON goes to
``benchmarks/results/autocast_overhead_<sizes>_<platform>.json``.

  python benchmarks/autocast_overhead.py --size small          # about a minute
  python benchmarks/autocast_overhead.py --size small,base --batch 4  # several minutes on 2 cores
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import optax
from _timing import alternating_rounds, summary
from flax import nnx

import precision
from models.encoder import Encoder, EncoderConfig, parameter_count, token_loss
from precision import _jax_compat as compat

RESULTS = Path(__file__).resolve().parent / "results"
TARGETS = {"step": 1.15, "compile": 1.3}
SIZES = {
  "base": EncoderConfig(),
  "small": EncoderConfig(
    vocab_size=8192, hidden_size=256, num_hidden_layers=2, num_heads=4, filter_size=1024
  ),
}


def build_steps(config: EncoderConfig, policy: precision.Policy) -> tuple[dict[str, Callable], tuple]:
  model = Encoder(config, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model)
  tx = optax.adamw(1e-4, weight_decay=0.01)
  opt_state = tx.init(params)

  def loss(params, tokens, targets):
    return token_loss(nnx.merge(graphdef, params), tokens, targets)

  def make_step(value_and_grad: Callable) -> Callable:
    def step(params, opt_state, tokens, targets):
      value, grads = value_and_grad(params, tokens, targets)
      updates, opt_state = tx.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state, value

    return step

  steps = {
    "float32": make_step(jax.value_and_grad(loss)),
    "grad(autocast)": make_step(jax.value_and_grad(precision.autocast(loss, policy))),
    "autocast(grad)": make_step(precision.autocast(jax.value_and_grad(loss), policy)),
  }
  return steps, (params, opt_state), parameter_count(model)


def rounding_sites(jaxpr: Any) -> int:
  """``precision_round`` equations in ``jaxpr`` and the jaxprs inside it (each body once)."""
  count = 0
  for eqn in jaxpr.eqns:
    count += eqn.primitive.name == "precision_round"
    for sub in compat.jaxprs_in_params(eqn.params):
      count += rounding_sites(compat.split_closed(sub)[0])
  return count


_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%\S+ = \S+ ([\w-]+)\(", re.MULTILINE)


def hlo_counts(hlo: str) -> dict[str, int]:
  """Instructions of the optimized HLO (all computations), its reduce-precision and map ones."""
  ops = _INSTRUCTION.findall(hlo)
  return {
    "instructions": len(ops),
    "reduce_precision": ops.count("reduce-precision"),
    "map": ops.count("map"),
  }


def measure(size: str, args: argparse.Namespace, policy: precision.Policy) -> dict:
  config = SIZES[size]
  steps, (params, opt_state), n_params = build_steps(config, policy)
  key = jax.random.key(0)
  tokens = jax.random.randint(key, (args.batch, args.seq), 0, config.vocab_size, jnp.int32)
  targets = jnp.roll(tokens, 1, axis=1)
  print(
    f"encoder {size}: {n_params / 1e6:.1f}M parameters, batch {args.batch} x seq {args.seq}; "
    f"policy {policy}; {jax.devices()[0].platform}"
  )

  def compile_once(name: str) -> Any:
    jax.clear_caches()  # a cold compile: the trace, our pass, lowering and XLA, every time
    return jax.jit(steps[name]).lower(params, opt_state, tokens, targets).compile()

  names = list(steps)
  compile_times = alternating_rounds(
    {n: functools.partial(compile_once, n) for n in names}, args.compile_rounds
  )
  compiled, counts = {}, {}
  for name, step in steps.items():
    compiled[name] = compile_once(name)
    sites = rounding_sites(jax.make_jaxpr(step)(params, opt_state, tokens, targets).jaxpr)
    counts[name] = {"rounding_sites": sites, **hlo_counts(compiled[name].as_text())}
    out = compiled[name](params, opt_state, tokens, targets)  # warm-up
    jax.block_until_ready(out)
    print(
      f"  compiled {name:15s} in {statistics.median(compile_times[name]):6.2f} s (median of "
      f"{args.compile_rounds}); loss {float(out[2]):.6f}; {counts[name]}",
      flush=True,
    )

  def progress(r: int, times: dict[str, list[float]]) -> None:
    print(
      f"  round {r + 1}/{args.rounds}: " + ", ".join(f"{n} {times[n][-1]:.3f} s" for n in names), flush=True
    )

  runs = {n: functools.partial(compiled[n], params, opt_state, tokens, targets) for n in names}
  times = alternating_rounds(runs, args.rounds, progress)
  step = summary(times, "float32")
  comp = summary(compile_times, "float32")
  results = {}
  print(
    f"\n{'variant':15s} {'median step s':>14s} {'step ratio':>11s} {'spread':>12s} {'compile s':>10s} "
    f"{'compile ratio':>14s} {'spread':>12s}"
  )
  for name in names:
    results[name] = {
      "median_step_s": step[name]["median_s"],
      "step_times_s": times[name],
      "step_ratio": step[name]["ratio"],
      "step_spread": [step[name]["spread_low"], step[name]["spread_high"]],
      "compile_s": comp[name]["median_s"],
      "compile_times_s": compile_times[name],
      "compile_ratio": comp[name]["ratio"],
      "compile_spread": [comp[name]["spread_low"], comp[name]["spread_high"]],
      **counts[name],
    }
    print(
      f"{name:15s} {step[name]['median_s']:14.4f} {step[name]['ratio']:11.3f} "
      f"{step[name]['spread_low']:5.2f}-{step[name]['spread_high']:4.2f} {comp[name]['median_s']:10.2f} "
      f"{comp[name]['ratio']:14.3f} {comp[name]['spread_low']:5.2f}-{comp[name]['spread_high']:4.2f}"
    )
  print(f"targets: step ratio <= {TARGETS['step']}, compile ratio <= {TARGETS['compile']}\n")
  return {"size": size, "parameters": n_params, "results": results}


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--size", default="small", help=f"comma-separated, of {', '.join(sorted(SIZES))}")
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--seq", type=int, default=128)
  parser.add_argument("--level", type=int, default=1, choices=(0, 1, 2))
  parser.add_argument("--rounds", type=int, default=5, help="timing rounds (each runs every variant)")
  parser.add_argument(
    "--compile_rounds", type=int, default=3, help="cold compiles per variant (alternating order)"
  )
  parser.add_argument("--output", type=Path, default=None)
  args = parser.parse_args(argv)
  sizes = [s.strip() for s in args.size.split(",") if s.strip()]
  unknown = [s for s in sizes if s not in SIZES]
  if unknown or not sizes:
    parser.error(
      f"--size {args.size!r}: unknown {unknown}; allowed: a comma-separated list of {sorted(SIZES)}"
    )

  policy = precision.Policy(compute="cbfloat16", level=args.level)
  by_size = {size: measure(size, args, policy) for size in sizes}
  report = {
    "benchmark": "autocast_overhead",
    "sizes": sizes,
    "batch": args.batch,
    "seq": args.seq,
    "policy": str(policy),
    "rounds": args.rounds,
    "compile_rounds": args.compile_rounds,
    "platform": jax.devices()[0].platform,
    "device": str(jax.devices()[0].device_kind),
    "machine": platform.machine(),
    "load_average": list(os.getloadavg()),
    "jax": jax.__version__,
    "targets": TARGETS,
    "by_size": by_size,
  }
  output = args.output or RESULTS / f"autocast_overhead_{'_'.join(sizes)}_{jax.devices()[0].platform}.json"
  output.parent.mkdir(parents=True, exist_ok=True)
  output.write_text(json.dumps(report, indent=2) + "\n")
  print(f"wrote {output}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
