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
