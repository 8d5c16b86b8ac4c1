"""The import graph of ``precision``, ``wafer`` and ``models`` has no circles, and ``wafer`` names no model.

A static walk of every ``import`` statement (``ast``; relative imports resolved), at module level and
inside functions and under ``if TYPE_CHECKING:`` alike: a function-level import is still a dependency
of the module, only a later one, and a type-only import still ties the two modules' designs together.
The circles this test guards against were of both kinds: the config <-> registry one and ``closures``
importing ``compile`` for an error type were function-level imports, ``costmodel.report`` <->
``costmodel.placement_plot`` a type-only one. The one deliberate circle is the pytest plugin's lazy shim:
``_precision_pytest_plugin`` (a top-level module, so that loading the plugin imports neither
``precision`` nor JAX) and ``precision.pytest_plugin``, which it loads on first use.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("precision", "wafer", "models")
ALLOWED_CYCLES = [{"_precision_pytest_plugin", "precision.pytest_plugin"}]


def _modules() -> dict[str, pathlib.Path]:
  out = {"_precision_pytest_plugin": ROOT / "_precision_pytest_plugin.py"}
  for package in PACKAGES:
    for path in sorted((ROOT / package).rglob("*.py")):
      parts = list(path.relative_to(ROOT).with_suffix("").parts)
      if parts[-1] == "__init__":
        parts.pop()
      out[".".join(parts)] = path
  return out


def imports_of(name: str, path: pathlib.Path, modules: dict[str, pathlib.Path]) -> set[str]:
  """The modules of ours that module ``name`` imports, anywhere in its code."""
  tree = ast.parse(path.read_text(), str(path))
  package = name if path.name == "__init__.py" else name.rpartition(".")[0]
  out = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      targets = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        anchor = package.split(".")
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
      # ``from a import b``: the submodule a.b when there is one, else a itself
      targets = [
        f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names
      ]
    else:
      continue
    for target in targets:
      while target and target not in modules:  # ``import a.b.c`` of a name inside a module
        target = target.rpartition(".")[0]
      if target and target != name:
        out.add(target)
  return out


def import_graph() -> dict[str, set[str]]:
  modules = _modules()
  return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
  """The strongly connected components of more than one module (Tarjan)."""
  index: dict[str, int] = {}
  low: dict[str, int] = {}
  stack: list[str] = []
  on_stack: set[str] = set()
  out: list[set[str]] = []

  def visit(v: str) -> None:
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph.get(v, ())):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = set()
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.add(w)
        if w == v:
          break
      if len(component) > 1:
        out.append(component)

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return out


def _path(graph: dict[str, set[str]], component: set[str]) -> str:
  """One circle inside ``component``, as ``a -> b -> a``."""
  start = min(component)
  previous = {start: None}
  queue = [start]
  while queue:
    v = queue.pop(0)
    for w in sorted(graph[v] & component):
      if w == start:
        chain = [v]
        while previous[chain[-1]] is not None:
          chain.append(previous[chain[-1]])
        return " -> ".join([*reversed(chain), start])
      if w not in previous:
        previous[w] = v
        queue.append(w)
  return ", ".join(sorted(component))


def test_the_walk_sees_function_level_and_relative_imports(tmp_path):
  pkg = tmp_path / "pkg"
  pkg.mkdir()
  (pkg / "__init__.py").write_text("from .a import f\n")
  (pkg / "a.py").write_text("def f():\n  from . import b\n  import pkg.b as c\n")
  (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n  from pkg import c\n")
  modules = {"pkg": pkg / "__init__.py", "pkg.a": pkg / "a.py", "pkg.b": pkg / "b.py"}
  assert imports_of("pkg", modules["pkg"], modules) == {"pkg.a"}
  assert imports_of("pkg.a", modules["pkg.a"], modules) == {"pkg.b"}
  assert imports_of("pkg.b", modules["pkg.b"], modules) == {"pkg"}  # type-only imports count too
  assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def test_no_import_circles():
  graph = import_graph()
  found = [c for c in cycles(graph) if c not in ALLOWED_CYCLES]
  assert not found, "import circles:\n" + "\n".join(_path(graph, c) for c in found)


def test_the_shim_circle_is_the_deliberate_one():
  graph = import_graph()
  assert "precision.pytest_plugin" in graph["_precision_pytest_plugin"]


def test_wafer_never_imports_a_model_package():
  graph = import_graph()
  bad = sorted(
    f"{m} -> {t}"
    for m, targets in graph.items()
    if m.split(".")[0] in ("wafer", "precision")
    for t in targets
    if t.split(".")[0] == "models"
  )
  assert not bad, "the engine names a model package: " + ", ".join(bad)


def test_precision_imports_nothing_of_the_project():
  graph = import_graph()
  bad = sorted(
    f"{m} -> {t}"
    for m, targets in graph.items()
    if m.startswith("precision")
    for t in targets
    if not t.startswith("precision") and t != "_precision_pytest_plugin"  # the shim's own state
  )
  assert not bad, ", ".join(bad)
