"""Entry points that do not load, give something else than specs, or share a model name: each is a
`PluginError` naming the entry points when one of their models is asked for, and never empties
the registry (a broken plugin left every model, the built-in ones included, unknown)."""

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
  for attr in ("_SPECS", "_ORIGIN", "_FAILED", "_CONFLICTS"):
    monkeypatch.setattr(registry, attr, {})
  monkeypatch.setattr(registry, "_LOADED", [])
  monkeypatch.setattr(config_params, "_MODEL_SCHEMAS", dict(config_params._MODEL_SCHEMAS))

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
    PluginError, match=r"unknown model 'mine'; .*'broken' \(pkg.broken:MISSING\) does not load: No module"
  ):
    registry.get_spec("mine")


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
