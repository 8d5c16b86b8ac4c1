"""Train-step speed of emulated formats against float32 and native bfloat16, on a GPU (or CPU).

Subject: the train step (loss, gradients, AdamW update) of a GPT-style decoder (pre-LN blocks,
causal attention, GELU FFN, learned positions, output tied to the token embedding), written
here in plain JAX so that every constant follows the activation dtype (native bfloat16 stays
bfloat16). Sizes (``--size``, a comma-separated list; default ``gpt2-small,4layer``):

* ``gpt2-small``: GPT-2 small's shape, 12 layers, d=768, 12 heads, FFN 3072, vocab 50257,
  batch 8 x seq 1024 (124M parameters);
* ``4layer``: 4 layers, d=384, 6 heads, FFN 1536, vocab 8192, batch 8 x seq 256;
* ``tiny``: 2 layers, d=64, for a CPU smoke test.

Variants, compiled and timed in the same run on the same data and initial parameters:

* ``float32``: everything float32, traced under ``jax.default_matmul_precision("highest")``:
  true float32 matmuls (no TF32 on GPUs), the baseline;
* ``bf16_native``: jmp-style mixed precision, float32 master parameters and optimizer state,
  the parameters and activations cast to bfloat16 at the loss's entry (so every matmul, the
  attention and the FFN run in bfloat16, LayerNorm statistics in float32), the logits cast
  back to float32 for the loss;
* ``autocast_<format>_l<level>``: ``jax.value_and_grad(precision.autocast(loss, policy))`` with
  ``Policy(compute=<format>, level=<level>)``, for bfloat16 and cbfloat16 at levels 0 and 1 by
  default (``--formats``, any of them, e.g. ``cbfloat16,bfloat16,float16``; ``--levels``).
  Autocast binds its forward products on rounded operands on native bfloat16 / float16 tensor
  cores where the format allows (bfloat16, float16, float8), else at ``precision=HIGH`` (TF32,
  exact for these operands; cbfloat16), and those it keeps float32 at ``HIGHEST`` itself; the
  backward products of this form (the derivatives of autocast's products) run with the
  ``BF16_BF16_F32`` algorithm preset (float32 arrays read as bfloat16, float32 accumulation)
  where the forward ones are native bfloat16 matrix products, else TF32 (float16 included).
  ``--autocast_precision`` (``jax.default_matmul_precision``) only reaches products autocast
  leaves alone;
* ``--force_tf32`` adds ``<name>_tf32`` for every variant whose format has native products:
  the same policy with ``products=tf32`` (TF32 for every product), to measure what the native
  tensor cores bring;
* ``--form`` ``autocast_of_grad`` (or ``both``) adds / uses
  ``precision.autocast(jax.value_and_grad(loss), policy)`` (``<name>_ag``): the backward
  equations are rewritten too, so their products are rounded and native as well.

Each variant's line says how its products run (``products``: ``native bfloat16``, ``tf32``,
``highest``, ``bf16 dtype``) and its ratio to ``bf16_native``.

Timing: ``--warmup`` untimed steps per variant after compiling, then ``--rounds`` rounds, each
running every variant once in an order that alternates (ABBA), each step ended by
``jax.block_until_ready``. Reported per variant: median step time, tokens/s (batch x seq /
median), the ratios against ``float32`` and against ``bf16_native``, and the compile time
(trace + lower + XLA compile). With ``--hlo_dir`` the optimized HLO of every variant is written
there, and the JSON counts its matmul instructions by kind (``dot``, cuBLAS / cuBLASLt custom
calls, Triton GEMM fusions) and by precision / algorithm (``dot_precisions``; also printed)
to show which ones XLA may send to tensor cores. Results go to
``benchmarks/results/gpu_step_<device>.json`` (``--output`` overrides).

  python benchmarks/gpu_step.py                                   # on a GPU: both sizes, ~minutes
  python benchmarks/gpu_step.py --size tiny --rounds 1 --warmup 1  # CPU smoke test, seconds

Issue 15's target: ``autocast_cbfloat16_l*`` step <= 2.0x ``bf16_native`` for ``gpt2-small``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import math
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import optax
from _timing import alternating_rounds

import precision
from precision import _matmul, _state  # noqa: E402  (which products a policy binds)

RESULTS = Path(__file__).resolve().parent / "results"
TARGET_VS_BF16 = 2.0


@dataclasses.dataclass(frozen=True)
class Size:
  layers: int
  hidden: int
  heads: int
  ffn: int
  vocab: int
  batch: int
  seq: int


SIZES = {
  "gpt2-small": Size(layers=12, hidden=768, heads=12, ffn=3072, vocab=50257, batch=8, seq=1024),
  "4layer": Size(layers=4, hidden=384, heads=6, ffn=1536, vocab=8192, batch=8, seq=256),
  "tiny": Size(layers=2, hidden=64, heads=2, ffn=256, vocab=256, batch=2, seq=32),
}


# ---- the model: a pytree of float32 parameters and a dtype-generic loss ----


def init_params(size: Size, key: jax.Array) -> dict[str, Any]:
  """GPT-2 initialisation: normal(0.02), output projections scaled by 1/sqrt(2 layers)."""
  d, f = size.hidden, size.ffn
  keys = iter(jax.random.split(key, 2 + 4 * size.layers))
  normal = lambda shape, std=0.02: std * jax.random.normal(next(keys), shape, jnp.float32)
  resid_std = 0.02 / math.sqrt(2 * size.layers)
  layer = lambda: {
    "ln1": {"scale": jnp.ones((d,), jnp.float32), "bias": jnp.zeros((d,), jnp.float32)},
    "qkv": {"w": normal((d, 3 * d)), "b": jnp.zeros((3 * d,), jnp.float32)},
    "proj": {"w": normal((d, d), resid_std), "b": jnp.zeros((d,), jnp.float32)},
    "ln2": {"scale": jnp.ones((d,), jnp.float32), "bias": jnp.zeros((d,), jnp.float32)},
    "fc": {"w": normal((d, f)), "b": jnp.zeros((f,), jnp.float32)},
    "out": {"w": normal((f, d), resid_std), "b": jnp.zeros((d,), jnp.float32)},
  }
  return {
    "wte": normal((size.vocab, d)),
    "wpe": normal((size.seq, d), 0.01),
    "layers": [layer() for _ in range(size.layers)],
    "ln_f": {"scale": jnp.ones((d,), jnp.float32), "bias": jnp.zeros((d,), jnp.float32)},
  }


def _layer_norm(x: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
  """Statistics in float32 (as Flax does for bfloat16 inputs); result in x's dtype."""
  x32 = x.astype(jnp.float32)
  mean = x32.mean(-1, keepdims=True)
  var = jnp.square(x32 - mean).mean(-1, keepdims=True)
  y = ((x32 - mean) * jax.lax.rsqrt(var + 1e-5)).astype(x.dtype)
  return y * p["scale"] + p["bias"]


def _block(x: jax.Array, p: dict[str, Any], heads: int) -> jax.Array:
  b, s, d = x.shape
  hd = d // heads
  qkv = _layer_norm(x, p["ln1"]) @ p["qkv"]["w"] + p["qkv"]["b"]
  q, k, v = (t.reshape(b, s, heads, hd) for t in jnp.split(qkv, 3, axis=-1))
  scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * jnp.asarray(1 / math.sqrt(hd), x.dtype)
  causal = jnp.tril(jnp.ones((s, s), jnp.bool_))
  scores = jnp.where(causal, scores, jnp.asarray(jnp.finfo(x.dtype).min, x.dtype))
  context = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v).reshape(b, s, d)
  x = x + context @ p["proj"]["w"] + p["proj"]["b"]
  h = jax.nn.gelu(_layer_norm(x, p["ln2"]) @ p["fc"]["w"] + p["fc"]["b"], approximate=True)
  return x + h @ p["out"]["w"] + p["out"]["b"]


def make_loss(heads: int, compute_dtype: Any = jnp.float32) -> Callable:
  """loss(params, tokens int32[b, s], targets int32[b, s]) -> float32 scalar (mean cross-entropy).

  ``compute_dtype`` bfloat16 casts the parameters at entry (jmp-style); logits return to float32.
  """

  def loss(params: dict[str, Any], tokens: jax.Array, targets: jax.Array) -> jax.Array:
    p = jax.tree.map(lambda w: w.astype(compute_dtype), params)
    x = p["wte"][tokens] + p["wpe"][None, : tokens.shape[1]]
    for layer in p["layers"]:
      x = _block(x, layer, heads)
    logits = (_layer_norm(x, p["ln_f"]) @ p["wte"].T).astype(jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

  return loss


def make_step(value_and_grad: Callable, tx: optax.GradientTransformation) -> Callable:
  def step(params, opt_state, tokens, targets):
    value, grads = value_and_grad(params, tokens, targets)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value

  return step


def products_of(policy: precision.Policy) -> str:
  """How autocast runs the products on rounded operands of ``policy`` on a GPU."""
  native = _matmul._native_dtype(_state.Pass(policy))
  return f"native {jnp.dtype(native).name}" if native is not None else "tf32"


def variants(
  heads: int,
  formats: list[str],
  levels: list[int],
  force_tf32: bool = False,
  form: str = "grad_of_autocast",
) -> dict[str, tuple[Callable, str | None, str]]:
  """name -> (value_and_grad of the loss, matmul precision to trace it under or None, products)."""
  f32_loss = make_loss(heads)
  out: dict[str, tuple[Callable, str | None, str]] = {
    "float32": (jax.value_and_grad(f32_loss), "highest", "highest"),
    "bf16_native": (jax.value_and_grad(make_loss(heads, jnp.bfloat16)), None, "bf16 dtype"),
  }
  forms = ("grad_of_autocast", "autocast_of_grad") if form == "both" else (form,)
  for fmt in formats:
    for level in levels:
      policy = precision.Policy(compute=fmt, level=level)
      policies = [("", policy)]
      if force_tf32 and products_of(policy) != "tf32":
        policies.append(("_tf32", dataclasses.replace(policy, products="tf32")))
      for suffix, pol in policies:
        for f in forms:
          name = f"autocast_{pol.compute.name}_l{level}{suffix}{'_ag' if f == 'autocast_of_grad' else ''}"
          if f == "grad_of_autocast":
            fn = jax.value_and_grad(precision.autocast(f32_loss, pol))
          else:
            fn = precision.autocast(jax.value_and_grad(f32_loss), pol)
          out[name] = (fn, "autocast", products_of(pol))
  return out


# ---- HLO inspection ----

_MATMUL_KINDS = {
  "dot": re.compile(r"= \S+ dot\("),
  "cublas_gemm": re.compile(r'custom_call_target="__cublas\$gemm"'),
  "cublaslt_matmul": re.compile(r'custom_call_target="__cublas\$lt\$matmul[^"]*"'),
  "triton_gemm": re.compile(r'"kind":"__triton_gemm"'),
}


def matmul_counts(hlo: str) -> dict[str, int]:
  """How many matmul instructions of each kind the optimized HLO holds."""
  return {kind: len(pattern.findall(hlo)) for kind, pattern in _MATMUL_KINDS.items()}


_DEFINITION = re.compile(r"^\s*(?:ROOT )?(%?[\w.\-]+) = (\w+)\[")
_OPERAND = re.compile(r"(?: (?:dot|convolution)|custom-call)\((?:(\w+)\[[^%]*)?(%?[\w.\-]+)")


def operand_dtypes(hlo: str) -> dict[str, int]:
  """Matmul instructions of the optimized HLO by the dtype of their first operand (``bf16``:
  bfloat16 tensor cores; ``f32``: TF32 or true float32, per ``dot_precisions``)."""
  dtypes = {m.group(1).lstrip("%"): m.group(2) for m in map(_DEFINITION.match, hlo.splitlines()) if m}
  counts: dict[str, int] = {}
  for line in hlo.splitlines():
    if not _MATMUL_LINE.search(line) or "fused_computation" in line.split("=")[0]:
      continue
    match = _OPERAND.search(line)
    key = "unknown"
    if match:
      key = match.group(1) or dtypes.get(match.group(2).lstrip("%"), "unknown")
    counts[key] = counts.get(key, 0) + 1
  return counts


_MATMUL_LINE = re.compile(
  r"= \S+ (dot|convolution)\(|custom_call_target=\"__cublas|__triton_gemm|__cudnn\$conv"
)
_PRECISION = re.compile(r'operand_precision=\{(\w+),\w+\}|"operand_precision":\["(\w+)"')
_ALGORITHM = re.compile(r'algorithm=(\w+)|"algorithm":"(\w+)"')


def dot_precisions(hlo: str) -> dict[str, int]:
  """Matmul instructions of the optimized HLO by ``precision/algorithm`` (as XLA prints them:
  ``dot(...)`` attributes on CPU, the backend config of cuBLAS / Triton / cuDNN calls on GPU;
  an absent attribute is ``default`` / ``unset``). On an NVIDIA GPU, ``high`` and ``default``
  allow TF32 tensor cores, ``highest`` is true float32."""
  counts: dict[str, int] = {}
  for line in hlo.splitlines():
    if not _MATMUL_LINE.search(line) or "fused_computation" in line.split("=")[0]:
      continue
    prec = _PRECISION.search(line)
    algo = _ALGORITHM.search(line)
    key = (
      f"{''.join(prec.groups('')).lower() if prec else 'default'}/"
      f"{''.join(algo.groups('')).lower() if algo else 'unset'}"
    )
    counts[key] = counts.get(key, 0) + 1
  return counts


def _device_tag(device: jax.Device) -> str:
  return re.sub(r"[^a-z0-9]+", "_", str(device.device_kind).lower()).strip("_") or device.platform


def run_size(name: str, size: Size, args: argparse.Namespace) -> dict[str, Any]:
  key_params, key_data = jax.random.split(jax.random.key(0))
  params = init_params(size, key_params)
  tx = optax.adamw(1e-4, weight_decay=0.01)
  opt_state = tx.init(params)
  tokens = jax.random.randint(key_data, (size.batch, size.seq), 0, size.vocab, jnp.int32)
  targets = jnp.roll(tokens, -1, axis=1)
  n_params = sum(x.size for x in jax.tree.leaves(params))
  tokens_per_step = size.batch * size.seq
  print(f"\n{name}: {n_params / 1e6:.1f}M parameters, batch {size.batch} x seq {size.seq}", flush=True)

  compiled, compile_s, losses, hlo_counts = {}, {}, {}, {}
  products = {}
  for vname, (value_and_grad, prec, how) in variants(
    size.heads, args.formats, args.levels, args.force_tf32, args.form
  ).items():
    products[vname] = how
    prec = args.autocast_precision if prec == "autocast" else prec
    ctx = jax.default_matmul_precision(prec) if prec not in (None, "default") else contextlib.nullcontext()
    start = time.perf_counter()
    with ctx:
      exe = jax.jit(make_step(value_and_grad, tx)).lower(params, opt_state, tokens, targets).compile()
    compile_s[vname] = time.perf_counter() - start
    hlo = exe.as_text()
    hlo_counts[vname] = {
      **matmul_counts(hlo),
      "precision/algorithm": dot_precisions(hlo),
      "operand_dtypes": operand_dtypes(hlo),
    }
    if args.hlo_dir is not None:
      args.hlo_dir.mkdir(parents=True, exist_ok=True)
      (args.hlo_dir / f"{name}_{vname}.hlo.txt").write_text(hlo)
    for _ in range(args.warmup):
      out = jax.block_until_ready(exe(params, opt_state, tokens, targets))
    losses[vname] = float(out[2])
    compiled[vname] = exe
    print(
      f"  compiled {vname:26s} in {compile_s[vname]:7.2f} s; loss {losses[vname]:.6f}; "
      f"matmul precision/algorithm {hlo_counts[vname]['precision/algorithm']}; "
      f"operands {hlo_counts[vname]['operand_dtypes']}",
      flush=True,
    )

  names = list(compiled)
  runs = {n: functools.partial(compiled[n], params, opt_state, tokens, targets) for n in names}
  times = alternating_rounds(runs, args.rounds)

  base = statistics.median(times["float32"])
  bf16 = statistics.median(times["bf16_native"])
  results = {}
  print(
    f"  {'variant':26s} {'products':>16s} {'median ms':>10s} {'tokens/s':>12s} {'vs f32':>8s} "
    f"{'vs bf16':>8s} {'compile s':>10s}"
  )
  for vname in names:
    step_s = statistics.median(times[vname])
    results[vname] = {
      "median_step_s": step_s,
      "step_times_s": times[vname],
      "tokens_per_s": tokens_per_step / step_s,
      "ratio_vs_float32": step_s / base,
      "ratio_vs_bf16_native": step_s / bf16,
      "compile_s": compile_s[vname],
      "loss_after_warmup": losses[vname],
      "hlo_matmuls": hlo_counts[vname],
      "products": products[vname],
    }
    print(
      f"  {vname:26s} {products[vname]:>16s} {step_s * 1e3:10.2f} {tokens_per_step / step_s:12.0f} "
      f"{step_s / base:8.3f} {step_s / bf16:8.3f} {compile_s[vname]:10.2f}"
    )
  return {
    "shape": dataclasses.asdict(size),
    "parameters": n_params,
    "tokens_per_step": tokens_per_step,
    "results": results,
  }


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--size", default="gpt2-small,4layer", help=f"comma-separated, of {', '.join(SIZES)}")
  parser.add_argument("--formats", default="bfloat16,cbfloat16", help="autocast compute formats")
  parser.add_argument("--levels", default="0,1", help="autocast precision levels")
  parser.add_argument("--rounds", type=int, default=20, help="timed steps per variant (alternating order)")
  parser.add_argument("--warmup", type=int, default=3, help="untimed steps per variant after compiling")
  parser.add_argument(
    "--autocast_precision",
    default="default",
    choices=("default", "high", "highest", "tensorfloat32", "float32", "bfloat16"),
    help="jax.default_matmul_precision for the autocast variants",
  )
  parser.add_argument(
    "--force_tf32",
    action="store_true",
    help="also time every native-product variant with products=tf32 (<name>_tf32)",
  )
  parser.add_argument(
    "--form",
    default="grad_of_autocast",
    choices=("grad_of_autocast", "autocast_of_grad", "both"),
    help="value_and_grad(autocast(loss)) (the wafer train step's form), autocast(value_and_grad(loss)) "
    "(<name>_ag: backward products rounded and native too), or both",
  )
  parser.add_argument("--hlo_dir", type=Path, default=None, help="write each variant's optimized HLO here")
  parser.add_argument("--output", type=Path, default=None)
  args = parser.parse_args(argv)
  sizes = [s.strip() for s in args.size.split(",") if s.strip()]
  unknown = [s for s in sizes if s not in SIZES]
  if unknown or not sizes:
    parser.error(f"--size {args.size!r}: unknown {unknown}; allowed: {', '.join(SIZES)} (comma-separated)")
  args.formats = [precision.get_format(f).name for f in args.formats.split(",") if f.strip()]
  args.levels = [int(v) for v in args.levels.split(",") if v.strip()]
  if args.rounds < 1 or args.warmup < 1:
    parser.error("--rounds and --warmup must be >= 1")

  device = jax.devices()[0]
  print(f"device: {device.device_kind} ({device.platform}); jax {jax.__version__}")
  report = {
    "benchmark": "gpu_step",
    "device": str(device.device_kind),
    "platform": device.platform,
    "machine": platform.machine(),
    "jax": jax.__version__,
    "rounds": args.rounds,
    "warmup": args.warmup,
    "autocast_precision": args.autocast_precision,
    "force_tf32": args.force_tf32,
    "form": args.form,
    "target": {"autocast_cbfloat16_vs_bf16_native": TARGET_VS_BF16, "size": "gpt2-small"},
    "sizes": {name: run_size(name, SIZES[name], args) for name in sizes},
  }
  output = args.output or RESULTS / f"gpu_step_{_device_tag(device)}.json"
  output.parent.mkdir(parents=True, exist_ok=True)
  output.write_text(json.dumps(report, indent=2) + "\n")
  print(f"wrote {output}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
