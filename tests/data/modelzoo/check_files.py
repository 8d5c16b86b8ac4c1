"""How many of the copied modelzoo params files validate at the config level, and why the others do not.

  python tests/data/modelzoo/check_files.py [-v] [--plan | --run] [FILE ...]   # default: every file of manifest.json

"Validates at the config level": the file loads (`wafer.config.load_params`), its ``model.name`` is a
registered model and its input sections name data processors that feed it. With ``--plan``, also what
``wafer run --params FILE --validate_only`` checks before it traces the step: the registry builds the
task (`wafer.runner.load_plan`) and its batch shapes fit the model (``task.batch_spec()``); slower (the
task builds the model's parameter shapes). With ``--run``, the command itself: ``wafer run --params FILE
--validate_only`` in a fresh process with a fresh model_dir (the trace, the lowering and the compile
report too), with its wall seconds and whether the estimate fits. Prints one line per file (``ok`` or
the first line of the error) and the count.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parents[2]))  # this checkout's wafer, not an installed one


def check(path: Path, plan: bool = False) -> str:
  """``"ok"``, or the error's text."""
  from wafer import registry, runner
  from wafer.config import load_params

  try:
    if plan:
      built = runner.load_plan(path, ["runconfig.validate_only=true"])
      if built.task.batch_spec is not None:
        built.task.batch_spec()
      return "ok"
    params = load_params(path, ["runconfig.validate_only=true"])
    spec = registry.get_spec(params.model.name)
    for section in (params.train_input, params.eval_input):
      if section is not None and section.data_processor not in spec.data_processors:
        return f"data_processor {section.data_processor!r} does not feed {params.model.name}"
  except Exception as error:  # the outcome is reported, not raised
    return f"{type(error).__name__}: {error}"
  return "ok"


def run(path: Path) -> str:
  """``"ok (N.N s, fits)"`` for ``wafer run --params path --validate_only`` in a fresh process, or its error."""
  with tempfile.TemporaryDirectory(prefix="check_files_") as model_dir:
    start = time.perf_counter()
    done = subprocess.run(
      [
        sys.executable,
        "-m",
        "wafer.cli",
        "run",
        "--params",
        str(path),
        "--validate_only",
        "--model_dir",
        model_dir,
      ],
      cwd=HERE.parents[2],
      capture_output=True,
      text=True,
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
      lines = [line for line in done.stderr.splitlines() if line.strip()]
      return next((line for line in lines if not line.startswith("(")), "failed") + f" ({seconds:.1f} s)"
    report = json.loads((Path(model_dir) / "compile_report.json").read_text())
  return f"ok ({seconds:.1f} s, {'fits' if report['fits'] else 'does not fit'})"


def main(argv: list[str]) -> int:
  if "-h" in argv or "--help" in argv:
    print(__doc__)
    return 0
  unknown = [a for a in argv if a.startswith("-") and a not in ("-v", "--plan", "--run")]
  if unknown:
    print(
      f"check_files.py: unknown option(s) {' '.join(unknown)}; allowed: -v, --plan, --run, -h",
      file=sys.stderr,
    )
    return 2
  verbose, plan, full = "-v" in argv, "--plan" in argv, "--run" in argv
  files = [Path(a) for a in argv if a not in ("-v", "--plan", "--run")]
  if not files:
    files = [HERE / e["file"] for e in json.loads((HERE / "manifest.json").read_text())]
  t0 = time.perf_counter()
  ok = 0
  for path in files:
    outcome = run(path) if full else check(path, plan)
    ok += outcome.startswith("ok")
    shown = outcome if verbose else outcome.splitlines()[0][:150]
    print(f"{path.relative_to(HERE) if path.is_relative_to(HERE) else path}: {shown}")
  print(f"{ok} of {len(files)} validate ({time.perf_counter() - t0:.1f} s)")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
