"""`precision.numerics_report` on a small ResNet v1 (BatchNorm in training mode) and on BERT-tiny.

Run: ``python benchmarks/numerics_report_examples.py [--formats cb16,f16] [--batch-bert 8]``.
Prints the worst rows and the per-scope summary of ``value_and_grad(loss)`` under each
policy, the gradient error against float32, and the time of each report; writes the plots
to ``docs/numerics_report_*.png`` and the rows to ``benchmarks/results/numerics_report.json``.

The ResNet is the issue's case: 8x8 RGB input, a 3x3 stem, three stages of one basic block
each (16, 32, 64 channels; strides 1, 2, 2) and a last stage down to 1x1 feature maps, with
batch 4: the last BatchNorm normalises each channel over only 4 numbers (N x 1 x 1).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import precision  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---- a ResNet v1 in plain JAX ----


def _conv(x, w, stride):
  return jax.lax.conv_general_dilated(
    x, w, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
  )


def _batch_norm(x, gamma, beta, eps=1e-5):
  mean = jnp.mean(x, axis=(0, 1, 2))
  var = jnp.mean(jnp.square(x - mean), axis=(0, 1, 2))
  return (x - mean) * jax.lax.rsqrt(var + eps) * gamma + beta


def init_resnet(key, widths=(16, 16, 32, 64, 64), classes=10):
  keys = iter(jax.random.split(key, 32))

  def conv_w(k, cin, cout):
    return jax.random.normal(next(keys), (k, k, cin, cout)) * np.sqrt(2.0 / (k * k * cin))

  def bn(c):
    return {"gamma": jnp.ones(c), "beta": jnp.zeros(c)}

  params = {"stem": {"w": conv_w(3, 3, widths[0]), "bn": bn(widths[0])}, "blocks": []}
  for cin, cout in zip(widths[:-1], widths[1:]):
    block = {
      "w1": conv_w(3, cin, cout),
      "bn1": bn(cout),
      "w2": conv_w(3, cout, cout),
      "bn2": bn(cout),
      "proj": conv_w(1, cin, cout),
      "bnp": bn(cout),
    }
    params["blocks"].append(block)
  params["head"] = jax.random.normal(next(keys), (widths[-1], classes)) / np.sqrt(widths[-1])
  return params


STRIDES = (1, 2, 2, 2)  # 8x8 -> 8, 4, 2, 1


def resnet_loss(params, images, labels):
  with jax.named_scope("stem"):
    h = jax.nn.relu(_batch_norm(_conv(images, params["stem"]["w"], 1), **params["stem"]["bn"]))
  for i, (block, stride) in enumerate(zip(params["blocks"], STRIDES)):
    with jax.named_scope(f"block{i + 1}"):
      y = jax.nn.relu(_batch_norm(_conv(h, block["w1"], stride), **block["bn1"]))
      y = _batch_norm(_conv(y, block["w2"], 1), **block["bn2"])
      shortcut = _batch_norm(_conv(h, block["proj"], stride), **block["bnp"])
      h = jax.nn.relu(y + shortcut)
  with jax.named_scope("head"):
    logits = jnp.mean(h, axis=(1, 2)) @ params["head"]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1))


# ---- BERT-tiny from the default config ----


def bert_case(batch_size, seed=0):
  from models.zoo import functional
  from wafer.config import load_params

  # unrolled layers: a row per layer (a scan's iterations would share one row)
  cfg = load_params(
    os.path.join(ROOT, "models/bert/configs/params_bert_tiny_default.yaml"), ["model.scan_layers=false"]
  )
  init_params, loss_fn = functional(cfg.model)
  params = init_params(jax.random.key(seed))
  seq, preds, vocab = 128, 20, cfg.model.vocab_size
  k = iter(jax.random.split(jax.random.key(seed + 1), 8))
  batch = {
    "input_ids": jax.random.randint(next(k), (batch_size, seq), 5, vocab, jnp.int32),
    "token_type_ids": (jnp.arange(seq) >= seq // 2).astype(jnp.int32)[None].repeat(batch_size, 0),
    "attention_mask": jnp.ones((batch_size, seq), jnp.int32),
    "masked_lm_positions": jax.random.randint(next(k), (batch_size, preds), 1, seq, jnp.int32),
    "masked_lm_mask": jnp.ones((batch_size, preds), jnp.int32),
    "labels": jax.random.randint(next(k), (batch_size, preds), 5, vocab, jnp.int32),
    "next_sentence_label": jax.random.randint(next(k), (batch_size,), 0, 2, jnp.int32),
  }
  return loss_fn, params, batch


def grad_error(fn, policy, *args):
  """|| g_policy - g_float32 || / || g_float32 || over all gradient leaves (autocast(value_and_grad))."""
  _, g32 = fn(*args)
  _, gp = precision.autocast(fn, policy)(*args)
  a = np.concatenate([np.ravel(x) for x in jax.tree.leaves(gp)]).astype(np.float64)
  b = np.concatenate([np.ravel(x) for x in jax.tree.leaves(g32)]).astype(np.float64)
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def report_case(name, fn, args, policies, depth, top, results):
  for policy in policies:
    start = time.perf_counter()
    report = precision.numerics_report(fn, policy, *args)
    seconds = time.perf_counter() - start
    err = grad_error(fn, policy, *args)
    print(f"\n=== {name}, {policy}: {len(report.rows)} equations, report in {seconds:.1f} s; "
          f"gradient error vs float32 {100 * err:.1f} % ===")  # fmt: skip
    report.table(top)
    print("per scope (worst drop first):")
    for s in report.by_scope(depth)[:6]:
      print(f"  {s['scope'] or '(none)':<40} worst drop {s['worst_drop_db']:6.1f} dB at {s['worst_at']}; "
            f"min SQNR {s['min_sqnr_db']:6.1f} dB; flips {s['flips']}; underflow {s['underflow']}; cancelled {s['cancelled']}")  # fmt: skip
    print("decisions that flipped (closest to the boundary first):")
    for r in report.flips()[:6]:
      dist = "-" if r.flip_distance is None else f"{r.flip_distance:.3g}"
      print(f"  {r.primitive:<10} {r.source:<45} {r.scope:<28} flips {r.flips:3d}  float32 distance {dist}")
    tag = policy.replace("=", "").replace(",", "_")
    path = os.path.join(ROOT, "docs", f"numerics_report_{name}_{tag}.png")
    report.plot(path, depth=depth, title=f"{name}: value_and_grad under {policy}")
    print(f"plot: {os.path.relpath(path, ROOT)}")
    results.append(
      {"case": name, "policy": policy, "seconds": seconds, "grad_rel_error": err, "report": report.to_dict()}
    )


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--formats", default="cb16,f16")
  parser.add_argument("--batch-bert", type=int, default=8)
  parser.add_argument("--top", type=int, default=12)
  parser.add_argument("--skip-bert", action="store_true")
  args = parser.parse_args()
  policies = [f"c={f}" for f in args.formats.split(",")]
  results: list = []

  params = init_resnet(jax.random.key(0))
  images = jax.random.normal(jax.random.key(1), (4, 8, 8, 3))
  labels = jnp.array([1, 3, 5, 7])
  report_case(
    "resnet", jax.value_and_grad(resnet_loss), (params, images, labels), policies, 1, args.top, results
  )

  if not args.skip_bert:
    loss_fn, bparams, batch = bert_case(args.batch_bert)
    report_case("bert_tiny", jax.value_and_grad(loss_fn), (bparams, batch), policies, 2, args.top, results)

  os.makedirs(os.path.join(ROOT, "benchmarks", "results"), exist_ok=True)
  out = os.path.join(ROOT, "benchmarks", "results", "numerics_report.json")
  with open(out, "w") as f:
    for r in results:  # keep the JSON small: the 30 worst rows per case
      r["report"]["rows"] = r["report"]["rows"][:30]
    json.dump(results, f, indent=1)
  print(f"\nwrote {os.path.relpath(out, ROOT)}")


if __name__ == "__main__":
  main()
