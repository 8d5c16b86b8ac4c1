"""Where a train step's time goes: per-kernel device time of ``gpu_step.py``'s variants.

``gpu_step.py`` says how much slower autocast's step is than native bfloat16; this says where.
Each variant's step (the same model, data and variants as ``gpu_step.py``) is compiled, run
``--warmup`` times, then ``--steps`` times under ``jax.profiler.trace`` (with a Perfetto trace,
which holds the device's kernels on a GPU: CUPTI). Kernels are summed by name and by kind:

* ``gemm``: matrix products (cuBLAS / cuBLASLt / CUTLASS / Triton GEMM kernels, ``dot``);
* ``reduce``: XLA reduction fusions (``input_*`` / ``*reduce*``: softmax, LayerNorm, sums);
* ``elementwise``: XLA loop fusions (``loop_*``: casts, roundings, activations, the optimizer) and
  XLA's other ``fusion_*`` kernels (Triton fusions, some of which reduce too: the split between
  the two kinds is approximate, the total is not);
* ``copy``: copies, transposes, memset / memcpy;
* ``other``.

Also printed: XLA's own estimate of the bytes the step reads and writes (``cost_analysis``),
the fraction of the step each kind takes, and each variant's excess over ``bf16_native`` by
kind, which is what a change to autocast has to remove.

  python benchmarks/gpu_profile.py --variants bf16_native,autocast_bfloat16_l0     # on a GPU
  python benchmarks/gpu_profile.py --size tiny --variants bf16_native,autocast_bfloat16_l0  # CPU

Results: ``benchmarks/results/gpu_profile_<device>.json`` (``--output`` overrides). On a CPU the
trace holds host threads, not kernels: the kinds are then XLA CPU's thunks, for a smoke test.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import gpu_step
import jax
import jax.numpy as jnp
import optax

_KINDS = (
  ("gemm", re.compile(r"gemm|cublas|cutlass|xmma|sm\d+_|nvjet|matmul|\bdot|triton_gemm", re.I)),
  ("reduce", re.compile(r"^input_|reduce|reduction", re.I)),
  ("elementwise", re.compile(r"^loop_|fusion", re.I)),
  ("copy", re.compile(r"copy|transpose|memset|memcpy|concatenate|dynamic.update", re.I)),
)


def kind_of(name: str) -> str:
  """The kind of a kernel, by its name (first match in ``_KINDS``, else ``other``)."""
  for kind, pattern in _KINDS:
    if pattern.search(name):
      return kind
  return "other"


def device_kernels(trace: dict[str, Any]) -> tuple[dict[str, float], list[str]]:
  """Kernel name -> total microseconds over the trace's device lanes, and the lanes used.

  Device lanes are the processes whose name holds ``GPU`` or ``/device:``; with none (a CPU
  trace) every complete event of the ``/host:CPU`` process's XLA threads is taken."""
  names = {
    e["pid"]: e.get("args", {}).get("name", "")
    for e in trace.get("traceEvents", [])
    if e.get("ph") == "M" and e.get("name") == "process_name"
  }
  lanes = {pid for pid, n in names.items() if "GPU" in n or "/device:" in n}
  if not lanes:
    lanes = {pid for pid, n in names.items() if "CPU" in n or "host" in n.lower()}
  threads = {
    (e["pid"], e.get("tid")): e.get("args", {}).get("name", "")
    for e in trace.get("traceEvents", [])
    if e.get("ph") == "M" and e.get("name") == "thread_name" and e["pid"] in lanes
  }
  # a device's "XLA Ops" / "XLA Modules" lines repeat its streams' kernels: streams only
  streams = {key for key, n in threads.items() if "stream" in n.lower()}
  totals: dict[str, float] = collections.defaultdict(float)
  for e in trace.get("traceEvents", []):
    if e.get("ph") != "X" or e.get("pid") not in lanes or "dur" not in e:
      continue
    if streams and (e["pid"], e.get("tid")) not in streams:
      continue
    totals[e["name"]] += float(e["dur"])
  used = sorted({f"{names[p]}: {threads.get((p, t), t)}" for p, t in (streams or threads)})
  return dict(totals), used


def profile_variant(exe, args_: tuple, steps: int, warmup: int) -> tuple[dict[str, float], list[str], float]:
  for _ in range(warmup):
    jax.block_until_ready(exe(*args_))
  with tempfile.TemporaryDirectory() as tmp:
    start = time.perf_counter()
    with jax.profiler.trace(tmp, create_perfetto_trace=True):
      for _ in range(steps):
        jax.block_until_ready(exe(*args_))
    wall = (time.perf_counter() - start) / steps
    found = list(Path(tmp).rglob("perfetto_trace.json.gz"))
    if not found:
      raise SystemExit(f"no perfetto_trace.json.gz under {tmp}: {[str(p) for p in Path(tmp).rglob('*')]}")
    with gzip.open(found[0], "rt") as fh:
      trace = json.load(fh)
  totals, lanes = device_kernels(trace)
  return {k: v / steps for k, v in totals.items()}, lanes, wall


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--size", default="gpt2-small", choices=sorted(gpu_step.SIZES))
  parser.add_argument(
    "--variants",
    default="bf16_native,autocast_bfloat16_l0",
    help="comma-separated names of gpu_step.py's variants",
  )
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument("--warmup", type=int, default=2)
  parser.add_argument("--top", type=int, default=25, help="kernels listed per variant")
  parser.add_argument("--output", type=Path, default=None)
  args = parser.parse_args(argv)

  size = gpu_step.SIZES[args.size]
  wanted = args.variants.split(",")
  formats = sorted({n.split("_")[1] for n in wanted if n.startswith("autocast_")})
  levels = sorted({int(n.split("_l")[-1][0]) for n in wanted if n.startswith("autocast_")})
  table = gpu_step.variants(size.heads, formats, levels, force_tf32=any(n.endswith("_tf32") for n in wanted))
  unknown = [n for n in wanted if n not in table]
  if unknown:
    parser.error(f"unknown variants {unknown}; gpu_step.py's are {sorted(table)}")

  key_params, key_data = jax.random.split(jax.random.key(0))
  params = gpu_step.init_params(size, key_params)
  tx = optax.adamw(1e-4, weight_decay=0.01)
  opt_state = tx.init(params)
  tokens = jax.random.randint(key_data, (size.batch, size.seq), 0, size.vocab, jnp.int32)
  targets = jnp.roll(tokens, -1, axis=1)
  device = jax.devices()[0]
  print(
    f"device: {device.device_kind} ({device.platform}); jax {jax.__version__}; size {args.size}", flush=True
  )

  report: dict[str, Any] = {
    "benchmark": "gpu_profile",
    "device": device.device_kind,
    "jax": jax.__version__,
    "size": args.size,
    "steps": args.steps,
    "variants": {},
  }
  for name in wanted:
    value_and_grad, prec, _ = table[name]
    ctx = jax.default_matmul_precision(prec) if prec == "highest" else _null()
    with ctx:
      exe = (
        jax.jit(gpu_step.make_step(value_and_grad, tx)).lower(params, opt_state, tokens, targets).compile()
      )
    cost = exe.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    kernels, lanes, wall = profile_variant(exe, (params, opt_state, tokens, targets), args.steps, args.warmup)
    by_kind: dict[str, float] = collections.defaultdict(float)
    counts: dict[str, int] = collections.defaultdict(int)
    for kname, us in kernels.items():
      by_kind[kind_of(kname)] += us
      counts[kind_of(kname)] += 1
    total = sum(kernels.values())
    report["variants"][name] = {
      "wall_ms": wall * 1e3,
      "kernel_ms": total / 1e3,
      "lanes": lanes,
      "bytes_accessed": (cost or {}).get("bytes accessed"),
      "flops": (cost or {}).get("flops"),
      "by_kind_ms": {k: v / 1e3 for k, v in sorted(by_kind.items())},
      "kernels_ms": {k: v / 1e3 for k, v in sorted(kernels.items(), key=lambda kv: -kv[1])},
    }
    ba = report["variants"][name]["bytes_accessed"]
    print(
      f"\n{name}: wall {wall * 1e3:.2f} ms/step, kernels {total / 1e3:.2f} ms/step, "
      f"XLA bytes accessed {ba / 1e9 if ba else float('nan'):.2f} GB; lanes {lanes}"
    )
    for kind in sorted(by_kind, key=lambda k: -by_kind[k]):
      print(f"  {kind:12s} {by_kind[kind] / 1e3:9.2f} ms  ({counts[kind]} kernels)")
    for kname, us in sorted(kernels.items(), key=lambda kv: -kv[1])[: args.top]:
      print(f"    {us / 1e3:8.3f} ms  {kind_of(kname):11s} {kname[:110]}")

  base = report["variants"].get("bf16_native")
  if base:
    print("\nexcess over bf16_native, ms/step by kind:")
    for name, v in report["variants"].items():
      if name == "bf16_native":
        continue
      kinds = sorted(set(v["by_kind_ms"]) | set(base["by_kind_ms"]))
      diff = {k: v["by_kind_ms"].get(k, 0.0) - base["by_kind_ms"].get(k, 0.0) for k in kinds}
      print(
        f"  {name:28s} total {v['kernel_ms'] - base['kernel_ms']:+8.2f}  "
        + "  ".join(f"{k} {d:+.2f}" for k, d in diff.items())
      )
  out = args.output or gpu_step.RESULTS / f"gpu_profile_{gpu_step._device_tag(device)}.json"
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(json.dumps(report, indent=1))
  print(f"wrote {out}")
  return 0


def _null():
  import contextlib

  return contextlib.nullcontext()


if __name__ == "__main__":
  sys.exit(main())
