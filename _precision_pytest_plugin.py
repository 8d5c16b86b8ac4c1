"""The pytest entry point of `precision`'s plugin (``pytest11``: ``precision``).

A top-level module, so that pytest loading it imports neither `precision` nor JAX: JAX reads
options such as ``JAX_PLATFORMS`` from the environment when it is imported, and a user's
``conftest.py`` must still be able to set them. The implementation, and its documentation, is
`precision.pytest_plugin`; it is imported only for a test that uses ``@pytest.mark.formats`` or
requests ``fmt``.
"""

from __future__ import annotations

import pytest

MARKER = "formats"
FIXTURE = "fmt"


def pytest_configure(config: pytest.Config) -> None:
  config.addinivalue_line(
    "markers",
    f"{MARKER}(*names): run the test once per float format (names, aliases or precision.FloatFormat "
    f"objects); the test receives the format as the fixture `{FIXTURE}` (a precision.FloatFormat) and "
    "its name as the test id",
  )


@pytest.hookimpl(trylast=True)  # after @pytest.mark.parametrize and conftest hooks, for the check below
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
  if metafunc.definition.get_closest_marker(MARKER) is None and FIXTURE not in metafunc.fixturenames:
    return
  from precision import pytest_plugin

  pytest_plugin.generate_tests(metafunc)
