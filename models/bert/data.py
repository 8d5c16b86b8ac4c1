"""BERT MLM+NSP features: example creation, and modelzoo-style pre-tokenised HDF5 and CSV.

Features of one example (``MSL`` = max sequence length, ``MMP`` = max masked positions):

======================  ===========  =======  ============================================
key                     shape        dtype    meaning
======================  ===========  =======  ============================================
input_ids               [MSL]        int32    ``[CLS] A [SEP] B [SEP]``, padded with 0
attention_mask          [MSL]        int32    1 on tokens, 0 on padding
token_type_ids          [MSL]        int32    0 for ``[CLS] A [SEP]``, 1 for ``B [SEP]``
masked_lm_positions     [MMP]        int32    positions of the masked tokens, padded with 0
masked_lm_labels        [MMP]        int32    original token ids there, padded with 0
masked_lm_weights       [MMP]        float32  1.0 for a real prediction, 0.0 for padding
next_sentence_label     []           int32    1 if B is a random sentence, 0 if it follows A
======================  ===========  =======  ============================================

**HDF5 layout read and written here**: one file, one dataset per feature at the root, named as
above, first axis = examples (``input_ids`` has shape ``[N, MSL]`` and so on). Extra datasets
are ignored; a missing one is an error naming the file and the keys found.

**CSV layout**: a header row with the feature names above; one row per example; a sequence
feature is a list of integers written either space-separated (``101 7592 102``) or as a JSON
list (``[101, 7592, 102]``). This is what modelzoo's BERT CSV data processor reads.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import ConfigDict, field_validator, model_validator

from wafer.config import InputConfig
from wafer.config.schema import PosInt
from wafer.data import text
from wafer.data.processors import data_dir, text_split
from wafer.data.sources import Features, announce, as_int32, cached_features, pretokenised

FEATURES = (
  "input_ids",
  "attention_mask",
  "token_type_ids",
  "masked_lm_positions",
  "masked_lm_labels",
  "masked_lm_weights",
  "next_sentence_label",
)
_FLOAT_FEATURES = ("masked_lm_weights",)


def example_spec(msl: int, mmp: int | None = None) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
  """``{feature: (shape, dtype)}`` of one example at max sequence length ``msl`` (the table above),
  ``mmp`` masked positions (default :func:`max_predictions`).

  >>> example_spec(128)["masked_lm_positions"]
  ((20,), dtype('int32'))
  >>> example_spec(10256, 1538)["masked_lm_labels"]
  ((1538,), dtype('int32'))
  """
  mmp = max_predictions(msl) if mmp is None else mmp
  shapes = {"masked_lm_positions": (mmp,), "masked_lm_labels": (mmp,), "masked_lm_weights": (mmp,)}
  shapes["next_sentence_label"] = ()
  return {
    k: (shapes.get(k, (msl,)), np.dtype(np.float32 if k in _FLOAT_FEATURES else np.int32)) for k in FEATURES
  }


def max_predictions(msl: int, mask_rate: float = 0.15) -> int:
  """``MMP`` for a sequence length: modelzoo's usual 20 at MSL128 and 80 at MSL512."""
  return max(1, int(round(msl * mask_rate)) + 1) if msl not in (128, 512) else {128: 20, 512: 80}[msl]


def create_mlm_nsp_examples(
  documents: Sequence[Sequence[Sequence[int]]],
  *,
  msl: int,
  vocab_size: int,
  cls_id: int,
  sep_id: int,
  mask_id: int,
  num_special: int,
  seed: int = 0,
  mask_rate: float = 0.15,
  mmp: int | None = None,
  dupe_factor: int = 1,
  short_seq_prob: float = 0.1,
) -> dict[str, np.ndarray]:
  """BERT pre-training examples (as Google's ``create_pretraining_data.py``) from tokenised text.

  Sentence pairs: ``A`` is one or more consecutive sentences of a document; ``B`` continues it
  (``next_sentence_label = 0``) or, with probability 1/2, comes from another document (1).
  ``mask_rate`` of the non-special tokens (at least one, at most ``mmp``) are predicted; of those,
  80% become ``[MASK]``, 10% a random non-special token and 10% stay as they are.

  Args:
    documents: documents, each a list of sentences, each a list of token ids.
    msl: max sequence length.
    vocab_size: tokenizer vocabulary size (random replacements are drawn from
      ``[num_special, vocab_size)``).
    cls_id, sep_id, mask_id: special token ids.
    num_special: ids below this are special tokens.
    seed: seed of the pairing and masking.
    mask_rate: fraction of tokens predicted.
    mmp: max masked positions (default :func:`max_predictions`).
    dupe_factor: passes over the corpus, each with different pairs and masks.
    short_seq_prob: probability of a shorter target length (as in the reference script).

  Returns:
    The features in the table of this module, stacked over examples.
  """
  if msl < 8:
    raise ValueError(f"msl must be at least 8 (got {msl})")
  mmp = max_predictions(msl, mask_rate) if mmp is None else mmp
  docs = [[list(s) for s in d if len(s) > 0] for d in documents]
  docs = [d for d in docs if d]
  if len(docs) < 2:
    raise ValueError(f"need at least 2 non-empty documents for next-sentence pairs (got {len(docs)})")
  rng = np.random.default_rng(seed)
  max_tokens = msl - 3
  rows: list[tuple[list[int], list[int], int]] = []
  for _ in range(dupe_factor):
    for d_idx, doc in enumerate(docs):
      target = max_tokens if rng.random() >= short_seq_prob else int(rng.integers(2, max_tokens + 1))
      chunk: list[list[int]] = []
      length = 0
      i = 0
      while i < len(doc):
        chunk.append(doc[i])
        length += len(doc[i])
        if i == len(doc) - 1 or length >= target:
          a_end = int(rng.integers(1, len(chunk))) if len(chunk) >= 2 else 1
          a = [t for s in chunk[:a_end] for t in s]
          if len(chunk) == 1 or rng.random() < 0.5:
            is_random = 1
            other = int(rng.integers(0, len(docs) - 1))
            other += other >= d_idx
            rdoc = docs[other]
            start = int(rng.integers(0, len(rdoc)))
            b = [t for s in rdoc[start:] for t in s][: max(1, target - len(a))]
            i -= len(chunk) - a_end  # put back the unused sentences
          else:
            is_random = 0
            b = [t for s in chunk[a_end:] for t in s]
          while len(a) + len(b) > max_tokens:  # truncate the longer side, from the front or the back
            side = a if len(a) > len(b) else b
            del side[0 if rng.random() < 0.5 else -1]
          if a and b:
            rows.append((a, b, is_random))
          chunk, length = [], 0
        i += 1
  n = len(rows)
  out = {
    "input_ids": np.zeros((n, msl), np.int32),
    "attention_mask": np.zeros((n, msl), np.int32),
    "token_type_ids": np.zeros((n, msl), np.int32),
    "masked_lm_positions": np.zeros((n, mmp), np.int32),
    "masked_lm_labels": np.zeros((n, mmp), np.int32),
    "masked_lm_weights": np.zeros((n, mmp), np.float32),
    "next_sentence_label": np.zeros((n,), np.int32),
  }
  for r, (a, b, is_random) in enumerate(rows):
    tokens = np.array([cls_id, *a, sep_id, *b, sep_id], np.int32)
    length = len(tokens)
    out["token_type_ids"][r, len(a) + 2 : length] = 1
    out["attention_mask"][r, :length] = 1
    out["next_sentence_label"][r] = is_random
    candidates = np.flatnonzero(tokens >= num_special)
    num = min(mmp, max(1, int(round(length * mask_rate))), len(candidates))
    pos = np.sort(rng.choice(candidates, size=num, replace=False))
    labels = tokens[pos].copy()
    u = rng.random(num)
    tokens[pos[u < 0.8]] = mask_id
    rand = pos[u >= 0.9]
    tokens[rand] = rng.integers(num_special, vocab_size, size=len(rand))
    out["input_ids"][r, :length] = tokens
    out["masked_lm_positions"][r, :num] = pos
    out["masked_lm_labels"][r, :num] = labels
    out["masked_lm_weights"][r, :num] = 1.0
  return out


def _check(features: dict[str, np.ndarray], where: str) -> dict[str, np.ndarray]:
  missing = [k for k in FEATURES if k not in features]
  if missing:
    raise ValueError(
      f"{where}: missing BERT features {missing}; found {sorted(features)}; expected {list(FEATURES)}"
    )
  return {
    k: np.asarray(features[k], np.float32) if k in _FLOAT_FEATURES else as_int32(features[k], k, where)
    for k in FEATURES
  }


def write_hdf5(path: str | os.PathLike, features: dict[str, np.ndarray]) -> None:
  """Write BERT features in the HDF5 layout of this module."""
  import h5py

  feats = _check(features, str(path))
  with h5py.File(path, "w") as f:
    for k, v in feats.items():
      f.create_dataset(k, data=v)


def read_hdf5(path: str | os.PathLike) -> dict[str, np.ndarray]:
  """Read BERT features from one HDF5 file (layout in the module docstring) into memory."""
  import h5py

  if not os.path.isfile(path):
    raise FileNotFoundError(f"BERT HDF5 file not found: {path}")
  with h5py.File(path, "r") as f:
    missing = [k for k in FEATURES if k not in f]
    if missing:
      raise ValueError(
        f"{path}: missing HDF5 datasets {missing}; found {sorted(f.keys())}; "
        f"expected one dataset per feature: {list(FEATURES)}"
      )
    return _check({k: f[k][()] for k in FEATURES}, str(path))


def write_csv(path: str | os.PathLike, features: dict[str, np.ndarray]) -> None:
  """Write BERT features as CSV (sequences space-separated)."""
  feats = _check(features, str(path))
  with open(path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(FEATURES)
    for i in range(len(feats["input_ids"])):
      row = []
      for k in FEATURES:
        v = feats[k][i]
        row.append(" ".join(_fmt(x) for x in v) if v.ndim else _fmt(v))
      w.writerow(row)


def _fmt(x: np.generic) -> str:
  return repr(float(x)) if np.issubdtype(x.dtype, np.floating) else str(int(x))


def read_csv(path: str | os.PathLike) -> dict[str, np.ndarray]:
  """Read BERT features from a CSV file (layout in the module docstring)."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"BERT CSV file not found: {path}")
  cols: dict[str, list] = {k: [] for k in FEATURES}
  with open(path, newline="") as f:
    reader = csv.DictReader(f)
    missing = [k for k in FEATURES if k not in (reader.fieldnames or [])]
    if missing:
      raise ValueError(f"{path}: missing CSV columns {missing}; header has {reader.fieldnames}")
    for line, row in enumerate(reader, start=2):
      for k in FEATURES:
        text = row[k].strip()
        try:
          vals = json.loads(text) if text.startswith("[") else [float(x) for x in text.split()]
        except ValueError as e:
          raise ValueError(f"{path}:{line}: column {k!r}: not a list of numbers: {text[:60]!r}") from e
        cols[k].append(vals[0] if k == "next_sentence_label" and len(vals) == 1 else vals)
  lengths = {k: {len(v) for v in cols[k]} for k in FEATURES if k != "next_sentence_label"}
  ragged = {k: sorted(v) for k, v in lengths.items() if len(v) > 1}
  if ragged:
    raise ValueError(
      f"{path}: sequences of one column must all have the same length; lengths found: {ragged}"
    )
  return _check({k: np.array(v) for k, v in cols.items()}, str(path))


def read_features(data_dir: str | os.PathLike) -> dict[str, np.ndarray]:
  """Every ``*.h5``/``*.hdf5``/``*.csv`` file in ``data_dir`` (or that one file), concatenated."""
  path = os.fspath(data_dir)
  files = (
    [path]
    if os.path.isfile(path)
    else sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith((".h5", ".hdf5", ".csv")))
  )
  if not files:
    raise FileNotFoundError(f"no pre-tokenised BERT data (*.h5, *.hdf5, *.csv) in {path}")
  parts = [read_csv(f) if f.endswith(".csv") else read_hdf5(f) for f in files]
  return {k: np.concatenate([p[k] for p in parts]) for k in FEATURES}


# ----------------------------------------------------------------- sources (text, pre-tokenised, embedded)

CLS_ID, SEP_ID, MASK_ID, NUM_SPECIAL = 2, 3, 4, 5  # positions in wafer.data.text.SPECIAL_TOKENS


def bert_features_from_text(
  docs: list[str],
  *,
  msl: int,
  vocab_size: int,
  cache_dir: str | os.PathLike | None,
  seed: int = 0,
  dupe_factor: int = 1,
  split: str | None = None,
  mmp: int | None = None,
  lowercase: bool = True,
) -> dict[str, np.ndarray]:
  """Train (or load) BERT's tokenizer (`wafer.data.text.train_bert_tokenizer`) on ``docs``, then create MLM+NSP examples.

  The tokenizer is trained on all of ``docs``; the examples come from the documents of
  ``split`` (:func:`wafer.data.text.split_documents`; None: all). With a ``cache_dir`` the
  examples are cached there as HDF5 (keyed by the corpus hash, MSL, vocabulary size, seed,
  dupe factor, split and case), so a second run skips tokenisation. ``lowercase=False``: a cased
  tokenizer (modelzoo's ``do_lower: false``).
  """

  def build() -> dict[str, np.ndarray]:
    chosen = announce(docs, split, f"subword BPE, {vocab_size} ids", f"MSL-{msl} MLM+NSP", cache_dir)
    tok = text.train_bert_tokenizer(docs, vocab_size, cache_dir, lowercase=lowercase)
    return create_mlm_nsp_examples(
      text.tokenize_documents(tok, chosen),
      msl=msl,
      vocab_size=tok.get_vocab_size(),
      cls_id=CLS_ID,
      sep_id=SEP_ID,
      mask_id=MASK_ID,
      num_special=NUM_SPECIAL,
      seed=seed,
      dupe_factor=dupe_factor,
      mmp=mmp,
    )

  masked = "" if mmp is None or mmp == max_predictions(msl) else f"-p{mmp}"
  cased = "" if lowercase else "-cased"
  key = (
    f"bert-{text.corpus_hash(docs)}-msl{msl}{masked}{cased}-v{vocab_size}-s{seed}-d{dupe_factor}-"
    f"{split or 'all'}.h5"
  )
  return cached_features(cache_dir, key, read_hdf5, write_hdf5, build)


def bert_features(
  data_dir: str | os.PathLike | list[str] | None,
  *,
  msl: int,
  vocab_size: int = 8192,
  cache_dir: str | os.PathLike | None = None,
  seed: int = 0,
  dupe_factor: int = 1,
  split: str | None = None,
  mmp: int | None = None,
  lowercase: bool = True,
) -> dict[str, np.ndarray]:
  """BERT features from pre-tokenised HDF5/CSV, from text (.txt / .jsonl), or the embedded corpus (None).

  ``split`` (``train`` / ``eval`` / None) selects documents of a text corpus; pre-tokenised data
  is split by its files (point ``data_dir`` at the split's directory). A list of paths is one
  dataset, read in the list's order.
  """
  feats = pretokenised(data_dir, (".h5", ".hdf5", ".csv"), read_features, msl, split)
  if feats is not None:
    return feats
  return bert_features_from_text(
    text.read_documents(data_dir),
    msl=msl,
    vocab_size=vocab_size,
    cache_dir=cache_dir,
    seed=seed,
    dupe_factor=dupe_factor,
    split=split,
    mmp=mmp,
    lowercase=lowercase,
  )


# ----------------------------------------------------------------- the data processors' input schema

PROCESSORS = (
  "BertCSVDataProcessor",  # modelzoo 1.x-2.1: the pre-masked CSV layout above (static masking)
  "BertCSVDynamicMaskDataProcessor",
  "BertHDF5DataProcessor",
  "BertMLMNSPDataProcessor",
)


class BertInput(InputConfig):
  """``train_input`` / ``eval_input`` of the BERT processors (strict): pre-tokenised CSV/HDF5 in
  ``data_dir``; or .txt/.jsonl text there (tokenised and masked here); or, with no ``data_dir``, the
  embedded corpus. ``max_sequence_length`` defaults to the model's ``max_position_embeddings`` (the
  task sets it; 128 for a section used alone), ``vocab_size`` (of the tokenizer trained here) to the
  model's."""

  model_config = ConfigDict(extra="forbid")

  masked_lm_prob: float = 0.15
  max_predictions_per_seq: PosInt | None = None
  # do_lower: the tokenizer trained here on text lowercases (true) or keeps case (false: modelzoo's
  # RoBERTa files); pre-tokenised files are read as they are. Masking is of subwords.
  do_lower: bool = True
  whole_word_masking: bool = False

  @field_validator("masked_lm_prob", mode="after")
  @classmethod
  def _rate(cls, v: float) -> float:
    if v != 0.15:
      raise ValueError("only 0.15 is implemented (modelzoo's masking rate)")
    return v

  @field_validator("whole_word_masking", mode="after")
  @classmethod
  def _wwm(cls, v: bool) -> bool:
    if v:
      raise ValueError("whole-word masking is not implemented; set whole_word_masking: false")
    return v

  @model_validator(mode="after")
  def _mmp(self) -> BertInput:
    msl = self.max_sequence_length  # unset: the model's max_position_embeddings (checked there)
    if msl is not None and self.max_predictions_per_seq is not None and self.max_predictions_per_seq > msl:
      raise ValueError(
        f"max_predictions_per_seq={self.max_predictions_per_seq}: more masked positions than the "
        f"max_sequence_length {msl}; allowed: 1 to {msl} (default {max_predictions(msl)})"
      )
    return self

  @property
  def mmp(self) -> int:
    """Masked positions per example: ``max_predictions_per_seq``, else :func:`max_predictions`."""
    return self.max_predictions_per_seq or max_predictions(self.max_sequence_length or 128)

  def features(self, *, cache_dir: Any = None, seed: int = 0, eval_split: bool = False) -> Features:
    return bert_features(
      data_dir(self, many=True),
      msl=self.max_sequence_length or 128,
      vocab_size=self.vocab_size or 8192,
      cache_dir=cache_dir,
      seed=seed,
      split=text_split(self, eval_split),
      mmp=self.mmp,
      lowercase=self.do_lower,
    )

  def example_spec(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """The table in this module's docstring at ``max_sequence_length`` (default 128) and
    ``max_predictions_per_seq`` masked positions."""
    return example_spec(self.max_sequence_length or 128, self.mmp)
