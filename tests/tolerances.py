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
  reason: str


def _unit_roundoff(fmt: precision.FloatFormat) -> float:
  return 2.0 ** -(fmt.mantissa_bits + 1)


ONE_ROUNDING: dict[str, Tolerance] = {
    f.name: Tolerance(
        rtol=_unit_roundoff(f),
        reason=f"nearest rounding in the normal range errs by at most half an ulp: u = 2^-{f.mantissa_bits + 1}",
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
