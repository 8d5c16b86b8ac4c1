"""Input pipelines: sharding, per-worker seeds, exact resume, sources and example creation."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from models.bert import data as bert
from models.bert.data import MASK_ID, NUM_SPECIAL, bert_features
from models.fc_mnist.data import digits_features
from tests.samples import small_corpus
from wafer.data import text
from wafer.data.pipeline import ArraySource, GrainBatchSource, one_pass, shard_indices, worker_seeds


def _src(n: int) -> ArraySource:
  return ArraySource({"id": np.arange(n), "sq": np.arange(n)[:, None] * np.ones((1, 3), np.int64)})


@pytest.mark.parametrize("n,workers", [(100, 1), (101, 3), (64, 4), (7, 7)])
def test_shards_partition_the_examples(n, workers):
  shards = [shard_indices(n, w, workers) for w in range(workers)]
  assert sorted(np.concatenate(shards).tolist()) == list(range(n))
  assert max(map(len, shards)) - min(map(len, shards)) <= 1


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_each_example_once_per_epoch_across_workers(workers):
  n, bs = 60, 5  # every shard divides into whole batches: an epoch is exactly n examples
  p = GrainBatchSource(_src(n), bs, seed=3, num_workers_per_csx=workers)
  per_epoch = n // bs
  for _ in range(3):  # three epochs, each a permutation of the data
    ids = np.concatenate([next(p)["id"] for _ in range(per_epoch)])
    assert sorted(ids.tolist()) == list(range(n))


def test_drop_last_drops_only_each_workers_remainder():
  n, bs, workers = 23, 4, 2  # shards of 12 and 11: 3 and 2 batches per epoch
  p = GrainBatchSource(_src(n), bs, seed=0, num_workers_per_csx=workers)
  w0 = [p.workers[0][j] for j in range(3)]
  assert len(set(np.concatenate(w0).tolist())) == 12 and set(np.concatenate(w0).tolist()) <= set(
    range(0, n, 2)
  )
  w1 = [p.workers[1][j] for j in range(2)]
  assert len(set(np.concatenate(w1).tolist())) == 8 and set(np.concatenate(w1).tolist()) <= set(
    range(1, n, 2)
  )
  # without drop_last the stream runs across the epoch boundary: 24 examples = all 12 of worker 0, then 12 more
  q = GrainBatchSource(_src(n), bs, seed=0, num_workers_per_csx=workers, drop_last=False)
  first = np.concatenate([q.workers[0][j] for j in range(3)])
  assert sorted(first.tolist()) == list(range(0, n, 2))


def test_reshuffles_every_epoch_and_differs_from_unshuffled():
  p = GrainBatchSource(_src(40), 40, seed=1)
  e0, e1 = next(p)["id"], next(p)["id"]
  assert sorted(e0.tolist()) == sorted(e1.tolist()) == list(range(40))
  assert not np.array_equal(e0, e1) and not np.array_equal(e0, np.arange(40))
  q = GrainBatchSource(_src(40), 40, seed=1, shuffle=False)
  assert np.array_equal(next(q)["id"], np.arange(40))


def test_worker_seeds_reproducible_and_distinct():
  assert worker_seeds(7, 4) == worker_seeds(7, 4)
  assert len(set(worker_seeds(7, 8))) == 8
  assert worker_seeds(7, 4) != worker_seeds(8, 4)
  assert all(0 <= s < 2**32 for s in worker_seeds(123456789012, 16))
  # two workers of one run shuffle differently; the same run reproduces its batches
  a = GrainBatchSource(_src(100), 10, seed=5, num_workers_per_csx=2)
  b = GrainBatchSource(_src(100), 10, seed=5, num_workers_per_csx=2)
  c = GrainBatchSource(_src(100), 10, seed=6, num_workers_per_csx=2)
  ba, bb, bc = ([next(s)["id"] for _ in range(6)] for s in (a, b, c))
  assert all(np.array_equal(x, y) for x, y in zip(ba, bb))
  assert not all(np.array_equal(x, y) for x, y in zip(ba, bc))
  order0 = np.argsort(np.argsort(ba[0]))  # rank pattern of worker 0's first batch vs worker 1's
  order1 = np.argsort(np.argsort(ba[1]))
  assert not np.array_equal(order0, order1)


@pytest.mark.parametrize("workers,stop", [(1, 0), (1, 5), (3, 7), (4, 13)])
def test_resume_reproduces_next_batches(workers, stop):
  kw = dict(seed=11, num_workers_per_csx=workers)
  ref = GrainBatchSource(_src(97), 8, **kw)
  expected = [next(ref) for _ in range(stop + 10)][stop:]
  run = GrainBatchSource(_src(97), 8, **kw)
  for _ in range(stop):
    next(run)
  state = json.loads(json.dumps(run.get_state()))  # JSON round trip, as in a checkpoint
  resumed = GrainBatchSource(_src(97), 8, **kw)
  resumed.set_state(state)
  got = [next(resumed) for _ in range(10)]
  for e, g in zip(expected, got):
    assert e.keys() == g.keys() and all(np.array_equal(e[k], g[k]) for k in e)
  assert resumed.get_state()["next_batch"] == stop + 10


def test_resume_refuses_another_pipeline():
  a = GrainBatchSource(_src(50), 5, seed=1, num_workers_per_csx=2)
  next(a)
  with pytest.raises(ValueError, match="different pipeline.*num_workers"):
    GrainBatchSource(_src(50), 5, seed=1, num_workers_per_csx=3).set_state(a.get_state())
  with pytest.raises(ValueError, match="version"):
    a.set_state({"step": 3})
  for bad in (-5, 2.5, True, "3"):  # a position that is no batch number (negative ones were yielded)
    with pytest.raises(ValueError, match=r"next_batch=.*; allowed: a batch number >= 0"):
      a.set_state({**a.get_state(), "next_batch": bad})


@pytest.mark.parametrize("where", [0, 17, 49])
def test_resume_refuses_the_same_shapes_with_other_values(where):
  """Swapped training files of the same size were resumed without a word: batch k was another batch."""
  a = GrainBatchSource(_src(50), 5, seed=1)
  next(a)
  state = a.get_state()
  other = _src(50)
  other.features["id"] = other.features["id"].copy()
  other.features["id"][where] += 1000  # one example changed (the first, one inside, the last)
  changed = GrainBatchSource(other, 5, seed=1)
  with pytest.raises(ValueError, match="the training data changed since the checkpoint was written"):
    changed.set_state(state)  # 50 examples: every one is among the 256 hashed
  GrainBatchSource(_src(50), 5, seed=1).set_state(state)  # the same data: resumes
  old = {**state, "pipeline": {k: v for k, v in state["pipeline"].items() if k != "contents"}}
  GrainBatchSource(_src(50), 5, seed=1).set_state(old)  # a checkpoint from before contents were recorded


def test_fixed_batch_shapes_and_errors():
  p = GrainBatchSource(_src(13), 4, seed=0, num_workers_per_csx=2)
  for _ in range(20):
    b = next(p)
    assert b["id"].shape == (4,) and b["sq"].shape == (4, 3)
  with pytest.raises(ValueError, match="fewer than batch_size"):
    GrainBatchSource(_src(10), 8, num_workers_per_csx=2)
  with pytest.raises(ValueError, match="differ in number of examples"):
    ArraySource({"a": np.zeros(3), "b": np.zeros(4)})
  assert [len(b["id"]) for b in one_pass(_src(10), 4, drop_last=False)] == [4, 4, 2]
  assert [len(b["id"]) for b in one_pass(_src(10), 4)] == [4, 4]


def test_worker_processes_do_not_change_the_output():
  kw = dict(seed=2, num_workers_per_csx=2)
  ref = GrainBatchSource(_src(64), 4, **kw)
  expected = [next(ref)["id"] for _ in range(12)]
  mp = GrainBatchSource(_src(64), 4, num_processes=2, **kw)
  try:
    mp.set_state(ref.get_state() | {"next_batch": 3})  # resume, with worker processes, at batch 3
    got = expected[:3] + [next(mp)["id"] for _ in range(9)]
  finally:
    mp.close()
  assert all(np.array_equal(e, g) for e, g in zip(expected, got))


def test_mlm_nsp_invariants():
  tok = text.train_bert_tokenizer(small_corpus(), 200)
  docs = text.tokenize_documents(tok, small_corpus())
  f = bert.create_mlm_nsp_examples(
    docs,
    msl=32,
    vocab_size=tok.get_vocab_size(),
    cls_id=2,
    sep_id=3,
    mask_id=4,
    num_special=5,
    seed=0,
    dupe_factor=20,
  )
  n = len(f["input_ids"])
  assert n > 100 and f["input_ids"].shape == (n, 32) and f["masked_lm_positions"].shape[0] == n
  lengths = f["attention_mask"].sum(1)
  assert np.all(f["input_ids"][:, 0] == 2)
  assert np.all(f["input_ids"][np.arange(n), lengths - 1] == 3)
  assert np.all(f["input_ids"][f["attention_mask"] == 0] == 0)
  w = f["masked_lm_weights"]
  num = w.sum(1)
  assert np.all(num == np.minimum(f["masked_lm_positions"].shape[1], np.maximum(1, np.round(lengths * 0.15))))
  assert abs(num.sum() / lengths.sum() - 0.15) < 0.03
  pos, labels = f["masked_lm_positions"], f["masked_lm_labels"]
  real = w > 0
  assert np.all(pos[~real] == 0) and np.all(labels[~real] == 0)
  assert np.all(labels[real] >= 5)  # never a special token
  assert np.all(pos[real] < np.repeat(lengths[:, None], pos.shape[1], 1)[real])
  got = f["input_ids"][np.arange(n)[:, None].repeat(pos.shape[1], 1)[real], pos[real]]
  frac_mask = np.mean(got == MASK_ID)
  frac_kept = np.mean(got == labels[real])
  assert 0.75 < frac_mask < 0.85 and 0.07 < frac_kept < 0.16
  # outside the masked positions, inputs are the tokens themselves (specials only at CLS/SEP/PAD)
  masked = np.zeros_like(f["input_ids"], bool)
  np.put_along_axis(masked, pos, real, axis=1)
  unmasked = f["input_ids"][(~masked) & (f["attention_mask"] == 1)]
  assert set(np.unique(unmasked[unmasked < NUM_SPECIAL]).tolist()) <= {2, 3}
  nsp = f["next_sentence_label"]
  assert 0.2 < nsp.mean() < 0.8
  assert np.all((f["token_type_ids"] == 1).sum(1) > 0)


def test_tokenizer_trains_and_caches(tmp_path):
  tok = text.train_bert_tokenizer(small_corpus(), 150, tmp_path)
  files = os.listdir(tmp_path)
  assert len(files) == 1 and files[0].startswith("bert-bpe-150-")
  assert [tok.token_to_id(t) for t in text.SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
  mtime = os.path.getmtime(tmp_path / files[0])
  again = text.train_bert_tokenizer(small_corpus(), 150, tmp_path)
  assert os.path.getmtime(tmp_path / files[0]) == mtime
  assert again.encode("sentence of document").ids == tok.encode("sentence of document").ids


@pytest.mark.slow  # over 5 s; .ci/run runs the slow tests
def test_tokenizer_training_is_deterministic():
  """Two trainings on the embedded corpus give one vocabulary (tokenizers' WordPiece trainer fails this:
  huggingface/tokenizers#1794), so two fresh runs of the default job see the same data."""
  docs = text.embedded_corpus()
  for train in (text.train_bert_tokenizer, text.train_bpe):  # BERT's and GPT's
    vocabs = [train(docs, 8192).get_vocab() for _ in range(3)]
    assert len(vocabs[0]) == 8192 and vocabs[1] == vocabs[0] and vocabs[2] == vocabs[0], train.__name__


def test_hdf5_and_csv_round_trip(tmp_path):
  f = _bert_examples()
  bert.write_hdf5(tmp_path / "a.h5", f)
  bert.write_csv(tmp_path / "b.csv", f)
  for got in (bert.read_hdf5(tmp_path / "a.h5"), bert.read_csv(tmp_path / "b.csv")):
    assert all(np.array_equal(got[k], f[k]) and got[k].dtype == f[k].dtype for k in bert.FEATURES)
  both = bert_features(tmp_path, msl=24)
  assert len(both["input_ids"]) == 2 * len(f["input_ids"])
  with pytest.raises(ValueError, match="max_sequence_length is 128"):
    bert_features(tmp_path, msl=128)
  (tmp_path / "c.csv").write_text("input_ids,attention_mask\n[1, 2],1 1\n")
  with pytest.raises(ValueError, match=r"c\.csv: missing CSV columns \['token_type_ids'"):
    bert.read_csv(tmp_path / "c.csv")


def test_text_sources(tmp_path):
  (tmp_path / "a.txt").write_text("One. Two.")
  (tmp_path / "b.jsonl").write_text('{"text": "Three."}\n\n{"text": "Four."}\n')
  assert text.read_documents(tmp_path) == ["Three.", "Four.", "One. Two."]
  (tmp_path / "bad.jsonl").write_text('{"txt": 1}\n')
  with pytest.raises(ValueError, match=r"bad\.jsonl:1: expected an object with a string 'text' field"):
    text.read_jsonl(tmp_path / "bad.jsonl")
  assert text.split_sentences("First one. Second one!\n\nThird\n=====\npart") == [
    "First one.",
    "Second one!",
    "Third part",
  ]


def test_embedded_corpus_is_real_english():
  docs = text.embedded_corpus()
  assert len(docs) > 1000 and sum(map(len, docs)) > 500_000
  joined = " ".join(docs[:200]).lower()
  assert all(w in joined for w in (" the ", " is ", " of "))


def test_digits_like_mnist():
  tr, ev = digits_features("train"), digits_features("eval")
  assert tr["images"].shape[1] == 784 and tr["images"].dtype == np.float32 and tr["labels"].dtype == np.int32
  assert len(tr["images"]) + len(ev["images"]) == 1797
  assert 0.0 <= tr["images"].min() and tr["images"].max() == 1.0
  img = tr["images"][0].reshape(28, 28)
  assert img[:2].sum() == 0 and img[:, -2:].sum() == 0  # the padding
  assert set(np.unique(tr["labels"])) == set(range(10))


def test_analyze_input_measures_and_recommends():
  from wafer.data.analyze import WorkerRate, measure_samples_per_s, recommend_workers

  rates = measure_samples_per_s(
    lambda w: GrainBatchSource(_src(200), 8, num_workers_per_csx=w), [1, 2], seconds=0.05, warmup_batches=1
  )
  assert [r.num_workers for r in rates] == [1, 2] and all(
    r.samples_per_s > 0 and r.batches > 0 for r in rates
  )
  fake = [
    WorkerRate(1, 1000.0, 1, 1.0, 0.0),
    WorkerRate(2, 1900.0, 1, 1.0, 0.0),
    WorkerRate(4, 3000.0, 1, 1.0, 0.0),
  ]
  assert recommend_workers(fake, 1500.0)["num_workers_per_csx"] == 2
  assert recommend_workers(fake, 500.0)["num_workers_per_csx"] == 1
  worst = recommend_workers(fake, 5000.0)
  assert worst["num_workers_per_csx"] == 4 and worst["input_bound"]


def test_processors_from_input_config(tmp_path):
  from wafer.config.schema import InputConfig
  from wafer.data import processors

  cfg = InputConfig(data_processor="MNISTDataProcessor", batch_size=16, shuffle=True, num_workers=2)
  src = processors.train_source(cfg, seed=3, num_csx=2)
  assert src.num_workers == 4 and next(src)["images"].shape == (16, 784)
  ev = list(
    processors.eval_batches(
      InputConfig(data_processor="MNISTDataProcessor", batch_size=100, split="val"), seed=0
    )
  )
  assert len(ev) == 3 and all(b["images"].shape == (100, 784) for b in ev)
  with pytest.raises(
    ValueError, match=r"number of CS devices \(4\) must be less than or equal to the model batch"
  ):
    processors.train_source(cfg.model_copy(update={"batch_size": 2}), seed=0, num_csx=4)
  with pytest.raises(ValueError, match="did not return any values"):
    processors.eval_batches(cfg.model_copy(update={"batch_size": 1000, "split": "val"}), seed=0)
  # a worker count the file set with modelzoo's DataLoader key is named as the cause
  with pytest.raises(
    ValueError, match=r"fewer than batch_size=1000.*the 8 workers per system are train_input.num_workers"
  ):
    processors.train_source(cfg.model_copy(update={"batch_size": 1000, "num_workers": 8}), seed=0)
  with pytest.raises(
    ValueError, match="'Nope' is not one an installed model plugin provides; registered: Bert"
  ):
    processors.train_source(cfg.model_copy(update={"data_processor": "Nope"}), seed=0)
  (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in small_corpus()))
  bcfg = InputConfig(
    data_processor="BertCSVDynamicMaskDataProcessor",
    data_dir=str(tmp_path / "a.jsonl"),
    batch_size=4,
    max_sequence_length=32,
    vocab_size=200,
    shuffle=True,
  )
  b = next(processors.train_source(bcfg, seed=1, cache_dir=tmp_path / "cache"))
  assert b["input_ids"].shape == (4, 32) and b["masked_lm_positions"].shape[0] == 4
  assert any(f.startswith("bert-") for f in os.listdir(tmp_path / "cache"))


def test_executor_resumes_a_grain_pipeline_bit_for_bit(tmp_path, monkeypatch):
  import jax
  import jax.numpy as jnp
  import optax

  import precision
  from models.fc_mnist.data import digits_batch_source
  from wafer.config import RunConfig
  from wafer.train import Task, run

  def loss_fn(params, batch):
    logits = batch["images"] @ params["w"] + params["b"][None]
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()

  task = Task(
    name="digits_linear",
    init_params=lambda key: {"w": jnp.zeros((784, 10)), "b": jnp.zeros(10)},
    loss_fn=loss_fn,
    batch_size=32,
    train_data=lambda seed: digits_batch_source(32, seed=seed, num_workers_per_csx=3),
  )

  def go(model_dir, max_steps):
    runconfig = RunConfig(model_dir=str(model_dir), max_steps=max_steps, checkpoint_steps=6, log_steps=1)
    return run(
      task,
      runconfig,
      optax.sgd(0.1),
      precision.DynamicLossScale.create("float32"),
      precision.Policy(compute="float32"),
      progress=False,
    )

  whole = go(tmp_path / "whole", 12)
  go(tmp_path / "parts", 6)
  resumed = go(tmp_path / "parts", 12)
  assert resumed["final_step"] == 12
  for x, y in zip(jax.tree.leaves(whole["params"]), jax.tree.leaves(resumed["params"])):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  losses = [
    json.loads(line)["loss"] for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()
  ]
  assert losses[-1] < 0.8 * losses[0]


def test_global_batch_split_across_systems():
  n, bs = 48, 8  # 2 systems x 2 workers: 4 shards of 12, per-system batches of 4 -> 3 per worker per epoch
  p = GrainBatchSource(_src(n), bs, seed=4, num_workers_per_csx=2, num_csx=2)
  assert p.num_workers == 4 and all(w.batch_size == 4 for w in p.workers)
  batches = [next(p)["id"] for _ in range(6)]  # one epoch: 6 steps x 8 = 48
  assert sorted(np.concatenate(batches).tolist()) == list(range(n))
  for k, b in enumerate(batches):  # system c's half comes from worker c * 2 + k % 2
    assert set((b[:4] % 4).tolist()) == {k % 2} and set((b[4:] % 4).tolist()) == {2 + k % 2}
  with pytest.raises(ValueError, match="must be a multiple of runconfig.num_csx=3"):
    GrainBatchSource(_src(n), 8, num_csx=3)


def test_per_step_dropout_keys_follow_the_batch_number():
  from wafer.data.pipeline import step_key

  src = GrainBatchSource(_src(64), 8, seed=5, num_workers_per_csx=2, num_csx=2, key_feature="dropout_key")
  batches = [next(src) for _ in range(6)]
  for k, b in enumerate(batches):
    keys = b["dropout_key"]
    assert keys.shape == (8, 2) and keys.dtype == np.uint32
    assert np.all(keys == step_key(5, k)[None])  # the step's key on every row (splits across num_csx)
  assert len({tuple(b["dropout_key"][0]) for b in batches}) == 6  # a new key every step
  state = {"version": 1, "next_batch": 3, "pipeline": src.get_state()["pipeline"]}
  resumed = GrainBatchSource(_src(64), 8, seed=5, num_workers_per_csx=2, num_csx=2, key_feature="dropout_key")
  resumed.set_state(state)
  np.testing.assert_array_equal(next(resumed)["dropout_key"], batches[3]["dropout_key"])
  assert "dropout_key" not in GrainBatchSource(_src(64), 8, seed=5).batch_at(0)
  assert not np.array_equal(step_key(5, 0), step_key(6, 0))


@pytest.mark.parametrize("systems", [(0,), (1, 3), (0, 1, 2, 3), (2,)])
def test_a_process_builds_only_its_systems_rows(systems):
  # Many processes: each builds the rows of its own systems, the rows the global batch holds for them.
  full = GrainBatchSource(_src(96), 16, seed=4, num_workers_per_csx=2, num_csx=4, key_feature="key")
  for _ in range(3):
    next(full)
  local = full.for_systems(systems)
  assert local.get_state() == full.get_state()  # same position, same pipeline
  rows = 16 // 4
  for _ in range(7):  # across the workers' round robin and an epoch boundary
    whole, part = next(full), next(local)
    for name in whole:
      want = np.concatenate([whole[name][c * rows : (c + 1) * rows] for c in systems])
      np.testing.assert_array_equal(part[name], want)
  with pytest.raises(ValueError, match="allowed: a non-empty subset of 0..3"):
    full.for_systems((4,))


# damaged data files ------------------------------------------------------------------------------


def _bert_examples():
  tok = text.train_bert_tokenizer(small_corpus(), 200)
  return bert.create_mlm_nsp_examples(
    text.tokenize_documents(tok, small_corpus()),
    msl=24,
    vocab_size=200,
    cls_id=2,
    sep_id=3,
    mask_id=4,
    num_special=5,
    seed=1,
  )


def _garbage(path):
  path.write_bytes(np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8).tobytes())


def _truncated_hdf5(path):
  bert.write_hdf5(path, _bert_examples())
  path.write_bytes(path.read_bytes()[:1500])  # the signature is there, the data is not


DAMAGED_FILES = [
  # (file name, how it is damaged, what the error says about that file)
  ("a.h5", lambda p: p.write_bytes(b""), r"the file is empty \(0 bytes"),
  ("a.csv", lambda p: p.write_bytes(b""), r"the file is empty \(0 bytes"),
  ("a.h5", _garbage, r"not an HDF5 file \(it starts with"),
  (
    "a.hdf5",
    lambda p: p.write_text("<html>404 Not Found</html>"),
    r"not an HDF5 file \(it starts with b'<html>4",
  ),
  ("a.h5", _truncated_hdf5, r"cannot be read \(OSError: .*truncated or corrupt: copy it again"),
  ("a.csv", _garbage, r"cannot be read \(UnicodeDecodeError: .*truncated or corrupt: copy it again"),
]


@pytest.mark.parametrize("name, damage, fragment", DAMAGED_FILES)
def test_a_damaged_pretokenised_file_is_named_in_the_data_error(tmp_path, name, damage, fragment):
  """Used to be h5py's "file signature not found" or a bare UnicodeDecodeError, naming no file."""
  import re

  from wafer.config.schema import InputConfig
  from wafer.data import DataError
  from wafer.data.processors import as_processor, train_source

  damage(tmp_path / name)
  cfg = as_processor(
    InputConfig(
      data_processor="BertCSVDynamicMaskDataProcessor", data_dir=str(tmp_path), batch_size=2,
      max_sequence_length=24,
    )
  )  # fmt: skip
  with pytest.raises(DataError, match=r"train_input \(BertCSVDynamicMaskDataProcessor, .*\): ") as info:
    train_source(cfg, seed=0)
  message = str(info.value)
  assert str(tmp_path) in message and re.search(fragment, message), message


def test_damaged_caches_are_rebuilt_not_fatal(tmp_path, capsys):
  from wafer.data.sources import cached_features

  calls = []

  def build():
    calls.append(1)
    return _bert_examples()

  first = cached_features(tmp_path, "f.h5", bert.read_hdf5, bert.write_hdf5, build)
  (tmp_path / "f.h5").write_bytes((tmp_path / "f.h5").read_bytes()[:700])  # a cache damaged on disk
  again = cached_features(tmp_path, "f.h5", bert.read_hdf5, bert.write_hdf5, build)
  assert len(calls) == 2 and "cached features" in capsys.readouterr().out
  assert all(np.array_equal(first[k], again[k]) for k in first)
  assert bert.read_hdf5(tmp_path / "f.h5")["input_ids"].shape == first["input_ids"].shape  # rewritten whole
  assert sorted(os.listdir(tmp_path)) == ["f.h5"]  # no temporary file left
  tok = text.train_bert_tokenizer(small_corpus(), 150, tmp_path / "tok")
  (cached,) = os.listdir(tmp_path / "tok")
  (tmp_path / "tok" / cached).write_text('{"version": "1.0", "trunc')
  again_tok = text.train_bert_tokenizer(small_corpus(), 150, tmp_path / "tok")
  assert "cached tokenizer" in capsys.readouterr().out
  assert again_tok.get_vocab() == tok.get_vocab()


def test_a_list_of_data_dirs_is_one_dataset_in_its_order(tmp_path):
  """modelzoo's GPT and BERT processors take ``data_dir: [dir0, dir1, ...]`` (every 2.x GPT-3 file lists
  ten): the examples of each path in the list's order; text documents likewise; MNIST's one path."""
  from pydantic import ValidationError

  from models.fc_mnist.data import MnistInput
  from models.gpt2 import data as gpt
  from wafer.config.schema import InputConfig
  from wafer.data import processors

  parts = [gpt.create_lm_examples([list(range(s, s + 40))], msl=8, eot_id=0) for s in (1, 100, 300)]
  dirs = [tmp_path / f"d{i}" for i in range(3)]
  for d, part in zip(dirs, parts):
    d.mkdir()
    gpt.write_hdf5(d / "a.h5", part)
  whole = gpt.gpt_features([str(d) for d in (dirs[2], dirs[0], dirs[1])], msl=8)
  for k in gpt.FEATURES:
    assert np.array_equal(whole[k], np.concatenate([parts[2][k], parts[0][k], parts[1][k]])), k
  cfg = InputConfig(
    data_processor="GptHDF5MapDataProcessor", data_dir=[str(d) for d in dirs], batch_size=2,
    max_sequence_length=8, shuffle=False,
  )  # fmt: skip
  rows = len(whole["input_ids"])
  got = np.concatenate([b["input_ids"] for b in processors.eval_batches(cfg, seed=0)])
  assert got.shape == (rows - rows % 2, 8) and np.array_equal(
    np.sort(got, axis=0), np.sort(np.concatenate([p["input_ids"] for p in parts])[: len(got)], axis=0)
  )
  (tmp_path / "t0").mkdir(), (tmp_path / "t1").mkdir()
  (tmp_path / "t0" / "a.txt").write_text("One. Two.")
  (tmp_path / "t1" / "b.jsonl").write_text('{"text": "Three."}\n')
  assert text.read_documents([tmp_path / "t1", tmp_path / "t0"]) == ["Three.", "One. Two."]
  with pytest.raises(ValueError, match=r"pre-tokenised data .* and text \(.*t1\); list paths of one kind"):
    gpt.gpt_features([str(dirs[0]), str(tmp_path / "t1")], msl=8)
  with pytest.raises(FileNotFoundError, match=r"data_dir .*nope: no such file or directory"):
    gpt.gpt_features([str(dirs[0]), str(tmp_path / "nope")], msl=8)
  with pytest.raises(
    ValidationError, match=r"MNISTDataProcessor reads one data_dir, got a list of 2 \(a, b\)"
  ):
    MnistInput(data_processor="MNISTDataProcessor", data_dir=["a", "b"], batch_size=2)
  assert MnistInput(data_processor="MNISTDataProcessor", data_dir=["a"], batch_size=2).data_dir == ["a"]


def test_do_lower_false_trains_a_cased_tokenizer(tmp_path):
  """modelzoo's RoBERTa files set do_lower: false (they were refused): the tokenizer keeps case, in a
  cache of its own, and the cased features differ from the lowercased ones."""
  docs = small_corpus()
  lower = text.train_bert_tokenizer(docs, 300, tmp_path)
  cased = text.train_bert_tokenizer(docs, 300, tmp_path, lowercase=False)
  assert lower.encode("The Cat").tokens == lower.encode("the cat").tokens
  assert cased.encode("The Cat").tokens != cased.encode("the cat").tokens
  names = sorted(p.name for p in tmp_path.iterdir())
  assert any(n.startswith("bert-bpe-cased-300-") for n in names) and any(
    n.startswith("bert-bpe-300-") for n in names
  )
  a = bert.bert_features_from_text(docs, msl=32, vocab_size=300, cache_dir=tmp_path)
  b = bert.bert_features_from_text(docs, msl=32, vocab_size=300, cache_dir=tmp_path, lowercase=False)
  assert not np.array_equal(a["input_ids"][:4], b["input_ids"][:4])


def test_an_empty_data_dir_names_both_kinds_of_data(tmp_path):
  """An empty folder under a pre-tokenised processor was 'no *.txt or *.jsonl files' (text only)."""
  from wafer.data.sources import pretokenised

  with pytest.raises(
    FileNotFoundError, match=r"holds no data: neither pre-tokenised files \(\*.h5, \*.csv\) nor text"
  ):
    pretokenised(str(tmp_path), (".h5", ".csv"), lambda path: {}, 128, None)
  (tmp_path / "a.txt").write_text("text")
  assert (
    pretokenised(str(tmp_path), (".h5", ".csv"), lambda path: {}, 128, None) is None
  )  # text: read as text


@pytest.mark.parametrize(
  "values, message",
  [
    (np.array([1.0, 2.0**31], np.float32), "outside int32"),  # float32 holds 2**31 exactly: cast to -2**31
    (np.array([1.0, np.nan], np.float16), "not a whole number"),
    (np.array([1, 2**32 + 7], np.int64), "outside int32"),
    (np.array([1.5], np.float64), "not a whole number"),
  ],
)
def test_as_int32_refuses_what_the_cast_would_change(values, message):
  from wafer.data.sources import as_int32

  with pytest.raises(ValueError, match=message):
    as_int32(values, "input_ids", "a.h5")
  assert as_int32(np.array([0, 5], values.dtype), "input_ids", "a.h5").tolist() == [0, 5]


def test_a_tokenizer_that_cannot_be_cached_is_used_with_a_warning(tmp_path, monkeypatch, capsys):
  """A full disk while caching the tokenizer was a bare traceback ending in tokenizers' ``Exception:
  No space left on device (os error 28)`` (a helper's probe); the cache only saves time."""
  from wafer.data import text

  def full(path):
    raise Exception("No space left on device (os error 28)")  # noqa: TRY002 - what tokenizers raises

  monkeypatch.setattr(text, "replace_atomically", lambda path, write: full(path))
  docs = small_corpus()
  tok = text.train_bert_tokenizer(docs, 300, tmp_path)
  assert tok.encode("the cat").tokens
  out = capsys.readouterr().out
  assert "cannot be cached" in out and "No space left on device" in out
  assert not any(tmp_path.iterdir()) or not any(p.is_file() for p in tmp_path.rglob("*"))
