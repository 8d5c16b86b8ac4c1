"""Which devices a test runs on: the suite passes on CPUs (the default) and on a GPU.

On a GPU (``JAX_PLATFORMS=cuda,cpu``, see docs/gpu.md) the default backend has one device and
float32 products at the default precision run in TF32. Tests that shard over several devices
take CPU devices explicitly (`cpu_devices`) and run their references there too; tests of code
that takes devices of the default backend (wafer's ``num_csx``) skip with the reason
(`needs_devices`); references that must be true float32 say so (`true_float32`: ``jax.default_matmul_precision("highest")``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import precision
from precision.testing import assert_same_floats, same_floats
from tests.tolerances import SUMMATION_ORDER, device_kind


def cpu_devices(count: int) -> list[jax.Device]:
  """``count`` CPU devices for a test that shards over several, or skip it with the reason.

  A test compares its sharded and unsharded runs both on CPU devices: run its body under
  ``jax.default_device(devices[0])`` (on a GPU the unsharded run would otherwise use the GPU,
  whose products round differently)."""
  try:
    devices = jax.devices("cpu")
  except RuntimeError as error:  # JAX_PLATFORMS without cpu: the CPU backend is not initialised
    pytest.skip(
      f"needs {count} CPU devices, but the CPU backend is not available ({error}); use JAX_PLATFORMS=cuda,cpu"
    )
  if len(devices) < count:
    pytest.skip(
      f"needs {count} CPU devices, this process has {len(devices)} (tests/conftest.py sets "
      f"--xla_force_host_platform_device_count=4 unless XLA_FLAGS already has the flag)"
    )
  return devices[:count]


def needs_devices(count: int) -> None:
  """Skip, with the reason, a test whose code takes ``count`` devices of the default backend
  (``jax.devices()``: wafer's ``num_csx``); one GPU has one device."""
  have = jax.device_count()
  if have < count:
    pytest.skip(
      f"needs {count} devices of the default backend ({jax.default_backend()} has {have}); "
      "run it on CPU (JAX_PLATFORMS=cpu: tests/conftest.py forces 4 CPU devices)"
    )


def on_cpu() -> bool:
  """Whether the default backend is the CPU."""
  return jax.default_backend() == "cpu"


CPU_ONLY = "checks XLA CPU's own numerics (every product precision is true float32 there)"


def true_float32(fn: Callable[..., Any]) -> Callable[..., Any]:
  """``fn`` with its matrix products in true float32 on every device (traced under
  ``jax.default_matmul_precision("highest")``): the reference a float32 policy equals. On a CPU
  this is ``fn`` itself; on a GPU ``fn``'s own products would run in TF32."""

  @functools.wraps(fn)
  def wrapped(*args: Any, **kwargs: Any) -> Any:
    with jax.default_matmul_precision("highest"):
      return fn(*args, **kwargs)

  return wrapped


def assert_same_up_to_summation_order(got: Any, want: Any, fmt: Any, what: str = "") -> None:
  """``got`` equals ``want`` (pytrees of float32 arrays of ``fmt`` values) bit for bit on a CPU, and
  within the default backend's `tests.tolerances.SUMMATION_ORDER` elsewhere (GPU GEMMs sum the
  same products in orders that depend on the shape and dtype)."""
  tolerance = SUMMATION_ORDER[device_kind(jax.default_backend())]
  fmt = precision.get_format(fmt)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    a, b = np.asarray(a), np.asarray(b)
    if tolerance.ulps == 0:
      assert_same_floats(a, b, what)
      continue
    ulp = np.asarray(fmt.ulp(jnp.asarray(np.maximum(np.abs(a), np.abs(b)), jnp.float32)), np.float64)
    close = np.abs(a.astype(np.float64) - b.astype(np.float64)) <= tolerance.ulps * ulp
    ok = same_floats(a, b) | close
    assert np.all(ok), (
      f"{what}: {np.sum(~ok)} elements differ by more than {tolerance.ulps} ulps ({tolerance.reason})"
    )
