"""Text sources, the embedded default corpus, and a locally trained subword tokenizer.

**Why this embedded corpus.** The default job must run on a fresh machine with no download.
Every CPython installation ships English prose: the help topics of ``pydoc_data.topics`` (the
language reference, about 0.8 MB) and the docstrings of the standard library. It is real,
edited English (sentences, paragraphs, a technical vocabulary), which is what MLM and NSP need,
unlike licence files or generated text. The docstrings are read with :mod:`ast` from the source
files of a fixed list of modules, never by importing them (no side effects, and quick). The text
depends on the Python version, so the cached tokenizer's name carries a hash of the corpus.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import sysconfig
from collections.abc import Iterable, Sequence

from wafer._io import replace_atomically

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
EOT_TOKEN = "<|endoftext|>"
EOT = 0  # id of EOT_TOKEN in the tokenizers of train_bpe

# Well-documented pure-Python standard-library modules (files under the stdlib directory).
_DOC_MODULES = (
  "argparse",
  "ast",
  "asyncio/base_events",
  "asyncio/events",
  "asyncio/tasks",
  "base64",
  "bisect",
  "calendar",
  "collections/__init__",
  "concurrent/futures/_base",
  "configparser",
  "contextlib",
  "copy",
  "csv",
  "dataclasses",
  "datetime",
  "decimal",
  "difflib",
  "doctest",
  "email/message",
  "enum",
  "fractions",
  "ftplib",
  "functools",
  "getopt",
  "gettext",
  "glob",
  "heapq",
  "http/client",
  "http/server",
  "imaplib",
  "inspect",
  "ipaddress",
  "json/__init__",
  "json/decoder",
  "json/encoder",
  "logging/__init__",
  "logging/handlers",
  "mailbox",
  "multiprocessing/pool",
  "numbers",
  "optparse",
  "os",
  "pathlib",
  "pdb",
  "pickle",
  "pickletools",
  "pprint",
  "pydoc",
  "queue",
  "random",
  "shlex",
  "shutil",
  "smtplib",
  "socket",
  "socketserver",
  "statistics",
  "string",
  "subprocess",
  "tarfile",
  "tempfile",
  "textwrap",
  "threading",
  "tkinter/__init__",
  "traceback",
  "typing",
  "unittest/case",
  "unittest/mock",
  "urllib/parse",
  "urllib/request",
  "uuid",
  "warnings",
  "weakref",
  "xml/dom/minidom",
  "xml/etree/ElementTree",
  "zipfile/__init__",
  "zipfile",
)


def _docstrings(path: str) -> list[str]:
  try:
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read())
  except (OSError, SyntaxError, UnicodeDecodeError):
    return []
  nodes = [tree] + [
    n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
  ]
  docs = [ast.get_docstring(n) for n in nodes]
  return [d for d in docs if d and len(d) > 80]


def embedded_corpus() -> list[str]:
  """Documents of the embedded corpus: ``pydoc_data`` help topics, then standard-library docstrings."""
  from pydoc_data.topics import topics

  docs = [topics[k] for k in sorted(topics)]
  stdlib = sysconfig.get_paths()["stdlib"]
  for mod in _DOC_MODULES:
    path = os.path.join(stdlib, mod + ".py")
    if os.path.isfile(path):
      docs.extend(_docstrings(path))
  return docs


def _read_utf8(path: str) -> str:
  """The text of ``path`` (newlines as ``open`` reads them); not UTF-8: a ``ValueError`` naming file and byte."""
  with open(path, "rb") as f:
    raw = f.read()
  try:
    return raw.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")  # universal newlines, as open()
  except UnicodeDecodeError as e:
    line = raw.count(b"\n", 0, e.start) + 1
    raise ValueError(
      f"{path}:{line}: byte {raw[e.start : e.end][:4]!r} at offset {e.start} is not UTF-8; text data must be "
      "UTF-8 (re-encode the file, e.g. iconv -f latin1 -t utf-8)"
    ) from None


def read_text_dir(path: str | os.PathLike) -> list[str]:
  """Documents from a directory of ``*.txt`` files (one document per file, sorted by name)."""
  path = os.fspath(path)
  if not os.path.isdir(path):
    raise FileNotFoundError(f"text directory not found: {path}")
  files = sorted(f for f in os.listdir(path) if f.endswith(".txt"))
  if not files:
    raise FileNotFoundError(f"no *.txt files in {path}")
  docs = []
  for name in files:
    docs.append(_read_utf8(os.path.join(path, name)))
  return docs


def read_jsonl(path: str | os.PathLike, key: str = "text") -> list[str]:
  """Documents from a JSONL file, one ``{"text": ...}`` object a line (blank lines skipped)."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"JSONL file not found: {path}")
  docs = []
  for line_no, line in enumerate(_read_utf8(os.fspath(path)).split("\n"), start=1):  # \n only, as JSONL
    if not line.strip():
      continue
    try:
      obj = json.loads(line)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path}:{line_no}: not valid JSON: {e}") from e
    if not isinstance(obj, dict) or not isinstance(obj.get(key), str):
      raise ValueError(f"{path}:{line_no}: expected an object with a string {key!r} field")
    docs.append(obj[key])
  return docs


def read_documents(data_dir: str | os.PathLike | Sequence[str | os.PathLike] | None) -> list[str]:
  """Documents from ``data_dir``: a ``.jsonl`` file, a directory of ``.txt``/``.jsonl`` files, a list of
  those (their documents in the list's order), or None (embedded)."""
  if data_dir is None:
    return embedded_corpus()
  if not isinstance(data_dir, (str, os.PathLike)):
    return [doc for path in data_dir for doc in read_documents(path)]
  path = os.fspath(data_dir)
  if os.path.isfile(path):
    if path.endswith(".jsonl"):
      return read_jsonl(path)
    if path.endswith(".txt"):
      return [_read_utf8(path)]
    raise ValueError(f"{path}: text data must be a .txt or .jsonl file, or a directory of them")
  if os.path.isdir(path):
    jsonl = sorted(f for f in os.listdir(path) if f.endswith(".jsonl"))
    docs = [d for f in jsonl for d in read_jsonl(os.path.join(path, f))]
    if any(f.endswith(".txt") for f in os.listdir(path)):
      docs += read_text_dir(path)
    if not docs:
      raise FileNotFoundError(f"no *.txt or *.jsonl files in {path}")
    return docs
  raise FileNotFoundError(f"text data not found: {path}")


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])|\n\s*\n")
_RULE = re.compile(r"^([-=*~^_+#.:])\1{2,}$")  # reST heading underlines and rules


def split_sentences(doc: str) -> list[str]:
  """Sentences of a document: split after ``.!?`` before a capital, and at blank lines."""
  sents = (" ".join(w for w in p.split() if not _RULE.match(w)) for p in _SENTENCE_END.split(doc))
  return [s for s in sents if s]


EVAL_EVERY = 20  # every 20th document of a text corpus is held out for evaluation
SPLITS = ("train", "eval")


def split_documents(docs: Sequence[str], split: str | None) -> list[str]:
  """The documents of ``split``: ``eval`` holds every :data:`EVAL_EVERY`-th document (indices
  ``EVAL_EVERY-1, 2*EVAL_EVERY-1, ...``), ``train`` the others, None all of them."""
  if split is None:
    return list(docs)
  if split not in SPLITS:
    raise ValueError(f"split={split!r}; allowed: train, eval (also val, test, validation), or no split key")
  held = [i % EVAL_EVERY == EVAL_EVERY - 1 for i in range(len(docs))]
  chosen = [d for d, h in zip(docs, held) if h == (split == "eval")]
  if not chosen:
    raise ValueError(
      f"split={split!r}: the corpus of {len(docs)} document(s) has none for this split (every "
      f"{EVAL_EVERY}th document is held out for eval); give eval its own data_dir"
    )
  return chosen


def corpus_hash(docs: Sequence[str]) -> str:
  h = hashlib.sha256()
  for d in docs:
    h.update(d.encode("utf-8", "replace"))
    h.update(b"\0")
  return h.hexdigest()[:12]


def _cached_tokenizer(cache_dir: str | os.PathLike | None, name: str, train):
  """``cache_dir/name`` if it exists and reads; else ``train()``, saved there atomically (`wafer._io`).
  A tokenizer that cannot be saved (a full disk, a read-only cache) is used all the same, with a
  warning: the cache only saves time."""
  from tokenizers import Tokenizer

  if cache_dir is None:
    return train()
  path = os.path.join(os.fspath(cache_dir), name)
  if os.path.isfile(path):
    try:
      return Tokenizer.from_file(path)
    except Exception as error:  # tokenizers raises a bare Exception on a damaged file: train it again
      print(f"Warning: the cached tokenizer {path} cannot be read ({error}); training it again.", flush=True)
  tok = train()
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    replace_atomically(path, tok.save)
  except Exception as error:  # (tokenizers raises a bare Exception: "No space left on device (os error 28)")
    print(
      f"Warning: the tokenizer cannot be cached at {path} ({error}); it is used all the same, and "
      "trained again by the next run that does not find it.",
      flush=True,
    )
  return tok


def train_bert_tokenizer(
  docs: Sequence[str], vocab_size: int, cache_dir: str | os.PathLike | None = None, *, lowercase: bool = True
):
  """BERT's subword tokenizer trained on ``docs``, cached as ``cache_dir/bert-bpe-V-HASH.json``
  (``bert-bpe-cased-V-HASH.json`` with ``lowercase=False``).

  BERT's normalizer (lowercasing unless ``lowercase=False``: modelzoo's ``do_lower: false``, as its
  RoBERTa files give; accents are stripped only when lowercasing, as BERT's cased models keep them)
  and pre-tokenizer (words and punctuation marks split apart), then
  BPE merges within words, with ``vocab_size`` ids at most. Subwords carry no ``##`` marker, so
  ``decode`` separates every token by a space (nothing in training decodes).

  Why BPE and not WordPiece: ``tokenizers``' WordPiece trainer is not deterministic (the ids of
  its ``##`` continuation tokens follow hash-map order, and merge ties are broken by id;
  huggingface/tokenizers#1794): two trainings on the same text give different vocabularies,
  so two fresh runs would see different data. This BPE trains the same vocabulary every time
  (tested).

  Returns:
    A ``tokenizers.Tokenizer``; ids 0..4 are ``[PAD] [UNK] [CLS] [SEP] [MASK]``.
  """
  from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

  def train():
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False
    )
    tok.train_from_iterator(docs, trainer=trainer)
    return tok

  cased = "" if lowercase else "cased-"
  return _cached_tokenizer(cache_dir, f"bert-bpe-{cased}{vocab_size}-{corpus_hash(docs)}.json", train)


def train_bpe(docs: Sequence[str], vocab_size: int, cache_dir: str | os.PathLike | None = None):
  """A GPT-2 style byte-level BPE tokenizer trained on ``docs``, cached as ``cache_dir/bpe-V-HASH.json``.

  The 256 byte symbols are always in the vocabulary, so every text encodes without an unknown
  token; ``vocab_size`` must therefore be at least 257 (the bytes and ``<|endoftext|>``). The
  trainer may stop below ``vocab_size`` on a small corpus: ids are always ``< vocab_size``.

  Returns:
    A ``tokenizers.Tokenizer``; id 0 (:data:`EOT`) is ``<|endoftext|>``.
  """
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

  alphabet = pre_tokenizers.ByteLevel.alphabet()
  if vocab_size < len(alphabet) + 1:
    raise ValueError(
      f"BPE vocab_size must be at least {len(alphabet) + 1} (the {len(alphabet)} byte symbols and "
      f"{EOT_TOKEN}); got {vocab_size}"
    )

  def train():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=[EOT_TOKEN], initial_alphabet=alphabet, show_progress=False
    )
    tok.train_from_iterator(docs, trainer=trainer)
    if tok.token_to_id(EOT_TOKEN) != EOT or tok.get_vocab_size() > vocab_size:
      raise RuntimeError(
        f"BPE training gave {EOT_TOKEN} id {tok.token_to_id(EOT_TOKEN)} and "
        f"{tok.get_vocab_size()} tokens; expected id {EOT} and at most {vocab_size}"
      )
    return tok

  return _cached_tokenizer(cache_dir, f"bpe-{vocab_size}-{corpus_hash(docs)}.json", train)


def tokenize_documents(tok, docs: Iterable[str]) -> list[list[list[int]]]:
  """Documents as lists of sentences of token ids."""
  out = []
  for doc in docs:
    sents = split_sentences(doc)
    if sents:
      out.append([e.ids for e in tok.encode_batch(sents, add_special_tokens=False)])
  return out
