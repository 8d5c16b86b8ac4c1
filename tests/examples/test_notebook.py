"""examples/quickstart.ipynb runs top to bottom in a fresh kernel, and is stored without outputs."""

from __future__ import annotations

import sys
from pathlib import Path

import nbclient
import nbformat
import pytest

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "quickstart.ipynb"


def test_notebook_is_stored_without_outputs():
  nb = nbformat.read(NOTEBOOK, as_version=4)
  code = [c for c in nb.cells if c.cell_type == "code"]
  assert code
  assert all(not c.outputs and c.execution_count is None for c in code)


@pytest.mark.slow
def test_notebook_runs_top_to_bottom(tmp_path, monkeypatch):
  nb = nbformat.read(NOTEBOOK, as_version=4)
  # The kernel is this interpreter (the project's environment), in its own process, working in tmp_path.
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  client = nbclient.NotebookClient(
    nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
  )
  client.kernel_manager_class = _manager(sys.executable)
  client.execute()
  outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
  assert not [o for o in outputs if o.output_type == "error"]
  images = [o for o in outputs if "image/png" in o.get("data", {})]
  assert len(images) == 3  # the numerics report, the sweep and the placement picture


def _manager(python: str):
  """A kernel manager that starts ``python -m ipykernel_launcher`` (not whatever kernelspec is installed)."""
  from jupyter_client.manager import KernelManager

  class Manager(KernelManager):
    def format_kernel_cmd(self, extra_arguments=None):
      return [python, "-m", "ipykernel_launcher", "-f", self.connection_file]

  return Manager
