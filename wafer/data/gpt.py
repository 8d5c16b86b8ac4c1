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

import numpy as np

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
  return {k: v.astype(np.int32) for k, v in out.items()}


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
