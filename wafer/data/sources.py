"""Ready-made sources: BERT MLM+NSP and GPT LM features (pre-tokenised, text, embedded), and digits for fc_mnist.

Every function returns a dict of NumPy arrays (first axis = examples) to wrap in an
:class:`~wafer.data.pipeline.ArraySource`; :func:`bert_batch_source` and :func:`digits_batch_source`
go on to the executor's ``BatchSource``.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

from wafer.data import bert, gpt, text
from wafer.data.pipeline import ArraySource, GrainBatchSource

Features = dict[str, np.ndarray]
CLS_ID, SEP_ID, MASK_ID, NUM_SPECIAL = 2, 3, 4, 5  # positions in text.SPECIAL_TOKENS


def _cached_features(
  cache_dir: str | os.PathLike | None,
  name: str,
  read: Callable[[str], Features],
  write: Callable[[str, Features], None],
  build: Callable[[], Features],
) -> Features:
  """``cache_dir/name`` if it exists; else ``build()``, written there atomically (tmp file + rename)."""
  if cache_dir is None:
    return build()
  path = os.path.join(os.fspath(cache_dir), name)
  if os.path.isfile(path):
    return read(path)
  feats = build()
  write(path + ".tmp", feats)
  os.replace(path + ".tmp", path)
  return feats


def _announce(
  docs: list[str], split: str | None, tokenizer: str, examples: str, cache_dir: str | os.PathLike | None
) -> list[str]:
  """The documents of ``split``, after a progress line saying what is about to be tokenised."""
  chosen = text.split_documents(docs, split)
  print(
    f"Tokenising {len(chosen):,} documents{f' of the {split} split' if split else ''} ({tokenizer}) into "
    f"{examples} examples{f'; cached in {cache_dir}' if cache_dir is not None else ''}...",
    flush=True,
  )
  return chosen


def _pretokenised(
  data_dir: str | os.PathLike | None,
  suffixes: tuple[str, ...],
  read: Callable[[str], Features],
  msl: int,
  split: str | None,
) -> Features | None:
  """Pre-tokenised features when ``data_dir`` is (or holds) a file with one of ``suffixes``, else None (text).

  Checks the sequence length against ``msl``; a ``split`` is an error (pre-tokenised data is split by files).
  """
  if data_dir is None:
    return None
  path = os.fspath(data_dir)
  names = [path] if os.path.isfile(path) else (os.listdir(path) if os.path.isdir(path) else [])
  if not any(n.endswith(suffixes) for n in names):
    return None
  if split is not None:
    raise ValueError(
      f"{path}: split={split!r} selects documents of a text corpus; pre-tokenised data is "
      "split by its files: remove split and point data_dir at that split's files"
    )
  feats = read(path)
  if feats["input_ids"].shape[1] != msl:
    raise ValueError(
      f"{path}: sequences have length {feats['input_ids'].shape[1]}, but max_sequence_length is {msl}"
    )
  return feats


def bert_features_from_text(
  docs: list[str],
  *,
  msl: int,
  vocab_size: int,
  cache_dir: str | os.PathLike | None,
  seed: int = 0,
  dupe_factor: int = 1,
  split: str | None = None,
) -> dict[str, np.ndarray]:
  """Train (or load) BERT's tokenizer (`wafer.data.text.train_bert_tokenizer`) on ``docs``, then create MLM+NSP examples.

  The tokenizer is trained on all of ``docs``; the examples come from the documents of
  ``split`` (:func:`wafer.data.text.split_documents`; None: all). With a ``cache_dir`` the
  examples are cached there as HDF5 (keyed by the corpus hash, MSL, vocabulary size, seed,
  dupe factor and split), so a second run skips tokenisation.
  """

  def build() -> dict[str, np.ndarray]:
    chosen = _announce(docs, split, f"subword BPE, {vocab_size} ids", f"MSL-{msl} MLM+NSP", cache_dir)
    tok = text.train_bert_tokenizer(docs, vocab_size, cache_dir)
    return bert.create_mlm_nsp_examples(
      text.tokenize_documents(tok, chosen),
      msl=msl,
      vocab_size=tok.get_vocab_size(),
      cls_id=CLS_ID,
      sep_id=SEP_ID,
      mask_id=MASK_ID,
      num_special=NUM_SPECIAL,
      seed=seed,
      dupe_factor=dupe_factor,
    )

  key = f"bert-{text.corpus_hash(docs)}-msl{msl}-v{vocab_size}-s{seed}-d{dupe_factor}-{split or 'all'}.h5"
  return _cached_features(cache_dir, key, bert.read_hdf5, bert.write_hdf5, build)


def bert_features(
  data_dir: str | os.PathLike | None,
  *,
  msl: int,
  vocab_size: int = 8192,
  cache_dir: str | os.PathLike | None = None,
  seed: int = 0,
  dupe_factor: int = 1,
  split: str | None = None,
) -> dict[str, np.ndarray]:
  """BERT features from pre-tokenised HDF5/CSV, from text (.txt / .jsonl), or the embedded corpus (None).

  ``split`` (``train`` / ``eval`` / None) selects documents of a text corpus; pre-tokenised data
  is split by its files (point ``data_dir`` at the split's directory).
  """
  feats = _pretokenised(data_dir, (".h5", ".hdf5", ".csv"), bert.read_features, msl, split)
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
  )


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
    chosen = _announce(docs, split, f"byte-level BPE, {vocab_size} ids", f"MSL-{msl} next-token", cache_dir)
    tok = text.train_bpe(docs, vocab_size, cache_dir)
    ids = [e.ids for e in tok.encode_batch(chosen, add_special_tokens=False)]
    return gpt.create_lm_examples(ids, msl=msl, eot_id=text.EOT)

  key = f"gpt-{text.corpus_hash(docs)}-msl{msl}-v{vocab_size}-{split or 'all'}.h5"
  return _cached_features(cache_dir, key, gpt.read_hdf5, gpt.write_hdf5, build)


def gpt_features(
  data_dir: str | os.PathLike | None,
  *,
  msl: int,
  vocab_size: int = 8192,
  cache_dir: str | os.PathLike | None = None,
  split: str | None = None,
) -> dict[str, np.ndarray]:
  """GPT features from pre-tokenised HDF5, from text (.txt / .jsonl), or the embedded corpus (None).

  Pre-tokenised data is used as it is (its ids come from its own tokenizer, so ``vocab_size`` is
  not applied; it is split by its files); text is tokenised here with ids ``< vocab_size``, and
  ``split`` selects its documents (:func:`gpt_features_from_text`).
  """
  feats = _pretokenised(data_dir, (".h5", ".hdf5"), gpt.read_features, msl, split)
  if feats is not None:
    return feats
  return gpt_features_from_text(
    text.read_documents(data_dir), msl=msl, vocab_size=vocab_size, cache_dir=cache_dir, split=split
  )


def digits_features(split: str = "train", eval_fraction: float = 0.2) -> dict[str, np.ndarray]:
  """scikit-learn's bundled handwritten digits (1,797 images, 8x8), shaped like MNIST for fc_mnist.

  Each 8x8 image (values 0..16) is upscaled 3x (nearest) to 24x24 and padded by 2 pixels to
  28x28, as MNIST centres a 20x20 digit in 28x28; then flattened to 784 values in [0, 1].
  A fixed permutation splits ``train`` from ``eval``.

  Returns:
    ``{"images": float32 [N, 784], "labels": int32 [N]}`` (fc_mnist's batch keys).
  """
  from sklearn.datasets import load_digits

  if split not in ("train", "eval"):
    raise ValueError(f"split must be 'train' or 'eval' (got {split!r})")
  d = load_digits()
  images = d.images.astype(np.float32) / 16.0
  images = np.repeat(np.repeat(images, 3, axis=1), 3, axis=2)
  images = np.pad(images, ((0, 0), (2, 2), (2, 2)))
  order = np.random.default_rng(0).permutation(len(images))
  n_eval = int(round(len(images) * eval_fraction))
  idx = order[n_eval:] if split == "train" else order[:n_eval]
  return {"images": images[idx].reshape(len(idx), 784), "labels": d.target[idx].astype(np.int32)}


MNIST_FILES = {
  "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
  "eval": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def _read_idx(path: str) -> np.ndarray:
  """One IDX file (MNIST's format: magic 0x0000 0x08 ndim, big-endian int32 dims, uint8 data)."""
  import gzip

  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rb") as f:
    raw = f.read()
  if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
    raise ValueError(
      f"{path}: not an IDX file of unsigned bytes (magic {raw[:4].hex()!r}, expected 000008xx)"
    )
  ndim = raw[3]
  dims = tuple(int(d) for d in np.frombuffer(raw, ">i4", count=ndim, offset=4))
  data = np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim)
  if data.size != int(np.prod(dims)):
    raise ValueError(f"{path}: header says {dims} = {int(np.prod(dims))} values, the file holds {data.size}")
  return data.reshape(dims)


def mnist_features(data_dir: str | os.PathLike, split: str = "train") -> dict[str, np.ndarray]:
  """MNIST from its IDX files in ``data_dir`` (``train-*`` for train, ``t10k-*`` for eval; ``.gz`` or not).

  Returns:
    ``{"images": float32 [N, 784] in [0, 1], "labels": int32 [N]}``.
  """
  if split not in MNIST_FILES:
    raise ValueError(f"split must be 'train' or 'eval' (got {split!r})")
  paths = []
  for stem in MNIST_FILES[split]:
    found = [
      os.path.join(data_dir, stem + ext)
      for ext in ("", ".gz")
      if os.path.isfile(os.path.join(data_dir, stem + ext))
    ]
    if not found:
      raise FileNotFoundError(
        f"no {stem}[.gz] in {os.fspath(data_dir)}: MNISTDataProcessor reads MNIST's IDX files "
        "there; remove data_dir to use scikit-learn's bundled digits instead"
      )
    paths.append(found[0])
  images, labels = _read_idx(paths[0]), _read_idx(paths[1])
  if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
    raise ValueError(
      f"{paths[0]}, {paths[1]}: expected images [N, 28, 28] and labels [N]; got {images.shape}, "
      f"{labels.shape}"
    )
  return {
    "images": images.reshape(len(images), -1).astype(np.float32) / 255.0,
    "labels": labels.astype(np.int32),
  }


def bert_batch_source(
  data_dir: str | os.PathLike | None,
  batch_size: int,
  *,
  msl: int = 128,
  seed: int = 0,
  num_workers_per_csx: int = 0,
  num_csx: int = 1,
  shuffle: bool = True,
  drop_last: bool = True,
  vocab_size: int = 8192,
  cache_dir: str | os.PathLike | None = None,
  num_processes: int = 0,
) -> GrainBatchSource:
  """The BERT MLM+NSP training pipeline as the executor's ``BatchSource``."""
  feats = bert_features(data_dir, msl=msl, vocab_size=vocab_size, cache_dir=cache_dir, seed=seed)
  return GrainBatchSource(
    ArraySource(feats, name=str(data_dir or "embedded corpus")),
    batch_size,
    seed=seed,
    num_workers_per_csx=num_workers_per_csx,
    num_csx=num_csx,
    shuffle=shuffle,
    drop_last=drop_last,
    num_processes=num_processes,
  )


def digits_batch_source(
  batch_size: int,
  *,
  split: str = "train",
  seed: int = 0,
  num_workers_per_csx: int = 0,
  num_csx: int = 1,
  shuffle: bool = True,
  drop_last: bool = True,
) -> GrainBatchSource:
  """fc_mnist's digits as the executor's ``BatchSource``."""
  return GrainBatchSource(
    ArraySource(digits_features(split), name=f"digits/{split}"),
    batch_size,
    seed=seed,
    num_workers_per_csx=num_workers_per_csx,
    num_csx=num_csx,
    shuffle=shuffle,
    drop_last=drop_last,
  )
