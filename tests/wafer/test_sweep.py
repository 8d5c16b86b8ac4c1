"""`wafer sweep`: one run per format on the default BERT-tiny job; float32 equals `wafer run`'s."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import yaml

from wafer import cli, registry, sweep
from wafer.config import ConfigError

# A few steps of the default job, a tiny eval: the whole module runs in CI time.
SHORT = ["runconfig.max_steps=3", "runconfig.eval_frequency=3", "runconfig.eval_steps=1", "runconfig.checkpoint_steps=0"]  # fmt: skip


@pytest.fixture(scope="module")
def params_path():
  return registry.default_job()[0]


@pytest.fixture(scope="module")
def swept(params_path, tmp_path_factory):
  out = tmp_path_factory.mktemp("sweep")
  result = sweep.sweep(params_path, "cbfloat16,float32", None, out, SHORT, progress=False)
  return result, out


def _metric_losses(path):
  records = [json.loads(line) for line in path.read_text().splitlines()]
  return [(r["step"], r["loss"]) for r in records if "loss" in r]


@pytest.mark.slow  # a whole second run; .ci/run runs it
def test_float32_run_is_bit_identical_to_wafer_run(swept, params_path, tmp_path):
  result, out = swept
  run_dir = tmp_path / "run"
  args = ["run", "--params", params_path, "--model_dir", str(run_dir), *SHORT]
  assert cli.main([*args, "runconfig.log_steps=1", "model.mixed_precision=false"]) == 0
  expected = _metric_losses(run_dir / "metrics.jsonl")
  got = _metric_losses(out / "float32_L1" / "metrics.jsonl")
  assert len(expected) == 3
  assert got == expected  # exact float equality: the same run path, config and data
  base = result.baseline()
  assert list(zip(base.steps, base.losses)) == expected


@pytest.mark.slow  # the swept fixture trains 4 runs (30 s); .ci/run runs it
def test_cbfloat16_differs_from_float32(swept):
  result, _ = swept
  cb = next(r for r in result.runs if r.format == "cbfloat16")
  f32 = result.baseline()
  assert cb.steps == f32.steps == [1, 2, 3]
  assert cb.losses != f32.losses  # rounding happened
  assert cb.deviation_u is not None and cb.deviation_u > 0
  assert f32.deviation_u == 0.0
  # the deviation is the worst relative loss difference in units of u = 2^-10 (cbfloat16: 9 mantissa bits)
  worst = max(abs(a - b) / abs(b) for a, b in zip(cb.losses, f32.losses)) / 2.0**-10
  assert math.isclose(cb.deviation_u, worst, rel_tol=1e-12)


@pytest.mark.slow  # shares the swept fixture; .ci/run runs it
def test_sweep_json_schema_and_png(swept):
  result, out = swept
  data = json.loads((out / "sweep.json").read_text())
  assert [(r["format"], r["level"]) for r in data["runs"]] == [("float32", 1), ("cbfloat16", 1)]
  for r in data["runs"]:
    assert {"format", "level", "steps", "losses", "eval", "samples_per_sec_estimate"} <= set(r)
    assert len(r["steps"]) == len(r["losses"]) == 3
    assert r["eval"]["step"] == 3 and len(r["eval"]) == 2
    assert r["samples_per_sec_estimate"] > 0
    assert r["estimate_mode"] == "weight streaming, release 2.x"  # the release decides the mode
    assert (out / f"{r['format']}_L{r['level']}" / "metrics.jsonl").exists()
  assert sweep.SweepResult.load(out).to_dict() == data == result.to_dict()
  png = (out / "sweep.png").read_bytes()
  assert png.startswith(b"\x89PNG")
  text = str(result.table())
  assert "deviation (u)" in text and "cbfloat16" in text
  assert "the compile report's estimate (weight streaming, release 2.x)" in " ".join(text.split())


@pytest.mark.parametrize(
  ("argv", "message"),
  [
    (["--formats", "cbfloat61,float32"], "unknown format 'cbfloat61'; did you mean 'cbfloat16'?"),
    (["--formats", "float8"], "unknown format 'float8'"),
    (["--levels", "3"], "'3' is not a precision level; allowed: 0, 1, 2"),
    (["--formats", "float32,float32"], "names a format twice"),
  ],
)
def test_bad_formats_and_levels_are_one_line_errors(argv, message, tmp_path, capsys):
  assert cli.main(["sweep", "--model_dir", str(tmp_path), *argv]) == 1
  err = capsys.readouterr().err
  assert err.startswith("wafer sweep: error: --") and message in err
  assert len(err.strip().splitlines()) == 1
  assert not (tmp_path / "sweep.json").exists()


def test_formats_and_levels_parse():
  assert sweep.parse_formats(["float16", "bfloat16"]) == ("float16", "bfloat16")
  assert sweep.parse_levels([0, 1, 2]) == (0, 1, 2)
  with pytest.raises(sweep.SweepError, match="allowed: 0, 1, 2"):
    sweep.parse_levels("1.5")
  with pytest.raises(sweep.SweepError, match="allowed: 0, 1, 2"):
    sweep.parse_levels([True])
  with pytest.raises(sweep.SweepError, match="no format given"):
    sweep.parse_formats(" , ")
  for formats in ("bf16,,f32", "bf16,f32,", ",bf16"):  # an empty name was skipped silently
    with pytest.raises(sweep.SweepError, match="an empty name"):
      sweep.parse_formats(formats)


def test_format_overrides_select_the_policy_through_the_config(params_path):
  from wafer.config import load_params

  registry.load_plugins()
  for fmt in sweep.FORMATS:
    for level in sweep.LEVELS:
      policy = load_params(params_path, sweep.format_overrides(fmt, level)).policy()
      assert policy.compute.name == fmt and policy.level == level


def test_cli_sweep_over_levels(tmp_path, capsys):
  """The command line on the example MLP job: float32 once, each 16-bit format once per level."""
  from models import mlp

  out = tmp_path / "s"
  argv = ["sweep", "--params", str(mlp.CONFIG), "--formats", "cbfloat16,float32", "--levels", "2,0"]
  assert (
    cli.main([*argv, "--model_dir", str(out), "runconfig.max_steps=2", "runconfig.checkpoint_steps=0"]) == 0
  )
  text = capsys.readouterr().out
  assert "[sweep 1/3] float32 at precision_opt_level 0" in text and "deviation (u)" in text
  assert sorted(p.name for p in out.iterdir()) == [
    "cbfloat16_L0",
    "cbfloat16_L2",
    "compile_cache",  # the runs' compiled steps, as wafer run keeps its model_dir's (a rerun loads them)
    "float32_L0",
    "sweep.json",
    "sweep.png",
  ]
  assert any((out / "compile_cache").iterdir())
  runs = json.loads((out / "sweep.json").read_text())["runs"]
  assert [(r["format"], r["level"]) for r in runs] == [("float32", 0), ("cbfloat16", 2), ("cbfloat16", 0)]
  assert all(r["steps"] == [1, 2] and r["eval"] == {} for r in runs)  # mode train: no eval


def test_formats_resolve_aliases_to_canonical_names():
  """Aliases and case resolve as `precision.get_format` does; the same format twice, under two
  spellings, is still a repeat; a known format no run computes in names itself."""
  assert sweep.parse_formats("bf16, CB16,fp16,f32") == ("bfloat16", "cbfloat16", "float16", "float32")
  assert sweep.parse_formats([" bfloat16", "float32 "]) == ("bfloat16", "float32")
  with pytest.raises(sweep.SweepError, match="names a format twice: 'bfloat16' and 'bf16' are both bfloat16"):
    sweep.parse_formats("bfloat16,bf16")
  with pytest.raises(sweep.SweepError, match="'float8_e4m3fn' .* a run cannot compute in"):
    sweep.parse_formats("float8_e4m3fn")


@pytest.mark.slow  # two sweeps of real training runs
def test_rerun_into_the_same_folder_keeps_the_losses(tmp_path):
  """A sweep run again into its folder (after an interruption, or after it finished) resumes each
  run from its checkpoint: the losses come from the run's whole metrics.jsonl, not only the steps
  trained this time (a finished sweep rerun trains nothing and used to write empty losses)."""
  from models import mlp

  def run(max_steps, save=False):
    overrides = [f"runconfig.max_steps={max_steps}", "runconfig.checkpoint_steps=1"]
    return sweep.sweep(mlp.CONFIG, "f32", None, tmp_path, overrides, progress=False, save=save).runs[0]

  first = run(2)
  longer = run(3, save=True)  # resumes at the checkpoint of step 2 and trains step 3 only
  assert longer.steps == [1, 2, 3] and longer.losses[:2] == first.losses
  assert sweep.SweepResult.load(tmp_path).runs[0].losses == longer.losses


def test_plot_of_a_float32_only_sweep_has_no_empty_panel(tmp_path):
  """float32 alone: the loss panel only (the difference panel's empty legend was a UserWarning,
  an error under filterwarnings=error)."""
  run = sweep.Run("float32", 1, str(tmp_path), [1, 2], [2.0, 1.5], {}, None, 0.0)
  assert sweep.SweepResult([run], str(tmp_path)).plot(tmp_path / "p.png").stat().st_size > 0


@pytest.mark.parametrize(
  ("overrides", "levels", "message"),
  [
    (
      ["runconfig.model_dir=elsewhere"],
      None,
      "sets runconfig.model_dir for each run; choose it with --model_dir",
    ),
    (["model.fp16_type=bfloat16"], None, "sets model.fp16_type for each run; choose it with --formats"),
    (["model.mixed_precision=false"], None, "choose it with --formats"),
    (["runconfig.precision_opt_level=2"], "0,1", "choose it with --levels"),
    (["runconfig.validate_only=true"], None, "runconfig has validate_only: a sweep trains every run"),
    (["runconfig.mode=eval"], None, "runconfig has mode eval: a sweep trains every run"),
  ],
)
def test_overrides_the_sweep_would_replace_or_that_train_nothing_are_refused(
  tmp_path, monkeypatch, overrides, levels, message
):
  """Each was replaced silently by the sweep's own override (runconfig.model_dir=elsewhere: the runs went
  into --model_dir), or gave runs that trained nothing (validate_only, mode eval)."""
  from models.mlp import EXAMPLE_PARAMS

  monkeypatch.chdir(tmp_path)
  Path("params.yaml").write_text(EXAMPLE_PARAMS)
  with pytest.raises(sweep.SweepError, match=re.escape(message)):
    sweep.sweep("params.yaml", "float32", levels, "s", overrides, progress=False)
  assert not Path("s").exists() and not Path("elsewhere").exists()


PARAMS = Path(__file__).resolve().parents[2] / "models/bert/configs/params_bert_tiny_default.yaml"


def test_the_python_api_refuses_a_string_of_overrides_and_a_number_of_formats(tmp_path):
  """``overrides="runconfig.max_steps=1"`` was read letter by letter ("got 'r'"); ``formats=16``
  was a bare TypeError."""
  with pytest.raises(sweep.SweepError, match=r"overrides='runconfig.max_steps=1'; allowed: a sequence"):
    sweep.sweep(PARAMS, model_dir=tmp_path, overrides="runconfig.max_steps=1")
  for bad in (16, [16]):
    with pytest.raises(sweep.SweepError, match=r"formats=.*; allowed: format names"):
      sweep.sweep(PARAMS, model_dir=tmp_path, formats=bad)
  assert not any(tmp_path.iterdir())  # refused before any run


def test_a_diverging_format_is_a_result_with_nan_losses_in_strict_json(tmp_path, caplog):
  """A loss that becomes NaN stops a `wafer run` (runconfig.check_loss_values); in a sweep it is what
  the sweep is for: the run's losses show nan, sweep.json stays strict JSON (null) and loads as nan.
  tensorboardX does not log "NaN or Inf found in input tensor" for each of its steps."""
  from models import mlp

  overrides = ["runconfig.max_steps=3", "optimizer.learning_rate=1e30"]
  result = sweep.sweep(mlp.CONFIG, "f32", None, tmp_path, overrides, progress=False)
  assert not [r for r in caplog.records if "NaN or Inf" in r.getMessage()]
  (run,) = result.runs
  assert run.steps == [1, 2, 3] and math.isfinite(run.losses[0]) and math.isnan(run.losses[-1])
  text = (tmp_path / "sweep.json").read_text()
  assert "NaN" not in text
  json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in sweep.json"))
  assert math.isnan(sweep.SweepResult.load(tmp_path).runs[0].losses[-1])
  first = next(s for s, v in zip(run.steps, run.losses) if math.isnan(v))
  assert f"float32 itself diverged (loss nan at step {first})" in result.table().footer  # the baseline: said


def test_a_diverged_format_deviates_without_bound_and_survives_a_save(tmp_path):
  """A format whose loss became nan where float32's is finite has an infinite deviation (max() skipped
  a nan that was not first); sweep.json holds nulls and loads back as the same sweep."""
  runs = [
    sweep.Run(
      "float32", 1, str(tmp_path / "a"), [1, 2, 3], [2.0, 1.9, 1.7], {"step": 3, "accuracy": 0.5}, None
    ),
    sweep.Run(
      "float16",
      1,
      str(tmp_path / "b"),
      [1, 2, 3],
      [2.0, 1.9001, math.nan],
      {"step": 3, "accuracy": math.nan},
      None,
    ),
  ]
  sweep._deviations(runs)
  assert runs[0].deviation_u == 0 and runs[1].deviation_u == math.inf
  result = sweep.SweepResult(runs, str(tmp_path))
  result.save()
  loaded = sweep.SweepResult.load(tmp_path)
  assert loaded.runs[1].deviation_u == math.inf and math.isnan(loaded.runs[1].eval["accuracy"])
  assert "inf" in str(loaded.table())


def test_bad_levels_and_model_dir_in_the_python_api_are_sweep_errors(tmp_path):
  """``levels=1`` was a bare "'int' object is not iterable"; ``model_dir=None`` a pathlib TypeError."""
  with pytest.raises(sweep.SweepError, match=r"--levels: 1; allowed: levels among 0, 1, 2"):
    sweep.sweep(PARAMS, model_dir=tmp_path, levels=1)
  with pytest.raises(sweep.SweepError, match=r"model_dir=None; allowed: a folder path"):
    sweep.sweep(PARAMS, model_dir=None)
  assert not any(tmp_path.iterdir())


MLP = Path(__file__).resolve().parents[2] / "models/mlp/configs/params_mlp.yaml"
STATIC = ["runconfig.max_steps=1", "runconfig.checkpoint_steps=0", "optimizer.loss_scaling_factor=1.0"]


def test_a_format_that_cannot_run_is_refused_before_any_run_trains(tmp_path):
  """cbfloat16 with a static loss scale is refused at load; the float32 run before it trained in
  full first, and the sweep then stopped without a sweep.json."""
  with pytest.raises(Exception, match="cbfloat16") as refused:
    sweep.sweep(MLP, "f32,cb16", "1", tmp_path, STATIC, progress=False)
  assert "Traceback" not in str(refused.value)
  assert not (tmp_path / "float32_L1").exists()  # nothing trained


def test_without_levels_the_level_is_read_with_a_format_the_sweep_runs(tmp_path):
  """The file's level was read by validating the file's own format (cbfloat16, which a static loss
  scale refuses) although the sweep ran only float32 and bfloat16."""
  result = sweep.sweep(MLP, "f32,bf16", None, tmp_path, STATIC, progress=False, save=False)
  assert [(r.format, r.level) for r in result.runs] == [("float32", 1), ("bfloat16", 1)]


MODELZOO_FC_MNIST = Path(__file__).resolve().parents[1] / "data/modelzoo/Release_2.3.1/fc_mnist/params.yaml"


def test_a_format_the_sweep_adds_names_itself_as_the_cause_and_gives_both_fixes(tmp_path, capsys):
  """The default sweep of a modelzoo file with a static loss scale said only "line 29:
  optimizer.loss_scaling_factor: cbfloat16 requires dynamic loss scaling": the file never asked for
  cbfloat16 (it computes in float16), the sweep's default --formats did."""
  out = tmp_path / "sw"
  argv = ["sweep", "--params", str(MODELZOO_FC_MNIST), "--model_dir", str(out)]
  assert cli.main([*argv, "train_input.data_dir=null", "eval_input.data_dir=null"]) == 1
  err = capsys.readouterr().err
  first = err.strip().splitlines()[0]
  assert first.startswith(
    f"wafer sweep: error: {MODELZOO_FC_MNIST}: line 29: optimizer.loss_scaling_factor: "
  )
  assert (
    "cbfloat16 is the sweep's (--formats cbfloat16,bfloat16,float16,float32, the default), not the params "
    "file's, which computes in float16: cbfloat16 requires dynamic loss scaling"
  ) in first
  assert first.endswith(
    "(got 1.0); fix: sweep without it (--formats bfloat16,float16,float32) or add the override "
    "optimizer.loss_scaling_factor=dynamic (every run of the sweep then has it)"
  )
  assert not out.exists()  # refused before any run
  data = yaml.safe_load(MLP.read_text())
  data["model"]["mixed_precision"] = False  # a float32 file, its static scale set by an override
  with pytest.raises(ConfigError, match=r"computes in float32: .* or set the override optimizer.loss_sc"):
    sweep.sweep(data, "f32,cb16", "1", tmp_path, STATIC, progress=False)
  with pytest.raises(
    ConfigError, match=r"\(got 1.0\); fix: set the override optimizer.loss_scaling_factor=dyn"
  ):
    sweep.sweep(data, "cb16", None, tmp_path, STATIC, progress=False)  # no other format: one fix
  with pytest.raises(ConfigError) as own:  # the file's own problem, format or not: as it was
    sweep.sweep(MLP, "cb16", None, tmp_path, [*STATIC, "optimizer.learning_rate=-1"], progress=False)
  assert "the sweep's" not in str(own.value) and "learning_rate" in str(own.value)


def test_a_rerun_with_other_settings_is_refused_before_any_run_trains_and_sweep_json_records_them(tmp_path):
  """A sweep rerun into its folder with a new learning rate said "Nothing to train" for each format and
  wrote the earlier sweep's losses again, byte for byte (only a "Note: settings changed" in the log)."""
  first = ["runconfig.max_steps=2", "runconfig.checkpoint_steps=1"]
  sweep.sweep(MLP, "f32,bf16", None, tmp_path, first, progress=False)
  saved = json.loads((tmp_path / "sweep.json").read_text())
  assert saved["params"] == str(MLP) and saved["overrides"] == first
  f32, bf16 = saved["runs"]
  assert f32["overrides"][:4] == ["runconfig.log_steps=1", "runconfig.check_loss_values=false", *first]
  assert "model.mixed_precision=false" in f32["overrides"] and "model.fp16_type=bfloat16" in bf16["overrides"]
  before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and "tensorboard" not in p.parts}

  with pytest.raises(sweep.SweepError) as refused:
    sweep.sweep(MLP, "f32,bf16", None, tmp_path, [*first, "optimizer.learning_rate=0.5"], progress=False)
  text = str(refused.value)
  assert (
    f"--model_dir {tmp_path} holds checkpoints of an earlier sweep with other settings: float32_L1 at step 2, "
    "bfloat16_L1 at step 2: optimizer.learning_rate: checkpoint 0.05, now 0.5." in text
  )
  assert "Give this sweep a new --model_dir, or set those keys back" in text
  after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and "tensorboard" not in p.parts}
  assert after == before  # nothing trained, nothing rewritten

  longer = sweep.sweep(MLP, "f32,bf16", None, tmp_path, ["runconfig.max_steps=3", "runconfig.checkpoint_steps=1"],
                       progress=False)  # fmt: skip
  assert [r.steps for r in longer.runs] == [[1, 2, 3]] * 2  # the same settings, a later max_steps: resumed
  assert longer.runs[0].losses[:2] == f32["losses"]
  assert sweep.SweepResult.load(tmp_path).to_dict() == longer.to_dict()


BERT_1_8 = (
  Path(__file__).parents[1] / "data" / "modelzoo" / "Release_1.8.0" / "bert" / "bert_base_MSL128.yaml"
)


class _Planned(Exception):
  """Raised instead of training: the sweep's first plan is what the test compares."""


def test_a_sweeps_float32_run_has_the_optimizer_of_wafer_run_of_a_1_8_file(tmp_path, monkeypatch):
  """The sweep adds runconfig.precision_opt_level=<level> to every run, a key of 1.9 and later files: it
  made a 1.8 file one of "1.x or 2.0", whose AdamW corrects its bias (wafer run's does not, 1.8's
  default); the release is read from the file as written, so both resolve one optimizer."""
  from wafer import runner
  from wafer.config import load_params

  plans = []

  def planned(plan, progress=True):
    plans.append(plan)
    raise _Planned

  monkeypatch.setattr(runner, "run_plan", planned)
  with pytest.raises(_Planned):
    sweep.sweep(BERT_1_8, "float32", None, tmp_path, ["runconfig.max_steps=1"], progress=False)
  run = load_params(BERT_1_8, ["runconfig.max_steps=1"])
  swept = plans[0].params
  assert swept.release == run.release and swept.release.name == "1.x (up to 1.8)"
  assert swept.optimizer.model_dump() == run.optimizer.model_dump()
  assert swept.optimizer.correct_bias is False


def test_a_format_the_sweep_adds_with_formats_given_is_not_called_the_default(tmp_path, capsys):
  """The cause said "the default is all four formats" also when --formats named the formats."""
  argv = ["sweep", "--params", str(MODELZOO_FC_MNIST), "--model_dir", str(tmp_path), "--formats", "cb16,f32"]
  assert cli.main([*argv, "train_input.data_dir=null", "eval_input.data_dir=null"]) == 1
  err = capsys.readouterr().err
  assert "cbfloat16 is the sweep's (--formats cbfloat16,float32), not the params file's" in err, err
