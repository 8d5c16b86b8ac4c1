"""Inputs several test modules share: a small text corpus, the shipped BERT-base optimizer section, and the
overrides that shrink a real modelzoo file's model to run in seconds on the embedded data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
BERT_BASE_PARAMS = ROOT / "models" / "bert" / "configs" / "params_bert_base_MSL128.yaml"

SHRUNK = [
  "model.hidden_size=64",
  "model.num_heads=4",
  "model.filter_size=256",
  "model.num_hidden_layers=2",
  "train_input.data_dir=null",
  "eval_input.data_dir=null",
  "train_input.batch_size=4",
  "eval_input.batch_size=4",
]
"""Overrides that shrink a real modelzoo file's model (its other keys kept) to run in seconds on the
embedded data."""


def small_corpus() -> list[str]:
  """8 documents of 12 sentences each: enough text to train a tokenizer of a few hundred ids."""
  return [
    f"Document {d} begins here. "
    + " ".join(
      f"Sentence {i} of document {d} talks about topic {(i * d) % 7} and value {i + d}." for i in range(12)
    )
    for d in range(8)
  ]


def bert_base_optimizer() -> dict[str, Any]:
  """The ``optimizer:`` section of the shipped BERT-base params file (AdamW, linear warmup then decay)."""
  return yaml.safe_load(BERT_BASE_PARAMS.read_text())["optimizer"]
