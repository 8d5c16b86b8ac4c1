"""From a ``train_input`` / ``eval_input`` section to the executor's data (generic over data processors).

Each data processor is the strict input schema a model plugin registers (`wafer.registry.ModelSpec`
``data_processors``): a `wafer.config.InputConfig` subclass whose ``features(cache_dir=, seed=,
eval_split=)`` returns the examples as NumPy arrays (first axis = examples). This module wraps them
in the grain pipeline: `train_source` (fixed global batches, sharded input workers, repeating
forever) and `eval_source` / `eval_batches` (one pass in order).

Keys read here: ``batch_size`` (global, across ``num_csx``), ``shuffle``, ``shuffle_seed`` (default:
the run seed), ``drop_last`` / ``drop_last_batch``, ``num_workers`` (used when the runconfig's
``num_workers_per_csx`` is 0). `text_split` is the train/eval split of a text corpus: the embedded
corpus holds out every 20th document for evaluation (``split: train`` / ``eval``), so ``train_input``
and ``eval_input`` without a ``data_dir`` see different text.
"""

from __future__ import annotations

import csv
import os
import struct
import zlib
from collections.abc import Callable, Mapping
from typing import Any

from wafer.data.pipeline import ArraySource, GrainBatchSource, one_pass
from wafer.data.sources import DAMAGED_FILE_FIX, missing_data_dir
from wafer.errors import DataError

DAMAGED_DATA: tuple[type[BaseException], ...] = (
  ValueError,
  OSError,
  EOFError,
  csv.Error,
  struct.error,
  zlib.error,
)
"""What readers raise on data that is missing, truncated or corrupt (not a bug): reported as a `DataError`."""


def _section_error(section: str, cfg: Any, error: BaseException) -> DataError:
  paths = cfg.data_dir
  if isinstance(paths, list) and len(paths) > 2:  # 2.x GPT-3 files list ten: the first and the count
    paths = f"[{paths[0]!r}, ... {len(paths) - 1} more]"
  else:
    paths = repr(paths)
  where = f"{section} ({cfg.data_processor}, data_dir={paths})"
  detail = str(error) or type(error).__name__
  if isinstance(error, (EOFError, zlib.error)):  # the readers' own messages name no file
    detail += f" (a file in data_dir ends early or is corrupt: {DAMAGED_FILE_FIX})"
  return DataError(f"{where}: {detail}")


def missing_data(section: str, cfg: Any) -> str | None:
  """The error a run reading input section ``section`` (``cfg``, a validated input section) stops with because
  a path of its ``data_dir`` does not exist (`wafer.data.sources.missing_data_dir`, named as `_section_error`
  names a section's data errors), or None (no data_dir: the embedded data; every path exists).

  >>> from types import SimpleNamespace as NS
  >>> missing_data("train_input", NS(data_dir="/nowhere", data_processor="P")).split(";")[0]
  "train_input (P, data_dir='/nowhere'): data_dir /nowhere: no such file or directory"
  >>> missing_data("train_input", NS(data_dir="gs://bucket/data", data_processor="P")) is None
  True
  """
  paths = cfg.data_dir if isinstance(cfg.data_dir, list) else [] if cfg.data_dir is None else [cfg.data_dir]
  for path in paths:
    if "://" in str(path):  # a URL a plugin's processor reads (gs://, https://): not a local path to check
      continue
    missing = missing_data_dir(path)
    if missing is not None:
      return str(_section_error(section, cfg, FileNotFoundError(missing)))
  return None


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


def data_dir(cfg: Any, *, many: bool = False) -> str | list[str] | None:
  """``cfg.data_dir``: None, one path, or (``many=True``, a processor that reads several) a list of paths.

  A one-element list is unwrapped. modelzoo's GPT and BERT processors take a list of directories (every
  2.x GPT-3 file lists ten), read as one dataset in their order; a processor that reads one path
  (``many=False``) refuses a longer list, naming the paths and the fix.

  >>> from types import SimpleNamespace as NS
  >>> data_dir(NS(data_dir=["a/0", "a/1"], data_processor="GptHDF5MapDataProcessor"), many=True)
  ['a/0', 'a/1']
  >>> data_dir(NS(data_dir=["a/0"], data_processor="MNISTDataProcessor"))
  'a/0'
  """
  path = cfg.data_dir[0] if isinstance(cfg.data_dir, list) and len(cfg.data_dir) == 1 else cfg.data_dir
  if isinstance(path, list) and not many:
    raise ValueError(
      f"{cfg.data_processor} reads one data_dir, got a list of {len(path)} ({', '.join(map(str, path))}): "
      "give one path, or data_dir: null for the built-in data"
    )
  return list(path) if isinstance(path, list) else path


def as_processor(cfg: Any) -> Any:
  """``cfg`` validated by its data processor's registered schema (a generic `InputConfig` is upgraded).

  A section a model package validated (its own `InputConfig` subclass) is returned as it is; only a
  generic one goes through the registry. A model's task passes its section's own ``features`` to
  `train_source` / `eval_source` instead.

  Raises:
    ValueError: no installed model plugin registers ``cfg.data_processor`` (the message lists those
      that are registered).
  """
  from wafer.config.schema import InputConfig

  if type(cfg).features is not InputConfig.features:
    return cfg
  from wafer import registry
  from wafer.config.params import section_schema

  known = registry.data_processors()
  if cfg.data_processor not in known:
    raise ValueError(
      f"data_processor {cfg.data_processor!r} is not one an installed model plugin provides; registered: "
      f"{', '.join(sorted(known))}"
    )
  schema = section_schema("train_input", {"data_processor": cfg.data_processor})
  return schema.model_validate(cfg.model_dump(exclude_unset=True))


Features = Callable[..., Mapping[str, Any]]
"""A section's features function: ``features(cache_dir=, seed=, eval_split=) -> {name: array}``."""


def _features(
  cfg: Any,
  cache_dir: str | os.PathLike | None,
  seed: int,
  eval_split: bool = False,
  features: Features | None = None,
) -> Mapping[str, Any]:
  make = features if features is not None else as_processor(cfg).features
  return make(cache_dir=cache_dir, seed=seed, eval_split=eval_split)


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
  features: Features | None = None,
) -> GrainBatchSource:
  """The training ``BatchSource`` of an ``InputConfig``: fixed global batches, repeating forever.

  ``key_feature`` adds a per-step random key to every batch (see `GrainBatchSource`). ``features``:
  the model package's own features function (its input section's ``features``); by default the
  section's data processor's (`as_processor`).

  Raises:
    DataError: the data cannot be read or does not fit the batch and worker settings; the
      message names ``section``, the processor and the data_dir.
  """
  try:
    data_seed = seed if cfg.shuffle_seed is None else cfg.shuffle_seed
    feats = _features(cfg, cache_dir, data_seed, features=features)
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
  except DAMAGED_DATA as error:
    if (
      isinstance(error, ValueError)
      and "input worker" in str(error)
      and not num_workers_per_csx
      and cfg.num_workers
    ):
      error = ValueError(  # a worker count the user may not know they set: say where it came from
        f"{error} (the {cfg.num_workers} workers per system are {section}.num_workers, modelzoo's DataLoader "
        "key, used while runconfig.num_workers_per_csx is 0)"
      )
    raise _section_error(section, cfg, error) from error


def batch_spec(cfg: Any, *, key_feature: str | None = None, section: str = "train_input") -> dict[str, Any]:
  """One global batch of an ``InputConfig`` as ``jax.ShapeDtypeStruct`` s, from its settings alone.

  The shapes `train_source` batches have (``[batch_size, *example shape]``, the processor's
  ``example_spec``; with ``key_feature``, also uint32 ``[batch_size, 2]``), without reading data:
  what ``--validate_only`` and ``--compile_only`` trace the step on.

  Raises:
    DataError: the processor declares no shapes, or its settings are invalid (names ``section``).
  """
  import jax
  import numpy as np

  try:
    spec = as_processor(cfg).example_spec()
  except ValueError as error:
    raise _section_error(section, cfg, error) from error
  batch = {k: jax.ShapeDtypeStruct((cfg.batch_size, *shape), dtype) for k, (shape, dtype) in spec.items()}
  if key_feature is not None:
    batch[key_feature] = jax.ShapeDtypeStruct((cfg.batch_size, 2), np.dtype(np.uint32))
  return batch


def eval_source(
  cfg: Any,
  *,
  seed: int,
  num_csx: int = 1,
  cache_dir: str | os.PathLike | None = None,
  section: str = "eval_input",
  features: Features | None = None,
) -> ArraySource:
  """The eval examples of an ``InputConfig`` (checked against its batch size); errors and ``features``
  as `train_source`."""
  try:
    data_seed = seed if cfg.shuffle_seed is None else cfg.shuffle_seed
    src = ArraySource(
      _features(cfg, cache_dir, data_seed, eval_split=True, features=features),
      name=f"{cfg.data_processor}:{cfg.data_dir}",
    )
  except DAMAGED_DATA as error:
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
