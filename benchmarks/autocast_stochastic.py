"""Cost of stochastic rounding inside `precision.autocast`, against nearest rounding, in one run.

A small MLP loss (``--width``, ``--depth`` tanh layers, batch ``--batch``) and its gradient,
``jax.jit(jax.grad(autocast(loss, policy)))``, timed for: float32 (no autocast), autocast with
nearest rounding, and autocast with ``stochastic=matmul+elementwise`` (each rounding site draws
its words from the step's key). Prints the median step time of each and the ratio
stochastic / nearest, and writes ``benchmarks/results/autocast_stochastic_cpu.json``.

  python benchmarks/autocast_stochastic.py [--width 512] [--depth 4] [--batch 128] [--rounds 20]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import statistics
import time

import jax
import jax.numpy as jnp

import precision


def loss(params, x):
  h = x
  for w, b in params:
    h = jnp.tanh(h @ w + b)
  return jnp.mean(h * h)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--width", type=int, default=512)
  parser.add_argument("--depth", type=int, default=4)
  parser.add_argument("--batch", type=int, default=128)
  parser.add_argument("--rounds", type=int, default=20)
  parser.add_argument("--compute", default="cbfloat16")
  args = parser.parse_args()

  keys = jax.random.split(jax.random.key(0), args.depth + 1)
  params = [
    (jax.random.normal(k, (args.width, args.width)) / args.width**0.5, jnp.zeros((1, args.width)))
    for k in keys[1:]
  ]
  x = jax.random.normal(keys[0], (args.batch, args.width))
  nearest = precision.Policy(compute=args.compute)
  stochastic = precision.Policy(compute=args.compute, stochastic="matmul+elementwise")
  steps = {
    "float32": jax.jit(lambda p, x, k: jax.grad(loss)(p, x)),
    "nearest": jax.jit(lambda p, x, k: jax.grad(precision.autocast(loss, nearest))(p, x)),
    "stochastic": jax.jit(
      lambda p, x, k: jax.grad(precision.autocast(loss, stochastic))(p, x, rounding_key=k)
    ),
  }
  times: dict[str, list[float]] = {name: [] for name in steps}
  for step in steps.values():  # compile
    jax.block_until_ready(step(params, x, jax.random.key(0)))
  for r in range(args.rounds):  # interleaved, so that load on the machine hits all alike
    key = jax.random.key(r)
    for name, step in steps.items():
      start = time.perf_counter()
      jax.block_until_ready(step(params, x, key))
      times[name].append(time.perf_counter() - start)
  median = {name: statistics.median(t) for name, t in times.items()}
  print(f"grad of a {args.depth}-layer MLP, width {args.width}, batch {args.batch}, {args.compute}, level 1")
  print(f"{'variant':<12}{'median ms':>12}{'vs float32':>12}{'vs nearest':>12}")
  for name, t in median.items():
    print(f"{name:<12}{t * 1e3:>12.3f}{t / median['float32']:>12.2f}{t / median['nearest']:>12.2f}")
  out = pathlib.Path(__file__).parent / "results" / "autocast_stochastic_cpu.json"
  out.write_text(
    json.dumps(
      {
        "args": vars(args),
        "median_s": median,
        "stochastic_over_nearest": median["stochastic"] / median["nearest"],
        "nearest_over_float32": median["nearest"] / median["float32"],
        "device": str(jax.devices()[0]),
        "machine": platform.machine(),
        "note": "shared, loaded machine (2 cores, several jobs at once): ratios measured in one run",
      },
      indent=2,
    )
    + "\n"
  )
  print(f"wrote {out}")


if __name__ == "__main__":
  main()
