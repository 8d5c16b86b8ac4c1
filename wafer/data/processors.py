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
``MNISTDataProcessor``               scikit-learn's bundled digits shaped as MNIST (``split``:
                                     ``train``, or ``val``/``eval``/``test`` for the held-out part)
==================================  ===========================================================

Keys read: ``batch_size`` (global, across ``num_csx``), ``shuffle``, ``shuffle_seed`` (default:
the run seed), ``drop_last`` / ``drop_last_batch``, ``num_workers`` (used when the runconfig's
``num_workers_per_csx`` is 0), ``max_sequence_length`` (default 128), ``vocab_size`` (of the
locally trained tokenizer, default 8192), ``data_dir``, ``split``.
"""

from __future__ import annotations

import os
from typing import Any

from wafer.data import sources
from wafer.data.pipeline import ArraySource, GrainBatchSource, one_pass

BERT_PROCESSORS = ("BertCSVDynamicMaskDataProcessor", "BertHDF5DataProcessor", "BertMLMNSPDataProcessor")
MNIST_PROCESSORS = ("MNISTDataProcessor",)
GPT_PROCESSORS = ("GptHDF5DataProcessor", "GptHDF5MapDataProcessor", "GptTextDataProcessor")
PROCESSORS = BERT_PROCESSORS + MNIST_PROCESSORS + GPT_PROCESSORS


def check_batch_size(batch_size: int, num_csx: int) -> None:
  """The Cerebras checks of a global batch size against ``num_csx`` (``cerebras.md`` section 6)."""
  if num_csx < 1:
    raise ValueError(f"num_csx must be a positive integer (got {num_csx})")
  if batch_size < num_csx:
    raise ValueError(f"The number of CS devices ({num_csx}) must be less than or equal to the model batch size "
                     f"({batch_size}), as the batch is split across the CS devices.")


def _features(cfg: Any, cache_dir: str | os.PathLike | None, seed: int) -> dict:
  name = cfg.data_processor
  if name in BERT_PROCESSORS:
    data_dir = cfg.data_dir[0] if isinstance(cfg.data_dir, list) and len(cfg.data_dir) == 1 else cfg.data_dir
    if isinstance(data_dir, list):
      raise ValueError(f"{name}: data_dir must be one path (got {len(data_dir)})")
    return sources.bert_features(data_dir, msl=cfg.max_sequence_length or 128, vocab_size=cfg.vocab_size or 8192,
                                 cache_dir=cache_dir, seed=seed)
  if name in GPT_PROCESSORS:
    data_dir = cfg.data_dir[0] if isinstance(cfg.data_dir, list) and len(cfg.data_dir) == 1 else cfg.data_dir
    if isinstance(data_dir, list):
      raise ValueError(f"{name}: data_dir must be one path (got {len(data_dir)})")
    return sources.gpt_features(data_dir, msl=cfg.max_sequence_length or 128, vocab_size=cfg.vocab_size or 8192,
                                cache_dir=cache_dir)
  if name in MNIST_PROCESSORS:
    split = (cfg.split or "train").lower()
    return sources.digits_features("train" if split == "train" else "eval")
  raise ValueError(f"data_processor {name!r} is not one wafer provides; allowed: {', '.join(PROCESSORS)}")


def train_source(cfg: Any, *, seed: int, num_csx: int = 1, num_workers_per_csx: int = 0,
                 cache_dir: str | os.PathLike | None = None, num_processes: int = 0) -> GrainBatchSource:
  """The training ``BatchSource`` of an ``InputConfig``: fixed global batches, repeating forever."""
  check_batch_size(cfg.batch_size, num_csx)
  data_seed = seed if cfg.shuffle_seed is None else cfg.shuffle_seed
  feats = _features(cfg, cache_dir, data_seed)
  workers = num_workers_per_csx or cfg.num_workers
  return GrainBatchSource(ArraySource(feats, name=f"{cfg.data_processor}:{cfg.data_dir}"), cfg.batch_size,
                          seed=data_seed, num_workers_per_csx=workers, num_csx=num_csx, shuffle=cfg.shuffle,
                          drop_last=cfg.drop_remainder, num_processes=num_processes)


def eval_batches(cfg: Any, *, seed: int, num_csx: int = 1, cache_dir: str | os.PathLike | None = None) -> Any:
  """Eval batches of an ``InputConfig``: one pass in order (the executor's ``eval_data()``)."""
  check_batch_size(cfg.batch_size, num_csx)
  data_seed = seed if cfg.shuffle_seed is None else cfg.shuffle_seed
  feats = _features(cfg, cache_dir, data_seed)
  src = ArraySource(feats, name=f"{cfg.data_processor}:{cfg.data_dir}")
  if cfg.drop_remainder and len(src) < cfg.batch_size:
    raise ValueError("Iterating the dataloader did not return any values. This is possibly because the dataset is "
                     f"too small for the specified batch_size ({cfg.batch_size}, {len(src)} examples) or drop_last "
                     "settings.")
  return one_pass(src, cfg.batch_size, cfg.drop_remainder)
