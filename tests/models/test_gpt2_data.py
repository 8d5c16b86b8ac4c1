"""GPT language-model data: windows, modelzoo GPT HDF5, the byte-level BPE tokenizer, processors."""

from __future__ import annotations

import os
import time

import h5py
import numpy as np
import pytest

from models.gpt2 import data as gpt
from models.gpt2.data import gpt_features
from tests.samples import small_corpus
from wafer import registry
from wafer.data import processors, text


def test_windows_are_exact_shifts_of_one_stream():
  docs = [list(range(1, 1 + n)) for n in (5, 11, 3, 20)]
  f = gpt.create_lm_examples(docs, msl=7, eot_id=0)
  stream = [t for d in docs for t in (*d, 0)]
  n = len(stream) // 8
  assert f["input_ids"].shape == f["labels"].shape == f["attention_mask"].shape == (n, 7)
  assert all(v.dtype == np.int32 for v in f.values()) and np.all(f["attention_mask"] == 1)
  assert np.array_equal(f["labels"][:, :-1], f["input_ids"][:, 1:])
  rebuilt = np.concatenate([f["input_ids"], f["labels"][:, -1:]], axis=1).reshape(-1)
  assert rebuilt.tolist() == stream[: n * 8]  # non-overlapping windows of msl + 1, tail dropped
  # EOT after every document: the token after document d's last token is 0
  ends = np.cumsum([len(d) + 1 for d in docs]) - 1
  assert all(stream[e] == 0 for e in ends) and stream.count(0) == len(docs)


def test_zero_windows_is_an_error():
  with pytest.raises(ValueError, match=r"no examples: 6 tokens \(2 documents.*msl=8 needs 9"):
    gpt.create_lm_examples([[1, 2], [3, 4]], msl=8, eot_id=0)


def test_hdf5_round_trip_in_modelzoo_layout(tmp_path):
  f = gpt.create_lm_examples([list(range(1, 200))], msl=16, eot_id=0)
  gpt.write_hdf5(tmp_path / "a.h5", f)
  with h5py.File(tmp_path / "a.h5", "r") as h:
    data = h["data"][()]
  assert data.shape == (len(f["input_ids"]), 3, 16)
  assert np.array_equal(data[:, 0], f["input_ids"]) and np.array_equal(data[:, 1], f["attention_mask"])
  assert np.array_equal(data[:, 2], f["labels"])
  got = gpt.read_hdf5(tmp_path / "a.h5")
  assert all(np.array_equal(got[k], f[k]) and got[k].dtype == np.int32 for k in gpt.FEATURES)
  gpt.write_hdf5(tmp_path / "b.hdf5", f)
  both = gpt_features(tmp_path, msl=16)
  assert len(both["input_ids"]) == 2 * len(f["input_ids"])
  with pytest.raises(ValueError, match="sequences have length 16, but max_sequence_length is 128"):
    gpt_features(tmp_path, msl=128)


def test_bad_hdf5_files(tmp_path):
  with h5py.File(tmp_path / "nodata.h5", "w") as h:
    h.create_dataset("input_ids", data=np.zeros((2, 4), np.int32))
  with pytest.raises(ValueError, match=r"nodata\.h5: no HDF5 dataset 'data'; found \['input_ids'\]"):
    gpt.read_hdf5(tmp_path / "nodata.h5")
  with h5py.File(tmp_path / "shape.h5", "w") as h:
    h.create_dataset("data", data=np.zeros((2, 2, 4), np.int32))
  with pytest.raises(
    ValueError, match=r"shape\.h5: dataset 'data' has shape \[2, 2, 4\].*expected .*\[N, 3, MSL\]"
  ):
    gpt.read_hdf5(tmp_path / "shape.h5")
  (tmp_path / "empty").mkdir()
  with pytest.raises(FileNotFoundError, match=r"no pre-tokenised GPT data \(\*\.h5, \*\.hdf5\) in .*empty"):
    gpt.read_features(tmp_path / "empty")
  f4 = gpt.create_lm_examples([list(range(1, 50))], msl=4, eot_id=0)
  f8 = gpt.create_lm_examples([list(range(1, 50))], msl=8, eot_id=0)
  (tmp_path / "mixed").mkdir()
  gpt.write_hdf5(tmp_path / "mixed" / "a.h5", f4)
  gpt.write_hdf5(tmp_path / "mixed" / "b.h5", f8)
  with pytest.raises(ValueError, match="differ in sequence length"):
    gpt.read_features(tmp_path / "mixed")


def test_bpe_tokenizer_trains_and_caches(tmp_path):
  tok = text.train_bpe(small_corpus(), 300, tmp_path)
  files = os.listdir(tmp_path)
  assert len(files) == 1 and files[0].startswith("bpe-300-") and files[0].endswith(".json")
  assert tok.token_to_id("<|endoftext|>") == text.EOT == 0 and tok.get_vocab_size() <= 300
  mtime = os.path.getmtime(tmp_path / files[0])
  again = text.train_bpe(small_corpus(), 300, tmp_path)
  assert os.path.getmtime(tmp_path / files[0]) == mtime
  s = "Sentence 3 of document 5 — with ünïcode!"
  assert again.encode(s).ids == tok.encode(s).ids and tok.decode(tok.encode(s).ids) == s
  with pytest.raises(ValueError, match="vocab_size must be at least 257"):
    text.train_bpe(small_corpus(), 100)


def test_gpt_features_from_text_ids_below_vocab(tmp_path):
  for i, d in enumerate(small_corpus()):
    (tmp_path / f"{i}.txt").write_text(d)
  f = gpt_features(tmp_path, msl=32, vocab_size=300, cache_dir=tmp_path / "cache")
  assert f["input_ids"].shape[1] == 32 and f["input_ids"].max() < 300 and f["labels"].max() < 300
  assert np.sum(f["input_ids"] == text.EOT) >= len(small_corpus()) - 2
  cached = sorted(os.listdir(tmp_path / "cache"))
  assert any(n.startswith("gpt-") and "-msl32-v300-" in n for n in cached)
  again = gpt_features(tmp_path, msl=32, vocab_size=300, cache_dir=tmp_path / "cache")
  assert all(np.array_equal(again[k], f[k]) for k in gpt.FEATURES)


def test_processors_build_a_gpt_source(tmp_path):
  from wafer.config.schema import InputConfig

  for i, d in enumerate(small_corpus()):
    (tmp_path / f"{i}.txt").write_text(d)
  cfg = InputConfig(
    data_processor="GptHDF5MapDataProcessor",
    data_dir=str(tmp_path),
    batch_size=4,
    max_sequence_length=16,
    vocab_size=300,
    shuffle=True,
  )
  src = processors.train_source(cfg, seed=1, cache_dir=tmp_path / "cache")
  for _ in range(3):
    b = next(src)
    assert set(b) == set(gpt.FEATURES)
    assert all(v.shape == (4, 16) and v.dtype == np.int32 for v in b.values())
    assert np.array_equal(b["labels"][:, :-1], b["input_ids"][:, 1:]) and b["input_ids"].max() < 300
  ev = list(
    processors.eval_batches(
      cfg.model_copy(update={"data_processor": "GptTextDataProcessor"}), seed=0, cache_dir=tmp_path / "cache"
    )
  )
  assert ev and all(b["input_ids"].shape == (4, 16) for b in ev)
  assert registry.data_processors()["GptHDF5DataProcessor"] == "gpt2/gpt3"


def test_embedded_corpus_at_msl_128(tmp_path):
  t0 = time.perf_counter()
  f = gpt_features(None, msl=128, vocab_size=8192, cache_dir=tmp_path)
  elapsed = time.perf_counter() - t0
  n = len(f["input_ids"])
  print(f"embedded corpus, msl 128, vocab 8192: {n} examples in {elapsed:.1f} s")
  assert n > 1000 and f["input_ids"].shape == (n, 128) and f["input_ids"].max() < 8192
  assert np.array_equal(f["labels"][:, :-1], f["input_ids"][:, 1:])
