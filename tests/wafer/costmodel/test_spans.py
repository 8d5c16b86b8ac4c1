"""Nested recomputation (``recompute="spans"``): when even the layer boundaries do not fit, only every
``span``-th is kept, each span's forward runs again to rebuild its boundaries, and each layer once more
before its backward (Chen et al. 2016, https://arxiv.org/abs/1604.06174). Cerebras' own micro-batches
for GPT-3 2.7B / 6.7B / 13B (modelzoo 2.1-2.3: 88, 104 and 90 at 2,048 tokens; 30.7, 58 and 78 GB of
layer boundaries, over the 27.5 GB of SRAM a CS-2 has for tensors) fit only so."""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wafer.costmodel import CALIBRATION
from wafer.costmodel import workloads as W
from wafer.costmodel.graph import extract
from wafer.costmodel.hardware import get_system
from wafer.costmodel.mesh import Machine
from wafer.costmodel.streaming import activation_memory, cost_micro_batches, weight_streaming

MODELZOO = Path(__file__).parents[2] / "data" / "modelzoo"


@functools.cache
def _graph(layers: int):
  cfg = W.TransformerConfig(layers=layers, d_model=64, heads=4, ffn=256, vocab=300, seq=64)
  fn, args = W.train_example(cfg, 4)
  return extract(fn, args, batch_argnums=(2,), compute_bits=16)


def _machine():
  sys_ = get_system("wse2")
  return Machine(sys_.chip, CALIBRATION, 32, "search"), sys_


@settings(max_examples=12, deadline=None)
@given(layers=st.sampled_from([9, 16, 30, 40]), mb=st.sampled_from([1, 4, 16]))
def test_spans_keep_fewer_bytes_than_layer_boundaries_by_the_sqrt_rule(layers, mb):
  graph, doubled = _graph(layers), _graph(2 * layers)
  mem = activation_memory(graph, mb / graph.traced_batch)
  span = round(math.sqrt(layers))
  assert mem.span == span and mem.levels()[-2:] == ["layers", "spans"]
  assert mem.nested < mem.checkpointed < mem.full
  # one layer's boundary x from boundary = others + L * x at L and 2L layers; the block keeps
  # ceil(L / span) of its L boundaries and rebuilds one span's; the other segments keep theirs
  x = (activation_memory(doubled, mb / doubled.traced_batch).boundary - mem.boundary) / layers
  saved = (layers - math.ceil(layers / span) - span) * x
  assert mem.checkpointed - mem.nested == pytest.approx(saved, rel=1e-9)


@settings(max_examples=8, deadline=None)
@given(layers=st.sampled_from([9, 16]), mb=st.sampled_from([2, 8, 32]))
def test_spans_cost_one_more_forward_of_every_layer_and_its_weights_once_more(layers, mb):
  graph = _graph(layers)
  machine, sys_ = _machine()
  runs = {
    level: cost_micro_batches(graph, machine, sys_, 64, 64, 32, [mb], recompute=level)[0][mb]
    for level in ("layers", "spans")
  }
  spans, plain = runs["spans"], runs["layers"]
  assert spans.recomputed == "spans" and plain.recomputed == "layers"
  block = [k for k in graph.kernels if k.count > 1 and k.has_phase("bwd")]
  ratio, n_micro = mb / graph.traced_batch, plain.n_micro
  fwd = sum(n_micro * k.count * k.matmul_flops(ratio, ("fwd",)) for k in block)
  weights = sum(n_micro * k.count * k.weight_bytes() for k in block) / sys_.io_bytes_per_sec
  assert spans.recompute_flops - plain.recompute_flops == pytest.approx(fwd, rel=1e-9)
  assert spans.io_s - plain.io_s == pytest.approx(weights, rel=1e-9)
  assert spans.step_s > plain.step_s and spans.model_flops == plain.model_flops
  assert spans.resident_bytes < plain.resident_bytes


def test_the_compiler_keeps_spans_only_when_the_boundaries_do_not_fit():
  graph = _graph(16)
  machine, sys_ = _machine()
  mem = activation_memory(graph, 32 / graph.traced_batch)
  side = math.isqrt(int(mem.checkpointed / machine.sram_data_bytes)) - 1  # boundaries do not fit
  assert side * side * machine.sram_data_bytes >= mem.nested, "the example must fit as spans"
  res = weight_streaming(graph, machine, sys_, side, side, 32, micro_batch=32)
  assert res.recomputed == "spans" and res.resident_bytes == mem.nested
  roomy = weight_streaming(graph, machine, sys_, side + 40, side + 40, 32, micro_batch=32)
  assert roomy.recomputed in ("attention", "layers")


@pytest.mark.slow  # three GPT-3 estimates, about 30 s
@pytest.mark.parametrize(
  ("name", "micro_batch"),
  [("params_gpt3_2p7b.yaml", 88), ("params_gpt3_6p7b.yaml", 104), ("params_gpt3_13b.yaml", 90)],
)
def test_cerebras_micro_batches_of_real_gpt3_files_fit_on_a_cs2(name, micro_batch, tmp_path, capsys):
  """The micro-batch of Cerebras' own params file ("forcing this micro batch size will lead to best
  performance") is used as given and fits, recomputing spans of layers."""
  import json

  from wafer import cli

  path = MODELZOO / "Release_2.3.1" / "gpt3" / name
  assert cli.main(["estimate", "--params", str(path), "--model_dir", str(tmp_path)]) == 0, capsys.readouterr()
  report = json.loads((tmp_path / "compile_report.json").read_text())
  assert report["fits"] and report["micro_batch_size"] == micro_batch and report["system"] == "wse2"
  assert report["details"]["micro_batch_given"] and report["samples_per_sec"] > 0
  assert any("only every" in note and "th is kept" in note for note in report["notes"]), report["notes"]


def test_recompute_spans_is_a_checked_argument():
  graph = _graph(9)
  machine, sys_ = _machine()
  with pytest.raises(Exception, match=r"allowed: None, False, True, 'attention', 'layers', 'spans'"):
    cost_micro_batches(graph, machine, sys_, 64, 64, 32, [4], recompute="segments")
  assert dataclasses.is_dataclass(activation_memory(graph, 1.0))
