"""The ``sparsity`` section (`wafer.config.sparsity`): the real modelzoo sparsity files of three
releases select the tensors Cerebras' library selects, every spelling means what its release means,
and mistakes are named.

Expected numbers: GPT-3 125M (12 layers, d 768, FFN 3072) has 12 x 6 weight tensors in its attention
projections and FFN layers, 12 x (4 x 768^2 + 2 x 768 x 3072) = 84,934,656 weights, a quarter kept at
75 % (``floor(0.25 N)``, each N a multiple of 4).
"""

from __future__ import annotations

import math
import pathlib
import re

import jax
import numpy as np
import pytest
import yaml

from tests.samples import SHRUNK
from wafer.config import ConfigError, load_params
from wafer.config.sparsity import SparsityConfig
from wafer.optim import path_names
from wafer.sparsity import keep_count, masks

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "modelzoo"
FILES = {
  "Release_2.1.1/gpt3/sparsity/params_gpt3_125m_rigl75.yaml": ("rigl", 100, 3584),
  "Release_2.4.3/gpt3/sparsity/params_gpt3_125m_static75.yaml": ("static", 1, None),
  "Release_2.10.0/gpt3/sparsity/params_gpt3_125m_set75.yaml": ("set", 100, 3584),
}


def _selected(params_file, overrides=()):
  """``{name: (numel, sparsity)}`` of the sparse tensors, from the built optimizer on shapes only."""
  from wafer.runner import load_plan

  plan = load_plan(params_file, list(overrides))
  shapes = jax.eval_shape(plan.task.init_params, jax.random.key(0))
  state = jax.eval_shape(plan.optimizer.init, shapes)
  out = {}
  model = plan.params.model
  for (path, mask), leaf in zip(
    jax.tree_util.tree_leaves_with_path(masks(state)), jax.tree.leaves(shapes), strict=True
  ):
    if mask.shape:
      out[model.parameter_name(path_names(path))] = (math.prod(leaf.shape), plan.params.sparsity)
  return out, plan


@pytest.mark.parametrize("name", sorted(FILES))
def test_the_real_files_sparsify_the_72_projection_and_ffn_weights(name):
  algorithm, freq, stop = FILES[name]
  selected, plan = _selected(DATA / name, ["runconfig.validate_only=true"])
  (group,) = plan.params.sparsity.all_groups()
  built = group.group()
  assert (built.algorithm, built.init_method, group.level) == (algorithm, "random", 0.75)
  if algorithm != "static":
    assert (built.update.freq, built.update.stop) == (freq, stop)
    assert (built.drop_fraction.init, built.drop_fraction.half_period) == (0.3, 3584)
  assert len(selected) == 72
  kinds = {n.split(".layers.")[1].split(".", 1)[1] for n in selected}
  assert kinds == {
    "self_attn.proj_q_dense_layer.weight",
    "self_attn.proj_k_dense_layer.weight",
    "self_attn.proj_v_dense_layer.weight",
    "self_attn.proj_output_dense_layer.weight",
    "ffn.ffn.0.linear_layer.weight",
    "ffn.ffn.1.linear_layer.weight",
  }
  assert sum(n for n, _ in selected.values()) == 84_934_656
  assert sum(keep_count(n, 0.75) for n, _ in selected.values()) == 21_233_664


def test_the_default_filter_selects_the_same_tensors_of_a_gpt():
  name = DATA / "Release_2.10.0/gpt3/sparsity/params_gpt3_125m_set75.yaml"
  with_filter, _ = _selected(name, SHRUNK)
  without, _ = _selected(name, [*SHRUNK, "sparsity.param_filter=null"])
  assert with_filter.keys() == without.keys() and len(without) == 12


def _section(value, model=None):
  data = {
    "model": model
    or {
      "name": "gpt2",
      "hidden_size": 32,
      "num_heads": 2,
      "filter_size": 64,
      "num_hidden_layers": 2,
      "vocab_size": 50,
      "max_position_embeddings": 16,
    },
    "optimizer": {"optimizer_type": "adamw", "learning_rate": 0.001},
    "train_input": {"data_processor": "GptHDF5MapDataProcessor", "batch_size": 4, "max_sequence_length": 16},
    "runconfig": {"max_steps": 2},
    "sparsity": value,
  }
  return data


@pytest.mark.parametrize(
  "section, expected",
  [
    (0.5, [("static", 0.5, None)]),
    ({"type": "set", "sparsity": 0.5, "schedule": 7}, [("set", 0.5, 7)]),  # 2.1: schedule = the cadence
    ({"type": "rigl", "sparsity": 0.5, "schedule": {"freq": 3, "stop": 9}}, [("rigl", 0.5, 3)]),
    (
      {"algorithm": "set", "schedule": 0.6, "update": {"freq": 5}},
      [("set", 0.6, 5)],
    ),  # 2.2+: schedule = level
    ({"type": "sideband", "sparsity": 0.3, "init_method": "topk"}, [("static", 0.3, None)]),
    (
      [{"param_filter": "*self_attn*", "sparsity": 0.5}, {"sparsity": 0.9, "algorithm": "rigl"}],
      [("static", 0.5, None), ("rigl", 0.9, 1)],
    ),
    (
      {
        "type": "static",
        "sparsity": 0.5,
        "param_name_patterns": {"proj_q": {"sparsity": 0.8}, "linear_layer": None},
      },
      [("static", 0.8, None), ("static", 0.5, None)],
    ),
  ],
)
def test_each_spelling_means_what_its_release_means(section, expected):
  cfg = SparsityConfig.model_validate(section)
  got = [
    (g.group().algorithm, g.level, g.group().update.freq if g.group().dynamic else None)
    for g in cfg.all_groups()
  ]
  assert got == expected


def test_a_parameter_belongs_to_the_first_group_that_matches():
  from wafer.config.params import Params

  data = _section([{"param_filter": "*self_attn*weight", "sparsity": 0.5}, {"sparsity": 0.75}])
  params = load_params(data)
  assert isinstance(params, Params)
  tx, _ = params.build_optimizer()
  from models.zoo import abstract_model  # noqa: F401  (the model plugin registers its schema)
  from wafer.runner import plan as make_plan

  p = make_plan(params)
  shapes = jax.eval_shape(p.task.init_params, jax.random.key(0))
  state = tx.init(jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes))
  kept = {}
  for path, m in jax.tree_util.tree_leaves_with_path(masks(state)):
    if m.shape:
      kept[params.model.parameter_name(path_names(path))] = float(np.mean(np.asarray(m)))
  assert {n: f for n, f in kept.items() if "self_attn" in n} and all(
    f == 0.5 for n, f in kept.items() if "self_attn" in n
  )
  assert all(f == 0.25 for n, f in kept.items() if "ffn" in n) and len(kept) == 12


@pytest.mark.parametrize(
  "section, message",
  [
    ({"algorithm": "gmp", "sparsity": 0.5}, "gmp"),
    ({"sparsity": 1.0}, "less than 1"),
    ({"algorithm": "set"}, "sparsity: required"),
    ({"sparsity": 0.5, "schedule": 0.4, "update": {"freq": 2}}, "schedule is sparsity's other name"),
    ({"sparsity": 0.5, "param_filter": "*", "param_name_patterns": ".*"}, "give one"),
    ({"sparsity": 0.5, "balance_in_groups": 2}, "balance_in_groups"),
    (
      {"sparsity": 0.5, "algorithm": "set", "drop_fraction": {"type": "linear", "init": 0.3}},
      "drop_fraction must be",
    ),
    ({"sparsity": 0.5, "drop_fraction": 0.2}, "only set and rigl change their masks"),
    ({"sparsity": 0.5, "type": "rigl"}, "schedule: required for type rigl"),
    ({"sparsity": 0.5, "param_name_patterns": "proj_[q"}, "not a valid regex"),
    (
      {"sparsity": 0.5, "algorithm": "set", "update": {"freq": 2, "stop": "abc"}},
      r"update.stop.*must be a step number",
    ),
    ({"sparsity": 0.5, "algorithm": "set", "update": {"freq": 2, "steps": [3]}}, "cannot come with it"),
    ({"sparsity": 0.5, "groups": [{"sparsity": 0.9}]}, "next to a list of groups"),
    (
      {
        "sparsity": 0.5,
        "algorithm": "set",
        "drop_fraction": {"type": "cosine", "init": 1.5, "half_period": 9},
      },
      "must be in",
    ),
    ({"sparsity": 0.5, "algorithm": "set", "update": {"frequency": 2}}, "allowed: freq, start, stop, steps"),
    ({"sparsity": 0.5, "init_metod": "random"}, "did you mean 'init_method'"),
    (
      {"algorithm": "set", "schedule": {"type": "cosine", "init": 0.5, "half_period": 10}},
      "changes over the run",
    ),
  ],
)
def test_mistakes_are_named(section, message):
  with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("'", ".")) as info:
    load_params(_section(section))
  assert "sparsity" in str(info.value)


RIGL_2_1 = (
  pathlib.Path(__file__).parents[1] / "data/modelzoo/Release_2.1.1/gpt3/sparsity/params_gpt3_125m_rigl75.yaml"
)


@pytest.mark.parametrize(
  "override, key, why",
  [
    ("sparsity.schedule.freq=0", "sparsity.schedule.freq", "must be at least 1"),
    ("sparsity.init_method=bogus", "sparsity.init_method", "must be random, topk or from_zeros"),
    ("sparsity.type=gmp", "sparsity.type", "gmp .* is not available"),
    ("sparsity.drop_fraction.init=1.5", "sparsity.drop_fraction.init", r"must be in \[0, 1\]"),
  ],
)
def test_a_sparsity_mistake_an_override_made_names_the_override_and_the_files_key(override, key, why):
  """These pointed at the section's line in the file (an override made them) and called a 2.1 file's
  ``schedule`` ``update``; they now name the key as written and where its value came from."""
  with pytest.raises(ConfigError) as info:
    load_params(RIGL_2_1, [override])
  line = next(x for x in str(info.value).splitlines() if x.strip().startswith("sparsity."))
  assert re.search(rf"{re.escape(key)} \(from override '{re.escape(override)}'\): {why}", line), line


def test_a_sparsity_mistake_in_the_file_names_its_own_line(tmp_path):
  text = RIGL_2_1.read_text().replace("freq: 100", "freq: 0")
  assert text != RIGL_2_1.read_text()
  path = tmp_path / "p.yaml"
  path.write_text(text)
  line = next(i for i, x in enumerate(text.splitlines(), 1) if "freq: 0" in x)
  with pytest.raises(ConfigError, match=rf"line {line}: sparsity.schedule.freq: must be at least 1"):
    load_params(path)


def test_a_filter_that_matches_nothing_names_the_models_parameters():
  """Planning the run checks the filters on the model's parameter shapes (before any trace), and so
  does building the optimizer state."""
  from wafer.runner import plan as make_plan

  params = load_params(_section({"sparsity": 0.5, "param_filter": "*proj_x_dense_layer.weight"}))
  expected = r"selects no parameter .* closest names .*proj_q_dense_layer\.weight"
  with pytest.raises(ConfigError, match=expected):
    make_plan(params)
  tx, _ = params.build_optimizer()
  shapes = jax.eval_shape(make_plan(load_params(_section(0.5))).task.init_params, jax.random.key(0))
  with pytest.raises(ConfigError, match=expected):
    tx.init(jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes))


@pytest.mark.slow  # a short run of a real file
def test_a_shrunk_real_sparse_file_trains_with_its_masks_in_force(tmp_path):
  """The SET file, masks updated after every step: 3 steps, the loss finite, and each sparse tensor
  of the final weights has at most its kept count of non-zeros (pruned weights exactly 0)."""
  from wafer import runner

  name = DATA / "Release_2.10.0/gpt3/sparsity/params_gpt3_125m_set75.yaml"
  summary = runner.run_params(
    name,
    [
      *SHRUNK,
      "sparsity.update.freq=1",
      f"runconfig.model_dir={tmp_path}",
      "runconfig.max_steps=3",
      "runconfig.checkpoint_steps=0",
      "runconfig.eval_steps=1",
    ],
  )
  assert summary["final_step"] == 3 and all(math.isfinite(loss) for _, loss in summary["losses"])
  sparse = 0
  for path, leaf in jax.tree_util.tree_leaves_with_path(summary["params"]):
    names = path_names(path)
    if names[-1] == "kernel" and names[0] == "layers":
      sparse += 1
      assert int(np.count_nonzero(np.asarray(leaf))) <= keep_count(leaf.size, 0.75), names
  assert sparse == 12


@pytest.mark.slow  # two short runs of real files
@pytest.mark.parametrize(
  "name",
  [
    "Release_2.1.1/gpt3/sparsity/params_gpt3_125m_rigl75.yaml",
    "Release_2.4.3/gpt3/sparsity/params_gpt3_125m_static75.yaml",
  ],
)
def test_the_other_shrunk_real_sparse_files_train(name, tmp_path):
  from wafer import runner

  cadence = ["sparsity.schedule.freq=1"] if "rigl" in name else []
  summary = runner.run_params(
    DATA / name,
    [
      *SHRUNK,
      *cadence,
      f"runconfig.model_dir={tmp_path}",
      "runconfig.max_steps=3",
      "runconfig.checkpoint_steps=0",
      "runconfig.eval_steps=1",
    ],
  )
  assert summary["final_step"] == 3 and all(math.isfinite(loss) for _, loss in summary["losses"])


def test_a_list_of_sparsity_groups_is_located_as_written(tmp_path):
  """``sparsity: [...]`` is validated as ``{groups: [...]}``: its mistakes were shown as
  ``sparsity.groups[0]...`` at the ``sparsity:`` line, and an override that made them was not named."""
  groups = [
    {"sparsity": 0.5, "algorithm": "set", "update": {"freq": 2}, "param_filter": "*fc*"},
    {"sparsity": 0.3},
  ]
  path = tmp_path / "p.yaml"
  path.write_text(yaml.safe_dump(_section(groups), sort_keys=False))
  with pytest.raises(
    ConfigError, match=r"sparsity\[0\].update.freq \(from override 'sparsity.0.update.freq=0'\)"
  ):
    load_params(path, ["sparsity.0.update.freq=0"])
  text = path.read_text().replace("freq: 2", "freq: 0")
  path.write_text(text)
  line = next(i for i, x in enumerate(text.splitlines(), 1) if "freq: 0" in x)
  with pytest.raises(ConfigError, match=rf"line {line}: sparsity\[0\].update.freq: must be at least 1"):
    load_params(path)
