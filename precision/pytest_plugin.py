"""pytest plugin: run a numerical test once per float format.

Installing the project registers it (entry point ``pytest11``, name ``precision``, module
``_precision_pytest_plugin``); nothing to add to a ``conftest.py``. Disable it with
``pytest -p no:precision``. This module holds the implementation; the registered module is a
thin shim that imports it only when a test uses the marker or requests ``fmt``.

* The marker ``@pytest.mark.formats("cbfloat16", "bfloat16", ...)`` parametrizes the test over
  the fixture ``fmt``: one test per format, ``fmt`` the `precision.FloatFormat`, the test id
  the format's name (aliases such as ``"bf16"`` resolve, and the id is the canonical
  ``bfloat16``). `precision.FloatFormat` objects are accepted too (custom formats).
* Like ``pytest.mark.parametrize``, the marker may sit on a test, a class or a module
  (``pytestmark``); the closest one applies, and every test it covers must request ``fmt``.
* Mistakes are errors, never a silently skipped format: an unknown format name, a format
  listed twice (or two formats of one name), a marker without names (or given a list: pass
  the names one by one, ``formats(*names)``), a marked test that does not request ``fmt`` or
  that also parametrizes ``fmt`` with ``@pytest.mark.parametrize``, or a test that requests
  ``fmt`` without the marker (and without a fixture or parametrization of that name) fail the
  collection of the test's module, naming the test and the known formats.
* ``fmt`` is a parametrized argument, not a fixture, so ``@hypothesis.given`` tests take it
  without tripping hypothesis's health check on function-scoped fixtures.

Example (``tests/test_my_kernel.py``)::

    import numpy as np
    import pytest
    import precision
    from precision.testing import assert_close

    @pytest.mark.formats("cbfloat16", "bfloat16", "float16")
    def test_mean_is_within_one_ulp(fmt):
      x = precision.round(np.linspace(1, 2, 1000, dtype=np.float32), fmt)
      assert_close(my_mean(x, fmt), np.mean(np.float64(x)), fmt, ulps=1)

Loading the plugin imports neither `precision` nor JAX (the registered shim is a top-level
module, as hypothesis does with ``_hypothesis_pytestplugin``): JAX options that JAX reads from
the environment at import (``JAX_PLATFORMS``, ``JAX_ENABLE_X64``, ...) may still be set in a
``conftest.py``. `precision`, and so JAX, is imported when the first test that uses the marker
or requests ``fmt`` is collected.
"""

from __future__ import annotations

from typing import Any

import pytest

from _precision_pytest_plugin import FIXTURE, MARKER
from precision.formats import PREDEFINED, FloatFormat, FormatError, get_format

_USAGE = '@pytest.mark.formats("cbfloat16", "bfloat16", ...)'


def _known_formats() -> str:
  return ", ".join(f.name for f in PREDEFINED) + " (or an alias, a registered name, a precision.FloatFormat)"


def _resolve(where: str, arg: Any) -> FloatFormat:
  try:
    return get_format(arg)
  except FormatError as err:
    message = f"{where}: @pytest.mark.{MARKER}({arg!r}): {err}"
  if isinstance(arg, (list, tuple)):  # as for @pytest.mark.parametrize; the marker takes the names one by one
    message += f"; pass the names as separate arguments: @pytest.mark.{MARKER}(*{list(arg)!r})"
  # failed outside the `except`: no "During handling of the above exception" in the report
  pytest.fail(message, pytrace=False)


def generate_tests(metafunc: pytest.Metafunc) -> None:
  marker = metafunc.definition.get_closest_marker(MARKER)
  where = metafunc.definition.nodeid
  if marker is None:
    # `fmt` is no fixture of ours (a function-scoped one would trip hypothesis's health check on
    # every @given test): a test asking for it with no marker, no fixture of that name and no
    # parametrization gets this message instead of pytest's "fixture 'fmt' not found".
    # `_arg2fixturedefs` holds the fixtures and direct parametrizations; without it (a future
    # pytest), pytest's own message remains.
    provided = getattr(metafunc, "_arg2fixturedefs", None)
    if FIXTURE in metafunc.fixturenames and provided is not None and FIXTURE not in provided:
      pytest.fail(
        f"{where}: requests `{FIXTURE}`, which the marker {_USAGE} provides; the test has no such marker "
        f"(nor a fixture or parametrization named `{FIXTURE}`). Add the marker with the formats to test. "
        f"Formats: {_known_formats()}",
        pytrace=False,
      )
    return
  if marker.kwargs:
    pytest.fail(
      f"{where}: @pytest.mark.{MARKER} takes format names only, got keywords {sorted(marker.kwargs)}; "
      f"write {_USAGE}",
      pytrace=False,
    )
  if not marker.args:
    pytest.fail(
      f"{where}: @pytest.mark.{MARKER}() names no format; write {_USAGE}. Formats: {_known_formats()}",
      pytrace=False,
    )
  if FIXTURE not in metafunc.fixturenames:
    pytest.fail(
      f"{where}: marked @pytest.mark.{MARKER}(...) but does not request the fixture `{FIXTURE}`; "
      f"add a `{FIXTURE}` argument (the precision.FloatFormat of each run), or remove the marker",
      pytrace=False,
    )
  formats = [_resolve(where, arg) for arg in marker.args]
  seen: dict[FloatFormat, Any] = {}
  named: dict[str, Any] = {}
  for arg, f in zip(marker.args, formats):
    if f in seen:
      pytest.fail(
        f"{where}: @pytest.mark.{MARKER}: {arg!r} and {seen[f]!r} are the same format ({f.name}); list it once",
        pytrace=False,
      )
    if f.name in named:  # the id and assert_close's messages name the format: they must tell them apart
      pytest.fail(
        f"{where}: @pytest.mark.{MARKER}: {arg!r} and {named[f.name]!r} are different formats named "
        f"{f.name!r}, which the test ids and failure messages could not tell apart; give one its own name "
        f"(FloatFormat.replace names it by the changed fields, e.g. {f.name}[overflow=saturate])",
        pytrace=False,
      )
    seen[f], named[f.name] = arg, arg
  # `_calls` holds the parametrizations so far (this hook runs last); without it, pytest's own
  # "duplicate parametrization of 'fmt'" remains
  if any(FIXTURE in getattr(call, "params", {}) for call in getattr(metafunc, "_calls", ())):
    pytest.fail(
      f"{where}: `{FIXTURE}` is parametrized twice: by @pytest.mark.parametrize({FIXTURE!r}, ...) and by "
      f"@pytest.mark.{MARKER}(...) (on the test, its class or its module); keep one, or rename the "
      "parametrized argument",
      pytrace=False,
    )
  # Each run also carries a `parametrize` mark, which is how hypothesis's pytest plugin tells a
  # parametrized test: it then gives each format its own example-database key and does not fail a
  # @given method of a class, whose runs get one instance of the class each, as "differing executors".
  metafunc.parametrize(
    FIXTURE,
    [pytest.param(f, id=f.name, marks=pytest.mark.parametrize(FIXTURE, [f], ids=[f.name])) for f in formats],
  )
