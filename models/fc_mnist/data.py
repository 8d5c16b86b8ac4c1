"""fc_mnist's data: MNIST's IDX files, or scikit-learn's bundled digits shaped as MNIST."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import numpy as np
from pydantic import ConfigDict, field_validator

from wafer.config import InputConfig
from wafer.data.pipeline import ArraySource, GrainBatchSource
from wafer.data.processors import EVAL_SPLITS, data_dir
from wafer.data.sources import Features, missing_data_dir, unreadable_file

IMAGE_PIXELS = 28 * 28  # MNIST's images, flattened


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
  return {"images": images[idx].reshape(len(idx), IMAGE_PIXELS), "labels": d.target[idx].astype(np.int32)}


MNIST_FILES = {
  "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
  "eval": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def _read_idx(path: str) -> np.ndarray:
  """One IDX file (MNIST's format: magic 0x0000 0x08 ndim, big-endian int32 dims, uint8 data)."""
  import gzip
  import zlib

  opener = gzip.open if path.endswith(".gz") else open
  try:
    with opener(path, "rb") as f:
      raw = f.read()
  except (gzip.BadGzipFile, EOFError, zlib.error) as error:  # their messages name no file
    raise unreadable_file(path, error) from None
  if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
    raise ValueError(
      f"{path}: not an IDX file of unsigned bytes (magic {raw[:4].hex()!r}, expected 000008xx)"
    )
  ndim = raw[3]
  dims = tuple(int(d) for d in np.frombuffer(raw, ">i4", count=ndim, offset=4))
  data = np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim)
  if 0 in dims:  # a reshape to (0, -1) has no answer: say what the file holds
    raise ValueError(f"{path}: holds no examples (header dimensions {dims})")
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
  missing = missing_data_dir(
    data_dir
  )  # the message a validation warns with (wafer.data.processors.missing_data)
  if missing is not None:
    raise FileNotFoundError(missing)
  if not os.path.isdir(data_dir):
    raise NotADirectoryError(
      f"data_dir {os.fspath(data_dir)}: not a directory; MNISTDataProcessor reads MNIST's IDX files "
      "there; remove data_dir to use scikit-learn's bundled digits instead"
    )
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
  if images.size == 0 or len(labels) == 0:
    raise ValueError(f"{paths[0]}, {paths[1]}: hold no examples ({images.shape}, {labels.shape})")
  if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
    raise ValueError(
      f"{paths[0]}, {paths[1]}: expected images [N, 28, 28] and labels [N]; got {images.shape}, "
      f"{labels.shape}"
    )
  return {
    "images": images.reshape(len(images), -1).astype(np.float32) / 255.0,
    "labels": labels.astype(np.int32),
  }


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


# ----------------------------------------------------------------- the data processor's input schema

PROCESSORS = ("MNISTDataProcessor",)


class MnistInput(InputConfig):
  """``train_input`` / ``eval_input`` of ``MNISTDataProcessor`` (strict): MNIST's IDX files in
  ``data_dir``; without one, scikit-learn's bundled digits shaped as MNIST. ``split``: ``train``, or
  ``val`` / ``eval`` / ``test`` for the held-out part. modelzoo's ``to_float`` / ``to_float16`` are
  accepted: the images are float32 here and the policy (``model.mixed_precision``) decides the
  compute format."""

  model_config = ConfigDict(extra="forbid")

  to_float: bool | None = None
  to_float16: bool | None = None

  @field_validator("data_dir")
  @classmethod
  def _one_dir(cls, v: Any) -> Any:
    data_dir(SimpleNamespace(data_dir=v, data_processor=PROCESSORS[0]))  # a list of several: refused here
    return v

  def features(self, *, cache_dir: Any = None, seed: int = 0, eval_split: bool = False) -> Features:
    del cache_dir, seed
    split = (self.split or ("val" if eval_split else "train")).lower()
    if split not in ("train",) + EVAL_SPLITS:
      raise ValueError(
        f"split={self.split!r}; allowed: train, or {', '.join(EVAL_SPLITS)} for the held-out part"
      )
    split = "train" if split == "train" else "eval"
    path = data_dir(self)
    return digits_features(split) if path is None else mnist_features(path, split)

  def example_spec(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """``images`` float32 ``[784]`` (28x28, flattened), ``labels`` int32 ``[]``."""
    return {"images": ((IMAGE_PIXELS,), np.dtype(np.float32)), "labels": ((), np.dtype(np.int32))}
