"""Compare `precision.round` with an independent reference on all 2^32 float32 inputs.

References (independent implementations, each with its own method):
  bfloat16, float16, float8_e4m3fn, float8_e5m2: ml_dtypes / NumPy casts (C++ bit manipulation)
  cbfloat16 and other formats: gfloat's ``round_ndarray`` (frexp/ldexp/floor arithmetic),
    run under jax.jit for speed. gfloat can fall back to NumPy with ``--gfloat-numpy`` (slow).

A mismatch is a result whose float32 bit pattern differs, except that any NaN equals any NaN.
Prints one line per format, then the total; exits 1 if anything mismatched. Writes JSON to
benchmarks/results/exhaustive_check.json.

  python benchmarks/exhaustive_check.py                       # cbfloat16 and bfloat16, all 2^32
  python benchmarks/exhaustive_check.py --formats float16,cbfloat16 --modes nearest_even,toward_zero
  python benchmarks/exhaustive_check.py --chunks 4            # a quick partial run (first 4 * 2^24)
  python benchmarks/exhaustive_check.py --integer-only         # the pure-integer kernel path
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import gfloat
import jax
import jax.numpy as jnp
import numpy as np

import precision
from precision import _kernel
from precision.testing import gfloat_format_info, reference_dtype, same_floats

CHUNK_BITS = 24
CHUNK = 1 << CHUNK_BITS
N_CHUNKS = 1 << (32 - CHUNK_BITS)
GFLOAT_MODES = {"nearest_even": gfloat.RoundMode.TiesToEven, "toward_zero": gfloat.RoundMode.TowardZero}
RESULTS = Path(__file__).resolve().parent / "results"


def chunk_inputs(start: jax.Array) -> jax.Array:
  """The float32 values whose bit patterns are start, start + 1, ..., start + CHUNK - 1."""
  bits = start + jax.lax.iota(jnp.uint32, CHUNK)
  return jax.lax.bitcast_convert_type(bits, jnp.float32)


def count_mismatches(ours: jax.Array, reference: jax.Array) -> jax.Array:
  ours_bits = jax.lax.bitcast_convert_type(ours, jnp.uint32)
  ref_bits = jax.lax.bitcast_convert_type(reference.astype(jnp.float32), jnp.uint32)
  same = (ours_bits == ref_bits) | (jnp.isnan(ours) & jnp.isnan(reference))
  return jnp.sum(~same, dtype=jnp.int32)


def ours(x: jax.Array, fmt: precision.FloatFormat, mode: str, integer_only: bool) -> jax.Array:
  if integer_only:  # the pure-integer kernel path (see precision._kernel)
    return _kernel.round_bits(x, fmt, mode, None, integer_only=True)
  return precision.round(x, fmt, mode)


def make_checker(fmt: precision.FloatFormat, mode: str, gfloat_numpy: bool, integer_only: bool):
  """A function chunk_index -> mismatch count, and the reference's name."""
  ours_fn = jax.jit(lambda start: ours(chunk_inputs(start), fmt, mode, integer_only))

  def host_checker(reference_fn):
    """Compare on the host with a NumPy reference function of the chunk's inputs."""

    def check(i: int) -> int:
      result = np.asarray(ours_fn(jnp.uint32(i * CHUNK)))
      x = np.arange(i * CHUNK, (i + 1) * CHUNK, dtype=np.uint64).astype(np.uint32).view(np.float32)
      with np.errstate(all="ignore"):
        reference = np.asarray(reference_fn(x)).astype(np.float32)
      return int(reference.size - np.count_nonzero(same_floats(result, reference)))

    return check

  dtype = reference_dtype(fmt)
  if dtype is not None and mode == "nearest_even":
    return host_checker(lambda x: x.astype(dtype)), f"{np.dtype(dtype).name} cast (ml_dtypes / NumPy)"
  info, rounding = gfloat_format_info(fmt), GFLOAT_MODES[mode]
  if gfloat_numpy:
    return host_checker(lambda x: gfloat.round_ndarray(info, x, rounding)), "gfloat round_ndarray (NumPy)"

  @jax.jit
  def both(start):
    x = chunk_inputs(start)
    with warnings.catch_warnings():
      # Without x64, gfloat's int64 significands become int32: exact, as they stay below 2^24.
      warnings.filterwarnings("ignore", "Explicitly requested dtype int64", UserWarning)
      reference = gfloat.round_ndarray(info, x, rounding)
    return count_mismatches(ours(x, fmt, mode, integer_only), reference)

  return (lambda i: int(both(jnp.uint32(i * CHUNK)))), "gfloat round_ndarray (under jax.jit)"


def run(
  formats: list[str], modes: list[str], chunks: int, gfloat_numpy: bool, integer_only: bool
) -> list[dict]:
  rows = []
  for name in formats:
    fmt = precision.get_format(name)
    for mode in modes:
      check, reference = make_checker(fmt, mode, gfloat_numpy, integer_only)
      t0 = time.perf_counter()
      mismatches = 0
      for i in range(chunks):
        mismatches += check(i)
        if (i + 1) % 32 == 0 or i + 1 == chunks:
          print(
            f"  {fmt.name} {mode}: {i + 1}/{chunks} chunks, {mismatches} mismatches, "
            f"{time.perf_counter() - t0:.0f} s",
            file=sys.stderr,
            flush=True,
          )
      seconds = time.perf_counter() - t0
      rows.append(
        dict(
          format=fmt.name,
          mode=mode,
          kernel="integer_only" if integer_only else "default",
          reference=reference,
          inputs=chunks * CHUNK,
          mismatches=mismatches,
          seconds=round(seconds, 1),
        )
      )
      print(
        f"{fmt.name:10s} {mode:13s} vs {reference}: {mismatches} mismatches in "
        f"{chunks * CHUNK} inputs ({seconds:.1f} s)",
        flush=True,
      )
  return rows


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--formats", default="cbfloat16,bfloat16", help="comma-separated format names")
  parser.add_argument("--modes", default="nearest_even", help="nearest_even and/or toward_zero")
  parser.add_argument(
    "--chunks", type=int, default=N_CHUNKS, help=f"check the first N of {N_CHUNKS} chunks of 2^24"
  )
  parser.add_argument("--gfloat-numpy", action="store_true", help="run gfloat on NumPy instead of JAX (slow)")
  parser.add_argument("--integer-only", action="store_true", help="check the pure-integer kernel path")
  parser.add_argument("--out", type=Path, default=RESULTS / "exhaustive_check.json")
  args = parser.parse_args(argv)
  if not 1 <= args.chunks <= N_CHUNKS:
    parser.error(f"--chunks must be in 1..{N_CHUNKS}")
  modes = [m.strip() for m in args.modes.split(",") if m.strip()]
  for m in modes:
    if m not in GFLOAT_MODES:
      parser.error(f"--modes: {m!r} is not one of {', '.join(GFLOAT_MODES)}")
  formats = [f.strip() for f in args.formats.split(",") if f.strip()]
  for name in formats:
    try:
      precision.get_format(name)
    except precision.FormatError as err:
      parser.error(f"--formats: {err}")
  t0 = time.perf_counter()
  rows = run(formats, modes, args.chunks, args.gfloat_numpy, args.integer_only)
  total = sum(r["mismatches"] for r in rows)
  seconds = time.perf_counter() - t0
  print(f"total: {total} mismatches ({seconds:.1f} s)")
  args.out.parent.mkdir(parents=True, exist_ok=True)
  args.out.write_text(
    json.dumps(
      dict(
        benchmark="exhaustive_check",
        jax=jax.__version__,
        devices=str(jax.devices()),
        total_mismatches=total,
        seconds=round(seconds, 1),
        rows=rows,
      ),
      indent=2,
    )
    + "\n"
  )
  return 1 if total else 0


if __name__ == "__main__":
  sys.exit(main())
