"""Files of Cerebras Model Zoo models wafer does not have (LLaMA, SantaCoder, DiT, a BERT classifier, ...):
refused as that model, first or alone, never read key by key as one of wafer's (probe 23b, D2-D4).

The files are excerpts of real Model Zoo files (the URL above each), at a path like the one they have in
Model Zoo's tree: the folder names the model."""

from __future__ import annotations

import pathlib
import textwrap

import pytest

from wafer import registry
from wafer.config import ConfigError, load_params
from wafer.config.loader import _validate_section
from wafer.config.modelzoo import EVIDENCE, MODELZOO_MODELS, zoo_folder
from wafer.config.params import model_schemas

# Release_2.10.0 src/cerebras/modelzoo/models/nlp/llama/configs/params_llama3p2_1b_msl_8k.yaml (trimmed)
LLAMA_TRAINER = """\
trainer:
  fit:
    train_dataloader:
      batch_size: 1024
      data_dir: ./datasets/rpj_1t_100k_llama3p1_msl8k_train
      data_processor: GptHDF5MapDataProcessor
  init:
    backend:
      backend_type: CSX
    callbacks:
    - ScopedTrainFlags:
        csx.performance.micro_batch_size: 8
    - LoadCheckpointStates:
        load_checkpoint_states: model
    logging:
      log_level: INFO
      log_steps: 1
    loop:
      max_steps: 700
    model:
      attention_module: multiquery_attention
      hidden_size: 2048
      name: llama
      nonlinearity: swiglu
      norm_type: rmsnorm
      position_embedding_type: rotary
      vocab_size: 128256
    optimizer:
      AdamW:
        lr: 0.0001
"""

# Release_2.10.0 src/cerebras/modelzoo/models/nlp/bert/classifier/configs/bert_base_classifier_sst2.yaml
BERT_CLASSIFIER_TRAINER = """\
trainer:
  init:
    model:
      name: "bert/classifier"
      num_labels: 2
      problem_type: "single_label_classification"
    optimizer:
      AdamW:
        lr: 0.00002
    loop:
      max_steps: 10
  fit:
    train_dataloader:
      data_processor: "SST2DataProcessor"
      batch_size: 256
"""

# Release_1.9.1 modelzoo/transformers/pytorch/llama/configs/params_llama_7b.yaml (trimmed)
LLAMA_LEGACY = """\
train_input:
    data_processor: "GptHDF5DataProcessor"
    data_dir: "./llama_data_test/val"
    batch_size: 1024
model:
    vocab_size: 32000
    hidden_size: 4096
    position_embedding_type: "rotary"
    rotary_dim: 128
    use_rms_norm: True
    nonlinearity: "swiglu"
    num_heads: 32
    num_hidden_layers: 32
    max_position_embeddings: 2048
optimizer:
    optimizer_type: "AdamW"
    learning_rate: 3.0e-4
runconfig:
    max_steps: 10
"""

# Release_2.3.1 src/cerebras/modelzoo/models/nlp/santacoder/configs/params_santacoder_1b.yaml (trimmed):
# refused on these two keys only, it would train as a multi-head gpt2 once they were deleted
SANTACODER_LEGACY = """\
train_input:
    data_processor : "GptHDF5MapDataProcessor"
    data_dir: "./shuffled/santacoder_data_test/val"
    batch_size: 192
model:
    vocab_size: 49280
    position_embedding_type: "learned"
    hidden_size: 2048
    filter_size: 8192
    num_heads: 16
    num_hidden_layers: 24
    max_position_embeddings: 2048
    attention_module: "multiquery_attention"
    attention_type: "scaled_dot_product"
    extra_attention_params:
        num_kv_groups: 1
    nonlinearity: "gelu"
optimizer:
    optimizer_type: "Adam"
    learning_rate: 2.0e-4
runconfig:
    max_steps: 10
"""

# Release_2.0.3 modelzoo/vision/pytorch/dit/configs/params_dit_small_patchsize_2x2.yaml (trimmed)
DIT_LEGACY = """\
description: "DiT-S with patch size 2*2 Table 1 of https://arxiv.org/pdf/2212.09748.pdf"
tag: "dit_s_2"
train_input:
  data_processor: "DiffusionLatentImageNet1KProcessor"
  batch_size: 256
model:
    schedule_name: "linear"
    hidden_size: 384
    position_embedding_type: "fixed"
    patch_size: [2, 2]
optimizer:
    optimizer_type: "AdamW"
    learning_rate: 1.0e-4
runconfig:
    max_steps: 10
"""


def _write(tmp_path: pathlib.Path, where: str, text: str) -> pathlib.Path:
  path = tmp_path / where
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(textwrap.dedent(text))
  return path


def _problems(path: pathlib.Path, overrides: tuple[str, ...] = ()) -> list:
  registry.load_plugins()
  with pytest.raises(ConfigError) as info:
    load_params(path, list(overrides))
  return info.value.problems


def test_a_trainer_layout_file_of_another_model_says_so_first(tmp_path):
  """D2: the 2.10 LLaMA file was refused for a callback and log_level, never naming its model."""
  path = _write(tmp_path, "llama/configs/params_llama3p2_1b_msl_8k.yaml", LLAMA_TRAINER)
  problems = _problems(path)
  first = problems[0]
  assert first.shown_path == "trainer.init.model.name" and first.line == 23
  assert "unknown model 'llama'" in first.message and "LLaMA" in first.message
  assert "Registered models" in first.message and "gpt2" in first.message
  assert "Did you mean" not in first.message
  rest = " ".join(p.message for p in problems[1:])
  assert "LoadCheckpointStates" in rest and "log_level" in rest  # the others follow


def test_a_model_zoo_model_gets_no_did_you_mean_but_a_typo_does():
  """gptj is Model Zoo's GPT-J, not a misspelled gpt3; gpt33 is."""
  assert "Did you mean" not in registry.unknown_model("gptj")
  assert "GPT-J" in registry.unknown_model("gptj")
  assert "Did you mean 'gpt3'?" in registry.unknown_model("gpt33")
  assert registry.unknown_model("gpt3") is None
  with pytest.raises(registry.UnknownModelError, match=r"^model.name: unknown model 'llama'\. It is"):
    registry.get_spec("llama")


def test_a_trainer_layout_file_of_another_model_gets_no_data_processor_suggestion(tmp_path):
  """D2: the 2.10 BERT classifier was told "did you mean 'MNISTDataProcessor'" for SST2DataProcessor."""
  path = _write(tmp_path, "bert/classifier/configs/bert_base_classifier_sst2.yaml", BERT_CLASSIFIER_TRAINER)
  problems = _problems(path, ("trainer.init.loop.max_stepz=1",))  # another problem: the loader's path
  assert "unknown model 'bert/classifier'" in problems[0].message and problems[0].line == 4
  text = " ".join(p.message for p in problems)
  assert "MNISTDataProcessor" not in text and "max_stepz" in text


@pytest.mark.parametrize(
  ("where", "text", "model", "keys"),
  [
    (
      "modelzoo/transformers/pytorch/llama/configs/params_llama_7b.yaml",
      LLAMA_LEGACY,
      "LLaMA",
      ("position_embedding_type (line 8)", "nonlinearity (line 11)", "use_rms_norm (line 10)"),
    ),
    (
      "src/cerebras/modelzoo/models/nlp/santacoder/configs/params_santacoder_1b.yaml",
      SANTACODER_LEGACY,
      "SantaCoder",
      ("attention_module (line 13)",),
    ),
  ],
)
def test_a_legacy_file_of_another_model_is_refused_as_that_model(tmp_path, where, text, model, keys):
  """D3: a legacy LLaMA or SantaCoder file was read as gpt2 (its data processor) and refused key by key,
  with fixes that build another model ("did you mean 'silu'", "must be 'learned'"); SantaCoder on two
  keys only, after which it trained as a multi-head gpt2."""
  (problem,) = _problems(_write(tmp_path, where, text))
  assert problem.loc == ("model",) and problem.line == 5
  assert f"this is a Cerebras Model Zoo {model} file" in problem.message
  assert "wafer's models: " in problem.message and "gpt2" in problem.message
  for key in keys:
    assert key in problem.message
  assert "did you mean" not in problem.message.lower() and "must be" not in problem.message


def test_the_keys_alone_mark_another_model_outside_model_zoos_tree(tmp_path):
  (problem,) = _problems(_write(tmp_path, "my_runs/params.yaml", LLAMA_LEGACY))
  assert problem.message.startswith("this is a file of a Cerebras Model Zoo model (")
  assert "LLaMA" in problem.message and "rotary position embeddings" in problem.message


def test_a_2_0_dit_file_is_not_called_tensorflow(tmp_path):
  """D4: the top-level ``description`` of the 2.0 PyTorch DiT files made them "TensorFlow" files."""
  (problem,) = _problems(
    _write(tmp_path, "modelzoo/vision/pytorch/dit/configs/params_dit_small_patchsize_2x2.yaml", DIT_LEGACY)
  )
  assert "TensorFlow" not in problem.message
  assert "this is a Cerebras Model Zoo DiT (diffusion transformer) file (its folder 'dit')" in problem.message


def test_every_evidence_is_refused_by_every_registered_model():
  """An evidence key or value is one no registered model takes: a file wafer runs never has one, so the
  refusal as another model changes no file that validates (the 259 + 78 real files included)."""
  registry.load_plugins()
  assert model_schemas()
  for name in model_schemas():
    for evidence in EVIDENCE:
      values = evidence.values if evidence.values is not None else ({"num_experts": 8},)
      for value in values:
        _, problems = _validate_section("model", {"name": name, evidence.key: value})
        assert any(p.loc[:2] == ("model", evidence.key) for p in problems), (name, evidence.key, value)


def test_a_folder_alone_refuses_only_a_file_none_of_whose_processors_feed_wafers_models(tmp_path):
  """A file in a LLaMA folder that is plain gpt2 (no evidence, a GPT processor) is still inferred gpt2."""
  plain = "\n".join(
    line
    for line in LLAMA_LEGACY.splitlines()
    if not any(k in line for k in ("rotary", "rms_norm", "swiglu", "position_embedding"))
  )
  params = load_params(_write(tmp_path, "modelzoo/transformers/pytorch/llama/configs/p.yaml", plain))
  assert params.model.name == "gpt2"


def test_zoo_folder_names_the_model_of_each_layout():
  assert (
    zoo_folder("x/Release_1.9.1/modelzoo/transformers/pytorch/gptj/configs/params_gpt_neox_small.yaml")
    == "gptj"
  )
  assert (
    zoo_folder("modelzoo/transformers/pytorch/bert/fine_tuning/qa/configs/bert_base_squad.yaml") == "bert/qa"
  )
  assert zoo_folder("src/cerebras/modelzoo/models/nlp/gpt3/configs/sparsity/p.yaml") == "gpt3"
  assert zoo_folder("modelzoo/fc_mnist/pytorch/configs/params.yaml") is None
  assert zoo_folder("tests/data/modelzoo/Release_1.9.1/gpt2/params_gpt2_small.yaml") is None
  assert all(name == name.lower() for name in MODELZOO_MODELS)


def test_a_scheduler_that_wraps_another_is_named_not_dumped(tmp_path):
  """Minor: the 2.5 MoE file's ``ScalePerParamLR: {scheduler: {SequentialLR: ...}}`` gave "Invalid
  lr_scheduler type {'SequentialLR': ...}" (its argument replaced its name) and "learning_rate: required"."""
  from wafer.config.trainer import convert_all

  text = LLAMA_TRAINER.replace("name: llama", "name: gpt3") + (
    "    schedulers:\n"
    "    - ScalePerParamLR:\n"
    "        scheduler:\n"
    "          SequentialLR:\n"
    "            schedulers:\n"
    "            - LinearLR: {initial_learning_rate: 0.0, end_learning_rate: 0.01, total_iters: 9}\n"
    "            - LinearLR: {initial_learning_rate: 0.01, end_learning_rate: 0.0, total_iters: 9}\n"
  )
  import yaml

  _, _, found, _ = convert_all(yaml.safe_load(text))
  (wrapped,) = [p for p in found if "ScalePerParamLR" in p.loc]
  assert wrapped.loc[-1] == "scheduler" and "wraps another scheduler" in wrapped.message
  registry.load_plugins()
  with pytest.raises(ConfigError) as info:
    load_params(_write(tmp_path, "p.yaml", text))
  messages = str(info.value)
  assert "ScalePerParamLR.scheduler: ScalePerParamLR wraps another scheduler" in messages
  assert "{'SequentialLR'" not in messages and "required key is missing" not in messages


def test_a_qualified_core_key_is_not_a_misspelling():
  """Minor: T5's ``src_max_sequence_length`` "looked like a misspelling of max_sequence_length"."""
  from wafer.config.schema import InputConfig

  found = InputConfig.key_problems({"src_max_sequence_length": 512, "tgt_max_sequence_length": 114})
  assert found == {}
  assert "batch_size" in InputConfig.key_problems({"batch_sise": 8}).get("batch_sise", "")


def test_a_plugin_model_that_takes_the_evidence_is_not_refused_as_another_model():
  """Evidence of another Model Zoo model (rotary embeddings) does not refuse a file whose data
  processor feeds a registered model that takes that value (a user's plugin); a hand-registered
  schema's name is not called unknown when the file has another problem."""
  from pydantic import ConfigDict

  from wafer.config import InputConfig, ModelConfig, register_input_schema, register_model_schema
  from wafer.config.params import unregister_schema

  class RopeModel(ModelConfig):
    model_config = ConfigDict(extra="forbid")
    hidden_size: int = 8
    position_embedding_type: str = "rotary"

  class RopeInput(InputConfig):
    pass

  registry.load_plugins()
  register_model_schema("rope_test_model", RopeModel)
  register_input_schema("RopeTestProcessor", RopeInput, models=("rope_test_model",))
  try:
    data = {
      "train_input": {"data_processor": "RopeTestProcessor", "batch_size": 8},
      "model": {"hidden_size": 8, "position_embedding_type": "rotary"},
      "optimizer": {"optimizer_type": "SGD", "learning_rate": 0.1},
      "runconfig": {"max_steps": 2},
    }
    assert isinstance(load_params(data).model, RopeModel)
    data["model"] = {"name": "rope_test_model", "hidden_sise": 8}
    with pytest.raises(ConfigError) as error:
      load_params(data)
    assert "unknown model" not in str(error.value) and "hidden_sise" in str(error.value)
  finally:
    unregister_schema("rope_test_model")
    unregister_schema("RopeTestProcessor")
