"""The ``wafer`` command line.

``wafer demo`` prints the float formats and a rounding example; ``wafer estimate`` estimates a
workload's rate on a Cerebras system and writes the compile report. The training runner
(``wafer run``) and the input analyser join them as they are built.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

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


class CommandError(Exception):
  """A command-line mistake: printed as one line, exit status 2."""


def _estimate_target(args: argparse.Namespace) -> tuple[Any, tuple[Any, ...], dict[str, Any], str]:
  """``(step_fn, example_args, estimate defaults, name)`` for what the command line names.

  Today that is a built-in workload (``--workload``); a params YAML (``--params``) plugs in here
  when the config system exists.
  """
  from wafer.costmodel import workloads

  if args.params is not None:
    raise CommandError("--params is not available yet (the YAML config system is a later milestone); "
                       f"use --workload, one of: {', '.join(sorted(workloads.WORKLOADS))}")
  if args.workload is None:
    names = ", ".join(sorted(workloads.WORKLOADS))
    raise CommandError(f"say what to estimate: --workload NAME, one of: {names}")
  try:
    w = workloads.get_workload(args.workload)
  except ValueError as exc:
    raise CommandError(str(exc).replace("workload=", "--workload ")) from None
  batch = args.batch_size if args.batch_size is not None else w.batch_size
  if batch < 1:
    raise CommandError(f"--batch_size {batch}; allowed: a positive integer")
  fn, example_args = w.example(batch)
  return fn, example_args, dict(w.estimate_kwargs), w.name


def _estimate(args: argparse.Namespace) -> int:
  import wafer
  from wafer.costmodel import EstimateError, TraceError, workloads

  if args.list:
    rows = [[w.name, w.batch_size, w.measurement.value if w.measurement else "", w.description]
            for w in workloads.WORKLOADS.values()]
    print(Table(["workload", "batch", "measured samples/s", "description"], rows, title="Built-in workloads"))
    return 0
  try:
    fn, example_args, kwargs, name = _estimate_target(args)
    for key in ("system", "mode", "num_csx", "micro_batch_size", "compute_format"):
      value = getattr(args, key)
      if value is not None:
        kwargs[key] = value
    report = wafer.estimate(fn, *example_args, name=name, **kwargs)
  except (CommandError, EstimateError, TraceError) as exc:
    print(f"wafer estimate: error: {exc}", file=sys.stderr)
    return 2
  print(report.to_text(), end="")
  if args.model_dir:
    paths = report.save(args.model_dir)
    print()
    for label in ("text", "json", "png"):
      print(f"wrote {paths[label]}")
  return 0


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="wafer", description=__doc__.splitlines()[0])
  commands = parser.add_subparsers(dest="command", metavar="COMMAND")
  demo = commands.add_parser("demo", help="print the float formats and a rounding example")
  demo.set_defaults(handler=_demo)
  est = commands.add_parser(
      "estimate", help="estimate samples/s on a Cerebras system and write the compile report",
      description="Estimate a step's rate on a Cerebras system (layer pipelined or weight streaming) and "
                  "print a compile report; with --model_dir, also write compile_report.txt, "
                  "compile_report.json and placement.png there.")
  target = est.add_argument_group("what to estimate")
  target.add_argument("--workload", metavar="NAME", help="a built-in workload (see --list)")
  target.add_argument("--params", metavar="FILE", help="a params YAML (not available yet)")
  target.add_argument("--list", action="store_true", help="list the built-in workloads and exit")
  est.add_argument("--system", help="wse2 (CS-2, default), wse3 (CS-3) or wse1 (CS-1)")
  est.add_argument("--mode", help="auto (default), pipeline or weight_streaming")
  est.add_argument("--batch_size", type=int, help="samples per step (default: the workload's)")
  est.add_argument("--num_csx", type=int, help="systems in data parallel (weight streaming)")
  est.add_argument("--micro_batch_size", type=int, help="force the micro-batch (default: searched)")
  est.add_argument("--compute_format", help="compute format (default: cbfloat16)")
  est.add_argument("--model_dir", metavar="DIR", help="write the report files into DIR")
  est.set_defaults(handler=_estimate)
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
