"""`wafer run` and `wafer estimate --params`: the built-in job, params files, and bad params files."""

import json
from pathlib import Path

import pytest
import yaml

from models.mlp import EXAMPLE_PARAMS
from wafer import cli


def _params_file(tmp_path, **changes):
  data = yaml.safe_load(EXAMPLE_PARAMS)
  for dotted, value in changes.items():
    section, key = dotted.split("__")
    if value is None:
      data[section].pop(key, None)
    else:
      data[section][key] = value
  path = tmp_path / "params.yaml"
  path.write_text(yaml.safe_dump(data))
  return path


@pytest.mark.slow  # over 7 s on the 2-core CI machine; runs in the slow stage
def test_run_without_params_runs_the_embedded_default_job(tmp_path, capsys):
  rc = cli.main(
    [
      "run",
      "--model_dir",
      str(tmp_path / "md"),
      "runconfig.max_steps=4",
      "--mode",
      "train",
      "runconfig.log_steps=2",
    ]
  )
  out = capsys.readouterr().out
  assert rc == 0, out
  assert "embedded default job: BERT-tiny MLM+NSP" in out and "| Train Device=CPU, Step=4" in out
  records = [json.loads(line) for line in (tmp_path / "md" / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records] == [1, 2, 4]  # the first step, then every log_steps
  assert "Training loss:" in out and "at step 1 ->" in out
  assert "Outputs:" in out and "metrics.jsonl" in out and "compile_report.txt" in out
  assert any(
    f.startswith("bert-bpe-8192-") for f in (tmp_path / "md" / "data_cache").iterdir() for f in [f.name]
  )


def test_run_a_params_file_with_modes_and_overrides(tmp_path, capsys):
  path = _params_file(tmp_path, runconfig__model_dir=str(tmp_path / "md"), runconfig__max_steps=10)
  assert cli.main(["run", "--params", str(path), "runconfig.checkpoint_steps=5"]) == 0
  assert cli.main(["run", "--params", str(path), "--mode", "eval_all"]) == 0
  out = capsys.readouterr().out
  assert out.count("Avg Eval Accuracy") == 2  # checkpoints at 5 and 10
  assert cli.main(["run", "--params", str(path), "--compile_only", "--model_dir", str(tmp_path / "c")]) == 0
  assert (tmp_path / "c" / "compile_report.txt").exists() and not (tmp_path / "c" / "metrics.jsonl").exists()


BAD_PARAMS = [
  # (change to the example params, fragment of the error)
  ({"runconfig__max_stesp": 10}, "did you mean 'max_steps'"),
  ({"runconfig__log_steps": -1}, "runconfig.log_steps"),
  ({"runconfig__mode": "fit"}, "runconfig.mode"),
  ({"model__name": "mlp_exampel"}, "Did you mean 'mlp_example'"),
  ({"model__fp16_type": "cbfloat61"}, "model.fp16_type"),
  ({"optimizer__optimizer_type": "adamm"}, "optimizer_type"),
  ({"optimizer__loss_scaling_factor": "sometimes"}, "loss_scaling_factor"),
  ({"train_input__batch_size": 0}, "train_input.batch_size"),
]


@pytest.mark.parametrize("changes, fragment", BAD_PARAMS)
def test_bad_params_files_get_short_errors(tmp_path, capsys, changes, fragment):
  path = _params_file(tmp_path, runconfig__model_dir=str(tmp_path / "md"), **changes)
  rc = cli.main(["run", "--params", str(path)])
  err = capsys.readouterr().err
  assert rc == 1
  assert fragment.lower() in err.lower(), err
  assert "Traceback" not in err and len(err.splitlines()) < 15


def test_batch_not_divisible_by_num_csx(tmp_path, capsys):
  path = _params_file(tmp_path, runconfig__model_dir=str(tmp_path / "md"), runconfig__num_csx=3)
  assert cli.main(["run", "--params", str(path)]) == 1
  assert "num_csx" in capsys.readouterr().err


def test_estimate_a_params_file(tmp_path, capsys):
  path = _params_file(tmp_path, runconfig__model_dir=str(tmp_path / "md"))
  assert cli.main(["estimate", "--params", str(path)]) == 0
  out = capsys.readouterr().out
  assert "Estimated Overall Performance" in out
  assert (Path(tmp_path) / "md" / "compile_report.txt").exists() and (
    Path(tmp_path) / "md" / "placement.png"
  ).exists()


def test_estimate_help_says_a_params_file_writes_into_its_model_dir(capsys):
  """`wafer estimate --params` writes the report into runconfig.model_dir; the help said only
  --model_dir writes files."""
  with pytest.raises(SystemExit):
    cli.main(["estimate", "--help"])
  help_text = " ".join(capsys.readouterr().out.split())
  assert "with --params: by default its runconfig.model_dir" in help_text
  assert "default with --params: runconfig.model_dir" in help_text


def test_estimate_a_params_file_at_another_batch_size(tmp_path, capsys):
  """--batch_size with --params sets train_input.batch_size (it was silently ignored)."""
  path = _params_file(tmp_path, runconfig__model_dir=str(tmp_path / "md"))
  assert cli.main(["estimate", "--params", str(path), "--batch_size", "32"]) == 0
  out = capsys.readouterr().out
  assert " 32 per step" in out and " 64 per step" not in out
  assert cli.main(["estimate", "--params", str(path), "--batch_size", "0"]) == 1  # USER_ERROR_EXIT
  assert "--batch_size 0; allowed: a positive integer" in capsys.readouterr().err


def test_process_flags_are_checked_before_anything_starts(tmp_path, capsys):
  path = _params_file(tmp_path, runconfig__model_dir=str(tmp_path / "md"))
  flags = ["--num_processes", "2", "--process_id", "2", "--coordinator_address", "127.0.0.1:1"]
  assert cli.main(["run", "--params", str(path), *flags]) == 1
  err = capsys.readouterr().err
  assert "--process_id 2 with --num_processes 2; allowed: 0 <= process_id < num_processes" in err
  assert "Traceback" not in err and not (tmp_path / "md").exists()
  assert (
    "--coordinator_address HOST:PORT"
    in cli.build_parser()._subparsers._group_actions[0].choices["run"].format_help()
  )
  # one process: nothing starts, but a process id of another run was taken without a word
  flags = ["--num_processes", "1", "--process_id", "3", "--coordinator_address", "foo:1"]
  assert cli.main(["run", "--params", str(path), *flags]) == 1
  err = capsys.readouterr().err
  assert "--process_id 3 with --num_processes 1; allowed: 0 <= process_id < num_processes" in err, err
  assert not (tmp_path / "md").exists()
  for address in ("nohostcolon", ":1234", "host:", "host:port"):  # was an IndexError from inside JAX
    flags = ["--num_processes", "2", "--process_id", "0", "--coordinator_address", address]
    assert cli.main(["run", "--params", str(path), *flags]) == 1
    err = capsys.readouterr().err
    assert f"--coordinator_address {address!r}; allowed: HOST:PORT" in err and "Traceback" not in err, err


def test_estimate_flags_are_the_params_keys_they_replace(tmp_path, capsys):
  """--num_csx replaces runconfig.num_csx before the file is checked, as --batch_size and
  --micro_batch_size replace theirs: a flag and its override give one answer, a problem names the flag,
  the per-system batch is that of the systems asked for, and wafer.estimate's own checks read as flags."""
  path = _params_file(tmp_path, runconfig__model_dir=str(tmp_path / "md"), train_input__micro_batch_size=16)

  def estimate(*argv):
    rc = cli.main(["estimate", "--params", str(path), *argv])
    out, err = capsys.readouterr()
    return rc, out, err

  rc, out, err = estimate("--num_csx", "8")  # 64 / 8 = 8 samples per system: 16 does not divide it
  assert rc == 1 and "must divide the per-system batch batch_size/num_csx = 8" in err, err
  assert estimate("runconfig.num_csx=8")[2] == err
  rc, _, err = estimate("--num_csx", "4", "--micro_batch_size", "3")
  assert (
    rc == 1 and "(from --micro_batch_size 3): must divide the per-system batch batch_size/num_csx = 16" in err
  )
  rc, _, err = estimate("--batch_size", "3", "--num_csx", "4")
  assert rc == 1 and "train_input.batch_size (from --batch_size 3): The number of CS devices (4)" in err, err
  rc, out, _ = estimate("--num_csx", "2", "--model_dir", str(tmp_path / "b"))
  assert rc == 0 and "2 x CS-2" in out and "(32 per system); micro-batch 16 as given" in out, out
  rc, _, err = estimate("--num_csx", "2", "--mode", "pipeline")
  assert rc == 1 and "--num_csx 2 with --mode pipeline" in err and "mode='" not in err, err


def test_a_section_the_mode_does_not_run_is_not_checked(tmp_path):
  """As modelzoo, which checks a section's batch when it builds that section's loader: an eval_input
  whose micro-batch does not split under runconfig.num_csx refuses train_and_eval, not train."""
  from wafer.config import ConfigError, load_params

  path = _params_file(tmp_path, eval_input__micro_batch_size=48, runconfig__num_csx=2)
  assert load_params(path).eval_input.micro_batch_size == 48
  with pytest.raises(ConfigError, match=r"eval_input\.micro_batch_size.* batch_size/num_csx = 32"):
    load_params(path, ["runconfig.eval_frequency=10"], mode="train_and_eval")


_SWALLOWED_CTRL_C = """
import gc, signal, sys, time
from wafer.cli import interrupts_delivered

# ctrl-C as in a terminal (a job started in the background by a script ignores SIGINT, and then
# neither ctrl-C nor its re-delivery reaches the process)
signal.signal(signal.SIGINT, signal.default_int_handler)

def swallowed_once(phase, info, fired=[]):  # as JAX's gc callback would: Python drops what it raises
  if not fired:
    fired.append(phase)
    raise KeyboardInterrupt

gc.callbacks.append(swallowed_once)
try:
  with interrupts_delivered():
    gc.collect()
    if sys.argv[1] == "wait":  # the interrupt arrives here, 50 ms later
      deadline = time.monotonic() + 10
      while time.monotonic() < deadline:
        time.sleep(0.001)
      print("not interrupted")
except KeyboardInterrupt:
  print("interrupted inside")
time.sleep(0.3)  # a stray interrupt after the context would end the process here, with a traceback
print("done")
"""


@pytest.mark.parametrize("when", ["wait", "end_at_once"])
def test_a_ctrl_c_that_lands_in_a_gc_callback_still_stops_the_command(when):
  """A KeyboardInterrupt raised inside JAX's garbage-collection callback is "Exception ignored" by
  Python: ctrl-C during data preparation was lost and the run finished. The CLI delivers it again,
  inside the command (``end_at_once``: one swallowed in its last 50 ms arrived after main() had
  returned, as a raw traceback). In a process of its own: the interrupt goes to the main thread."""
  import subprocess
  import sys

  done = subprocess.run(
    [sys.executable, "-c", _SWALLOWED_CTRL_C, when], capture_output=True, text=True, timeout=120
  )
  assert done.returncode == 0 and done.stdout.split() == ["interrupted", "inside", "done"], (
    done.stdout + done.stderr
  )


FC_MNIST_FILE = Path(__file__).parents[1] / "data" / "params" / "fc_mnist.yaml"


def _fc_mnist_files(tmp_path):
  """fc_mnist (scikit-learn's digits: no data_dir) and the same file without its train_input."""
  data = yaml.safe_load(FC_MNIST_FILE.read_text())
  for section in ("train_input", "eval_input"):
    data[section].pop("data_dir")
  data["runconfig"].update(max_steps=4, checkpoint_steps=4, log_steps=4)
  full = tmp_path / "fc_mnist.yaml"
  full.write_text(yaml.safe_dump(data))
  data.pop("train_input")
  eval_only = tmp_path / "notrain.yaml"
  eval_only.write_text(yaml.safe_dump(data))
  return full, eval_only


def test_eval_modes_run_a_file_without_train_input_and_validate_checks_the_eval_step(tmp_path, capsys):
  full, eval_only = _fc_mnist_files(tmp_path)
  md = str(tmp_path / "md")
  assert cli.main(["run", "--params", str(full), "--model_dir", md]) == 0
  capsys.readouterr()
  for mode in ("eval", "eval_all"):
    assert cli.main(["run", "--params", str(eval_only), "--mode", mode, "--model_dir", md]) == 0
    assert "Eval accuracy at step 4" in capsys.readouterr().out
  report = (tmp_path / "md" / "compile_report.txt").read_text()
  rc = cli.main(["run", "--params", str(eval_only), "--mode", "eval", "--validate_only", "--model_dir", md])
  out = capsys.readouterr().out
  assert rc == 0 and "Validating the eval step of fc_mnist" in out and "the train step of" not in out
  assert (tmp_path / "md" / "compile_report.txt").read_text() == report  # the train step's report, kept
  assert "Outputs:" not in out  # it wrote nothing (metrics, checkpoints and the report are the earlier run's)
  # the modes that train still need train_input
  assert cli.main(["run", "--params", str(eval_only), "--mode", "train", "--model_dir", md]) == 1
  assert "train_input: required for mode 'train'" in capsys.readouterr().err


def test_a_run_the_checkpoint_refuses_is_refused_before_any_work(tmp_path, capsys):
  path = _params_file(tmp_path, runconfig__max_steps=4, runconfig__checkpoint_steps=4, runconfig__log_steps=4)
  md = str(tmp_path / "md")
  assert cli.main(["run", "--params", str(path), "--model_dir", md]) == 0
  capsys.readouterr()
  report = (tmp_path / "md" / "compile_report.txt").read_text()
  rc = cli.main(
    ["run", "--params", str(path), "--model_dir", md, "runconfig.max_steps=8", "train_input.batch_size=32"]
  )
  out, err = capsys.readouterr()
  assert rc == 1 and "Cannot resume from the checkpoint of step 4" in err, err
  assert "Preparing the training data" not in out and "Compil" not in out
  assert (tmp_path / "md" / "compile_report.txt").read_text() == report
  rc = cli.main(
    ["run", "--params", str(path), "--model_dir", md, "train_input.batch_size=32", "--validate_only"]
  )
  out, err = capsys.readouterr()
  assert rc == 1 and "--validate_only: the run would be refused (nothing was written): Cannot resume" in err
  assert (tmp_path / "md" / "compile_report.txt").read_text() == report and "Validating" not in out
  # a validation that fits names only what it wrote: the compile report, not the run's metrics or checkpoints
  assert cli.main(["run", "--params", str(path), "--model_dir", md, "--validate_only"]) == 0
  outputs = capsys.readouterr().out.split("Outputs:")[1]
  assert "compile_report.txt" in outputs and "metrics" not in outputs and "checkpoints" not in outputs
  assert "compile_report.json" in outputs and "placement.png" in outputs  # the report's other two files


@pytest.mark.slow  # about 5 s: whole runs through the CLI; .ci/run runs the slow tests
def test_a_max_steps_below_the_checkpoints_step_is_refused_before_any_work(tmp_path, capsys):
  """The refusal came at the resume, after the data, the compile and the estimate had overwritten the
  compile report of the run whose checkpoints they are; --validate_only said "Validation completed"."""
  path = _params_file(tmp_path, runconfig__max_steps=4, runconfig__checkpoint_steps=4, runconfig__log_steps=4)
  md = str(tmp_path / "md")
  assert cli.main(["run", "--params", str(path), "--model_dir", md]) == 0
  capsys.readouterr()
  report = (tmp_path / "md" / "compile_report.json").read_bytes()
  rc = cli.main(["run", "--params", str(path), "--model_dir", md, "runconfig.max_steps=2"])
  out, err = capsys.readouterr()
  assert rc == 1 and "Initial global step 4 already exceeds max step 2" in err, err
  assert "Preparing the training data" not in out and "Compil" not in out and "Estimat" not in out
  assert (tmp_path / "md" / "compile_report.json").read_bytes() == report
  rc = cli.main(["run", "--params", str(path), "--model_dir", md, "runconfig.max_steps=2", "--validate_only"])
  out, err = capsys.readouterr()
  assert rc == 1 and "Validation completed" not in out and "Validating" not in out
  assert "--validate_only: the run would be refused (nothing was written): " in err
  assert "Initial global step 4 already exceeds max step 2" in err
  assert (tmp_path / "md" / "compile_report.json").read_bytes() == report


@pytest.mark.slow  # about 5 s: whole runs through the CLI; .ci/run runs the slow tests
def test_validate_only_warns_of_a_data_dir_that_does_not_exist_with_the_runs_error(tmp_path, capsys):
  """--validate_only reads no data, and said nothing of a data_dir that does not exist; the run stops at
  once there. It warns (a modelzoo file is validated before its data is prepared) with the run's error."""
  nowhere = tmp_path / "nowhere"
  args = ["run", "--params", str(FC_MNIST_FILE), "--model_dir", str(tmp_path / "md")]
  args += [f"train_input.data_dir={nowhere}", "eval_input.data_dir=null", "runconfig.max_steps=1"]
  assert cli.main([*args, "--validate_only"]) == 0
  out = capsys.readouterr().out
  warning = next(line for line in out.splitlines() if line.startswith("Warning: the run will stop reading"))
  error = warning.removeprefix("Warning: the run will stop reading its data: ")
  assert error.startswith(
    f"train_input (MNISTDataProcessor, data_dir='{nowhere}'): data_dir {nowhere}: no such"
  )
  assert "Validation completed successfully" in out
  assert cli.main(args) == 1
  assert capsys.readouterr().err.strip() == f"wafer run: error: {error}"
  # eval_input is not read in mode train: no warning of it
  args[-3:-1] = ["train_input.data_dir=null", f"eval_input.data_dir={nowhere}"]
  assert cli.main([*args, "--validate_only"]) == 0
  assert "Warning: the run will stop" not in capsys.readouterr().out


@pytest.mark.parametrize(
  ("argv", "message"),
  [
    (
      ["--model_dir", "a", "runconfig.model_dir=b"],
      "runconfig.model_dir=b and --model_dir a both set runconfig.model_dir",
    ),
    (
      ["--mode", "train", "runconfig.mode=eval"],
      "runconfig.mode=eval and --mode train both set runconfig.mode",
    ),
    (["--validate_only", "runconfig.validate_only=false"], "both set runconfig.validate_only"),
    (
      ["runconfig.model_dir=runs/b #3"],
      "holds ' #3', which YAML reads as a comment: the value would be 'runs/b'",
    ),
  ],
)
def test_a_flag_and_an_override_of_its_key_or_a_value_cut_by_a_comment_are_refused(
  tmp_path, capsys, argv, message
):
  """The flag won silently (its override comes last), and ``runs/b #3`` silently became ``runs/b``."""
  path = _params_file(tmp_path)
  monkey_dir = tmp_path / "cwd"
  monkey_dir.mkdir()
  with pytest.MonkeyPatch.context() as mp:
    mp.chdir(monkey_dir)  # a run that went on would write into ./a, ./b or ./runs
    assert cli.main(["run", "--params", str(path), *argv]) == 1
  err = capsys.readouterr().err
  assert message in err, err
  assert not any(monkey_dir.iterdir())
  # the same value both ways is one answer, not a conflict
  md = str(tmp_path / "md")
  argv = ["run", "--params", str(path), "--model_dir", md, f"runconfig.model_dir={md}", "--validate_only"]
  assert cli.main(argv) == 0


@pytest.mark.parametrize("mode", ["eval", "eval_all"])
def test_eval_without_a_checkpoint_is_refused_and_creates_nothing(tmp_path, capsys, mode):
  path = _params_file(tmp_path)
  md = tmp_path / "typo"
  assert cli.main(["run", "--params", str(path), "--mode", mode, "--model_dir", str(md)]) == 1
  err = capsys.readouterr().err.strip()
  assert err == (
    f"wafer run: error: mode {mode}: no checkpoint in {md / 'checkpoints'}: train first, or point --model_dir "
    "(runconfig.model_dir) at a run's folder (runconfig.save_initial_checkpoint: true makes a training run also "
    "write checkpoint 0, the initial weights)"
  )
  assert not md.exists()


def test_a_checkpoint_folder_not_named_by_its_step_is_named_not_silently_skipped(tmp_path, capsys):
  path = _params_file(tmp_path, runconfig__max_steps=4, runconfig__checkpoint_steps=4, runconfig__log_steps=4)
  md = tmp_path / "md"
  assert cli.main(["run", "--params", str(path), "--model_dir", str(md)]) == 0
  (md / "checkpoints" / "4").rename(md / "checkpoints" / "ckpt_4")
  capsys.readouterr()
  assert cli.main(["run", "--params", str(path), "--model_dir", str(md), "--mode", "eval"]) == 1
  assert "ckpt_4 there holds a checkpoint's files, but only folders named by their step are read" in (
    capsys.readouterr().err
  )
  assert cli.main(["run", "--params", str(path), "--model_dir", str(md)]) == 0
  note = (
    f"Note: {md / 'checkpoints' / 'ckpt_4'} holds a checkpoint's files but is not read: only folders named"
  )
  assert capsys.readouterr().out.count(note) == 1


def test_sigterm_stops_a_run_as_ctrl_c_does_and_says_how_to_resume(tmp_path, capsys, monkeypatch):
  import os
  import signal

  from wafer.train import loop

  real = loop.next_batch

  def terminated_at_step_7(data, step):  # as a `timeout` or a cluster's preemption would
    if step == 6:
      os.kill(os.getpid(), signal.SIGTERM)
    return real(data, step)

  monkeypatch.setattr(loop, "next_batch", terminated_at_step_7)
  before = signal.getsignal(signal.SIGTERM)
  path = _params_file(
    tmp_path, runconfig__max_steps=10, runconfig__checkpoint_steps=4, runconfig__log_steps=4
  )
  rc = cli.main(["run", "--params", str(path), "--model_dir", str(tmp_path / "md")])
  err = capsys.readouterr().err
  assert rc == 143, err
  assert "wafer run: terminated (SIGTERM). Interrupted at step 6." in err
  assert "its newest checkpoint is step 4" in err and "Rerun the same command to resume" in err
  assert signal.getsignal(signal.SIGTERM) is before  # restored


@pytest.mark.slow  # about 5 s: whole runs through the CLI; .ci/run runs the slow tests
def test_a_resume_with_another_num_csx_is_refused_before_any_work(tmp_path, capsys):
  """fc_mnist's input pipeline shards by system: its checkpoint does not resume under another num_csx. The
  refusal came at the resume, after the data, the compile and the estimate had rewritten the compile report,
  with the pipelines' settings as a Python dict; --validate_only passed."""
  path = Path(__file__).resolve().parents[2] / "models" / "fc_mnist" / "configs" / "params_fc_mnist.yaml"
  md = str(tmp_path / "md")
  steps = ["runconfig.max_steps=2", "runconfig.checkpoint_steps=2", "runconfig.log_steps=2"]
  assert cli.main(["run", "--params", str(path), "--model_dir", md, *steps]) == 0
  capsys.readouterr()
  report = (tmp_path / "md" / "compile_report.json").read_bytes()
  more = ["runconfig.max_steps=4", "runconfig.num_csx=2"]
  rc = cli.main(["run", "--params", str(path), "--model_dir", md, *more])
  out, err = capsys.readouterr()
  assert rc == 1, err
  assert (
    "Cannot resume from the checkpoint of step 2: its input pipeline was written for runconfig.num_csx=1"
    in err
  )
  assert "{" not in err and "Preparing the training data" not in out and "Compil" not in out
  assert (tmp_path / "md" / "compile_report.json").read_bytes() == report
  rc = cli.main(["run", "--params", str(path), "--model_dir", md, *more, "--validate_only"])
  out, err = capsys.readouterr()
  assert rc == 1 and "--validate_only: the run would be refused (nothing was written): Cannot resume" in err
  assert (tmp_path / "md" / "compile_report.json").read_bytes() == report
