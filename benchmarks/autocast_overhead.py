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
rounds of each variant's time, and the ratio of medians against float32. Compile time is
trace + lower + XLA compile of the jitted step, measured once per variant (reported as a
ratio too). Targets (issue "The mixed-precision core"): step <= 1.15x, compile <= 1.3x.

Load-independent evidence, also reported per variant: the rounding sites of the step's jaxpr
(``precision_round`` equations, counted inside loops and calls once each) and, in the optimized
HLO, the instruction count and the roundings XLA runs (``reduce-precision`` instructions: one
per nearest-even rounding to cbfloat16, counted once per fusion that computes it).

``--size`` takes a comma-separated list: ``--size small,base`` measures both in one run, each
against its own float32 baseline. The JSON goes to
``benchmarks/results/autocast_overhead_<sizes>_<platform>.json``.

  python benchmarks/autocast_overhead.py --size small          # about a minute
  python benchmarks/autocast_overhead.py --size small,base --batch 4  # several minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.extend import core as jcore

import precision
from models.encoder import Encoder, EncoderConfig, parameter_count, token_loss

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


def rounding_sites(jaxpr: jcore.Jaxpr) -> int:
  """``precision_round`` equations in ``jaxpr`` and the jaxprs inside it (each body once)."""
  count = 0
  for eqn in jaxpr.eqns:
    count += eqn.primitive.name == "precision_round"
    for value in eqn.params.values():
      for sub in value if isinstance(value, (tuple, list)) else (value,):
        if isinstance(sub, jcore.ClosedJaxpr):
          count += rounding_sites(sub.jaxpr)
        elif isinstance(sub, jcore.Jaxpr):
          count += rounding_sites(sub)
  return count


_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%\S+ = \S+ ([\w-]+)\(", re.MULTILINE)


def hlo_counts(hlo: str) -> dict[str, int]:
  """Instructions of the optimized HLO (all computations), and its reduce-precision ones."""
  ops = _INSTRUCTION.findall(hlo)
  return {"instructions": len(ops), "reduce_precision": ops.count("reduce-precision")}


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

  compiled, compile_s, counts = {}, {}, {}
  for name, step in steps.items():
    start = time.perf_counter()
    compiled[name] = jax.jit(step).lower(params, opt_state, tokens, targets).compile()
    compile_s[name] = time.perf_counter() - start
    sites = rounding_sites(jax.make_jaxpr(step)(params, opt_state, tokens, targets).jaxpr)
    counts[name] = {"rounding_sites": sites, **hlo_counts(compiled[name].as_text())}
    out = compiled[name](params, opt_state, tokens, targets)  # warm-up
    jax.block_until_ready(out)
    print(
      f"  compiled {name:15s} in {compile_s[name]:6.2f} s; loss {float(out[2]):.6f}; {counts[name]}",
      flush=True,
    )

  names = list(steps)
  times: dict[str, list[float]] = {n: [] for n in names}
  for r in range(args.rounds):
    order = names if r % 2 == 0 else names[::-1]
    for name in order:
      start = time.perf_counter()
      jax.block_until_ready(compiled[name](params, opt_state, tokens, targets))
      times[name].append(time.perf_counter() - start)
    print(
      f"  round {r + 1}/{args.rounds}: " + ", ".join(f"{n} {times[n][-1]:.3f} s" for n in names), flush=True
    )

  base_step = statistics.median(times["float32"])
  results = {}
  print(
    f"\n{'variant':15s} {'median step s':>14s} {'step ratio':>11s} {'compile s':>10s} {'compile ratio':>14s}"
  )
  for name in names:
    step_s = statistics.median(times[name])
    results[name] = {
      "median_step_s": step_s,
      "step_times_s": times[name],
      "step_ratio": step_s / base_step,
      "compile_s": compile_s[name],
      "compile_ratio": compile_s[name] / compile_s["float32"],
      **counts[name],
    }
    print(
      f"{name:15s} {step_s:14.4f} {step_s / base_step:11.3f} {compile_s[name]:10.2f} "
      f"{compile_s[name] / compile_s['float32']:14.3f}"
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
