"""Activation memory as the compiler manages it (issue 25, item 2): what autodiff saves for the
backward pass stays on the wafer when it fits; when it does not, only the layer boundaries are kept
and each layer's forward is recomputed before its backward (`wafer.costmodel.streaming`). GPT-3
175B on 16 x CS-2 and a 70B LLaMA on one CS-3 then fit, at a plausible model-FLOP utilisation."""

from __future__ import annotations

import dataclasses
import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wafer
from tests.wafer.costmodel.helpers import mlp_params, mlp_train_step, sds
from wafer.costmodel import CALIBRATION
from wafer.costmodel import workloads as W
from wafer.costmodel.graph import extract
from wafer.costmodel.hardware import get_system
from wafer.costmodel.mesh import Machine
from wafer.costmodel.streaming import ActivationMemory, StreamingResult, activation_memory, weight_streaming

# LLaMA-2 70B (Touvron et al. 2023, table 1 and section 2.2: 80 layers, d 8192, 64 heads with 8
# key/value heads, SwiGLU FFN 28672, vocab 32000), at sequence 2048 as the other workloads
LLAMA_70B = dataclasses.replace(
  W.LLAMA_7B, layers=80, d_model=8192, heads=64, kv_heads=8, ffn=28672, vocab=32000, seq=2048
)
SMALL = W.TransformerConfig(layers=4, d_model=64, heads=4, ffn=256, vocab=300, seq=64)
BATCH = 32


@functools.cache
def _graph():
  fn, args = W.train_example(SMALL, 4)
  return extract(fn, args, batch_argnums=(2,), compute_bits=16)


def _machine(system: str = "wse2") -> tuple[Machine, object]:
  sys_ = get_system(system)
  return Machine(sys_.chip, CALIBRATION, 32, "search"), sys_


def _run(mb: int, pes: int, recompute: bool | None = None) -> StreamingResult | str:
  """Weight streaming of the small transformer at micro-batch ``mb`` on a ``pes x pes`` rectangle
  (a small rectangle: little SRAM, so that recomputation is needed at small sizes)."""
  machine, sys_ = _machine()
  return weight_streaming(_graph(), machine, sys_, pes, pes, BATCH, micro_batch=mb, recompute=recompute)


def _capacity(pes: int) -> float:
  return pes * pes * _machine()[0].sram_data_bytes


MBS = st.sampled_from([1, 2, 3, 4, 6, 8, 11, 16, 32])


@settings(max_examples=40, deadline=None)
@given(a=MBS, b=MBS)
def test_activation_memory_grows_with_the_micro_batch_and_checkpoints_take_less(a, b):
  g = _graph()
  lo, hi = sorted((a, b))
  m_lo, m_hi = activation_memory(g, lo / g.traced_batch), activation_memory(g, hi / g.traced_batch)
  assert m_lo.full <= m_hi.full and m_lo.checkpointed <= m_hi.checkpointed
  assert m_lo.attention <= m_hi.attention
  for m in (m_lo, m_hi):
    assert 0 < m.checkpointed <= m.full and 0 < m.attention < m.full  # (the attention scores: h s^2)
    assert m.boundary < m.checkpointed
  assert m_hi.recomputable  # the layers of the scan
  # linear in the micro-batch (every saved tensor is per sample)
  assert m_hi.full / m_lo.full == pytest.approx(hi / lo, rel=1e-6)


@settings(max_examples=40, deadline=None)
@given(mb=MBS, pes=st.sampled_from([4, 6, 8, 12, 16, 24, 64, 300]))
def test_recomputation_happens_exactly_when_the_activations_do_not_fit(mb, pes):
  """Attention's core is always recomputed (it runs fused: its scores are never stored, whether
  they would fit or not); whole layers when that does not fit; else the micro-batch is rejected,
  naming the sizes."""
  g = _graph()
  mem = activation_memory(g, mb / g.traced_batch)
  res = _run(mb, pes)
  cap = _capacity(pes)
  assert mem.attention < mem.full  # (the graph has an attention core)
  assert mem.level(cap) != ""
  if mem.attention <= cap:
    assert isinstance(res, StreamingResult) and res.recomputed == "attention" and res.recompute_fraction > 0
    assert res.resident_bytes == pytest.approx(mem.attention)
  elif mem.checkpointed <= cap:
    assert isinstance(res, StreamingResult) and res.recomputed == "layers" and res.recompute_fraction > 0
    assert res.resident_bytes == pytest.approx(mem.checkpointed)
  else:
    assert isinstance(res, str) and "recomputing each layer" in res and "attention's scores" in res


@settings(max_examples=30, deadline=None)
@given(mb=MBS, pes=st.sampled_from([8, 12, 16, 24, 64, 300]))
def test_recomputing_costs_time_and_exactly_the_forward_flops_of_the_layers(mb, pes):
  g = _graph()
  ratio = mb / g.traced_batch
  mem = activation_memory(g, ratio)
  with_ = _run(mb, pes, recompute=True)
  without = _run(mb, pes, recompute=False)
  assert isinstance(without, StreamingResult) == (mem.full <= _capacity(pes))
  if mem.checkpointed > _capacity(pes):
    assert isinstance(with_, str)
    return
  assert isinstance(with_, StreamingResult) and with_.recompute and with_.recomputed == "layers"
  if isinstance(without, StreamingResult):  # (when the full set fits at all)
    assert not without.recompute and without.recompute_flops == 0.0
    assert with_.step_s >= without.step_s
    assert with_.model_flops == pytest.approx(without.model_flops)
    attn = _run(mb, pes, recompute="attention")  # (fits: it needs less than the full set)
    assert isinstance(attn, StreamingResult) and attn.recomputed == "attention"
    assert without.step_s <= attn.step_s
    core = [m for k in g.kernels if k.count > 1 for m in k.matmuls for _ in range(k.count)]
    core = [m for m in core if m.phase == "fwd" and not m.weight and m.instances.at_trace > 1]
    assert attn.recompute_flops == pytest.approx(attn.n_micro * sum(m.flops(ratio) for m in core))
    assert 0 < attn.recompute_flops < with_.recompute_flops
  again = [k for k in g.kernels if k.name in mem.recomputable]  # every segment with a backward
  assert {k.name for k in g.kernels if k.count > 1} <= set(mem.recomputable)
  forward = with_.n_micro * sum(k.count * k.matmul_flops(ratio, ("fwd",)) for k in again)
  assert with_.recompute_flops == pytest.approx(forward)
  assert sum(r.recompute_flops for r in with_.kernels) == pytest.approx(forward)
  everything = with_.n_micro * sum(k.count * k.matmul_flops(ratio, ("fwd", "bwd")) for k in g.kernels)
  assert with_.model_flops == pytest.approx(everything)
  # a transformer's layers hold most of its work, and backward = 2 x forward: about a third more
  assert 0.2 < with_.recompute_fraction < 1 / 3 + 1e-9


def test_a_step_that_fits_recomputes_only_its_fused_attention_scores_and_says_so():
  fn, args = W.train_example(SMALL, BATCH)
  r = wafer.estimate(fn, *args, mode="weight_streaming")
  assert r.fits and 0.0 < r.details["recompute_fraction"] < 0.2
  notes = [n for n in r.notes if "recomputing" in n]
  assert len(notes) == 1 and "attention runs fused" in notes[0] and "forward runs again" not in notes[0]
  fn, args = mlp_train_step([64, 128, 64]), (mlp_params([64, 128, 64]), sds(8, 16, 64), sds(8, 16, 64))
  plain = wafer.estimate(fn, *args, mode="weight_streaming")  # (no attention: nothing recomputed)
  assert plain.fits and plain.details["recompute_fraction"] == 0.0
  assert not any("recomputing" in n for n in plain.notes)


def test_a_step_too_big_even_recomputing_says_what_each_level_would_need():
  """Two layers of different widths (nothing repeats) with 2^25 tokens a sample: one sample's
  activations exceed the wafer's SRAM, even recomputing each layer from its input."""
  widths = [256, 512, 128]
  x, y = sds(4, 2**25, widths[0]), sds(4, 2**25, widths[-1])
  r = wafer.estimate(mlp_train_step(widths, names=False), mlp_params(widths), x, y, mode="weight_streaming")
  assert not r.fits and "GB recomputing each layer from its boundary" in r.reason, r.reason
  assert "attention" not in r.reason  # (no attention to recompute alone)


FLAGSHIPS = [
  pytest.param(W.GPT3_175B, 1536, {"system": "wse2", "num_csx": 16}, id="gpt3-175b-16xcs2"),
  pytest.param(LLAMA_70B, 1024, {"system": "wse3"}, id="llama-70b-1xcs3"),
]


@pytest.mark.parametrize(("cfg", "batch", "kwargs"), FLAGSHIPS)
def test_the_flagship_models_fit_by_recomputing_at_a_plausible_utilisation(cfg, batch, kwargs):
  fn, args = W.train_example(cfg, 8)
  r = wafer.estimate(fn, *args, batch_size=batch, mode="weight_streaming", **kwargs)
  assert r.fits, r.reason
  mfu = r.samples_per_sec * r.flops_per_sample / r.peak_flops_per_sec
  assert 0.05 <= mfu <= 0.60, mfu  # (measured: GPT-3 175B 18 %, LLaMA-70B 17 %)
  note = next(n for n in r.notes if n.startswith("recomputing activations: +"))
  assert f"+{100 * r.details['recompute_fraction']:.0f} % FLOPs" in note, note
  # whole layers (+33 %) or, when their boundaries do not fit, spans of them (+66 %)
  assert 0 < r.details["recompute_fraction"] <= 2 / 3 + 0.01
  assert (
    r.details["resident_bytes"]
    <= r.grid[0]
    * r.grid[1]
    * Machine(get_system(kwargs["system"]).chip, CALIBRATION, 32, "search").sram_data_bytes
  )


def test_an_unknown_recompute_level_is_an_error_naming_the_allowed_ones():
  machine, sys_ = _machine()
  with pytest.raises(wafer.costmodel.EstimateError, match=r"recompute='some'; allowed: None, False, True"):
    weight_streaming(_graph(), machine, sys_, 64, 64, BATCH, recompute="some")


@settings(max_examples=60, deadline=None)
@given(
  full=st.floats(1.0, 1e12),
  frac=st.floats(0.01, 0.99),
  ckpt=st.floats(0.001, 0.99),
  cap=st.floats(0.5, 2e12),
)
def test_level_keeps_everything_only_without_an_attention_core(full, frac, ckpt, cap):
  """Without an attention core (``attention == full``) nothing is recomputed when everything fits;
  with one, the fused core is recomputed even when everything would fit."""
  plain = ActivationMemory(full, ckpt * full, 0.0, 0.0, ("layer",), attention=full)
  fused = ActivationMemory(full, ckpt * full * frac, 0.0, 0.0, ("layer",), attention=frac * full)
  assert plain.level(cap) == ("" if full <= cap else "layers" if ckpt * full <= cap else None)
  assert fused.level(cap) == (
    "attention" if frac * full <= cap else "layers" if ckpt * frac * full <= cap else None
  )


@pytest.mark.parametrize("seq", [2048, 24576])
def test_fused_attention_keeps_no_score_matrix_so_long_sequences_fit(seq):
  """Attention's ``h s^2`` scores are produced and consumed block by block (fused, as
  FlashAttention's forward and backward), so no level of the activation memory holds one sample's
  score matrix: GPT-2 small's shape at 24,576 tokens (29 GB of scores a sample, over the CS-2's
  27.5 GB) fits on a CS-2, and the memory at any length is the saved set without the scores."""
  cfg = dataclasses.replace(W.GPT2_SMALL, layers=2, seq=seq, max_positions=seq)
  fn, args = W.train_example(cfg, 2)
  graph = extract(fn, args, batch_argnums=(2,), compute_bits=16)
  mem = activation_memory(graph, 1.0)
  one = 1.0 / graph.traced_batch
  scores = max(sum(k.saved_bytes(one, core=True) for k in graph.kernels), 0.0)
  assert scores >= cfg.heads * seq * seq * 2  # one sample's scores, 16-bit, are in the saved set
  assert mem.attention < mem.full  # fused: recomputing the scores keeps less than keeping them
  no_core = sum(k.count * k.saved_bytes(1.0, core=False) for k in graph.kernels)
  assert mem.attention == pytest.approx(no_core)  # no score matrix, not even one sample's
  assert mem.checkpointed <= mem.attention
  report = wafer.estimate(fn, *args, system="wse2", mode="weight_streaming")
  assert report.fits and report.samples_per_sec > 0


GPT3_XL = "tests/data/modelzoo/Release_2.3.1/gpt3/params_gpt3_xl.yaml"


def _plan_step(path: str, overrides: list[str]):
  from wafer import runner, train
  from wafer.compile import cheap_sharding_probes

  root = __import__("pathlib").Path(__file__).parents[3]
  p = runner.load_plan(str(root / path), overrides)
  with cheap_sharding_probes():
    state, batch = train.step_shapes(p.task, p.optimizer, p.loss_scale, p.seed)
  return p, train.make_train_step(p.task, p.optimizer, p.policy), state, batch


def test_a_reference_gpt_under_autocast_checkpoints_only_its_residual_stream():
  """A real modelzoo GPT-3 file on the reference GPT model (scanned layers; autocast's roundings and
  nested calls inside each layer): each layer's checkpoint is its residual stream ``[b, s, d]`` (a
  value the layer made, then rounded or passed into a nested call, is its own, not one entering it),
  and a forward-only piece of a layer grouped apart keeps none. Before, the GELU's input entered
  each layer (4x the residual) and a forward-only piece counted 7 checkpoints a layer."""
  _, step, state, batch = _plan_step(
    GPT3_XL, ["model.num_hidden_layers=4", "train_input.batch_size=8", "train_input.micro_batch_size=8"]
  )
  graph = extract(step, (state, batch), batch_argnums=(1,), compute_bits=16)
  mem = activation_memory(graph, 1.0)
  residual = 8 * 2048 * 2048 * 2  # batch x seq x d, 16-bit
  assert mem.boundary == pytest.approx(
    5 * residual, rel=1e-3
  )  # 4 layers' inputs, the head's (and the token ids)


@pytest.mark.slow  # over 5 s; .ci/run runs the slow tests
def test_the_gpt3_xl_file_runs_its_own_micro_batch():
  """The file's ``micro_batch_size: 88`` (Cerebras' setting for GPT-3 XL at 2048 tokens on a CS-2) fits
  as given, recomputing the layers from their checkpoints."""
  p, step, state, batch = _plan_step(GPT3_XL, [])
  from wafer.costmodel.estimate import run_inputs

  report = wafer.estimate(
    step,
    state,
    batch,
    batch_argnums=(1,),
    batch_size=p.task.batch_size,
    policy=p.policy,
    **run_inputs(p.params),
  )
  assert report.fits and report.micro_batch_size == 88, report.reason
