"""Entry points that do not load, give something else than specs, or share a model name: each is a
`PluginError` naming the entry points when one of their models is asked for, and never empties
the registry (a broken plugin left every model, the built-in ones included, unknown)."""

import pathlib
import types

import pytest

from wafer import registry
from wafer.config import ModelConfig
from wafer.config import params as config_params
from wafer.errors import PluginError, UnknownModelError


def _spec(*names):
  return registry.ModelSpec(names=names, config=ModelConfig, build_task=lambda params: None)


def _entry(name, value, loaded):
  def load():
    if isinstance(loaded, Exception):
      raise loaded
    return loaded

  return types.SimpleNamespace(name=name, value=value, load=load)


@pytest.fixture
def fresh_registry(monkeypatch):
  """The registry's state emptied for the test and restored after it."""
  for attr in ("_SPECS", "_ORIGIN", "_FAILED", "_CONFLICTS", "_PROCESSOR_ORIGIN"):
    monkeypatch.setattr(registry, attr, {})
  monkeypatch.setattr(registry, "_LOADED", [])
  for attr in ("_MODEL_SCHEMAS", "_INPUT_SCHEMAS", "_PROCESSOR_MODELS"):
    monkeypatch.setattr(config_params, attr, dict(getattr(config_params, attr)))

  def use(*entries):
    monkeypatch.setattr(registry.metadata, "entry_points", lambda group: list(entries))

  return use


def test_a_broken_plugin_blocks_only_its_own_models(fresh_registry):
  fresh_registry(
    _entry("good", "pkg.good:SPEC", _spec("toy")),
    _entry("broken", "pkg.broken:MISSING", ImportError("No module named 'pkg.broken'")),
  )
  assert registry.get_spec("toy").names == ("toy",)
  assert registry.get_spec("toy") is registry.get_spec("TOY")  # a second lookup: still there
  assert registry.registered() == ["toy"]
  with pytest.raises(
    PluginError,
    match=r"unknown model 'mine'\. It may be .*'broken' \(pkg.broken:MISSING\) does not load: No",
  ):
    registry.get_spec("mine")
  # a misspelled name still gets its suggestion (and, through wafer run, its file line: runner.load_plan)
  with pytest.raises(PluginError, match=r"unknown model 'toyy'\. Did you mean 'toy'\? It may be in a plugin"):
    registry.get_spec("toyy")


def test_an_entry_point_that_is_not_a_spec_is_named(fresh_registry):
  fresh_registry(_entry("my_model", "pkg:NOT_A_SPEC", 42))
  with pytest.raises(
    PluginError, match=r"'my_model' \(pkg:NOT_A_SPEC\) does not load: it gives 42, not a wafer"
  ):
    registry.get_spec("my_model")


def test_two_entry_points_with_one_model_name_are_refused_for_that_name(fresh_registry):
  fresh_registry(_entry("a", "pkg_a:SPEC", _spec("toy", "only_a")), _entry("b", "pkg_b:SPEC", [_spec("toy")]))
  with pytest.raises(
    PluginError, match=r"'toy' is registered by several .*'a' \(pkg_a:SPEC\), 'b' \(pkg_b:SPEC\)"
  ):
    registry.get_spec("toy")
  assert registry.get_spec("only_a").names == ("toy", "only_a")


def test_without_broken_plugins_an_unknown_name_suggests_one(fresh_registry):
  fresh_registry(_entry("good", "pkg.good:SPEC", _spec("toy_bert")))
  with pytest.raises(UnknownModelError, match="Did you mean 'toy_bert'"):
    registry.get_spec("toy_bertt")


def test_a_spec_with_wrong_types_is_refused_where_it_is_made():
  """A config that is not a ModelConfig subclass (or a processor schema that is not an InputConfig
  subclass) stopped every `wafer run`, every model's, with a bare TypeError from registration; a
  string for names registered each of its letters."""
  from wafer.config import InputConfig

  assert registry.ModelSpec(names="strmodel", config=ModelConfig, build_task=print).names == ("strmodel",)
  bad = [
    dict(names=(), config=ModelConfig, build_task=print),
    dict(names=("ok", 3), config=ModelConfig, build_task=print),
    dict(names="m", config=dict, build_task=print),
    dict(names="m", config=ModelConfig(), build_task=print),
    dict(names="m", config=ModelConfig, build_task=None),
    dict(names="m", config=ModelConfig, build_task=print, data_processors={"P": dict}),
    dict(names="m", config=ModelConfig, build_task=print, data_processors={"P": InputConfig(batch_size=1)}),
  ]
  for kwargs in bad:
    with pytest.raises(PluginError, match="allowed"):
      registry.ModelSpec(**kwargs)


def test_a_plugin_whose_spec_fails_or_whose_processor_is_taken_blocks_only_its_own_models(fresh_registry):
  from wafer.config import InputConfig

  class P(InputConfig):
    pass

  with_processor = registry.ModelSpec(
    names="first", config=ModelConfig, build_task=print, data_processors={"P": P}
  )
  again = registry.ModelSpec(names="second", config=ModelConfig, build_task=print, data_processors={"P": P})
  fresh_registry(
    _entry("one", "pkg_one:SPEC", with_processor),
    _entry("two", "pkg_two:SPEC", again),
    # (entry.load() runs the plugin's module, which builds its spec: the spec's error is its error)
    _entry("wrong", "pkg_wrong:SPEC", PluginError("ModelSpec('wrong').config=<class 'dict'>; allowed: ...")),
  )
  assert registry.get_spec("first").names == ("first",)  # the others do not stop it
  with pytest.raises(
    PluginError, match=r"'two' \(pkg_two:SPEC\) does not load: its data_processor 'P' is already "
  ):
    registry.get_spec("second")
  with pytest.raises(PluginError, match=r"'wrong' \(pkg_wrong:SPEC\) does not load"):
    registry.get_spec("wrong")


def test_wafer_run_names_where_an_unknown_model_name_came_from_when_a_plugin_failed(fresh_registry, tmp_path):
  """With a plugin that did not load, an unknown ``model.name`` lost its file line and its "did you
  mean"; one set by an override was blamed on the file's line."""
  from wafer import runner
  from wafer.config import ConfigError

  fresh_registry(
    _entry("good", "pkg.good:SPEC", _spec("toy")),
    _entry("broken", "pkg.broken:MISSING", ImportError("No module named 'pkg.broken'")),
  )
  original = pathlib.Path(__file__).resolve().parents[2] / "models/fc_mnist/configs/params_fc_mnist.yaml"
  text = original.read_text()
  path = tmp_path / "p.yaml"
  path.write_text(text.replace("name: fc_mnist", "name: toyy"))
  assert path.read_text() != text
  with pytest.raises(
    ConfigError, match=r"p.yaml: line \d+: model.name: unknown model 'toyy'\. Did you mean 'toy'"
  ):
    runner.load_plan(str(path))
  with pytest.raises(
    ConfigError, match=r"model.name \(from override 'model.name=toyy'\): unknown model 'toyy'\. Did you mean"
  ):
    runner.load_plan(str(original), ["model.name=toyy"])
