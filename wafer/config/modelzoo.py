"""Params files as Cerebras' Model Zoo releases wrote them: what is inferred, ignored, translated, refused.

Every release's layout loads unchanged (docs/guides/modelzoo-params.md). Before a file is validated,
:func:`adapt` rewrites its legacy-layout dict and says what it did in one note per kind:

* **inferred**: ``model.name`` when it is missing (modelzoo up to 2.3 chose the model by the folder the
  file sat in): from the data processor, else the file's path, else the model keys only one model
  takes; fc_mnist's ``data_processor`` when the file names none (one processor feeds it);
* **ignored**: keys that only steer the real cluster, logging or performance (:data:`IGNORED`, each
  with its reason; the one table the docs print);
* **translated**: keys whose meaning moved (:data:`RENAMED`);
* **refused**: features wafer does not have (:data:`FEATURES`), all named in one problem.

The defaults that changed across releases (the half type when ``fp16_type`` is absent) follow the
file's release (:func:`release_of`, :class:`Release`).

>>> data = {"train_input": {"data_processor": "MNISTDataProcessor", "batch_size": 8, "repeat": True},
...         "model": {"depth": 2}}
>>> feeds = {"MNISTDataProcessor": ("fc_mnist",)}
>>> out = adapt(data, "fc_mnist/params.yaml", lambda p: feeds.get(p, ()), {"fc_mnist": object})
>>> out.data["model"]["name"], "train_input" in out.data, out.data["train_input"].get("repeat")
('fc_mnist', True, None)
>>> print(out.notes[-1])
note: model.name is missing: using 'fc_mnist', the model of train_input.data_processor 'MNISTDataProcessor'
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from wafer.config.errors import Loc, Problem, dotted

MZ = "https://github.com/Cerebras/modelzoo/blob/"
"""Public sources: ``MZ + '<tag>/<path>'``."""

_INPUTS = ("train_input", "eval_input")

IGNORED: dict[tuple[str, str], str] = {
  ("runconfig", "multireplica"): "runs several copies of a small model on one CS system for throughput "
  "(performance; R_1.6.0 modelzoo/common/pytorch/pytorch_base_cs_runner.py)",
  ("runconfig", "use_appliance_data"): "where the appliance reads the data from (cluster; Release_1.9.1 "
  "modelzoo/common/pytorch/pytorch_base_runner.py)",
  (
    "runconfig",
    "execution_strategy",
  ): "pipeline or weight-streaming execution on the CS system (performance; "
  "`wafer estimate` chooses its own mode; Release_1.8.0 modelzoo/common/pytorch/pytorch_base_runner.py)",
  ("runconfig", "save_summary_steps"): "TensorBoard summary frequency of the TF estimator (logging; the "
  "PyTorch runners never read it; wafer logs every runconfig.log_steps)",
  ("runconfig", "keep_checkpoint_max"): "checkpoint retention of the TF estimator (the PyTorch runners never "
  "read it; wafer's key is runconfig.max_checkpoints)",
  ("runconfig", "cs_ip"): "the address of the CS system (cluster; R_1.6.0 modelzoo/common/pytorch/utils.py)",
  ("model", "allow_multireplica"): "allows multireplica runs (performance; Release_1.8.0 "
  "modelzoo/common/pytorch/PyTorchBaseModel.py)",
  ("model", "attention_kernel"): "which compiler kernel computes attention (performance; the same attention; "
  "Release_1.8.0 modelzoo/common/pytorch/layers/AttentionLayer.py)",
  ("input", "buckets"): "groups examples of similar length into batches for variable-sequence-length "
  "throughput (performance; R_1.6.0 modelzoo/transformers/pytorch/bert/input/BertCSVDynamicMaskDataProcessor.py)",
  ("input", "repeat"): "repeats the dataset (Release_1.8.0 modelzoo/transformers/pytorch/bert/input/"
  "BertCSVDataProcessor.py; wafer's input pipeline already runs over as many epochs as the run needs)",
  ("input", "use_multiple_workers"): "multiple input workers on a CS-1 (cluster; modelzoo's PyTorch code "
  "never reads it; wafer's input workers are runconfig.num_workers_per_csx)",
  ("input", "mixed_precision"): "never read by the PyTorch GPT data processors (Release_1.8.0 "
  "modelzoo/transformers/pytorch/gpt2/input); the policy (model.mixed_precision, model.fp16_type) decides "
  "the compute format",
  (
    "optimizer",
    "ws_summary",
  ): "weight-streaming summaries (logging; modelzoo's PyTorch code at Release_1.8.0 "
  "and later never reads it)",
  (
    "optimizer",
    "use_bias_correction",
  ): "never read by modelzoo's PyTorch optimizers (they read correct_bias; "
  "Release_1.9.1 modelzoo/common/pytorch/PyTorchBaseModel.py)",
  ("scheduler", "alpha"): "never read by modelzoo's learning-rate schedulers up to 2.3 (Release_1.9.1 "
  "modelzoo/common/pytorch/PyTorchBaseModel.py, _configure_lr_scheduler)",
  ("runconfig", "save_checkpoint_steps"): "never read by modelzoo's PyTorch runners (R_1.7.1; a TF estimator "
  "key; wafer's is runconfig.checkpoint_steps)",
  ("runconfig", "log_step_count_steps"): "never read by modelzoo's PyTorch runners (R_1.7.0; a TF estimator "
  "logging key; wafer logs every runconfig.log_steps)",
  (
    "scheduler",
    "decay_steps",
  ): "given with steps: modelzoo up to 1.9 overwrote decay_steps with steps (R_1.7.0 "
  "modelzoo/common/pytorch/PyTorchBaseModel.py, _configure_lr_scheduler)",
  (
    "input",
    "use_worker_cache",
  ): "copies the dataset to the input workers' local disk (performance; Release_2.4.0 "
  "src/cerebras/modelzoo/data/common/h5_map_dataset/dataset.py)",
  ("callback", "ComputeNorm"): "logs the norms of the weights and gradients (logging; Release_2.4.3 "
  "src/cerebras/modelzoo/trainer/callbacks/norm.py)",
}
"""``{(section, key): why it is ignored}``: keys that only steer the real cluster, logging or performance,
or that modelzoo itself never read. ``input`` is ``train_input`` and ``eval_input``; ``scheduler`` a
learning-rate scheduler of ``optimizer.learning_rate``; ``callback`` a trainer-layout callback."""


def ignored_table() -> str:
  """:data:`IGNORED` as the Markdown table rows of docs/guides/modelzoo-params.md (the docs print this;
  a test checks they agree)."""
  return "\n".join(f"| `{section}.{key}` | {why} |" for (section, key), why in IGNORED.items())


@dataclasses.dataclass(frozen=True)
class Rename:
  """A key whose meaning moved: ``source`` -> ``target`` with ``value(old)``; None drops it."""

  source: tuple[str, str]
  target: tuple[str, str] | None
  value: Callable[[Any], Any]
  why: str


def _dynamic_mlm(v: Any) -> Any:
  return "num_masked" if v is True else "batch_size" if v is False else v


RENAMED: tuple[Rename, ...] = (
  Rename(
    ("input", "dynamic_mlm_scale"),
    ("model", "mlm_loss_scaling"),
    _dynamic_mlm,
    "1.x scaled the MLM loss by batch_size / number of masked tokens (R_1.6.0 "
    "modelzoo/transformers/pytorch/bert/input/BertCSVDynamicMaskDataProcessor.py): True is "
    "mlm_loss_scaling: num_masked, False batch_size",
  ),
  Rename(
    ("model", "precision_opt_level"),
    ("runconfig", "precision_opt_level"),
    lambda v: v,
    "1.8 read it under model (Release_1.8.0 modelzoo/common/pytorch/pytorch_cs_appliance.py); "
    "runconfig's wins when both are set (Release_1.9.1 modelzoo/common/pytorch/run_cstorch_flow.py)",
  ),
  Rename(
    ("model", "use_position_embedding"),
    None,
    lambda v: v,
    "True (learned position embeddings) is the only behaviour wafer's models have (R_1.6.0 "
    "modelzoo/transformers/pytorch/gpt2/model.py)",
  ),
)
"""Keys whose name or place changed between releases."""

FEATURES: dict[str, tuple[tuple[str, str], ...]] = {
  "TensorFlow input (TFRecords / tf.data, the TF estimator)": (
    ("input", "num_parallel_calls"),
    ("runconfig", "save_checkpoints_steps"),
    ("runconfig", "tf_random_seed"),
    ("model", "hidden_sizes"),
    ("model", "use_vsl"),
  ),
}
"""``{feature: keys}``: features wafer does not have, refused with every key of the file named.
A ``data_processor`` reading TFRecords (``*Tf*Processor``) is TensorFlow input too."""

MODELZOO_MODELS: dict[str, str] = {
  "bert/classifier": "BERT classifier (fine-tuning)",
  "bert/extractive_summarization": "BERT extractive summarization (fine-tuning)",
  "bert/qa": "BERT question answering (fine-tuning)",
  "bert/token_classifier": "BERT token classifier (fine-tuning)",
  "bloom": "BLOOM",
  "btlm": "BTLM",
  "dino": "DINOv2",
  "dit": "DiT (diffusion transformer)",
  "dpo": "DPO",
  "dpr": "DPR",
  "esm2": "ESM-2",
  "falcon": "Falcon",
  "gemma2": "Gemma 2",
  "gptj": "GPT-J / GPT-NeoX",
  "jais": "Jais",
  "layers_api_demo": "layers API demo",
  "llama": "LLaMA",
  "llava": "LLaVA",
  "mistral": "Mistral",
  "mixtral": "Mixtral (mixture of experts)",
  "multimodal_simple": "multimodal (simple)",
  "santacoder": "SantaCoder",
  "starcoder": "StarCoder",
  "t5": "T5",
  "transformer": "Transformer (encoder-decoder)",
  "unet": "UNet",
  "vision_transformer": "ViT (vision transformer)",
}
"""``{model name or folder: the model}``: Cerebras Model Zoo models that wafer's own models are not (their
``model.name`` from 2.4 on, their folder under ``transformers/pytorch``, ``vision/pytorch`` or
``models/<domain>`` before). A file of one is refused as that model, never read key by key as one of
wafer's (`other_model`, `wafer.registry.unknown_model`)."""


@dataclasses.dataclass(frozen=True)
class Evidence:
  """A ``model`` key (and values) that only models wafer does not have use: a legacy file without
  ``model.name`` that has it is of one of those models, whatever its data processor feeds."""

  key: str
  values: tuple[Any, ...] | None
  """The values that are evidence (None: any); strings compare case-insensitively."""
  feature: str
  models: str
  """The Model Zoo models that use it (as a hint when the file's folder does not name its model)."""

  def found(self, model: Mapping[str, Any]) -> bool:
    if self.key not in model:
      return False
    value = model[self.key]
    if self.values is None:
      return True
    value = value.lower() if isinstance(value, str) else value
    return any(value == v and type(value) is type(v) for v in self.values)


EVIDENCE: tuple[Evidence, ...] = (
  Evidence(
    "position_embedding_type",
    ("rotary",),
    "rotary position embeddings",
    "GPT-J, GPT-NeoX, LLaMA, Mistral, Mixtral, Falcon, Gemma 2, ESM-2",
  ),
  Evidence("position_embedding_type", ("alibi",), "ALiBi attention biases", "BLOOM, BTLM, Jais"),
  Evidence("position_embedding_type", ("relative",), "relative position biases", "T5"),
  Evidence(
    "nonlinearity",
    ("swiglu", "geglu", "reglu", "liglu", "glu"),
    "a gated feed-forward",
    "LLaMA, Mistral, Mixtral, BTLM, Jais, Gemma 2",
  ),
  Evidence(
    "attention_module",
    ("multiquery_attention",),
    "multi-query or grouped-query attention",
    "Falcon, StarCoder, SantaCoder, LLaMA 2/3 70B, Mistral, Mixtral",
  ),
  Evidence("use_rms_norm", (True,), "RMSNorm", "LLaMA"),
  Evidence("norm_type", ("rmsnorm",), "RMSNorm", "LLaMA, Mistral, Mixtral, Jais, Gemma 2"),
  Evidence("moe", None, "a mixture of experts", "Mixtral"),
  Evidence("attention_sliding_window_length", None, "sliding-window attention", "Mistral, Gemma 2"),
)
"""What marks a legacy file (no ``model.name``) as another model's. Each is a key or value wafer's models
reject (a test checks it against every registered model), so no file wafer runs is refused for it."""

_ZOO_FOLDER = re.compile(r"(?:^|/)(?:pytorch|models/[a-z0-9_]+)/((?:[a-z0-9_]+/)+?)configs/")
"""The model's folder in Model Zoo's tree: ``transformers/pytorch/<model>/configs/`` (up to 2.0),
``models/<domain>/<model>/configs/`` (2.1 on), with ``fine_tuning/`` between model and task up to 2.0."""


def zoo_folder(path: str | None) -> str | None:
  """The model a file's Model Zoo folder names (``"llama"``, ``"bert/classifier"``), or None when the path
  is not in Model Zoo's tree.

  >>> zoo_folder("modelzoo/transformers/pytorch/bert/fine_tuning/classifier/configs/bert_base_sst2.yaml")
  'bert/classifier'
  >>> zoo_folder("src/cerebras/modelzoo/models/nlp/gptj/continuous_pretraining/configs/p.yaml")
  'gptj'
  """
  if not path:
    return None
  found = _ZOO_FOLDER.search(str(path).replace("\\", "/").lower())
  if found is None:
    return None
  parts = [p for p in found.group(1).strip("/").split("/") if p != "fine_tuning"]
  for n in range(len(parts), 0, -1):
    if "/".join(parts[:n]) in MODELZOO_MODELS:
      return "/".join(parts[:n])
  return parts[0]


def _takes(schema: Any, key: str, value: Any) -> bool:
  """Whether the model schema ``schema`` takes ``model.<key> = value`` (its other keys aside)."""
  from pydantic import ValidationError

  try:
    schema.model_validate({key: value})
  except ValidationError as error:
    return not any(tuple(e.get("loc", ()))[:1] == (key,) for e in error.errors())
  except Exception:  # noqa: BLE001 - a model-level check of the other keys: this key was taken
    return True
  return True


def other_model(
  data: Mapping[str, Any],
  path: str | None,
  models_of: Callable[[str], tuple[str, ...]],
  schemas: Mapping[str, Any],
  where: Callable[[Loc], str] = dotted,
) -> Problem | None:
  """The refusal of a legacy file without ``model.name`` that is of a Model Zoo model wafer does not
  have, or None: its ``model`` keys show it (:data:`EVIDENCE`, unless a model its data processors feed
  takes that value: a plugin's rotary model), or its Model Zoo folder names such a model
  (:data:`MODELZOO_MODELS`) and no data processor of the file feeds one of wafer's models.

  Args:
    schemas: the registered models' schemas, by name (a folder that names one is not another model's).
    where: how a key path is shown (as written, with its line).
  """
  names = sorted(schemas)
  model = data.get("model") if isinstance(data.get("model"), dict) else {}
  registered = {n.lower() for n in names}
  folder = zoo_folder(path)
  folder = folder if folder in MODELZOO_MODELS and folder not in registered else None
  ours = [
    p
    for s in _sections(data, "input")
    if isinstance(p := data[s].get("data_processor"), str) and models_of(p)
  ]
  fed = [schemas[m] for p in ours for m in models_of(p) if m in schemas]
  shown = [e for e in EVIDENCE if e.found(model) and not any(_takes(f, e.key, model[e.key]) for f in fed)]
  if not shown and (folder is None or ours):
    return None
  evidence = "; ".join(f"{e.feature}: {where(('model', e.key))}" for e in shown)
  if folder is not None:
    what = f"a Cerebras Model Zoo {MODELZOO_MODELS[folder]} file (its folder {folder!r}"
    what += f"; {evidence})" if evidence else ")"
  else:
    models = sorted({m.strip() for e in shown for m in e.models.split(",")})
    what = f"a file of a Cerebras Model Zoo model ({', '.join(models)}): {evidence}"
  return Problem(
    ("model",),
    f"this is {what}. Wafer does not have that model, so the file cannot run here; wafer's models: "
    f"{', '.join(sorted(names))}",
  )


_TF_PROCESSOR = re.compile(r"tf(records)?(data)?processor$|tfrecords", re.IGNORECASE)
_ONE_X = (
  ("runconfig", "save_losses"),
  ("runconfig", "show_debug_metrics"),
  ("runconfig", "multireplica"),
  ("runconfig", "use_appliance_data"),
  ("runconfig", "execution_strategy"),
  ("model", "use_bfloat16"),
  ("model", "precision_opt_level"),
  ("model", "use_position_embedding"),
  ("model", "allow_multireplica"),
  ("input", "dynamic_mlm_scale"),
  ("", "csconfig"),
)
"""Keys of the 1.x era (they mark a legacy file as 1.x or 2.0: ``model.use_bfloat16``,
``use_position_embedding`` and ``runconfig.use_appliance_data`` are in Release_2.0.3 files too, and
``csconfig`` in a 2.2 one). ``runconfig.use_cs_grad_accum`` is not one: Release_2.0.3 and 2.1.1 files
have it too."""

_UP_TO_1_8 = (
  ("model", "allow_multireplica"),
  ("model", "enable_vts"),
  ("runconfig", "execution_strategy"),
  ("runconfig", "log_step_count_steps"),
  ("runconfig", "multireplica"),
  ("runconfig", "save_summary_steps"),
  ("input", "buckets"),
  ("input", "dynamic_mlm_scale"),
)
"""Keys that files of R_1.6.0 to Release_1.8.0 have and no file of Release_1.9.1 or later (every
legacy-layout params file of the modelzoo's 23 tags: 84 of the 184 files of 1.6-1.8 have one, none of
the 897 later ones): such a file is of a release before 1.9."""

_FROM_1_9 = (
  ("optimizer", "weight_decay"),
  ("optimizer", "betas"),
  ("runconfig", "precision_opt_level"),
  ("runconfig", "eval_frequency"),
  ("model", "pooler_nonlinearity"),
  ("model", "fp16_type"),
  ("model", "attention_module"),
  ("model", "norm_type"),
  ("input", "micro_batch_size"),
)
"""Keys that no file of 1.6-1.8 has and most later ones do (853 of the 897 legacy-layout files of
Release_1.9.1 and later have one): such a file is of 1.9 or later."""

ADAMW_CORRECT_BIAS_SOURCES = (
  MZ + "Release_1.8.0/modelzoo/common/pytorch/PyTorchBaseModel.py",
  MZ + "Release_1.9.1/modelzoo/common/pytorch/PyTorchBaseModel.py",
)
"""Where modelzoo's AdamW default of ``correct_bias`` changed: False up to 1.8 (AdamW built with
``correct_bias=oparams.get("correct_bias", False)``, as in R_1.6.0 and R_1.7.1: BERT's AdamW, without
bias correction), True from 1.9 on (``oparams.get("correct_bias", True)``)."""


@dataclasses.dataclass(frozen=True)
class Release:
  """The Model Zoo release a file was written for, and the defaults that follow from it.

  Attributes:
    name: ``"1.x (up to 1.8)"``, ``"1.x or 2.0"``, ``"2.1-2.3"``, ``"legacy layout (<= 2.3)"`` (not
      decidable), ``"2.4+"``, or the release given (``runconfig.modelzoo_release``).
    half_dtype: the half type when the file gives none (``model.fp16_type`` / ``use_bfloat16``).
    reason: how the release was decided.
    source: where the half-type default of that release is (a public URL and what it says).
    adamw_correct_bias: AdamW's ``correct_bias`` when the file gives none: False up to 1.8, True from
      1.9 on (:data:`ADAMW_CORRECT_BIAS_SOURCES`); None when the file does not decide it (True is
      used, with a note: `adamw_default`).
  """

  name: str
  half_dtype: str
  reason: str
  source: str
  adamw_correct_bias: bool | None = True


def _parsed(given: Any) -> tuple[int, int | None] | None:
  """``(major, minor)`` of a ``runconfig.modelzoo_release`` as `wafer.costmodel.release.parse_release`
  reads it (minor None for ``"2.x"``); None for a release it refuses (the schema reports that)."""
  from wafer.costmodel.release import parse_release  # lazily: the cost model's package is large
  from wafer.errors import EstimateError

  try:
    release = parse_release(given)
  except EstimateError:
    return None
  return (release.major, release.minor)


_HALF_SOURCES = {
  "old": MZ + "Release_1.9.1/modelzoo/common/pytorch/run_cstorch_flow.py (use_bfloat16 defaults to False: "
  "float16)",
  "bert": MZ + "Release_2.3.1/src/cerebras/modelzoo/models/nlp/bert/utils.py (fp16_type defaults to float16)",
  "gpt": MZ + "Release_2.3.1/src/cerebras/modelzoo/models/nlp/gpt2/utils.py (fp16_type defaults to bfloat16)",
  "other": MZ + "Release_2.3.1/src/cerebras/modelzoo/common/half_dtype.py (fp16_type defaults to float16)",
  "trainer": MZ + "Release_2.4.3/src/cerebras/modelzoo/trainer/callbacks/precision.py (fp16_type defaults "
  "to bfloat16)",
}


def _half_of(version: tuple[int, int], model: str | None) -> tuple[str, str]:
  if version >= (2, 4):
    return "bfloat16", _HALF_SOURCES["trainer"]
  if version <= (2, 0):
    return "float16", _HALF_SOURCES["old"]
  if model is not None and model.lower().startswith("gpt"):
    return "bfloat16", _HALF_SOURCES["gpt"]
  return "float16", _HALF_SOURCES["bert" if model == "bert" else "other"]


def release_of(data: Mapping[str, Any], *, trainer_layout: bool, model: str | None) -> Release:
  """The release of a (legacy-layout, converted if it was a trainer-layout) params dict.

  From ``runconfig.modelzoo_release`` when given; else the trainer layout is 2.4+, a legacy file with
  a key no file of 1.9 or later has (:data:`_UP_TO_1_8`) is "1.x (up to 1.8)", one with a 1.x-era key
  (:data:`_ONE_X`) "1.x or 2.0", one with ``model.fp16_type`` (introduced in 2.1) 2.1-2.3; any other
  legacy file is "legacy layout (<= 2.3)", its half default that of 1.x/2.0 (float16). AdamW's
  ``correct_bias`` default is decided by the first, or by a key of 1.9 and later (:data:`_FROM_1_9`).

  >>> release_of({"model": {}}, trainer_layout=True, model="gpt3").half_dtype
  'bfloat16'
  >>> release_of({"runconfig": {"save_summary_steps": 10}}, trainer_layout=False, model="bert").name
  '1.x (up to 1.8)'
  >>> release_of({"runconfig": {"save_losses": True}}, trainer_layout=False, model="bert").name
  '1.x or 2.0'
  """
  rc = data.get("runconfig") if isinstance(data.get("runconfig"), dict) else {}
  given = rc.get("modelzoo_release")
  parsed = None if given is None else _parsed(given)
  if parsed is not None and (parsed[1] is not None or parsed[0] == 1):  # every 1.x defaults to float16
    half, src = _half_of((parsed[0], parsed[1] or 0), model)
    before_1_9 = parsed[0] == 1 and (parsed[1] is None or parsed[1] <= 8)  # "1.x": a release before 1.9
    return Release(str(given), half, f"runconfig.modelzoo_release={given}", src, not before_1_9)
  if parsed is None:
    return _infer(data, trainer_layout=trainer_layout, model=model)
  # "2.x": a 2.x file, whatever 1.x-era keys it kept (AdamW corrects its bias in every 2.x)
  inferred = _infer(data, trainer_layout=trainer_layout, model=model, two=True)
  why = f"runconfig.modelzoo_release={given} names no minor release (2.0, 2.1-2.3 and 2.4+ differ)"
  return dataclasses.replace(inferred, reason=f"{why}; {inferred.reason}", adamw_correct_bias=True)


def dated_by(written: Mapping[str, Any], merged: Mapping[str, Any]) -> dict[str, Any]:
  """What `release_of` reads: the params file as ``written`` (before command-line overrides, whose keys
  date nothing: ``runconfig.precision_opt_level=1`` does not make a 1.8 file one of 1.9), with the
  ``runconfig.modelzoo_release`` of ``merged`` (the file's or an override's: a release given decides).

  >>> dated_by({"runconfig": {"save_summary_steps": 10}}, {"runconfig": {"eval_frequency": 5}})
  {'runconfig': {'save_summary_steps': 10}}
  >>> dated_by({}, {"runconfig": {"modelzoo_release": "1.8"}})
  {'runconfig': {'modelzoo_release': '1.8'}}
  """
  rc = merged.get("runconfig")
  given = rc.get("modelzoo_release") if isinstance(rc, dict) else None
  written_rc = written.get("runconfig")
  out = dict(written)
  if given is not None:
    out["runconfig"] = {**(written_rc if isinstance(written_rc, dict) else {}), "modelzoo_release": given}
  elif isinstance(written_rc, dict) and "modelzoo_release" in written_rc:  # overridden to null: inferred
    out["runconfig"] = {k: v for k, v in written_rc.items() if k != "modelzoo_release"}
  return out


def _infer(data: Mapping[str, Any], *, trainer_layout: bool, model: str | None, two: bool = False) -> Release:
  """`release_of` from the file's layout and keys alone (``two``: the file is of a 2.x release, so its
  1.x-era keys date nothing)."""
  if trainer_layout:
    half, src = _half_of((2, 4), model)
    return Release("2.4+", half, "trainer layout (2.4 and later)", src)
  early = [] if two else [dotted(loc) for loc in _present(data, _UP_TO_1_8)]
  later = bool(_present(data, _FROM_1_9))
  if early and not later:
    half, src = _half_of((1, 8), model)
    why = f"legacy layout with keys no file of 1.9 or later has: {', '.join(early[:3])}"
    return Release("1.x (up to 1.8)", half, why, src, False)
  decided = None if early or not later else True  # AdamW's default: keys of both eras decide nothing
  marks = [] if two else [dotted(loc) for loc in _present(data, _ONE_X)]
  if marks:
    half, src = _half_of((1, 9), model)
    why = f"legacy layout with keys of 1.x and 2.0 files: {', '.join(marks[:3])}"
    return Release("1.x or 2.0", half, why, src, decided)
  model_section = data.get("model") if isinstance(data.get("model"), dict) else {}
  if "fp16_type" in model_section:
    half, src = _half_of((2, 3), model)
    return Release("2.1-2.3", half, "legacy layout with model.fp16_type (2.1 to 2.3)", src, decided)
  half, src = _half_of((2, 0), model)
  other = ""
  if _half_of((2, 3), model)[0] != half:
    other = (
      f"; 2.1-2.3 would have used {_half_of((2, 3), model)[0]} for this model: set model.fp16_type, or "
      "runconfig.modelzoo_release, to decide"
    )
  return Release("legacy layout (<= 2.3)", half, f"legacy layout, release not decidable{other}", src, decided)


def adamw_default(data: dict[str, Any], release: Release) -> str | None:
  """Give an AdamW section without ``correct_bias`` its release's default (in ``data``, a legacy-layout
  dict); returns the note that says so, or None when there is nothing to say.

  Up to 1.8 modelzoo's AdamW did not correct its moments' bias (BERT's AdamW): the first update is
  ``(1 - beta1) / sqrt(1 - beta2)`` times the corrected one (3.2x at beta1 0.9, beta2 0.999).

  >>> data = {"optimizer": {"optimizer_type": "AdamW"}}
  >>> adamw_default(data, Release("1.x (up to 1.8)", "float16", "", "", False)).split(":")[1]
  ' optimizer.correct_bias not given'
  >>> data["optimizer"]["correct_bias"]
  False
  """
  opt = data.get("optimizer")
  if not isinstance(opt, dict) or str(opt.get("optimizer_type", "")).lower() != "adamw":
    return None
  if "correct_bias" in opt or release.adamw_correct_bias is True:
    return None
  old, new = ADAMW_CORRECT_BIAS_SOURCES
  if release.adamw_correct_bias is False:
    opt["correct_bias"] = False
    return (
      f"note: optimizer.correct_bias not given: False, AdamW's default up to Model Zoo 1.8 ({old}); "
      "1.9 and later default to True"
    )
  return (
    f"note: optimizer.correct_bias not given: True, AdamW's default from Model Zoo 1.9 on ({new}); up to "
    f"1.8 it was False ({old}), and this file does not say which it is ({release.reason}): set "
    "optimizer.correct_bias, or runconfig.modelzoo_release, to decide"
  )


def _sections(data: Mapping[str, Any], section: str) -> list[str]:
  return [s for s in (_INPUTS if section == "input" else (section,)) if isinstance(data.get(s), dict)]


def _present(data: Mapping[str, Any], keys: Sequence[tuple[str, str]]) -> list[Loc]:
  """The key paths of ``keys`` that ``data`` has (``""``: top level; ``input``: either input section)."""
  out: list[Loc] = []
  for section, key in keys:
    if section == "":
      if key in data:
        out.append((key,))
      continue
    for s in _sections(data, section):
      if key in data[s]:
        out.append((s, key))
  return out


@dataclasses.dataclass
class Adapted:
  """What :func:`adapt` made of a params dict: the dict to validate, the notes and the problems."""

  data: dict[str, Any]
  notes: list[str]
  problems: list[Problem]
  alone: bool = False
  """The refusal is the whole report: the file is a TensorFlow (estimator) file, or one of a Model Zoo
  model wafer does not have (`other_model`); its other keys are that model's, not wafer's business."""
  inferred: str | None = None
  """How the model was chosen when the file names none (``"using 'gpt2', the model of ..."``)."""
  renames: tuple[tuple[Loc, Loc], ...] = ()
  """``(key path validated, key path as written)`` of the 1.x keys moved (`RENAMED`): a problem of the
  moved key names the one the file (or an override) wrote."""


def features_problem(locs: Mapping[str, list[Loc]], where: Callable[[Loc], str] = dotted) -> Problem | None:
  """One problem naming every key of every feature wafer lacks (``{feature: key paths}``), or None.

  ``where(loc)``: how a key is shown (its path as written and its line).
  """
  found = {f: ls for f, ls in locs.items() if ls}
  if not found:
    return None
  at = where

  parts = [f"{f}: {', '.join(at(loc) for loc in ls)}" for f, ls in found.items()]
  first = next(iter(found.values()))[0]
  return Problem(
    first,
    "uses features wafer does not have, so it cannot run here: "
    + "; ".join(parts)
    + ". "
    + (
      "This is a TensorFlow Model Zoo file: start from the PyTorch params file of the same model"
      if any(f.startswith("TensorFlow") for f in found)
      else "Remove these keys to run the model without them (the results then differ from the original run's)"
    ),
  )


def feature_locs(data: Mapping[str, Any]) -> dict[str, list[Loc]]:
  """``{feature: key paths}`` of the features wafer lacks in a legacy-layout dict."""
  out = {f: _present(data, keys) for f, keys in FEATURES.items()}
  tf = next(f for f in FEATURES if f.startswith("TensorFlow"))
  for s in _sections(data, "input"):
    processor = data[s].get("data_processor")
    if isinstance(processor, str) and _TF_PROCESSOR.search(processor):
      out[tf].insert(0, (s, "data_processor"))
  return out


def _model_from_path(path: str | None, names: Sequence[str]) -> str | None:
  """The registered name the path names last (the deepest folder or the file name), or None."""
  if not path:
    return None
  text = str(path).lower()
  best: tuple[int, str] | None = None
  for name in names:
    for m in re.finditer(rf"(?<![a-z0-9]){re.escape(name.lower())}(?![a-z0-9])", text):
      if best is None or m.start() > best[0]:
        best = (m.start(), name)
  return best[1] if best else None


def infer_model(
  data: Mapping[str, Any],
  path: str | None,
  models_of: Callable[[str], tuple[str, ...]],
  schemas: Mapping[str, type],
) -> tuple[str | None, str]:
  """``(model name, what it was inferred from)``; ``(None, what would decide it)`` when undecidable.

  Args:
    data: the legacy-layout dict (``model.name`` absent).
    path: the file's path (modelzoo up to 2.3 chose the model by its folder).
    models_of: data processor -> the names of the model it feeds (the registry's table).
    schemas: registered model name -> its schema (the model keys each model takes).
  """
  names = sorted(schemas)
  for s in _sections(data, "input"):
    processor = data[s].get("data_processor")
    if isinstance(processor, str) and models_of(processor):
      family = models_of(processor)
      chosen = _model_from_path(path, family) or family[0]
      return chosen, f"the model of {s}.data_processor {processor!r}"
  by_path = _model_from_path(path, names)
  if by_path is not None:
    return by_path, f"the file's path {str(path)!r}"
  model = data.get("model") if isinstance(data.get("model"), dict) else {}
  keys = set(model) - {"name"}
  fits: dict[type, list[str]] = {}
  for name in names:
    fields = getattr(schemas[name], "model_fields", {})
    if keys and keys <= set(fields):
      fits.setdefault(schemas[name], []).append(name)
  if len(fits) == 1:
    found = next(iter(fits.values()))
    return found[0], f"the model keys (only {'/'.join(found)} takes all of {', '.join(sorted(keys))})"
  return None, (
    "it could not be inferred: no train_input.data_processor of a registered model, no model name in the "
    "file's path, and the model keys fit "
    + (
      "several models (" + ", ".join("/".join(v) for v in fits.values()) + ")" if fits else "no single model"
    )
    + f"; set model.name to one of {', '.join(names)}"
  )


def adapt(
  data: dict[str, Any],
  path: str | None,
  models_of: Callable[[str], tuple[str, ...]],
  schemas: Mapping[str, type] | None = None,
  processors_of: Callable[[str], tuple[str, ...]] | None = None,
  where: Callable[[Loc], str] = dotted,
  ignored: Sequence[str] = (),
) -> Adapted:
  """Rewrite a legacy-layout params dict as wafer validates it; see the module doc.

  Args:
    data: the parsed file (legacy layout; a trainer-layout file after its conversion). Not modified.
    path: the file's path, for inferring the model.
    models_of: data processor -> model names (empty: not registered).
    schemas: model name -> model schema, for inferring the model from its keys.
    processors_of: model name -> the data processors that feed it (fc_mnist without one).
    where: how a key path is shown in the refusal of missing features (as written, with its line).
    ignored: keys already ignored (a trainer-layout callback), for the one note of ignored keys.
  """
  data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
  notes: list[str] = []
  problems: list[Problem] = []
  features = feature_locs(data)
  refused = features_problem(features, where)
  if refused is not None and any(features[f] for f in features if f.startswith("TensorFlow")):
    return Adapted(data, [], [refused], alone=True)
  model = data.get("model")
  if isinstance(model, dict) and model.get("name") is None and schemas is not None:
    other = other_model(data, path, models_of, schemas, where)
    if other is not None:
      return Adapted(data, [], [other], alone=True)
  if refused is not None:
    problems.append(refused)
    for locs in feature_locs(data).values():
      for loc in locs:
        if loc[-1] != "data_processor":
          _drop(data, loc)
  ignored = list(ignored)
  for (section, key), why in IGNORED.items():
    for loc in _present(data, ((section, key),)):
      _drop(data, loc)
      ignored.append(f"{dotted(loc)} ({why})")
  optimizer = data.get("optimizer")
  if isinstance(optimizer, dict) and isinstance(optimizer.get("learning_rate"), list):
    rates = [dict(r) if isinstance(r, dict) else r for r in optimizer["learning_rate"]]
    for i, r in enumerate(rates):
      if (
        isinstance(r, dict) and "alpha" in r and str(r.get("scheduler", "")).lower() in ("linear", "linearlr")
      ):
        del r["alpha"]
        ignored.append(f"optimizer.learning_rate[{i}].alpha ({IGNORED[('scheduler', 'alpha')]})")
      if isinstance(r, dict) and "steps" in r and "decay_steps" in r:
        del r["decay_steps"]
        ignored.append(f"optimizer.learning_rate[{i}].decay_steps ({IGNORED[('scheduler', 'decay_steps')]})")
    data["optimizer"] = {**optimizer, "learning_rate": rates}
  if ignored:
    notes.append(
      "note: ignored, as they only steer the real system or were never read: " + "; ".join(ignored)
    )
  translated = []
  moved: list[tuple[Loc, Loc]] = []
  for rename in RENAMED:
    for loc in _present(data, (rename.source,)):
      value = data[loc[0]].pop(loc[1])
      if rename.source == ("model", "use_position_embedding"):
        if value is not True:
          problems.append(
            Problem(loc, "must be True: wafer's models always add learned position embeddings", value)
          )
        else:
          translated.append(f"{dotted(loc)}: True dropped ({rename.why})")
        continue
      assert rename.target is not None
      target = data.setdefault(rename.target[0], {})
      if isinstance(target, dict) and rename.target[1] not in target:
        target[rename.target[1]] = rename.value(value)
        moved.append((rename.target, loc))
        translated.append(
          f"{dotted(loc)}: {value!r} -> {dotted(rename.target)}: {target[rename.target[1]]!r} ({rename.why})"
        )
      elif isinstance(target, dict):
        translated.append(f"{dotted(loc)}: {value!r} dropped, {dotted(rename.target)} is set ({rename.why})")
  if translated:
    notes.append("note: translated from an older release: " + "; ".join(translated))
  model = data.get("model")
  inferred = None
  if isinstance(model, dict) and model.get("name") is None and schemas is not None:
    name, why = infer_model(data, path, models_of, schemas)
    if name is None:
      problems.append(Problem(("model", "name"), "is missing, and " + why))
    else:
      data["model"] = {"name": name, **model}
      inferred = f"using {name!r}, {why}"
      notes.append(f"note: model.name is missing: {inferred}")
  model = data.get("model")
  name = model.get("name") if isinstance(model, dict) else None
  if isinstance(name, str) and processors_of is not None:
    feeds = processors_of(name)
    for s in _sections(data, "input"):
      if data[s].get("data_processor") is None and len(feeds) == 1:
        data[s] = {"data_processor": feeds[0], **data[s]}
        notes.append(
          f"note: {s}.data_processor is missing: using {feeds[0]!r}, the only one that feeds {name}"
        )
  return Adapted(data, notes, problems, inferred=inferred, renames=tuple(moved))


def _drop(data: dict[str, Any], loc: Loc) -> None:
  if len(loc) == 1:
    data.pop(loc[0], None)
  elif isinstance(data.get(loc[0]), dict):
    data[loc[0]].pop(loc[1], None)


def precision_note(params: Any) -> str | None:
  """The note that states a loaded file's release, its half type and loss scaling, and why.

  ``params``: a `wafer.config.Params` with its ``release`` (None: no note).
  """
  release = params.release
  if release is None:
    return None
  m = params.model
  if not m.mixed_precision:
    half = "float32 (model.mixed_precision: False)"
  elif m.fp16_type is not None:
    half = f"{m.fp16_type} (model.fp16_type)"
  elif params.csconfig is not None and params.csconfig.use_cbfloat16:
    half = "cbfloat16 (csconfig.use_cbfloat16)"
  elif m.use_bfloat16:
    half = "bfloat16 (model.use_bfloat16)"
  else:
    half = f"{release.half_dtype} (no model.fp16_type: the default of that release, {release.source})"
  opt = params.optimizer
  if opt is None:
    scaling = "none (no optimizer)"
  else:
    try:
      built = opt.loss_scale(params.policy().compute)
    except Exception:  # the problem is reported by the checks; the note says what the file asks
      built = None
    asked = "loss_scaling_factor" in opt.model_fields_set
    if type(built).__name__ == "DynamicLossScale":
      scaling = "dynamic (optimizer.loss_scaling_factor: dynamic)"
    elif params.policy().compute.name == "bfloat16" and opt.dynamic_loss_scaling:
      scaling = "none (bfloat16 needs none; loss_scaling_factor: dynamic is dropped, as modelzoo does)"
    elif (
      params.policy().compute.name == "bfloat16" and asked and float(opt.loss_scaling_factor or 1.0) != 1.0
    ):
      scaling = (
        f"none (bfloat16: loss_scaling_factor {opt.loss_scaling_factor} is not applied, as modelzoo's trainer "
        "(2.4 on) does; the runner of 2.3 and before applied it, which changes only values that underflow or "
        "overflow)"
      )
    elif asked:
      scaling = f"static {opt.loss_scaling_factor} (optimizer.loss_scaling_factor)"
    else:
      scaling = "static 1.0 (loss_scaling_factor absent: 1.0 in every release)"
    unused = [
      f"optimizer.{key}"
      for key in _DYNAMIC_ONLY
      if key in opt.model_fields_set and getattr(opt, key) is not None
    ]
    if unused and type(built).__name__ != "DynamicLossScale":
      scaling += f"; {', '.join(unused)} set dynamic loss scaling only: ignored"
  softmax = ""
  if m.mixed_precision and getattr(m, "attention_softmax_fp32", None) is True:
    try:
      rounded = params.policy().rule("attention_softmax") == "round"
    except Exception:  # the problem is reported by the checks
      rounded = False
    if rounded:
      softmax = (
        f"; model.attention_softmax_fp32: True overridden, the attention softmax is rounded (modelzoo forces "
        f"it at precision_opt_level 2, and at 1 with cbfloat16; this run: level "
        f"{params.runconfig.precision_opt_level}, {params.policy().compute.name})"
      )
  return (
    f"note: Model Zoo release {release.name} ({release.reason}): half type {half}; loss scaling {scaling}"
    f"{softmax}"
  )


_DYNAMIC_ONLY = (
  "initial_loss_scale",
  "steps_per_increase",
  "min_loss_scale",
  "max_loss_scale",
  "overflow_tolerance",
)
"""The optimizer keys of dynamic loss scaling alone (`wafer.config.optimizer.OptimizerConfig.loss_scale`)."""
