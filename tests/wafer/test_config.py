"""The params-YAML config system: the modelzoo examples parse, overrides, the trainer layout, errors."""

from __future__ import annotations

import pathlib
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import yaml
from pydantic import ConfigDict

import precision
from wafer.config import (
  ConfigError,
  InputConfig,
  ModelConfig,
  Params,
  format_config_error,
  from_trainer_layout,
  load_params,
  parse_override,
  register_input_schema,
  register_model_schema,
)
from wafer.config.loader import literal_override
from wafer.config.optimizer import OPTIMIZER_TYPES
from wafer.config.params import unregister_schema

DATA = pathlib.Path(__file__).resolve().parents[1] / "data" / "params"
EXAMPLES = ("bert_base_MSL128.yaml", "fc_mnist.yaml", "params_gpt2_small.yaml", "params_gpt3_111m.yaml")
FC = DATA / "fc_mnist.yaml"

MINIMAL = """\
train_input:
  batch_size: 8
model:
  name: tiny
optimizer:
  optimizer_type: SGD
  learning_rate: 0.1
runconfig:
  max_steps: 10
"""
REGISTERED = MINIMAL.replace("name: tiny", "name: mlp_example")
"""`MINIMAL` of a registered model: its errors are the file's alone (a file of a model that is not
available says that first)."""


def write(tmp_path: pathlib.Path, text: str, name: str = "params.yaml") -> pathlib.Path:
  path = tmp_path / name
  path.write_text(textwrap.dedent(text))
  return path


def error_of(*args, **kwargs) -> str:
  with pytest.raises(ConfigError) as info:
    load_params(*args, **kwargs)
  text = str(info.value)
  assert "Traceback" not in text and "pydantic" not in text and "validation error" not in text, text
  assert "For further information visit" not in text, text
  return text


# --- the example configs of docs/references.md -------------------------------------------------------


@pytest.mark.parametrize("name", EXAMPLES)
def test_modelzoo_examples_parse(name: str) -> None:
  params = load_params(DATA / name)
  assert isinstance(params, Params)
  assert params.source == str(DATA / name)
  assert params.runconfig.mode == "train"
  assert params.train_input is not None and params.eval_input is not None
  assert isinstance(params.policy(), precision.Policy)


def test_bert_values() -> None:
  p = load_params(DATA / "bert_base_MSL128.yaml")
  assert p.train_input.batch_size == 3200 and p.eval_input.batch_size == 256
  assert p.train_input.max_predictions_per_seq == 20  # typed by the processor's strict schema
  assert p.model.name == "bert"  # inferred from the data processor (the file names no model)
  assert p.model.hidden_size == 768 and p.model.fp16_type == "cbfloat16"
  assert p.optimizer.name == "adamw" and p.optimizer.decay == 0.01 and p.optimizer.dynamic_loss_scaling
  assert [s["total_iters"] for s in p.optimizer.learning_rate] == [3200, 77600]
  assert p.runconfig.max_steps == 72000 and p.runconfig.save_initial_checkpoint is True
  policy = p.policy()
  assert policy.compute.name == "cbfloat16" and policy.level == 1
  assert "attention_softmax=round" in str(policy)  # POL 1 + cbfloat16 forces a 16-bit softmax


def test_gpt2_values() -> None:
  p = load_params(DATA / "params_gpt2_small.yaml")
  assert p.optimizer.eps == 1e-8  # written "1e-8": a float (YAML 1.2), not the string PyYAML gives
  assert p.optimizer.betas == [0.9, 0.95]
  assert p.optimizer.initial_loss_scale == 2.0**31 and p.optimizer.max_loss_scale == 2.0**31


def test_fc_mnist_values() -> None:
  p = load_params(FC)
  assert p.model.name == "fc_mnist" and p.optimizer.learning_rate == 0.001
  assert p.train_input.drop_remainder is True
  # a legacy-layout file without fp16_type ran in float16 on its releases (<= 2.3; the Trainer's bfloat16 is 2.4+)
  assert p.policy().compute.name == "float16" and p.release.half_dtype == "float16"


# --- the trainer (v2) layout ----------------------------------------------------------------------


def test_trainer_layout_converts_like_the_legacy_file() -> None:
  v2 = load_params(DATA / "bert_base_MSL128_v2.yaml")
  legacy = load_params(DATA / "bert_base_MSL128.yaml")
  assert v2.runconfig.target_device == "CSX"
  for key in (
    "max_steps",
    "log_steps",
    "checkpoint_steps",
    "seed",
    "model_dir",
    "save_initial_checkpoint",
    "eval_steps",
    "eval_frequency",
  ):
    assert getattr(v2.runconfig, key) == getattr(legacy.runconfig, key), key
  assert v2.model.name == "bert" and v2.model.fp16_type == "cbfloat16" and v2.model.mixed_precision
  assert v2.optimizer.optimizer_type == "AdamW" and v2.optimizer.weight_decay == 0.01
  assert v2.optimizer.loss_scaling_factor == "dynamic" and v2.optimizer.max_gradient_norm == 1.0
  lr_v2, lr_legacy = v2.optimizer.learning_rate, legacy.optimizer.learning_rate
  assert [s["scheduler"] for s in lr_v2] == ["LinearLR", "LinearLR"]
  assert [{k: v for k, v in s.items() if k != "scheduler"} for s in lr_v2] == [
    {k: v for k, v in s.items() if k != "scheduler"} for s in lr_legacy
  ]
  assert v2.train_input.batch_size == 3200 and v2.eval_input.batch_size == 256
  assert v2.policy() == legacy.policy()


def test_trainer_converter_details() -> None:
  data = {
    "trainer": {
      "init": {
        "backend": {"backend_type": "CSX", "cluster_config": {"num_csx": 2, "num_workers_per_csx": 1}},
        "model": {"name": "gpt3"},
        "optimizer": {"SGD": {"lr": 0.5, "momentum": 0.9}},
        "schedulers": [
          {
            "ChainedScheduler": {
              "schedulers": [
                {"ConstantLR": {"learning_rate": 1.0}},
                {"ExponentialLR": {"initial_learning_rate": 1.0, "total_iters": 10, "decay_rate": 0.5}},
              ]
            }
          }
        ],
        "precision": {"precision_opt_level": 0, "fp16_type": "float16", "log_loss_scale": True},
        "loop": {"num_steps": 5, "grad_accum_steps": 1},
        "callbacks": [{"ScopedTrainFlags": {"csx.performance.micro_batch_size": 2}}],
      },
      "fit": {"train_dataloader": {"batch_size": 8}, "ckpt_path": "ckpt.mdl"},
    }
  }
  out = from_trainer_layout(data)
  assert out["runconfig"] == {
    "target_device": "CSX",
    "num_csx": 2,
    "num_workers_per_csx": 1,
    "precision_opt_level": 0,
    "num_steps": 5,
    "checkpoint_path": "ckpt.mdl",
    "mode": "train",
  }
  assert out["optimizer"]["optimizer_type"] == "SGD" and out["optimizer"]["momentum"] == 0.9
  assert [s["main_scheduler"] for s in out["optimizer"]["learning_rate"]] == ["chained", "chained"]
  assert out["optimizer"]["grad_accum_steps"] == 1 and out["optimizer"]["log_loss_scale"] is True
  assert out["train_input"] == {"batch_size": 8, "micro_batch_size": 2}
  assert out["model"] == {"name": "gpt3", "fp16_type": "float16"}
  params = load_params(data)
  assert params.runconfig.num_csx == 2 and params.policy().level == 0


def test_trainer_milestones_must_match_total_iters() -> None:
  sched = {
    "SequentialLR": {
      "milestones": [10],
      "schedulers": [
        {"LinearLR": {"initial_learning_rate": 0.0, "end_learning_rate": 1.0, "total_iters": 20}},
        {"ConstantLR": {"learning_rate": 1.0}},
      ],
    }
  }
  data = {"trainer": {"init": {"model": {}, "optimizer": {"SGD": {}}, "schedulers": [sched]}}}
  text = error_of(data)
  assert "trainer.init.schedulers[0].SequentialLR.milestones" in text
  assert "Expected SequentialLR to have milestones [20], but got [10]" in text


def test_trainer_unconverted_keys_are_errors(tmp_path: pathlib.Path) -> None:
  path = write(
    tmp_path,
    """\
      trainer:
        init:
          model: {name: x}
          loop: {max_stepz: 3}
          callbacks:
            - CheckLoss: {}
          schedulers:
            - LinearLR: {total_iters: 1}
            - WeightDecayScheduler: {}
        fit:
          train_dataloader: {batch_size: 2}
      """,
  )
  text = error_of(path)
  assert "4 problems" in text  # the model first: it is not available (x names none)
  assert text.splitlines()[1].startswith("  line 3: trainer.init.model.name: unknown model 'x'")
  assert "trainer.init.loop.max_stepz: unknown key 'max_stepz'; did you mean 'max_steps'?" in text
  assert "trainer.init.callbacks[0].CheckLoss: callback 'CheckLoss' is not converted" in text
  assert "trainer.init.schedulers: only one learning-rate scheduler" in text


def test_trainer_lr_and_learning_rate_together_and_the_examples_per_kind(tmp_path: pathlib.Path) -> None:
  """``{SGD: {lr: 0.1, learning_rate: 0.2}}`` trained at whichever came last (the other silently dropped); the
  "one key" errors of schedulers and callbacks showed an optimizer as their example."""
  path = write(
    tmp_path,
    """\
      trainer:
        init:
          model: {name: x}
          optimizer:
            SGD: {lr: 0.1, learning_rate: 0.2}
          schedulers: 5
          callbacks: [5]
        fit:
          train_dataloader: {batch_size: 2}
      """,
  )
  text = error_of(path)
  assert (
    "line 5: trainer.init.optimizer.SGD.learning_rate: lr and learning_rate are the same setting (lr is its "
    "trainer-layout name); give one of them (got 0.2)" in text
  )
  assert (
    "trainer.init.schedulers: must be a mapping with one key, the scheduler name (e.g. {LinearLR: " in text
  )
  assert (
    "trainer.init.callbacks[0]: must be a mapping with one key, the callback name (e.g. {ScopedTrainFlags"
    in text
  )


def test_trainer_errors_are_shown_at_the_written_path(tmp_path: pathlib.Path) -> None:
  text = error_of(DATA / "bert_base_MSL128_v2.yaml", ["trainer.init.loop.max_steps=0"])
  assert "trainer.init.loop.max_steps (from override 'trainer.init.loop.max_steps=0')" in text
  raw = (DATA / "bert_base_MSL128_v2.yaml").read_text().replace("fp16_type: cbfloat16", "fp16_type: cbfloat")
  text = error_of(write(tmp_path, raw))
  line = raw.splitlines().index("      fp16_type: cbfloat") + 1
  assert f"line {line}: trainer.init.precision.fp16_type: must be one of" in text
  assert "did you mean 'cbfloat16'?" in text


# --- overrides ------------------------------------------------------------------------------------


def test_an_override_of_drop_last_outvoted_by_drop_last_batch_is_an_error() -> None:
  """The file's ``drop_last_batch: True`` silently won over ``train_input.drop_last=false`` (the
  "dataset too small" error then suggested the very override that had been ignored)."""
  text = error_of(FC, ["train_input.drop_last=false"])
  assert "train_input.drop_last (from override 'train_input.drop_last=false')" in text, text
  assert "disagrees with drop_last_batch=True, the key that counts; set drop_last_batch instead" in text, text
  assert not load_params(FC, ["train_input.drop_last_batch=false"]).train_input.drop_remainder
  assert load_params(FC, ["train_input.drop_last=true"]).train_input.drop_remainder  # (they agree)


def test_overrides() -> None:
  p = load_params(
    FC,
    [
      "runconfig.max_steps=10",
      "optimizer.learning_rate=0.1",
      "train_input.batch_size=8",
      "optimizer.momentum=0.8",
      "runconfig.seed=null",
      "eval_input.shuffle=true",
    ],
  )
  assert p.runconfig.max_steps == 10 and p.optimizer.learning_rate == 0.1 and p.train_input.batch_size == 8
  assert p.optimizer.momentum == 0.8 and p.runconfig.seed is None and p.eval_input.shuffle is True


def test_integers_are_accepted_where_floats_are_expected() -> None:
  p = load_params(
    FC, ["optimizer.weight_decay=0", "optimizer.max_gradient_norm=1", "optimizer.learning_rate=1"]
  )
  assert p.optimizer.weight_decay == 0.0 and p.optimizer.max_gradient_norm == 1.0
  assert isinstance(p.optimizer.learning_rate, float)


def test_override_into_a_list_and_new_section() -> None:
  p = load_params(
    DATA / "bert_base_MSL128.yaml", ["optimizer.learning_rate.1.total_iters=100", "csconfig.x=1"]
  )
  assert p.optimizer.learning_rate[1]["total_iters"] == 100
  assert p.csconfig is not None and not p.csconfig.use_cbfloat16
  text = error_of(DATA / "bert_base_MSL128.yaml", ["optimizer.learning_rate.5.total_iters=1"])
  assert "optimizer.learning_rate[5]" in text and "no element 5 in a list of 2" in text


def test_negative_override_indices_count_from_the_end_of_a_list() -> None:
  """``optimizer.learning_rate.-1.total_iters=100`` was "no element '-1'" (the index was read as a key)."""
  bert = DATA / "bert_base_MSL128.yaml"
  original = [s["total_iters"] for s in load_params(bert).optimizer.learning_rate]
  for n in (1, 2):
    p = load_params(bert, [f"optimizer.learning_rate.-{n}.total_iters=100"])
    want = list(original)
    want[len(want) - n] = 100
    assert [s["total_iters"] for s in p.optimizer.learning_rate] == want != original
  text = error_of(bert, ["optimizer.learning_rate.-3.total_iters=1"])
  assert text.startswith(f"{bert}: optimizer.learning_rate[-3]")  # the file, not "params:"
  assert (
    "optimizer.learning_rate[-3]" in text
    and "no element -3 in a list of 2 (0..1, or -2..-1 from the end)" in text
  )
  text = error_of(FC, ["runconfig.max_steps=10", "runconfig.max_steps.-1=2"])
  assert f"{FC}: runconfig.max_steps (from override 'runconfig.max_steps.-1=2'): is not a mapping" in text


def test_an_error_in_a_list_element_set_by_a_negative_index_names_the_override() -> None:
  text = error_of(DATA / "params_gpt2_small.yaml", ["optimizer.betas.-1=ten"])
  assert "optimizer.betas[1] (from override 'optimizer.betas.-1=ten'): must be a valid number" in text


def test_an_override_inside_a_scheduler_list_is_named_not_the_lists_line() -> None:
  """A schedule is checked as a whole (at optimizer.learning_rate): its errors named the list's line in the
  file even when the bad value came from an override."""
  for params, key in [
    (DATA / "bert_base_MSL128.yaml", "optimizer.learning_rate.-1.total_iters"),
    (
      DATA / "bert_base_MSL128_v2.yaml",
      "trainer.init.schedulers.0.SequentialLR.schedulers.1.LinearLR.total_iters",
    ),
  ]:
    text = error_of(params, [f"{key}=ten"])
    assert f"(from override '{key}=ten')" in text and "total_iters='ten'" in text and "line " not in text
  text = error_of(DATA / "bert_base_MSL128.yaml", ["optimizer.momentum=ten"])  # a key of its own: as before
  assert "optimizer.momentum (from override 'optimizer.momentum=ten')" in text


def test_parse_override_values() -> None:
  assert parse_override("a.b=1e-3") == (("a", "b"), 1e-3)
  assert parse_override("a.b=") == (("a", "b"), None)
  assert parse_override("a.0.b=dynamic") == (("a", 0, "b"), "dynamic")
  assert parse_override("a.-1.b=1") == (("a", -1, "b"), 1) and parse_override("a.-b=1") == (("a", "-b"), 1)
  with pytest.raises(ConfigError, match="must look like key.path=value"):
    parse_override("runconfig.max_steps")


def test_unknown_override_paths_get_suggestions() -> None:
  text = error_of(FC, ["runconfig.max_stesp=10"])
  assert "runconfig.max_stesp (from override 'runconfig.max_stesp=10')" in text
  assert "did you mean 'max_steps'?" in text
  text = error_of(FC, ["runconfg.max_steps=10"])
  assert "unknown key 'runconfg'; did you mean 'runconfig'?" in text


def test_mode_argument() -> None:
  assert load_params(FC, mode="eval").runconfig.mode == "eval"
  text = error_of(FC, mode="evaluate")
  assert "runconfig.mode (from --mode): must be one of 'train', 'eval', 'train_and_eval', 'eval_all'" in text


# --- errors -------------------------------------------------------------------------------------


def test_misspelled_key_in_file(tmp_path: pathlib.Path) -> None:
  path = write(tmp_path, REGISTERED.replace("max_steps: 10", "max_stesp: 10\n  max_steps: 10"))
  text = error_of(path)
  assert text == (
    f"{path}: line 9: runconfig.max_stesp: unknown key 'max_stesp'; did you mean 'max_steps'? (got 10)"
  )


def test_unknown_key_without_suggestion_lists_the_allowed(tmp_path: pathlib.Path) -> None:
  text = error_of(write(tmp_path, MINIMAL + "  zzz: 1\n"))
  assert "runconfig.zzz: unknown key 'zzz'; allowed keys: " in text and "max_steps" in text


def test_wrong_type_and_range(tmp_path: pathlib.Path) -> None:
  text = error_of(
    FC,
    [
      "runconfig.max_steps=ten",
      "train_input.batch_size=0",
      "runconfig.precision_opt_level=3",
      "runconfig.log_steps=1.5",
    ],
  )
  assert "4 problems" in text
  assert (
    "runconfig.max_steps (from override 'runconfig.max_steps=ten'): "
    "must be a valid integer, not str (got 'ten')" in text
  )
  assert (
    "train_input.batch_size (from override 'train_input.batch_size=0'): must be greater than or equal to 1"
    in text
  )
  assert "runconfig.precision_opt_level" in text and "must be less than or equal to 2 (got 3)" in text
  assert "runconfig.log_steps" in text and "(got 1.5)" in text
  # strict: no silent coercion of strings to numbers or booleans
  error_of(FC, ["train_input.batch_size='8'"])
  error_of(FC, ["train_input.shuffle='yes'"])


def test_enum_value_suggestion() -> None:
  text = error_of(FC, ["model.fp16_type=cbfloat"])
  assert "model.fp16_type" in text and "must be one of 'float16', 'bfloat16', 'cbfloat16'" in text
  assert "did you mean 'cbfloat16'?" in text and "(got 'cbfloat')" in text
  text = error_of(FC, ["optimizer.optimizer_type=adamm"])
  assert "unknown optimizer 'adamm'; did you mean 'Adam'?" in text


def test_precision_opt_level_under_model_is_translated(tmp_path: pathlib.Path) -> None:
  """1.8 read precision_opt_level under model: it moves to runconfig, with a note."""
  path = write(tmp_path, MINIMAL.replace("  name: tiny\n", "  name: tiny\n  precision_opt_level: 0\n"))
  p = load_params(path)
  assert p.runconfig.precision_opt_level == 0
  assert any("model.precision_opt_level: 0 -> runconfig.precision_opt_level: 0" in n for n in p.notes)


def test_misspelled_core_key_in_an_open_section() -> None:
  text = error_of(FC, ["model.mixed_precison=false"])
  assert "model.mixed_precison" in text and "did you mean 'mixed_precision'?" in text
  text = error_of(FC, ["train_input.batch_sise=2"])
  assert "did you mean 'batch_size'?" in text


def test_loss_scaling_factor_message() -> None:
  text = error_of(FC, ["optimizer.loss_scaling_factor=auto"])
  assert "Optimizer param 'loss_scaling_factor' must be a float, None, or 'dynamic'." in text
  for bad in ("0.0", "-2.0", "inf"):  # floats: the rule the message gave did not say why they are refused
    assert "Allowed: a finite number > 0 (a static scale)" in error_of(
      FC, [f"optimizer.loss_scaling_factor={bad}"]
    )
  assert load_params(FC, ["optimizer.loss_scaling_factor=null"]).optimizer.loss_scaling_factor is None


def test_both_clip_modes() -> None:
  text = error_of(FC, ["optimizer.max_gradient_norm=1.0", "optimizer.max_gradient_value=2.0"])
  assert "Gradients can be clipped by norm(=1.0) or by value(=2.0), but not both." in text
  assert "must be greater than 0" in error_of(FC, ["optimizer.max_gradient_norm=0"])


def test_batch_size_and_num_csx() -> None:
  text = error_of(FC, ["runconfig.num_csx=3", "train_input.batch_size=8", "eval_input.batch_size=6"])
  assert "train_input.batch_size" in text and "must be a multiple of runconfig.num_csx=3" in text
  assert "eval_input" not in text
  text = error_of(FC, ["runconfig.num_csx=8"])
  assert "The number of CS devices (8) must be less than or equal to the model batch size (4)" in text
  assert load_params(FC, ["runconfig.num_csx=2"]).runconfig.num_csx == 2


def test_step_counts() -> None:
  text = error_of(FC, ["runconfig.max_steps=null"])  # named the file's line of runconfig, not the override
  assert (
    "runconfig (from override 'runconfig.max_steps=null'): One of num_epochs, num_steps, or max_steps must be "
    "provided" in text
  )
  assert "mutually exclusive" in error_of(
    FC, ["runconfig.num_steps=5", "runconfig.num_epochs=1", "runconfig.steps_per_epoch=3"]
  )
  rc = load_params(FC, ["runconfig.num_steps=300"]).runconfig
  assert rc.num_train_steps() == 300 and rc.num_train_steps(initial_step=900) == 100
  with pytest.raises(ConfigError, match="Initial global step 1000 already exceeds max step 1000"):
    rc.num_train_steps(initial_step=1000)
  rc = load_params(FC, ["runconfig.num_epochs=2", "runconfig.max_steps=null", "runconfig.steps_per_epoch=7"])
  assert rc.runconfig.num_train_steps(dataloader_len=9) == 14


def test_train_and_eval_checks() -> None:
  text = error_of(
    FC, ["runconfig.mode=train_and_eval", "runconfig.checkpoint_steps=300", "runconfig.eval_frequency=200"]
  )
  assert (
    "checkpoint_steps (300) and frequency of evaluation steps (200) must be multiples of each other." in text
  )


def test_cbfloat16_needs_dynamic_loss_scaling() -> None:
  text = error_of(FC, ["model.fp16_type=cbfloat16"])
  assert "optimizer.loss_scaling_factor: cbfloat16 requires dynamic loss scaling" in text
  p = load_params(FC, ["model.fp16_type=cbfloat16", "optimizer.loss_scaling_factor=dynamic"])
  assert p.policy().compute.name == "cbfloat16"


def test_missing_sections(tmp_path: pathlib.Path) -> None:
  text = error_of(write(tmp_path, "runconfig:\n  max_steps: 3\n"))
  assert text.endswith("params.yaml: model: required section is missing")
  assert "train_input (from override 'train_input=null'): required for mode 'train'" in error_of(
    FC, ["train_input=null"]
  )
  text = error_of(write(tmp_path, REGISTERED), mode="eval")
  assert text.endswith("params.yaml: eval_input: required for mode 'eval'")


def test_yaml_syntax_error_names_file_and_line(tmp_path: pathlib.Path) -> None:
  path = write(tmp_path, "model:\n  name: x\nrunconfig:\n  max_steps: [10\n  seed: 1\n")
  text = error_of(path)
  assert text.startswith(f"{path}:5:") and "YAML syntax error" in text and "started at line 4" in text


def test_a_duplicate_key_keeps_its_last_value_with_a_note(tmp_path: pathlib.Path) -> None:
  """As PyYAML (modelzoo's reader) does: a real modelzoo file repeats a key and ran with the last value."""
  params = load_params(write(tmp_path, MINIMAL + "  max_steps: 20\n"))
  assert params.runconfig.max_steps == 20
  assert any("'runconfig.max_steps' is given twice (lines 9 and 10)" in note for note in params.notes), (
    params.notes
  )
  assert not any("given twice" in note for note in load_params(write(tmp_path, MINIMAL)).notes)


TWO_MODELS = """\
train_input:
  batch_size: 4
  batch_size: 8
model:
  name: fc_mnist
  hidden_sizee: 5
optimizer:
  optimizer_type: SGD
  learning_rate: 0.01
model:
  name: fc_mnist
  depth: 0
runconfig:
  max_steps: 2
"""


def test_a_duplicate_key_note_names_the_whole_key_path_and_is_shown_with_the_errors(
  tmp_path: pathlib.Path,
) -> None:
  """Two model: sections showed only the second one's errors, with no word of the first (the note of a
  key given twice was printed only when the file loaded), and the note named 'batch_size', not
  train_input.batch_size."""
  text = error_of(write(tmp_path, TWO_MODELS))
  lines = text.splitlines()
  assert lines[0].endswith("params.yaml: line 12: model.depth: must be greater than or equal to 1 (got 0)")
  assert lines[1:] == [
    "note: key 'train_input.batch_size' is given twice (lines 2 and 3): its last value (line 3) is used, as "
    "PyYAML, which modelzoo reads params files with, does; delete one of them",
    "note: key 'model' is given twice (lines 4 and 10): only the last one (line 10) is read, as PyYAML, which "
    "modelzoo reads params files with, does: the keys under line 4 are not; merge the two into one",
  ]
  params = load_params(write(tmp_path, TWO_MODELS.replace("depth: 0", "depth: 1")))  # loads: the same notes
  assert [n for n in params.notes if "given twice" in n] == lines[1:]
  assert params.train_input.batch_size == 8 and params.model.hidden_size == 50  # the last values, as PyYAML
  in_a_list = REGISTERED.replace(
    "  learning_rate: 0.1\n",
    "  learning_rate:\n    - scheduler: Constant\n      learning_rate: 0.1\n      learning_rate: 0.2\n",
  ).replace("max_steps: 10", "max_steps: -1")
  text = error_of(write(tmp_path, in_a_list))
  assert "runconfig.max_steps" in text.splitlines()[0]
  assert "note: key 'optimizer.learning_rate[0].learning_rate' is given twice (lines 9 and 10)" in text
  assert "given twice" not in error_of(write(tmp_path, MINIMAL.replace("max_steps: 10", "max_steps: -1")))


def test_unreadable_and_empty_files(tmp_path: pathlib.Path) -> None:
  assert "cannot read the params file" in error_of(tmp_path / "missing.yaml")
  assert "the params file is empty" in error_of(write(tmp_path, "# nothing\n"))
  assert "is a list, not a mapping" in error_of(write(tmp_path, "- 1\n"))


def test_several_problems_one_per_line(tmp_path: pathlib.Path) -> None:
  path = write(
    tmp_path, REGISTERED.replace("batch_size: 8", "batch_size: -1").replace("SGD", "SDG") + "  sed: 1\n"
  )
  text = error_of(path)
  lines = text.splitlines()
  assert lines[0] == f"{path}: 3 problems:"
  assert len(lines) == 4 and all(line.startswith("  line ") for line in lines[1:])
  assert "did you mean 'seed'?" in text and "did you mean 'SGD'?" in text


def test_format_config_error() -> None:
  with pytest.raises(ConfigError) as info:
    load_params(FC, ["runconfig.max_stesp=1"])
  out = format_config_error(info.value)
  assert out.startswith("error: ") and "max_steps" in out and "Traceback" not in out
  assert format_config_error(ValueError("x")) == "error: ValueError: x"


# --- registered schemas ---------------------------------------------------------------------------


class _TinyModel(ModelConfig):
  model_config = ConfigDict(extra="forbid")
  depth: int = 2
  hidden_size: int = 8


class _TinyInput(InputConfig):
  model_config = ConfigDict(extra="forbid")
  image_size: int = 28


def test_registered_model_schema_closes_the_section(tmp_path: pathlib.Path) -> None:
  register_model_schema("tiny", _TinyModel)
  register_input_schema("TinyProcessor", _TinyInput)
  try:
    path = write(
      tmp_path, MINIMAL.replace("  batch_size: 8\n", "  batch_size: 8\n  data_processor: TinyProcessor\n")
    )
    p = load_params(path, ["model.depth=4"])
    assert isinstance(p.model, _TinyModel) and p.model.depth == 4 and isinstance(p.train_input, _TinyInput)
    text = error_of(path, ["model.dept=4", "train_input.image_sise=3"])
    assert "model.dept" in text and "did you mean 'depth'?" in text and "did you mean 'image_size'?" in text
  finally:
    unregister_schema("tiny")
    unregister_schema("TinyProcessor")
  assert load_params(write(tmp_path, MINIMAL), ["model.dept=4"]).model.model_extra == {"dept": 4}


def test_fixtures_are_plain_yaml() -> None:
  for name in EXAMPLES:
    assert isinstance(yaml.safe_load((DATA / name).read_text()), dict)


# --- issue 13: the config builds the runtime; every key it accepts works ---------------------------

MNIST = """\
train_input:
  data_processor: MNISTDataProcessor
  batch_size: 8
model:
  name: fc_mnist
optimizer:
  optimizer_type: SGD
  learning_rate: 0.1
runconfig:
  max_steps: 10
"""


def test_empty_and_list_files_with_overrides_say_so(tmp_path: pathlib.Path) -> None:
  """Overrides on an empty or a list file used to report a key path inside it."""
  empty = error_of(write(tmp_path, "# nothing\n"), ["runconfig.max_steps=10"])
  assert "the params file is empty" in empty and "has no key" not in empty
  listed = error_of(write(tmp_path, "- 1\n- 2\n", "list.yaml"), ["runconfig.max_steps=10"])
  assert "is a list, not a mapping" in listed and "no element" not in listed


def test_schedule_errors_carry_the_file_line(tmp_path: pathlib.Path) -> None:
  """A bad scheduler used to pass validation and fail when the run built the optimizer."""
  text = MINIMAL.replace(
    "learning_rate: 0.1", "learning_rate:\n    scheduler: Linear\n    initial_learning_rate: 1.0"
  )
  message = error_of(write(tmp_path, text))
  assert "line 7: optimizer.learning_rate: LinearLR: missing required key" in message, message


def test_misspelled_input_keys_are_errors_with_a_suggestion(tmp_path: pathlib.Path) -> None:
  """``train_input`` is validated by its data processor's strict schema (it used to keep any key)."""
  text = error_of(write(tmp_path, MNIST.replace("batch_size: 8", "batch_size: 8\n  shufle: true")))
  assert "line 4: train_input.shufle: unknown key 'shufle'; did you mean 'shuffle'?" in text, text
  text = error_of(write(tmp_path, MNIST.replace("batch_size: 8", "batch_size: 8\n  learning_rat: 0.1")))
  assert "train_input.learning_rat: unknown key 'learning_rat'" in text, text


def test_unknown_data_processor_is_an_error(tmp_path: pathlib.Path) -> None:
  text = error_of(write(tmp_path, MNIST.replace("MNISTDataProcessor", "MnistDataProcesor")))
  assert "train_input.data_processor: unknown data_processor 'MnistDataProcesor'" in text, text
  assert "did you mean 'MNISTDataProcessor'?" in text


def test_grad_accum_steps_other_than_one_is_refused() -> None:
  text = error_of(MINIMAL_WITH("grad_accum_steps: 4"))
  assert "optimizer.grad_accum_steps: gradient accumulation is not emulated" in text, text


def MINIMAL_WITH(line: str) -> dict:
  data = yaml.safe_load(MINIMAL)
  key, value = line.split(": ")
  data["optimizer"][key] = yaml.safe_load(value)
  return data


def test_num_epochs_counts_the_dataloader_length_or_steps_per_epoch() -> None:
  data = MINIMAL_WITH("momentum: 0.0")
  data["runconfig"] = {"num_epochs": 2}
  rc = load_params(data).runconfig  # valid: the run's data source gives the epoch length
  assert rc.num_train_steps(dataloader_len=7) == 14
  with pytest.raises(ConfigError, match="runconfig.num_epochs: needs runconfig.steps_per_epoch"):
    rc.num_train_steps()  # a source that does not know its length
  data["runconfig"]["steps_per_epoch"] = 5
  assert load_params(data).runconfig.num_train_steps() == 10
  assert load_params(data).runconfig.num_train_steps(dataloader_len=7) == 10


def test_epsilon_overflow_tolerance_and_log_loss_scale_reach_the_runtime() -> None:
  """Keys that used to validate and then fail when the optimizer was built."""
  data = MINIMAL_WITH("optimizer_type: Adam")
  data["optimizer"].update(
    epsilon=1e-3, overflow_tolerance=0.25, log_loss_scale=True, loss_scaling_factor="dynamic"
  )
  data["model"] = {"name": "tiny", "fp16_type": "float16"}
  p = load_params(data)
  assert p.optimizer.epsilon_value == 1e-3
  tx, loss_scale = p.build_optimizer()
  assert loss_scale.overflow_tolerance == 0.25
  # eps reaches the update: with g = 1 the first Adam step is lr * 1 / (1 + eps)
  params = {"w": jnp.zeros((), jnp.float32)}
  updates, _ = tx.update({"w": jnp.ones((), jnp.float32)}, tx.init(params), params)
  np.testing.assert_allclose(float(updates["w"]), -0.1 / (1 + 1e-3), rtol=1e-6)


def test_asgd_is_an_error_naming_the_key() -> None:
  text = error_of(MINIMAL_WITH("optimizer_type: ASGD"))
  assert "optimizer.optimizer_type: ASGD (averaged SGD) is not implemented" in text, text


def test_every_optimizer_key_belongs_to_its_type() -> None:
  """SGD takes no betas: the union's SGD member rejects it (the old flat schema accepted it)."""
  data = MINIMAL_WITH("betas: [0.9, 0.95]")
  assert "optimizer.betas: unknown key 'betas'" in error_of(data)
  # switching the type on the command line: a key set to null is absent
  p = load_params(FC, ["optimizer.optimizer_type=AdamW", "optimizer.momentum=null"])
  assert p.optimizer.name == "adamw" and "momentum" not in type(p.optimizer).model_fields


@pytest.mark.parametrize("kind", OPTIMIZER_TYPES)
def test_every_optimizer_type_builds_and_descends(kind: str) -> None:
  """Every type the schema accepts builds under strict promotion and lowers a quadratic."""
  lr = {"Adadelta": 1.0, "Rprop": 0.01, "Adafactor": 0.5}.get(kind, 0.05)
  data = MINIMAL_WITH(f"optimizer_type: {kind}")
  data["optimizer"]["learning_rate"] = lr
  tx, _ = load_params(data).build_optimizer()
  target = jnp.asarray([1.0, -2.0, 0.5], jnp.float32)
  loss = lambda p: jnp.sum(jnp.square(p["w"] - target))
  params = {"w": jnp.full((3,), 0.25, jnp.float32)}  # not 0: Adafactor scales steps by the parameters' RMS
  state = tx.init(params)

  @jax.jit
  def step(params, state):
    updates, state = tx.update(jax.grad(loss)(params), state, params)
    return optax.apply_updates(params, updates), state

  start = float(loss(params))
  for _ in range(30):
    params, state = step(params, state)
  assert params["w"].dtype == jnp.float32
  assert float(loss(params)) < 0.9 * start, (kind, float(loss(params)))


def test_cbfloat16_rule_lives_where_the_loss_scale_is_built() -> None:
  data = MINIMAL_WITH("loss_scaling_factor: 1.0")
  data["model"] = {"name": "tiny", "fp16_type": "cbfloat16"}
  text = error_of(data)
  assert "optimizer.loss_scaling_factor: cbfloat16 requires dynamic loss scaling" in text, text


def test_wafer_names_no_model_package() -> None:
  """Models are plugins found through the ``wafer.models`` entry point; wafer imports none by name."""
  import ast

  from wafer import registry

  root = pathlib.Path(__file__).resolve().parents[2] / "wafer"
  for path in root.rglob("*.py"):
    for node in ast.walk(ast.parse(path.read_text())):
      names = (
        [a.name for a in node.names]
        if isinstance(node, ast.Import)
        else [node.module or ""]
        if isinstance(node, ast.ImportFrom)
        else []
      )
      assert not any(n == "models" or n.startswith("models.") for n in names), (path, names)
  assert not hasattr(registry, "PLUGIN_PACKAGES")
  assert {"bert", "gpt2", "gpt3", "fc_mnist", "mlp_example"} <= set(registry.registered())


def test_wafer_holds_no_models_data_code() -> None:
  """BERT MLM/NSP, GPT windows and MNIST data live next to their models, not in ``wafer`` (issue 13).

  ``wafer`` outside the cost model (which estimates named workloads) defines no module, function,
  class or module-level name for one model family's data: no processor names, feature builders or
  file lists. The shared BPE tokenizer trainer ``train_bert_tokenizer`` is the one named exception.
  """
  import ast
  import re

  family = re.compile(r"bert|gpt|mnist", re.IGNORECASE)
  allowed = {"train_bert_tokenizer"}
  root = pathlib.Path(__file__).resolve().parents[2] / "wafer"
  found = []
  for path in root.rglob("*.py"):
    if "costmodel" in path.relative_to(root).parts:
      continue
    if family.search(path.stem):
      found.append(str(path))
      continue
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        names = [node.name]
      elif isinstance(node, ast.Assign):
        names = [t.id for t in node.targets if isinstance(t, ast.Name)]
      elif isinstance(node, ast.Constant) and isinstance(node.value, str):
        names = [node.value] if re.fullmatch(r"\w+DataProcessor", node.value) else []
      else:
        names = []
      found += [f"{path}:{node.lineno}: {n}" for n in names if family.search(n) and n not in allowed]
  assert not found, found


def test_a_null_override_restores_the_default_of_a_key_that_takes_no_null() -> None:
  assert load_params(FC, ["optimizer.momentum=0.7"]).optimizer.momentum == 0.7
  assert load_params(FC, ["optimizer.momentum=0.7", "optimizer.momentum=null"]).optimizer.momentum == 0.0
  micro = load_params(FC, ["train_input.micro_batch_size=null"]).train_input.micro_batch_size
  assert micro is None  # null is one of micro_batch_size's values
  with pytest.raises(ConfigError, match="train_input.batch_size .*required key is missing"):
    load_params(FC, ["train_input.batch_size=null"])


def test_a_model_vocabulary_smaller_than_the_datas_is_refused_before_any_work():
  """``--validate_only model.vocab_size=100`` passed; the run then stopped at the first token id
  >= 100. Both sizes are in the file: the check needs no data. One problem, however many sections."""
  path = pathlib.Path(__file__).resolve().parents[2] / "models/bert/configs/params_bert_tiny_default.yaml"
  with pytest.raises(ConfigError) as info:
    load_params(path, ["model.vocab_size=100"])
  text = str(info.value)
  assert text.count("must be at least") == 1, text
  assert (
    "model.vocab_size (from override 'model.vocab_size=100'): must be at least train_input.vocab_size" in text
  )
  assert (
    load_params(path, ["model.vocab_size=9000"]).model.vocab_size == 9000
  )  # a larger model vocabulary is fine


@pytest.mark.parametrize(
  ("written", "suggested"),
  [
    ("SST2DataProcessor", None),  # a BERT classifier's: not MNIST's, whose name shares only the ending
    ("MnistDataProcesor", "MNISTDataProcessor"),
    ("GptHDF5DataProcesor", "GptHDF5DataProcessor"),
    ("BertCSVDynamicMaskDataProcesor", "BertCSVDynamicMaskDataProcessor"),
  ],
)
def test_an_unknown_data_processor_is_matched_on_its_name_not_its_ending(written, suggested):
  from wafer.config.loader import _unknown_processor_message

  message = _unknown_processor_message(written)
  if suggested is None:
    assert "did you mean" not in message and "registered processors: " in message
  else:
    assert message.endswith(f"did you mean {suggested!r}?")


def test_a_moved_1x_key_is_named_as_written(tmp_path):
  """model.precision_opt_level (1.8) is validated as runconfig.precision_opt_level; its error named
  that key, at the line of the file's runconfig section."""
  text = error_of(write(tmp_path, REGISTERED), ["model.precision_opt_level=5"])
  assert (
    "model.precision_opt_level (from override 'model.precision_opt_level=5'): must be less than or equal to 2"
    in text
  )
  in_file = REGISTERED.replace("  name: mlp_example\n", "  name: mlp_example\n  precision_opt_level: 7\n")
  text = error_of(write(tmp_path, in_file, "moved.yaml"))
  assert "line 5: model.precision_opt_level: must be less than or equal to 2 (got 7)" in text, text


@pytest.mark.parametrize("key", ["drop_last_batch", "drop_last"])
def test_an_eval_input_that_keeps_a_partial_batch_is_refused_at_load(tmp_path, key):
  """It passed --validate_only, trained, then failed at the first eval on the smaller last batch
  (the eval step is compiled for batch_size rows). Train modes that read no eval_input do not care."""
  text = error_of(
    FC,
    [f"eval_input.{key}=false", "eval_input.drop_last_batch=null"]
    if key == "drop_last"
    else [f"eval_input.{key}=false"],
    mode="train_and_eval",
  )
  assert (
    f"eval_input.{key} (from override 'eval_input.{key}=false'): must be true: the eval step is a static graph"
    in text
  ), text
  assert load_params(
    FC,
    [f"eval_input.{key}=false"] + (["eval_input.drop_last_batch=null"] if key == "drop_last" else []),
    mode="train",
  )


def test_an_override_problem_names_the_override_the_user_typed_and_the_path_inside_a_list():
  """An emptied key's problem named the file's line; a --model_dir under ``runconfig=3`` named the override
  the flag made; a scheduler's unknown key named the whole list (optimizer.learning_rate)."""
  text = error_of(FC, ["runconfig.max_steps="])
  assert "runconfig (from override 'runconfig.max_steps='): One of num_epochs" in text and "line" not in text
  flag = literal_override("runconfig.model_dir", "md")
  text = error_of(FC, ["runconfig=3", flag], flags={flag: "--model_dir md"})
  assert (
    "runconfig (from override 'runconfig=3'): is not a mapping, so it has no key 'model_dir' (--model_dir md"
    in text
  )
  text = error_of(DATA / "bert_base_MSL128.yaml", ["optimizer.learning_rate.-1.total_iter=1"])
  assert (
    "optimizer.learning_rate[1].total_iter (from override 'optimizer.learning_rate.-1.total_iter=1'): "
    in text
  )
  assert "unknown key 'total_iter'. Did you mean 'total_iters'?" in text and text.endswith("(got 1)")
