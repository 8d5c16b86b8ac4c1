"""docs/guides/modelzoo-params.md prints the loader's tables (wafer/config/modelzoo.py): they must agree."""

import pathlib

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
