"""Copy the params files of ``manifest.json`` from Cerebras' public modelzoo, unchanged.

The files were copied with this script from a clone of https://github.com/Cerebras/modelzoo (all
release tags):

  python tests/data/modelzoo/copy_files.py /path/to/modelzoo   # a clone (bare or not)
  python tests/data/modelzoo/copy_files.py --check /path/to/modelzoo   # the copies match their blobs

Each entry of ``FILES`` is ``(tag, path in the repository, local name under <tag>/)``; the script writes
the file as ``git show TAG:PATH`` gives it and records its blob sha and public URL in ``manifest.json``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
URL = "https://github.com/Cerebras/modelzoo/blob/{tag}/{path}"

_PT = "modelzoo/transformers/pytorch"
_TF = "modelzoo/transformers/tf"
_NLP = "src/cerebras/modelzoo/models/nlp"


def _legacy(tag: str, root: str, names: list[str]) -> list[tuple[str, str, str]]:
  return [
    (tag, f"{root}/{n}", n.replace("configs/", "").replace("sparsity/pretraining/", "sparsity/"))
    for n in names
  ]


FILES: list[tuple[str, str, str]] = [
  *_legacy(
    "R_1.6.0",
    _PT,
    [
      "bert/configs/bert_base_msl128.yaml",
      "bert/configs/bert_base_msl512.yaml",
      "bert/configs/bert_large_msl128.yaml",
      "bert/configs/bert_large_msl512.yaml",
      "bert/configs/roberta_base.yaml",
      "gpt2/configs/params_gpt2_small.yaml",
      "gpt2/configs/params_gpt2_medium.yaml",
      "gpt2/configs/params_gpt2_large.yaml",
    ],
  ),
  ("R_1.6.0", "modelzoo/fc_mnist/pytorch/configs/params.yaml", "fc_mnist/params.yaml"),
  ("R_1.6.0", "modelzoo/fc_mnist/tf/configs/params.yaml", "fc_mnist_tf/params.yaml"),
  ("R_1.6.0", f"{_TF}/bert/configs/params_bert_base_msl128.yaml", "tf/params_bert_base_msl128.yaml"),
  ("R_1.6.0", f"{_TF}/gpt3/configs/params_gpt3_xl_ws.yaml", "tf/params_gpt3_xl_ws.yaml"),
  *_legacy("R_1.7.0", _PT, ["gpt3/configs/params_gpt3_6p7b.yaml"]),
  *_legacy("R_1.7.1", _PT, ["gpt3/configs/params_gpt3_xl.yaml", "bert/configs/bert_base_MSL128.yaml"]),
  *_legacy(
    "Release_1.8.0",
    _PT,
    [
      "bert/configs/bert_base_MSL128.yaml",
      "bert/configs/bert_base_MSL512.yaml",
      "bert/configs/bert_large_MSL128.yaml",
      "bert/configs/bert_large_MSL512.yaml",
      "gpt2/configs/params_gpt2_small.yaml",
      "gpt2/configs/params_gpt2_xl.yaml",
      "gpt3/configs/params_gpt3_xl.yaml",
      "gpt3/configs/params_gpt3_20b.yaml",
      "gpt3/configs/Cerebras_GPT/111m.yaml",
    ],
  ),
  ("Release_1.8.0", "modelzoo/fc_mnist/pytorch/configs/params.yaml", "fc_mnist/params.yaml"),
  *_legacy(
    "Release_1.9.1",
    _PT,
    [
      "bert/configs/bert_base_MSL128.yaml",
      "bert/configs/bert_large_MSL512.yaml",
      "bert/configs/bert_large_MSL10k_preview.yaml",
      "gpt2/configs/params_gpt2_small.yaml",
      "gpt2/configs/params_gpt2_large.yaml",
      "gpt3/configs/params_gpt3_111m.yaml",
      "gpt3/configs/params_gpt3_13b.yaml",
      "gpt3/configs/Cerebras_GPT/1p3b.yaml",
      "gpt3/configs/Cerebras_GPT/111m_mup.yaml",
    ],
  ),
  ("Release_1.9.1", "modelzoo/fc_mnist/pytorch/configs/params.yaml", "fc_mnist/params.yaml"),
  *_legacy(
    "Release_2.1.1",
    _PT,
    [
      "bert/configs/bert_base_MSL512.yaml",
      "bert/configs/roberta_base.yaml",
      "bert/configs/bert_large_MSL128.yaml",
      "gpt2/configs/params_gpt2_medium.yaml",
      "gpt3/configs/params_gpt3_256m.yaml",
      "gpt3/configs/params_gpt3_6p7b.yaml",
      "gpt3/configs/Cerebras_GPT/2p7b.yaml",
      "gpt3/configs/sparsity/pretraining/params_gpt3_125m_rigl75.yaml",
    ],
  ),
  ("Release_2.1.1", "modelzoo/fc_mnist/pytorch/configs/params.yaml", "fc_mnist/params.yaml"),
  *_legacy("Release_2.2.1", _NLP, ["bert/configs/bert_base_MSL128.yaml"]),
  *_legacy(
    "Release_2.3.1",
    _NLP,
    [
      "bert/configs/bert_base_MSL128.yaml",
      "bert/configs/bert_large_MSL512.yaml",
      "gpt2/configs/params_gpt2_small.yaml",
      "gpt2/configs/params_gpt2_xl.yaml",
      "gpt3/configs/params_gpt3_xl.yaml",
      "gpt3/configs/params_gpt3_2p7b.yaml",
      "gpt3/configs/params_gpt3_6p7b.yaml",
      "gpt3/configs/params_gpt3_13b.yaml",
      "gpt3/configs/params_gpt3_20b.yaml",
      "gpt3/configs/Cerebras_GPT/590m.yaml",
      "gpt3/configs/muP/params_gpt3_40M.yaml",
    ],
  ),
  ("Release_2.3.1", "src/cerebras/modelzoo/fc_mnist/pytorch/configs/params.yaml", "fc_mnist/params.yaml"),
  *_legacy(
    "Release_2.4.3",
    _NLP,
    [
      "bert/configs/bert_base_MSL128.yaml",
      "bert/configs/bert_large_MSL512.yaml",
      "bert/configs/bert_large_MSL512_muP.yaml",
      "gpt3/configs/Cerebras_GPT/111m.yaml",
      "gpt3/configs/Cerebras_GPT/6p7b.yaml",
      "gpt3/configs/Cerebras_GPT/256m_mup.yaml",
      "gpt3/configs/sparsity/pretraining/params_gpt3_125m_static75.yaml",
    ],
  ),
  *_legacy("Release_2.6.0", _NLP, ["gpt3/configs/Cerebras_GPT/111m.yaml"]),
  (
    "Release_2.6.0",
    "src/cerebras/modelzoo/models/vision/fc_mnist/configs/params.yaml",
    "fc_mnist/params.yaml",
  ),
  *_legacy(
    "Release_2.10.0",
    _NLP,
    [
      "bert/configs/bert_base_MSL128.yaml",
      "bert/configs/bert_large_MSL512.yaml",
      "bert/configs/roberta_large.yaml",
      "gpt3/configs/params_gpt3_xl.yaml",
      "gpt3/configs/Cerebras_GPT/111m.yaml",
      "gpt3/configs/Cerebras_GPT/13b_bs720.yaml",
      "gpt3/configs/Cerebras_GPT/1p3b_mup.yaml",
      "gpt3/configs/muP/params_gpt3_111M.yaml",
      "bert/configs/bert_large_MSL512_muP.yaml",
      "gpt3/configs/sparsity/pretraining/params_gpt3_125m_set75.yaml",
    ],
  ),
  (
    "Release_2.10.0",
    "src/cerebras/modelzoo/models/vision/fc_mnist/configs/params.yaml",
    "fc_mnist/params.yaml",
  ),
  (
    "Release_2.10.0",
    "src/cerebras/modelzoo/models/vision/fc_mnist/configs/params_cszoov2.yaml",
    "fc_mnist/params_cszoov2.yaml",
  ),
]


def _git(repo: str, *args: str) -> str:
  return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True, text=True).stdout


def main(argv: list[str]) -> int:
  check = "--check" in argv
  repo = [a for a in argv if a != "--check"][0]
  entries = []
  bad = 0
  for tag, path, local in FILES:
    blob = _git(repo, "rev-parse", f"{tag}:{path}").strip()
    text = _git(repo, "cat-file", "blob", blob)
    target = HERE / tag / local
    if check:
      if target.read_text(encoding="utf-8") != text:
        print(f"differs: {target}")
        bad += 1
    else:
      target.parent.mkdir(parents=True, exist_ok=True)
      target.write_text(text, encoding="utf-8")
    entries.append(
      {
        "file": f"{tag}/{local}",
        "tag": tag,
        "path": path,
        "blob": blob,
        "url": URL.format(tag=tag, path=path),
      }
    )
  if not check:
    license_text = _git(repo, "show", "Release_2.10.0:LICENSE")
    (HERE / "LICENSE").write_text(license_text, encoding="utf-8")
    (HERE / "manifest.json").write_text(json.dumps(entries, indent=1) + "\n", encoding="utf-8")
  print(f"{len(entries)} files {'checked' if check else 'copied'}, {bad} differ")
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
