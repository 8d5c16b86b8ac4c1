"""The reference models' `wafer.registry.ModelSpec` s (``BERT``, ``GPT``, ``FC_MNIST``).

They are found through the ``wafer.models`` entry points in ``pyproject.toml``; BERT's spec carries
the embedded default job that ``wafer run`` runs without ``--params``. Each spec names the strict
input schema of every data processor that feeds its model, so a misspelled ``train_input`` key is
an error with a "did you mean".

Each builder joins three things a params file names:

* the model (``model:``) as a pure ``(init_params, loss_fn)`` pair from `models.functional`;
* the training data (``train_input:``) as a `wafer.data.GrainBatchSource`, built by the
  ``data_processor`` named there (its strict schema in ``models/<name>/data.py``; `wafer.data.processors`), with ``runconfig.num_csx`` and
  ``runconfig.num_workers_per_csx`` input workers;
* the eval data (``eval_input:``), one pass in order, and the eval metric (loss for the language
  models, accuracy for fc_mnist).

Tokenizers and tokenised examples are cached under ``model_dir/data_cache`` (a second run in
the same model_dir starts at once). The data is built once per run: the executor takes its
example batch from the same source and rewinds it.

Data features are renamed to the model's batch keys here (the BERT files use Google's TF names
``masked_lm_labels`` / ``masked_lm_weights``; the model takes modelzoo's PyTorch names ``labels``
/ ``masked_lm_mask``).

Dropout: when the ``model:`` section has a non-zero dropout rate, every training batch carries a
``dropout_key`` (uint32[batch, 2], a function of the run seed and the batch number; see
`wafer.data.GrainBatchSource`), and the loss runs the model in train mode with dropout drawn from
it (`models.functional`). A resumed run draws the same masks. Eval batches carry no key: eval
runs without dropout.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from models.bert import data as bert_data
from models.bert.model import BertConfig
from models.fc_mnist import data as mnist_data
from models.fc_mnist.model import INPUT_SIZE, FCMnistConfig
from models.gpt2 import data as gpt_data
from models.gpt2.model import GPT2Config
from models.zoo import bind, functional
from wafer.data import DataError, processors
from wafer.registry import ModelSpec
from wafer.train import Task

Batch = Mapping[str, Any]


class DataConfigError(DataError):
  """The data a params file names does not fit its model; the message says what to change."""


def data_cache_dir(params: Any) -> Path:
  """Where tokenizers and tokenised examples are cached: ``model_dir/data_cache``."""
  return Path(params.runconfig.model_dir) / "data_cache"


def _input_section(params: Any, which: str, processors_allowed: tuple[str, ...], model: str) -> Any:
  cfg = getattr(params, which)
  if cfg is None:
    return None
  if cfg.data_processor not in processors_allowed:
    raise DataConfigError(
      f"{which}.data_processor: {cfg.data_processor!r} does not feed the {model} model; allowed: "
      f"{', '.join(processors_allowed)}"
    )
  return cfg


_NO_TRAIN_INPUT = (
  "train_input: missing; the train and train_and_eval modes read it (eval and eval_all read only "
  "eval_input): add a train_input section, or run with --mode eval / eval_all"
)


def _train_section(params: Any, train_cfg: Any, eval_cfg: Any, model: str) -> Any:
  """The section that gives the task its batch size: ``train_input``, or in an eval mode (which reads
  only ``eval_input``, as modelzoo) ``eval_input`` when the file has no ``train_input``.

  Raises:
    DataConfigError: no ``train_input`` in a mode that trains.
  """
  if train_cfg is not None:
    return train_cfg
  if params.runconfig.mode in ("eval", "eval_all") and eval_cfg is not None:
    return eval_cfg
  raise DataConfigError(
    f"train_input: missing; {model} needs a train_input section to train (mode "
    f"{params.runconfig.mode!r}); eval and eval_all read only eval_input"
  )


def _check_tokens(features: Mapping[str, np.ndarray], vocab_size: int, msl_limit: int, where: str) -> None:
  """Token ids must index the embedding table, and sequences must fit the position table."""
  ids = features["input_ids"]
  low = int(ids.min()) if ids.size else 0
  if low < 0:
    raise DataConfigError(
      f"{where}: token id {low} is negative; token ids index the embedding table, 0 to "
      f"model.vocab_size - 1 = {vocab_size - 1} (JAX would clamp it to a real token silently)"
    )
  top = int(ids.max()) if ids.size else 0
  if top >= vocab_size:
    raise DataConfigError(
      f"{where}: token id {top} is outside model.vocab_size={vocab_size}; set model.vocab_size to at least "
      f"{top + 1}, or tokenise with a vocabulary of at most {vocab_size} ids ({where}.vocab_size)"
    )
  _check_length(ids.shape[1], msl_limit, where)


def _check_ranges(
  features: Mapping[str, np.ndarray], ranges: Mapping[str, tuple[int, int, str]], where: str
) -> None:
  """Each feature of ``ranges`` (key -> (low, high, what it indexes)) within ``low..high - 1``.

  An index feature out of range is not an error JAX raises: a negative one wraps to a real row (a
  label of -100 trains on token ``vocab_size - 100``), one past the end is clamped or gathers NaN, so
  the run trains on wrong targets or stops much later at a NaN loss that names no feature. Checked
  on every example when the data is prepared; the message names the feature, the first example out
  of range and the range.

  >>> _check_ranges({"labels": np.array([[3, 1], [2, -100]])}, {"labels": (0, 8, "token ids")}, "train_input")
  Traceback (most recent call last):
  ...
  models.registry.DataConfigError: train_input: labels holds -100 (example 1 of the data, ...), outside 0..7 (token ids); ...
  """
  for key, (low, high, meaning) in ranges.items():
    values = features.get(key)
    if values is None or not np.size(values):
      continue
    values = np.asarray(values)
    bad = (values < low) | (values >= high)
    if np.issubdtype(values.dtype, np.floating):
      bad |= ~np.isfinite(values)
    if not bad.any():
      continue
    rows = bad.reshape(len(values), -1)
    first = int(np.argmax(rows.any(axis=1)))
    value = values.reshape(len(values), -1)[first][rows[first]][0]
    shown = int(value) if np.issubdtype(values.dtype, np.integer) else float(value)
    why = (
      "a mask multiplies the loss by its value"
      if meaning == _MASK
      else "JAX would not raise: a negative index wraps to a real row and one past the end is clamped or reads "
      "NaN, so the run would train on wrong targets"
    )
    advice = (
      " (an ignored position is label 0 with weight or mask 0, as modelzoo writes it, not -100)"
      if "label" in key
      else ""
    )
    raise DataConfigError(
      f"{where}: {key} holds {shown} (example {first} of the data, its files in sorted order), outside "
      f"{low}..{high - 1} ({meaning}); {why}. Fix the data{advice}"
    )


_MASK = "0 or 1"


def _token_ranges(kind: str, model: Any, length: int) -> dict[str, tuple[int, int, str]]:
  """The index features of BERT's and GPT's data and their ranges (`_check_ranges`)."""
  vocab = (0, model.vocab_size, f"token ids: 0 to model.vocab_size - 1 = {model.vocab_size - 1}")
  mask = (0, 2, _MASK)
  if kind == "gpt":
    return {"labels": vocab, "attention_mask": mask}
  ranges = {
    "attention_mask": mask,
    "masked_lm_positions": (0, length, f"positions in a sequence of {length} tokens"),
    "masked_lm_labels": vocab,
    "next_sentence_label": (0, 2, "0: B follows A, 1: B is random"),
  }
  segments = getattr(model, "num_segments", None)
  if segments:
    ranges["token_type_ids"] = (0, segments, f"segments: 0 to model.num_segments - 1 = {segments - 1}")
  return ranges


def _check_length(length: int, msl_limit: int, where: str) -> None:
  """Sequences of ``length`` tokens must fit the position table (JAX would clamp the positions past it)."""
  if length > msl_limit:
    raise DataConfigError(
      f"{where}: sequences of {length} tokens exceed model.max_position_embeddings={msl_limit}; lower "
      f"{where}.max_sequence_length or raise max_position_embeddings"
    )


def _with_vocab(cfg: Any, vocab_size: int) -> Any:
  """The input section with the tokenizer's vocabulary defaulting to the model's."""
  if cfg is None or getattr(cfg, "vocab_size", None) is not None:
    return cfg
  return cfg.model_copy(update={"vocab_size": vocab_size})


def _with_sequence_length(cfg: Any, max_position_embeddings: int, which: str) -> Any:
  """The input section with ``max_sequence_length`` defaulting to the model's ``max_position_embeddings``.

  In modelzoo the pre-tokenised data fixes the length (a GPT HDF5 file holds ``[N, 3, MSL]``), so a
  file without ``max_sequence_length`` means the data's length, and the longest sequence the model
  takes is the natural stand-in for it (``wafer estimate`` says where its length came from:
  `wafer.costmodel.estimate.run_inputs`). The section is validated again at that length (BERT's
  ``max_predictions_per_seq`` must fit in it).
  """
  if cfg is None or getattr(cfg, "max_sequence_length", None) is not None:
    return cfg
  try:
    return type(cfg).model_validate({**dict(cfg), "max_sequence_length": max_position_embeddings})
  except ValueError as error:  # pydantic's ValidationError
    found = getattr(error, "errors", lambda: [])()
    problems = "; ".join(e["msg"].removeprefix("Value error, ") for e in found) or str(error)
    raise DataConfigError(
      f"{which}.max_sequence_length: not in the params file, so model.max_position_embeddings="
      f"{max_position_embeddings} stands for it, and then: {problems}; set {which}.max_sequence_length"
    ) from None


DROPOUT_KEYS = ("dropout_rate", "attention_dropout_rate", "embedding_dropout_rate", "dropout")


def uses_dropout(model: Any) -> bool:
  """Whether any dropout rate of a ``model:`` section is non-zero."""
  return any((getattr(model, k, None) or 0.0) > 0.0 for k in DROPOUT_KEYS)


def _data(
  params: Any, train_cfg: Any, eval_cfg: Any, check: Callable[[Mapping[str, np.ndarray], str], None]
) -> dict[str, Any]:
  """The Task's ``train_data(seed)``, ``eval_data()`` (built once, lazily) and ``batch_spec()``."""
  rc = params.runconfig
  cache = data_cache_dir(params)
  key_feature = "dropout_key" if uses_dropout(params.model) else None

  def train_data(seed: int) -> Any:
    if train_cfg is None:  # an eval-only file (_train_section): the eval modes never read training data
      raise DataConfigError(_NO_TRAIN_INPUT)
    source = processors.train_source(
      train_cfg,
      seed=seed,
      num_csx=rc.num_csx,
      num_workers_per_csx=rc.num_workers_per_csx,
      cache_dir=cache,
      key_feature=key_feature,
      features=train_cfg.features,  # the model's own input section: no generic lookup
    )
    check(source.features, "train_input")
    return source

  def batch_spec() -> dict[str, Any]:
    return processors.batch_spec(train_cfg, key_feature=key_feature)

  if eval_cfg is None:
    return {"train_data": train_data, "eval_data": None, "batch_spec": batch_spec}

  def eval_batch_spec() -> dict[str, Any]:
    return processors.batch_spec(eval_cfg, section="eval_input")

  if (
    train_cfg is not None
    and eval_cfg.data_dir is not None
    and eval_cfg.data_dir == train_cfg.data_dir
    and eval_cfg.split is None
    and train_cfg.split is None
  ):
    print(
      f"Note: train_input and eval_input read the same data_dir ({eval_cfg.data_dir}) without a split, so "
      "eval measures training data. For text, split: train / split: eval hold out every 20th document.",
      flush=True,
    )
  held: list[Any] = []

  def eval_data() -> Any:
    if not held:
      source = processors.eval_source(
        eval_cfg,
        seed=1 if rc.seed is None else rc.seed,
        num_csx=rc.num_csx,
        cache_dir=cache,
        features=eval_cfg.features,
      )
      check(source.features, "eval_input")
      held.append(processors.one_pass(source, eval_cfg.batch_size, eval_cfg.drop_remainder))
    return held[0]

  return {
    "train_data": train_data,
    "eval_data": eval_data,
    "batch_spec": batch_spec if train_cfg is not None else None,
    "eval_batch_spec": eval_batch_spec,
  }


def _bert_batch(batch: Batch) -> dict[str, Any]:
  """The data's feature names -> `models.bert.bert_loss`'s batch keys."""
  renamed = {"masked_lm_labels": "labels", "masked_lm_weights": "masked_lm_mask"}
  return {renamed.get(k, k): v for k, v in batch.items()}


def _language_model_task(
  params: Any, allowed: tuple[str, ...], kind: str, name: str, adapt: Callable[[Batch], Batch] | None = None
) -> Task:
  """BERT's and GPT's task: token data checked against the model's vocabulary and positions."""
  model = params.model
  positions = model.max_position_embeddings
  train_cfg = _with_vocab(_input_section(params, "train_input", allowed, kind), model.vocab_size)
  eval_cfg = _with_vocab(_input_section(params, "eval_input", allowed, kind), model.vocab_size)
  train_cfg = _with_sequence_length(train_cfg, positions, "train_input")
  eval_cfg = _with_sequence_length(eval_cfg, positions, "eval_input")
  sizes = _train_section(params, train_cfg, eval_cfg, f"the {kind} model")
  init_params, loss = functional(model)
  loss_fn = loss if adapt is None else (lambda p, batch: loss(p, adapt(batch)))

  def check(features: Mapping[str, np.ndarray], where: str) -> None:
    _check_tokens(features, model.vocab_size, model.max_position_embeddings, where)
    _check_ranges(features, _token_ranges(kind, model, features["input_ids"].shape[1]), where)
    weights = features.get("masked_lm_weights")
    if weights is not None and np.size(weights) and not (np.isfinite(weights).all() and (weights >= 0).all()):
      raise DataConfigError(
        f"{where}: masked_lm_weights holds {float(weights[~(np.isfinite(weights) & (weights >= 0))][0])}; the "
        "weights of the masked-LM loss are finite and not negative (1.0 for a real prediction, 0.0 for padding)"
      )

  data = _data(params, train_cfg, eval_cfg, check)
  spec = data["batch_spec"]

  def batch_spec() -> dict[str, Any]:  # --validate_only reads no data: the lengths are checked on the spec
    out = spec()
    _check_length(out["input_ids"].shape[1], model.max_position_embeddings, "train_input")
    return out

  eval_spec = data.get("eval_batch_spec")

  def eval_batch_spec() -> dict[str, Any]:
    out = eval_spec()
    _check_length(out["input_ids"].shape[1], model.max_position_embeddings, "eval_input")
    return out

  adjust = params.optimizer.adjust_learning_rate if params.optimizer is not None else None
  mup = model.describe(adjust)
  if mup:
    print(mup, flush=True)
  return Task(
    name=f"{name} (L={model.num_hidden_layers}, H={model.hidden_size})",
    init_params=init_params,
    loss_fn=loss_fn,
    batch_size=sizes.batch_size,
    learning_rate_multipliers=model.learning_rate_multipliers(adjust),  # muP (models.mup)
    **{
      **data,
      "batch_spec": batch_spec if spec is not None else None,
      "eval_batch_spec": eval_batch_spec if eval_cfg is not None else None,
    },
  )


def bert_task(params: Any) -> Task:
  """BERT MLM+NSP pre-training on ``train_input`` (the embedded corpus when it names no data_dir)."""
  model: BertConfig = params.model
  return _language_model_task(params, bert_data.PROCESSORS, "bert", model.name or "bert", _bert_batch)


def gpt_task(params: Any) -> Task:
  """GPT-2 / GPT-3 next-token training on ``train_input`` (the embedded corpus when no data_dir)."""
  model: GPT2Config = params.model
  return _language_model_task(params, gpt_data.PROCESSORS, "gpt", model.name or "gpt2")


def fc_mnist_task(params: Any) -> Task:
  """fc_mnist on the handwritten digits (scikit-learn's, shaped as MNIST); eval metric: accuracy."""
  model: FCMnistConfig = params.model
  allowed = mnist_data.PROCESSORS
  train_cfg = _input_section(params, "train_input", allowed, "fc_mnist")
  eval_cfg = _input_section(params, "eval_input", allowed, "fc_mnist")
  if eval_cfg is not None and eval_cfg.split is None:
    eval_cfg = eval_cfg.model_copy(update={"split": "val"})
  sizes = _train_section(params, train_cfg, eval_cfg, "fc_mnist (MNISTDataProcessor)")
  init_params, loss_fn = functional(model)
  model_of = bind(model)

  def accuracy(p: Any, batch: Batch) -> jax.Array:
    logits = model_of(p)(batch["images"])
    return jnp.mean((jnp.argmax(logits, axis=-1) == batch["labels"]).astype(jnp.float32))

  def check_width(images_shape: tuple[int, ...], where: str) -> None:
    """The one check of the pixels per image, on the real data (`check`) and the declared shapes (`batch_spec`)."""
    width = int(np.prod(images_shape[1:]))
    if width != model.input_size:
      raise DataConfigError(
        f"{where}: images have {width} pixels, model.input_size is {model.input_size}; set "
        f"model.input_size={width} (or remove it: the default is {INPUT_SIZE})"
      )

  def check(features: Mapping[str, np.ndarray], where: str) -> None:
    check_width(np.shape(features["images"]), where)
    labels = features["labels"]
    if labels.size and (labels.min() < 0 or labels.max() >= model.num_classes):
      raise DataConfigError(
        f"{where}: labels {int(labels.min())}..{int(labels.max())} are outside 0..{model.num_classes - 1} "
        f"(model.num_classes={model.num_classes}); a label out of range would index a logit that does "
        "not exist; raise model.num_classes or fix the labels"
      )

  data = _data(params, train_cfg, eval_cfg, check)
  spec = data["batch_spec"]

  def batch_spec() -> dict[str, Any]:  # --validate_only reads no data: the width is checked on the spec
    out = spec()
    check_width(out["images"].shape, "train_input")
    return out

  eval_spec = data.get("eval_batch_spec")

  def eval_batch_spec() -> dict[str, Any]:
    out = eval_spec()
    check_width(out["images"].shape, "eval_input")
    return out

  return Task(
    name="fc_mnist",
    init_params=init_params,
    loss_fn=loss_fn,
    batch_size=sizes.batch_size,
    **{
      **data,
      "batch_spec": batch_spec if spec is not None else None,
      "eval_batch_spec": eval_batch_spec if eval_spec is not None else None,
    },
    eval_metric=accuracy,
    eval_metric_name="accuracy",
  )


_BERT_INPUTS = dict.fromkeys(bert_data.PROCESSORS, bert_data.BertInput)
_GPT_INPUTS = dict.fromkeys(gpt_data.PROCESSORS, gpt_data.GptInput)
_MNIST_INPUTS = dict.fromkeys(mnist_data.PROCESSORS, mnist_data.MnistInput)

DEFAULT_JOB = Path(__file__).parent / "bert" / "configs" / "params_bert_tiny_default.yaml"

BERT = ModelSpec(
  names=("bert",),
  config=BertConfig,
  build_task=bert_task,
  data_processors=_BERT_INPUTS,
  default_job=(
    str(DEFAULT_JOB),
    "BERT-tiny MLM+NSP on the embedded corpus (Python's own docs), cbfloat16 with dynamic loss scaling",
    10,
  ),
)
GPT = ModelSpec(names=("gpt2", "gpt3"), config=GPT2Config, build_task=gpt_task, data_processors=_GPT_INPUTS)
FC_MNIST = ModelSpec(
  names=("fc_mnist",),
  config=FCMnistConfig,
  build_task=fc_mnist_task,
  data_processors=_MNIST_INPUTS,
  eval_metric="accuracy",
)
SPECS = (BERT, GPT, FC_MNIST)
