"""Kernels are named by the model's layers (issue 12, item 4): the reference models' named scopes
(``embeddings``, ``encoder/layer_0/attention``, ``mlm_head`` ...) reach the text report, the JSON and
the placement picture, through `wafer.estimate` on a train step built from ``models.functional`` and
through ``wafer estimate --params``. BERT and GPT-2 are checked both ways they run their layers:
scanned (``model.scan_layers``, the default: one scan named ``encoder/layer``, whose placement
labels are ``encoder/layer/attention[i]``) and unrolled (``encoder/layer_{i}/attention``)."""

from __future__ import annotations

import json
import re

import jax
import jax.numpy as jnp
import pytest

import wafer
import wafer.config
from models.zoo import functional
from wafer.cli import main

S = jax.ShapeDtypeStruct

CONFIGS = {
  "bert": "models/bert/configs/params_bert_tiny.yaml",
  "gpt2": "models/gpt2/configs/params_gpt2_tiny.yaml",
  "fc_mnist": "models/fc_mnist/configs/params_fc_mnist.yaml",
}


STACK = {"bert": ("encoder", "mlm_head"), "gpt2": ("decoder", "lm_head")}
LAYER = re.compile(r"(^|/)layer(_\d+|_\*)?(/|$)")  # a layer's kernel (not fc_mnist's last_layer)


def _layer_names(model: str, layers: int, scan: bool = False) -> list[str]:
  """Each written layer's own name: its placement label (a scanned layer's is ``name[i]``)."""
  if model in STACK:
    stack, head = STACK[model]
    per = [
      f"{stack}/layer/{part}[{i}]" if scan else f"{stack}/layer_{i}/{part}"
      for i in range(layers)
      for part in ("attention", "ffn")
    ]
    return ["embeddings", *per, head]
  return [*(f"layer_{i}" for i in range(layers)), "last_layer"]


# the kernels of the canonical layer graph (the tiny configs have 2 encoder/decoder layers, and
# fc_mnist 10 layers of which the last 9 are identical)
CANONICAL = {
  ("bert", False): ["embeddings", "encoder/layer_*/attention", "encoder/layer_*/ffn", "mlm_head"],
  ("gpt2", False): ["embeddings", "decoder/layer_*/attention", "decoder/layer_*/ffn", "lm_head"],
  ("bert", True): ["embeddings", "encoder/layer/attention", "encoder/layer/ffn", "mlm_head"],
  ("gpt2", True): ["embeddings", "decoder/layer/attention", "decoder/layer/ffn", "lm_head"],
  ("fc_mnist", False): ["layer_0", "layer_*", "last_layer"],
}
CASES = sorted(CANONICAL)


def _layers(model_cfg) -> int:
  n = getattr(model_cfg, "num_hidden_layers", None)
  return n if n is not None else len(model_cfg.hidden_sizes())


def _batch(model: str, b: int, model_cfg) -> dict[str, S]:
  i32 = lambda *shape: S(shape, jnp.int32)  # noqa: E731
  if model == "bert":
    s, p = 64, 10
    return {
      "input_ids": i32(b, s),
      "token_type_ids": i32(b, s),
      "attention_mask": i32(b, s),
      "labels": i32(b, p),
      "masked_lm_mask": i32(b, p),
      "masked_lm_positions": i32(b, p),
      "next_sentence_label": i32(b),
    }
  if model == "gpt2":
    return {"input_ids": i32(b, 64), "labels": i32(b, 64)}
  return {"images": S((b, model_cfg.input_size), jnp.float32), "labels": i32(b)}


@pytest.fixture(scope="module", params=CASES, ids=[f"{m}-{'scan' if s else 'loop'}" for m, s in CASES])
def estimated(request):
  model, scan = request.param
  p = wafer.config.load_params(
    CONFIGS[model], [f"model.scan_layers={str(scan).lower()}"] if model in STACK else []
  )
  init, loss = functional(p.model)
  params = jax.eval_shape(init, jax.random.key(0))

  def train_step(params, batch):
    value, grads = jax.value_and_grad(loss)(params, batch)
    return jax.tree.map(lambda w, g: w - 0.01 * g, params, grads), value

  report = wafer.estimate(train_step, params, _batch(model, 8, p.model), mode="pipeline")
  return model, scan, _layers(p.model), report


def _folded(names: list[str]) -> list[str]:
  """The canonical layer graph's names (issue 25, item 3): identical layers are one kernel with a
  count, named with ``*`` where the layers' names differ (``encoder/layer_*/attention``)."""
  out: list[str] = []
  for n in names:
    f = re.sub(r"\[\d+\]$", "", re.sub(r"layer_\d+", "layer_*", n))
    if f not in out:
      out.append(f)
  return out


def test_kernels_are_named_by_the_modules(estimated):
  model, scan, layers, report = estimated
  names = [k.name for k in report.kernels]
  expected = _folded(_layer_names(model, layers, scan))
  assert expected == CANONICAL[model, scan] or model == "fc_mnist"
  if model == "fc_mnist":  # the first layer reads the images (a wider input): not one of the others
    expected = CANONICAL[model, scan]
  assert [n for n in names if n in expected] == expected  # all of them, in dataflow order
  assert not any(n.startswith(("dot_general", "ops")) for n in names), names
  # the layers are folded, every written layer counted: one kernel per layer part, with its count
  assert sum(k.count for k in report.kernels if LAYER.search(k.name)) == sum(
    1 for n in _layer_names(model, layers, scan) if LAYER.search(n)
  )


def test_names_reach_the_text_the_json_and_the_placement(estimated, tmp_path):
  model, scan, layers, report = estimated
  text = report.to_text()
  data = json.loads(report.to_json())
  labels = {r.label for r in report.placement}
  for name in {k.name for k in report.kernels}:
    assert name in text
    assert name in {k["name"] for k in data["kernels"]}
  for name in _layer_names(model, layers, scan):  # the placement keeps each written layer's own name
    assert name in labels
  assert report.save(tmp_path)["png"]


@pytest.mark.parametrize("model", sorted(CONFIGS))
def test_cli_estimate_params_names_kernels_by_layer(model, tmp_path, capsys):
  assert main(["estimate", "--params", CONFIGS[model], "--model_dir", str(tmp_path)]) == 0
  out = capsys.readouterr().out
  data = json.loads((tmp_path / "compile_report.json").read_text())
  names = {k["name"] for k in data["kernels"]}
  for name in CANONICAL[model, model in STACK]:  # scanned: the default
    assert name in names and name in out


def test_a_step_without_names_is_told_how_to_name_its_rows():
  """Rows named ``dot_general_N`` cannot be mapped to the user's code: the report says to use
  ``jax.named_scope``; a step that names its layers gets no such note."""
  from tests.wafer.costmodel.helpers import sds

  def make(named: bool):
    def loss(w, x):
      for i in range(2):
        if named:
          with jax.named_scope(f"layer_{i}"):
            x = jnp.tanh(x @ w[i])
        else:
          x = jnp.tanh(x @ w[i])
      return jnp.mean(x**2)

    def step(w, x):
      return w - 1e-3 * jax.grad(loss)(w, x)

    return step

  hint = "named by op pattern"
  plain = wafer.estimate(make(False), sds(2, 32, 32), sds(8, 32))
  assert all(
    k.name.startswith(("dot_general", "ops", "layer latencies", "step boundary")) for k in plain.kernels
  )
  assert any(hint in n for n in plain.notes), plain.notes
  named = wafer.estimate(make(True), sds(2, 32, 32), sds(8, 32))
  assert not any(hint in n for n in named.notes), named.notes
