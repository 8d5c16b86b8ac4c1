"""The documentation: the README is a front door, links resolve, sources are public, the API is documented.

- README.md is at most 300 lines and keeps the two Quickstart commands;
- every relative link (and its ``#anchor``) in README.md, CONTRIBUTING.md, models/README.md and
  docs/**/*.md points at a file (and heading) of the repository;
- nothing in the repository cites files outside it (``../shared/...``, the old notes);
- every public name of ``precision`` and ``wafer`` (their ``__all__``) and of ``wafer.errors`` has a
  docstring and a section in the generated reference docs/api/*.md (``python docs/gen_api.py``),
  as optax's docs check does.
"""

from __future__ import annotations

import importlib
import importlib.util
import pathlib
import re
import subprocess

import jax
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
QUICKSTART = (
  "python3 -m venv .venv && . .venv/bin/activate && pip install -e . && wafer run",
  "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[dev]' && pytest",
)


def _markdown_files() -> list[pathlib.Path]:
  files = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "models" / "README.md"]
  return files + sorted((ROOT / "docs").rglob("*.md"))


def _repository_files() -> list[pathlib.Path]:
  """The repository's files (git's list when this is a checkout, else a walk without build folders)."""
  try:
    out = subprocess.run(
      ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
      cwd=ROOT,
      capture_output=True,
      text=True,
      check=True,
    ).stdout
    return [ROOT / line for line in out.splitlines() if (ROOT / line).is_file()]
  except (OSError, subprocess.CalledProcessError):
    skip = {".git", ".venv", "__pycache__", "node_modules", "build", "dist"}
    return [p for p in ROOT.rglob("*") if p.is_file() and not skip.intersection(p.relative_to(ROOT).parts)]


def _slug(heading: str) -> str:
  """GitHub's anchor of a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces as ``-``."""
  text = re.sub(r"[`*]", "", heading.strip().lower())
  text = re.sub(r"[^\w\- ]", "", text)
  return text.replace(" ", "-")


def _anchors(path: pathlib.Path) -> set[str]:
  seen: dict[str, int] = {}
  out = set()
  fenced = False
  for line in path.read_text().splitlines():
    if line.startswith("```"):
      fenced = not fenced
    if fenced or not line.startswith("#"):
      continue
    slug = _slug(line.lstrip("#"))
    n = seen.get(slug, 0)
    seen[slug] = n + 1
    out.add(slug if n == 0 else f"{slug}-{n}")
  return out


def _links(path: pathlib.Path) -> list[str]:
  text = re.sub(r"<!--.*?-->", "", path.read_text(), flags=re.S)  # commented-out links are not links
  text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)  # nor are code blocks
  text = re.sub(r"`[^`\n]*`", "", text)
  return re.findall(r"\]\(([^)\s]+)\)", text)


def test_readme_is_a_front_door():
  text = (ROOT / "README.md").read_text()
  assert len(text.splitlines()) <= 300
  for command in QUICKSTART:
    assert command in text


def test_readme_taste_prints_what_the_readme_shows(capsys):
  """The README's first Python block, run as it is, prints the output block that follows it.
  The gradient difference against float32 is compared exactly on CPU only: elsewhere its float32
  reference runs at the backend's default matmul precision (TF32 on a GPU)."""
  text = (ROOT / "README.md").read_text()
  code, shown = re.search(r"^```python\n(.*?)^```\n\n```\n(.*?)^```", text, flags=re.S | re.M).groups()
  exec(compile(code, "README.md", "exec"), {"__name__": "readme_taste"})
  printed = capsys.readouterr().out.splitlines()
  shown = shown.splitlines()
  assert len(printed) == len(shown)
  for i, (got, want) in enumerate(zip(printed, shown)):
    if i == 2 and jax.default_backend() != "cpu":
      assert 0.5 < float(got) / float(want) < 2, (got, want)
    else:
      assert got == want


def test_cost_model_guide_first_example_prints_what_the_guide_shows(tmp_path, monkeypatch, capsys):
  """The cost-model guide's first Python block, run as it is, prints every ``# <text>`` comment
  that directly follows a ``print(`` line (the numbers it shows are today's cost model's). It runs
  in a scratch directory: the block saves its report to ``model_dir``."""
  text = (ROOT / "docs" / "guides" / "cost-model.md").read_text()
  code = re.search(r"^```python\n(.*?)^```", text, flags=re.S | re.M).group(1)
  lines = code.splitlines()
  shown = [after[2:] for line, after in zip(lines, lines[1:]) if "print(" in line and after.startswith("# ")]
  assert shown, "the guide's first Python block shows no printed output to check"
  monkeypatch.chdir(tmp_path)
  exec(compile(code, "docs/guides/cost-model.md", "exec"), {"__name__": "cost_model_guide"})
  printed = capsys.readouterr().out.splitlines()
  missing = [want for want in shown if want not in printed]
  assert not missing, f"docs/guides/cost-model.md shows {missing}; the block printed {printed[:2]}"


@pytest.mark.slow  # 20 steps of the default job (~30 s on 2 cores)
@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the shown digits are the CPU's")
def test_the_default_jobs_log_in_the_guide_is_todays(tmp_path):
  """docs/guides/reference-models.md shows the default job's log (the README quotes its losses): its
  first logged losses are those of today's code (a change of the numerics left them stale once). The
  schedule is absolute (warm-up over 20 steps), so a 20-step run logs the same first steps."""
  text = (ROOT / "docs" / "guides" / "reference-models.md").read_text()
  shown = {int(s): loss for s, loss in re.findall(r"Step=(\d+), Loss=([\d.]+)", text) if int(s) <= 20}
  assert set(shown) == {1, 10, 20}, shown
  from wafer import runner

  path = ROOT / "models" / "bert" / "configs" / "params_bert_tiny_default.yaml"
  summary = runner.run_params(path, [f"runconfig.model_dir={tmp_path}", "runconfig.max_steps=20"])
  losses = dict(summary["losses"])
  assert {step: f"{losses[step]:.5f}" for step in shown} == shown


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the shown digits are the CPU's")
def test_autocast_concept_stochastic_example_prints_what_it_shows(capsys):
  """docs/concepts/autocast.md's stochastic-rounding example, run as it is, prints its output block
  (it passed Python numbers, constants that are never rounded, and printed float32 three times)."""
  text = (ROOT / "docs" / "concepts" / "autocast.md").read_text()
  pairs = re.findall(r"^```python\n(.*?)^```\n\n```\n(.*?)^```", text, flags=re.S | re.M)
  code, shown = next((c, o) for c, o in pairs if "def total(start, inc)" in c)
  exec(compile(code, "docs/concepts/autocast.md", "exec"), {"__name__": "autocast_concept"})
  assert capsys.readouterr().out.splitlines() == shown.splitlines()


@pytest.mark.slow  # about 5 s; .ci/run runs the slow tests
@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the guide shows a CPU run")
def test_mixed_precision_guide_cast_report_is_todays(capsys):
  """docs/guides/mixed-precision.md's example prints a cast report: its table is today's (a change that
  moved the attention scores' divisions into attention_softmax left it stale once). The report depends on
  shapes only, so the block runs without its three training steps (their losses' last digits depend on the
  machine)."""
  text = (ROOT / "docs" / "guides" / "mixed-precision.md").read_text()
  code, shown = re.search(r"^```python\n(.*?)^```\n\n```\n(.*?)^```", text, flags=re.S | re.M).groups()
  training = re.search(r"^mixed_step = .*?\n(?=^print\()", code, flags=re.S | re.M).group(0)
  setup = [line for line in training.splitlines() if line.startswith(("tokens =", "targets ="))]
  assert len(setup) == 2, training
  code = code.replace(training, "\n".join(setup) + "\n")
  exec(compile(code, "docs/guides/mixed-precision.md", "exec"), {"__name__": "mixed_precision_guide"})
  assert _decided(capsys.readouterr().out) == _decided(shown)


def _decided(report: str) -> list[tuple[str, ...]]:
  """A cast report table's rows as autocast decides them: each op class's values rounded and kept float32,
  and the equations of the classes it rounds or keeps (what JAX leaves untouched, its constants and data
  movement, varies by JAX version: 0.11 folds some constants)."""
  rows = [line.split() for line in report.splitlines() if re.match(r"^[a-z_0-9]+ +\d+ +\d+ +\d+ +\d+$", line)]
  assert len(rows) > 5, report
  return [(c, n if untouched == "0" else "", rounded, kept) for c, n, rounded, kept, untouched in rows]


@pytest.mark.parametrize("path", _markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
  broken = []
  for link in _links(path):
    if re.match(r"^[a-z]+:", link):  # http:, https:, mailto:
      continue
    target, _, anchor = link.partition("#")
    file = (path.parent / target).resolve() if target else path
    if not file.exists():
      broken.append(f"{link} (no such file)")
    elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
      broken.append(f"{link} (no heading #{anchor} in {file.relative_to(ROOT)})")
  assert not broken, f"{path.relative_to(ROOT)}: " + "; ".join(broken)


_NOTES_CITATION_ALLOWED: set[str] = set()


def test_nothing_cites_files_outside_the_repository():
  outside, notes = [], []
  for path in _repository_files():
    try:
      text = path.read_text()
    except (UnicodeDecodeError, OSError):
      continue
    rel = str(path.relative_to(ROOT))
    if rel == "tests/test_docs.py":
      continue
    for n, line in enumerate(text.splitlines(), 1):
      if "../shared" in line:
        outside.append(f"{rel}:{n}")
      if (
        re.search(r"\bcerebras\.md\b|\b(wafer|precision)\.md\s*(§|section)", line)
        and rel not in _NOTES_CITATION_ALLOWED
      ):
        notes.append(f"{rel}:{n}")
  assert not outside, "cites files outside the repository (cite docs/references.md): " + ", ".join(outside)
  assert not notes, "cites notes that are not in the repository (cite docs/references.md): " + ", ".join(
    notes
  )


def _gen_api():
  spec = importlib.util.spec_from_file_location("gen_api", ROOT / "docs" / "gen_api.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_every_public_name_has_a_docstring():
  missing = _gen_api().undocumented(("precision", "wafer", "wafer.errors"))
  assert not missing, "public names without a docstring (or a #: comment): " + ", ".join(missing)


@pytest.mark.parametrize(
  "page, module_name", [("precision", "precision"), ("wafer", "wafer"), ("errors", "wafer.errors")]
)
def test_every_public_name_is_in_the_generated_reference(page, module_name):
  text = (ROOT / "docs" / "api" / f"{page}.md").read_text()
  headings = set(re.findall(r"^## (\S+)$", text, re.M))
  missing = [n for n in importlib.import_module(module_name).__all__ if n not in headings]
  assert not missing, f"not in docs/api/{page}.md (run python docs/gen_api.py): " + ", ".join(missing)


def test_the_generated_reference_is_up_to_date():
  """docs/api/ is what docs/gen_api.py writes from today's docstrings (one source of truth)."""
  import subprocess
  import sys

  result = subprocess.run(
    [sys.executable, str(ROOT / "docs" / "gen_api.py"), "--check"], capture_output=True, text=True, cwd=ROOT
  )
  assert result.returncode == 0, f"run `python docs/gen_api.py`: {result.stdout}{result.stderr}"
