"""Input pipelines on grain: sharded input workers, per-worker shuffles, exact resume.

The model of the Cerebras input workers (``docs/references.md``, "Step closures, the executor and the run config"):

- ``num_workers_per_csx * num_csx`` input workers (at least one). Worker ``w`` owns the shard
  ``examples[w::W]``: every example belongs to exactly one worker, so one epoch across the
  workers sees each example exactly once (:func:`shard_indices`).
- Each worker shuffles its shard with its own seed, derived from the one run seed
  (:func:`worker_seeds`): runs are reproducible and workers differ. The shuffle is grain's
  index shuffle (``MapDataset.seed(s).shuffle()``), reshuffled every epoch.
- The global batch is split evenly across the ``num_csx`` systems, and each system's workers
  (``num_workers_per_csx`` of them, ``P``) emit whole per-system batches of ``batch_size /
  num_csx`` (fixed, ``drop_remainder``). Each system reads its workers in strict round-robin, so
  step ``k``'s global batch is, for every system ``c``, batch ``k // P`` of its worker
  ``c * P + k % P``, concatenated in system order (one worker's batch when ``num_csx`` is 1). With ``drop_last`` each worker's epoch ends with its last full batch; without it
  the worker's example stream runs on across the epoch boundary (nothing is dropped).
- Training data repeats forever.

Batch ``k`` is a pure function of ``(k, run seed, W, batch size)``: grain only computes example
*indices* (random access, no state), and a batch is one vectorised gather from an in-memory
:class:`ArraySource`. The iterator state is therefore just the next batch number (JSON), and a
restored iterator yields exactly the batches an uninterrupted one would. Worker *processes*
(``grain.MultiprocessingOptions``) only add parallelism: they cannot change the output.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import grain
import numpy as np

from wafer.config.schema import batch_split_problem
from wafer.errors import short_repr

STATE_VERSION = 1


class ArraySource:
  """Random-access examples held as equal-length NumPy arrays (one per feature)."""

  def __init__(self, features: Mapping[str, np.ndarray], *, name: str = "arrays"):
    if not features:
      raise ValueError(f"{name}: no features")
    lengths = {k: len(v) for k, v in features.items()}
    if len(set(lengths.values())) != 1:
      raise ValueError(f"{name}: features differ in number of examples: {lengths}")
    self.features = {k: np.ascontiguousarray(v) for k, v in features.items()}
    self.name = name
    self.num_examples = next(iter(lengths.values()))
    if self.num_examples == 0:
      raise ValueError(f"{name}: no examples")

  def __len__(self) -> int:
    return self.num_examples

  def __getitem__(self, index: int) -> dict[str, np.ndarray]:
    return {k: v[index] for k, v in self.features.items()}

  def gather(self, indices: np.ndarray) -> dict[str, np.ndarray]:
    """The examples at ``indices``, stacked into one batch."""
    return {k: v[indices] for k, v in self.features.items()}

  def fingerprint(self) -> str:
    """Shapes and dtypes (not contents): part of the resume check."""
    spec = sorted((k, v.shape, str(v.dtype)) for k, v in self.features.items())
    return hashlib.sha256(repr(spec).encode()).hexdigest()[:16]

  def contents(self, samples: int = 256) -> str:
    """A hash of ``samples`` examples spread evenly over the data (the first and the last
    included) of every feature: the resume check's sign that the data itself changed, at the
    cost of reading those examples, whatever the data's size."""
    picked = np.unique(
      np.linspace(0, self.num_examples - 1, min(samples, self.num_examples)).astype(np.int64)
    )
    digest = hashlib.sha256()
    for key in sorted(self.features):
      digest.update(key.encode())
      digest.update(np.ascontiguousarray(self.features[key][picked]).tobytes())
    return digest.hexdigest()[:16]


_RECORDED_LATER = frozenset({"contents"})
"""Pipeline keys a checkpoint written before they were recorded lacks: compared only when saved."""


def worker_seeds(run_seed: int, num_workers: int) -> list[int]:
  """One shuffle seed per input worker, all derived from ``run_seed`` (each in ``[0, 2**32)``)."""
  seq = np.random.SeedSequence(int(run_seed) % 2**63)
  return [int(child.generate_state(1, np.uint32)[0]) for child in seq.spawn(num_workers)]


def shard_indices(num_examples: int, worker: int, num_workers: int) -> np.ndarray:
  """Example indices owned by ``worker`` (strided, so shards differ in size by at most one)."""
  return np.arange(worker, num_examples, num_workers)


def total_workers(num_workers_per_csx: int, num_csx: int = 1) -> int:
  """Input workers in all: ``num_workers_per_csx * num_csx``, and one when it is 0."""
  if num_workers_per_csx < 0 or num_csx < 1:
    raise ValueError(
      f"num_workers_per_csx must be >= 0 and num_csx >= 1 (got {num_workers_per_csx}, {num_csx})"
    )
  return max(1, num_workers_per_csx) * num_csx


class _WorkerBatches(grain.MapDataset):
  """Worker ``w``'s batches of example indices: grain shards, shuffles and repeats the indices."""

  def __init__(
    self,
    num_examples: int,
    worker: int,
    num_workers: int,
    seed: int,
    batch_size: int,
    shuffle: bool,
    drop_last: bool,
  ):
    indices = grain.MapDataset.range(num_examples)[worker::num_workers]
    super().__init__([])
    self.shard_size = len(indices)
    if shuffle:
      indices = indices.seed(seed).shuffle()
    self.indices = indices.repeat()
    self.batch_size = batch_size
    self.drop_last = drop_last
    self.batches_per_epoch = self.shard_size // batch_size
    if drop_last and self.batches_per_epoch == 0:
      raise ValueError(
        "Iterating the dataloader did not return any values. This is possibly because the dataset "
        f"is too small for the specified batch_size or drop_last settings: input worker {worker} of "
        f"{num_workers} holds {self.shard_size} examples, fewer than batch_size={batch_size}; use "
        "fewer workers, a smaller batch, or drop_last_batch: false"
      )

  def __len__(self) -> int:
    return sys.maxsize

  def __str__(self) -> str:
    return f"_WorkerBatches(shard={self.shard_size}, batch={self.batch_size}, drop_last={self.drop_last})"

  def __getitem__(self, index):
    if isinstance(index, slice):
      return self.slice(index)
    if self.drop_last:
      epoch, b = divmod(index, self.batches_per_epoch)
      start = epoch * self.shard_size + b * self.batch_size
    else:
      start = index * self.batch_size
    return np.asarray(self.indices._getitems(list(range(start, start + self.batch_size))), np.int64)


def step_key(seed: int, step: int) -> np.ndarray:
  """uint32[2] raw ``jax.random`` key data of batch ``step`` of a run seeded ``seed`` (NumPy, no JAX)."""
  return np.random.SeedSequence([int(seed) % 2**63, int(step)]).generate_state(2, np.uint32)


class _RoundRobin(grain.MapDataset):
  """Step ``k``: for each system ``c``, batch ``k // P`` of worker ``c * P + k % P``, concatenated."""

  def __init__(
    self,
    source: ArraySource,
    workers: Sequence[_WorkerBatches],
    num_csx: int = 1,
    key_feature: str | None = None,
    seed: int = 0,
    systems: Sequence[int] | None = None,
  ):
    super().__init__([])
    self.source = source
    self.workers = list(workers)
    self.num_csx = num_csx
    self.systems = tuple(range(num_csx)) if systems is None else tuple(systems)
    self.per_csx = len(self.workers) // num_csx
    self.key_feature = key_feature
    self.seed = seed

  def __len__(self) -> int:
    return sys.maxsize

  def __str__(self) -> str:
    return f"_RoundRobin({len(self.workers)} workers)"

  def __getitem__(self, index):
    if isinstance(index, slice):
      return self.slice(index)
    p = self.per_csx
    k, j = divmod(index, p)
    idx = [self.workers[c * p + j][k] for c in self.systems]
    batch = self.source.gather(idx[0] if len(idx) == 1 else np.concatenate(idx))
    if self.key_feature is not None:
      rows = sum(len(i) for i in idx)
      batch[self.key_feature] = np.tile(step_key(self.seed, index), (rows, 1))
    return batch


class GrainBatchSource:
  """The executor's ``BatchSource``: fixed-size batches that repeat forever and resume exactly.

  Args:
    source: the examples.
    batch_size: global batch size (across ``num_csx``), fixed.
    seed: the run seed; each input worker's shuffle seed derives from it.
    num_workers_per_csx: input workers per CS-X (0 counts as 1).
    num_csx: CS-X systems; the workers in all are ``num_workers_per_csx * num_csx``.
    shuffle: shuffle each worker's shard (reshuffled every epoch).
    drop_last: end each worker's epoch at its last full batch.
    num_processes: grain worker processes that compute batches in parallel (0: in-process). The
      output does not depend on it.
    prefetch: per-process buffer size.
    systems: the systems (``0 .. num_csx - 1``) whose rows this source builds, in order; None: all
      of them. In a run of many processes each process builds only the rows of its own systems
      (`for_systems`), so the input workers are split by process; the rows are those the full
      global batch holds for these systems.
    key_feature: if set, every batch also holds, under this name, a per-step random key: uint32
      [batch_size, 2], the raw key data :func:`step_key` ``(seed, k)`` repeated on every row (a
      batch axis, so that it splits across ``num_csx`` like the other features). Models draw
      dropout from it; it depends only on the seed and the batch number, so a resumed run
      draws the same masks.
  """

  def __init__(
    self,
    source: ArraySource,
    batch_size: int,
    *,
    seed: int = 0,
    num_workers_per_csx: int = 0,
    num_csx: int = 1,
    shuffle: bool = True,
    drop_last: bool = True,
    num_processes: int = 0,
    prefetch: int = 4,
    key_feature: str | None = None,
    systems: Sequence[int] | None = None,
  ):
    if batch_size < 1:
      raise ValueError(f"batch_size must be a positive integer (got {batch_size})")
    split = batch_split_problem(batch_size, num_csx)
    if split is not None:
      raise ValueError(f"batch_size={batch_size}: {split}")
    self.source = source
    self.batch_size = int(batch_size)
    self.seed = int(seed)
    self.num_workers = total_workers(num_workers_per_csx, num_csx)
    self.shuffle = shuffle
    self.drop_last = drop_last
    self.num_processes = int(num_processes)
    self.prefetch = int(prefetch)
    self.seeds = worker_seeds(self.seed, self.num_workers)
    self.num_csx = int(num_csx)
    self.workers = [
      _WorkerBatches(
        len(source), w, self.num_workers, self.seeds[w], self.batch_size // self.num_csx, shuffle, drop_last
      )
      for w in range(self.num_workers)
    ]
    self.key_feature = key_feature
    self.systems = tuple(range(self.num_csx)) if systems is None else tuple(int(c) for c in systems)
    if not self.systems or any(not 0 <= c < self.num_csx for c in self.systems):
      raise ValueError(f"systems={list(self.systems)}: allowed: a non-empty subset of 0..{self.num_csx - 1}")
    self.dataset = _RoundRobin(source, self.workers, self.num_csx, key_feature, self.seed, self.systems)
    self.next_batch = 0
    self._it: Any = None

  @property
  def features(self) -> dict[str, np.ndarray]:
    """The examples' arrays, ``{name: [examples, ...]}`` (what the batches are gathered from)."""
    return self.source.features

  def with_workers(self, *, num_workers_per_csx: int, num_processes: int = 0) -> GrainBatchSource:
    """The same pipeline (examples, batch, seed, shuffle) with other worker counts, at position 0."""
    return GrainBatchSource(
      self.source,
      self.batch_size,
      seed=self.seed,
      num_workers_per_csx=num_workers_per_csx,
      num_csx=self.num_csx,
      shuffle=self.shuffle,
      drop_last=self.drop_last,
      num_processes=num_processes,
      prefetch=self.prefetch,
      key_feature=self.key_feature,
    )

  def for_systems(self, systems: Sequence[int]) -> GrainBatchSource:
    """The same pipeline, at the same position, building only the rows of ``systems``.

    Only those systems' input workers compute anything: with ``P`` systems per process, each
    process does ``P / num_csx`` of the input work.
    """
    local = GrainBatchSource(
      self.source,
      self.batch_size,
      seed=self.seed,
      num_workers_per_csx=self.num_workers // self.num_csx,
      num_csx=self.num_csx,
      shuffle=self.shuffle,
      drop_last=self.drop_last,
      num_processes=self.num_processes,
      prefetch=self.prefetch,
      key_feature=self.key_feature,
      systems=systems,
    )
    local.next_batch = self.next_batch
    return local

  def epoch_steps(self) -> int:
    """Steps in one epoch: every input worker of a system passes its shard once (the dataloader's
    length, what ``runconfig.num_epochs`` counts). With ``P`` workers per system each holding at
    least ``b`` batches of its shard, ``P * b``.

    >>> GrainBatchSource(ArraySource({"x": np.zeros(100)}), 8, num_workers_per_csx=2).epoch_steps()
    12
    """
    per_csx = self.num_workers // self.num_csx
    if self.drop_last:
      return per_csx * min(w.batches_per_epoch for w in self.workers)
    return per_csx * min(-(-w.shard_size // w.batch_size) for w in self.workers)

  def batch_at(self, k: int) -> dict[str, np.ndarray]:
    """Batch number ``k`` (random access; what the iterator yields at position ``k``)."""
    return self.dataset[k]

  def _iterator(self) -> Any:
    ds = self.dataset[self.next_batch :].to_iter_dataset(
      grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
    )
    if self.num_processes > 0:
      from absl import flags  # grain's worker processes read absl flags; outside an absl app none are parsed

      if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
      ds = ds.mp_prefetch(
        grain.MultiprocessingOptions(num_workers=self.num_processes, per_worker_buffer_size=self.prefetch)
      )
    return iter(ds)

  def __iter__(self) -> GrainBatchSource:
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    if self._it is None:
      self._it = self._iterator()
    batch = next(self._it)
    self.next_batch += 1
    return batch

  def _config(self) -> dict[str, Any]:
    return {
      "seed": self.seed,
      "batch_size": self.batch_size,
      "num_workers": self.num_workers,
      "num_csx": self.num_csx,
      "shuffle": self.shuffle,
      "drop_last": self.drop_last,
      "num_examples": len(self.source),
      "source": self.source.fingerprint(),
      "contents": self.source.contents() if hasattr(self.source, "contents") else None,
    }

  def get_state(self) -> dict[str, Any]:
    """JSON-serialisable position: the next batch number, and the pipeline it is valid for."""
    return {"version": STATE_VERSION, "next_batch": self.next_batch, "pipeline": self._config()}

  def set_state(self, state: dict[str, Any]) -> None:
    """Resume at ``state['next_batch']``; the pipeline must be the one that saved the state."""
    if state.get("version") != STATE_VERSION or "next_batch" not in state:
      raise ValueError(
        f"input pipeline state: expected version {STATE_VERSION} with 'next_batch', got {state!r}"
      )
    position = state["next_batch"]
    if isinstance(position, bool) or not isinstance(position, (int, np.integer)) or position < 0:
      raise ValueError(f"input pipeline state: next_batch={position!r}; allowed: a batch number >= 0")
    saved = state.get("pipeline", {})
    mine = self._config()
    diff = {
      k: (saved.get(k), mine[k])
      for k in mine
      if saved.get(k) != mine[k] and (k in saved or k not in _RECORDED_LATER)
    }
    if set(diff) == {"contents"}:
      raise ValueError(
        "the training data changed since the checkpoint was written (same number of examples, shapes and "
        "dtypes, other values: a hash of examples spread over it differs), so batch k of this run would not "
        "be the batch k the checkpoint's run saw"
      )
    if diff:
      shown = "; ".join(
        f"{k} {short_repr(then, 40)} then, {short_repr(now, 40)} now" for k, (then, now) in diff.items()
      )
      raise ValueError(f"input pipeline state was saved for a different pipeline ({shown})")
    self.close()
    self.next_batch = int(state["next_batch"])

  def close(self) -> None:
    """Stop worker processes, if any."""
    it, self._it = self._it, None
    if it is not None and hasattr(it, "close"):
      it.close()


def one_pass(source: ArraySource, batch_size: int, drop_last: bool = True) -> Any:
  """Eval batches: one pass in order, without shuffling (the executor's ``eval_data``).

  With ``drop_last`` the incomplete last batch is dropped; otherwise it is kept (smaller).
  """
  ds = grain.MapDataset.range(len(source)).batch(batch_size, drop_remainder=drop_last)
  return ds.map(lambda idx: source.gather(np.asarray(idx)))
