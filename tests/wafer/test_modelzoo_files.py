"""Real Cerebras Model Zoo params files (tests/data/modelzoo, copied unchanged): each validates at the
config level, or is refused in one message naming a feature wafer lacks; the loader's inferences,
ignored keys and translations hold as invariants."""

from __future__ import annotations

import json
import pathlib

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wafer import registry
from wafer.config import ConfigError, load_params
from wafer.config.modelzoo import IGNORED

DATA = pathlib.Path(__file__).parents[1] / "data" / "modelzoo"
MANIFEST = json.loads((DATA / "manifest.json").read_text())

_TF = "TensorFlow"
REFUSED = {
  "R_1.6.0/fc_mnist_tf/params.yaml": _TF,
  "R_1.6.0/tf/params_bert_base_msl128.yaml": _TF,
  "R_1.6.0/tf/params_gpt3_xl_ws.yaml": _TF,
}
"""The files wafer refuses, and why; every other file of the manifest must validate."""
EXPECTED = {e["file"]: REFUSED.get(e["file"], "ok") for e in MANIFEST}
HALF = {
  "R_1.6.0": "float16",
  "Release_1.8.0": "float16",
  "Release_2.4.3": "bfloat16",
  "Release_2.10.0": "bfloat16",
}
"""The half type each release used when a file gives no fp16_type (docs/guides/modelzoo-params.md)."""


def outcome(path: pathlib.Path, overrides: tuple[str, ...] = ()) -> str:
  """ "ok" when the file validates at the config level (loads, names a registered model, and its input
  sections name processors of that model), else the error's text."""
  try:
    params = load_params(path, list(overrides))
  except ConfigError as error:
    return str(error)
  spec = registry.get_spec(params.model.name)
  for section in (params.train_input, params.eval_input):
    if section is not None and section.data_processor not in spec.data_processors:
      return f"{section.data_processor} does not feed {params.model.name}"
  return "ok"


def test_the_table_covers_every_file_and_both_outcomes():
  assert len(EXPECTED) >= 45 and set(REFUSED) <= set(EXPECTED)
  assert sum(v == "ok" for v in EXPECTED.values()) >= 45
  for entry in MANIFEST:
    assert (DATA / entry["file"]).is_file()
    assert entry["url"] == f"https://github.com/Cerebras/modelzoo/blob/{entry['tag']}/{entry['path']}"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_real_file_validates_or_is_refused_for_a_missing_feature(name):
  got = outcome(DATA / name)
  expected = EXPECTED[name]
  if expected == "ok":
    assert got == "ok", got
    params = load_params(DATA / name)
    tag = name.split("/")[0]
    if tag in HALF and (
      tag.startswith(("R_1", "Release_1")) or "trainer:" in (DATA / name).read_text()
    ):  # a 1.x file without 1.x-only keys is "legacy layout (<= 2.3)": float16 all the same
      assert params.release.half_dtype == HALF[tag], params.release
    assert params.notes and params.notes[-1].startswith("note: Model Zoo release")
    # Release_1.8.0's GPT-3 20B repeats a key; PyYAML (modelzoo's reader) keeps the last
    if name == "Release_1.8.0/gpt3/params_gpt3_20b.yaml":
      assert any(
        "'optimizer.learning_rate[1].steps' is given twice (lines 104 and 105)" in note
        for note in params.notes
      ), params.notes
    return
  assert expected in got, got
  assert got.count("features wafer does not have") == 1, got  # one message names every such key


def _model_section(data: dict) -> dict:
  return data["trainer"]["init"]["model"] if "trainer" in data else data["model"]


NAMED = [
  n
  for n, e in sorted(EXPECTED.items())
  if e == "ok" and "name" in _model_section(yaml.safe_load((DATA / n).read_text()))
]
"""The files that name their model (the others are inferred: the test above)."""


@pytest.mark.parametrize("name", NAMED)
def test_removing_model_name_infers_the_same_model(name, tmp_path):
  path = DATA / name
  text = path.read_text()
  data = yaml.safe_load(text)
  model = _model_section(data)
  named = load_params(path).model.name
  del model["name"]
  copy = tmp_path / path.name  # the file name kept: the path is one of the clues
  copy.write_text(yaml.safe_dump(data))
  params = load_params(copy)
  assert registry.get_spec(params.model.name) is registry.get_spec(named)  # gpt2 and gpt3 are one model
  assert any("model.name is missing" in n for n in params.notes)


BASE = DATA / "Release_2.3.1" / "bert" / "bert_base_MSL128.yaml"
_IGNORABLE = sorted((s, k) for s, k in IGNORED if s in ("runconfig", "model", "input", "optimizer"))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys=st.lists(st.sampled_from(_IGNORABLE), min_size=1, max_size=3, unique=True), value=st.booleans())
def test_an_ignorable_key_changes_nothing_but_the_notes(keys, value):
  before = load_params(BASE)
  overrides = [f"{'train_input' if s == 'input' else s}.{k}={str(value).lower()}" for s, k in keys]
  after = load_params(BASE, overrides)
  assert after.model_dump() == before.model_dump()
  note = next(n for n in after.notes if n.startswith("note: ignored"))
  for s, k in keys:
    assert f"{'train_input' if s == 'input' else s}.{k} (" in note
  assert len([n for n in after.notes if n.startswith("note: ignored")]) == 1


@settings(max_examples=6, deadline=None)
@given(n=st.integers(1, 4), m=st.integers(0, 4))
def test_independent_bad_keys_are_all_reported_and_features_in_one_problem(n, m):
  bad = [f"runconfig.no_such_key_{i}=1" for i in range(n)]
  tf_keys = [
    "runconfig.tf_random_seed=1",
    "runconfig.save_checkpoints_steps=10",
    "model.use_vsl=true",
    "train_input.num_parallel_calls=4",
  ]
  tf = tf_keys[:m]
  with pytest.raises(ConfigError) as info:
    load_params(BASE, bad + tf)
  problems = info.value.problems
  assert sum("no_such_key" in p.path for p in problems) == (0 if tf else n)  # a TF file: the refusal is all
  feature = [p for p in problems if "features wafer does not have" in p.message]
  assert len(feature) == (1 if tf else 0)
  for text in tf:
    assert text.split("=")[0] in feature[0].message


def test_use_position_embedding_false_is_refused_true_is_dropped():
  path = DATA / "R_1.6.0" / "gpt2" / "params_gpt2_small.yaml"
  assert "use_position_embedding: True dropped" in " ".join(load_params(path).notes)
  with pytest.raises(ConfigError, match=r"model.use_position_embedding .*: must be True"):
    load_params(path, ["model.use_position_embedding=false"])


def test_dynamic_mlm_scale_translates_and_half_type_follows_the_release():
  params = load_params(DATA / "R_1.6.0" / "bert" / "bert_base_msl128.yaml")
  assert params.model.mlm_loss_scaling == "num_masked"
  assert params.policy().compute.name == "float16"  # 1.x: use_bfloat16 defaults to False
  assert "half type float16" in params.notes[-1] and "loss scaling dynamic" in params.notes[-1]
  trainer = load_params(DATA / "Release_2.10.0" / "fc_mnist" / "params_cszoov2.yaml")
  assert trainer.release.half_dtype == "bfloat16" and trainer.policy().compute.name == "bfloat16"
  given = load_params(DATA / "R_1.6.0" / "bert" / "bert_base_msl128.yaml", ["runconfig.modelzoo_release=2.4"])
  assert given.policy().compute.name == "bfloat16"
  # a release that does not exist picked 1.x/2.0 defaults without a word, and a later estimate blamed --release
  for bad in ("banana", "3.0"):
    with pytest.raises(
      ConfigError, match=r"runconfig.modelzoo_release \(from override .*\): .*allowed: '2.x'"
    ):
      load_params(DATA / "R_1.6.0" / "bert" / "bert_base_msl128.yaml", [f"runconfig.modelzoo_release={bad}"])


def test_a_model_that_cannot_be_inferred_says_what_would_decide_it(tmp_path):
  data = yaml.safe_load((DATA / "Release_2.3.1" / "gpt2" / "params_gpt2_small.yaml").read_text())
  for section in ("train_input", "eval_input"):
    data[section].pop("data_processor")
  data["model"]["num_segments"] = 2  # a BERT key among GPT keys: no single model takes them all
  path = tmp_path / "params.yaml"
  path.write_text(yaml.safe_dump(data))
  with pytest.raises(ConfigError, match="model.name: is missing, and it could not be inferred") as info:
    load_params(path)
  assert "set model.name to one of" in str(info.value)


def _tiny(tmp_path: pathlib.Path, extra: tuple[str, ...] = ()) -> list[str]:
  return [
    f"runconfig.model_dir={tmp_path}",
    "runconfig.max_steps=6",
    "runconfig.log_steps=1",
    "runconfig.checkpoint_steps=0",
    "train_input.data_dir=null",
    "train_input.batch_size=4",
    "train_input.num_workers=0",
    "train_input.max_sequence_length=32",
    "model.hidden_size=32",
    "model.num_hidden_layers=1",
    "model.num_heads=2",
    "model.filter_size=64",
    "model.vocab_size=512",
    "model.max_position_embeddings=32",
    *extra,
  ]


@pytest.mark.slow
def test_a_fixed_up_1x_bert_file_runs_in_float16_with_dynamic_loss_scaling(tmp_path):
  from wafer import runner

  path = DATA / "R_1.6.0" / "bert" / "bert_base_msl128.yaml"
  overrides = _tiny(
    tmp_path,
    (
      "train_input.max_predictions_per_seq=null",
      "train_input.prefetch_factor=null",
      "train_input.persistent_workers=false",
      "eval_input=null",
      "runconfig.mode=train",
    ),
  )
  plan = runner.load_plan(path, overrides)
  assert plan.policy.compute.name == "float16"
  runner.run_plan(plan, progress=False)
  records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  scales = [r["loss_scale"] for r in records if "loss_scale" in r]
  assert scales and all(s != 1.0 for s in scales)  # dynamic: 2^15 start for float16, not the static 1.0


@pytest.mark.slow
def test_a_fixed_up_trainer_layout_file_runs_in_bfloat16(tmp_path):
  from wafer import runner

  path = DATA / "Release_2.10.0" / "gpt3" / "Cerebras_GPT" / "111m.yaml"
  overrides = [
    o.replace("train_input.", "trainer.fit.train_dataloader.").replace(
      "runconfig.model_dir", "trainer.init.model_dir"
    )
    for o in _tiny(tmp_path)
    if not o.startswith(("runconfig.", "model.", "train_input.num_workers"))
  ] + [
    f"trainer.init.model_dir={tmp_path}",
    "trainer.init.loop.max_steps=3",
    "trainer.init.checkpoint.steps=0",
    "trainer.fit.val_dataloader=null",
    "trainer.init.loop.eval_frequency=null",
    "trainer.init.loop.eval_steps=null",
  ]
  overrides += [
    f"trainer.init.model.{k}"
    for k in (
      "hidden_size=32",
      "num_hidden_layers=1",
      "num_heads=2",
      "filter_size=64",
      "vocab_size=512",
      "max_position_embeddings=32",
    )
  ]
  plan = runner.load_plan(path, overrides)
  assert plan.policy.compute.name == "bfloat16"
  summary = runner.run_plan(plan, progress=False)
  assert summary.losses


@pytest.mark.parametrize(
  "name",
  [
    "Release_2.3.1/gpt2/params_gpt2_small.yaml",  # ~3 s: its 12 layers are one scan
    # MSL 10256: fits by recomputing each layer (it once "did not fit" at micro-batch 1: the padding
    # mask, broadcast to every head, was counted at h s^2 per layer boundary)
    pytest.param("Release_1.9.1/bert/bert_large_MSL10k_preview.yaml", marks=pytest.mark.slow),  # ~9 s
    "Release_2.10.0/fc_mnist/params.yaml",
    "R_1.6.0/fc_mnist/params.yaml",
  ],
)
def test_cli_validate_only_accepts_real_files(name, tmp_path, capsys):
  from wafer import cli

  assert cli.main(["run", "--params", str(DATA / name), "--validate_only", "--model_dir", str(tmp_path)]) == 0
  out = capsys.readouterr().out
  assert out.startswith("note:") and "Validation completed successfully" in out
  report = json.loads((tmp_path / "compile_report.json").read_text())
  assert report["fits"] and report["samples_per_sec"] > 0 and report["micro_batch_size"] >= 1


@settings(max_examples=30, deadline=None)
@given(
  major=st.integers(1, 2),
  minor=st.integers(0, 12),
  model=st.sampled_from(["bert", "gpt2", "gpt3", "fc_mnist"]),
)
def test_the_half_type_default_follows_the_given_release(major, minor, model):
  from wafer.config.modelzoo import release_of

  release = release_of(
    {"runconfig": {"modelzoo_release": f"{major}.{minor}"}}, trainer_layout=False, model=model
  )
  if (major, minor) >= (2, 4):
    expected = "bfloat16"  # the Trainer's MixedPrecision callback
  elif (major, minor) <= (2, 0):
    expected = "float16"  # use_bfloat16 defaults to False
  else:
    expected = "bfloat16" if model.startswith("gpt") else "float16"  # gpt2/utils.py set_defaults
  assert release.half_dtype == expected and release.source.startswith(
    "https://github.com/Cerebras/modelzoo/blob/"
  )


@settings(max_examples=30, deadline=None)
@given(
  minor=st.integers(0, 12),
  patch=st.integers(0, 3),
  spelling=st.sampled_from(["{}", "R{}", "Release_{}", "rel-{}", "R_{}"]),
  model=st.sampled_from(["bert", "gpt2", "gpt3"]),
)
def test_every_spelling_of_a_release_gives_its_defaults(minor, patch, spelling, model):
  """The release is read by the one parser `wafer.costmodel.release.parse_release` (``--release`` and the
  schema's check use it too): a spelling it accepts gives the defaults of the bare number."""
  from wafer.config.modelzoo import release_of

  def of(text):
    return release_of({"runconfig": {"modelzoo_release": text}}, trainer_layout=False, model=model)

  written = of(spelling.format(f"2.{minor}.{patch}"))
  bare = of(f"2.{minor}")
  assert (written.half_dtype, written.source) == (bare.half_dtype, bare.source)
  assert written.reason == f"runconfig.modelzoo_release={spelling.format(f'2.{minor}.{patch}')}"


def test_a_release_without_minor_number_is_inferred_and_says_so():
  from wafer.config.modelzoo import release_of

  two = release_of({"runconfig": {"modelzoo_release": "2.x"}, "model": {}}, trainer_layout=True, model="gpt3")
  assert two.name == "2.4+" and "2.x names no minor release" in two.reason
  one = release_of({"runconfig": {"modelzoo_release": "1.x"}}, trainer_layout=False, model="gpt2")
  assert one.half_dtype == "float16" and one.reason == "runconfig.modelzoo_release=1.x"


def test_trainer_layout_conversion_problems_are_reported_together(tmp_path):
  data = yaml.safe_load(
    (DATA / "Release_2.4.3" / "gpt3" / "sparsity" / "params_gpt3_125m_static75.yaml").read_text()
  )
  data["trainer"]["init"]["callbacks"].append({"NoSuchCallback": {}})
  data["trainer"]["init"]["model"]["no_such_model_key"] = 1
  data["trainer"]["init"]["sparsity"]["algorithm"] = "gmp"
  path = tmp_path / "params_gpt3_125m_static75.yaml"
  path.write_text(yaml.safe_dump(data))
  with pytest.raises(ConfigError) as info:
    load_params(path)
  text = str(info.value)
  assert "callback 'NoSuchCallback' is not converted" in text
  assert "no_such_model_key" in text
  assert "gmp" in text and "features wafer does not have" not in text
  assert not any("ComputeNorm" in p.path for p in info.value.problems)  # logging only: ignored


def test_a_missing_data_dir_names_the_way_out(tmp_path):
  from wafer.data.sources import pretokenised

  with pytest.raises(FileNotFoundError, match=r"train_input.data_dir=null .* embedded data"):
    pretokenised(tmp_path / "not_there", (".h5",), lambda p: {}, 128, None)


def test_a_2_1_file_with_use_cs_grad_accum_is_not_called_1x():
  """``runconfig.use_cs_grad_accum`` is in 2.0 and 2.1 files too (Release_2.1.1's sparsity configs)."""
  params = load_params(DATA / "Release_2.1.1/gpt3/sparsity/params_gpt3_125m_rigl75.yaml")
  assert params.release.name == "2.1-2.3", params.release


def test_an_unknown_model_name_in_a_trainer_layout_file_is_located_as_written(tmp_path):
  """A 2.4+ file's model name is ``trainer.init.model.name``: the error named ``model.name`` with
  neither its line nor the override that set it."""
  from wafer import runner

  path = DATA / "Release_2.4.3" / "gpt3" / "Cerebras_GPT" / "111m.yaml"
  with pytest.raises(
    ConfigError,
    match=r"trainer.init.model.name \(from override 'trainer.init.model.name=gpt33'\): unknown model 'gpt33'\. Did you mean 'gpt3'",
  ):
    runner.load_plan(path, ["trainer.init.model.name=gpt33"])
  edited = tmp_path / "111m.yaml"
  edited.write_text(path.read_text().replace('name: "gpt3"', 'name: "gpt33"', 1))
  with pytest.raises(
    ConfigError, match=r"111m.yaml: line \d+: trainer.init.model.name: unknown model 'gpt33'"
  ):
    runner.load_plan(edited)


def _adamw_without_correct_bias(entry: dict) -> bool:
  opt = yaml.safe_load((DATA / entry["file"]).read_text()).get("optimizer") or {}
  return str(opt.get("optimizer_type", "")).lower() == "adamw" and "correct_bias" not in opt


@pytest.mark.parametrize(
  "entry", [e for e in MANIFEST if EXPECTED[e["file"]] == "ok" and _adamw_without_correct_bias(e)], ids=str
)
def test_adamw_without_correct_bias_gets_its_release_default_or_a_note(entry):
  """modelzoo's AdamW defaulted to ``correct_bias: False`` up to 1.8 and True from 1.9 on: a file of 1.8
  or before is never given True silently, a later file never False."""
  params = load_params(DATA / entry["file"])
  major, minor = (int(x) for x in entry["tag"].removeprefix("Release_").removeprefix("R_").split(".")[:2])
  undecided = [n for n in params.notes if "correct_bias not given: True" in n and "does not say" in n]
  if (major, minor) <= (1, 8):
    assert params.optimizer.correct_bias is False or undecided, params.notes
  else:
    assert params.optimizer.correct_bias is True
  assert len(undecided) <= 1


def test_a_1_8_bert_file_updates_as_modelzoo_1_8_did():
  """Release_1.8.0's BERT-base AdamW: no bias correction, so the first update is ``lr (1 - b1) g /
  (sqrt((1 - b2) g^2) + eps)`` (3.2x the corrected one at beta1 0.9, beta2 0.999), as PyTorchBaseModel.py built it."""
  import jax.numpy as jnp
  import numpy as np

  params = load_params(
    DATA / "Release_1.8.0/bert/bert_base_MSL128.yaml",
    ["optimizer.learning_rate=0.001", "optimizer.weight_decay_rate=0.0", "optimizer.max_gradient_norm=null"],
  )
  assert any("correct_bias not given: False" in n for n in params.notes)
  tx, _ = params.build_optimizer()
  g = jnp.array([1e-3, 1.0, 5.0])
  update, _ = tx.update({"w": g}, tx.init({"w": jnp.zeros(3)}), {"w": jnp.zeros(3)})
  b1, b2 = params.optimizer.b1_b2
  eps = params.optimizer.epsilon_value
  expected = -1e-3 * (1 - b1) * g / (np.sqrt((1 - b2) * g**2) + eps)
  np.testing.assert_allclose(update["w"], expected, rtol=1e-5)
  corrected = load_params(DATA / "Release_1.8.0/bert/bert_base_MSL128.yaml", ["optimizer.correct_bias=true"])
  assert corrected.optimizer.correct_bias is True
  assert not any("correct_bias" in n for n in corrected.notes)


@pytest.mark.parametrize(
  ("release", "expected"),
  [("1.8", False), ("R_1.6.0", False), ("1.x", False), ("1.9.1", True), ("2.0.3", True), ("2.x", True)],
)
def test_a_given_release_decides_adamw_correct_bias(release, expected):
  """The release given wins over keys that date the file (here one that only 1.6-1.8 files have)."""
  from wafer.config.modelzoo import adamw_default, release_of

  data = {
    "runconfig": {"modelzoo_release": release, "save_summary_steps": 10},
    "optimizer": {"optimizer_type": "adamw"},
  }
  adamw_default(data, release_of(data, trainer_layout=False, model="bert"))
  assert data["optimizer"].get("correct_bias", True) is expected


@pytest.mark.parametrize(
  ("path", "key"),
  [
    ("Release_2.10.0/fc_mnist/params.yaml", "model.to_float16"),
    ("Release_2.6.0/fc_mnist/params.yaml", "trainer.init.model.to_float16"),
  ],
)
def test_fc_mnist_to_float16_true_is_refused_not_trained_in_mixed_precision(path, key):
  """modelzoo 2.x's fc_mnist casts the whole model, weights too, to the half type with to_float16: true;
  wafer keeps float32 weights, so it refuses the key (at its line) rather than train another model."""
  with pytest.raises(
    ConfigError, match=r"model.to_float16 .*: true \(the whole model, its weights too"
  ) as error:
    load_params(DATA / path, [f"{key}=true"])
  assert "set model.to_float16: false" in str(error.value)
  assert load_params(DATA / path, [f"{key}=false"]).model.to_float16 is False


MLP = pathlib.Path(__file__).parents[2] / "models" / "mlp" / "configs" / "params_mlp.yaml"


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
  half=st.sampled_from(["float16", "bfloat16", "cbfloat16"]),
  factor=st.sampled_from([None, "dynamic", "1.0", "128.0"]),
  extra=st.sampled_from([[], ["optimizer.initial_loss_scale=1024.0"], ["optimizer.steps_per_increase=10"]]),
)
def test_the_loss_scaling_note_says_what_the_run_does(half, factor, extra):
  """The load note's loss scaling is the scale the run builds: bfloat16 with a static 128 said
  'static 128.0' and ran at 1.0; keys of dynamic scaling under a static scale were taken without a word."""
  overrides = [f"model.fp16_type={half}", *extra]
  if factor is not None:
    overrides.append(f"optimizer.loss_scaling_factor={factor}")
  try:
    params = load_params(MLP, overrides)
  except ConfigError as error:  # cbfloat16 without dynamic scaling: refused, as modelzoo
    assert half == "cbfloat16" and factor != "dynamic", error
    return
  note = params.notes[-1].split("loss scaling ", 1)[1]
  built = params.build().loss_scale
  if type(built).__name__ == "DynamicLossScale":
    assert note.startswith("dynamic")
  elif note.startswith("static"):
    assert note.startswith(f"static {float(built.loss_scale)}")
  else:
    assert note.startswith("none") and float(built.loss_scale) == 1.0
  ignored = type(built).__name__ != "DynamicLossScale" and bool(extra)
  assert ("set dynamic loss scaling only: ignored" in note) == ignored


@pytest.mark.parametrize(
  "overrides, overridden",
  [
    (["model.fp16_type=cbfloat16", "runconfig.precision_opt_level=1"], True),
    (["model.fp16_type=float16", "runconfig.precision_opt_level=2"], True),
    (["model.fp16_type=float16", "runconfig.precision_opt_level=1"], False),
    (["model.fp16_type=cbfloat16", "runconfig.precision_opt_level=0"], False),
  ],
)
def test_an_explicit_float32_softmax_that_modelzoo_overrides_is_noted(overrides, overridden):
  params = load_params(MLP, ["model.attention_softmax_fp32=true", *overrides])
  assert ("model.attention_softmax_fp32: True overridden" in params.notes[-1]) == overridden
  assert (params.policy().rule("attention_softmax") == "round") == overridden  # the note says what runs


@pytest.mark.parametrize(
  "override",
  [
    "runconfig.eval_frequency=5",
    "runconfig.precision_opt_level=1",
    "model.fp16_type=bfloat16",
    "optimizer.betas=[0.9, 0.999]",
  ],
)
def test_an_override_does_not_change_the_release_a_file_is_read_as(override):
  """The release (and with it AdamW's correct_bias) is read from the file as written: an override of a key
  that 1.9 and later files have made a 1.8 file "1.x or 2.0", and its AdamW correct its bias."""
  path = DATA / "Release_1.8.0" / "bert" / "bert_base_MSL128.yaml"
  written = load_params(path)
  overridden = load_params(path, [override])
  assert written.release.name == overridden.release.name == "1.x (up to 1.8)"
  assert written.optimizer.correct_bias is overridden.optimizer.correct_bias is False


@pytest.mark.parametrize(("release", "expected"), [("1.9", True), ("1.8", False), ("null", False)])
def test_a_release_given_by_an_override_still_decides(release, expected):
  path = DATA / "Release_1.8.0" / "bert" / "bert_base_MSL128.yaml"
  params = load_params(path, [f"runconfig.modelzoo_release={release}"])
  assert params.optimizer.correct_bias is expected
