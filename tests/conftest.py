"""JAX set-up for every test, done before JAX is first imported.

* CPU platform unless ``JAX_PLATFORMS`` says otherwise, with 4 forced CPU devices for sharding
  tests (``JAX_PLATFORMS=cuda,cpu`` runs the suite on a GPU and keeps those CPU devices, which
  the sharding tests take explicitly: `tests.devices`, docs/gpu.md);
* strict dtype promotion and rank promotion errors, so silent up-casts fail loudly;
* a derandomized hypothesis profile, so CI runs are reproducible; ``HYPOTHESIS_PROFILE=thorough``
  runs 8x the examples, fresh ones each run (not derandomized, no example database), to find
  tests that hold only for the examples CI happens to draw (`tests.values.examples` scales the
  tests' own ``max_examples`` with it).
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
  os.environ["XLA_FLAGS"] = f"{_flags} --xla_force_host_platform_device_count=4".strip()

import jax
import numpy as np
import pytest
from hypothesis import settings

jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")

settings.register_profile("ci", derandomize=True, deadline=None, max_examples=200, print_blob=True)
settings.register_profile("dev", deadline=None, max_examples=200)
settings.register_profile("thorough", deadline=None, max_examples=1600, database=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def rng() -> np.random.Generator:
  return np.random.default_rng(20261122)


@pytest.fixture
def standard_promotion():
  """JAX's standard dtype promotion instead of the suite's strict one, for code written for it:
  Hugging Face's models mix int and bool masks (``logical_and(attention_mask, causal)``)."""
  with jax.numpy_dtype_promotion("standard"):
    yield
