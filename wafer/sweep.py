"""Format sweeps: the same training run once per compute format (and precision level), compared.

`sweep(params, formats, levels, model_dir, overrides)` trains the model of ``params`` once per
``(format, level)``, each run through the ordinary run path (`wafer.runner.load_plan` /
`wafer.runner.run_plan`) with the format and level set as config overrides:

==============  =================================================================================
format          overrides (after the user's, so they win)
==============  =================================================================================
``float32``     ``model.mixed_precision=false`` (the all-float32 baseline, as ``wafer run`` does it)
``cbfloat16``,  ``model.mixed_precision=true``, ``model.fp16_type=<format>``
``bfloat16``,
``float16``
every run       ``runconfig.precision_opt_level=<level>``, ``runconfig.model_dir=DIR/<format>_L<level>``
==============  =================================================================================

so the policy is the one ``params.policy()`` builds (one source of truth). Every run has the same
seed, hence the same initial weights, the same batches and the same dropout masks; only the
rounding differs. ``runconfig.log_steps`` defaults to 1 in a sweep (a loss at every step), unless the
user's overrides set it. A float32 run does not depend on the level (an all-float32 policy rounds
nothing), so float32 runs once, at the lowest level asked for.

The deviation of a run from float32 is measured in units of the run's format's unit roundoff
``u = 2^-(m+1)`` (``m`` stored mantissa bits; half the spacing of values at 1.0, the largest relative
error of one round-to-nearest): ``max over logged steps |loss - loss_f32| / (|loss_f32| * u)``.
Without float32 in the sweep there is no baseline: the deviation is ``None`` (``-`` in the table) and
the plot shows the loss curves only.

Outputs: ``DIR/<format>_L<level>/`` (each run's metrics.jsonl, checkpoints, compile report),
``DIR/sweep.json`` (`SweepResult.to_dict`: the losses, and the overrides of every run), ``DIR/sweep.png``
(`SweepResult.plot`).

Every run's config is checked before any run trains. A format the file cannot run in (cbfloat16 with a
static loss scale) is an error that names the sweep's format as the cause and the fixes (`_format_caused`);
run folders holding checkpoints written with other settings (a rerun into ``DIR`` with, say, a new
learning rate) are refused, naming the keys (`_check_earlier_runs`); a rerun with the same settings
resumes each run (a higher ``runconfig.max_steps`` trains further).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import json
import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import precision
from precision._table import Table
from wafer._io import replace_atomically, strict_json, write_text_atomically
from wafer.config.schema import TRAIN_MODES
from wafer.errors import SweepError, WaferError

if TYPE_CHECKING:
  from wafer.train import RunSummary

__all__ = ("FORMATS", "LEVELS", "Run", "SweepError", "SweepResult", "parse_formats", "parse_levels", "sweep")

FORMATS = ("cbfloat16", "bfloat16", "float16", "float32")
LEVELS = (0, 1, 2)
BASELINE = "float32"


def parse_formats(formats: str | Sequence[str]) -> tuple[str, ...]:
  """Format names from ``"a,b,c"`` or a sequence, each resolved as `precision.get_format` does
  (aliases such as ``bf16``, ``cb16``, ``f32``; any case) to its canonical name, one of `FORMATS`.

  >>> parse_formats("cbfloat16, float32")
  ('cbfloat16', 'float32')
  >>> parse_formats("bf16,f32")
  ('bfloat16', 'float32')
  >>> parse_formats("bfloat61")
  Traceback (most recent call last):
  ...
  wafer.errors.SweepError: --formats: unknown format 'bfloat61'; did you mean 'bfloat16'? Allowed: cbfloat16, bfloat16, float16, float32 (or an alias: cb16, bf16, fp16, f32, ...)
  """
  if not isinstance(formats, str) and not (
    isinstance(formats, Sequence) and all(isinstance(f, str) for f in formats)
  ):  # (16, or [16]: a bare TypeError from iterating it)
    raise SweepError(
      f"formats={formats!r}; allowed: format names, as one string ('bf16,f32') or a sequence (['bf16', 'f32'])"
    )
  items = formats.split(",") if isinstance(formats, str) else list(formats)
  given = [n.strip() for n in items if n.strip()]
  allowed = f"Allowed: {', '.join(FORMATS)} (or an alias: cb16, bf16, fp16, f32, ...)"
  if not given:
    raise SweepError(f"--formats: no format given; {allowed}")
  if len(given) < len(items):
    raise SweepError(f"--formats {formats!r}: an empty name (two commas, or one at an end); {allowed}")
  names = []
  for name in given:
    try:
      canonical = precision.get_format(name).name
    except precision.FormatError:
      close = difflib.get_close_matches(name.lower(), FORMATS, n=1)
      hint = f"; did you mean {close[0]!r}?" if close else ";"
      raise SweepError(f"--formats: unknown format {name!r}{hint} {allowed}") from None
    if canonical not in FORMATS:
      raise SweepError(
        f"--formats: {name!r} ({canonical}) is a float format a run cannot compute in "
        f"(model.fp16_type takes cbfloat16, bfloat16, float16); {allowed}"
      )
    if canonical in names:
      first = given[names.index(canonical)]
      raise SweepError(
        f"--formats: {','.join(given)} names a format twice: {first!r} and {name!r} are both {canonical}"
      )
    names.append(canonical)
  return tuple(names)


def parse_levels(levels: str | Sequence[int]) -> tuple[int, ...]:
  """Precision levels from ``"0,1,2"`` or a sequence; each 0, 1 or 2.

  >>> parse_levels("0, 2"), parse_levels([1])
  ((0, 2), (1,))
  """
  try:
    items = [s.strip() for s in levels.split(",")] if isinstance(levels, str) else list(levels)
  except TypeError:  # a number: levels=1
    raise SweepError(
      f"--levels: {levels!r}; allowed: levels among 0, 1, 2 as '0,1' or a sequence, e.g. [1]"
    ) from None
  out = []
  for item in items:
    try:
      level = int(item)
    except (TypeError, ValueError):
      level = None
    if level is None or isinstance(item, bool) or level not in LEVELS or str(level) != str(item).strip():
      raise SweepError(f"--levels: {item!r} is not a precision level; allowed: 0, 1, 2 (e.g. --levels 0,1,2)")
    out.append(level)
  if not out or len(set(out)) != len(out):
    raise SweepError(f"--levels: {levels!r}; give distinct levels among 0, 1, 2")
  return tuple(out)


def unit_roundoff(fmt: str) -> float:
  """``u = 2^-(m+1)`` of a format (``m`` stored mantissa bits).

  >>> unit_roundoff("bfloat16"), unit_roundoff("cbfloat16") == 2.0**-10
  (0.00390625, True)
  """
  return float(2.0 ** -(precision.get_format(fmt).mantissa_bits + 1))


@dataclasses.dataclass
class Run:
  """One run of a sweep: its logged losses, last eval and the cost model's wafer rate."""

  format: str
  level: int
  model_dir: str
  steps: list[int]
  losses: list[float]
  eval: dict[str, Any]
  samples_per_sec_estimate: float | None
  deviation_u: float | None = None  # worst |loss - loss_f32| / (|loss_f32| u); None without a baseline
  estimate_mode: str | None = None  # the compile report's mode and release ("weight streaming, release 2.x")
  overrides: list[str] = dataclasses.field(default_factory=list)  # every override the run had, in order

  @property
  def name(self) -> str:
    return run_name(self.format, self.level)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


def run_name(fmt: str, level: int) -> str:
  """The run's folder under the sweep's model_dir: ``<format>_L<level>``."""
  return f"{fmt}_L{level}"


@dataclasses.dataclass
class SweepResult:
  """The runs of a sweep, in the order they ran."""

  runs: list[Run]
  model_dir: str
  params: str | None = None  # the params file's path (``<dict>`` for a dict)
  overrides: list[str] = dataclasses.field(default_factory=list)  # the user's, given to every run

  def baseline(self) -> Run | None:
    """The float32 run, if the sweep has one."""
    return next((r for r in self.runs if r.format == BASELINE), None)

  def to_dict(self) -> dict[str, Any]:
    """``{"params": ..., "overrides": [...], "runs": [run.to_dict(), ...]}`` (what ``sweep.json`` holds;
    each run lists every override it had: the sweep's defaults, the user's, its format's and its folder)."""
    return {
      "params": self.params,
      "overrides": list(self.overrides),
      "runs": [r.to_dict() for r in self.runs],
    }

  def table(self) -> Table:
    """Final loss, worst deviation from float32 in units of u, and the estimated wafer rate per run."""
    rows = []
    for r in self.runs:
      dev = "-" if r.deviation_u is None else f"{r.deviation_u:.3g}"
      rate = "-" if r.samples_per_sec_estimate is None else f"{r.samples_per_sec_estimate:,.1f}"
      final = f"{r.losses[-1]:.6f}" if r.losses else "-"
      ev = ", ".join(f"{k}={v:.4f}" for k, v in r.eval.items() if k != "step") or "-"
      rows.append([r.format, r.level, f"{unit_roundoff(r.format):.3g}", final, dev, ev, rate])
    modes = sorted({r.estimate_mode for r in self.runs if r.estimate_mode})
    base = self.baseline()
    lost = (
      next(((s, v) for s, v in zip(base.steps, base.losses) if not math.isfinite(v)), None) if base else None
    )
    footer = (
      "deviation: max over logged steps of |loss - loss_float32| / (|loss_float32| * u), u = 2^-(m+1)"
      + ("" if base else " (no float32 run: no deviation)")
      + (
        f"\nfloat32 itself diverged (loss {lost[1]} at step {lost[0]}): deviations compare the steps before it"
        if lost
        else ""
      )
      + (f"\nest. samples/s: the compile report's estimate ({'; '.join(modes)})" if modes else "")
    )
    columns = ["format", "level", "u", "final loss", "deviation (u)", "eval", "est. samples/s (wafer)"]
    return Table(columns, rows, title=f"Format sweep ({self.model_dir})", footer=footer)

  def plot(self, path: str | Path) -> Path:
    """Write the loss curves overlaid and (float32 and another run) each run's ``loss - loss_float32``."""
    from matplotlib.figure import Figure

    base = self.baseline()
    if base is not None and all(r is base for r in self.runs):
      base = None  # float32 alone: no difference to draw (an empty panel, a legend with no entries)
    fig = Figure(figsize=(11 if base else 6, 4), layout="constrained")
    axes = fig.subplots(1, 2 if base else 1, squeeze=False)[0]
    colors = {r.name: f"C{i}" for i, r in enumerate(self.runs)}  # one color per run in both panels
    for r in self.runs:
      axes[0].plot(r.steps, r.losses, marker=".", color=colors[r.name], label=r.name)
    axes[0].set(xlabel="step", ylabel="training loss", title="Loss")
    axes[0].legend()
    if base is not None:
      ref = dict(zip(base.steps, base.losses))
      for r in self.runs:
        if r is base:
          continue
        pts = [(s, v - ref[s]) for s, v in zip(r.steps, r.losses) if s in ref]
        axes[1].plot([s for s, _ in pts], [d for _, d in pts], marker=".", color=colors[r.name], label=r.name)
      axes[1].axhline(0.0, color="gray", linewidth=0.8)
      axes[1].set(xlabel="step", ylabel="loss - loss(float32)", title="Difference from float32")
      axes[1].legend()
    path = Path(path)
    replace_atomically(path, lambda tmp: fig.savefig(tmp, dpi=100))
    return path

  @classmethod
  def load(cls, path: str | Path) -> SweepResult:
    """The sweep of a ``sweep.json`` (``path``: the file or its folder)."""
    path = Path(path)
    path = path / "sweep.json" if path.is_dir() else path
    data = json.loads(path.read_text())
    runs = data["runs"]
    for r in runs:  # a diverged loss or eval is saved as null (strict JSON): nan again
      r["losses"] = [math.nan if v is None else v for v in r["losses"]]
      r["eval"] = {k: math.nan if v is None else v for k, v in r.get("eval", {}).items()}
    result = cls([Run(**r) for r in runs], str(path.parent), data.get("params"), data.get("overrides", []))
    _deviations(result.runs)  # an infinite deviation (a diverged run) was saved as null
    return result

  def save(self, model_dir: str | Path | None = None) -> dict[str, Path]:
    """Write ``sweep.json`` and ``sweep.png`` into ``model_dir`` (default: the sweep's)."""
    out = Path(model_dir or self.model_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / "sweep.json"
    write_text_atomically(
      json_path, json.dumps(strict_json(self.to_dict()), indent=1, allow_nan=False) + "\n"
    )
    return {"json": json_path, "png": self.plot(out / "sweep.png")}


def format_overrides(fmt: str, level: int | None = None) -> list[str]:
  """The config overrides that select ``fmt`` at ``level`` (see the module docstring); without a
  ``level``, only the format's keys (the config's own level stays)."""
  if fmt == BASELINE:
    keys = ["model.mixed_precision=false"]
  else:
    keys = ["model.mixed_precision=true", f"model.fp16_type={fmt}"]
  return keys if level is None else [*keys, f"runconfig.precision_opt_level={level}"]


_SET_BY_THE_SWEEP = {
  "model.mixed_precision": "--formats (float32 runs without mixed precision)",
  "model.fp16_type": "--formats",
  "runconfig.model_dir": "--model_dir (run (f, L) writes into DIR/<f>_L<L>)",
}


def _check_overrides(overrides: Sequence[str], levels_given: bool) -> None:
  """Refuse an override of a key each run of the sweep sets itself (it would be silently replaced).

  ``runconfig.precision_opt_level`` is the level of every run when ``levels`` is not given, and a
  conflict when it is.
  """
  if isinstance(overrides, str) or not all(isinstance(t, str) for t in overrides):  # a string was iterated
    raise SweepError(  # letter by letter ("got 'r'")
      f"overrides={overrides!r}; allowed: a sequence of key.path=value strings, e.g. ['runconfig.max_steps=3']"
    )
  for text in overrides:
    key = text.split("=", 1)[0].strip()
    flag = _SET_BY_THE_SWEEP.get(key)
    if key == "runconfig.precision_opt_level" and levels_given:
      flag = "--levels"
    if flag is not None:
      raise SweepError(f"override {text!r}: the sweep sets {key} for each run; choose it with {flag} instead")


def sweep(
  params: str | Path | dict,
  formats: str | Sequence[str] = FORMATS,
  levels: str | Sequence[int] | None = None,
  model_dir: str | Path = "sweep",
  overrides: Sequence[str] = (),
  *,
  progress: bool = True,
  save: bool = True,
  compile_cache: bool = False,
) -> SweepResult:
  """Train ``params`` once per format and level; returns the runs (and writes sweep.json / .png).

  Args:
    params: a params file (path or dict), as for ``wafer run``.
    formats: names among `FORMATS` or their aliases (``"bf16,f32"`` or a sequence).
    levels: ``runconfig.precision_opt_level`` values among 0, 1, 2; default: the params file's
      (after ``overrides``).
    model_dir: the sweep's folder; run ``(f, L)`` writes into ``model_dir/<f>_L<L>/``.
    overrides: ``key.path=value`` overrides applied to every run (e.g. ``runconfig.max_steps=3``).
    progress: print a line before each run (the runs print their own log lines).
    save: write ``sweep.json`` and ``sweep.png`` into ``model_dir``.
    compile_cache: use ``model_dir/compile_cache`` as JAX's persistent compilation cache (`wafer sweep`
      does, as `wafer run` uses its model_dir's: a rerun loads its steps), once every run's config is
      checked (a refused sweep creates nothing).

  Raises:
    SweepError: an unknown format or level; any `WaferError` of the runs themselves.
  """
  from wafer import registry, runner
  from wafer.config import load_params
  from wafer.config.loader import literal_override

  names = parse_formats(formats)
  _check_overrides(overrides, levels is not None)
  if not isinstance(model_dir, (str, os.PathLike)):
    raise SweepError(f"model_dir={model_dir!r}; allowed: a folder path (str or pathlib.Path)")
  if levels is None:  # the config's level (its default lives in the schema), read with a format the
    registry.load_plugins()  # sweep runs selected (the file's own may not run with these overrides)
    with _format_caused(params, list(overrides), names[0], names):
      levels = [load_params(params, [*overrides, *format_overrides(names[0])]).runconfig.precision_opt_level]
  lvls = parse_levels(levels)
  jobs = [(f, lv) for f in names for lv in lvls if f != BASELINE]
  if BASELINE in names:  # float32 does not depend on the level: once, first (the baseline)
    jobs.insert(0, (BASELINE, min(lvls)))
  root = Path(model_dir)
  user = list(overrides)
  given = {o.split("=", 1)[0].strip() for o in user}
  defaults = [] if "runconfig.log_steps" in given else ["runconfig.log_steps=1"]
  if "runconfig.check_loss_values" not in given:  # a format whose loss diverges is a result (nan losses)
    defaults.append("runconfig.check_loss_values=false")
  plans = []  # every run's config checked before any trains: a format that cannot run fails now
  for fmt, level in jobs:
    out = root / run_name(fmt, level)
    own = [*defaults, *user, literal_override("runconfig.model_dir", str(out))]
    with _format_caused(params, own, fmt, names):
      plan = runner.load_plan(params, defaults + user + format_overrides(fmt, level) + own[-1:])
    rc = plan.runconfig
    if rc.mode not in TRAIN_MODES or rc.validate_only or rc.compile_only:
      what = "validate_only" if rc.validate_only else "compile_only" if rc.compile_only else f"mode {rc.mode}"
      raise SweepError(
        f"runconfig has {what}: a sweep trains every run (runconfig.mode train or train_and_eval, no "
        "validate_only / compile_only) and compares the losses; set those keys back, or use `wafer run`"
      )
    applied = [*defaults, *user, *format_overrides(fmt, level), own[-1]]
    plans.append((fmt, level, out, plan, applied))
  _check_earlier_runs(plans, root)
  if compile_cache:
    from wafer.compile import enable_compilation_cache

    enable_compilation_cache(root / "compile_cache")
  runs = []
  for i, (fmt, level, out, plan, applied) in enumerate(plans, 1):
    if progress:
      print(f"[sweep {i}/{len(jobs)}] {fmt} at precision_opt_level {level} -> {out}", flush=True)
    summary = runner.run_plan(plan, progress=progress)
    runs.append(dataclasses.replace(_run_of(fmt, level, out, summary), overrides=applied))
  _deviations(runs)
  result = SweepResult(runs, str(root), params=_source(params), overrides=user)
  if save:
    result.save()
  return result


def _source(params: Any) -> str:
  """What sweep.json names as the params: the file's path, or ``<dict>``."""
  return "<dict>" if isinstance(params, dict) else str(params)


def _check_earlier_runs(plans: Sequence[tuple[Any, ...]], root: Path) -> None:
  """Refuse a sweep whose run folders hold checkpoints written with other settings, before any run trains.

  A sweep rerun into its folder resumes each run from its checkpoint (an interrupted sweep goes on; a higher
  ``runconfig.max_steps`` trains further); with other settings (a new learning rate, model or data) each
  run would go on from weights trained otherwise, or train nothing and report the old losses as the new
  sweep's. The settings compared are those a run compares on resume (`wafer.train.loop.checkpoint_changes`:
  ``model``, ``train_input``, ``optimizer``, ``sparsity``, the batch size and the policy; not ``runconfig``).
  """
  from wafer.train.loop import checkpoint_changes, listed, run_settings

  found: dict[str, list[str]] = {}  # the changes -> the runs with them (often every run alike)
  for _, _, out, plan, _ in plans:
    settings = run_settings(plan.runtime.params, plan.task.batch_size, plan.runtime.policy)
    earlier = checkpoint_changes(out, settings)
    if earlier is not None and earlier[1]:
      found.setdefault(listed(earlier[1]), []).append(f"{out.name} at step {earlier[0]}")
  if found:
    what = " | ".join(f"{', '.join(runs)}: {changes}" for changes, runs in found.items())
    raise SweepError(
      f"--model_dir {root} holds checkpoints of an earlier sweep with other settings: {what}. This sweep "
      "would resume them: go on from weights trained with the checkpoint's settings, or (at max_steps) train "
      "nothing and report the earlier sweep's losses as its own. Give this sweep a new --model_dir, or set "
      "those keys back to the checkpoint's values (runconfig keys such as max_steps may differ: the runs then "
      "train further)"
    )


_FORMAT_FIXES = ("optimizer.loss_scaling_factor=dynamic",)
"""Overrides a sweep may suggest when a format it sets refuses the file's settings (each is suggested only
when the file then loads: cbfloat16 refuses a static loss scale, `wafer.config.OptimizerConfig.loss_scale`)."""


@contextlib.contextmanager
def _format_caused(params: Any, overrides: list[str], fmt: str, names: Sequence[str]) -> Iterator[None]:
  """A `ConfigError` raised inside, when the file loads with its own format but not with the sweep's
  ``fmt``, says that the sweep's format caused it and gives the fixes: ``--formats`` without ``fmt``, or
  an override (`_FORMAT_FIXES`) that makes every run load. The user's settings are never changed."""
  from wafer import runner
  from wafer.config import ConfigError
  from wafer.errors import _MISSING, short_repr

  try:
    yield
  except ConfigError as error:

    def loads(extra: list[str], with_format: bool) -> Any:
      try:
        return runner.load_plan(params, [*overrides, *extra, *(format_overrides(fmt) if with_format else [])])
      except WaferError:
        return None

    own = loads([], with_format=False)
    if own is None:  # the file fails on its own: its error as it is
      raise
    policy = own.params.policy()
    computes = policy.compute.name if own.params.model.mixed_precision else BASELINE
    others = [f for f in names if f != fmt]
    fixes = [f"sweep without it (--formats {','.join(others)})"] if others else []
    given = {o.split("=", 1)[0].strip() for o in overrides}
    fixes += [
      f"{'set' if fix.split('=', 1)[0] in given else 'add'} the override {fix} (every run of the sweep then has it)"
      for fix in _FORMAT_FIXES
      if loads([fix], with_format=True) is not None
    ]
    cause = (
      f"{fmt} is the sweep's (--formats {','.join(names)}{', the default' * (tuple(names) == FORMATS)}), not the params "
      f"file's, which computes in {computes}"
    )
    fix = f"; fix: {' or '.join(fixes)}" if fixes else ""
    problems = []
    for p in error.problems:
      got = "" if p.value is _MISSING else f" (got {short_repr(p.value)})"
      message = f"{cause}: {p.message}{got}{fix}"
      problems.append(dataclasses.replace(p, message=message, value=_MISSING))
    raise ConfigError(problems, error.source, error.notes) from None


def _run_of(fmt: str, level: int, out: Path, summary: RunSummary) -> Run:
  """The run's losses and last eval from its ``metrics.jsonl``: the whole history of the run folder,
  also when the run resumed from a checkpoint (a sweep rerun after an interruption, or after it
  finished: then nothing trains and the summary has no losses). The summary is the fallback when
  there is no metrics.jsonl."""
  from wafer.train import read_metrics

  metric = summary.eval_metric
  path = out / "metrics.jsonl"
  if path.exists():  # holds a step at most once (a resumed run moves later records aside)
    records = read_metrics(path)
    losses = [(r["step"], r["loss"]) for r in records if "loss" in r]
    evals = [(r["step"], r[f"eval/{metric}"]) for r in records if f"eval/{metric}" in r]
  else:
    losses = list(summary.losses or [])
    evals = summary.eval_results()
  last_eval = {"step": evals[-1][0], metric: float(evals[-1][1])} if evals else {}
  return Run(
    format=fmt,
    level=level,
    model_dir=str(out),
    steps=[int(s) for s, _ in losses],
    losses=[float(v) for _, v in losses],
    eval=last_eval,
    samples_per_sec_estimate=summary.samples_per_sec_estimate,
    estimate_mode=_estimate_mode(out / "compile_report.json"),
  )


def _estimate_mode(path: Path) -> str | None:
  """``"weight streaming, release 2.x"`` (or ``"... : does not fit"``) from a run's compile report, if any."""
  try:
    report = json.loads(path.read_text())
  except (OSError, ValueError):
    return None
  mode = str(report.get("mode", "?")).replace("_", " ")
  text = f"{'layer pipelined' if mode == 'pipeline' else mode}, release {report.get('release', '?')}"
  return text if report.get("fits", True) else f"{text}: does not fit"


def _deviations(runs: list[Run]) -> None:
  base = next((r for r in runs if r.format == BASELINE), None)
  if base is None:
    return
  ref = {s: v for s, v in zip(base.steps, base.losses) if math.isfinite(v) and v}
  for r in runs:
    u = unit_roundoff(r.format)
    # a loss that is not finite where float32's is (a diverged format) deviates without bound
    devs = [abs(v - ref[s]) / (abs(ref[s]) * u) if math.isfinite(v) else math.inf
            for s, v in zip(r.steps, r.losses) if s in ref]  # fmt: skip
    r.deviation_u = max(devs) if devs else None
