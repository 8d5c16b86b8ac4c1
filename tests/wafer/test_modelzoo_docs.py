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
