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
# ulp * sqrt(p (1 - p) / n), p the round-up probability. A test bound of SR_SIGMAS standard
# deviations fails a correct implementation with probability < 6e-7 per check (normal tail).
SR_SIGMAS = 5.0
