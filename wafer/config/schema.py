"""Typed sections of a modelzoo params file (legacy layout) and the checks within a section.

Sections ``runconfig`` and ``optimizer`` are closed: every key is typed and an unknown key is an
error. ``model`` and ``train_input`` / ``eval_input`` differ per model and data processor: a
typed common core, plus model- or processor-specific keys that are kept as they are (in
``model_extra``) until a schema is registered for that model name or data processor
(:func:`register_model_schema`, :func:`register_input_schema`); from then on those sections are
closed too. An open section still rejects a key that looks like a misspelled core key.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from wafer.config.errors import Problem

NonNegInt = Annotated[int, Field(ge=0)]
PosInt = Annotated[int, Field(ge=1)]
Seed = Annotated[int, Field(ge=0, le=2**32 - 1)]
"""A random seed: JAX's keys and NumPy's generators take 0 .. 2**32 - 1 from every seed key alike."""
PosFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]

Mode = Literal["train", "eval", "train_and_eval", "eval_all"]
"""``runconfig.mode``: what a run does (`wafer.train.run`; the CLI's ``--mode``)."""
MODES: tuple[str, ...] = typing.get_args(Mode)
"""Every run mode, in the one place they are defined."""
TRAIN_MODES = ("train", "train_and_eval")
EVAL_MODES = ("eval", "train_and_eval", "eval_all")
FP16_TYPES = ("float16", "bfloat16", "cbfloat16")
MIN_DLS_LOSS_SCALE = 2.0**-14


def batch_split_problem(batch_size: int, num_csx: int, name: str = "runconfig.num_csx") -> str | None:
  """Why a global ``batch_size`` cannot be split over ``num_csx`` systems, or None (Cerebras' rule).

  The one place this rule lives: the config checks it, the data pipeline and the runtime call it.
  ``name`` is what the caller calls ``num_csx`` (``wafer.estimate``'s argument is ``num_csx``).

  >>> batch_split_problem(8, 2) is None
  True
  >>> batch_split_problem(6, 4)
  'must be a multiple of runconfig.num_csx=4 (batch_size is the global batch, split evenly across systems); e.g. 4 or 8'
  """
  if num_csx < 1:
    return f"{name} must be a positive integer (got {num_csx})"
  if batch_size < num_csx:
    return (
      f"The number of CS devices ({num_csx}) must be less than or equal to the model batch size "
      f"({batch_size}); batch_size is the global batch"
    )
  if batch_size % num_csx:
    b, n = batch_size, num_csx
    return (
      f"must be a multiple of {name}={n} (batch_size is the global batch, split evenly across "
      f"systems); e.g. {b - b % n} or {b - b % n + n}"
    )
  return None


class Section(BaseModel):
  """Base of every section: strict types (no "8" -> 8), unknown keys forbidden."""

  model_config = ConfigDict(extra="forbid", strict=True, protected_namespaces=(), frozen=False)


class OpenSection(Section):
  """A section whose unknown keys are model- or processor-specific and kept in ``model_extra``.

  A key within ``_typo_cutoff`` similarity of a core key is rejected as a likely misspelling.
  """

  model_config = ConfigDict(extra="allow")
  _typo_cutoff: ClassVar[float] = 0.86

  @classmethod
  def key_problems(cls, data: dict[str, Any]) -> dict[str, str]:
    """``{key: message}`` for keys of ``data`` that are wrong before any typing (misspelled core keys)."""
    from wafer.config.errors import suggest

    out = {}
    if cls.model_config.get("extra") == "allow":
      core = list(cls.model_fields)
      for key in data:
        close = suggest(key, core, cutoff=cls._typo_cutoff) if key not in core else None
        if close and (key.endswith(f"_{close}") or key.startswith(f"{close}_")):
          close = None  # a qualified core key (T5's src_max_sequence_length): another key, not a typo
        if close:
          out[key] = f"unknown key {key!r} looks like a misspelling of {close!r}; did you mean {close!r}?"
    return out

  @model_validator(mode="before")
  @classmethod
  def _reject_key_problems(cls, data: Any) -> Any:
    if isinstance(data, dict):
      problems = cls.key_problems(data)
      if problems:
        raise ValueError("; ".join(f"{k}: {m}" for k, m in problems.items()))
    return data


class RunConfig(Section):
  """``runconfig``: modelzoo's run keys (``runconfig_schema.yaml``), all typed.

  Wafer extensions: ``activation_steps`` (closures run every N steps; modelzoo derives it from
  ``log_steps`` when ``enable_act_frequency`` is set).
  """

  mode: Mode = "train"
  model_dir: str = "./model_dir"
  max_steps: PosInt | None = None
  num_steps: PosInt | None = None
  num_epochs: PosInt | None = None
  steps_per_epoch: PosInt | None = None
  log_steps: PosInt = 1
  checkpoint_steps: NonNegInt | None = None
  save_initial_checkpoint: bool = False
  eval_steps: PosInt | None = None
  eval_frequency: PosInt | None = None
  seed: Seed | None = None
  num_csx: PosInt = 1
  num_workers_per_csx: NonNegInt = 0
  num_wgt_servers: PosInt | None = None
  num_act_servers: PosInt | None = None
  compile_only: bool = False
  validate_only: bool = False
  compile_dir: str | None = None
  precision_opt_level: Annotated[int, Field(ge=0, le=2)] = 1
  checkpoint_path: str | None = None
  load_checkpoint_states: str | None = None
  disable_strict_checkpoint_loading: bool = False
  autoload_last_checkpoint: bool = True
  max_checkpoints: PosInt | None = None
  enable_act_frequency: bool = False
  activation_steps: PosInt | None = None
  check_loss_values: bool = True
  dump_activations: bool = False
  log_input_summaries: bool = False
  retrace_every_iteration: bool = False
  lazy_initialization: bool = True
  drop_data: bool = False
  debug_args: dict[str, Any] | None = None
  debug_args_path: str | None = None
  ini: dict[str, Any] | None = None
  target_device: Literal["CPU", "GPU", "CSX"] | None = None
  mount_dirs: list[str] | None = None
  python_paths: list[str] | None = None
  job_labels: list[str] | None = None
  job_priority: Literal["p1", "p2", "p3"] | None = None
  job_time_sec: PosInt | None = None
  logging: Any = None
  summary_dir: str | None = None
  op_profiler_config: dict[str, Any] | None = None
  experimental_api: bool = False
  transfer_processes: PosInt | None = None
  disable_version_check: bool = False
  enable_distributed: bool = False
  dist_backend: str | None = None
  dist_addr: str | None = None
  init_method: str | None = None
  sync_batchnorm: bool = False
  compile_crd_memory_gi: PosFloat | None = None
  execute_crd_memory_gi: PosFloat | None = None
  wrk_memory_gi: PosFloat | None = None
  act_memory_gi: PosFloat | None = None
  cmd_memory_gi: PosFloat | None = None
  wgt_memory_gi: PosFloat | None = None
  modelzoo_release: str | float | None = None
  """The Model Zoo release the file was written for (``"1.9"``, ``"2.3.1"``, ``"Release_2.4.3"``): decides
  the defaults that changed across releases (`wafer.config.modelzoo.release_of`); inferred when absent.
  Quote it: YAML reads ``2.10`` as the number 2.1."""
  # 1.x-era keys, accepted and ignored
  show_debug_metrics: bool = False
  save_losses: bool = False
  use_cs_grad_accum: bool = False

  @field_validator("modelzoo_release")
  @classmethod
  def _release(cls, v: str | float | None) -> str | float | None:
    """A release `wafer.costmodel.release.parse_release` accepts (the check of release names that
    ``--release`` has too; `wafer.config.modelzoo.release_of` then reads its numbers for the defaults):
    a typo here would silently pick the wrong release's defaults."""
    if v is not None:
      from wafer.costmodel.release import parse_release
      from wafer.errors import EstimateError

      try:
        parse_release(v)
      except EstimateError as e:
        raise ValueError(str(e).removeprefix(f"release={v!r}").lstrip(":; ") or str(e)) from None
    return v

  @field_validator("model_dir")
  @classmethod
  def _model_dir(cls, v: str) -> str:
    if not v.strip():  # Path("") is the current directory: checkpoints would land among the user's files
      raise ValueError("must name a directory (an empty path would mean the current directory)")
    return v

  @property
  def run_seed(self) -> int:
    """The run's seed: ``seed``, 1 when unset (weights, data order, dropout, sparsity masks)."""
    return 1 if self.seed is None else self.seed

  def num_train_steps(self, initial_step: int = 0, dataloader_len: int | None = None) -> int:
    """Steps to run from ``initial_step`` (cstorch's ``compute_num_steps``; docs/references.md, "Step
    closures, the executor and the run config").

    The result is ``min(num_epochs * steps_per_epoch, num_steps, max_steps - initial_step)``
    over the keys that are set; ``steps_per_epoch`` defaults to ``dataloader_len``.

    Raises:
      ConfigError: none of the keys set, an epoch count without a known epoch length, or a
        ``max_steps`` already reached.
    """
    from wafer.config.errors import ConfigError

    if self.num_epochs is None and self.num_steps is None and self.max_steps is None:
      raise ConfigError(
        Problem(("runconfig",), "One of num_epochs, num_steps, or max_steps must be provided")
      )
    candidates = []
    if self.num_epochs is not None:
      per_epoch = self.steps_per_epoch or dataloader_len
      if per_epoch is None:
        raise ConfigError(
          Problem(
            ("runconfig", "num_epochs"),
            "needs runconfig.steps_per_epoch: this data source does not know its epoch length (the "
            "data processors' sources do; a plugin's source gives it with epoch_steps())",
            self.num_epochs,
          )
        )
      if (
        dataloader_len is not None
        and self.steps_per_epoch is not None
        and self.steps_per_epoch > dataloader_len
      ):
        raise ConfigError(
          Problem(
            ("runconfig", "steps_per_epoch"),
            f"is larger than the dataloader's length ({dataloader_len})",
            self.steps_per_epoch,
          )
        )
      candidates.append(self.num_epochs * per_epoch)
    if self.num_steps is not None:
      candidates.append(self.num_steps)
    if self.max_steps is not None:
      if initial_step >= self.max_steps:
        raise ConfigError(
          Problem(
            ("runconfig", "max_steps"),
            f"Initial global step {initial_step} already exceeds max step {self.max_steps}.",
          )
        )
      candidates.append(self.max_steps - initial_step)
    return min(candidates)

  @property
  def effective_activation_steps(self) -> int | None:
    """``activation_steps``, else ``log_steps`` when ``enable_act_frequency``, else None: step closures
    then run at the log steps only (``log_steps``, step 1 and the final step)."""
    if self.activation_steps is not None:
      return self.activation_steps
    return self.log_steps if self.enable_act_frequency else None


class ModelConfig(OpenSection):
  """``model``: the typed core every model shares; other keys are model-specific.

  Register a closed schema for a model name with :func:`register_model_schema`.

  ``learning_rate_groups`` (a class attribute of the model's schema) names the parameter groups
  whose learning rate ``optimizer.adjust_learning_rate`` may scale (modelzoo's LR adjustment
  groups); a model without groups refuses the key.
  """

  learning_rate_groups: ClassVar[tuple[str, ...]] = ()

  name: str | None = None
  mixed_precision: bool = True
  fp16_type: Literal["float16", "bfloat16", "cbfloat16"] | None = None
  use_bfloat16: bool | None = None
  attention_softmax_fp32: bool | None = None
  boundary_casting: bool = False
  tf_summary: bool = False

  def learning_rate_scales(self, adjust: Mapping[str, float] | None = None) -> dict[str, float]:
    """``{group: factor}`` of the learning rate: the model's own factors (muP's, in a model that
    has them) with each group named in ``adjust`` (``optimizer.adjust_learning_rate``) taking its
    value; factors of 1 left out.

    Raises:
      ValueError: the factors contradict each other (the message says how).
    """
    return {g: float(s) for g, s in (adjust or {}).items() if s != 1.0}

  def parameter_name(self, names: tuple[str, ...]) -> str:
    """The name of the parameter at ``names`` (`wafer.optim.path_names`) that a ``sparsity`` filter
    matches: modelzoo's torch name in a model that maps its parameters (GPT:
    ``model.transformer_decoder.layers.0.self_attn.proj_q_dense_layer.weight``), else the names
    joined by dots.

    >>> ModelConfig().parameter_name(("layers", "0", "kernel"))
    'layers.0.kernel'
    """
    return ".".join(names)


class InputConfig(OpenSection):
  """``train_input`` / ``eval_input``: the typed core; other keys are processor-specific.

  Register a closed schema for a data processor with :func:`register_input_schema`.
  """

  data_processor: str | None = None
  data_dir: str | list[str] | None = None
  batch_size: PosInt
  micro_batch_size: Any = "auto"
  shuffle: bool = False
  shuffle_seed: Seed | None = None
  shuffle_buffer: PosInt | None = None
  num_workers: NonNegInt = 0
  prefetch_factor: PosInt | None = None
  persistent_workers: bool = False
  drop_last: bool = True
  drop_last_batch: bool | None = None
  max_sequence_length: PosInt | None = None
  vocab_size: PosInt | None = None
  vocab_file: str | None = None
  split: str | None = None

  @field_validator("data_dir", mode="before")
  @classmethod
  def _data_dir(cls, v: Any) -> Any:
    if (
      isinstance(v, str)
      and not v.strip()
      or isinstance(v, list)
      and any(isinstance(x, str) and not x.strip() for x in v)
    ):
      raise ValueError(  # "" is no data ("data_dir: $DATA" with DATA unset), not the embedded corpus
        "an empty path names no data; give the data's path, or remove data_dir for the built-in data"
      )
    if v is None or isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v)):
      return v
    raise ValueError("must be a path or a list of paths")

  @model_validator(mode="after")
  def _one_drop_last(self) -> InputConfig:
    if "drop_last" in self.model_fields_set and self.drop_last_batch not in (None, self.drop_last):
      raise ValueError(  # (an override of drop_last was silently outvoted by the file's drop_last_batch)
        f"drop_last={self.drop_last}: disagrees with drop_last_batch={self.drop_last_batch}, the key that "
        "counts; set drop_last_batch instead (or give only one of the two)"
      )
    return self

  @field_validator("micro_batch_size", mode="before")
  @classmethod
  def _micro_batch_size(cls, v: Any) -> Any:
    if v is None or v in ("auto", "explore") or (isinstance(v, int) and not isinstance(v, bool) and v > 0):
      return v
    if isinstance(v, dict) and set(v) == {"explore"} and isinstance(v["explore"], dict):
      return v
    raise ValueError("must be 'auto', 'explore', {explore: {min, max}}, a positive integer, or null")

  def features(self, *, cache_dir: Any = None, seed: int = 0, eval_split: bool = False) -> dict[str, Any]:
    """The examples of this section as NumPy arrays (first axis = examples).

    A data processor's schema (registered by a model plugin) implements it; the generic section
    names no processor that provides data.
    """
    raise ValueError(
      f"data_processor {self.data_processor!r} provides no data: name one an installed model plugin "
      "registers (wafer.registry.data_processors())"
    )

  def example_spec(self) -> dict[str, tuple[tuple[int, ...], Any]]:
    """``{feature: (shape, dtype)}`` of ONE example, from this section's settings alone (no data read).

    ``--validate_only`` and ``--compile_only`` trace the step on these shapes (batch axis added in
    front), so a params file is checked without its data. A data processor's schema implements it;
    the real features must match it (the reference models test that they do).
    """
    raise ValueError(
      f"data_processor {self.data_processor!r} declares no feature shapes (InputConfig.example_spec)"
    )

  @property
  def drop_remainder(self) -> bool:
    """Whether the last partial batch is dropped (``drop_last_batch`` wins over ``drop_last``)."""
    return self.drop_last if self.drop_last_batch is None else self.drop_last_batch


class CSConfig(OpenSection):
  """``csconfig`` (1.x era): only ``use_cbfloat16`` is used; other keys are kept and ignored."""

  use_cbfloat16: bool = False
