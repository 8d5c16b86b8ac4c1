"""The reference models wired to real data through the registry and the executor (issue 5).

Every run here goes the way a user's does: params YAML -> `wafer.runner.run_params` -> registry
builder (`models.registry`) -> grain pipeline -> compiled step -> metrics.jsonl. The data is real:
the embedded corpus (Python's own English documentation) for BERT and GPT, and scikit-learn's
bundled handwritten digits for fc_mnist.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import precision
from tests.devices import needs_devices
from tests.tolerances import LOSS_CURVE
from wafer import registry, runner

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_JOB = ROOT / "models" / "bert" / "configs" / "params_bert_tiny_default.yaml"
FC_MNIST = ROOT / "models" / "fc_mnist" / "configs" / "params_fc_mnist.yaml"
CURVE_STEPS = 24


def _losses(model_dir: Path) -> dict[int, float]:
  lines = (model_dir / "metrics.jsonl").read_text().splitlines()
  return {r["step"]: r["loss"] for r in map(json.loads, lines) if "loss" in r}


def _run(path: Path, model_dir: Path, *overrides: str) -> dict:
  return runner.run_params(path, [f"runconfig.model_dir={model_dir}", *overrides])


def test_registry_has_every_model_and_the_default_job():
  assert {"bert", "gpt2", "gpt3", "fc_mnist"} <= set(registry.registered())
  path, description = registry.default_job()
  assert Path(path) == DEFAULT_JOB and "BERT-tiny" in description
  plan = runner.load_plan(path)
  assert plan.params.model.name == "bert" and plan.params.train_input.data_dir is None  # the embedded corpus
  assert plan.policy.compute == precision.cbfloat16 and plan.params.optimizer.loss_scaling_factor == "dynamic"


@pytest.fixture(scope="module")
def bert_curves(tmp_path_factory):
  """BERT-tiny (the default job's config) for CURVE_STEPS steps, in float32 and in cbfloat16."""
  out = {}
  for name, mixed in (("float32", "false"), ("cbfloat16", "true")):
    model_dir = tmp_path_factory.mktemp(f"bert_{name}")
    runner.run_params(
      DEFAULT_JOB,
      [
        f"runconfig.model_dir={model_dir}",
        "runconfig.mode=train",
        f"runconfig.max_steps={CURVE_STEPS}",
        "runconfig.log_steps=1",
        f"model.mixed_precision={mixed}",
      ],
    )
    out[name] = _losses(model_dir)
  return out


@pytest.mark.slow  # two BERT-tiny runs on the embedded corpus (the module fixture): about 2.5 minutes
def test_bert_tiny_learns_the_embedded_corpus(bert_curves):
  for name, curve in bert_curves.items():
    losses = [curve[s] for s in sorted(curve)]
    assert len(losses) == CURVE_STEPS
    first, last = np.mean(losses[:4]), np.mean(losses[-4:])
    assert last < first - 1.0, (name, losses)  # from ~9.7 (ln 8192 + ln 2) down by well over a nat


@pytest.mark.slow  # shares the two BERT-tiny runs above
def test_cbfloat16_tracks_float32_loss_curve(bert_curves):
  f32, cb16 = bert_curves["float32"], bert_curves["cbfloat16"]
  steps = sorted(f32)
  rel = np.array([abs(cb16[s] - f32[s]) / abs(f32[s]) for s in steps])
  tol = LOSS_CURVE["cbfloat16"]
  assert rel.max() <= tol.rtol, (tol.reason, rel)
  # rounding happened: the cbfloat16 curve is not the float32 one
  assert rel.max() > 2.0**-16 and np.count_nonzero(rel) > len(rel) // 2, rel


GPT2_TINY = ROOT / "models" / "gpt2" / "configs" / "params_gpt2_tiny.yaml"


@pytest.mark.slow  # GPT-2-tiny on the embedded corpus: about 2 minutes
def test_gpt2_tiny_learns_the_embedded_corpus(tmp_path):
  summary = _run(
    GPT2_TINY,
    tmp_path,
    "runconfig.max_steps=30",
    "runconfig.log_steps=1",
    "runconfig.mode=train_and_eval",
    "runconfig.eval_frequency=30",
    "runconfig.checkpoint_steps=30",
    "runconfig.eval_steps=2",
    "model.vocab_size=4096",
  )  # the tokenizer's vocabulary follows the model's
  losses = list(_losses(tmp_path).values())
  assert len(losses) == 30 and abs(losses[0] - np.log(4096)) < 1.0  # starts near uniform over the vocabulary
  assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 1.0, losses
  ((step, eval_loss),) = summary["evals"]
  assert step == 30 and eval_loss < losses[0] - 1.0  # held-out documents
  # a fresh run in another model_dir (its own tokenizer and examples) reproduces the losses exactly
  _run(
    GPT2_TINY,
    tmp_path / "again",
    "runconfig.max_steps=3",
    "runconfig.log_steps=1",
    "runconfig.mode=train",
    "model.vocab_size=4096",
  )
  assert list(_losses(tmp_path / "again").values()) == losses[:3]


@pytest.mark.slow  # over 5 s; .ci/run runs the slow tests
def test_fc_mnist_learns_the_digits(tmp_path):
  """The shipped config's own values train (modelzoo's stay at loss 2.30 for 1000 steps)."""
  summary = _run(
    FC_MNIST,
    tmp_path,
    "runconfig.max_steps=60",
    "runconfig.log_steps=1",
    "runconfig.mode=train_and_eval",
    "runconfig.eval_frequency=60",
    "runconfig.checkpoint_steps=60",
  )
  losses = list(_losses(tmp_path).values())
  assert np.mean(losses[-5:]) < 0.85 * np.mean(losses[:5]), losses
  ((step, accuracy),) = summary["evals"]
  assert step == 60 and accuracy > 0.2  # chance is 0.1


FAST = (
  "train_input.batch_size=32",
  "optimizer.learning_rate=0.05",
  "optimizer.momentum=0.9",
  "runconfig.log_steps=1",
  "model.mixed_precision=false",
)


def test_first_step_trains_on_batch_zero(tmp_path):
  """The executor takes its compile example from the source and rewinds it: step 1 sees batch 0."""
  import jax

  from wafer.data.processors import train_source

  _run(FC_MNIST, tmp_path, *FAST, "runconfig.max_steps=1")
  plan = runner.load_plan(FC_MNIST, [f"runconfig.model_dir={tmp_path}", *FAST])
  batch0 = train_source(plan.params.train_input, seed=plan.seed).batch_at(0)
  expected = float(plan.task.loss_fn(plan.task.init_params(jax.random.key(plan.seed)), batch0))
  assert _losses(tmp_path)[1] == pytest.approx(expected, rel=1e-6)


@pytest.mark.slow  # three real-data runs (resume, eval_all, num_csx=2): about 45 s
def test_resume_eval_all_and_two_systems_on_real_data(tmp_path, capsys):
  needs_devices(2)  # the num_csx=2 run takes 2 devices of the default backend (one GPU has one)
  straight = _run(FC_MNIST, tmp_path / "straight", *FAST, "runconfig.max_steps=20")
  _run(FC_MNIST, tmp_path / "parts", *FAST, "runconfig.max_steps=10", "runconfig.checkpoint_steps=10")
  resumed = _run(
    FC_MNIST, tmp_path / "parts", *FAST, "runconfig.max_steps=20", "runconfig.checkpoint_steps=10"
  )
  assert resumed["final_step"] == 20 and "Resuming from the checkpoint at step 10." in capsys.readouterr().out
  for x, y in zip(_leaves(straight["params"]), _leaves(resumed["params"])):
    np.testing.assert_array_equal(x, y)
  evals = _run(FC_MNIST, tmp_path / "parts", *FAST, "runconfig.mode=eval_all")["eval_all"]
  assert sorted(evals) == [10, 20] and all(0.0 <= a <= 1.0 for a in evals.values())
  two = _run(FC_MNIST, tmp_path / "two", *FAST, "runconfig.max_steps=3", "runconfig.num_csx=2")
  assert two["final_step"] == 3 and len(_losses(tmp_path / "two")) == 3
  from wafer.train import ExecutorError

  with pytest.raises(
    ExecutorError,
    match=r"Cannot resume from the checkpoint of step 20: .*batch_size.*use a new "
    r"model_dir",
  ):
    _run(FC_MNIST, tmp_path / "parts", *FAST, "runconfig.max_steps=30", "train_input.batch_size=16")
  with pytest.raises(
    ExecutorError,
    match=r"checkpoint of step 20 .* does not fit this model: params/last_layer/"
    r"kernel: checkpoint \(50, 10\), model \(40, 10\)",
  ):
    _run(FC_MNIST, tmp_path / "parts", *FAST, "runconfig.mode=eval", "model.hidden_size=40")
  with pytest.raises(ExecutorError, match="mode eval: no checkpoint in .*empty.*checkpoints: train first"):
    _run(FC_MNIST, tmp_path / "empty", *FAST, "runconfig.mode=eval")
  assert not (tmp_path / "empty").exists()  # nothing created


def _leaves(tree) -> list:
  import jax

  return [np.asarray(x) for x in jax.tree.leaves(tree)]


@pytest.mark.slow  # over 5 s; .ci/run runs the slow tests
def test_data_errors_name_the_section(tmp_path):
  from wafer.data import DataError

  with pytest.raises(
    DataError,
    match=r"train_input \(BertCSVDynamicMaskDataProcessor, data_dir='.*nowhere'\).*(not found|no such file or directory)",
  ):
    _run(DEFAULT_JOB, tmp_path, f"train_input.data_dir={tmp_path / 'nowhere'}", "runconfig.max_steps=1")
  from wafer.config import ConfigError

  # the MNIST processor's strict schema rejects the BERT keys before any data is read
  with pytest.raises(ConfigError, match=r"line \d+: train_input.max_predictions_per_seq: unknown key"):
    _run(DEFAULT_JOB, tmp_path, "train_input.data_processor=MNISTDataProcessor", "runconfig.max_steps=1")
  with pytest.raises(
    DataError,
    match=r"train_input.data_processor: 'MNISTDataProcessor' does not feed the fc_mnist|does not feed the bert",
  ):
    _run(
      DEFAULT_JOB,
      tmp_path,
      "train_input.data_processor=MNISTDataProcessor",
      "train_input.max_predictions_per_seq=null",
      "runconfig.max_steps=1",
    )
  # a model vocabulary below the data's is refused by the params check, before any data is read
  # (the data check below catches ids beyond it that the file's sizes do not predict)
  with pytest.raises(
    ConfigError, match=r"model.vocab_size \(from override 'model.vocab_size=100'\): must be at least"
  ):
    _run(
      DEFAULT_JOB, tmp_path, "model.vocab_size=100", "train_input.vocab_size=8192", "runconfig.max_steps=1"
    )
  with pytest.raises(DataError, match=r"split='bogus'; allowed: train, or val, eval, test, validation"):
    _run(FC_MNIST, tmp_path, "train_input.split=bogus", "runconfig.max_steps=1")
  # labels beyond the model's classes would index logits that do not exist (JAX clamps silently)
  with pytest.raises(DataError, match=r"labels 0\.\.9 are outside 0\.\.4 \(model.num_classes=5\)"):
    _run(FC_MNIST, tmp_path, "model.num_classes=5", "runconfig.max_steps=1")


def test_negative_token_ids_are_an_error_naming_the_section():
  from models.registry import _check_tokens
  from wafer.data import DataError

  ids = np.array([[5, 3, -1, 7]], np.int32)
  with pytest.raises(
    DataError, match=r"train_input: token id -1 is negative.*0 to model.vocab_size - 1 = 99"
  ):
    _check_tokens({"input_ids": ids}, 100, 512, "train_input")
  _check_tokens({"input_ids": np.abs(ids)}, 100, 512, "train_input")  # in range: no error
  with pytest.raises(
    DataError, match=r"token id 120 is outside model.vocab_size=100; set model.vocab_size to at least"
  ):
    _check_tokens({"input_ids": np.array([[5, 120, 7]], np.int32)}, 100, 512, "train_input")


@pytest.mark.slow  # over 5 s; .ci/run runs the slow tests
def test_analyze_input_recommends_workers(tmp_path, capsys):
  from wafer import cli

  rc = cli.main(
    [
      "analyze-input",
      "--params",
      str(FC_MNIST),
      "--workers",
      "1",
      "2",
      "--seconds",
      "0.3",
      "--consumer",
      "measured",
      "--model_dir",
      str(tmp_path),
    ]
  )
  out = capsys.readouterr().out
  assert rc == 0, out
  report = json.loads((tmp_path / "input_analysis.json").read_text())
  assert [r["num_workers"] for r in report["rates"]] == [1, 2]
  assert all(r["samples_per_s"] > 0 for r in report["rates"]) and report["consumption_samples_per_s"] > 0
  from wafer.data.analyze import WorkerRate, recommend_workers

  rates = [WorkerRate(**r) for r in report["rates"]]
  assert report["recommendation"] == recommend_workers(rates, report["consumption_samples_per_s"])
  assert (
    f"Recommendation: runconfig.num_workers_per_csx: {report['recommendation']['num_workers_per_csx']}" in out
  )
  assert "measured step rate" in out


def _write_idx(path: Path, array: np.ndarray) -> None:
  import gzip

  header = bytes([0, 0, 8, array.ndim]) + np.asarray(array.shape, ">i4").tobytes()
  with gzip.open(path, "wb") as f:
    f.write(header + array.astype(np.uint8).tobytes())


def test_mnist_idx_files_in_data_dir(tmp_path):
  from wafer.config.schema import InputConfig
  from wafer.data import DataError, processors

  rng = np.random.default_rng(0)
  for prefix, n in (("train", 40), ("t10k", 12)):
    _write_idx(tmp_path / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
    _write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte.gz", np.arange(n) % 10)
  cfg = InputConfig(data_processor="MNISTDataProcessor", data_dir=str(tmp_path), batch_size=8)
  batch = next(processors.train_source(cfg, seed=0))
  assert (
    batch["images"].shape == (8, 784) and batch["images"].max() <= 1.0 and batch["labels"].dtype == np.int32
  )
  assert len(processors.eval_source(cfg, seed=0)) == 12
  (tmp_path / "empty").mkdir()
  with pytest.raises(
    DataError,
    match=r"no train-images-idx3-ubyte\[.gz\] in .*remove data_dir to use "
    r"scikit-learn's bundled digits",
  ):
    processors.train_source(cfg.model_copy(update={"data_dir": str(tmp_path / "empty")}), seed=0)
  with pytest.raises(DataError, match=r"data_dir .*nowhere: no such file or directory"):
    processors.train_source(cfg.model_copy(update={"data_dir": str(tmp_path / "nowhere")}), seed=0)
  (tmp_path / "none").mkdir()  # IDX files of 0 examples: said so, not numpy's reshape message
  _write_idx(tmp_path / "none" / "train-images-idx3-ubyte.gz", np.zeros((0, 28, 28), np.uint8))
  _write_idx(tmp_path / "none" / "train-labels-idx1-ubyte.gz", np.zeros((0,), np.uint8))
  with pytest.raises(DataError, match=r"train-images-idx3-ubyte.gz: holds no examples"):
    processors.train_source(cfg.model_copy(update={"data_dir": str(tmp_path / "none")}), seed=0)
  (tmp_path / "bad").mkdir()
  (tmp_path / "bad" / "train-images-idx3-ubyte").write_bytes(b"\x01\x02\x03\x04")
  (tmp_path / "bad" / "train-labels-idx1-ubyte").write_bytes(b"\x01\x02\x03\x04")
  with pytest.raises(DataError, match="not an IDX file"):
    processors.train_source(cfg.model_copy(update={"data_dir": str(tmp_path / "bad")}), seed=0)
  # a .gz that is not gzip, and one cut short: the error names the file (gzip's own messages do not)
  whole = (tmp_path / "train-images-idx3-ubyte.gz").read_bytes()
  for name, damaged in (("garbage", b"!\x8a" + bytes(64)), ("truncated", whole[: len(whole) // 2])):
    (tmp_path / name).mkdir()
    (tmp_path / name / "train-images-idx3-ubyte.gz").write_bytes(damaged)
    (tmp_path / name / "train-labels-idx1-ubyte.gz").write_bytes(
      (tmp_path / "train-labels-idx1-ubyte.gz").read_bytes()
    )
    with pytest.raises(DataError, match=rf"{name}/train-images-idx3-ubyte.gz: .*copy it again"):
      processors.train_source(cfg.model_copy(update={"data_dir": str(tmp_path / name)}), seed=0)


def test_num_epochs_runs_one_pass_over_each_input_workers_shard(tmp_path):
  from models.fc_mnist.data import digits_features

  examples = len(digits_features("train")["labels"])
  workers = 3
  shard = examples // workers  # the smallest shard: worker w holds examples w, w + 3, ...
  expected = workers * (shard // 32)  # batch 32, drop_last: each worker's full batches
  summary = _run(
    FC_MNIST,
    tmp_path,
    "runconfig.num_epochs=1",
    "runconfig.max_steps=null",
    f"runconfig.num_workers_per_csx={workers}",
    "runconfig.log_steps=1000",
  )
  assert summary["final_step"] == expected


@pytest.mark.slow  # builds the embedded corpus at MSL 64 and trains two steps: about 25 s
def test_bert_max_predictions_per_seq_is_the_datas_masked_positions(tmp_path):
  """A modelzoo file's max_predictions_per_seq is how many positions its examples mask (Release_1.9.1's
  MSL10k BERT gives 1538 where the usual rule gives 1539): the spec and the examples made here follow it."""
  from wafer.data.processors import train_source

  overrides = ["train_input.max_sequence_length=64", "train_input.max_predictions_per_seq=7"]
  plan = runner.load_plan(DEFAULT_JOB, [f"runconfig.model_dir={tmp_path}", *overrides])
  batch = train_source(plan.params.train_input, seed=plan.seed).batch_at(0)
  assert plan.params.train_input.example_spec()["masked_lm_positions"][0] == (7,)
  for key in ("masked_lm_positions", "masked_lm_labels", "masked_lm_weights"):
    assert batch[key].shape[1:] == (7,), (key, batch[key].shape)
  assert batch["masked_lm_weights"].sum(axis=1).max() <= 7
  _run(DEFAULT_JOB, tmp_path, *overrides, "runconfig.max_steps=2", "runconfig.eval_steps=1")
  assert set(_losses(tmp_path)) >= {1, 2}


def test_without_max_sequence_length_the_sequences_are_the_models_max_position_embeddings(tmp_path):
  """A modelzoo file without train_input.max_sequence_length means the data's length (its HDF5 fixes
  it); the tasks took 128 tokens. The model's max_position_embeddings stands for it (BERT and GPT), and
  a BERT section is checked again at that length."""
  from models.registry import DataConfigError

  for config, extra, length in [
    (GPT2_TINY, ["model.max_position_embeddings=96"], 96),
    (DEFAULT_JOB, ["train_input.max_predictions_per_seq=80"], 512),  # BERT-tiny's 512 positions
  ]:
    overrides = [f"runconfig.model_dir={tmp_path}", "train_input.max_sequence_length=null", *extra]
    spec = runner.load_plan(config, overrides).task.batch_spec()
    assert spec["input_ids"].shape[1] == length, config
  overrides = [f"runconfig.model_dir={tmp_path}", "train_input.max_sequence_length=null"]
  too_few = ["model.max_position_embeddings=64", "train_input.max_predictions_per_seq=80"]
  with pytest.raises(DataConfigError, match=r"train_input.max_sequence_length: not in the params file, so "
                     r"model.max_position_embeddings=64 stands for it, and then: max_predictions_per_seq=80"):  # fmt: skip
    runner.load_plan(DEFAULT_JOB, overrides + too_few)


@pytest.mark.slow  # about 5 s; .ci/run runs the slow tests
def test_analyze_input_against_a_step_that_does_not_fit_has_no_rate_to_feed(tmp_path, monkeypatch):
  """A train step the cost model finds does not fit has no wafer rate: an error saying why and what
  to do, not "Model consumes 0.0 samples/s"."""
  import dataclasses

  import wafer
  from wafer import input_analyzer

  real = wafer.estimate

  def not_fitting(*args, **kwargs):
    r = real(*args, **kwargs)
    return dataclasses.replace(
      r,
      fits=False,
      samples_per_sec=None,
      reason="32 GB of activations exceed 27.5 GB",
      remedy="micro_batch_size 8",
    )

  monkeypatch.setattr(wafer, "estimate", not_fitting)
  plan = runner.load_plan(FC_MNIST, [f"runconfig.model_dir={tmp_path}"])
  with pytest.raises(
    input_analyzer.InputAnalysisError, match=r"does not fit \(32 GB.*would fit: micro_batch_size 8"
  ):
    input_analyzer.analyze(plan, seconds=0.05)


# ---- index features out of range: JAX wraps or clamps them silently, the data check does not ----

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.values import examples  # noqa: E402


def _bert_features(n=3, msl=16, mmp=4, vocab=100):
  rng = np.random.default_rng(0)
  return {
    "input_ids": rng.integers(0, vocab, (n, msl)).astype(np.int32),
    "attention_mask": np.ones((n, msl), np.int32),
    "token_type_ids": np.zeros((n, msl), np.int32),
    "masked_lm_positions": rng.integers(0, msl, (n, mmp)).astype(np.int32),
    "masked_lm_labels": rng.integers(0, vocab, (n, mmp)).astype(np.int32),
    "masked_lm_weights": np.ones((n, mmp), np.float32),
    "next_sentence_label": rng.integers(0, 2, (n,)).astype(np.int32),
  }


def _gpt_features(n=3, msl=16, vocab=100):
  rng = np.random.default_rng(1)
  ids = rng.integers(0, vocab, (n, msl + 1)).astype(np.int32)
  return {"input_ids": ids[:, :-1], "labels": ids[:, 1:], "attention_mask": np.ones((n, msl), np.int32)}


class _Model:  # the fields the data check reads
  vocab_size, num_segments = 100, 2


@settings(max_examples=examples(25), deadline=None)
@given(
  kind=st.sampled_from(["bert", "gpt"]),
  data=st.data(),
  below=st.booleans(),
  example=st.integers(0, 2),
)
def test_an_index_feature_out_of_its_range_is_an_error_naming_it_and_the_example(kind, data, below, example):
  from models.registry import _check_ranges, _token_ranges
  from wafer.data import DataError

  features = _bert_features() if kind == "bert" else _gpt_features()
  ranges = _token_ranges(kind, _Model, 16)
  _check_ranges(features, ranges, "train_input")  # the data as written: no error
  key = data.draw(st.sampled_from(sorted(ranges)))
  low, high, _ = ranges[key]
  value = data.draw(st.integers(-(2**20), low - 1) if below else st.integers(high, 2**20))
  bad = {k: v.copy() for k, v in features.items()}
  row = bad[key][example]
  if row.ndim:
    row[data.draw(st.integers(0, row.size - 1))] = value
  else:
    bad[key][example] = value
  with pytest.raises(
    DataError,
    match=rf"train_input: {key} holds {value} \(example {example} of the data.*\), outside {low}\.\.{high - 1}",
  ):
    _check_ranges(bad, ranges, "train_input")


def test_index_features_are_checked_when_the_data_is_prepared(tmp_path):
  """Through a params file and the real HDF5 reader: -100 labels (PyTorch's ignore index), a
  negative weight, NaN or fractional ids and int64 ids beyond int32 are refused before training."""
  from wafer.data import DataError

  def prepare(**changes):
    folder = tmp_path / f"d{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    features = {**_bert_features(n=4, msl=128, mmp=20, vocab=8192), **changes}
    import h5py

    with h5py.File(folder / "data.h5", "w") as f:
      for k, v in features.items():
        f.create_dataset(k, data=v)
    plan = runner.load_plan(
      DEFAULT_JOB,
      [
        "train_input.data_processor=BertHDF5DataProcessor",
        f"train_input.data_dir={folder}",
        "train_input.batch_size=2",
      ],
    )
    return plan.task.train_data(0)

  prepare()  # the data as written: no error
  labels = _bert_features(n=4, msl=128, mmp=20, vocab=8192)["masked_lm_labels"]
  labels[2, 3] = -100
  with pytest.raises(DataError, match=r"masked_lm_labels holds -100 \(example 2 of the data.*not -100"):
    prepare(masked_lm_labels=labels)
  with pytest.raises(DataError, match=r"masked_lm_weights holds -1.0"):
    prepare(masked_lm_weights=-np.ones((4, 20), np.float32))
  ids = _bert_features(n=4, msl=128, mmp=20, vocab=8192)["input_ids"].astype(np.float64)
  for value, message in ((np.nan, "nan, not a whole number"), (7.5, "7.5, not a whole number")):
    bad = ids.copy()
    bad[1, 1] = value
    with pytest.raises(DataError, match=rf"input_ids holds {message}"):
      prepare(input_ids=bad)
  wide = ids.astype(np.int64)
  wide[0, 0] = 2**32 + 7  # would wrap to token 7
  with pytest.raises(DataError, match=r"input_ids holds 4294967303, outside int32"):
    prepare(input_ids=wide)


@pytest.mark.slow  # about 5 s; .ci/run runs the slow tests
def test_analyze_input_keeps_the_counts_it_measured_when_more_workers_hold_less_than_a_batch(tmp_path):
  """A probe: ``--workers 1 2 4`` at batch 500 of 1,438 examples measured 1 and 2 workers, then died in
  a raw traceback at 4 (a worker's shard of 360 examples holds no batch), writing nothing. The counts
  measured are kept and the others named; with no count that runs, one error."""
  from wafer import input_analyzer

  plan = runner.load_plan(
    FC_MNIST, [f"runconfig.model_dir={tmp_path}", "train_input.data_dir=null", "train_input.batch_size=500"]
  )
  analysis = input_analyzer.analyze(plan, worker_counts=[1, 2, 4], seconds=0.05)
  assert [r.num_workers for r in analysis.rates] == [1, 2]
  assert (
    analysis.skipped.startswith("4 workers: a worker would hold") and "batch_size=500" in analysis.skipped
  )
  assert "Not measured: 4 workers" in analysis.to_text()
  assert analysis.to_dict()["skipped"] == analysis.skipped
  with pytest.raises(input_analyzer.InputAnalysisError, match=r"^8 worker\(s\): .*fewer than batch_size=500"):
    input_analyzer.analyze(plan, worker_counts=[8], seconds=0.05)
