"""Generate the API reference (``docs/api/*.md``) from the packages' ``__all__`` and docstrings.

Run from the repository root after changing a public name or its docstring::

  python docs/gen_api.py          # writes docs/api/{index,precision,wafer,errors}.md
  python docs/gen_api.py --check  # exits 1 if the files on disk are not what it would write

A public name is a name in a package's ``__all__``. A class, function or module is documented by
its docstring; a constant (a predefined format, ``__version__``) by the ``#:`` comment lines just
above its assignment in the module that defines it (Sphinx's convention). `undocumented` lists the
public names with neither; ``tests/test_docs.py`` fails when it is not empty.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import pathlib
import re
import sys
from types import ModuleType

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "api"
# (page, module, title, intro)
PAGES = (
  (
    "precision",
    "precision",
    "`precision`",
    "Formats, rounding, policies, autocast, reports, loss scaling, testing helpers.",
  ),
  ("wafer", "wafer", "`wafer`", "The emulated system: the static-graph step, step closures, the cost model."),
  (
    "errors",
    "wafer.errors",
    "`wafer.errors`",
    "Every user-facing error type of `wafer`, with when it is raised.",
  ),
)


def _kind(obj: object) -> str:
  if inspect.ismodule(obj):
    return "module"
  if inspect.isclass(obj):
    return "exception" if issubclass(obj, BaseException) else "class"
  if callable(obj):
    return "function"
  return "constant"


def _data_doc(package: ModuleType, name: str) -> str:
  """The ``#:`` comment above ``name``'s top-level assignment in ``package``'s modules ('' if none)."""
  files = [pathlib.Path(package.__file__)]
  if package.__file__.endswith("__init__.py"):
    files += sorted(pathlib.Path(package.__file__).parent.rglob("*.py"))
  assign = re.compile(rf"^{re.escape(name)}\s*(:[^=]*)?=")
  for path in files:
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
      if assign.match(line):
        doc = []
        j = i - 1
        while j >= 0 and lines[j].startswith("#:"):
          doc.insert(0, lines[j][2:].strip())
          j -= 1
        if doc:
          return " ".join(doc)
  return ""


def doc_of(package: ModuleType, name: str) -> str:
  """The documentation of ``package.name`` ('' when it has none)."""
  obj = getattr(package, name)
  if _kind(obj) == "constant":
    return _data_doc(package, name)
  return inspect.cleandoc(obj.__doc__ or "") if (obj.__doc__ or "").strip() else ""


def undocumented(module_names: tuple[str, ...] = ("precision", "wafer")) -> list[str]:
  """Public names (``module.name``) without documentation."""
  out = []
  for module_name in module_names:
    package = importlib.import_module(module_name)
    out += [f"{module_name}.{n}" for n in package.__all__ if not doc_of(package, n)]
  return out


def _signature(obj: object) -> str:
  try:
    text = str(inspect.signature(obj))
  except (TypeError, ValueError):
    return ""
  return re.sub(r" at 0x[0-9a-f]+", "", text)


_TABLE_BORDER = re.compile(r"^=+( +=+)+ *$")


def _markdown(doc: str) -> str:
  """A docstring as Markdown: doctest blocks, reST simple tables and ``::`` literal blocks fenced, the
  rest as is."""
  out: list[str] = []
  lines = doc.splitlines()
  i = 0
  while i < len(lines):
    line = lines[i]
    if _TABLE_BORDER.match(line):  # a reST simple table: shown as it is written
      block, borders = [], 0
      while i < len(lines) and borders < 3:
        borders += bool(_TABLE_BORDER.match(lines[i]))
        block.append(lines[i])
        i += 1
      out += ["```", *block, "```"]
      continue
    if line.lstrip().startswith(">>>"):
      block = []
      while i < len(lines) and lines[i].strip():
        block.append(lines[i])
        i += 1
      out += ["```python", *block, "```"]
      continue
    if line.rstrip().endswith("::") and i + 1 < len(lines):
      out.append(line.rstrip()[:-1])
      i += 1
      block = []
      while i < len(lines) and (not lines[i].strip() or lines[i].startswith((" ", "\t"))):
        block.append(lines[i])
        i += 1
      while block and not block[-1].strip():
        block.pop()
      while block and not block[0].strip():
        block.pop(0)
      out += ["", "```", *inspect.cleandoc("\n".join(block)).splitlines(), "```", ""]
      continue
    out.append(line)
    i += 1
  return "\n".join(out)


def _members(cls: type) -> list[str]:
  rows = []
  for name, member in sorted(vars(cls).items()):
    if name.startswith("_"):
      continue
    target = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
    if not callable(target) or not (getattr(target, "__doc__", None) or "").strip():
      continue
    first = inspect.cleandoc(target.__doc__).split("\n\n")[0].replace("\n", " ")
    kind = "property" if isinstance(member, property) else "method"
    rows.append(f"- `{name}` ({kind}): {first}")
  return rows


def render(page: str, module_name: str, title: str, intro: str) -> str:
  """The Markdown of one page."""
  package = importlib.import_module(module_name)
  parts = [
    f"# {title}",
    "",
    "<!-- Generated by docs/gen_api.py from __all__ and the docstrings: edit those, then rerun it. -->",
    "",
    intro,
    "",
  ]
  head = inspect.cleandoc(package.__doc__ or "")
  if head:
    parts += [_markdown(head), ""]
  names = list(package.__all__)
  parts += ["| name | kind |", "|---|---|"]
  parts += [f"| [`{n}`](#{n.lower()}) | {_kind(getattr(package, n))} |" for n in names]
  parts.append("")
  for name in names:
    obj = getattr(package, name)
    kind = _kind(obj)
    parts += [f"## {name}", ""]
    where = getattr(obj, "__module__", None) if kind != "module" else obj.__name__
    if kind in ("class", "exception", "function"):
      parts += ["```python", f"{module_name}.{name}{_signature(obj)}", "```", ""]
      if kind == "exception":
        bases = ", ".join(f"`{b.__name__}`" for b in obj.__bases__)
        parts += [f"Subclass of {bases}; defined in `{where}`.", ""]
      elif where:
        parts += [f"Defined in `{where}`.", ""]
    elif kind == "module":
      parts += [f"The module `{where}`.", ""]
    parts += [_markdown(doc_of(package, name)) or "*(undocumented)*", ""]
    if kind in ("class", "exception"):
      members = _members(obj)
      if members:
        parts += ["Members:", "", *members, ""]
  return "\n".join(parts).rstrip() + "\n"


def index() -> str:
  """The index page of the API reference."""
  rows = [
    "# API reference",
    "",
    "<!-- Generated by docs/gen_api.py: edit it, then rerun it. -->",
    "",
    "Generated from each package's `__all__` and docstrings by `python docs/gen_api.py`.",
    "",
  ]
  for page, _, title, intro in PAGES:
    rows.append(f"- [{title}]({page}.md): {intro}")
  rows += [
    "",
    "Not generated: `models` (the reference models, see [models/README.md](../../models/README.md)) and",
    "the subpackages (`wafer.config`, `wafer.train`, `wafer.costmodel`, `wafer.data`), whose",
    "module docstrings describe them.",
  ]
  return "\n".join(rows) + "\n"


def pages() -> dict[pathlib.Path, str]:
  """``{path: text}`` of every generated page."""
  out = {OUT / "index.md": index()}
  for page in PAGES:
    out[OUT / f"{page[0]}.md"] = render(*page)
  return out


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--check", action="store_true", help="exit 1 if docs/api/ is out of date")
  args = parser.parse_args(argv)
  missing = undocumented()
  if missing:
    print("undocumented public names: " + ", ".join(missing), file=sys.stderr)
  stale = []
  for path, text in pages().items():
    if args.check:
      if not path.exists() or path.read_text() != text:
        stale.append(str(path.relative_to(ROOT)))
    else:
      path.parent.mkdir(parents=True, exist_ok=True)
      path.write_text(text)
      print(f"wrote {path.relative_to(ROOT)}")
  if stale:
    print("out of date (run python docs/gen_api.py): " + ", ".join(stale), file=sys.stderr)
  return 1 if (missing or stale) else 0


if __name__ == "__main__":
  sys.path.insert(0, str(ROOT))
  sys.exit(main())
