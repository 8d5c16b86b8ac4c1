"""muP as modelzoo implements it (`models.mup`): the real muP params files get modelzoo's numbers,
the forward pass has modelzoo's multipliers (checked bit for bit against the plain model with
rescaled weights), the learning-rate groups cover the parameters modelzoo's globs name, and a run
applies them.

The expected numbers of the real files were computed from modelzoo's formulas
(``common/utils/model/mup_utils.py``, ``models/nlp/gpt2/gpt2_model.py``, ``models/nlp/bert/``,
``layers/AttentionLayer.py`` of each file's release), independently of `models.mup`.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models import bert, gpt2
from models.bert.model import BertConfig
from models.gpt2.model import GPT2Config
from models.zoo import functional
from tests.samples import SHRUNK
from wafer.config import ConfigError, load_params
from wafer.optim import path_names

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "modelzoo"

REAL = {
  # file: (attention factor, output-logits factor, embeddings scale, {group: lr factor}, init stds)
  "Release_1.9.1/gpt3/Cerebras_GPT/111m_mup.yaml": (
    1 / 64,
    1 / 3,
    10.0,
    {"decoder_kernel": 1 / 3},
    {"initializer": 0.02, "output_layer_initializer": 0.004472135954999579},
  ),
  "Release_2.3.1/gpt3/muP/params_gpt3_40M.yaml": (
    1 / 64,
    1.0,
    10.0,
    {},
    {"initializer": 0.08, "output_layer_initializer": 0.011547005383792516},
  ),
  "Release_2.4.3/gpt3/Cerebras_GPT/256m_mup.yaml": (
    1 / 64,
    1 / 4.25,
    10.0,
    {"decoder_attention": 1 / 4.25, "decoder_input_ffn": 1 / 4.25, "decoder_output_ffn": 1 / 4.25},
    {
      "initializer": 0.0388057,
      "output_layer_initializer": 0.00733359,
      "ffn_output_layer_initializer": 0.0018334,
      "embedding_initializer": 0.08,
    },
  ),
  "Release_2.10.0/gpt3/Cerebras_GPT/1p3b_mup.yaml": (
    1 / 128,
    1 / 8,
    10.0,
    {"decoder_attention": 1 / 8, "decoder_input_ffn": 1 / 8, "decoder_output_ffn": 1 / 8},
    {"ffn_output_layer_initializer": 0.02 * 8**-0.5 * 48**-0.5},
  ),
  "Release_2.4.3/bert/bert_large_MSL512_muP.yaml": (
    4.0 / 64,
    2.22 / 2,
    14.6,
    {"encoder_attention": 0.5, "encoder_input_ffn": 0.5, "encoder_output_ffn": 0.5, "pooler": 0.5},
    {},
  ),
}


@pytest.mark.parametrize("name", sorted(REAL))
def test_the_real_mup_files_get_modelzoos_numbers(name):
  attention, logits, embeddings, lr, stds = REAL[name]
  params = load_params(DATA / name)
  model = params.model
  head_dim = model.hidden_size // model.num_heads
  assert model.attention_scale(head_dim) == pytest.approx(attention, rel=1e-12)
  assert (model.output_logits_multiplier() or 1.0) == pytest.approx(logits, rel=1e-12)
  assert model.embeddings_scale == embeddings
  adjust = params.optimizer.adjust_learning_rate
  assert model.learning_rate_scales(adjust) == pytest.approx(lr, rel=1e-12)
  for which, std in stds.items():
    assert model.initializer_std(which) == pytest.approx(std, rel=1e-5), which


_SMALL = dict(
  vocab_size=64,
  hidden_size=64,
  num_hidden_layers=2,
  num_heads=4,  # head_dim 16: 1 / sqrt(16) and 1 / 16 are powers of two
  filter_size=128,
  max_position_embeddings=32,
  dropout_rate=0.0,
  share_embedding_weights=False,
)


def _gpt(**update) -> GPT2Config:
  return GPT2Config(**{**_SMALL, **update})


def _bert(**update) -> BertConfig:
  return BertConfig(**{**_SMALL, **update})


def _scaled(params, rules):
  """``params`` with each leaf whose path names end with one of ``rules``' keys times its factor."""

  def one(path, leaf):
    names = path_names(path)
    for suffix, factor in rules.items():
      if names[-len(suffix) :] == suffix:
        return leaf * jnp.float32(factor)
    return leaf

  return jax.tree_util.tree_map_with_path(one, params)


def _logits(config, params, batch):
  from models.zoo import bind

  model = bind(config)(params)
  if isinstance(config, BertConfig):
    return model(
      batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], batch["masked_lm_positions"]
    )
  return (model(batch["input_ids"]),)


@pytest.mark.parametrize("which", ["gpt2", "bert"])
@settings(max_examples=1, deadline=None)
@given(
  seed=st.integers(0, 2**16),
  emb=st.sampled_from([0.5, 2.0, 4.0]),
  width=st.sampled_from([2.0, 4.0]),
  alpha=st.sampled_from([1.0, 2.0, 0.25]),
)
def test_the_mup_forward_is_the_plain_model_with_rescaled_weights(which, seed, emb, width, alpha):
  """With power-of-two factors every rescaling is exact, so the muP model's outputs equal, bit for
  bit, the plain model's with: the embedding tables times ``embeddings_scale`` (GPT: the sum of word
  and position embeddings, before dropout; BERT: before the embedding LayerNorm), the query
  projection times ``alpha / sqrt(d_head)`` (the logits ``alpha q.k / d_head``), and the output
  layers (GPT's LM head; BERT's MLM decoder and bias, NSP classifier) times ``alpha_out / w``."""
  make, head = (_gpt, ("lm_head",)) if which == "gpt2" else (_bert, ("mlm_decoder",))
  out_alpha = 2.0
  mup = make(
    mup_base_hidden_size=64 / width,
    mup_base_filter_size=128 / width,
    embeddings_scale=emb,
    attention_logits_alpha=alpha,
    output_logits_alpha=out_alpha,
  )
  plain = make()
  params = functional(mup)[0](jax.random.key(seed))
  rules = {
    ("word_embeddings", "embedding"): emb,
    ("position_embeddings", "embedding"): emb,
    ("token_type_embeddings", "embedding"): emb,
    ("query", "kernel"): alpha / 4,
    ("query", "bias"): alpha / 4,
    (*head, "kernel"): out_alpha / width,
    ("mlm_bias",): out_alpha / width,
    ("nsp_classifier", "kernel"): out_alpha / width,
    ("nsp_classifier", "bias"): out_alpha / width,
  }
  batch = (
    bert.random_batch(jax.random.key(seed + 1), 2, 16, 64, 3)
    if which == "bert"
    else gpt2.random_batch(jax.random.key(seed + 1), 2, 16, 64)
  )
  with jax.default_matmul_precision("highest"):
    got = _logits(mup, params, batch)
    want = _logits(plain, _scaled(params, rules), batch)
  for a, b in zip(got, want):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("which", ["gpt2", "bert"])
def test_mup_at_the_base_width_without_its_multipliers_is_the_plain_model(which):
  """w = f = 1, logits by sqrt(d_head), alphas and scales 1: the same weights and the same loss."""
  make = _gpt if which == "gpt2" else _bert
  mup = make(mup_base_hidden_size=64, mup_base_filter_size=128, scale_qk_dot_by_d=False)
  plain = make()
  init_a, loss_a = functional(mup)
  init_b, loss_b = functional(plain)
  pa, pb = init_a(jax.random.key(3)), init_b(jax.random.key(3))
  for x, y in zip(jax.tree.leaves(pa), jax.tree.leaves(pb)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  batch = (
    bert.random_batch(jax.random.key(4), 2, 16, 64, 3)
    if which == "bert"
    else gpt2.random_batch(jax.random.key(4), 2, 16, 64)
  )
  assert float(loss_a(pa, batch)) == float(loss_b(pb, batch))


def _factors(config, adjust=None):
  shapes = jax.eval_shape(functional(config)[0], jax.random.key(0))
  multipliers = config.learning_rate_multipliers(adjust)
  tree = multipliers(shapes) if multipliers else jax.tree.map(lambda _: 1.0, shapes)
  return {".".join(path_names(p)): f for p, f in jax.tree_util.tree_leaves_with_path(tree)}


def test_gpt_learning_rate_groups_are_modelzoos_globs():
  """muP: attention kernels (``*decoder*attn*dense*weight``) and the first FFN layer 1/w, the second
  1/f; biases, LayerNorms, embeddings and the LM head 1. The legacy ``decoder_kernel`` covers all
  six kernels of a layer."""
  factors = _factors(_gpt(mup_base_hidden_size=32, mup_base_filter_size=32))  # w = 2, f = 4
  for name, f in factors.items():
    parts = name.split(".")
    if parts[0] == "layers" and parts[-1] == "kernel" and parts[2] in ("attention", "ffn_in"):
      assert f == 0.5, name
    elif parts[0] == "layers" and parts[-1] == "kernel" and parts[2] == "ffn_out":
      assert f == 0.25, name
    else:
      assert f == 1.0, name
  legacy = _factors(_gpt(), {"decoder_kernel": 1 / 3, "embedding": 2.0})
  kernels = [n for n in legacy if n.startswith("layers") and n.endswith("kernel")]
  assert len(kernels) == 2 * 6 and all(legacy[n] == 1 / 3 for n in kernels)
  assert {n for n, f in legacy.items() if f == 2.0} == {
    "word_embeddings.embedding",
    "position_embeddings.embedding",
  }


def test_bert_learning_rate_groups_include_the_pooler():
  factors = _factors(_bert(mup_base_hidden_size=32, mup_base_filter_size=32))
  assert factors["pooler.kernel"] == 0.5 and factors["pooler.bias"] == 1.0
  assert factors["layers.0.ffn_out.kernel"] == 0.25 and factors["layers.1.attention.value.kernel"] == 0.5
  assert factors["mlm_dense.kernel"] == 1.0 and factors["nsp_classifier.kernel"] == 1.0


def test_a_run_applies_the_factors(tmp_path):
  """`wafer.train.run` chains the task's factors after its optimizer: factors of 1 change nothing,
  bit for bit; a factor 0 freezes its parameter (and only it)."""
  from models.mlp import example_run
  from wafer.train import run

  def final(name, multipliers=None, optimizer=None):
    task, rc, opt, scale, policy = example_run(
      str(tmp_path / name), max_steps=3, checkpoint_steps=0, eval_steps=1
    )
    task = dataclasses.replace(task, learning_rate_multipliers=multipliers)
    return task, run(task, rc, optimizer or opt, scale, policy, progress=False)["params"]

  task, plain = final("plain")
  init = task.init_params(jax.random.key(0))
  _, ones = final("ones", lambda t: jax.tree.map(lambda _: 1.0, t))
  for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(ones)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  first = jax.tree_util.tree_leaves_with_path(init)[0][0]

  def freeze_first(tree):
    return jax.tree_util.tree_map_with_path(lambda p, _: 0.0 if p == first else 1.0, tree)

  _, frozen = final("frozen", freeze_first)
  start = dict(jax.tree_util.tree_leaves_with_path(init))
  end = dict(jax.tree_util.tree_leaves_with_path(frozen))
  assert set(start) == set(end) and len(start) > 1
  for path in start:
    same = np.array_equal(np.asarray(end[path]), np.asarray(start[path]))
    assert same == (path == first), jax.tree_util.keystr(path)


def test_configuration_mistakes_are_named():
  with pytest.raises(ValueError, match="muP needs both mup_base_hidden_size and mup_base_filter_size"):
    _gpt(mup_base_hidden_size=32)
  with pytest.raises(ValueError, match="output_logits_scale .* cannot both be set"):
    _gpt(mup_base_hidden_size=32, mup_base_filter_size=64, output_logits_scale=0.5)
  base = DATA / "Release_1.9.1" / "gpt3" / "Cerebras_GPT" / "111m_mup.yaml"
  with pytest.raises(ConfigError) as info:
    load_params(base, ["optimizer.adjust_learning_rate.decoder_kernal=0.5"])
  assert "did you mean 'decoder_kernel'" in str(info.value)
  with pytest.raises(ConfigError, match="different factors: decoder_attention"):
    load_params(base, ["optimizer.adjust_learning_rate.decoder_attention=0.5"])
  with pytest.raises(ConfigError, match="has no learning-rate groups|allowed: none"):
    load_params(
      ROOT / "models" / "fc_mnist" / "configs" / "params_fc_mnist.yaml",
      ["optimizer.adjust_learning_rate.x=0.5"],
    )


def test_one_adamw_step_scales_the_whole_update_decay_included():
  """AdamW (lr 0.1, weight decay 0.5) with a factor 1/2 on the kernel: the kernel moves by
  ``0.5 * 0.1 * (g / (|g| + eps) + 0.5 p)``, its bias by ``0.1 * g / (|g| + eps)`` (no decay on a
  bias). A factor on the gradient instead (Adam would cancel it), or applied twice, fails."""

  import precision
  from wafer.config import build_optimizer
  from wafer.train import Task, make_train_step
  from wafer.train.state import initial_state

  params = {"dense": {"kernel": jnp.array([[1.0, -2.0], [0.5, 3.0]]), "bias": jnp.array([0.25, -0.5])}}
  x = jnp.array([[1.0, 2.0], [-1.0, 0.5]])

  def loss(p, batch):
    return jnp.sum(jnp.tanh(batch @ p["dense"]["kernel"] + p["dense"]["bias"][None, :]))

  def factors(tree):
    return jax.tree_util.tree_map_with_path(
      lambda path, _: 0.5 if path_names(path)[-1] == "kernel" else 1.0, tree
    )

  task = Task("t", lambda key: params, loss, lambda seed: iter([]), 2, learning_rate_multipliers=factors)
  tx, scale = build_optimizer(
    {"optimizer_type": "AdamW", "learning_rate": 0.1, "weight_decay": 0.5, "eps": 1e-6}, half_dtype="float32"
  )
  state = initial_state(task, tx, scale, jax.random.key(0))
  new, _ = jax.jit(make_train_step(task, tx, precision.Policy(compute="float32")))(state, x)
  g = jax.grad(loss)(params, x)["dense"]
  k, b = params["dense"]["kernel"], params["dense"]["bias"]
  want_k = k - 0.5 * 0.1 * (g["kernel"] / (jnp.abs(g["kernel"]) + 1e-6) + 0.5 * k)
  want_b = b - 0.1 * g["bias"] / (jnp.abs(g["bias"]) + 1e-6)
  np.testing.assert_allclose(np.asarray(new.params["dense"]["kernel"]), np.asarray(want_k), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(new.params["dense"]["bias"]), np.asarray(want_b), rtol=1e-5)


@pytest.mark.parametrize("which", ["gpt2", "bert"])
def test_the_built_models_initializers_have_modelzoos_stds(which):
  """The arrays, not only the config: GPT at w = 4, f = 2 (q/k/v and the first FFN layer
  0.02 w^-1/2; attention output 0.02 w^-1/2 (2L)^-1/2; second FFN layer 0.02 f^-1/2 (2L)^-1/2);
  BERT unscaled (0.02 everywhere, as modelzoo's BERT). A truncated normal at 2 std has std
  0.8796 of its parameter."""
  sizes = dict(hidden_size=256, filter_size=1024, num_heads=4, vocab_size=64, max_position_embeddings=32)
  make = _gpt if which == "gpt2" else _bert
  config = make(**sizes, mup_base_hidden_size=64, mup_base_filter_size=512)
  params = functional(config)[0](jax.random.key(7))
  depth = 4**-0.5  # (2 L)^-1/2 with L = 2
  if which == "gpt2":
    want = {
      "attention.query.kernel": 0.02 * 4**-0.5,
      "ffn_in.kernel": 0.02 * 4**-0.5,
      "attention.output.kernel": 0.02 * 4**-0.5 * depth,
      "ffn_out.kernel": 0.02 * 2**-0.5 * depth,
    }
  else:
    want = {
      k: 0.02
      for k in ("attention.query.kernel", "ffn_in.kernel", "attention.output.kernel", "ffn_out.kernel")
    }
  got = {".".join(path_names(p)): np.asarray(v) for p, v in jax.tree_util.tree_leaves_with_path(params)}
  for name, std in want.items():
    leaf = got[f"layers.0.{name}"]
    assert np.std(leaf) == pytest.approx(0.8796 * std, rel=0.03), name


@pytest.mark.parametrize(
  "name, groups",
  [
    ("Release_1.9.1/gpt3/Cerebras_GPT/111m_mup.yaml", {"decoder_kernel": 1 / 3}),
    ("Release_2.4.3/gpt3/Cerebras_GPT/256m_mup.yaml", {"decoder_attention": 0.5}),
    ("Release_2.10.0/bert/bert_large_MSL512_muP.yaml", {"encoder_attention": 0.5, "pooler": 0.5}),
  ],
)
def test_a_real_files_task_carries_its_learning_rate_factors(name, groups):
  from wafer.runner import load_plan

  bases = [] if "1.9.1" in name else ["model.mup_base_hidden_size=32", "model.mup_base_filter_size=128"]
  plan = load_plan(DATA / name, [*SHRUNK, *bases])
  factors = plan.task.learning_rate_multipliers
  assert factors is not None
  shapes = jax.eval_shape(plan.task.init_params, jax.random.key(0))
  tree = {".".join(path_names(p)): f for p, f in jax.tree_util.tree_leaves_with_path(factors(shapes))}
  for group, factor in groups.items():
    module = {
      "decoder_kernel": "ffn_out",
      "decoder_attention": "attention",
      "encoder_attention": "attention",
    }.get(group, group)
    hits = [f for n, f in tree.items() if f".{module}." in f".{n}" and n.endswith("kernel")]
    assert hits and all(f == pytest.approx(factor) for f in hits), (group, hits)
  assert all(f == 1.0 for n, f in tree.items() if not n.endswith("kernel"))


@pytest.mark.slow  # two short runs, about 15 s each
@pytest.mark.parametrize(
  "name", ["Release_1.9.1/gpt3/Cerebras_GPT/111m_mup.yaml", "Release_2.10.0/bert/bert_large_MSL512_muP.yaml"]
)
def test_a_shrunk_real_mup_file_trains(name, tmp_path):
  from wafer import runner

  bases = [] if "1.9.1" in name else ["model.mup_base_hidden_size=32", "model.mup_base_filter_size=128"]
  summary = runner.run_params(
    DATA / name,
    [
      *SHRUNK,
      *bases,
      f"runconfig.model_dir={tmp_path}",
      "runconfig.max_steps=3",
      "runconfig.checkpoint_steps=0",
      "runconfig.eval_steps=1",
    ],
  )
  assert summary["final_step"] == 3 and summary["losses"]
  assert all(math.isfinite(loss) for _, loss in summary["losses"])


@pytest.mark.slow  # two short runs
def test_a_run_resumes_after_its_learning_rate_factors_change(tmp_path):
  """The factors live in the train step, not the optimizer state: a checkpoint of a muP run resumes
  with other factors (here all 1), and the note names the changed settings."""
  from wafer import runner

  name = DATA / "Release_2.4.3/gpt3/Cerebras_GPT/256m_mup.yaml"
  common = [
    *SHRUNK,
    "model.mup_base_hidden_size=32",
    "model.mup_base_filter_size=128",
    f"runconfig.model_dir={tmp_path}",
    "runconfig.checkpoint_steps=2",
    "runconfig.eval_steps=1",
  ]
  assert runner.run_params(name, [*common, "runconfig.max_steps=2"])["final_step"] == 2
  ones = [
    f"optimizer.adjust_learning_rate.{g}=1.0"
    for g in ("decoder_attention", "decoder_input_ffn", "decoder_output_ffn")
  ]
  resumed = runner.run_params(name, [*common, *ones, "runconfig.max_steps=4"])
  assert resumed["final_step"] == 4 and [step for step, _ in resumed["losses"]] == [3, 4]
