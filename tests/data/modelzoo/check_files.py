"""How many of the copied modelzoo params files validate at the config level, and why the others do not.

  python tests/data/modelzoo/check_files.py [-v] [FILE ...]   # default: every file of manifest.json

"Validates at the config level" is what ``wafer run --params FILE --validate_only`` checks before it
traces the step: the file loads (`wafer.config.load_params`), the registry builds its task
(`wafer.runner.load_plan`) and the task's batch shapes fit the model (``task.batch_spec()``).
Prints one line per file (``ok`` or the first line of the error) and the count.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent


def check(path: Path) -> str:
  """``"ok"``, or the error's text."""
  from wafer import runner

  try:
    plan = runner.load_plan(path, ["runconfig.validate_only=true"])
    if plan.task.batch_spec is not None:
      plan.task.batch_spec()
  except Exception as error:  # the outcome is reported, not raised
    return f"{type(error).__name__}: {error}"
  return "ok"


def main(argv: list[str]) -> int:
  verbose = "-v" in argv
  files = [Path(a) for a in argv if a != "-v"]
  if not files:
    files = [HERE / e["file"] for e in json.loads((HERE / "manifest.json").read_text())]
  t0 = time.perf_counter()
  ok = 0
  for path in files:
    outcome = check(path)
    ok += outcome == "ok"
    shown = outcome if verbose else outcome.splitlines()[0][:150]
    print(f"{path.relative_to(HERE) if path.is_relative_to(HERE) else path}: {shown}")
  print(f"{ok} of {len(files)} validate ({time.perf_counter() - t0:.1f} s)")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
