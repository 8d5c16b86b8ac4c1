"""Inputs damaged the way users damage them: each gets a `WaferError` that says where, what and what to do.

One test per defect found by probing the CLI, the params loader, the schedules, the data readers and the
run loop from the outside (issue: bad inputs made elsewhere). Nothing here trains for more than a few steps.
"""

from __future__ import annotations

import errno
import gzip
import math
import re
import struct
import typing
from pathlib import Path

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from hypothesis import given, settings

import wafer
from models.mlp import EXAMPLE_PARAMS
from wafer import cli, input_analyzer, runner, schedules
from wafer.config import ConfigError, RunConfig, load_params
from wafer.config.errors import short_repr
from wafer.config.loader import parse_yaml
from wafer.data import sources, text
from wafer.errors import ClosureError, DataError, WaferError
from wafer.train import ExecutorError
from wafer.train.checkpoint import Checkpoints
from wafer.train.loop import check_checkpoint_keys, make_model_dir, steps_to_run


def _params(tmp_path, text_: str | None = None, **runconfig) -> str:
  data = yaml.safe_load(EXAMPLE_PARAMS)
  data["runconfig"].update({"model_dir": str(tmp_path / "md"), **runconfig})
  path = tmp_path / "params.yaml"
  path.write_text(text_ if text_ is not None else yaml.safe_dump(data, sort_keys=False))
  return str(path)


# ----------------------------------------------------------------------------- params files


def test_a_params_file_that_is_not_utf8_names_the_line_and_the_byte(tmp_path, capsys):
  path = tmp_path / "latin1.yaml"
  path.write_bytes("model:\n  name: mlp_example\n# caf\u00e9\n".encode("latin-1"))
  with pytest.raises(
    ConfigError, match=r"latin1\.yaml: line 3, column 6: byte b'\\xe9' is not UTF-8"
  ) as info:
    load_params(path)
  assert isinstance(info.value, WaferError) and "Re-save it as UTF-8" in str(info.value)
  assert cli.main(["run", "--params", str(path), "--validate_only"]) == 1  # one message, no traceback
  assert "is not UTF-8" in capsys.readouterr().err


@pytest.mark.parametrize("key", ["runconfig.seed", "train_input.shuffle_seed"])
@pytest.mark.parametrize("seed", [-1, 2**32, 10**20])
def test_seeds_outside_0_to_2_32_are_config_errors(tmp_path, key, seed):
  path = _params(tmp_path)
  with pytest.raises(ConfigError, match=re.escape(key) + r" .*: must be (greater|less) than or equal to"):
    load_params(path, [f"{key}={seed}"])
  for ok in (0, 2**32 - 1):  # the bounds themselves are seeds
    load_params(path, [f"{key}={ok}"])


def test_an_unknown_model_name_names_the_file_and_line(tmp_path):
  path = _params(tmp_path, EXAMPLE_PARAMS.replace("name: mlp_example", "name: mlp_exampel"))
  line = EXAMPLE_PARAMS.splitlines().index("  name: mlp_example") + 1
  with pytest.raises(
    ConfigError, match=rf"params\.yaml: line {line}: model\.name: unknown model .*'mlp_example'"
  ):
    runner.load_plan(path)


# ----------------------------------------------------------------------------- schedules


_rates = st.one_of(st.just(0.0), st.floats(1e-6, 1.0))


@settings(max_examples=30)  # each example compiles the schedule once
@given(i=_rates, e=_rates, total=st.integers(1, 400), power=st.sampled_from([0.0, 0.5, 1.0, 2.0, 2.5, 3.7]))
def test_polynomial_decay_inside_jit_stays_between_its_ends_and_is_exact_at_them(i, e, total, power):
  """What a compiled train step sees: no NaN past total_iters, never below 0, ``i`` at 0 and ``e`` from T on.

  Before the fix XLA's rewrite of ``1 - t/T`` made a fractional power NaN from ``t = T`` on, and a decay
  to 0 (or a warm-up from 0) a learning rate just below 0.
  """
  s = schedules.build_schedule(
    {
      "scheduler": "PolynomialLR",
      "initial_learning_rate": i,
      "end_learning_rate": e,
      "total_iters": total,
      "power": power,
    }
  )
  t = jnp.concatenate([jnp.arange(total + 3), jnp.array([10 * total, 2**31 - 1])]).astype(jnp.int32)
  v = np.asarray(jax.jit(s)(t))
  lo, hi = np.float32(min(i, e)), np.float32(max(i, e))
  assert np.all(np.isfinite(v))
  assert v[0] == np.float32(i) and np.all(v[total:] == np.float32(e))
  assert np.all(v >= 0) and np.all(v >= lo - 4 * np.spacing(lo)) and np.all(v <= hi + 4 * np.spacing(hi))


def test_cosine_decay_inside_jit_is_its_end_value_from_total_iters_on():
  s = schedules.build_schedule(
    {"scheduler": "CosineDecayLR", "initial_learning_rate": 0.1, "end_learning_rate": 0.0, "total_iters": 7}
  )
  v = np.asarray(jax.jit(s)(jnp.array([7, 8, 10**6], jnp.int32)))
  assert np.all(v == 0.0)


BAD_SCHEDULES = [
  (
    {"scheduler": "ConstantLR", "learning_rate": -0.1},
    "ConstantLR: learning_rate=-0.1; allowed: a finite number >= 0",
  ),
  ({"scheduler": "LinearLR", "initial_learning_rate": -1, "end_learning_rate": 0, "total_iters": 5}, ">= 0"),
  ({"scheduler": "StepLR", "initial_learning_rate": 0.1, "step_size": 5, "gamma": -0.5}, "gamma=-0.5"),
  ({"scheduler": "MultiplicativeLR", "initial_learning_rate": 0.1, "coefficient": -1}, "coefficient=-1"),
  ({"scheduler": "CosineAnnealingLR", "initial_learning_rate": 0.1, "T_max": 5, "eta_min": -0.01}, "eta_min"),
  ({"scheduler": "PiecewiseConstantLR", "learning_rates": [0.1, -0.1], "milestones": [3]}, "learning_rates"),
  ({"scheduler": "CyclicLR", "base_lr": -0.1, "max_lr": 0.1}, "base_lr=-0.1"),
  (
    {
      "scheduler": "PolynomialLR",
      "initial_learning_rate": 0.1,
      "end_learning_rate": 0,
      "total_iters": 5,
      "power": -1,
    },
    "power=-1",
  ),
  (
    {"scheduler": "LinearLR", "initial_learning_rate": 0.1, "end_learning_rate": 0, "total_iters": 10**13},
    "2\\*\\*30",
  ),
  ({"scheduler": "CosineAnnealingLR", "initial_learning_rate": 0.1, "T_max": 2**30}, "T_max=1073741824"),
  (
    {"scheduler": "MultiStepLR", "initial_learning_rate": 0.1, "gamma": 0.5, "milestones": [3, 2**40]},
    "milestones",
  ),
  ({"scheduler": "CyclicLR", "base_lr": 0.01, "max_lr": 0.1, "step_size_up": 10**15}, "step_size_up"),
]


@pytest.mark.parametrize(("spec", "fragment"), BAD_SCHEDULES)
def test_schedule_arguments_that_would_climb_the_loss_or_overflow_the_step_are_refused(spec, fragment):
  """Each used to build and then give a negative rate, or an OverflowError at the first compiled step."""
  with pytest.raises(schedules.ScheduleError, match=fragment) as info:
    schedules.build_schedule(spec)
  assert "allowed:" in str(info.value)


def test_a_schedule_error_in_a_params_file_names_its_line(tmp_path):
  data = yaml.safe_load(EXAMPLE_PARAMS)
  data["optimizer"]["learning_rate"] = [
    {"scheduler": "LinearLR", "initial_learning_rate": 0.0, "end_learning_rate": 0.1, "total_iters": 10},
    {"scheduler": "StepLR", "initial_learning_rate": 0.1, "step_size": 5, "gamma": -0.5},
  ]
  path = _params(tmp_path, yaml.safe_dump(data, sort_keys=False))
  line = next(  # the scheduler's own line (it was the learning_rate's, its message naming [1])
    n for n, s in enumerate(Path(path).read_text().splitlines(), 1) if s.startswith("  - scheduler: StepLR")
  )
  with pytest.raises(ConfigError, match=rf"line {line}: optimizer\.learning_rate\[1\]: StepLR: gamma=-0\.5"):
    load_params(path)


# ----------------------------------------------------------------------------- model_dir and checkpoints


@pytest.mark.parametrize(
  ("key", "value"),
  [
    ("checkpoint_path", "pretrained/checkpoints/100"),
    ("load_checkpoint_states", "model"),
    ("autoload_last_checkpoint", False),
    ("disable_strict_checkpoint_loading", True),
  ],
)
def test_checkpoint_loading_keys_wafer_would_ignore_are_refused(key, value):
  """Ignored, they trained other weights than asked (from scratch instead of a warm start, or a resume)."""
  check_checkpoint_keys(RunConfig())  # the defaults pass
  with pytest.raises(ExecutorError, match=rf"runconfig\.{key}={value!r}: not implemented.*new model_dir"):
    check_checkpoint_keys(RunConfig(**{key: value}))


def test_run_refuses_checkpoint_path_before_training(tmp_path, capsys):
  path = _params(tmp_path, checkpoint_path=str(tmp_path / "elsewhere"))
  assert cli.main(["run", "--params", path]) == 1
  assert "runconfig.checkpoint_path=" in capsys.readouterr().err
  assert not (tmp_path / "md" / "checkpoints").exists()


def test_save_initial_checkpoint_writes_step_0(tmp_path):
  path = _params(tmp_path, max_steps=2, save_initial_checkpoint=True, log_steps=2)
  runner.run_params(path)
  assert sorted(int(p.name) for p in (tmp_path / "md" / "checkpoints").iterdir()) == [0, 2]


def test_a_model_dir_that_is_a_file_is_refused_and_kept(tmp_path, capsys):
  notes = tmp_path / "notes.txt"
  notes.write_text("my notes")
  with pytest.raises(ExecutorError, match=r"model_dir='.*notes\.txt' is a file, not a directory"):
    make_model_dir(notes)
  with pytest.raises(ExecutorError, match=r"notes\.txt/md' cannot be created"):
    make_model_dir(notes / "md")
  assert cli.main(["run", "--params", _params(tmp_path), "--model_dir", str(notes)]) == 1
  assert "is a file, not a directory" in capsys.readouterr().err
  assert notes.read_text() == "my notes"


# ----------------------------------------------------------------------------- data and analyze-input


def test_text_data_that_is_not_utf8_names_the_file_and_line(tmp_path):
  (tmp_path / "a.txt").write_text("fine\n")
  (tmp_path / "b.txt").write_bytes(b"one\ntwo \xff\n")
  with pytest.raises(ValueError, match=r"b\.txt:2: byte b'\\xff' at offset 8 is not UTF-8"):
    text.read_documents(tmp_path)
  bad = tmp_path / "docs.jsonl"
  bad.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
  with pytest.raises(ValueError, match=r"docs\.jsonl:2: .* is not UTF-8"):
    text.read_documents(bad)


def test_jsonl_lines_split_on_newlines_only(tmp_path):
  path = tmp_path / "docs.jsonl"  # CRLF line ends, and U+2028 inside a string (valid JSON, not a line end)
  path.write_bytes('{"text": "a\u2028b"}\r\n\r\n{"text": "c"}\r\n'.encode())
  assert text.read_jsonl(path) == ["a\u2028b", "c"]
  (tmp_path / "d").mkdir()
  (tmp_path / "d" / "x.txt").write_bytes(b"one\r\ntwo\rthree")
  assert text.read_documents(tmp_path / "d") == ["one\ntwo\nthree"]  # as open() reads it


def test_a_missing_data_dir_is_named_as_such(tmp_path):
  with pytest.raises(FileNotFoundError, match=r"data_dir .*nope\.h5: no such file or directory"):
    sources.pretokenised(tmp_path / "nope.h5", (".h5",), lambda p: {}, 128, None)


@pytest.mark.parametrize("seconds", [0, -1.0, math.inf, math.nan])
def test_analyze_input_refuses_seconds_that_measure_nothing(tmp_path, capsys, seconds):
  plan = runner.load_plan(_params(tmp_path))
  with pytest.raises(input_analyzer.InputAnalysisError, match=r"--seconds .*allowed: .* > 0"):
    input_analyzer.analyze(plan, seconds=seconds)
  # the command refuses it before announcing a measurement
  assert cli.main(["analyze-input", "--params", _params(tmp_path), "--seconds", str(seconds)]) != 0
  captured = capsys.readouterr()
  assert "Measuring" not in captured.out and "--seconds" in captured.err


def test_analyze_input_says_where_an_override_after_workers_goes(tmp_path, capsys):
  """``--workers 1 key=value`` read the override as a worker count: "invalid int value"."""
  with pytest.raises(SystemExit):
    cli.main(["analyze-input", "--params", _params(tmp_path), "--workers", "1", "train_input.batch_size=8"])
  err = capsys.readouterr().err
  assert (
    "invalid worker count 'train_input.batch_size=8'" in err and "overrides go before --workers" in err
  ), err


class _State(typing.NamedTuple):
  w: jax.Array
  step: jax.Array


def test_a_step_set_aside_twice_keeps_both_earlier_copies(tmp_path):
  """A checkpoint damaged again after a resume used to stop the run (OSError) at the save, losing the steps."""
  checkpoints = Checkpoints(tmp_path, None)
  try:
    for k in range(3):  # three saves of step 2: the first two are set aside, nothing is overwritten
      checkpoints.save(_State(jnp.full(3, float(k)), jnp.int32(2)), {"k": k})
  finally:
    checkpoints.close()
  names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
  assert names == ["2", "2.unreadable", "2.unreadable.1"]


def test_resuming_past_max_steps_says_what_to_do():
  with pytest.raises(
    ConfigError, match=r"model_dir md: runconfig\.max_steps: .* step 6\. Raise runconfig\.max_steps"
  ):
    steps_to_run(RunConfig(max_steps=2, model_dir="md"), 6)


def test_closure_registration_mistakes_are_named():
  """``add_step_closure(log, loss)`` (args not a tuple) used to unpack the array's rows into arguments."""
  seen = []
  with pytest.raises(ClosureError, match=r"args is an .*Array.*add_step_closure\(log, \(loss,\)\)"):
    wafer.add_step_closure(seen.append, jnp.arange(3.0))
  with pytest.raises(ClosureError, match=r"kwargs is a list"):
    wafer.add_step_closure(seen.append, (), [1])
  with pytest.raises(ClosureError, match=r"step_closure: 3 is not callable"):
    wafer.step_closure(3)
  with pytest.raises(ClosureError, match=r"add_step_closure: 'log' is not callable"):
    wafer.add_step_closure("log", (1.0,))
  assert seen == []
  wafer.add_step_closure(seen.append, [jnp.float32(1.0)])  # a list of arguments is fine
  assert seen == [1.0]


def _nested_aliases(depth: int, indent: str = "") -> str:
  lines = [f"{indent}a0: &a0 {{x: 1}}"]
  lines += [f"{indent}a{k}: &a{k} [{', '.join([f'*a{k - 1}'] * 9)}]" for k in range(1, depth + 1)]
  return "\n".join(lines) + "\n"


def test_nested_yaml_aliases_are_indexed_once_not_expanded():
  """A file of nested aliases (9**depth values when expanded) used to hang the loader indexing its lines."""
  _, lines = parse_yaml("model:\n  name: x\n" + _nested_aliases(5))
  assert len(lines) < 100  # each node once: the expansion has 9**5 paths


def test_a_params_file_of_nested_aliases_gets_its_error_at_once(tmp_path):
  path = tmp_path / "aliases.yaml"
  path.write_text("model:\n  name: mlp_example\n" + _nested_aliases(11))
  with pytest.raises(ConfigError, match=r"line 14: a11: unknown key 'a11'"):
    load_params(path)
  assert len(short_repr([[["x" * 1000] * 1000] * 1000])) <= 60  # problem values are shown bounded


def test_a_yaml_key_that_is_a_list_is_a_config_error(tmp_path):
  path = tmp_path / "complex_key.yaml"
  path.write_text("model:\n  name: mlp_example\n? [a, b]\n: 3\n")
  with pytest.raises(
    ConfigError, match=r"complex_key\.yaml:3:3: YAML syntax error: a key must be a name, not a list"
  ):
    load_params(path)


def _idx(array: np.ndarray) -> bytes:
  header = struct.pack(">BBBB", 0, 0, 8, array.ndim) + b"".join(struct.pack(">I", d) for d in array.shape)
  return header + array.astype(np.uint8).tobytes()


def test_a_truncated_gzip_data_file_is_a_data_error(tmp_path):
  """gzip's EOFError (not a ValueError/OSError) used to escape the input section's error as a traceback."""
  for split, n in (("train", 64), ("t10k", 32)):
    images = gzip.compress(_idx(np.random.default_rng(0).integers(0, 255, (n, 28, 28))))
    (tmp_path / f"{split}-images-idx3-ubyte.gz").write_bytes(images[: len(images) // 2])
    (tmp_path / f"{split}-labels-idx1-ubyte").write_bytes(_idx(np.zeros(n)))
  plan = runner.load_plan(
    Path(__file__).parents[2] / "models" / "fc_mnist" / "configs" / "params_fc_mnist.yaml",
    [
      f"train_input.data_dir={tmp_path}",
      f"eval_input.data_dir={tmp_path}",
      f"runconfig.model_dir={tmp_path / 'md'}",
    ],
  )
  with pytest.raises(
    DataError,
    match=r"train_input \(MNISTDataProcessor, .*train-images-idx3-ubyte.gz: cannot be read .*truncated or corrupt: copy it again",
  ):
    plan.task.train_data(1)


@pytest.mark.parametrize(
  "argv",
  [
    ["estimate", "--workload", "gpt2_small", "--model_dir", "{notes}"],
    ["analyze-input", "--params", "{params}", "--model_dir", "{notes}", "--seconds", "0.1", "--workers", "1"],
  ],
)
def test_estimate_and_analyze_input_refuse_a_model_dir_that_is_a_file_before_working(tmp_path, capsys, argv):
  """Both used to compute and then fail writing their files with a FileExistsError traceback."""
  notes = tmp_path / "notes.txt"
  notes.write_text("my notes")
  argv = [a.format(notes=notes, params=_params(tmp_path)) for a in argv]
  assert cli.main(argv) in (1, 2)
  err = capsys.readouterr().err
  assert "is a file, not a directory" in err and "Traceback" not in err
  assert notes.read_text() == "my notes"


@pytest.mark.parametrize("flag", ["--model_dir", "--params"])
@pytest.mark.parametrize("command", ["run", "estimate", "analyze-input", "sweep"])
def test_an_empty_path_flag_is_refused_not_taken_as_the_default(capsys, command, flag):
  """``--model_dir "$UNSET"`` used to run in ./model_dir, resuming whatever checkpoints were there."""
  with pytest.raises(SystemExit) as info:
    cli.main([command, flag, ""])
  assert info.value.code == 2
  assert f"argument {flag}: an empty path" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "-4", "abc", "1.5"])
def test_estimate_micro_batch_size_takes_an_integer_or_a_search_word(capsys, value):
  with pytest.raises(SystemExit) as info:
    cli.main(["estimate", "--workload", "gpt2_small", "--micro_batch_size", value])
  assert info.value.code == 2
  assert (
    "allowed: an integer >= 1 (used as given), or auto / explore / none (searched)" in capsys.readouterr().err
  )


def test_estimate_micro_batch_size_auto_searches_over_the_params_files_setting(tmp_path, capsys):
  """The help offered auto/explore/none, and the flag refused them (it took integers only)."""
  data = yaml.safe_load(EXAMPLE_PARAMS)
  data["train_input"]["micro_batch_size"] = 16
  path = tmp_path / "params.yaml"
  path.write_text(yaml.safe_dump(data, sort_keys=False))
  assert cli.main(["estimate", "--params", str(path)]) == 0
  assert "micro-batch 16 as given" in capsys.readouterr().out
  assert cli.main(["estimate", "--params", str(path), "--micro_batch_size", "Auto"]) == 0
  out = capsys.readouterr().out
  assert "Micro-batch:    searched" in out and "as given" not in out


def test_the_fix_a_key_hint_follows_key_problems_only(tmp_path, capsys):
  hint = "(fix the params file, or override a key on the command line"
  assert cli.main(["run", "--validate_only", "--params", str(tmp_path / "nope.yaml")]) != 0
  err = capsys.readouterr().err
  assert "cannot read the params file" in err and hint not in err
  assert cli.main(["run", "--validate_only", "--params", _params(tmp_path), "runconfig.max_steps"]) != 0
  err = capsys.readouterr().err
  assert "an override must look like key.path=value" in err and hint not in err
  assert cli.main(["run", "--validate_only", "--params", _params(tmp_path), "runconfig.max_steps=abc"]) != 0
  assert hint in capsys.readouterr().err


def test_a_checkpoint_that_cannot_be_written_says_which_one_is_kept(tmp_path, monkeypatch):
  """A full disk at a checkpoint used to end the run with TensorStore's ValueError traceback."""
  checkpoints = Checkpoints(tmp_path, None)
  try:
    checkpoints.save(_State(jnp.zeros(3), jnp.int32(2)), {})

    def full(*args, **kwargs):
      raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoints.manager, "save", full)
    with pytest.raises(
      ExecutorError, match=r"step 4 .*No space left.*newest saved checkpoint is step 2.*rerun"
    ):
      checkpoints.save(_State(jnp.ones(3), jnp.int32(4)), {})
  finally:
    checkpoints.close()
  assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["2"]


@pytest.mark.parametrize("n", ["0", "-1"])
def test_num_processes_below_one_is_named(capsys, n):
  assert cli.main(["run", "--num_processes", n, "--validate_only"]) == 1
  assert f"--num_processes {n}; allowed: the number of processes in the run, >= 1" in capsys.readouterr().err


@pytest.mark.parametrize(("max_steps", "noted"), [(200, True), (60, False), (40, False)])
def test_a_schedule_that_ends_at_rate_0_before_max_steps_is_noted(max_steps, noted):
  """total_iters adding up to less than max_steps left the last steps training at rate 0, silently."""
  data = yaml.safe_load(EXAMPLE_PARAMS)
  data["runconfig"]["max_steps"] = max_steps
  data["optimizer"]["learning_rate"] = [
    {"scheduler": "LinearLR", "initial_learning_rate": 0.0, "end_learning_rate": 0.1, "total_iters": 10},
    {"scheduler": "LinearLR", "initial_learning_rate": 0.1, "end_learning_rate": 0.0, "total_iters": 50},
  ]
  note = runner.schedule_note(load_params(data))
  if noted:
    assert note is not None and "ends at step 60 with rate 0" in note and "steps 61..200" in note
  else:
    assert note is None
  data["optimizer"]["learning_rate"][1]["end_learning_rate"] = 0.01  # a rate that still trains: no note
  assert runner.schedule_note(load_params(data)) is None


# ----------------------------------------------------------------------------- paths that are not YAML


@given(st.text())
def test_a_literal_override_sets_exactly_the_string_given(value):
  from wafer.config.loader import literal_override, parse_override

  assert parse_override(literal_override("runconfig.model_dir", value)) == (("runconfig", "model_dir"), value)


class _Planned(Exception):
  """Raised in place of the work, carrying the plan the command built."""


_NOT_YAML_PATHS = ["run #2", "~", "null", "2024", "a: b", "|", "[x]", 'it\'s "here"']


@pytest.mark.parametrize("name", _NOT_YAML_PATHS)
@pytest.mark.parametrize("command", ["run", "analyze-input"])
def test_a_model_dir_flag_is_the_path_given_not_yaml(tmp_path, monkeypatch, command, name):
  """``--model_dir "runs/a #2"`` ran in runs/a (a YAML comment), ``~`` / ``null`` in ./model_dir, and ``2024``
  or ``a: b`` were type errors: the flag was pasted into a ``key=value`` override and parsed as YAML."""
  params = _params(tmp_path)
  monkeypatch.chdir(tmp_path)

  def planned(plan, *args, **kwargs):
    raise _Planned(plan)

  monkeypatch.setattr(runner, "run_plan", planned)
  monkeypatch.setattr(input_analyzer, "analyze", planned)
  monkeypatch.setattr(wafer, "enable_compilation_cache", lambda d: d)  # process-wide: not from a test
  with pytest.raises(_Planned) as info:
    cli.main(
      [command, "--params", params, "--model_dir", name, "--seconds", "0.1"][: 5 if command == "run" else 7]
    )
  assert info.value.args[0].runconfig.model_dir == name
  assert (tmp_path / name).is_dir()


@pytest.mark.parametrize("name", ["sweep #2", "~"])
def test_a_sweep_runs_in_the_folder_given(tmp_path, monkeypatch, name):
  from wafer import sweep

  monkeypatch.setattr(runner, "run_plan", lambda plan, **_: (_ for _ in ()).throw(_Planned(plan)))
  with pytest.raises(_Planned) as info:
    sweep.sweep(_params(tmp_path), ["float32"], None, tmp_path / name, save=False)
  assert info.value.args[0].runconfig.model_dir == str(tmp_path / name / "float32_L1")


@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_model_dir_in_the_params_file_is_refused(tmp_path, value):
  """``model_dir: ""`` was Path(""): the run wrote its checkpoints into the current directory."""
  with pytest.raises(ConfigError, match=r"line \d+: runconfig.model_dir: must name a directory"):
    load_params(_params(tmp_path, model_dir=value))


# ----------------------------------------------------------------------------- a Task's functions


def _traced_train_step(task):
  from models.mlp import example_run
  from wafer import train

  _, _, optimizer, loss_scale, policy = example_run()
  state, batch = train.step_shapes(task, optimizer, loss_scale, 0)
  wafer.compile(train.make_train_step(task, optimizer, policy), state, batch, validate_only=True)
  wafer.compile(train.make_eval_step(task, policy), state.params, batch, validate_only=True)


def _vector_loss(params, batch):
  return jnp.ones(3)


@pytest.mark.parametrize(
  ("change", "message"),
  [
    ({}, None),  # the task as it is: traces
    (
      {"loss_fn": _vector_loss},
      r"Task.loss_fn _vector_loss \(.*test_bad_inputs\.py:\d+\) returned float32\[3\]",
    ),
    (
      {"loss_fn": lambda p, b: (jnp.float32(1), {"aux": 1})},
      r"returned a tuple; it must return one floating",
    ),
    ({"loss_fn": lambda p, b: jnp.int32(1)}, r"returned int32\[\]; it must return one floating-point scalar"),
    ({"eval_metric": lambda p, b: jnp.ones(2)}, r"Task.eval_metric .* returned float32\[2\]"),
    (
      {"init_params": "str leaf"},
      r"Task.init_params .* returned params\['name'\] = a str \('x'\); every parameter",
    ),
    (
      {"init_params": "int leaf"},
      r"returned params\['w'\] = an int32 array; every parameter must be a floating",
    ),
  ],
)
def test_task_functions_returning_the_wrong_thing_are_named(change, message):
  """Each was a bare JAX TypeError from wafer's own frames (``Gradient only defined for scalar-output
  functions``, ``data type 'x' not understood``, ``grad requires real- or complex-valued inputs``); a vector
  eval metric was averaged into a number silently."""
  import dataclasses

  from models.mlp import example_task

  task = example_task()
  init = task.init_params
  extra = {
    "str leaf": lambda k: {**init(k), "name": "x"},
    "int leaf": lambda k: {**init(k), "w": jnp.int32(1)},
  }
  if "init_params" in change:
    change = {"init_params": extra[change["init_params"]]}
  task = dataclasses.replace(task, **change)
  if message is None:
    _traced_train_step(task)
    return
  with pytest.raises(ExecutorError, match=message):
    _traced_train_step(task)


class _TwoBatches(wafer.train.IndexedBatches):
  """A source that ends (a user's iterator over a list), where Task.train_data must repeat forever."""

  def __next__(self):
    if self.next_batch >= 2:
      raise StopIteration
    return super().__next__()


def _finite_task(tmp_path, source):
  import dataclasses

  from models.mlp import example_run

  task, *rest = example_run(str(tmp_path / "md"), max_steps=4, log_steps=1, checkpoint_steps=0)
  return (
    dataclasses.replace(task, train_data=lambda seed: source(task.train_data(seed)), batch_spec=None),
    *rest,
  )


def test_training_data_that_ends_is_named_not_a_bare_stop_iteration(tmp_path):
  """A source that ran out was a bare StopIteration (here from step_shapes; the run loop: the slow test)."""
  task, _, optimizer, loss_scale, _ = _finite_task(tmp_path, lambda source: iter([]))
  with pytest.raises(
    ExecutorError, match=r"ended before step 1: its source \(list_iterator\).*IndexedBatches"
  ):
    wafer.train.step_shapes(task, optimizer, loss_scale, 0)


@pytest.mark.slow
def test_training_data_that_ends_mid_run_is_named(tmp_path):
  task, runconfig, optimizer, loss_scale, policy = _finite_task(tmp_path, lambda s: _TwoBatches(s.batch_of))
  with pytest.raises(
    ExecutorError, match=r"the training data ended before step 3: its source \(_TwoBatches\)"
  ):
    wafer.train.run(task, runconfig, optimizer, loss_scale, policy, progress=False)


@pytest.mark.parametrize("value", ["", " ", [""]])
def test_an_empty_data_dir_is_a_config_error_not_a_missing_file_later(value):
  """``data_dir: ""`` (``$DATA`` unset) passed the config and failed at data loading as ``data_dir : no such
  file or directory``, or was ignored by a processor that has built-in data."""
  data = yaml.safe_load(EXAMPLE_PARAMS)
  data["train_input"]["data_dir"] = value
  with pytest.raises(ConfigError, match=r"train_input.data_dir: an empty path names no data"):
    load_params(data)


@pytest.mark.parametrize(
  "rate",
  [
    10**400,  # a YAML int literal of 400 digits: float() raises OverflowError (was a bare traceback)
    1e39,  # finite in float64, inf in the float32 the schedule computes in
    {"scheduler": "LinearLR", "initial_learning_rate": 10**400, "end_learning_rate": 0.0, "total_iters": 3},
  ],
)
def test_a_learning_rate_beyond_float32_is_a_config_error(rate):
  data = yaml.safe_load(EXAMPLE_PARAMS)
  data["optimizer"]["learning_rate"] = rate
  with pytest.raises(ConfigError, match=r"optimizer.learning_rate: .*finite number") as info:
    load_params(data)
  assert len(str(info.value)) < 400  # the 400-digit value is shortened


@pytest.mark.parametrize(
  ("decay_rate", "max_steps"), [(1e10, 100), (1.01, 20_000), (1.01, 8000), (1.0, 10**6)]
)
def test_a_schedule_that_grows_past_float32_before_max_steps_is_refused(decay_rate, max_steps):
  """ExponentialLR with decay_rate > 1 reached inf: inf weights, then NaN losses (skipped steps) for the rest of
  the run, silently."""
  spec = {
    "scheduler": "ExponentialLR",
    "initial_learning_rate": 0.1,
    "decay_rate": decay_rate,
    "total_iters": 1,
  }
  data = yaml.safe_load(EXAMPLE_PARAMS)
  data["runconfig"]["max_steps"] = max_steps
  data["optimizer"]["learning_rate"] = spec
  rates = np.asarray(schedules.build_schedule(spec)(jnp.arange(min(max_steps, 30_000) + 1)))
  overflows = np.flatnonzero(~np.isfinite(rates))
  if not overflows.size:
    load_params(data)
    return
  with pytest.raises(
    ConfigError, match=r"optimizer.learning_rate: reaches inf by step (\d+) \(beyond float32"
  ) as info:
    load_params(data)
  named = int(re.search(r"by step (\d+)", str(info.value)).group(1))
  first = int(overflows[0])
  assert first <= named <= first + max_steps // 4096 + 1  # exact below 4096 steps, sampled above


def test_a_section_validators_key_error_names_the_keys_line_and_value(tmp_path):
  """It named the section's line and dumped the whole section as the value."""
  real = (
    Path(__file__).resolve().parents[1] / "data" / "modelzoo" / "R_1.7.1" / "bert" / "bert_base_MSL128.yaml"
  )
  lines = real.read_text().splitlines(keepends=True)
  (at,) = [i for i, line in enumerate(lines) if "max_predictions_per_seq: 20" in line][:1]
  lines[at] = lines[at].replace("max_predictions_per_seq: 20", "max_predictions_per_seq: 200")
  path = tmp_path / "bert_base_MSL128.yaml"
  path.write_text("".join(lines))
  with pytest.raises(ConfigError) as info:
    load_params(str(path))
  text = str(info.value)
  assert f"line {at + 1}: train_input.max_predictions_per_seq: more masked positions than" in text
  assert text.endswith("(got 200)")
