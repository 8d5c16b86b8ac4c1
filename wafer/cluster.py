"""Cluster settings: ``num_csx`` systems run data parallel over JAX devices.

``num_csx`` and ``num_workers_per_csx`` are fixed by the first compile in a process, as the
cluster configuration of a Cerebras run is: `lock_cluster` records them, and a later request
for different values raises `ClusterConfigError`. ``num_csx > 1`` maps to a 1-D
``jax.sharding.Mesh`` over the first ``num_csx`` devices with axis ``"csx"``: the global batch
is split along axis 0 and everything else is replicated, so gradients are averaged by XLA's
all-reduce, the analogue of SwarmX's reduce. Multi-host runs use the same code after
``jax.distributed.initialize()``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from wafer.errors import WaferError

AXIS = "csx"


class ClusterConfigError(WaferError, ValueError):
  """Cluster settings that cannot be used or that changed after the first compile."""


@dataclasses.dataclass(frozen=True)
class ClusterSettings:
  num_csx: int = 1
  num_workers_per_csx: int = 0


_LOCKED: list[ClusterSettings] = []


def lock_cluster(num_csx: int = 1, num_workers_per_csx: int = 0) -> ClusterSettings:
  """Fix the cluster settings for this process, or check them against the fixed ones."""
  if isinstance(num_csx, bool) or not isinstance(num_csx, int) or num_csx < 1:
    raise ClusterConfigError(f"num_csx={num_csx!r}; allowed: an int >= 1")
  if (
    isinstance(num_workers_per_csx, bool)
    or not isinstance(num_workers_per_csx, int)
    or num_workers_per_csx < 0
  ):
    raise ClusterConfigError(f"num_workers_per_csx={num_workers_per_csx!r}; allowed: an int >= 0")
  wanted = ClusterSettings(num_csx, num_workers_per_csx)
  if not _LOCKED:
    _LOCKED.append(wanted)
  elif _LOCKED[0] != wanted:
    fixed = _LOCKED[0]
    raise ClusterConfigError(
      f"the cluster settings are fixed by the first compile in this process (num_csx={fixed.num_csx}, "
      f"num_workers_per_csx={fixed.num_workers_per_csx}); got num_csx={num_csx}, "
      f"num_workers_per_csx={num_workers_per_csx}. Start a new process to change them."
    )
  return _LOCKED[0]


def locked_settings() -> ClusterSettings | None:
  """The settings fixed in this process, or None before the first compile."""
  return _LOCKED[0] if _LOCKED else None


def mesh(num_csx: int) -> jax.sharding.Mesh:
  """A 1-D mesh over the first ``num_csx`` devices, axis ``"csx"``."""
  devices = jax.devices()
  if num_csx > len(devices):
    raise ClusterConfigError(
      f"num_csx={num_csx} needs {num_csx} JAX devices; this process has {len(devices)}. On CPU, set "
      f"XLA_FLAGS=--xla_force_host_platform_device_count={num_csx} before JAX starts."
    )
  return jax.sharding.Mesh(np.asarray(devices[:num_csx]), (AXIS,))


def data_parallel_shardings(example_args: Sequence[Any], batch_argnums: Sequence[int], num_csx: int) -> tuple:
  """``in_shardings`` for `jax.jit`: batch arguments split on axis 0, the rest replicated.

  Raises:
    ClusterConfigError: a batch dimension not divisible by ``num_csx`` (the global batch is
      split evenly across systems), or no batch argument named.
  """
  if not batch_argnums:
    raise ClusterConfigError("num_csx > 1 needs batch_argnums: which arguments hold the global batch")
  m = mesh(num_csx)
  replicated = NamedSharding(m, PartitionSpec())
  split = NamedSharding(m, PartitionSpec(AXIS))
  shardings = []
  for i, arg in enumerate(example_args):
    if i not in batch_argnums:
      shardings.append(jax.tree.map(lambda _: replicated, arg))
      continue
    for leaf in jax.tree.leaves(arg):
      size = np.shape(leaf)[0] if np.ndim(leaf) else None
      if size is None or size % num_csx:
        raise ClusterConfigError(
          f"batch_size {size} is not divisible by num_csx={num_csx}: the global batch is split evenly "
          "across systems. Choose a batch_size that is a multiple of num_csx."
        )
    shardings.append(jax.tree.map(lambda _: split, arg))
  return tuple(shardings)
