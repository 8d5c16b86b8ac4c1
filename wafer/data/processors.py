"""From a ``train_input`` / ``eval_input`` section to the executor's data, by ``data_processor`` name.

==================================  ===========================================================
data_processor                      data
==================================  ===========================================================
``BertCSVDynamicMaskDataProcessor``  BERT MLM+NSP: pre-tokenised CSV/HDF5 in ``data_dir``; or
``BertHDF5DataProcessor``            .txt/.jsonl text there (tokenised and masked here); or,
``BertMLMNSPDataProcessor``          with no ``data_dir``, the embedded corpus
``GptHDF5DataProcessor``             GPT next-token: modelzoo GPT HDF5 (``data`` [N, 3, MSL]) in
``GptHDF5MapDataProcessor``          ``data_dir``; or .txt/.jsonl text there (byte-level BPE
``GptTextDataProcessor``             trained here, ids < ``vocab_size``); or the embedded corpus
``MNISTDataProcessor``               MNIST's IDX files in ``data_dir``; without one, scikit-learn's
                                     bundled digits shaped as MNIST (``split``: ``train``, or
                                     ``val``/``eval``/``test`` for the held-out part)
==================================  ===========================================================

Keys read: ``batch_size`` (global, across ``num_csx``), ``shuffle``, ``shuffle_seed`` (default:
the run seed), ``drop_last`` / ``drop_last_batch``, ``num_workers`` (used when the runconfig's
``num_workers_per_csx`` is 0), ``max_sequence_length`` (default 128), ``vocab_size`` (of the
locally trained tokenizer, default 8192), ``data_dir``, ``split``.

Train/eval split of a text corpus (:func:`text_split`): the embedded corpus holds out every
20th document for evaluation (``split: train`` / ``eval``), so ``train_input`` and
``eval_input`` without a ``data_dir`` see different text. A ``data_dir`` of text is used whole
unless its section says ``split``. The tokenizer is always trained on the whole corpus, so
train and eval share it.
"""

from __future__ import annotations

import os
from typing import Any

from wafer.data import sources
from wafer.data.pipeline import ArraySource, GrainBatchSource, one_pass
from wafer.errors import WaferError


class DataError(WaferError, ValueError):
  """An input section names data that cannot be read or does not fit; the message says which and why."""


def _section_error(section: str, cfg: Any, error: Exception) -> DataError:
  where = f"{section} ({cfg.data_processor}, data_dir={cfg.data_dir!r})"
  return DataError(f"{where}: {error}")


BERT_PROCESSORS = ("BertCSVDynamicMaskDataProcessor", "BertHDF5DataProcessor", "BertMLMNSPDataProcessor")
MNIST_PROCESSORS = ("MNISTDataProcessor",)
GPT_PROCESSORS = ("GptHDF5DataProcessor", "GptHDF5MapDataProcessor", "GptTextDataProcessor")
PROCESSORS = BERT_PROCESSORS + MNIST_PROCESSORS + GPT_PROCESSORS


EVAL_SPLITS = ("val", "eval", "test", "validation")


def text_split(cfg: Any, eval_split: bool) -> str | None:
  """Which documents of a text corpus to use: ``cfg.split``; else, for the embedded corpus (no
  ``data_dir``), ``train`` for training and ``eval`` for evaluation; else all of them."""
  if cfg.split is not None:
    split = cfg.split.lower()
    return "eval" if split in EVAL_SPLITS else split
  if cfg.data_dir is None:
    return "eval" if eval_split else "train"
  return None


def _data_dir(cfg: Any) -> str | None:
  """``cfg.data_dir`` as one path (a one-element list is unwrapped; longer lists are an error)."""
  data_dir = cfg.data_dir[0] if isinstance(cfg.data_dir, list) and len(cfg.data_dir) == 1 else cfg.data_dir
  if isinstance(data_dir, list):
    raise ValueError(f"{cfg.data_processor}: data_dir must be one path (got {len(data_dir)})")
  return data_dir


def _features(cfg: Any, cache_dir: str | os.PathLike | None, seed: int, eval_split: bool = False) -> dict:
  name = cfg.data_processor
  if name in BERT_PROCESSORS:
    return sources.bert_features(
      _data_dir(cfg),
      msl=cfg.max_sequence_length or 128,
      vocab_size=cfg.vocab_size or 8192,
      cache_dir=cache_dir,
      seed=seed,
      split=text_split(cfg, eval_split),
    )
  if name in GPT_PROCESSORS:
    return sources.gpt_features(
      _data_dir(cfg),
      msl=cfg.max_sequence_length or 128,
      vocab_size=cfg.vocab_size or 8192,
      cache_dir=cache_dir,
      split=text_split(cfg, eval_split),
    )
  if name in MNIST_PROCESSORS:
    split = (cfg.split or ("val" if eval_split else "train")).lower()
    if split not in ("train",) + EVAL_SPLITS:
      raise ValueError(
        f"split={cfg.split!r}; allowed: train, or {', '.join(EVAL_SPLITS)} for the held-out part"
      )
    split = "train" if split == "train" else "eval"
    data_dir = _data_dir(cfg)
    return sources.digits_features(split) if data_dir is None else sources.mnist_features(data_dir, split)
  raise ValueError(f"data_processor {name!r} is not one wafer provides; allowed: {', '.join(PROCESSORS)}")


def train_source(
  cfg: Any,
  *,
  seed: int,
  num_csx: int = 1,
  num_workers_per_csx: int = 0,
  cache_dir: str | os.PathLike | None = None,
  num_processes: int = 0,
  section: str = "train_input",
  key_feature: str | None = None,
) -> GrainBatchSource:
  """The training ``BatchSource`` of an ``InputConfig``: fixed global batches, repeating forever.

  ``key_feature`` adds a per-step random key to every batch (see `GrainBatchSource`).

  Raises:
    DataError: the data cannot be read or does not fit the batch and worker settings; the
      message names ``section``, the processor and the data_dir.
  """
  try:
    data_seed = seed if cfg.shuffle_seed is None else cfg.shuffle_seed
    feats = _features(cfg, cache_dir, data_seed)
    workers = num_workers_per_csx or cfg.num_workers
    return GrainBatchSource(
      ArraySource(feats, name=f"{cfg.data_processor}:{cfg.data_dir}"),
      cfg.batch_size,
      seed=data_seed,
      num_workers_per_csx=workers,
      num_csx=num_csx,
      shuffle=cfg.shuffle,
      drop_last=cfg.drop_remainder,
      num_processes=num_processes,
      key_feature=key_feature,
    )
  except DataError:
    raise
  except (ValueError, OSError) as error:
    raise _section_error(section, cfg, error) from error


def eval_source(
  cfg: Any,
  *,
  seed: int,
  num_csx: int = 1,
  cache_dir: str | os.PathLike | None = None,
  section: str = "eval_input",
) -> ArraySource:
  """The eval examples of an ``InputConfig`` (checked against its batch size); errors as `train_source`."""
  try:
    data_seed = seed if cfg.shuffle_seed is None else cfg.shuffle_seed
    src = ArraySource(
      _features(cfg, cache_dir, data_seed, eval_split=True), name=f"{cfg.data_processor}:{cfg.data_dir}"
    )
  except (ValueError, OSError) as error:
    raise _section_error(section, cfg, error) from error
  if cfg.drop_remainder and len(src) < cfg.batch_size:
    raise DataError(
      f"{section}: Iterating the dataloader did not return any values. This is possibly because the "
      f"dataset is too small for the specified batch_size ({cfg.batch_size}, {len(src)} examples) or "
      "drop_last settings."
    )
  return src


def eval_batches(cfg: Any, *, seed: int, num_csx: int = 1, cache_dir: str | os.PathLike | None = None) -> Any:
  """Eval batches of an ``InputConfig``: one pass in order (the executor's ``eval_data()``)."""
  return one_pass(
    eval_source(cfg, seed=seed, num_csx=num_csx, cache_dir=cache_dir), cfg.batch_size, cfg.drop_remainder
  )
