"""The one table of numerical tolerances, per format, each with its reason.

Rounding itself is tested bit-exactly (no tolerance). These bounds are for comparisons of
rounded results against unrounded ones.
"""

from __future__ import annotations

import dataclasses

import precision


@dataclasses.dataclass(frozen=True)
class Tolerance:
  rtol: float  # bound on |round(x) - x| / |x| for normal-range x
  ulps: float  # bound on |round(x) - x| in ulps of the format at x (precision.testing.assert_close)
  reason: str


def _unit_roundoff(fmt: precision.FloatFormat) -> float:
  return 2.0 ** -(fmt.mantissa_bits + 1)


ONE_ROUNDING: dict[str, Tolerance] = {
  f.name: Tolerance(
    rtol=_unit_roundoff(f),
    ulps=0.5,
    reason=(
      f"nearest rounding errs by at most half an ulp at x (below max), so by u = 2^-{f.mantissa_bits + 1} "
      "relative in the normal range"
    ),
  )
  for f in precision.formats.PREDEFINED
}

# Stochastic rounding: the sample mean of n independent roundings of x has standard deviation
# sigma = step * sqrt(p (1 - p) / n), p the round-up probability. Bound: SR_SIGMAS * sigma plus
# step * SR_SIGMAS^2 / n, which covers the small-count regime where n p is below ~SR_SIGMAS^2 and
# the normal approximation fails (Bernstein's inequality has the same two terms). A correct
# implementation fails it with probability < 1e-6 per check.
SR_SIGMAS = 5.0


def sr_mean_bound(step: float, p: float, n: int) -> float:
  """Largest |mean of n stochastic roundings - x| accepted; see SR_SIGMAS."""
  return SR_SIGMAS * step * (p * (1 - p) / n) ** 0.5 + step * SR_SIGMAS**2 / n


@dataclasses.dataclass(frozen=True)
class ModelTolerance:
  loss_rtol: float  # |loss - loss_f32| / |loss_f32|
  grad_rtol: float  # ||g - g_f32|| / ||g_f32|| over all parameters together
  reason: str


def _transformer_tolerance(f: precision.FloatFormat) -> ModelTolerance:
  u = _unit_roundoff(f)
  return ModelTolerance(
    loss_rtol=2 * u,
    grad_rtol=8 * u,
    reason=(
      f"a 2-layer encoder under autocast({f.name}), u = 2^-{f.mantissa_bits + 1}: the loss is a mean "
      "over tokens whose rounding errors (a few u each) largely cancel; measured <= 0.11u at levels "
      "0-2, bound 2u. Each gradient passes through ~10 roundings per layer on its way back; "
      "measured 3.3u-4.4u (norm-wise, all parameters), bound 8u."
    ),
  )


# One row per compute format: autocast of a small NNX transformer against float32.
AUTOCAST_TRANSFORMER: dict[str, ModelTolerance] = {
  name: _transformer_tolerance(precision.get_format(name)) for name in ("cbfloat16", "bfloat16", "float16")
}


@dataclasses.dataclass(frozen=True)
class StepTolerance:
  rtol_per_step: float  # ||h - h_f32|| / ||h_f32||, per step of a generated program
  reason: str


# tests/precision/test_autocast_generated.py: the activation of a generated program without
# discontinuous steps (comparisons, argmax, sorting, clipping) under a 16-bit policy.
GENERATED_PROGRAM: dict[str, StepTolerance] = {
  f.name: StepTolerance(
    rtol_per_step=64 * _unit_roundoff(f),
    reason=(
      f"u = 2^-{f.mantissa_bits + 1}: a step makes up to ~10 roundings (a scan or fori body of two "
      "matmuls and a tanh, rounded operands and results, chunk sums) each of relative error <= u, "
      "amplified by the step's condition number (<= ~4 for the vocabulary's steps on unit-scale "
      "inputs: tanh, exp(-h^2), cumprod of 1 + 0.1 tanh, softmax); the errors of the steps add. "
      "Bound 64u per step; the generated cases stay well inside it (see the test)."
    ),
  )
  for f in (precision.cbfloat16, precision.bfloat16, precision.float16)
}


@dataclasses.dataclass(frozen=True)
class CurveTolerance:
  rtol: float  # max over steps of |loss_mixed(step) - loss_f32(step)| / |loss_f32(step)|
  reason: str


# Whole training runs: BERT-tiny (the default job's config) for 24 AdamW steps from the same
# initial parameters on the same batches, mixed precision against float32.
LOSS_CURVE: dict[str, CurveTolerance] = {
  "cbfloat16": CurveTolerance(
    rtol=_unit_roundoff(precision.cbfloat16),
    reason=(
      "max over the steps: u = 2^-10 (not an error that accumulates). Both runs see the same batches and dropout masks and start from the "
      "same weights, so a step's loss differs by the rounding of that step's forward pass (<= 0.11u "
      "for the encoder, see AUTOCAST_TRANSFORMER) plus the drift of the weights, which AdamW keeps "
      "small while the rounded gradients point the same way. Measured with dropout 0.1: max 0.15u "
      "over 24 steps (median 0.02u), still 0.15u over 60 steps; without dropout 0.17u and 0.24u."
    ),
  ),
}


@dataclasses.dataclass(frozen=True)
class TransformTolerance:
  """How far two evaluations of one autocast program may differ when only XLA's compilation of
  them differs (``jit`` vs eager, ``vmap``, ``scan`` vs the unrolled loop, a 1x1 convolution vs
  its matmul): `docs/invariants.md`, `tests.values.assert_equal_up_to_fusion`."""

  float32_ulps: float  # a kept-float32 output: |a - b| <= float32_ulps * ulp_float32(max |b|)
  flip_ulps: float  # after a flipped rounding: |a - b| <= flip_ulps * ulp_compute(max |b|)
  reason: str


_FLOAT32_FUSION = (
  "XLA promises neither jit/eager nor fused/unfused bit equality of float32 code. Per kept-float32 "
  "op, the two compilations differ by: (a) FMA contraction: LLVM contracts a*b + c in a fused loop "
  "(XLA's default, no fast-math flag needed; gone with --xla_cpu_max_isa=AVX, i.e. without FMA "
  "units), skipping the rounding of a*b: <= 1/2 ulp of a*b, i.e. of the array's scale here (the "
  "vocabulary's kept multiply-adds, h * 1.7 + 0.25 and h * h + h, do not cancel at the scale); "
  "(b) XLA's own exp/log1p/tanh/rsqrt/erf approximations (<= 1-2 ulps from the correctly rounded "
  "value, not libm), whose Horner steps contract differently when vectorised in a fusion: <= 1 ulp "
  "between two evaluations. So <= 2 ulps of the scale per kept-float32 layer (measured: <= 2, "
  "in a quarter of the elements of exp(-x*x)*0.7+0.1 on an Intel Xeon and an AMD EPYC). A "
  "difference entering a later kept layer is carried with that layer's gain relative to the "
  "scale (<= 2: tanh, exp(-h^2), log1p(h^2), sin(h) * 2, h * 1.7); over the <= 4 layers of a "
  "generated program 2 * (1 + 2 + 4 + 8) = 30 -> 32 ulps. Still 2^-18 relative: far below one "
  "compute-format rounding (>= 2^-11), so a missing rounding or a wrong format cannot hide in it."
)
_FLIP = (
  "A rounding whose float32 input may differ by the float32 bound (or comes from a float32 sum "
  "whose order XLA may change: a matmul's accumulation, an approximated tanh/sin) flips to the "
  "neighbouring compute-format value when that input lies within the difference of a rounding "
  "boundary: one compute ulp, with probability ~ 2 * d * 2^(m - 23) per element (d the float32 "
  "difference in ulps, m the format's mantissa bits: ~1e-4 for cbfloat16). The later layers carry "
  "it with gain <= 2 relative to the scale (3 layers: 8) and a program may flip a few (4): 32 "
  "compute ulps of the scale. Layer norm of a nearly constant row and a cond on the sign of a sum "
  "within the flip of 0 are not bounded by this (ill-conditioned; see docs/invariants.md)."
)

# Per backend: XLA's CPU and GPU compilers differ in what they fuse and in the summation order of
# dots and reductions (a GPU splits a sum over threads and reduces the partial sums as a tree).
TRANSFORM_EQUALITY: dict[str, TransformTolerance] = {
  "cpu": TransformTolerance(float32_ulps=32, flip_ulps=32, reason=_FLOAT32_FUSION + " " + _FLIP),
  "gpu": TransformTolerance(
    float32_ulps=64,
    flip_ulps=32,
    reason=(
      _FLOAT32_FUSION + " On a GPU a fused reduction also sums in another (tree) order than the unfused one: "
      "reordering a sum of n terms moves it by <= (n - 1) ulps of sum |x_i|, <= 7 for the rows of "
      "8 here, <= 2x the CPU bound: 64 (measured on an H200, jax 0.11.2: jit and eager agree "
      "on elementwise code; the 8-element row sums of exp(h) * 1.5 differ by 1 ulp in a third "
      "of the rows). " + _FLIP
    ),
  ),
}


def transform_tolerance(backend: str | None = None) -> TransformTolerance:
  """The row of `TRANSFORM_EQUALITY` for ``backend`` (default: JAX's default backend)."""
  import jax

  backend = backend or jax.default_backend()
  return TRANSFORM_EQUALITY["gpu" if backend in ("gpu", "cuda", "rocm") else "cpu"]


# ---- per device: float32 summation order (GPU portability; applied by tests/devices.py) ----


@dataclasses.dataclass(frozen=True)
class DeviceTolerance:
  ulps: float  # |a - b| <= ulps * (ulp of the compute format at max(|a|, |b|)); 0: bit for bit
  reason: str


# Two computations of the same rounded products whose float32 sums may run in different orders:
# native bfloat16 / float16 and TF32 products (``products=tf32``), a batched product (vmap) and
# its per-example products, jit and eager. Keyed by the default backend's kind: `device_kind()`.
SUMMATION_ORDER: dict[str, DeviceTolerance] = {
  "cpu": DeviceTolerance(
    ulps=0.0,
    reason=(
      "bit for bit: XLA CPU computes every product precision as true float32 and sums the products "
      "of these tests' batched and unbatched, jitted and eager forms in the same order (measured: "
      "the suite compares them bitwise and passes)"
    ),
  ),
  "gpu": DeviceTolerance(
    ulps=4.0,
    reason=(
      "cuBLAS, cuBLASLt and Triton choose a GEMM algorithm (tiles, split-K) per shape, dtype and "
      "precision, so the same exact products are summed in different float32 orders; two such sums "
      "of K <= 64 products differ by <= 2 gamma_K(2^-24) sum|p| (< 2^-17 relative), far below a "
      "16-bit format's half ulp, so a product's rounded result is equal or one rounding (1 ulp) "
      "apart where its sum lies next to a rounding boundary. The compared programs have at most two "
      "products in sequence with a tanh between (condition <= 2): 4 ulps"
    ),
  ),
}


def device_kind(platform: str) -> str:
  """The `SUMMATION_ORDER` key of a JAX platform: ``cpu``, or ``gpu`` for cuda and rocm."""
  return "cpu" if platform == "cpu" else "gpu"
