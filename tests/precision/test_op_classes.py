"""Every primitive of the installed JAX is known to autocast: a JAX upgrade that brings a new one
fails here, by name, instead of leaving it unrounded in float32 (JAX 0.11.2's ``one_minus_square``,
the derivative of ``tanh``, ran unrounded under every policy until it was classified)."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import precision
from precision import _jax_compat as compat
from precision._op_classes import CONTROL_FLOW, PRIMITIVE_CLASSES
from precision.testing import assert_same_floats

# Primitives autocast leaves to its per-equation checks, by why. A new JAX primitive belongs either
# in precision/_op_classes.py (it computes floats the policy should round) or here, with its reason.
# fmt: off
NOT_CLASSIFIED = {
  # no float result: the pass's dtype check leaves integer, bool, key and token results untouched
  "no float result": (
    "and", "or", "not", "xor", "eq", "ne", "lt", "le", "gt", "ge", "eq_to", "le_to", "lt_to", "is_finite",
    "argmax", "argmin", "clz", "population_count", "reduce_xor", "shift_left", "shift_right_arithmetic",
    "shift_right_logical", "after_all", "create_token", "dce_sink", "iota_2x32_shape", "random_bits",
    "random_fold_in", "random_seed", "random_split", "random_unwrap", "random_wrap", "random_clone",
    "threefry2x32", "threefry4x32", "philox2x32", "philox4x32", "rng_bit_generator",
    "lu_pivots_to_permutation", "dim_as_value", "dimension_size", "shape_assertion", "check",
    "debug_callback", "debug_print", "inspect_sharding", "platform_index",
  ),
  # float work autocast does not round: left float32, listed in the cast report, warned about
  "float, not rounded (reported)": (
    "cholesky", "cholesky_update", "eig", "eigh", "geqp3", "geqrf", "hessenberg", "householder_product",
    "lu", "ormqr", "qr", "schur", "svd", "symmetric_product", "triangular_solve", "tridiagonal",
    "tridiagonal_solve", "fft", "complex", "approx_top_k", "random_gamma", "rng_uniform",
    "select_and_scatter", "scaled_dot", "scaled_matmul", "scaled_matmul_wrapper",
    "dot_product_attention_fwd", "dot_product_attention_bwd", "dot_product_attention_fwd_wrapper",
    "dot_product_attention_bwd_wrapper", "dot_product_attention_fp8_fwd", "dot_product_attention_fp8_bwd",
    "dot_product_attention_fp8_fwd_wrapper", "dot_product_attention_fp8_bwd_wrapper", "pure_callback",
    "io_callback", "ffi_call", "empty", "empty2", "tie", "to_edtype", "from_edtype", "layout_constraint",
    "reduced_vary_cast_p", "vary_unreduced_cast_p",
  ),
  # carry a computation: refused with an UnhandledPrimitiveError naming the user's line
  "higher-order, refused": (
    "call", "custom_jvp_call_jaxpr", "custom_vmap_call", "custom_partitioning", "custom_lin",
    "linear_call", "remat_opt", "unreachable", "cudnn_fusion", "composite", "run_state", "call_exported",
    "call_hi_primitive", "call_hi_primitive_linearized", "xla_metadata_call", "program_order",
  ),
  # collectives and their asynchronous halves, outside what autocast's programs (shard_map bodies
  # of psum / all_gather / ppermute, classified) contain
  "collective halves": (
    "all_gather_done", "all_gather_invariant", "all_gather_reduced", "all_gather_reduced_start",
    "all_gather_start", "all_to_all_done", "all_to_all_start", "pbroadcast_done", "pbroadcast_start",
    "ppermute_done", "ppermute_start", "precv", "preduced", "psend", "psum_done", "psum_invariant_start",
    "psum_start", "ragged_all_to_all", "reduce_scatter_done", "reduce_scatter_start", "unreduced_psum",
    "unreduced_psum_start", "unreduced_reduce_scatter", "unreduced_reduce_scatter_start", "unreduced_pmax",
    "unreduced_pmin",
  ),
  # mutable references and boxes (``jax.new_ref``, state discharge, hijax): no jaxpr that autocast
  # reads holds them (``jax.make_jaxpr`` of a plain function discharges them)
  "references": (
    "accum_grad_in_ref", "empty_ref", "free_ref", "freeze", "new_ref", "stage", "addupdate",
    "broadcast_to", "create_linear", "get", "pin", "swap", "unpin", "box_get", "box_set", "new_box",
    "log_extend", "log_read", "new_log",
  ),
}
# fmt: on


def test_every_primitive_of_the_installed_jax_is_known():
  known = set(PRIMITIVE_CLASSES) | set(CONTROL_FLOW) | {n for names in NOT_CLASSIFIED.values() for n in names}
  new = {name: module for name, module in compat.jax_primitives().items() if name not in known}
  assert not new, (
    f"JAX {jax.__version__} defines primitives autocast does not know: {new}. Classify each in "
    "precision/_op_classes.py (a float result the policy should round), or list it in NOT_CLASSIFIED "
    "with why"
  )


def test_the_lists_do_not_overlap_the_table():
  listed = [n for names in NOT_CLASSIFIED.values() for n in names]
  assert len(listed) == len(set(listed))
  assert not set(listed) & set(PRIMITIVE_CLASSES)


def test_the_answer_does_not_depend_on_what_else_was_imported():
  """Orbax imports jax.experimental.multihost_utils (two primitives); jax.experimental.sparse defines
  dozens. Which tests ran before in the process must not change the answer."""
  before = compat.jax_primitives()
  import jax.experimental.sparse  # noqa: F401

  assert compat.jax_primitives() == before


def test_the_everyday_primitives_are_found():
  """The enumeration sees what programs use (a broken enumeration would pass the first test)."""
  found = compat.jax_primitives()
  assert {"dot_general", "tanh", "exp", "reduce_sum", "scan", "cond", "random_bits", "add"} <= set(found)


@pytest.mark.skipif(
  not hasattr(jax.lax, "one_minus_square"), reason=f"JAX {jax.__version__} has no one_minus_square"
)
@pytest.mark.parametrize("fmt", ["bfloat16", "cbfloat16"])
def test_one_minus_square_is_rounded_once(fmt):
  """JAX 0.11.2's derivative of tanh: ``1 - x**2`` computed in float32 (as JAX computes it),
  rounded once to the compute format."""
  x = precision.round(jnp.linspace(-0.999, 0.999, 257, dtype=jnp.float32), fmt)
  got = precision.autocast(jax.lax.one_minus_square, f"c={fmt}")(x)
  want = precision.round(jax.lax.one_minus_square(x), fmt)
  assert_same_floats(got, want)


@pytest.mark.parametrize("transform", ["eager", "jit", "grad", "vmap"])
def test_the_warning_names_the_users_line(transform):
  """Under jit, grad or vmap an autocast function is called from JAX's tracing: the warning still
  points at the line that called it."""
  f = precision.autocast(lambda a: jnp.sum(jnp.linalg.solve(a, jnp.ones((3,)))), "c=bf16")
  call = {"eager": f, "jit": jax.jit(f), "grad": jax.grad(f), "vmap": jax.vmap(f)}[transform]
  a = jnp.eye(3) * 2.0
  with pytest.warns(precision.UnknownPrimitiveWarning) as seen:
    call(a if transform != "vmap" else a[None])
  assert {w.filename for w in seen} == {__file__}


def test_the_derivative_of_tanh_is_classified_on_every_jax():
  """JAX 0.11.2 writes tanh's derivative as one_minus_square; 0.10 as sub, mul and add."""
  x = jnp.linspace(-2.0, 2.0, 9)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    precision.autocast(jax.vmap(jax.grad(jnp.tanh)), "c=bf16")(x)
    jax.grad(lambda x: jnp.sum(precision.autocast(jnp.tanh, "c=bf16")(x)))(x)


def test_a_solve_warns_and_inside_a_float32_region_does_not():
  """jnp.linalg.solve (lu, triangular_solve) runs unrounded: said once per trace, with the way to
  keep it float32 on purpose."""
  a, b = jnp.eye(3) * 2.0, jnp.ones((3,))
  with pytest.warns(precision.UnknownPrimitiveWarning, match=r"lu \(1 equation\), triangular_solve") as seen:
    precision.autocast(lambda a, b: jnp.tanh(jnp.linalg.solve(a, b)), "c=bf16")(a, b)
  assert "float32_region" in str(seen[0].message)

  def in_region(a, b):
    with precision.float32_region():
      x = jnp.linalg.solve(a, b)
    return jnp.tanh(x)

  with warnings.catch_warnings():
    warnings.simplefilter("error")
    got = precision.autocast(in_region, "c=bf16")(a, b)
  # x = 0.5 exactly; tanh of a float32-region value stays float32 (autocast's documented rule)
  np.testing.assert_allclose(np.asarray(got), np.tanh(0.5), rtol=1e-6)


def test_log2_is_rounded_on_every_jax():
  """JAX 0.11.2's jnp.log2 is a primitive of its own (0.10: log, then a division): a transcendental,
  under its rule (float32 by default, as PyTorch autocast's list; rounded when the rule says so)."""
  x = jnp.linspace(0.1, 9.0, 64)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    kept = precision.autocast(jnp.log2, "c=bf16")(x)
    got = precision.autocast(jnp.log2, "c=bf16,transcendental=round")(x)
  assert precision.cast_report(jnp.log2, "c=bf16", x).unknown_primitives == {}
  assert_same_floats(got, precision.round(got, "bf16"))  # bfloat16 values
  assert not np.array_equal(np.asarray(got), np.asarray(kept))
