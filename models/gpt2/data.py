"""GPT language-model features: example creation, and modelzoo's pre-tokenised GPT HDF5.

Features of one example (``MSL`` = max sequence length):

======================  ===========  =======  ============================================
key                     shape        dtype    meaning
======================  ===========  =======  ============================================
input_ids               [MSL]        int32    tokens ``t[i : i + MSL]`` of the token stream
labels                  [MSL]        int32    the next tokens, ``t[i + 1 : i + MSL + 1]``
attention_mask          [MSL]        int32    1 = the position counts in the loss
======================  ===========  =======  ============================================

**Examples** (:func:`create_lm_examples`): the documents, each followed by ``<|endoftext|>``,
are concatenated into one stream and cut into non-overlapping windows of ``MSL + 1`` tokens
(the incomplete tail is dropped); no padding, so ``attention_mask`` is all ones.

**HDF5 layout** (modelzoo's ``GptHDF5DataProcessor`` / ``GptHDF5MapDataProcessor``): one
dataset named ``data`` of shape ``[N, 3, MSL]``, integer; channel 0 is ``input_ids``, 1
``attention_mask`` (modelzoo's ``input_mask``), 2 ``labels``. Other datasets are ignored.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import ConfigDict

from wafer.config import InputConfig
from wafer.data import text
from wafer.data.processors import data_dir, text_split
from wafer.data.sources import Features, announce, as_int32, cached_features, pretokenised

FEATURES = ("input_ids", "attention_mask", "labels")  # in the order of the HDF5 channels
DATASET = "data"


def create_lm_examples(
  documents_token_ids: Sequence[Sequence[int]], *, msl: int, eot_id: int
) -> dict[str, np.ndarray]:
  """Next-token examples from tokenised documents (layout in the module docstring).

  Args:
    documents_token_ids: documents, each a list of token ids.
    msl: max sequence length (tokens per example).
    eot_id: the end-of-text id appended to every document.

  Returns:
    ``input_ids``, ``labels``, ``attention_mask``: int32 ``[N, msl]``, ``N = len(stream) // (msl + 1)``.
  """
  if msl < 1:
    raise ValueError(f"msl must be a positive integer (got {msl})")
  parts = [p for d in documents_token_ids for p in (np.asarray(d, np.int64).reshape(-1), np.array([eot_id]))]
  stream = np.concatenate(parts) if parts else np.zeros(0, np.int64)
  n = len(stream) // (msl + 1)
  if n == 0:
    raise ValueError(
      f"the corpus gives no examples: {len(stream)} tokens ({len(documents_token_ids)} documents, "
      f"an end-of-text token after each), but one example at msl={msl} needs {msl + 1}"
    )
  if stream.min() < 0 or stream.max() > np.iinfo(np.int32).max:
    raise ValueError(f"token ids must lie in [0, 2**31) (found {stream.min()}..{stream.max()})")
  windows = stream[: n * (msl + 1)].reshape(n, msl + 1).astype(np.int32)
  return {
    "input_ids": np.ascontiguousarray(windows[:, :-1]),
    "labels": np.ascontiguousarray(windows[:, 1:]),
    "attention_mask": np.ones((n, msl), np.int32),
  }


def _check(features: dict[str, np.ndarray], where: str) -> dict[str, np.ndarray]:
  missing = [k for k in FEATURES if k not in features]
  if missing:
    raise ValueError(
      f"{where}: missing GPT features {missing}; found {sorted(features)}; expected {list(FEATURES)}"
    )
  out = {k: np.asarray(features[k]) for k in FEATURES}
  shapes = {k: v.shape for k, v in out.items()}
  if len(set(shapes.values())) != 1 or out["input_ids"].ndim != 2:
    raise ValueError(f"{where}: GPT features must all have shape [N, MSL]; found {shapes}")
  return {k: as_int32(v, k, where) for k, v in out.items()}


def write_hdf5(path: str | os.PathLike, features: dict[str, np.ndarray]) -> None:
  """Write GPT features as modelzoo's HDF5: dataset ``data`` int32 ``[N, 3, MSL]``."""
  import h5py

  feats = _check(features, str(path))
  with h5py.File(path, "w") as f:
    f.create_dataset(DATASET, data=np.stack([feats[k] for k in FEATURES], axis=1))


def read_hdf5(path: str | os.PathLike) -> dict[str, np.ndarray]:
  """Read GPT features from one modelzoo GPT HDF5 file (layout in the module docstring) into memory."""
  import h5py

  if not os.path.isfile(path):
    raise FileNotFoundError(f"GPT HDF5 file not found: {path}")
  with h5py.File(path, "r") as f:
    if DATASET not in f or not isinstance(f[DATASET], h5py.Dataset):
      raise ValueError(
        f"{path}: no HDF5 dataset {DATASET!r}; found {sorted(f.keys())}; expected {DATASET!r} of "
        "shape [N, 3, MSL] (channels input_ids, input_mask, labels)"
      )
    ds = f[DATASET]
    if ds.ndim != 3 or ds.shape[1] != 3 or not np.issubdtype(ds.dtype, np.integer):
      raise ValueError(
        f"{path}: dataset {DATASET!r} has shape {list(ds.shape)} and dtype {ds.dtype}; expected an "
        "integer array of shape [N, 3, MSL] (channels input_ids, input_mask, labels)"
      )
    data = ds[()]
  return _check({k: data[:, i] for i, k in enumerate(FEATURES)}, str(path))


def read_features(data_dir: str | os.PathLike) -> dict[str, np.ndarray]:
  """Every ``*.h5``/``*.hdf5`` file in ``data_dir`` (or that one file), concatenated in name order."""
  path = os.fspath(data_dir)
  if os.path.isfile(path):
    files = [path]
  elif os.path.isdir(path):
    files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith((".h5", ".hdf5")))
  else:
    raise FileNotFoundError(f"GPT data not found: {path}")
  if not files:
    raise FileNotFoundError(f"no pre-tokenised GPT data (*.h5, *.hdf5) in {path}")
  parts = [read_hdf5(f) for f in files]
  lengths = {f: p["input_ids"].shape[1] for f, p in zip(files, parts)}
  if len(set(lengths.values())) != 1:
    raise ValueError(f"{path}: GPT HDF5 files differ in sequence length: {lengths}")
  return {k: np.concatenate([p[k] for p in parts]) for k in FEATURES}


# ----------------------------------------------------------------- sources (text, pre-tokenised, embedded)


def gpt_features_from_text(
  docs: list[str], *, msl: int, vocab_size: int, cache_dir: str | os.PathLike | None, split: str | None = None
) -> dict[str, np.ndarray]:
  """Train (or load) the byte-level BPE tokenizer on ``docs``, then create next-token examples.

  Token ids are ``< vocab_size`` (the requested size: the trainer may stop short of it on a small
  corpus), and ``<|endoftext|>`` (id :data:`text.EOT`) ends every document. The tokenizer is
  trained on all of ``docs``; the examples come from the documents of ``split``
  (:func:`wafer.data.text.split_documents`; None: all). With a ``cache_dir`` the examples are
  cached there as GPT HDF5, keyed by the corpus hash, MSL, vocabulary size and split.
  """

  def build() -> dict[str, np.ndarray]:
    chosen = announce(docs, split, f"byte-level BPE, {vocab_size} ids", f"MSL-{msl} next-token", cache_dir)
    tok = text.train_bpe(docs, vocab_size, cache_dir)
    ids = [e.ids for e in tok.encode_batch(chosen, add_special_tokens=False)]
    return create_lm_examples(ids, msl=msl, eot_id=text.EOT)

  key = f"gpt-{text.corpus_hash(docs)}-msl{msl}-v{vocab_size}-{split or 'all'}.h5"
  return cached_features(cache_dir, key, read_hdf5, write_hdf5, build)


def gpt_features(
  data_dir: str | os.PathLike | list[str] | None,
  *,
  msl: int,
  vocab_size: int = 8192,
  cache_dir: str | os.PathLike | None = None,
  split: str | None = None,
) -> dict[str, np.ndarray]:
  """GPT features from pre-tokenised HDF5, from text (.txt / .jsonl), or the embedded corpus (None).

  Pre-tokenised data is used as it is (its ids come from its own tokenizer, so ``vocab_size`` is
  not applied; it is split by its files); text is tokenised here with ids ``< vocab_size``, and
  ``split`` selects its documents (:func:`gpt_features_from_text`). A list of paths (every 2.x
  GPT-3 params file lists ten directories) is one dataset, read in the list's order.
  """
  feats = pretokenised(data_dir, (".h5", ".hdf5"), read_features, msl, split)
  if feats is not None:
    return feats
  return gpt_features_from_text(
    text.read_documents(data_dir), msl=msl, vocab_size=vocab_size, cache_dir=cache_dir, split=split
  )


# ----------------------------------------------------------------- the data processors' input schema

PROCESSORS = ("GptHDF5DataProcessor", "GptHDF5MapDataProcessor", "GptTextDataProcessor")


class GptInput(InputConfig):
  """``train_input`` / ``eval_input`` of the GPT processors (strict): modelzoo GPT HDF5 (``data``
  [N, 3, MSL]) in ``data_dir``; or .txt/.jsonl text there (byte-level BPE trained here, ids <
  ``vocab_size``); or, with no ``data_dir``, the embedded corpus. ``max_sequence_length`` defaults to
  the model's ``max_position_embeddings`` (the task sets it: modelzoo's data fixes the length, so a
  file without it means the data's; 128 for a section used alone)."""

  model_config = ConfigDict(extra="forbid")

  def features(self, *, cache_dir: Any = None, seed: int = 0, eval_split: bool = False) -> Features:
    del seed  # the windows are cut in order; shuffling is the pipeline's
    return gpt_features(
      data_dir(self, many=True),
      msl=self.max_sequence_length or 128,
      vocab_size=self.vocab_size or 8192,
      cache_dir=cache_dir,
      split=text_split(self, eval_split),
    )

  def example_spec(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Every feature is int32 ``[MSL]`` (the table in this module's docstring)."""
    return dict.fromkeys(FEATURES, ((self.max_sequence_length or 128,), np.dtype(np.int32)))
