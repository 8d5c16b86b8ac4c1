"""Generic helpers of data sources: a features cache, the tokenising announcement, pre-tokenised files.

A model's data module (``models/<name>/data.py``) builds its features (a dict of NumPy arrays, first
axis = examples, to wrap in an :class:`~wafer.data.pipeline.ArraySource`) with these.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import numpy as np

from wafer._io import replace_atomically
from wafer.data import text

Features = dict[str, np.ndarray]


def cached_features(
  cache_dir: str | os.PathLike | None,
  name: str,
  read: Callable[[str], Features],
  write: Callable[[str, Features], None],
  build: Callable[[], Features],
) -> Features:
  """``cache_dir/name`` if it exists and reads; else ``build()``, written there atomically
  (`wafer._io.replace_atomically`: a run killed while writing leaves no partial cache file)."""
  if cache_dir is None:
    return build()
  path = os.path.join(os.fspath(cache_dir), name)
  if os.path.isfile(path):
    try:
      return read(path)
    except (OSError, ValueError, EOFError, KeyError) as error:  # damaged (disk, an older non-atomic write)
      print(f"Warning: the cached features {path} cannot be read ({type(error).__name__}: {error}); "
            "building them again.", flush=True)  # fmt: skip
  feats = build()
  replace_atomically(path, lambda tmp: write(tmp, feats))
  return feats


def announce(
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


def missing_data_dir(path: str | os.PathLike) -> str | None:
  """The error of a ``data_dir`` path that does not exist (what a run stops with when it reads its data), or
  None when it exists. A validation, which reads no data, warns with it (`wafer.data.processors.missing_data`).

  >>> missing_data_dir("/nonexistent/path").split(";")[0]
  'data_dir /nonexistent/path: no such file or directory'
  """
  path = os.fspath(path)
  if os.path.exists(path):
    return None
  return (
    f"data_dir {path}: no such file or directory; point data_dir at the data (a modelzoo file names the "
    "data its release's preparation scripts write: docs/guides/modelzoo-params.md, 'Data'), or override "
    "train_input.data_dir=null (and eval_input.data_dir=null) to run on the embedded data"
  )


def pretokenised(
  data_dir: str | os.PathLike | Sequence[str | os.PathLike] | None,
  suffixes: tuple[str, ...],
  read: Callable[[str], Features],
  msl: int,
  split: str | None,
) -> Features | None:
  """Pre-tokenised features when ``data_dir`` is (or holds) a file with one of ``suffixes``, else None (text).

  Checks the sequence length against ``msl``; a ``split`` is an error (pre-tokenised data is split by files).
  A list of paths (modelzoo's ``data_dir: [dir0, dir1, ...]``) is one dataset: each path's examples in
  the list's order, concatenated; every path must hold pre-tokenised data, or none of them (text).

  Raises:
    ValueError: naming the file: it is empty, an ``.h5``/``.hdf5`` file without the HDF5 signature
      (garbage, or a download that is not the file), or the reader fails on it (truncated, corrupt);
      or a list mixing pre-tokenised and text paths.
  """
  if data_dir is None:
    return None
  if not isinstance(data_dir, (str, os.PathLike)):
    paths = [os.fspath(p) for p in data_dir]
    parts = [pretokenised(p, suffixes, read, msl, split) for p in paths]
    if all(part is None for part in parts):
      return None
    if any(part is None for part in parts):
      text_paths = [p for p, part in zip(paths, parts) if part is None]
      raise ValueError(
        f"data_dir lists pre-tokenised data ({', '.join(suffixes)}) and text ({', '.join(text_paths)}); "
        "list paths of one kind"
      )
    return {k: np.concatenate([part[k] for part in parts]) for k in parts[0]}
  path = os.fspath(data_dir)
  missing = missing_data_dir(path)
  if missing is not None:
    raise FileNotFoundError(missing)
  names = [path] if os.path.isfile(path) else (os.listdir(path) if os.path.isdir(path) else [])
  if not any(n.endswith(suffixes) for n in names):
    if os.path.isdir(path) and not any(n.endswith((".txt", ".jsonl")) for n in names):
      raise FileNotFoundError(
        f"{path}: holds no data: neither pre-tokenised files ({', '.join('*' + s for s in suffixes)}) nor "
        "text (*.txt, *.jsonl)"
      )
    return None
  if split is not None:
    raise ValueError(
      f"{path}: split={split!r} selects documents of a text corpus; pre-tokenised data is "
      "split by its files: remove split and point data_dir at that split's files"
    )
  files = (
    [path] if os.path.isfile(path) else [os.path.join(path, n) for n in sorted(names) if n.endswith(suffixes)]
  )
  for name in files:
    _check_file(name)
  try:
    feats = read(path)
  except (OSError, ValueError, EOFError) as error:  # the readers' own messages do not always name the file
    if path in str(error):
      raise
    raise unreadable_file(path, error) from error
  if len(feats["input_ids"]) == 0:
    raise ValueError(f"{path}: holds no examples (a header or empty datasets only); point data_dir at data")
  if feats["input_ids"].ndim != 2:
    raise ValueError(
      f"{path}: input_ids has shape {feats['input_ids'].shape}; expected [examples, sequence length]"
    )
  if feats["input_ids"].shape[1] != msl:
    raise ValueError(
      f"{path}: sequences have length {feats['input_ids'].shape[1]}, but max_sequence_length is {msl}"
    )
  return feats


def as_int32(values: np.ndarray, key: str, where: str) -> np.ndarray:
  """``values`` (a feature of ``where``) as int32, refusing what the cast would change silently.

  Floats must be whole numbers (a NaN cast to int32 is -2**31, 100.7 is 100) and integers must
  fit int32 (int64 2**32 + 7 wraps to 7, a valid token).

  >>> as_int32(np.array([1.0, 2.0]), "input_ids", "a.csv")
  array([1, 2], dtype=int32)
  >>> as_int32(np.array([1.0, 2.5]), "input_ids", "a.csv")
  Traceback (most recent call last):
  ...
  ValueError: a.csv: input_ids holds 2.5, not a whole number; integer features are whole numbers in [-2**31, 2**31)
  """
  values = np.asarray(values)
  if values.dtype == np.int32 or values.size == 0:
    return values.astype(np.int32)
  bounds = np.iinfo(np.int32)
  if np.issubdtype(values.dtype, np.floating):
    values = values.astype(np.float64)  # compared exactly (2**31 as float32 is 2**31, not in range)
    bad = ~np.isfinite(values) | (values != np.round(values))
    if bad.any():
      raise ValueError(
        f"{where}: {key} holds {values[bad][0]}, not a whole number; integer features are whole numbers in "
        "[-2**31, 2**31)"
      )
  elif not np.issubdtype(values.dtype, np.integer) and values.dtype != np.bool_:
    raise ValueError(f"{where}: {key} has dtype {values.dtype}; an integer feature must hold integers")
  outside = (values < bounds.min) | (values > bounds.max)
  if outside.any():
    raise ValueError(
      f"{where}: {key} holds {values[outside][0]}, outside int32 ([-2**31, 2**31)): the cast to int32 would "
      "wrap it to another (valid-looking) id"
    )
  return values.astype(np.int32)


DAMAGED_FILE_FIX = "copy it again or regenerate it"
"""The advice every damaged-data error gives (one wording: `unreadable_file`, the section errors)."""


def unreadable_file(path: str, error: BaseException) -> ValueError:
  """The error for data a reader fails on (truncated, corrupt): names the path, the reader's error and the fix.

  >>> str(unreadable_file("/nonexistent/a.gz", EOFError("Compressed file ended before the end-of-stream marker")))
  '/nonexistent/a.gz: cannot be read (EOFError: Compressed file ended before the end-of-stream marker); a file there is truncated or corrupt: copy it again or regenerate it'
  """
  which = "the file is" if os.path.isfile(path) else "a file there is"
  return ValueError(
    f"{path}: cannot be read ({type(error).__name__}: {error}); {which} truncated or corrupt: {DAMAGED_FILE_FIX}"
  )


HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
"""The first 8 bytes of an HDF5 file (at offset 0, or 512, 1024, ... after a user block)."""


def _check_file(path: str) -> None:
  """A data file that is empty, or an HDF5 file without the HDF5 signature: a ``ValueError`` naming it."""
  size = os.path.getsize(path)
  if size == 0:
    raise ValueError(
      f"{path}: the file is empty (0 bytes; a copy or a write that did not finish?): copy it again, or remove it "
      "from data_dir"
    )
  if not path.endswith((".h5", ".hdf5")):
    return
  with open(path, "rb") as f:
    head = f.read(8)
    offset = 512
    while head != HDF5_SIGNATURE and offset < min(size, 1 << 30):
      f.seek(offset)
      if f.read(8) == HDF5_SIGNATURE:
        return
      offset *= 2
  if head != HDF5_SIGNATURE:
    raise ValueError(
      f"{path}: not an HDF5 file (it starts with {head!r}; an HDF5 file with {HDF5_SIGNATURE!r}): the file is "
      f"damaged or is not what its name says: {DAMAGED_FILE_FIX}"
    )
