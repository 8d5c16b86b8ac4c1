"""docs/guides/modelzoo-params.md prints the loader's tables (wafer/config/modelzoo.py): they must agree."""

import pathlib

import pytest

from wafer.config.modelzoo import FEATURES, IGNORED, RENAMED, ignored_table

DOC = (pathlib.Path(__file__).parents[2] / "docs" / "guides" / "modelzoo-params.md").read_text()


def test_the_ignored_table_is_the_codes():
  assert ignored_table() in DOC  # regenerate: print(wafer.config.modelzoo.ignored_table())
  rows = [line for line in DOC.splitlines() if line.startswith("| `") and line.count("|") == 3]
  documented = {line.split("`")[1]: line.split("|")[2].strip() for line in rows}
  for (section, key), why in IGNORED.items():
    assert documented.get(f"{section}.{key}") == why
  assert len([k for k in documented if "." in k and k.split(".")[0] in {s for s, _ in IGNORED}]) >= len(
    IGNORED
  )


def test_renamed_and_refused_keys_are_documented():
  for rename in RENAMED:
    assert f"`{rename.source[0]}.{rename.source[1]}`" in DOC and rename.why in DOC
  for feature, keys in FEATURES.items():
    assert feature in DOC
    for section, key in keys:
      assert f"`{section + '.' if section else ''}{key}`" in DOC


def _with_worker_cache(tmp_path, model_name):
  import pathlib

  import yaml

  root = pathlib.Path(__file__).parents[2]
  src = yaml.safe_load((root / "tests/data/modelzoo/Release_2.10.0/gpt3/params_gpt3_xl.yaml").read_text())
  src["trainer"]["fit"]["train_dataloader"]["use_worker_cache"] = True
  src["trainer"]["init"]["model"]["name"] = model_name
  path = tmp_path / "params.yaml"
  path.write_text(yaml.safe_dump(src))
  return str(path)


@pytest.mark.slow  # about 9 s: two estimates of real files; .ci/run runs the slow tests
def test_use_worker_cache_is_ignored_and_an_unknown_model_is_named_first(tmp_path, capsys):
  """Modelzoo 2.4+ dataloaders set ``use_worker_cache`` (a cluster performance flag): ignored with a
  note, so a file of a model this project does not have (BTLM, JAIS) says that first, not
  "unknown key 'use_worker_cache'" (probe 2)."""
  from wafer.cli import main

  assert main(["estimate", "--params", _with_worker_cache(tmp_path, "gpt3")]) == 0
  assert "use_worker_cache" in capsys.readouterr().err  # named among the ignored keys
  assert main(["estimate", "--params", _with_worker_cache(tmp_path, "btlm")]) != 0
  err = capsys.readouterr().err
  assert "unknown model 'btlm'" in err and "unknown key 'use_worker_cache'" not in err


def test_a_file_read_as_another_model_says_so_before_its_problems(tmp_path):
  """A legacy file has no model.name: its data processor makes it gpt2, and a key of another model then
  reads as a gpt2 mistake. The error says first how the file was read and that its model may not be
  available (probe 2). (A LLaMA file's rotary and swiglu refuse it as another model's: probe 23b.)"""
  from wafer.config import load_params
  from wafer.errors import ConfigError

  path = tmp_path / "params_llama.yaml"
  path.write_text(
    "train_input:\n  data_processor: GptHDF5MapDataProcessor\n  batch_size: 8\n"
    "model:\n  hidden_size: 64\n  num_hidden_layers: 2\n  num_heads: 2\n  filter_size: 128\n"
    "  vocab_size: 100\n  max_position_embeddings: 64\n  position_embedding_type: fixed\n"
    "optimizer:\n  optimizer_type: adamw\n  learning_rate: 1.0e-4\n"
    "runconfig:\n  max_steps: 2\n"
  )
  with pytest.raises(ConfigError) as info:
    load_params(str(path))
  first = info.value.problems[0]
  assert first.loc == ("model", "name") and "not set: using 'gpt2'" in first.message
  assert "not available here (registered models: " in first.message
  assert any(p.loc == ("model", "position_embedding_type") for p in info.value.problems[1:])
  path.write_text(path.read_text().replace("fixed", "rotary"))
  with pytest.raises(ConfigError) as info:
    load_params(str(path))
  (only,) = info.value.problems
  assert (
    only.loc == ("model",) and "rotary position embeddings: model.position_embedding_type" in only.message
  )
