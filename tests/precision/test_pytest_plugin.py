"""The pytest plugin (`precision.pytest_plugin`), run on small test files through ``pytester``.

Each inner run gets an ini with this project's strictness (``--strict-markers``,
``filterwarnings = error``); the plugin comes from the installed ``pytest11`` entry point, as
in a user's project (nothing passes ``-p``).
"""

import importlib.metadata
import subprocess
import sys
import textwrap

import pytest

pytest_plugins = ["pytester"]

# ``-p no:benchmark``: pytest-benchmark, where installed (the GPU image has it), warns inside an
# xdist worker and the strict filter below would turn that into an INTERNALERROR of the inner run.
STRICT_INI = """
[pytest]
addopts = --strict-markers -p no:cacheprovider -p no:benchmark
filterwarnings =
    error
"""


@pytest.fixture
def run(pytester):
  """Write ``source`` as a test module and run pytest on it in process; returns the RunResult."""
  pytester.makeini(STRICT_INI)

  def _run(source: str, *args: str, name: str = "test_numerics"):
    pytester.makepyfile(**{name: textwrap.dedent(source)})
    return pytester.runpytest(*args)

  return _run


def test_the_entry_point_registers_the_plugin():
  found = [ep for ep in importlib.metadata.entry_points(group="pytest11") if ep.name == "precision"]
  assert [ep.value for ep in found] == ["_precision_pytest_plugin"]


def test_marker_gives_one_test_per_format_with_its_name_as_id(run):
  result = run(
    """
    import pytest
    import precision

    @pytest.mark.formats("cbfloat16", "bf16", precision.float16.replace(subnormals=False))
    def test_a(fmt):
      pass
    """,
    "--collect-only",
    "-q",
  )
  assert result.stdout.lines[:3] == [
    "test_numerics.py::test_a[cbfloat16]",
    "test_numerics.py::test_a[bfloat16]",
    "test_numerics.py::test_a[float16[subnormals=False]]",
  ]
  assert result.ret == 0


def test_fmt_is_the_float_format(run):
  result = run(
    """
    import pytest
    import precision

    @pytest.mark.formats("cbfloat16", "fp16", "float8_e4m3fn")
    def test_fmt(fmt, request):
      assert isinstance(fmt, precision.FloatFormat)
      assert fmt is precision.get_format(request.node.callspec.id)
      assert fmt.name == request.node.callspec.id
    """,
    "-v",
  )
  result.assert_outcomes(passed=3)
  result.stdout.fnmatch_lines(["*test_fmt?cbfloat16? PASSED*", "*test_fmt?float16? PASSED*"])


def test_marker_on_a_class_or_module_and_the_closest_wins(run):
  result = run(
    """
    import pytest

    pytestmark = pytest.mark.formats("bfloat16")

    def test_module_level(fmt):
      assert fmt.name == "bfloat16"

    @pytest.mark.formats("cbfloat16", "float16")
    class TestClass:
      def test_class_level(self, fmt):
        assert fmt.name in ("cbfloat16", "float16")

      @pytest.mark.formats("float32")
      def test_own_marker(self, fmt):
        assert fmt.name == "float32"
    """,
    "-v",
  )
  result.assert_outcomes(passed=4)
  result.stdout.fnmatch_lines(["*TestClass::test_own_marker?float32? PASSED*"])


def test_combines_with_parametrize_and_hypothesis(run):
  # fmt is a parametrized argument, not a function-scoped fixture: hypothesis runs without its
  # health-check error, and the ids combine with other parameters.
  result = run(
    """
    import numpy as np
    import pytest
    from hypothesis import given, strategies as st
    import precision

    @pytest.mark.formats("cbfloat16", "bfloat16")
    @pytest.mark.parametrize("mode", ["nearest_even", "toward_zero"])
    @given(x=st.floats(1.0, 2.0, width=32))
    def test_rounding_is_within_one_ulp(fmt, mode, x):
      r = float(precision.round(np.float32(x), fmt, mode))
      assert abs(r - x) <= float(fmt.ulp(np.float32(x)))
    """,
    "-v",
  )
  result.assert_outcomes(passed=4)
  result.stdout.fnmatch_lines(["*test_rounding_is_within_one_ulp?toward_zero-bfloat16? PASSED*"])


def test_hypothesis_method_of_a_class_runs_once_per_format(run):
  # Each format's run of a method gets a new instance of the class; hypothesis calls that a
  # "differing executors" error unless the test is parametrized, as it is: the marker's runs count
  # as parametrized for hypothesis (no health-check failure, one example database key per format),
  # with the marker on the method and on the class, and alone (no @pytest.mark.parametrize).
  result = run(
    """
    import pytest
    from hypothesis import given, settings, strategies as st

    class TestOnTheMethod:
      @pytest.mark.formats("bfloat16", "cbfloat16")
      @given(x=st.integers(0, 3))
      @settings(max_examples=3)
      def test_a(self, fmt, x):
        assert fmt.name in ("bfloat16", "cbfloat16")

    @pytest.mark.formats("f16", "f32")
    class TestOnTheClass:
      @given(x=st.integers(0, 3))
      @settings(max_examples=3)
      def test_b(self, fmt, x):
        assert fmt.name in ("float16", "float32")
    """,
  )
  result.assert_outcomes(passed=4)


def test_assert_close_failure_shows_the_worst_ulps_index_and_values(run):
  result = run(
    """
    import numpy as np
    import pytest
    from precision.testing import assert_close

    @pytest.mark.formats("cbfloat16", "bfloat16")
    def test_sum(fmt):
      expected = np.float32([1.0, 2.0, 4.0, 8.0])
      actual = expected.copy()
      actual[2] += np.float32(3 * 4.0 * fmt.eps)  # 3 ulp at 4.0
      assert_close(actual, expected, fmt, ulps=1)
    """
  )
  result.assert_outcomes(failed=2)
  result.stdout.fnmatch_lines(
    [
      "E     AssertionError: 1 of 4 elements differ by more than 1 ulp of cbfloat16; worst: 3 ulp at index (2,): "
      "actual 4.0234375, expected 4.0, ulp of cbfloat16 at expected 0.0078125",
      "E     AssertionError: 1 of 4 elements differ by more than 1 ulp of bfloat16; worst: 3 ulp at index (2,): "
      "actual 4.09375, expected 4.0, ulp of bfloat16 at expected 0.03125",
      "FAILED test_numerics.py::test_sum?cbfloat16? - AssertionError: 1 of 4 element*",
      "FAILED test_numerics.py::test_sum?bfloat16? - AssertionError: 1 of 4 element*",
    ]
  )


def test_unknown_format_name_is_a_collection_error(run):
  result = run(
    """
    import pytest

    @pytest.mark.formats("cbfloat16", "cbfloat61")
    def test_a(fmt):
      pass
    """
  )
  result.assert_outcomes(errors=1)
  result.stdout.fnmatch_lines(
    [
      "*ERROR collecting test_numerics.py*",
      "test_numerics.py::test_a: @pytest.mark.formats('cbfloat61'): unknown float format 'cbfloat61'. "
      "Did you mean 'cbfloat16'? Known formats: float32 (*); bfloat16 (bf16); *cbfloat16 (cb16, cbf16)*",
    ]
  )
  assert "Traceback" not in result.stdout.str()


BAD_USES = {
  "no marker": (
    "def test_a(fmt):\n  pass\n",
    "test_numerics.py::test_a: requests `fmt`, which the marker @pytest.mark.formats(*) provides; "
    "the test has no such marker*Formats: float32, bfloat16, float16, cbfloat16, float8_e4m3fn, float8_e5m2*",
  ),
  "no fmt": (
    "@pytest.mark.formats('bf16')\ndef test_a():\n  pass\n",
    "test_numerics.py::test_a: marked @pytest.mark.formats(...) but does not request the fixture `fmt`; add a `fmt`*",
  ),
  "no names": (
    "@pytest.mark.formats()\ndef test_a(fmt):\n  pass\n",
    "test_numerics.py::test_a: @pytest.mark.formats() names no format; write @pytest.mark.formats(*",
  ),
  "twice": (
    "@pytest.mark.formats('bfloat16', 'bf16')\ndef test_a(fmt):\n  pass\n",
    "test_numerics.py::test_a: @pytest.mark.formats: 'bf16' and 'bfloat16' are the same format (bfloat16); list it once",
  ),
  "keywords": (
    "@pytest.mark.formats('bf16', ulps=1)\ndef test_a(fmt):\n  pass\n",
    "test_numerics.py::test_a: @pytest.mark.formats takes format names only, got keywords ?'ulps'?; write *",
  ),
}


@pytest.mark.parametrize("case", sorted(BAD_USES))
def test_mistakes_are_collection_errors_naming_the_test(run, case):
  body, message = BAD_USES[case]
  result = run("import pytest\n\n" + body)
  result.assert_outcomes(errors=1)
  result.stdout.fnmatch_lines(["*ERROR collecting test_numerics.py*", message])
  assert "Traceback" not in result.stdout.str()


def test_fmt_from_elsewhere_is_left_alone(run):
  # A fixture or a parametrization named `fmt` needs no marker.
  result = run(
    """
    import pytest

    @pytest.mark.parametrize("fmt", ["anything"])
    def test_parametrized(fmt):
      assert fmt == "anything"

    @pytest.fixture
    def other():
      return 1

    class TestOwnFixture:
      @pytest.fixture
      def fmt(self):
        return "mine"

      def test_fixture(self, fmt):
        assert fmt == "mine"
    """
  )
  result.assert_outcomes(passed=2)


def test_installed_plugin_loads_in_a_fresh_process(pytester):
  # No -p and no conftest: the entry point alone registers the marker (--strict-markers would
  # reject an unknown one) and parametrizes the test; `-p no:precision` turns it off.
  pytester.makeini(STRICT_INI)
  pytester.makepyfile(
    test_fresh="""
    import pytest

    @pytest.mark.formats("cbfloat16", "float16")
    def test_a(fmt):
      assert fmt.name in ("cbfloat16", "float16")
    """
  )
  result = pytester.runpytest_subprocess("-v")
  result.assert_outcomes(passed=2)
  result.stdout.fnmatch_lines(["*test_a?cbfloat16? PASSED*"])
  disabled = pytester.runpytest_subprocess("-p", "no:precision")
  disabled.stdout.fnmatch_lines(["*'formats' not found in `markers` configuration option*"])
  assert disabled.ret != 0


def test_loading_the_plugin_imports_neither_precision_nor_jax():
  # A user's conftest.py must still be able to set JAX_PLATFORMS: JAX reads it when imported.
  code = (
    "import sys, _precision_pytest_plugin; print(sorted(m for m in ('jax', 'precision') if m in sys.modules))"
  )
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
  assert out.strip() == "[]"
