"""The ``wafer`` command line.

``wafer demo`` prints the float formats and a rounding example; the training runner
(``wafer run``), the cost model (``wafer estimate``) and the input analyser join it as they
are built.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import numpy as np

import precision
from precision._table import Table

_DEMO_FORMATS = ("float32", "bfloat16", "float16", "cbfloat16", "float8_e4m3fn")
_DEMO_VALUES = (np.pi, 1.0 / 3.0, 70000.0, 5.0e9, 1.0e-6, 1.0e-11)


def rounding_example(values: Sequence[float] = _DEMO_VALUES, formats: Sequence[str] = _DEMO_FORMATS) -> Table:
  """Each value (first rounded to float32) rounded to nearest even in each format."""
  x = np.asarray(values, np.float32)
  rows = []
  for name in formats:
    fmt = precision.get_format(name)
    rounded = np.asarray(precision.round(x, fmt))
    codes = np.asarray(precision.encode(x, fmt))
    width = (fmt.bits + 3) // 4
    rows.append([name] + [f"{v:.8g} (0x{int(c):0{width}x})" for v, c in zip(rounded, codes)])
  return Table(["format"] + [f"{v:.6g}" for v in x], rows, title="round(x, fmt) (bit pattern)")


def _demo(args: argparse.Namespace) -> int:
  print(precision.format_table())
  print()
  print(rounding_example())
  print()
  print(precision.cbfloat16.describe())
  return 0


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="wafer", description=__doc__.splitlines()[0])
  commands = parser.add_subparsers(dest="command", metavar="COMMAND")
  demo = commands.add_parser("demo", help="print the float formats and a rounding example")
  demo.set_defaults(handler=_demo)
  return parser


def main(argv: Sequence[str] | None = None) -> int:
  parser = build_parser()
  args = parser.parse_args(argv)
  if not hasattr(args, "handler"):
    parser.print_help(sys.stderr)
    return 2
  try:
    return args.handler(args)
  except BrokenPipeError:  # output piped into e.g. `head`: stop quietly, as Unix tools do
    sys.stdout = open(os.devnull, "w")
    return 0


if __name__ == "__main__":
  sys.exit(main())
