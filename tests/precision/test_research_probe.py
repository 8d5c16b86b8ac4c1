"""A researcher's use of the pytest plugin and of `numerics_report` on models written by others.

Each test here was written against a defect found by using the features as the README documents
them (or pins down what ran clean): readable collection errors for the marker's common mistakes,
`NumericsReport.plot` leaving the user's matplotlib backend alone, and reports on Equinox and
Haiku models naming the user's line and the library's module.
"""

import inspect
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import precision
from tests.precision.test_pytest_plugin import STRICT_INI

pytest_plugins = ["pytester"]


@pytest.fixture
def run(pytester):
  """Write ``source`` as ``test_research.py`` (and ``conftest``) and run pytest in process."""
  pytester.makeini(STRICT_INI)

  def _run(source: str, *args: str, conftest: str = ""):
    if conftest:
      pytester.makeconftest(textwrap.dedent(conftest))
    pytester.makepyfile(test_research=textwrap.dedent(source))
    return pytester.runpytest(*args)

  return _run


# ---- the pytest plugin ----

RESEARCH_PROJECT = """
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import precision
from precision.testing import assert_close

pytestmark = pytest.mark.formats("cb16", "bf16")

def test_module_marker(fmt):
  assert fmt.name in ("cbfloat16", "bfloat16")

@pytest.mark.parametrize("n", [3, 5])
def test_with_parametrize(fmt, n):
  assert precision.round(np.ones(n, np.float32), fmt).shape == (n,)

@pytest.mark.formats("float16", "e3m4x")
class TestClassMarker:
  def test_class(self, fmt):
    assert fmt.name in ("float16", "e3m4x")

  @settings(max_examples=5, deadline=None)
  @given(x=st.floats(1.0, 2.0, width=32))
  def test_hypothesis(self, fmt, x):
    assert_close(precision.round(np.float32(x), fmt), np.float32(x), fmt, ulps=0.5)
"""

CUSTOM_FORMAT = """
import precision
precision.register_format(precision.FloatFormat("e3m4x", exponent_bits=3, mantissa_bits=4), ())
"""


def test_a_research_project_collects_runs_and_selects_formats_by_id(run):
  collected = run(RESEARCH_PROJECT, "--collect-only", "-q", conftest=CUSTOM_FORMAT)
  assert collected.ret == 0
  assert collected.stdout.lines[:10] == [
    "test_research.py::test_module_marker[cbfloat16]",
    "test_research.py::test_module_marker[bfloat16]",
    "test_research.py::test_with_parametrize[3-cbfloat16]",
    "test_research.py::test_with_parametrize[3-bfloat16]",
    "test_research.py::test_with_parametrize[5-cbfloat16]",
    "test_research.py::test_with_parametrize[5-bfloat16]",
    "test_research.py::TestClassMarker::test_class[float16]",
    "test_research.py::TestClassMarker::test_class[e3m4x]",
    "test_research.py::TestClassMarker::test_hypothesis[float16]",
    "test_research.py::TestClassMarker::test_hypothesis[e3m4x]",
  ]
  selected = run(RESEARCH_PROJECT, "-q", "-k", "bfloat16 and not cbfloat16 or e3m4x")
  selected.assert_outcomes(passed=5, deselected=5)


def test_a_list_of_names_gets_the_unpacking_hint_and_no_chained_exception(run):
  # `@pytest.mark.parametrize` takes a list; the marker takes the names one by one
  result = run(
    """
    import pytest
    FORMATS = ("bf16", "cb16")

    @pytest.mark.formats(FORMATS)
    def test_a(fmt):
      pass
    """
  )
  result.assert_outcomes(errors=1)
  out = result.stdout.str()
  assert "test_research.py::test_a: @pytest.mark.formats(('bf16', 'cb16')): " in out
  assert "; pass the names as separate arguments: @pytest.mark.formats(*['bf16', 'cb16'])" in out
  assert "During handling of the above exception" not in out


def test_fmt_parametrized_under_a_module_marker_names_both(run):
  result = run(
    """
    import pytest
    pytestmark = pytest.mark.formats("bf16")

    @pytest.mark.parametrize("fmt", ["mine"])
    def test_a(fmt):
      pass
    """
  )
  result.assert_outcomes(errors=1)
  result.stdout.fnmatch_lines(
    [
      "test_research.py::test_a: `fmt` is parametrized twice: by @pytest.mark.parametrize('fmt', ...) and by "
      "@pytest.mark.formats(...) (on the test, its class or its module); *"
    ]
  )


def test_two_formats_of_one_name_are_a_collection_error(run):
  # they were run as test[bfloat16_0] and test[bfloat16_1], and failed with "ulp of bfloat16" both
  result = run(
    """
    import pytest
    import precision

    @pytest.mark.formats("bf16", precision.FloatFormat("bfloat16", 8, 7, overflow="saturate"))
    def test_a(fmt):
      pass
    """
  )
  result.assert_outcomes(errors=1)
  result.stdout.fnmatch_lines(
    ["test_research.py::test_a: @pytest.mark.formats: * are different formats named 'bfloat16'*"]
  )


def test_assert_close_failure_names_the_format_and_the_element(run):
  result = run(
    """
    import numpy as np
    import pytest
    from precision.testing import assert_close

    @pytest.mark.formats("bf16")
    def test_grid(fmt):
      expected = np.ones((2, 3), np.float32)
      actual = expected.copy()
      actual[1, 2] += np.float32(2 * fmt.eps)
      assert_close(actual, expected, fmt, ulps=1)
    """
  )
  result.assert_outcomes(failed=1)
  result.stdout.fnmatch_lines(
    [
      "E     AssertionError: 1 of 6 elements differ by more than 1 ulp of bfloat16; worst: 2 ulp at index (1, 2): *",
      "FAILED test_research.py::test_grid?bfloat16? - *",
    ]
  )


# ---- numerics_report on models written by others ----


def _line(fn, marker: str) -> str:
  lines, start = inspect.getsourcelines(fn)
  (offset,) = [i for i, text in enumerate(lines) if marker in text]
  return f"{inspect.getsourcefile(fn).rsplit('/', 1)[-1]}:{start + offset}"


def _check_policies(fn, args, user_line: str, module: str) -> None:
  """float32: exactly the shadow everywhere; bfloat16: rounding error where the model computes,
  at the user's line, in a scope naming the library's module."""
  exact = precision.numerics_report(fn, "c=f32", *args)
  assert exact.rows and all(r.sqnr_db == np.inf and r.drop_db == 0 for r in exact.rows)
  rounded = precision.numerics_report(fn, "c=bf16", *args)
  matmuls = [r for r in rounded.rows if r.primitive == "dot_general"]
  assert matmuls and all(np.isfinite(r.sqnr_db) for r in matmuls)  # rounding happened
  assert all(r.source.endswith(user_line) and module in r.scope for r in matmuls)


def test_report_on_an_equinox_mlp():
  eqx = pytest.importorskip("equinox")
  mlp = eqx.nn.MLP(8, 4, 16, 2, key=jax.random.key(0))
  x = jax.random.normal(jax.random.key(1), (4, 8))

  def forward(mlp, x):
    return jax.vmap(mlp)(x)  # the user's line

  _check_policies(forward, (mlp, x), _line(forward, "the user's line"), "eqx.nn.Linear")


def test_report_on_a_haiku_mlp():
  hk = pytest.importorskip("haiku")

  def model(x):
    return hk.nets.MLP([16, 4], name="probe_mlp")(x)  # the user's line: the innermost frame of theirs

  net = hk.without_apply_rng(hk.transform(model))
  x = jax.random.normal(jax.random.key(1), (4, 8))
  params = net.init(jax.random.key(0), x)
  _check_policies(net.apply, (params, x), _line(model, "the user's line"), "probe_mlp/linear_")


def test_plot_leaves_the_users_matplotlib_backend_and_figures_alone(tmp_path):
  # A notebook's inline backend was switched to Agg by report.plot (later plt.show() showed nothing).
  import matplotlib
  import matplotlib.pyplot as plt

  report = precision.numerics_report(lambda x: jnp.tanh(x * 1.1), "c=bf16", jnp.linspace(0.0, 1.0, 16))
  before = matplotlib.get_backend()
  matplotlib.use("pdf")
  try:
    report.plot(tmp_path / "r.png")
    assert matplotlib.get_backend() == "pdf" and plt.get_fignums() == []
  finally:
    matplotlib.use(before)
  assert (tmp_path / "r.png").stat().st_size > 1000


def _module_at(path, source: str):
  import importlib.util

  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(textwrap.dedent(source))
  spec = importlib.util.spec_from_file_location(path.stem, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_source_skips_dist_packages_and_keeps_a_users_folder_named_jax(tmp_path):
  # Debian/Ubuntu's pip and NVIDIA's JAX containers install into dist-packages: those frames were
  # taken for the user's; a user's own folder named `jax` was taken for JAX's.
  lib = _module_at(
    tmp_path / "dist-packages" / "probe_dist_lib.py",
    """
    import jax.numpy as jnp

    def layer(x, w):
      return jnp.tanh(x @ w)
    """,
  )
  user = _module_at(
    tmp_path / "jax" / "probe_user_model.py",
    """
    def model(layer, x, w):
      return layer(x, w) * 2.0  # the user's line
    """,
  )
  x, w = jnp.linspace(-1.0, 1.0, 12).reshape(3, 4), jnp.eye(4) * 0.7
  report = precision.numerics_report(lambda x, w: user.model(lib.layer, x, w), "c=bf16", x, w)
  (matmul,) = [r for r in report.rows if r.primitive == "dot_general"]
  assert matmul.source.endswith("/jax/" + _line(user.model, "the user's line"))
