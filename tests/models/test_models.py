"""Reference models: every params YAML parses, parameter counts, autocast runs, training steps.

Big models are only ever built abstractly (`nnx.eval_shape`); anything that runs uses tiny
configs.
"""

from __future__ import annotations

import copy
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import yaml
from flax import nnx

import models
import precision
from models import bert, gpt2
from models.fc_mnist import FCMnistConfig
from wafer.config import ConfigError, load_params

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "models").glob("*/configs/*.yaml"))
CONFIG_DIR = {name: ROOT / "models" / name / "configs" for name in ("bert", "gpt2", "fc_mnist")}


def _config(model: str, file: str) -> pathlib.Path:
  return CONFIG_DIR[model] / file


# ---- every YAML parses, into the model's strict schema ----


def test_configs_exist():
  names = {p.name for p in CONFIGS}
  expected = {
    "params_fc_mnist.yaml",
    "params_bert_tiny.yaml",
    "params_bert_base_MSL128.yaml",
    "params_bert_base_MSL512.yaml",
    "params_bert_large_MSL128.yaml",
    "params_bert_large_MSL512.yaml",
    "params_gpt2_small.yaml",
    "params_gpt2_tiny.yaml",
    "params_gpt3_111m.yaml",
    "params_gpt3_xl.yaml",
  }
  assert expected <= names, expected - names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_yaml_parses_into_a_registered_schema(path):
  params = load_params(path)
  from models.mlp import MlpConfig

  assert type(params.model) in (bert.BertConfig, gpt2.GPT2Config, FCMnistConfig, MlpConfig), type(
    params.model
  )
  assert not params.model.model_extra  # closed schema: nothing left over
  params.policy()  # the precision keys form a valid policy


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_misspelled_model_key_is_an_error(path):
  data = yaml.safe_load(path.read_text())
  data["model"]["num_hiden_layers"] = 3
  with pytest.raises(ConfigError, match="num_hiden_layers"):
    load_params(data)


def test_wrong_model_value_is_an_error():
  data = yaml.safe_load(_config("bert", "params_bert_tiny.yaml").read_text())
  bad = copy.deepcopy(data)
  bad["model"]["encoder_nonlinearity"] = "gelu_fast"
  with pytest.raises(ConfigError, match="encoder_nonlinearity"):
    load_params(bad)


@pytest.mark.parametrize(
  "path", [p for p in CONFIGS if p.parent.parent.name in ("bert", "gpt2")], ids=lambda p: p.name
)
def test_num_heads_that_does_not_divide_hidden_size_is_a_config_error_naming_the_override(path):
  """It was a bare ValueError traceback from the attention layer, at --validate_only's trace."""
  hidden = load_params(path).model.hidden_size
  heads = next(n for n in range(2, hidden) if hidden % n)
  with pytest.raises(ConfigError) as info:
    load_params(path, [f"model.num_heads={heads}"])
  text = str(info.value)
  assert (
    f"model.num_heads (from override 'model.num_heads={heads}'): num_heads={heads} does not divide " in text
  )
  assert f"hidden_size={hidden}" in text and "num_heads that fit: 1, 2" in text
  assert load_params(path, [f"model.num_heads={hidden}"]).model.num_heads == hidden  # a divisor is fine


@pytest.mark.parametrize(
  "override, message",
  [
    ("model.hidden_size=0", "model.hidden_size (from override 'model.hidden_size=0'): must be greater than or "
     "equal to 1 (got 0)"),
    ("model.hidden_size=-3", "model.hidden_size (from override 'model.hidden_size=-3'): must be greater than or "
     "equal to 1 (got -3)"),
    ("model.hidden_size=[5,0]", "entry 1 is 0; every entry must be greater than or equal to 1"),
    ("model.hidden_size=1.5", "must be a positive integer, or a list of them (one width per hidden layer) (got 1.5)"),
    ("model.hidden_size=[]", "must have at least 1 item(s)"),
    ("model.hidden_size=[5,5,5]", "model.hidden_size (from override 'model.hidden_size=[5,5,5]'): has 3 entries, "
     "depth is 2: give one width per hidden layer (2), or one number for all, or set model.depth=3"),
    ("model.depth=0", "model.depth (from override 'model.depth=0'): must be greater than or equal to 1 (got 0)"),
    ("model.input_size=0", "model.input_size (from override 'model.input_size=0'): must be greater than or equal to 1"),
    ("model.num_classes=1", "model.num_classes (from override 'model.num_classes=1'): must be greater than or equal"),
    ("model.dropout=1.0", "model.dropout (from override 'model.dropout=1.0'): must be less than 1 (got 1.0)"),
    ("model.dropout=-0.1", "model.dropout (from override 'model.dropout=-0.1'): must be greater than or equal to 0"),
  ],
)  # fmt: skip
def test_fc_mnist_sizes_out_of_range_are_config_errors(override, message):
  """hidden_size=0 was a bare ZeroDivisionError at --validate_only's trace, -3 a negative-shape TypeError."""
  path = _config("fc_mnist", "params_fc_mnist.yaml")
  with pytest.raises(ConfigError) as info:
    load_params(path, ["model.depth=2", override])
  assert message in str(info.value)
  assert "\n" not in str(info.value)  # one problem, one line
  assert load_params(path, ["model.depth=2", "model.hidden_size=[3,4]"]).model.hidden_sizes() == [3, 4]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_size_of_every_model_schema_refuses_zero(path):
  """Each integer size of a model schema (bert, gpt2, fc_mnist; the MLP has none) refuses 0 with a config error."""
  model = load_params(path).model
  sizes = [
    k
    for k, f in type(model).model_fields.items()
    if k.endswith(("_size", "_layers", "_heads", "_embeddings", "depth", "num_classes", "num_segments"))
    and "mup_base" not in k
  ]
  assert sizes or type(model).__name__ == "MlpConfig"
  for key in sizes:
    with pytest.raises(ConfigError, match=rf"model\.{key} \(from override 'model\.{key}=0'\): must be"):
      load_params(path, [f"model.{key}=0"])


# ---- parameter counts against the published ones (abstract shapes, nothing allocated) ----

# (file, published count, relative tolerance, why the tolerance)
PUBLISHED = [
  ("bert", "params_bert_base_MSL128.yaml", 110e6, 0.01, "BERT paper's 110M is rounded"),
  ("bert", "params_bert_base_MSL512.yaml", 110e6, 0.01, "same shapes as MSL128"),
  ("bert", "params_bert_large_MSL128.yaml", 340e6, 0.02, "paper's 340M; HF BertForPreTraining has 336.2M"),
  ("bert", "params_bert_large_MSL512.yaml", 340e6, 0.02, "same shapes as MSL128"),
  ("gpt2", "params_gpt2_small.yaml", 124.4e6, 0.01, "modelzoo uses 2048 positions, +0.79M over GPT-2's 1024"),
  ("gpt2", "params_gpt3_111m.yaml", 111e6, 0.005, "Cerebras-GPT 111M"),
  ("gpt2", "params_gpt3_xl.yaml", 1.3e9, 0.02, "Cerebras-GPT 1.3B (1.316B exactly)"),
]


_COUNTS: dict[str, int] = {}
_LOSS_KEYS = {
  "mlm_loss_weight",
  "mlm_loss_scaling",
  "loss_scaling",
  "loss_weight",
  "fp16_type",
  "mixed_precision",
}


def _count(config) -> int:
  """Abstract parameter count, cached across configs with the same shapes (MSL128 vs MSL512)."""
  key = config.model_dump_json(exclude=_LOSS_KEYS)
  if key not in _COUNTS:
    _COUNTS[key] = models.parameter_count(models.abstract_model(config))
  return _COUNTS[key]


@pytest.mark.parametrize(
  "model, file, published, rtol, why",
  [  # the 340M and 1.3B models take about 4 s each to build abstractly: slow
    pytest.param(*p, id=p[1], marks=pytest.mark.slow if ("large" in p[1] or "xl" in p[1]) else ())
    for p in PUBLISHED
  ],
)
def test_parameter_count_matches_published(model, file, published, rtol, why):
  params = load_params(_config(model, file))
  count = _count(params.model)
  assert abs(count - published) <= rtol * published, (count, published, why)


def test_exact_counts():
  """Pinned against well-known exact totals (GPT-2 small with 1024 positions: 124,439,808)."""
  small = gpt2.GPT2Config(max_position_embeddings=1024)
  assert models.parameter_count(models.abstract_model(small)) == 124_439_808
  # BERT-base with MLM (tied decoder + bias) and NSP heads, as HF's BertForPreTraining.
  assert _count(bert.BertConfig(max_position_embeddings=512, layer_norm_epsilon=1.0e-5)) == 110_106_428
  untied = bert.BertConfig(share_embedding_weights=False)
  assert models.parameter_count(models.abstract_model(untied)) == 110_106_428 + 30522 * 768


# ---- tiny configs run ----

TINY_OVERRIDES = {
  "bert": ["model.vocab_size=512", "model.max_position_embeddings=64"],
  "gpt2": ["model.vocab_size=512", "model.max_position_embeddings=64"],
  "fc_mnist": ["model.depth=3", "model.hidden_size=32"],
}
TINY = {
  "bert": ("params_bert_tiny.yaml", 4, 32),
  "gpt2": ("params_gpt2_tiny.yaml", 4, 32),
  "fc_mnist": ("params_fc_mnist.yaml", 8, None),
}


def _tiny(name: str):
  file, batch_size, seq = TINY[name]
  params = load_params(_config(name, file), TINY_OVERRIDES[name])
  c = params.model
  key = jax.random.key(7)
  if name == "bert":
    batch = bert.random_batch(key, batch_size, seq, c.vocab_size, 5)
  elif name == "gpt2":
    batch = gpt2.random_batch(key, batch_size, seq, c.vocab_size)
  else:
    batch = {
      "images": jax.random.uniform(key, (batch_size, 784), jnp.float32),
      "labels": jax.random.randint(jax.random.key(8), (batch_size,), 0, 10, jnp.int32),
    }
  return params, batch


def _split(params, train: bool):
  model = models.build_model(params.model, rngs=nnx.Rngs(params.runconfig.seed or 0))
  model.train() if train else model.eval()
  graphdef, weights, rest = nnx.split(model, nnx.Param, ...)
  loss = models.loss_function(params.model)

  def loss_fn(weights, rest, batch):
    return loss(nnx.merge(graphdef, weights, rest), batch)

  return loss_fn, weights, rest


@pytest.mark.parametrize(  # BERT (9 s) under -m slow; it trains under autocast in test_a_few_training_steps_lower_the_loss
  "name", [pytest.param(n, marks=pytest.mark.slow) if n == "bert" else n for n in sorted(TINY)]
)
def test_tiny_forward_and_grad_under_cbfloat16_autocast(name):
  params, batch = _tiny(name)
  # Eval mode: dropout's RNG ops would triple the autocast trace time (see test_dropout_*).
  loss_fn, weights, rest = _split(params, train=False)
  policy = precision.Policy(compute="cbfloat16")
  value, grads = jax.jit(jax.value_and_grad(precision.autocast(loss_fn, policy)))(weights, rest, batch)
  ref = jax.jit(loss_fn)(weights, rest, batch)
  assert np.isfinite(float(value)) and float(value) > 0
  assert abs(float(value) - float(ref)) <= 0.05 * float(ref)  # cbfloat16 tracks float32 at init
  leaves = jax.tree.leaves(grads)
  assert all(g.dtype == jnp.float32 for g in leaves)
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in leaves)
  assert sum(float(jnp.sum(jnp.abs(g))) for g in leaves) > 0


@pytest.mark.parametrize("name", sorted(TINY))
def test_a_few_training_steps_lower_the_loss(name):
  params, batch = _tiny(name)
  loss_fn, weights, rest = _split(params, train=False)
  loss_fn = precision.autocast(loss_fn, params.policy())
  optimizer = optax.adam(3e-3)
  state = optimizer.init(weights)

  @jax.jit
  def step(weights, state):
    value, grads = jax.value_and_grad(loss_fn)(weights, rest, batch)
    with jax.numpy_dtype_promotion("standard"):  # optax's bias correction mixes int32 and float
      updates, state = optimizer.update(grads, state, weights)
    return optax.apply_updates(weights, updates), state, value

  losses = []
  for _ in range(8):
    weights, state, value = step(weights, state)
    losses.append(float(value))
  assert all(np.isfinite(losses))
  assert losses[-1] < 0.9 * losses[0], losses


# ---- model structure ----


def _tiny_model(name: str, **kw):
  params, batch = _tiny(name)
  config = params.model.model_copy(update=kw)
  model = models.build_model(config, rngs=nnx.Rngs(0))
  model.eval()
  return model, batch


def test_gpt2_is_causal():
  model, batch = _tiny_model("gpt2")
  ids = batch["input_ids"]
  changed = ids.at[:, 20].set((ids[:, 20] + 1) % 512)
  a, b = model(ids), model(changed)
  np.testing.assert_array_equal(a[:, :20], b[:, :20])
  assert not np.allclose(a[:, 20:], b[:, 20:])


def test_bert_attention_mask_hides_padding():
  model, batch = _tiny_model("bert")
  ids, types = batch["input_ids"], batch["token_type_ids"]
  mask = jnp.ones_like(ids).at[:, 24:].set(0)
  changed = ids.at[:, 24:].set((ids[:, 24:] + 1) % 512)
  a, b = model.encode(ids, types, mask), model.encode(changed, types, mask)
  np.testing.assert_allclose(a[:, :24], b[:, :24], rtol=1e-5, atol=1e-5)
  assert not np.allclose(model.encode(ids, types, None)[:, :24], model.encode(changed, types, None)[:, :24])


def test_bert_layer_is_post_ln():
  """``h = LN(x + Attn(x))``, ``out = LN(h + FFN(h))`` (the original BERT), not pre-LN."""
  model, _ = _tiny_model("bert")
  layer = model.layers[0]
  x = jax.random.normal(jax.random.key(3), (2, 8, 128), jnp.float32)
  h = layer.attention_norm(x + layer.attention(x, None))
  expected = layer.ffn_norm(h + layer.ffn_out(jax.nn.gelu(layer.ffn_in(h), approximate=False)))
  np.testing.assert_allclose(layer(x, None), expected, rtol=1e-5, atol=1e-5)


def test_gpt2_block_is_pre_ln():
  model, _ = _tiny_model("gpt2")
  block = model.layers[0]
  x = jax.random.normal(jax.random.key(3), (2, 8, 128), jnp.float32)
  mask = jnp.broadcast_to(jnp.tril(jnp.ones((8, 8), jnp.bool_))[None], (2, 8, 8))
  h = x + block.attention(block.attention_norm(x), mask)
  expected = h + block.ffn_out(jax.nn.gelu(block.ffn_in(block.ffn_norm(h)), approximate=False))
  np.testing.assert_allclose(block(x, mask), expected, rtol=1e-5, atol=1e-5)


def test_bert_is_post_ln_and_heads_are_tied():
  model, batch = _tiny_model("bert")
  hidden = model.encode(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
  # Post-LN: the encoder output is a LayerNorm output (zero mean, unit variance per token, as
  # LayerNorm's scale and bias are 1 and 0 at init).
  np.testing.assert_allclose(jnp.mean(hidden, axis=-1), 0.0, atol=1e-4)
  np.testing.assert_allclose(jnp.var(hidden, axis=-1), 1.0, rtol=1e-2)
  assert model.mlm_decoder is None  # the decoder is the word embedding matrix
  ids, types, mask = batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]
  mlm, nsp = model(ids, types, mask, batch["masked_lm_positions"])
  assert mlm.shape == (4, 5, 512) and nsp is not None and nsp.shape == (4, 2)
  no_nsp, _ = _tiny_model("bert", disable_nsp=True)
  assert no_nsp(batch["input_ids"])[1] is None


def test_bert_mlm_loss_counts_only_masked_positions():
  model, batch = _tiny_model("bert", disable_nsp=True)
  loss = models.loss_function(bert.BertConfig(mlm_loss_scaling="num_masked"))
  full = loss(model, batch)
  weights = batch["masked_lm_mask"].at[:, 3:].set(0.0)
  other_labels = batch["labels"].at[:, 3:].set(0)
  a = loss(model, {**batch, "masked_lm_mask": weights})
  b = loss(model, {**batch, "masked_lm_mask": weights, "labels": other_labels})
  assert float(a) == pytest.approx(float(b), rel=1e-6)
  assert float(a) != pytest.approx(float(full), rel=1e-6)


def test_dropout_only_in_train_mode():
  params, batch = _tiny("bert")
  model = models.build_model(params.model, rngs=nnx.Rngs(0))
  model.eval()
  a, b = model(batch["input_ids"])[0], model(batch["input_ids"])[0]
  np.testing.assert_array_equal(a, b)
  model.train()
  assert not np.allclose(model(batch["input_ids"])[0], a)


# ---- attention_softmax_fp32 and the precision level (docs/references.md, "Precision optimisation levels") ----


@pytest.mark.parametrize(
  "level, fp16_type, softmax_fp32, rule",
  [
    (0, "cbfloat16", None, "float32"),
    (1, "cbfloat16", None, "round"),  # forced off at POL 1 with cbfloat16
    (1, "cbfloat16", True, "round"),
    (1, "bfloat16", None, "float32"),  # default True
    (1, "bfloat16", False, "round"),
    (2, "bfloat16", True, "round"),  # forced off at POL 2
  ],
)
def test_attention_softmax_fp32_maps_to_the_policy(level, fp16_type, softmax_fp32, rule):
  overrides = [f"runconfig.precision_opt_level={level}", f"model.fp16_type={fp16_type}"]
  if softmax_fp32 is not None:
    overrides.append(f"model.attention_softmax_fp32={str(softmax_fp32).lower()}")
  params = load_params(_config("bert", "params_bert_tiny.yaml"), overrides)
  assert params.policy().rule("attention_softmax") == rule


def test_functional_form_for_the_executor():
  """``(init_params, loss_fn)`` as `wafer.train.Task` wants them: pure, keyed, float32 params."""
  params, batch = _tiny("gpt2")
  init_params, loss_fn = models.functional(params.model)
  a, b = init_params(jax.random.key(0)), init_params(jax.random.key(1))
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(a))
  assert sum(x.size for x in jax.tree.leaves(a)) == _count(params.model)
  la, lb = jax.jit(loss_fn)(a, batch), jax.jit(loss_fn)(b, batch)
  assert np.isfinite(float(la)) and float(la) != float(lb)
  assert float(jax.jit(loss_fn)(a, batch)) == float(la)  # deterministic: dropout off


@pytest.mark.slow  # over 7 s on the 2-core CI machine; runs in the slow stage
def test_dropout_follows_the_batch_key():
  """models.functional: a ``dropout_key`` in the batch turns dropout on (train mode), reproducibly."""
  import models
  from models.bert import random_batch
  from wafer.config import load_params

  path = ROOT / "models" / "bert" / "configs" / "params_bert_tiny_default.yaml"
  on = load_params(path)
  off = load_params(path, ["model.dropout_rate=0.0", "model.attention_dropout_rate=0.0"])
  init, loss = models.functional(on.model)
  _, loss_off = models.functional(off.model)
  params = init(jax.random.key(0))
  batch = random_batch(jax.random.key(1), 4, 32, on.model.vocab_size, 5)
  key = np.tile(np.array([7, 9], np.uint32), (4, 1))
  other = np.tile(np.array([7, 10], np.uint32), (4, 1))
  plain = float(loss(params, batch))
  dropped = float(jax.jit(loss)(params, {**batch, "dropout_key": key}))
  assert dropped != plain and dropped == float(loss(params, {**batch, "dropout_key": key}))
  assert float(loss(params, {**batch, "dropout_key": other})) != dropped
  assert float(loss_off(params, {**batch, "dropout_key": key})) == float(loss_off(params, batch)) == plain
  grads = jax.grad(loss)(params, {**batch, "dropout_key": key})
  assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_sequences_longer_than_the_position_table_are_refused(name):
  """The position lookup read past the table: the loss was NaN, with no error (under jit)."""
  params, batch = _tiny(name)
  limit = params.model.max_position_embeddings
  model = models.build_model(params.model, rngs=nnx.Rngs(0))
  too_long = jnp.zeros((2, limit + 1), jnp.int32)
  with pytest.raises(
    ValueError, match=f"{limit + 1} tokens per sequence, more than model.max_position_embeddings={limit}"
  ):
    jax.jit(lambda ids: model(ids))(too_long)
  out = jax.tree.leaves(model(jnp.zeros((2, limit), jnp.int32)))  # the whole table is usable
  assert all(bool(jnp.all(jnp.isfinite(x))) for x in out)


def test_roberta_position_rows_shift_by_one_and_padding_takes_row_zero():
  """modelzoo 2.x RoBERTa's mask_padding_in_positional_embed: one more position row; the tokens of a
  sequence read rows 1..seq and its padding ([PAD], id 0) row 0. The same model with its table
  shifted by one row is the plain model on unpadded sequences."""
  model, batch = _tiny_model("bert", disable_nsp=True, mask_padding_in_positional_embed=True)
  plain, _ = _tiny_model("bert", disable_nsp=True)
  table = model.position_embeddings.embedding
  assert table.shape[0] == plain.position_embeddings.embedding.shape[0] + 1
  plain.position_embeddings.embedding[...] = table[...][1:]
  ids, types = batch["input_ids"], batch["token_type_ids"]
  ids = jnp.where(ids == 0, 5, ids)  # no padding
  np.testing.assert_array_equal(model.encode(ids, types, None), plain.encode(ids, types, None))
  padded = ids.at[:, -4:].set(0)
  mask = (padded != 0).astype(jnp.int32)
  row0 = model.encode(padded, types, mask)
  table[...] = table[...].at[0].add(1.0)
  changed = model.encode(padded, types, mask)
  np.testing.assert_array_equal(row0[:, :-4], changed[:, :-4])  # tokens never read row 0
  assert not np.array_equal(np.asarray(row0[:, -4:]), np.asarray(changed[:, -4:]))  # the padding does


@pytest.mark.parametrize(("train", "evaluate"), [(16, 8), (16, 64), (32, None)])
def test_the_example_mlp_evaluates_at_eval_input_batch_size(train, evaluate):
  """``eval_input.batch_size`` sets the example's eval batches (it used the training batch size)."""
  from models.mlp import CONFIG, build_task
  from wafer.config import load_params

  overrides = [f"train_input.batch_size={train}", "runconfig.eval_steps=2"]
  overrides.append(f"eval_input.batch_size={evaluate}" if evaluate else "eval_input=null")
  task = build_task(load_params(CONFIG, overrides))
  batches = list(task.eval_data())
  assert len(batches) == 2 and all(b["x"].shape[0] == (evaluate or train) for b in batches)
  assert task.batch_size == train
