"""The ``wafer`` command line.

* ``wafer run [--params FILE] [--mode MODE] [--model_dir DIR] [--validate_only | --compile_only]
  [--num_processes N --process_id I --coordinator_address HOST:PORT] [key.path=value ...]``: train
  or evaluate (without ``--params``: the embedded default job, BERT-tiny); one process per host
  with the process flags (or the environment ``jax.distributed`` reads);
* ``wafer estimate (--params FILE | --workload NAME)``: the wafer cost model's compile report;
* ``wafer analyze-input --params FILE``: input pipeline samples/s with 1..N workers against the
  model's consumption; recommends ``num_workers_per_csx``;
* ``wafer sweep``: the same training run once per compute format (and level), compared;
* ``wafer demo``: the float formats and a rounding example.

Exit status: 0 on success; 1 (`wafer.errors.USER_ERROR_EXIT`) when a command stops on an error the user
can fix (a `wafer.errors.WaferError`, or precision's `PolicyError` / `FormatError`), which `main`
prints as one line, ``wafer <command>: error: <message>``, without a traceback; 2 for a command line
that argparse cannot parse; 130 on ctrl-C. Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import _thread
import argparse
import contextlib
import dataclasses
import os
import re
import signal
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import precision
from precision._table import Table
from wafer.config.schema import MODES
from wafer.costmodel.estimate import SEARCHED_MICRO_BATCH, canonical_mode
from wafer.costmodel.release import SPEEDUP_2_0
from wafer.errors import USER_ERROR_EXIT, CommandError, RunInterrupted

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


_RUN_FLAGS = ("system", "mode", "release", "num_csx", "micro_batch_size", "compute_format")
"""The ``wafer estimate`` flags that are `wafer.estimate` arguments of the same name."""


def _estimate_target(args: argparse.Namespace) -> tuple[Any, tuple[Any, ...], dict[str, Any], str]:
  """``(step_fn, example_args, estimate defaults, name)`` for what the command line names: a params
  YAML (``--params``: its train step) or a built-in workload (``--workload``: its published run's
  conditions, less those the command line replaces: `_workload_conditions`)."""
  from wafer.costmodel import workloads

  if args.batch_size is not None and args.batch_size < 1:
    raise CommandError(f"--batch_size {args.batch_size}; allowed: a positive integer")
  if args.params is not None:
    return _params_target(args)
  if args.workload is None:
    names = ", ".join(sorted(workloads.WORKLOADS))
    raise CommandError(f"say what to estimate: --workload NAME, one of: {names}")
  if args.overrides:
    raise CommandError(
      f"{args.overrides[0]}: key.path=value overrides change a --params file; a --workload has no params "
      "file (its options are --batch_size, --system, --mode, --release, --num_csx, --micro_batch_size, "
      "--compute_format)"
    )
  try:
    w = workloads.get_workload(args.workload)
  except ValueError as exc:
    raise CommandError(str(exc).replace("workload=", "--workload ")) from None
  batch = args.batch_size if args.batch_size is not None else w.batch_size
  fn, example_args = w.example(batch)
  return fn, example_args, _workload_conditions(args, w), w.name


def _workload_conditions(args: argparse.Namespace, w: Any) -> dict[str, Any]:
  """The workload's conditions (``estimate_kwargs``: those its published run was measured under) that
  still apply to the run the command line asks for.

  A flag given wins over the condition of the same name. The published run's mode and micro-batch
  describe that run only: ``--release`` or ``--mode`` drops its mode (the release, or the mode given,
  decides); ``--batch_size``, ``--num_csx``, ``--release`` or ``--mode`` drops its micro-batch (searched
  instead), as does a batch whose samples per system are fewer than it; layer pipelined (``--mode
  pipeline``) drops its systems in data parallel; ``--system`` naming another chip drops the
  conditions of the run's chip (its clock, rectangle and micro-batch). What is kept and what is dropped is stated in
  ``args.workload_notes``, which `_estimate` adds to the report's notes.
  """
  pinned = dict(w.estimate_kwargs)
  given = {k for k in (*_RUN_FLAGS, "batch_size") if getattr(args, k) is not None}
  dropped: list[str] = []

  def drop(key: str, why: str) -> None:
    if key in pinned and key not in given:
      dropped.append(f"{key} {_condition(pinned.pop(key))} ({why})")

  changed = [f"--{k}" for k in ("batch_size", "num_csx", "release", "mode") if k in given]
  if {"release", "mode"} & given:
    deciding = [f for f in changed if f in ("--release", "--mode")]
    drop("mode", f"{' and '.join(deciding)} {'decides' if len(deciding) == 1 else 'decide'} the mode")
  if changed:
    drop(
      "micro_batch_size",
      f"{' and '.join(changed)} {'changes' if len(changed) == 1 else 'change'} the run: searched",
    )
  batch = args.batch_size if args.batch_size is not None else w.batch_size
  systems = args.num_csx if args.num_csx is not None else pinned.get("num_csx", 1)
  mb = pinned.get("micro_batch_size")
  if isinstance(mb, int) and isinstance(systems, int) and systems >= 1 and mb > batch // systems:
    drop("micro_batch_size", f"more than the {batch // systems} samples per system: searched")
  if args.mode is not None and canonical_mode(str(args.mode)) == "pipeline":
    drop("num_csx", "layer pipelined runs on one system")
  if "system" in given and _chip_name(args.system) != _chip_name(pinned.get("system", args.system)):
    for key in ("clock_hz", "rect"):  # conditions of the published run's chip
      drop(key, "--system changes the chip")
    drop("micro_batch_size", "--system changes the chip: searched")
  kept = [f"{k} {_condition(v)}" for k, v in pinned.items() if k not in given]
  notes = []
  if kept:
    notes.append(
      f"workload {w.name}: {', '.join(kept)}: the published run's conditions (a flag given wins; "
      "--batch_size, --num_csx, --release or --mode drop its micro-batch, --release or --mode its mode)"
    )
  if dropped:
    notes.append(f"workload {w.name}: not the published run's {'; '.join(dropped)}")
  args.workload_notes = notes
  args.workload_mode = pinned.get("mode") if "mode" not in given else None
  args.workload_pinned = (
    w.name,
    {k: v for k, v in pinned.items() if k not in given}
    | ({} if "batch_size" in given else {"batch_size": w.batch_size}),
  )
  return pinned


_ARGUMENT = re.compile(rf"(?<![\w.])({'|'.join((*_RUN_FLAGS, 'batch_size'))})=(?:'([^']*)'|([^\s;,)']+))")
"""``name=value`` of a `wafer.estimate` argument that a `wafer estimate` flag sets (`_as_flags`)."""


def _as_flags(text: str, workload: tuple[str, Mapping[str, Any]] | None = None) -> str:
  """``wafer.estimate``'s wording of its arguments (``num_csx=2``, ``mode='pipeline'``) as the flags a
  `wafer estimate` user types (``--num_csx 2``, ``--mode pipeline``); a params key (``train_input.
  micro_batch_size=``) is left as it is, and so is the value a workload's published run set
  (``workload``: its name and those arguments' values), which says so instead of naming a flag not
  given; another value of that argument (advice) is a flag.

  >>> print(_as_flags("num_csx=2 with mode='pipeline' (use mode='weight_streaming'); train_input.batch_size=3"))
  --num_csx 2 with --mode pipeline (use --mode weight_streaming); train_input.batch_size=3
  >>> print(_as_flags("mode='weight_streaming' is faster than mode='pipeline'", ("bert", {"mode": "pipeline"})))
  --mode weight_streaming is faster than mode 'pipeline' (workload bert's published run)
  """
  name, pinned = workload or ("", {})
  said: set[str] = set()

  def flag(m: re.Match) -> str:
    value = (m[2] if m[2] is not None else m[3]) or chr(39) * 2
    colon = ":" if value.endswith(":") else ""
    bare = value.removesuffix(":")
    if m[1] in pinned and m[1] not in said and bare == _condition(pinned[m[1]]):  # the run's value, once
      said.add(m[1])
      return f"{m[1]} {bare if m[2] is None else repr(bare)} (workload {name}'s published run){colon}"
    return f"--{m[1]} {value}"

  return _ARGUMENT.sub(flag, text)


def _chip_name(system: Any) -> str:
  """The chip of a ``--system`` value (``"WSE-2"``), or the value itself when it names none (the
  estimate's own check then refuses it)."""
  from wafer.costmodel.hardware import get_system

  try:
    return get_system(system).chip.name
  except Exception:  # noqa: BLE001 - an unknown system: wafer.estimate says what is allowed
    return str(system)


def _condition(value: Any) -> str:
  """A workload condition as the notes show it: ``weight_streaming``, ``112``, ``(720, 720)``."""
  return f"{value:g}" if isinstance(value, float) else str(value)


def _params_target(args: argparse.Namespace) -> tuple[Any, tuple[Any, ...], dict[str, Any], str]:
  """The train step of a params file, at its batch size, with its state shapes."""
  from wafer import runner, train
  from wafer.compile import cheap_sharding_probes
  from wafer.costmodel.estimate import run_inputs

  overrides = list(args.overrides or ())
  flags: dict[str, str] = {}  # override -> the flag it came from, which a problem with it names
  for flag, key in (  # each flag replaces the file's value before the file is checked
    ("batch_size", "train_input.batch_size"),  # the params file's batch: the step is traced at it
    ("num_csx", "runconfig.num_csx"),  # the file's micro-batch is checked per system of the run
    ("micro_batch_size", "train_input.micro_batch_size"),
  ):
    value = getattr(args, flag)
    if value is not None:
      value = "auto" if value == _SEARCH else value
      overrides.append(f"{key}={value}")
      flags[overrides[-1]] = f"--{flag} {value}"
  refuse_flag_and_override(args.overrides or (), flags)
  p = runner.load_plan(args.params, overrides, flags=flags)
  for line in p.params.notes:  # what the loader inferred, ignored or translated, as `wafer run` prints
    print(line, file=sys.stderr, flush=True)
  with cheap_sharding_probes():
    state, batch = train.step_shapes(p.task, p.optimizer, p.loss_scale, p.seed)  # no weights, no data
  if args.model_dir is None:
    args.model_dir = p.runconfig.model_dir
  kwargs = {"batch_size": p.task.batch_size, "num_csx": p.runconfig.num_csx, "policy": p.policy}
  kwargs.update(run_inputs(p.params))  # the file's micro_batch_size as given, its release
  kwargs["batch_argnums"] = (1,)  # the train step's (state, batch): the state is never data
  return train.make_train_step(p.task, p.optimizer, p.policy), (state, batch), kwargs, p.task.name


def refuse_flag_and_override(overrides: Sequence[str], flags: Mapping[str, str]) -> None:
  """Refuse a ``key.path=value`` the user typed for a key a flag sets to another value: the flag's override
  comes last and would win silently (``--model_dir a runconfig.model_dir=b``, ``--mode train
  runconfig.mode=eval``).

  Args:
    overrides: the overrides as the user typed them.
    flags: the override each flag made (``runconfig.mode=train``) -> the flag as typed (``--mode train``).

  Raises:
    CommandError: naming both and what to do.

  >>> refuse_flag_and_override(["runconfig.mode=train"], {"runconfig.mode=train": "--mode train"})
  >>> refuse_flag_and_override(["runconfig.mode=eval"], {"runconfig.mode=train": "--mode train"})
  Traceback (most recent call last):
  ...
  wafer.errors.CommandError: runconfig.mode=eval and --mode train both set runconfig.mode: the flag would win; give one of them
  >>> refuse_flag_and_override(["runconfig={model_dir: b}"], {'runconfig.model_dir="a"': "--model_dir a"})
  Traceback (most recent call last):
  ...
  wafer.errors.CommandError: runconfig={model_dir: b} and --model_dir a both set runconfig.model_dir: the flag would win; give one of them
  >>> refuse_flag_and_override(["runconfig.model_dir=2024"], {'runconfig.model_dir="2024"': "--model_dir 2024"})
  """
  from wafer.config import ConfigError
  from wafer.config.loader import parse_override
  from wafer.errors import dotted

  def parsed(text: str) -> tuple[Any, Any] | None:
    try:
      return parse_override(text)
    except ConfigError:  # the loader reports it, in its words
      return None

  missing = object()

  def under(value: Any, keys: Sequence[Any]) -> Any:  # the value an override of a parent key gives a key
    for key in keys:
      if not isinstance(value, dict) or key not in value:
        return missing
      value = value[key]
    return value

  made = [(parsed(text), flag) for text, flag in flags.items()]
  for text in overrides:
    given = parsed(text)
    for by_flag, flag in made:
      if given is None or by_flag is None or tuple(by_flag[0][: len(given[0])]) != tuple(given[0]):
        continue
      value = under(given[1], by_flag[0][len(given[0]) :])  # runconfig={model_dir: b} sets it too
      if value is not missing and str(value) != str(by_flag[1]):  # (a path flag's 2024 is the string "2024")
        raise CommandError(
          f"{text} and {flag} both set {dotted(by_flag[0])}: the flag would win; give one of them"
        )


def _distributed(args: argparse.Namespace) -> bool:
  """Start ``jax.distributed`` when the process flags (or ``JAX_COORDINATOR_ADDRESS``) ask for many processes."""
  from wafer import cluster

  flags = (args.num_processes, args.process_id, args.coordinator_address)
  env = os.environ
  scheduled = any(int(env.get(k, "1") or 1) > 1 for k in ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"))
  if all(f is None for f in flags) and not env.get("JAX_COORDINATOR_ADDRESS") and not scheduled:
    return False
  if args.num_processes is not None and args.num_processes < 1:
    raise cluster.ClusterConfigError(
      f"--num_processes {args.num_processes}; allowed: the number of processes in the run, >= 1"
    )
  if args.num_processes == 1:  # one process: nothing to start, but the flags given must still make sense
    cluster.check_flags(args.coordinator_address, args.num_processes, args.process_id)
    return False
  cluster.initialize(args.coordinator_address, args.num_processes, args.process_id)
  return True


def _run(args: argparse.Namespace) -> int:
  import wafer
  from wafer import cluster, runner
  from wafer.config.loader import literal_override

  distributed = _distributed(args)
  overrides = list(args.overrides or ())
  flags: dict[str, str] = {}  # override -> the flag it came from, which a problem with it names
  if args.model_dir is not None:  # the value as given: a path is not YAML (``runs/a #2``, ``~``, ``2024``)
    overrides.append(literal_override("runconfig.model_dir", args.model_dir))
    flags[overrides[-1]] = f"--model_dir {args.model_dir}"
  for flag in ("validate_only", "compile_only"):
    if getattr(args, flag):
      overrides.append(f"runconfig.{flag}=true")
      flags[overrides[-1]] = f"--{flag}"
  made = {
    **flags,
    **({f"runconfig.mode={args.mode}": f"--mode {args.mode}"} if args.mode is not None else {}),
  }
  refuse_flag_and_override(args.overrides or (), made)
  source = args.params if args.params is not None else _default_params()
  try:
    # a params error found by one process stops every process with its message at once (the others
    # waited in their first collective until JAX's timeout, then showed a backend traceback)
    with cluster.same_outcome() if distributed else contextlib.nullcontext():
      plan = runner.load_plan(source, overrides, mode=args.mode, flags=flags)
      from wafer.train.loop import make_model_dir, require_checkpoint

      require_checkpoint(plan.runconfig)  # an eval of a folder without checkpoints creates nothing
      model_dir = make_model_dir(plan.runconfig.model_dir)  # a bad model_dir is refused before any work
    wafer.enable_compilation_cache(model_dir / "compile_cache")  # reruns load, not compile
    summary = runner.run_plan(plan)
  except KeyboardInterrupt as error:  # wafer.train.RunInterrupted says where model_dir stands
    detail = str(error) if isinstance(error, RunInterrupted) else ""
    detail = detail or "the last checkpoint in model_dir is where a rerun resumes."
    signum = int(getattr(error, "signum", signal.SIGINT))
    what = "interrupted" if signum == signal.SIGINT else f"terminated ({signal.Signals(signum).name})"
    print(f"\nwafer run: {what}. {detail}", file=sys.stderr)
    return 128 + signum  # 130 for ctrl-C, 143 for SIGTERM (the shell's codes)
  model_dir = Path(summary.model_dir)
  losses = summary.losses or []
  if losses:
    (s0, l0), (s1, l1) = losses[0], losses[-1]
    print(f"\nTraining loss: {l0:.4f} at step {s0} -> {l1:.4f} at step {s1}")
  evals = summary.eval_results()
  if evals and not losses:
    print()
  for step, value in evals:
    print(f"Eval {summary.eval_metric} at step {step}: {value:.4f}")
  rc = plan.runconfig
  checked_only = rc.validate_only or rc.compile_only
  # only what this run wrote: a check writes no metrics or checkpoints, an eval mode no checkpoint and no
  # compile report (the files of an earlier run in model_dir are not this run's outputs)
  import jax

  main = jax.process_index() == 0  # process 0 alone writes the metrics (every process its checkpoint parts)
  written = (
    ("metrics", model_dir / "metrics.jsonl", main and not checked_only),
    ("TensorBoard", model_dir / "tensorboard", main and not checked_only),
    ("checkpoints", model_dir / "checkpoints", not checked_only and rc.mode not in ("eval", "eval_all")),
    ("compile report", model_dir / "compile_report.txt", summary.compile_report is not None),
    ("  as JSON", model_dir / "compile_report.json", summary.compile_report is not None),
    ("  placement", model_dir / "placement.png", summary.compile_report is not None),
  )
  shown = [
    (label, path)
    for label, path, wrote in written
    if wrote and path.exists() and not (path.is_dir() and not any(path.iterdir()))  # an empty checkpoints/
  ]
  if shown:
    print("\nOutputs:")
  for label, path in shown:
    print(f"  {label:15s} {path}")
  return 0


def _default_params() -> Any:
  """The embedded default job's params path (announced), for commands run without --params."""
  from wafer import registry

  job = registry.default_job()
  if job is None:  # no installed plugin offers a default job
    raise registry.PluginError(
      "no --params given, and no installed model plugin (wafer.models entry point) offers a default job"
    )
  print(f"No --params given: running the embedded default job: {job[1]}.\n  params: {job[0]}", flush=True)
  return job[0]


def _sweep(args: argparse.Namespace) -> int:
  from wafer import sweep

  try:
    formats = sweep.parse_formats(args.formats)  # checked before anything is loaded
    levels = None if args.levels is None else sweep.parse_levels(args.levels)
    source = args.params if args.params is not None else _default_params()
    result = sweep.sweep(
      source, formats, levels, args.model_dir, list(args.overrides or ()), compile_cache=True
    )
  except KeyboardInterrupt:
    print("\nwafer sweep: interrupted.", file=sys.stderr)
    return 130
  print()
  print(result.table())
  print(f"\nwrote {Path(args.model_dir) / 'sweep.json'}\nwrote {Path(args.model_dir) / 'sweep.png'}")
  return 0


def _user_error(error: BaseException) -> str | None:
  """The message of an error the user can act on, or None for a bug (which keeps its traceback).

  User errors are `wafer.WaferError` (every wafer error type subclasses it) and precision's own
  `PolicyError` / `FormatError` (precision imports nothing of wafer's).
  """
  import precision
  from wafer.config import ConfigError, format_config_error
  from wafer.errors import WaferError

  if isinstance(error, ConfigError):
    return format_config_error(error).removeprefix("error: ")
  if isinstance(error, (WaferError, precision.PolicyError, precision.FormatError)):
    return str(error)
  return None


@contextlib.contextmanager
def _working(what: str) -> Iterator[None]:
  """A spinner with ``what`` on a terminal's stderr while the block runs (seconds to tens of seconds
  for a large model); nothing when stderr is not a terminal (a log, a pipe, the tests)."""
  if not sys.stderr.isatty():
    yield
    return
  from rich.console import Console
  from rich.live import Live
  from rich.spinner import Spinner

  # (stdout is left alone: what the step prints still goes where stdout goes, a file or a pipe)
  live = Live(
    Spinner("dots", text=what + " ..."),
    console=Console(stderr=True),
    transient=True,
    redirect_stdout=False,
    redirect_stderr=False,
  )
  with live:
    yield


def _estimate(args: argparse.Namespace) -> int:
  import wafer
  from wafer.compile import cheap_sharding_probes
  from wafer.costmodel import workloads

  if args.list:
    rows = [
      [
        w.name,
        w.batch_size,
        w.measurement.value if w.measurement else "",
        ", ".join(f"{k} {_condition(v)}" for k, v in w.estimate_kwargs.items()),
        w.description,
      ]
      for w in workloads.WORKLOADS.values()
    ]
    header = ["workload", "batch", "measured samples/s", "published run's conditions", "description"]
    print(Table(header, rows, title="Built-in workloads"))
    return 0
  fn, example_args, kwargs, name = _estimate_target(args)
  for key in _RUN_FLAGS:
    value = getattr(args, key)
    if value == _SEARCH:  # overrides the params file's micro_batch_size: searched
      kwargs.pop(key, None)
    elif value is not None:
      kwargs[key] = value
  if args.model_dir:  # refused before the estimate, not after it
    from wafer.train.loop import make_model_dir

    make_model_dir(args.model_dir, "--model_dir")
  with cheap_sharding_probes(), _working(f"estimating {name}: tracing the step and costing it on the wafer"):
    report = wafer.estimate(fn, *example_args, name=name, **kwargs)
  notes = getattr(args, "workload_notes", None)
  if notes:  # which conditions are the published run's, and which the command line replaced
    reason = report.mode_reason
    if getattr(args, "workload_mode", None) and reason.startswith("requested"):
      reason = f"the published run's: workload {name}" + reason.removeprefix("requested")
    report = dataclasses.replace(report, mode_reason=reason, notes=(*notes, *report.notes))
  print(_as_flags(report.to_text()), end="")  # the saved report keeps the API's wording
  if args.model_dir:
    paths = report.save(args.model_dir)
    print()
    for label in ("text", "json", "png"):
      print(f"wrote {paths[label]}")
  return 0


def _analyze_input(args: argparse.Namespace) -> int:
  from wafer import input_analyzer, runner
  from wafer.config.loader import literal_override

  overrides = list(args.overrides or ())
  if args.model_dir is not None:
    overrides.append(literal_override("runconfig.model_dir", args.model_dir))
  input_analyzer.check_settings(args.workers, args.seconds)  # before anything is loaded or announced
  plan = runner.load_plan(args.params, overrides)
  from wafer.train.loop import make_model_dir

  make_model_dir(plan.runconfig.model_dir)  # where the result goes: refused before measuring, not after
  print(
    f"Measuring the input pipeline of {plan.task.name} ({args.seconds:g} s per worker count)...", flush=True
  )
  analysis = input_analyzer.analyze(
    plan, worker_counts=args.workers, seconds=args.seconds, consumer=args.consumer
  )
  print(analysis.to_text(), end="")
  path = input_analyzer.save(analysis, plan.runconfig.model_dir)
  print(f"wrote {path}")
  return 0


def _path(text: str) -> str:
  """A --params / --model_dir value: an empty one (``--model_dir "$UNSET"``) would silently mean the default."""
  if not text.strip():
    raise argparse.ArgumentTypeError("an empty path; give a file or directory name")
  return text


def _worker_count(text: str) -> int:
  """A --workers value: an integer (an override after the list was read as one of them)."""
  try:
    return int(text)
  except ValueError:
    hint = (
      "; key=value overrides go before --workers (--workers takes every value after it)"
      if "=" in text
      else ""
    )
    raise argparse.ArgumentTypeError(f"invalid worker count {text!r}: an integer{hint}") from None


_SEARCH = "search"


def _micro_batch(text: str) -> int | str:
  """A --micro_batch_size value: an integer >= 1, or auto / explore / none (searched)."""
  if text.strip().lower() in SEARCHED_MICRO_BATCH:
    return _SEARCH
  try:
    value = int(text)
  except ValueError:
    value = 0
  if value < 1:
    raise argparse.ArgumentTypeError(
      f"{text!r}; allowed: an integer >= 1 (used as given), or {' / '.join(SEARCHED_MICRO_BATCH)} (searched)"
    )
  return value


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="wafer", description=__doc__.splitlines()[0])
  commands = parser.add_subparsers(dest="command", metavar="COMMAND")
  demo = commands.add_parser(
    "demo",
    help="print the float formats and a rounding example",
    description="Print the float formats precision knows (float32, bfloat16, float16, cbfloat16, float8: "
    "bits, layout, bias, range, eps), a few numbers rounded to each (with their bit patterns), and "
    "cbfloat16's properties. Takes no arguments.",
  )
  demo.set_defaults(handler=_demo)
  est = commands.add_parser(
    "estimate",
    help="estimate samples/s on a Cerebras system and write the compile report",
    description="Estimate a step's rate on a Cerebras system (layer pipelined or weight streaming) and "
    "print a compile report; with --model_dir (with --params: by default its runconfig.model_dir), also "
    "write compile_report.txt, compile_report.json and placement.png there. A --workload carries the "
    "conditions its published run was measured under (system, mode, micro-batch, systems: --list); a "
    "flag given wins over the condition of the same name, --release or --mode drops the published mode "
    "(the release or the mode given decides), and --batch_size, --num_csx, --release or --mode drops "
    "the published micro-batch (searched instead), as does a batch with fewer samples per system than "
    "it; --system naming another chip drops the published run's clock, rectangle and micro-batch. The report's "
    "notes say which conditions are the published run's and which were dropped.",
  )
  target = est.add_argument_group("what to estimate").add_mutually_exclusive_group()
  target.add_argument(
    "--workload",
    metavar="NAME",
    help="a built-in workload (see --list), under its published run's conditions, less those the flags "
    "below replace (see above)",
  )
  target.add_argument("--params", metavar="FILE", type=_path, help="a params YAML: estimates its train step")
  target.add_argument("--list", action="store_true", help="list the built-in workloads and exit")
  est.add_argument("--system", help="wse2 (CS-2, default), wse3 (CS-3) or wse1 (CS-1)")
  est.add_argument(
    "--mode",
    help="auto (default: the mode the release runs the model in), fastest (the faster mode, a what-if), "
    "pipeline or weight_streaming",
  )
  est.add_argument(
    "--release",
    help="Cerebras software release: 2.x (default: weight streaming for every model), 1.x (before 1.9: "
    "layer pipelined under 1B parameters), or a number such as 2.4, R1.9.1, Release_2.10.0; a 1.x "
    f"release computes at 1/{SPEEDUP_2_0:g} of the 2.x rate (Cerebras' R2.0: 50%% faster)",
  )
  est.add_argument(
    "--batch_size",
    type=int,
    help="samples per step (default: the workload's; with --params: train_input.batch_size)",
  )
  est.add_argument("--num_csx", type=int, help="systems in data parallel (weight streaming)")
  est.add_argument(
    "--micro_batch_size",
    type=_micro_batch,
    help="the micro-batch, used as given (default: the params file's micro_batch_size; auto/explore "
    "or none: searched)",
  )
  est.add_argument(
    "--compute_format",
    help="compute format (default: the params file's policy with --params, else cbfloat16)",
  )
  est.add_argument(
    "--model_dir",
    metavar="DIR",
    type=_path,
    help="write the report files into DIR (default with --params: runconfig.model_dir; else none)",
  )
  est.add_argument("overrides", nargs="*", metavar="key.path=value", help="overrides of --params keys")
  est.set_defaults(handler=_estimate)
  ana = commands.add_parser(
    "analyze-input",
    help="measure the input pipeline with 1..N workers and recommend num_workers_per_csx",
    description="Measure the params file's training input pipeline (samples/s with 1, 2, 4, ... input worker "
    "processes), compare it with the rate the model consumes (the wafer cost model's estimate, or "
    "the step rate measured here) and recommend runconfig.num_workers_per_csx. Writes "
    "model_dir/input_analysis.json.",
  )
  ana.add_argument("--params", metavar="FILE", type=_path, required=True, help="a params YAML")
  ana.add_argument(
    "--workers",
    type=_worker_count,
    nargs="+",
    metavar="N",
    help="worker counts (default: 1, 2, 4, ... CPUs); key=value overrides go before it",
  )
  ana.add_argument("--seconds", type=float, default=2.0, help="seconds measured per worker count (default 2)")
  ana.add_argument(
    "--consumer",
    choices=("costmodel", "measured"),
    default="costmodel",
    help="consumption rate: the wafer cost model's estimate (default) or the step rate measured here",
  )
  ana.add_argument(
    "--model_dir",
    metavar="DIR",
    type=_path,
    help="where input_analysis.json goes (default: runconfig.model_dir)",
  )
  ana.add_argument("overrides", nargs="*", metavar="key.path=value", help="overrides of --params keys")
  ana.set_defaults(handler=_analyze_input)
  run = commands.add_parser(
    "run",
    help="train / evaluate a params file (default: the embedded BERT-tiny job)",
    description="Compile the step once and run it: train, eval, train_and_eval or eval_all. Metrics go to "
    "model_dir/metrics.jsonl and TensorBoard; checkpoints to model_dir/checkpoints (a rerun "
    "resumes from the latest); the compile report to model_dir/compile_report.txt.",
  )
  run.add_argument(
    "--params", metavar="FILE", type=_path, help="a params YAML (modelzoo layout or trainer layout)"
  )
  run.add_argument("--mode", choices=MODES, help="runconfig.mode")
  run.add_argument("--model_dir", metavar="DIR", type=_path, help="runconfig.model_dir")
  only = run.add_mutually_exclusive_group()
  only.add_argument(
    "--validate_only", action="store_true", help="trace and check the step; no compile, no run"
  )
  only.add_argument(
    "--compile_only", action="store_true", help="compile and write the compile report; no run"
  )
  procs = run.add_argument_group(
    "many processes (one per host; see docs/guides/many-processes.md)",
    "Every process runs the same command with its own --process_id; runconfig.num_csx systems are spread "
    "over all processes' devices. Without these flags, JAX_COORDINATOR_ADDRESS or a SLURM/MPI job "
    "environment is used when set.",
  )
  procs.add_argument("--num_processes", type=int, metavar="N", help="processes in the run (hosts)")
  procs.add_argument("--process_id", type=int, metavar="I", help="this process: 0 .. N-1 (0 writes the logs)")
  procs.add_argument("--coordinator_address", metavar="HOST:PORT", help="process 0's host and a free port")
  run.add_argument("overrides", nargs="*", metavar="key.path=value", help="e.g. runconfig.max_steps=10")
  run.set_defaults(handler=_run)
  swp = commands.add_parser(
    "sweep",
    help="train the same run once per compute format (and precision level) and compare the losses",
    description="Train a params file once per format and level: same initial weights, batches and dropout "
    "masks; only the rounding differs. Each run writes into DIR/<format>_L<level>/; DIR/sweep.json holds "
    "the losses, eval and the cost model's wafer rate per run, DIR/sweep.png the loss curves and their "
    "difference from float32. The table's deviation is the worst |loss - loss_float32| / (|loss_float32| u), "
    "u = 2^-(mantissa bits + 1) of the run's format (needs float32 among the formats).",
  )
  swp.add_argument(
    "--params", metavar="FILE", type=_path, help="a params YAML (default: the embedded BERT-tiny job)"
  )
  swp.add_argument(
    "--formats",
    default="cbfloat16,bfloat16,float16,float32",
    help="comma-separated: cbfloat16, bfloat16, float16, float32 or aliases (cb16, bf16, fp16, f32; default: all four)",
  )
  swp.add_argument(
    "--levels", help="comma-separated runconfig.precision_opt_level values, 0-2 (default: the params file's)"
  )
  swp.add_argument("--model_dir", metavar="DIR", type=_path, required=True, help="the sweep's folder")
  swp.add_argument("overrides", nargs="*", metavar="key.path=value", help="e.g. runconfig.max_steps=10")
  swp.set_defaults(handler=_sweep)
  return parser


@contextlib.contextmanager
def interrupts_delivered() -> Iterator[None]:
  """ctrl-C is never lost. Python turns SIGINT into a KeyboardInterrupt at the next bytecode, and
  when that bytecode is in a callback it cannot raise from (JAX's garbage-collection callback, run by
  any allocation), the exception is printed as "Exception ignored" and dropped: the run went on, to
  "Training completed". Inside this context such an interrupt is delivered to the main thread again
  (``_thread.interrupt_main``, from a timer thread 50 ms later); one still pending when the context
  ends is raised there, never after it."""
  previous = sys.unraisablehook
  pending: list[threading.Timer] = []

  def hook(unraisable: Any) -> None:
    if (
      isinstance(unraisable.exc_value, KeyboardInterrupt)
      and threading.current_thread() is threading.main_thread()
    ):
      # from another thread, once this hook has returned (raised here, it would be dropped again)
      # a SIGTERM's interrupt (wafer.errors.Terminated) is delivered as a SIGTERM again
      signum = getattr(unraisable.exc_value, "signum", signal.SIGINT)
      timer = threading.Timer(0.05, _thread.interrupt_main, (signum,))
      timer.daemon = True
      pending.append(timer)
      timer.start()
      return
    previous(unraisable)

  sys.unraisablehook = hook
  try:
    yield
  finally:
    if sys.unraisablehook is hook:
      sys.unraisablehook = previous
    waiting = [t for t in pending if t.is_alive()]
    for timer in waiting:
      timer.cancel()
    if waiting:
      raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
  parser = build_parser()
  args, extra = parser.parse_known_args(argv)
  # key.path=value overrides may come before or after options (argparse stops at the first option)
  if extra:
    if hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
      args.overrides = list(args.overrides or ()) + extra
    else:
      parser.error(f"unrecognized arguments: {' '.join(extra)}")
  if not hasattr(args, "handler"):
    parser.print_help(sys.stderr)
    return 2
  try:
    with interrupts_delivered():
      return args.handler(args)
  except KeyboardInterrupt:  # (the commands' own handlers say more where they can)
    print(f"\nwafer {args.command}: interrupted.", file=sys.stderr)
    return 130
  except BrokenPipeError:  # output piped into e.g. `head`: stop quietly, as Unix tools do
    sys.stdout = open(os.devnull, "w")
    return 0
  except Exception as error:  # the one place user errors become a message (bugs keep their traceback)
    message = _user_error(error)
    if message is None:
      raise
    if args.command == "estimate":  # wafer.estimate's argument checks, in the flags' wording
      message = _as_flags(message, getattr(args, "workload_pinned", None))
    print(f"wafer {args.command}: error: {message}", file=sys.stderr)
    if _peer_lost(error):  # another process of the run is gone: JAX's shutdown barrier
      sys.stdout.flush()  # at exit would wait for it, then abort with a C++ stack trace (exit 134)
      sys.stderr.flush()
      os._exit(USER_ERROR_EXIT)
    return USER_ERROR_EXIT


def _peer_lost(error: BaseException | None) -> bool:
  """Whether ``error``, or an error it was raised while handling (a close in a ``finally`` that failed in
  turn), says that another process of the run is gone (`wafer.cluster`'s collectives set ``peer_lost``)."""
  seen: set[int] = set()
  while error is not None and id(error) not in seen:
    if getattr(error, "peer_lost", False):
      return True
    seen.add(id(error))
    error = error.__cause__ or error.__context__
  return False


if __name__ == "__main__":
  sys.exit(main())
