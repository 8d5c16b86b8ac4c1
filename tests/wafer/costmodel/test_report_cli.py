"""The report's text / JSON / PNG, Report.save, and the ``wafer estimate`` command."""

import json

import jax
import jax.numpy as jnp
import pytest

import wafer
from tests.wafer.costmodel.helpers import batch_args, mlp_params, mlp_train_step, sds
from wafer.cli import main

FILES = ("compile_report.txt", "compile_report.json", "placement.png")


@pytest.fixture(scope="module")
def pipeline_report():
  widths = [64, 512, 512, 64]
  return wafer.estimate(
    mlp_train_step(widths),
    mlp_params(widths),
    *batch_args(32, 256, 64, 64),
    batch_argnums=(1, 2),
    mode="pipeline",
    name="mlp",
  )


def test_text_follows_the_compile_report_layout(pipeline_report):
  text = pipeline_report.to_text()
  lines = text.splitlines()
  assert lines[0] == "Estimated Overall Performance"
  for i, label in enumerate(
    ("Samples/s:", "Compute Samples/s:", "Transmission Samples/s:", "Active PEs:", "Compute Utilization:"),
    start=1,
  ):
    assert lines[i].strip().startswith(label)
  header = next(line for line in lines if line.startswith("Kernel Name"))
  for column in (
    "Samples/s",
    "Compute Samples/s",
    "Transmission Samples/s",
    "Active PEs",
    "Compute Utilization",
  ):
    assert column in header
  assert all(name in text for name in ("layer0", "layer1", "layer2"))
  assert "layer pipelined" in text and "CS-2" in text


def _work_and_tokens(report):
  text = report.to_text()
  work = next(line for line in text.splitlines() if line.startswith(" Work:"))
  return work, report.tokens_per_sec, "Tokens/s" in text


@pytest.mark.parametrize("mode", ["pipeline", "weight_streaming"])
def test_forward_only_work_is_not_called_forward_and_backward(mode):
  """The Work line of an inference step said "forward + backward" beside the note "forward only"."""
  w = {"w1": sds(64, 256), "w2": sds(256, 8)}

  def forward(w, x):
    return jnp.tanh(x @ w["w1"]) @ w["w2"]

  def train(w, x):
    grads = jax.grad(lambda w: jnp.mean(forward(w, x) ** 2))(w)
    return jax.tree.map(lambda a, g: a - 0.1 * g, w, grads)

  infer = wafer.estimate(forward, w, sds(32, 16, 64), mode=mode)
  trained = wafer.estimate(train, w, sds(32, 16, 64), mode=mode)
  assert _work_and_tokens(infer)[0].endswith("(matrix products, forward only)")
  assert _work_and_tokens(trained)[0].endswith("(matrix products, forward + backward)")
  assert infer.flops_per_sample < trained.flops_per_sample


def test_tokens_per_second_only_for_a_batch_with_a_sequence_axis():
  """A float [batch, features] input (an MLP) or an image has no tokens; tokens/s used to be the
  samples/s times the feature width (or the image height)."""
  w = {"emb": sds(1000, 64), "w": sds(64, 8), "conv": sds(3, 3, 3, 8)}

  def mlp(w, x):  # x [batch, features]
    return jnp.tanh(x @ w["emb"].T[:, :64]) @ w["w"]

  def tokens(w, ids):  # ids [batch, seq] int32
    return jnp.tanh(w["emb"][ids]) @ w["w"]

  def embedded(w, x):  # x [batch, seq, features]
    return jnp.tanh(x).astype(jnp.float32) @ w["w"]

  def image(w, x):  # x [batch, h, w, c]
    return jax.lax.conv_general_dilated(
      x, w["conv"], (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )

  for fn, x, seq in [
    (mlp, sds(32, 64), None),
    (image, sds(32, 24, 24, 3), None),
    (tokens, sds(32, 128, dtype=jnp.int32), 128),
    (embedded, sds(32, 128, 64), 128),
    (embedded, sds(32, 128, 64, dtype=jnp.bfloat16), 128),
  ]:
    report = wafer.estimate(fn, w, x)
    _, rate, shown = _work_and_tokens(report)
    if seq is None:
      assert rate is None and not shown, (fn.__name__, x)
    else:
      assert rate == pytest.approx(seq * report.samples_per_sec) and shown, (fn.__name__, x)


def test_json_has_the_promised_fields(pipeline_report):
  data = json.loads(pipeline_report.to_json())
  for key in (
    "samples_per_sec",
    "compute_samples_per_sec",
    "transmission_samples_per_sec",
    "active_pes",
    "compute_utilization",
    "kernels",
    "placement",
    "calibration",
    "mode",
    "system",
  ):
    assert key in data
  assert data["samples_per_sec"] == pytest.approx(pipeline_report.samples_per_sec)
  assert len(data["placement"]) == len(pipeline_report.placement)
  assert {"name", "samples_per_sec", "active_pes"} <= set(data["kernels"][0])


def test_save_writes_the_three_files(pipeline_report, tmp_path):
  paths = pipeline_report.save(tmp_path / "model_dir")
  for name in FILES:
    path = tmp_path / "model_dir" / name
    assert path.is_file() and path.stat().st_size > 0
  assert (tmp_path / "model_dir" / "placement.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert paths["text"].endswith("compile_report.txt")


def test_the_placement_picture_leaves_the_users_matplotlib_backend_and_figures_alone(
  pipeline_report, tmp_path
):
  # A notebook's inline backend would be switched to Agg (later plt.show() showed nothing).
  import matplotlib
  import matplotlib.pyplot as plt

  before = matplotlib.get_backend()
  matplotlib.use("pdf")
  try:
    pipeline_report.plot(str(tmp_path / "p.png"))
    assert matplotlib.get_backend() == "pdf" and plt.get_fignums() == []
  finally:
    matplotlib.use(before)
  assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_save_into_a_file_is_a_wafer_error_with_the_clis_message(pipeline_report, tmp_path, capsys):
  """Report.save(path) where path is a file raised a bare FileExistsError."""
  from wafer.errors import WaferError

  afile = tmp_path / "afile"
  afile.write_text("mine")
  with pytest.raises(WaferError, match=rf"^Report.save: model_dir='{afile}' is a file, not a directory; give "
                     "a directory wafer can write$"):  # fmt: skip
    pipeline_report.save(afile)
  assert afile.read_text() == "mine"
  assert main(["estimate", "--workload", "esm2_35m", "--model_dir", str(afile)]) == 1
  assert f"--model_dir='{afile}' is a file, not a directory; give a directory wafer can write" in (
    capsys.readouterr().err
  )


def test_plot_returns_the_path_it_writes(pipeline_report, tmp_path):
  """Report.plot("x") returned "x" and wrote x.png (matplotlib adds the extension)."""
  written = pipeline_report.plot(tmp_path / "x")
  assert written == str(tmp_path / "x.png") and not (tmp_path / "x").exists()
  assert (tmp_path / "x.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert pipeline_report.plot(tmp_path / "y.png") == str(tmp_path / "y.png")


def test_a_micro_batch_run_at_the_nearest_supported_size_says_both(capsys):
  """`--micro_batch_size 34` on gpt2_small printed "micro-batch 38 as given": 34 was given."""
  assert main(["estimate", "--workload", "gpt2_small", "--micro_batch_size", "34"]) == 0
  out = capsys.readouterr().out
  assert "micro-batch 34 requested, 38 run: the nearest supported size (3 per step)" in out
  assert "as given" not in out
  assert main(["estimate", "--workload", "gpt2_small", "--micro_batch_size", "56"]) == 0
  assert "micro-batch 56 as given (2 per step)" in capsys.readouterr().out


def test_a_failed_save_leaves_the_previous_report_whole(pipeline_report, tmp_path, monkeypatch):
  model_dir = tmp_path / "model_dir"
  pipeline_report.save(model_dir)
  before = {name: (model_dir / name).read_bytes() for name in FILES}

  def full_disk(self, path):  # the disk fills in the middle of writing the picture
    with open(path, "wb") as fh:
      fh.write(b"\x89PN")
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(type(pipeline_report), "plot", full_disk)
  with pytest.raises(OSError, match="No space left"):
    pipeline_report.save(model_dir)
  after = {name: (model_dir / name).read_bytes() for name in FILES}
  assert after == before  # the half-written picture never replaced the old one
  assert sorted(p.name for p in model_dir.iterdir()) == sorted(FILES)  # no temporary files left


def test_cli_estimate_writes_the_files(tmp_path, capsys):
  rc = main(
    ["estimate", "--workload", "esm2_35m", "--mode", "weight_streaming", "--model_dir", str(tmp_path)]
  )
  out = capsys.readouterr().out
  assert rc == 0
  assert out.startswith("Estimated Overall Performance")
  for name in FILES:
    assert (tmp_path / name).is_file()
    assert f"wrote {tmp_path / name}" in out
  assert json.loads((tmp_path / "compile_report.json").read_text())["name"] == "esm2_35m"


def test_cli_lists_workloads(capsys):
  assert main(["estimate", "--list"]) == 0
  out = capsys.readouterr().out
  assert "gpt2_small" in out and "gpt3_175b" in out


@pytest.mark.parametrize(
  ("argv", "message"),
  [
    (["estimate", "--workload", "gpt2_small", "--system", "tpu"], "--system tpu is not a known system"),
    (["estimate", "--workload", "gpt2_small", "--mode", "fast"], "--mode fast;"),
    (["estimate", "--workload", "gpt2_small", "--num_csx", "3"], "--num_csx 3"),
    (["estimate", "--workload", "gpt2_small", "--batch_size", "0"], "--batch_size 0"),
    (["estimate", "--workload", "bert"], "--workload 'bert' is not a built-in workload"),
    (["estimate"], "--workload NAME"),
    (["estimate", "--params", "params.yaml"], "params.yaml: cannot read the params file"),
    (["estimate", "--workload", "gpt2_small", "model.hidden_size=64"], "overrides change a --params file"),
    # a value the workload's published run set is named as its, not as a flag the user did not give
    (
      ["estimate", "--workload", "bert_large_pipelined", "--num_csx", "2"],
      "--num_csx 2 with mode 'pipeline' (workload bert_large_pipelined's published run)",
    ),
    (
      ["estimate", "--workload", "llama3_8b_prefill", "--num_csx", "2"],
      "batch_size 1 (workload llama3_8b_prefill's published run): ",
    ),
  ],
)
def test_cli_errors_print_a_message_not_a_traceback(argv, message, capsys):
  assert main(argv) == 1  # USER_ERROR_EXIT, as for every command
  err = capsys.readouterr().err
  assert message in err and "Traceback" not in err


def test_cli_refuses_a_workload_and_a_params_file_together(capsys):
  """Both given used to estimate the params file and ignore --workload without a word."""
  with pytest.raises(SystemExit) as exc:
    main(["estimate", "--workload", "gpt2_small", "--params", "params.yaml"])
  assert exc.value.code == 2
  err = capsys.readouterr().err
  assert "not allowed with argument" in err and "Traceback" not in err


@pytest.mark.slow  # 15 s each on the 2-core CI machine; runs in the slow stage
@pytest.mark.parametrize("release", ["Release_2.3.1", "Release_2.10.0"])
def test_a_modelzoo_gpt3_file_without_max_sequence_length_is_costed_at_its_positions(
  release, tmp_path, capsys
):
  """GPT-3 XL's files set no train_input.max_sequence_length (modelzoo's HDF5 data fixes it: msl2048);
  the estimate costed 128-token samples (1.016 TFLOP a sample) and said nothing. The model's
  max_position_embeddings stands for the data's length, and the report says where the length came from."""
  path = f"tests/data/modelzoo/{release}/gpt3/params_gpt3_xl.yaml"
  assert main(["estimate", "--params", path, "--model_dir", str(tmp_path)]) == 0
  out = capsys.readouterr().out
  assert (
    " Sequence:       2,048 tokens per sample (train_input.max_sequence_length not set: model.max_position_embeddings"
    in out
  )
  data = json.loads((tmp_path / "compile_report.json").read_text())
  assert data["details"]["sequence_length"] == 2048
  assert data["flops_per_sample"] > 15e12  # 6 N s + attention at s = 2048 (128 tokens: 1.016e12)
  assert main(["estimate", "--params", path, "train_input.max_sequence_length=1024"]) == 0
  out = capsys.readouterr().out
  assert " Sequence:       1,024 tokens per sample (train_input.max_sequence_length)" in out


def test_the_sequence_line_names_the_batch_array_it_was_read_from():
  w = {"emb": sds(1000, 64), "w": sds(64, 8)}
  report = wafer.estimate(
    lambda w, batch: jnp.tanh(w["emb"][batch["ids"]]) @ w["w"], w, {"ids": sds(32, 96, dtype=jnp.int32)}
  )
  assert " Sequence:       96 tokens per sample (axis 1 of batch['ids'])" in report.to_text()
  assert report.details["sequence_source"] == "axis 1 of batch['ids']"
  mlp = wafer.estimate(lambda w, x: jnp.tanh(x @ w["w"].T), w, sds(32, 8))
  assert "Sequence:" not in mlp.to_text() and mlp.details["sequence_source"] is None


def _estimate_lines(capsys, *argv):
  assert main(["estimate", "--workload", "gpt2_small", *argv]) == 0, capsys.readouterr().err
  lines = capsys.readouterr().out.splitlines()
  pick = lambda label: [line for line in lines if line.startswith(f" {label}")]  # noqa: E731
  return pick("Mode:")[0], pick("Batch:")[0], pick("Note:           workload")


def test_cli_workload_conditions_say_they_are_the_published_runs(capsys):
  """`--workload gpt2_small` said "Mode: weight streaming (requested)": nobody requested it."""
  mode, batch, notes = _estimate_lines(capsys)
  assert mode.endswith("weight streaming (the published run's: workload gpt2_small)"), mode
  assert "micro-batch 112" in batch
  assert notes == [
    " Note:           workload gpt2_small: system wse2, mode weight_streaming, micro_batch_size 112: the "
    "published run's conditions (a flag given wins; --batch_size, --num_csx, --release or --mode drop its "
    "micro-batch, --release or --mode its mode)"
  ]


def test_cli_release_decides_the_mode_over_the_workloads_published_mode(capsys):
  """`--release 1.8` printed "weight streaming (requested)": the workload's pinned mode overrode the release."""
  mode, batch, notes = _estimate_lines(capsys, "--release", "1.8")
  assert "layer pipelined (release 1.8 runs models under 1B parameters" in mode, mode
  assert "requested" not in mode
  assert any(
    "not the published run's mode weight_streaming (--release decides the mode); micro_batch_size 112 "
    "(--release changes the run: searched)" in n
    for n in notes
  ), notes


@pytest.mark.parametrize("flags", [("--num_csx", "2"), ("--batch_size", "64")])
def test_cli_a_new_batch_or_systems_drop_the_published_micro_batch(flags, capsys):
  """`--num_csx 2` / `--batch_size 64` failed: "micro_batch_size=112 is larger than the 56 samples per
  system", a micro-batch the user never gave."""
  mode, batch, notes = _estimate_lines(capsys, *flags)
  assert "as given" not in batch and "micro-batch 112" not in batch, batch
  assert "published run's" in mode
  assert any(f"micro_batch_size 112 ({flags[0]} changes the run: searched)" in n for n in notes), notes


def test_cli_flags_given_win_over_the_workloads_conditions(capsys):
  mode, batch, notes = _estimate_lines(capsys, "--micro_batch_size", "56", "--mode", "weight_streaming")
  assert "micro-batch 56" in batch and mode.endswith("weight streaming (requested)")
  assert notes == [
    " Note:           workload gpt2_small: system wse2: the published run's conditions (a flag given wins; "
    "--batch_size, --num_csx, --release or --mode drop its micro-batch, --release or --mode its mode)"
  ]
  assert main(["estimate", "--workload", "gptj_6b_2cs2", "--mode", "pipeline"]) == 0  # was: num_csx=2 refused
  assert "not the published run's num_csx 2 (layer pipelined runs on one system)" in capsys.readouterr().out


def test_cli_help_says_how_flags_and_a_workloads_conditions_combine(capsys):
  with pytest.raises(SystemExit):
    main(["estimate", "--help"])
  text = " ".join(capsys.readouterr().out.split())
  assert "a flag given wins over the condition of the same name" in text
  assert "--batch_size, --num_csx, --release or --mode drops the published micro-batch" in text
  assert "--release or --mode drops the published mode" in text


@pytest.mark.parametrize(("flag", "expected"), [("auto", "searched: 32 is"), ("16", "micro-batch 16 ")])
def test_the_micro_batch_flag_replaces_the_files_before_it_is_checked(flag, expected, capsys):
  """GPT-3 XL's file runs micro-batches of 88; at --batch_size 32 that value does not divide the
  batch. ``--micro_batch_size`` replaces it before the file is checked (before, the file's 88 was
  refused even with ``--micro_batch_size auto``); without the flag the error says what to set."""
  path = "tests/data/modelzoo/Release_2.3.1/gpt3/params_gpt3_xl.yaml"
  assert main(["estimate", "--params", path, "--batch_size", "32", "--micro_batch_size", flag]) == 0
  assert expected in capsys.readouterr().out
  assert main(["estimate", "--params", path, "--batch_size", "32"]) != 0
  err = capsys.readouterr().err
  assert "micro_batch_size: must divide the per-system batch" in err and "or to auto" in err


def test_estimate_prints_what_the_loader_inferred_from_a_params_file(capsys):
  """``wafer run`` prints the loader's notes (a model inferred from the data processor, the release
  and its half type); ``wafer estimate --params`` printed none of them (probe)."""
  path = "tests/data/modelzoo/Release_2.3.1/gpt3/params_gpt3_xl.yaml"
  assert main(["estimate", "--params", path]) == 0
  err = capsys.readouterr().err
  assert "note: model.name is missing: using 'gpt3'" in err and "half type cbfloat16" in err


def test_cli_another_system_drops_the_published_runs_chip_conditions(capsys, monkeypatch):
  """`--workload llama3_8b_prefill --system wse3` costed the CS-3 at the WSE-2 run's 1.1 GHz (WaferLLM's
  cycle conversion) on the WSE-2 run's 720 x 720 rectangle."""
  import importlib

  from wafer.costmodel import CALIBRATION

  E = importlib.import_module("wafer.costmodel.estimate")  # the module (the package exports the function)

  assert main(["estimate", "--workload", "llama3_8b_prefill", "--system", "wse3"]) == 0
  out = capsys.readouterr().out
  assert f"{CALIBRATION.wse3_clock_hz / 1e9:g} GHz clock" in out and "720 x 720" not in out, out
  assert "not the published run's clock_hz 1.1e+09 (--system changes the chip); rect (720, 720)" in out
  # the same chip by another name keeps them (a default WSE-2 clock unlike the run's tells them apart)
  monkeypatch.setattr(E, "CALIBRATION", CALIBRATION.replace(clock_hz=0.9e9))
  assert main(["estimate", "--workload", "llama3_8b_prefill", "--system", "cs2"]) == 0
  out = capsys.readouterr().out
  assert "1.1 GHz clock" in out and "720 x 720 PEs used" in out and "--system changes the chip" not in out


def test_a_workload_value_is_named_where_its_value_is_mentioned_not_at_the_first_mention():
  from wafer.cli import _as_flags

  text = "use mode='weight_streaming' or num_csx=1: mode='pipeline' runs on num_csx=1 system"
  out = _as_flags(text, ("bert_large_pipelined", {"mode": "pipeline", "num_csx": 1}))
  assert out == (
    "use --mode weight_streaming or num_csx 1 (workload bert_large_pipelined's published run): "
    "mode 'pipeline' (workload bert_large_pipelined's published run) runs on --num_csx 1 system"
  )
