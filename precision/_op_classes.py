"""Which op class each JAX primitive belongs to (the table `precision.autocast` reads).

Classes that compute (their treatment comes from the `Policy` rule table): ``matmul``,
``attention_matmul`` (decided per equation), ``elementwise``, ``transcendental``,
``reduction`` and ``attention_softmax`` (decided by data flow). Classes that never round:

* ``exact``: ops whose float result is one of their inputs' values, up to sign (max, min,
  neg, abs, select, clamp, floor, sort, ...). Never rounded: the result has the joined
  state of the inputs (rounded values give a rounded value).
* ``data_movement``: reshapes, transposes, slices, gathers, concatenation, padding,
  sharding annotations: values move, none change.
* ``cast``: explicit conversions the user wrote (``astype``, ``reduce_precision``,
  ``precision.round``): left exactly as written.
* ``control_flow``: jit, remat, scan, while, cond, custom_jvp/custom_vjp, shard_map: the pass
  recurses into their bodies.
* ``integer``: any equation without float or complex results (comparisons, integer arithmetic,
  RNG bits): untouched.
* ``other_float``: an equation whose float results are not float32 (float64 with
  ``jax_enable_x64``, complex values (an FFT), bfloat16 or float16 values the program computes
  itself): untouched, and
  listed so that a program that escapes the policy this way shows it.
* ``unknown``: float primitives not in this table: left unchanged, listed in the report, and
  named in an `UnknownPrimitiveWarning` (a new JAX may bring new primitives: JAX 0.11.2's
  ``one_minus_square``, the derivative of ``tanh``, was one).

`PRIMITIVE_CLASSES` is a dict: add a primitive (for example a custom op) with
``precision.PRIMITIVE_CLASSES["my_op"] = "elementwise"``; an entry under another class than
matmul, elementwise, transcendental, reduction, exact, data_movement or cast is refused (a typo would
leave the primitive unrounded).
"""

from __future__ import annotations


class UnknownPrimitiveWarning(UserWarning):
  """`precision.autocast` ran float primitives that `PRIMITIVE_CLASSES` does not classify: they
  computed in float32 and were not rounded. The message names each one and how to classify it
  (``precision.PRIMITIVE_CLASSES["name"] = "elementwise"``); `precision.cast_report` lists them
  under ``unknown_primitives``."""


MATMUL_PRIMITIVES = ("dot_general", "conv_general_dilated", "ragged_dot_general", "ragged_dot")

_ELEMENTWISE = (
    "add", "add_any", "sub", "mul", "div", "rem", "sqrt", "cbrt", "square", "integer_pow",
    "tanh", "logistic", "erf", "erfc", "sin", "cos", "atan", "atan2", "atanh", "asinh", "acosh",
    "nextafter", "mulhi",
    "one_minus_square",  # 1 - x**2 (JAX 0.11.2: the derivative of tanh), one rounding
)  # fmt: skip
_TRANSCENDENTAL = (
    "exp", "exp2", "log", "log1p", "expm1", "pow", "rsqrt", "tan", "sinh", "cosh", "asin", "acos",
    "erf_inv", "lgamma", "digamma", "igamma", "igammac", "igamma_grad_a", "polygamma", "zeta",
    "bessel_i0e", "bessel_i1e", "regularized_incomplete_beta", "random_gamma_grad",
    "log2",  # (JAX 0.11.2: jnp.log2, which 0.10 wrote as log and a div)
)  # fmt: skip
_REDUCTION = (
    "reduce_sum", "reduce_prod", "cumsum", "cumprod", "cumlogsumexp", "reduce_window_sum",
    "reduce_window", "reduce", "scatter_add", "scatter_sub", "scatter_mul", "scatter-add",
    "scatter-sub", "scatter-mul", "psum", "psum2",
    "psum_invariant", "select_and_scatter_add", "select_and_gather_add", "reduce_scatter",
)  # fmt: skip
_EXACT = (
    "max", "min", "neg", "abs", "sign", "select_n", "clamp", "floor", "ceil", "round", "copy",
    "copy_p", "reduce_max", "reduce_min", "cummax", "cummin", "reduce_window_max",
    "reduce_window_min", "sort", "top_k", "scatter_max", "scatter_min", "scatter-max", "scatter-min",
    "pmax", "pmin",
    "reduce_and", "reduce_or",
)  # fmt: skip
_DATA_MOVEMENT = (
    "reshape", "broadcast_in_dim", "transpose", "squeeze", "expand_dims", "slice", "dynamic_slice",
    "dynamic_update_slice", "gather", "scatter", "concatenate", "pad", "rev", "split", "tile",
    "stack", "unstack", "stop_gradient", "sharding_constraint", "mesh_cast", "reshard",
    "device_put", "optimization_barrier", "name", "pvary", "pbroadcast", "all_gather",
    "all_to_all", "ppermute", "psum_scatter", "axis_index", "iota", "full", "zeros_like",
    "broadcast", "real", "imag", "conj", "squeeze_p",
    "xla_metadata_value",  # (JAX 0.11: an identity that tags its value's producer for XLA)
    "host_local_array_to_global_array", "global_array_to_host_local_array",  # (multihost_utils)
    "relayout", "with_memory_space_constraint",  # (JAX 0.11.2: a layout, a memory space; same values)
)  # fmt: skip
_CAST = ("convert_element_type", "reduce_precision", "bitcast_convert_type", "precision_round")
CONTROL_FLOW = (
    "jit", "pjit", "closed_call", "core_call", "eval_jaxpr", "remat2", "checkpoint", "scan", "while", "cond",
    "custom_jvp_call", "custom_vjp_call", "shard_map", "custom_linear_solve",
)  # fmt: skip


class _PrimitiveClasses(dict):  # type: ignore[type-arg]
  """A dict that refuses an entry it could not use: a class name with a typo would make the pass
  treat the primitive as unknown and leave it unrounded, silently."""

  @staticmethod
  def _check(name: object, op_class: object) -> None:
    if not isinstance(name, str):
      raise TypeError(f"PRIMITIVE_CLASSES[{name!r}]: a key is a JAX primitive's name (a str)")
    if op_class not in ENTRY_CLASSES:
      raise ValueError(
        f"PRIMITIVE_CLASSES[{name!r}] = {op_class!r}: not an op class; allowed: {', '.join(ENTRY_CLASSES)}"
      )

  def __setitem__(self, name: str, op_class: str) -> None:
    self._check(name, op_class)
    super().__setitem__(name, op_class)

  def update(self, *args: object, **kwargs: str) -> None:  # type: ignore[override]
    entries = dict(*args, **kwargs)
    for name, op_class in entries.items():  # every entry checked before any is written
      self._check(name, op_class)
    super().update(entries)

  def setdefault(self, name: str, op_class: str | None = None) -> str:  # type: ignore[override]
    if name not in self:
      self[name] = op_class  # (None, dict's default, is no class: refused)
    return self[name]

  def __ior__(self, other: object) -> _PrimitiveClasses:  # type: ignore[override,misc]
    self.update(other)
    return self


#: JAX primitive name -> autocast op class (matmul, elementwise, transcendental, reduction, exact, ...).
#: Add an entry for a primitive autocast does not know: ``PRIMITIVE_CLASSES["my_op"] = "elementwise"``
#: (a class the error does not list is refused).
PRIMITIVE_CLASSES: dict[str, str] = _PrimitiveClasses()
_TABLE = (
  ("matmul", MATMUL_PRIMITIVES),
  ("elementwise", _ELEMENTWISE),
  ("transcendental", _TRANSCENDENTAL),
  ("reduction", _REDUCTION),
  ("exact", _EXACT),
  ("data_movement", _DATA_MOVEMENT),
  ("cast", _CAST),
)
ENTRY_CLASSES = tuple(op_class for op_class, _ in _TABLE)
"""The classes a user's primitive can be entered under (``control_flow`` is the pass's own: a primitive
carrying a body needs a handler; the others are decided per equation)."""
PRIMITIVE_CLASSES.update({name: op_class for op_class, names in _TABLE for name in names})
dict.update(PRIMITIVE_CLASSES, dict.fromkeys(CONTROL_FLOW, "control_flow"))  # (the pass's own handlers)
