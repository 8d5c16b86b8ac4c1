"""The whole params file (:class:`Params`), the checks across sections, the schema table, and the
objects a run is built from (:class:`Runtime`, `Params.build`).

The config never imports the model registry (`wafer.registry`): the registry fills the schema table
(`register_model_schema`, `register_input_schema`) and hands the config its plugin loading
(`add_schema_source`), which runs before the first lookup of a model or input schema.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from wafer.config.errors import Problem, locate, suggest
from wafer.config.optimizer import Optimizer, OptimizerConfig, optimizer_class
from wafer.config.schema import (
  EVAL_MODES,
  TRAIN_MODES,
  CSConfig,
  InputConfig,
  ModelConfig,
  RunConfig,
  Section,
  batch_split_problem,
)
from wafer.config.sparsity import SparsityConfig

SECTIONS: dict[str, type[Section]] = {
  "train_input": InputConfig,
  "eval_input": InputConfig,
  "model": ModelConfig,
  "optimizer": OptimizerConfig,
  "runconfig": RunConfig,
  "csconfig": CSConfig,
  "sparsity": SparsityConfig,
}

_MODEL_SCHEMAS: dict[str, type[ModelConfig]] = {}
_INPUT_SCHEMAS: dict[str, type[InputConfig]] = {}
_PROCESSOR_MODELS: dict[str, tuple[str, ...]] = {}
_SCHEMA_SOURCES: list[Callable[[], None]] = []
_MODEL_CHECKS: list[Callable[[str], str | None]] = []


def add_schema_source(load: Callable[[], None]) -> None:
  """Call ``load()`` before a model or input schema is looked up (each time: ``load`` must be cheap
  once done). `wafer.registry` adds its `load_plugins` here, so a params file validated by a program
  that never loaded the plugins still gets their strict schemas."""
  if load not in _SCHEMA_SOURCES:
    _SCHEMA_SOURCES.append(load)


def add_model_check(check: Callable[[str], str | None]) -> None:
  """``check(name)``: why ``model.name`` = ``name`` names no available model, or None when it names one.
  `wafer.registry` adds its `unknown_model`: a file that fails to load says first that its model is not
  available (`unknown_model`), with the message a run would give."""
  if check not in _MODEL_CHECKS:
    _MODEL_CHECKS.append(check)


def unknown_model(name: str) -> str | None:
  """Why ``model.name`` = ``name`` names no available model (the checks of `add_model_check`), or None:
  it names one, or no check is installed (the config alone validates any model name)."""
  load_schemas()
  if str(name).lower() in {k.lower() for k in _MODEL_SCHEMAS}:  # a schema registered for it validates it
    return None
  for check in tuple(_MODEL_CHECKS):
    why = check(name)
    if why is not None:
      return why
  return None


def load_schemas() -> None:
  """Run the schema sources (`add_schema_source`): the plugins register their schemas."""
  for load in tuple(_SCHEMA_SOURCES):
    load()


def register_model_schema(name: str, schema: type[ModelConfig]) -> None:
  """Use ``schema`` (a closed :class:`ModelConfig` subclass) for ``model.name == name``.

  Model plugins do this through their `wafer.registry.ModelSpec`; by hand:

  >>> from pydantic import ConfigDict
  >>> class TinyModel(ModelConfig):
  ...   model_config = ConfigDict(extra="forbid")
  ...   depth: int = 10
  >>> register_model_schema("tiny_doctest", TinyModel)
  >>> section_schema("model", {"name": "tiny_doctest"}) is TinyModel
  True
  >>> unregister_schema("tiny_doctest")
  """
  if not (isinstance(schema, type) and issubclass(schema, ModelConfig)):
    raise TypeError(f"{schema!r} is not a ModelConfig subclass")
  _MODEL_SCHEMAS[name.lower()] = schema


def register_input_schema(
  data_processor: str, schema: type[InputConfig], models: tuple[str, ...] = ()
) -> None:
  """Use ``schema`` (an :class:`InputConfig` subclass) for ``*_input.data_processor == data_processor``.

  ``models``: the names of the model the processor feeds (a file without ``model.name`` is inferred
  to be that model; `wafer.config.modelzoo.infer_model`)."""
  if not (isinstance(schema, type) and issubclass(schema, InputConfig)):
    raise TypeError(f"{schema!r} is not an InputConfig subclass")
  _INPUT_SCHEMAS[data_processor] = schema
  if models:
    _PROCESSOR_MODELS[data_processor] = tuple(models)


def models_of(data_processor: str) -> tuple[str, ...]:
  """The names of the model ``data_processor`` feeds (empty when no plugin registered it with them)."""
  load_schemas()
  return _PROCESSOR_MODELS.get(data_processor, ())


def processors_of(model: str) -> tuple[str, ...]:
  """The data processors registered as feeding ``model``."""
  load_schemas()
  return tuple(
    sorted(p for p, names in _PROCESSOR_MODELS.items() if model.lower() in (n.lower() for n in names))
  )


def model_schemas() -> dict[str, type[ModelConfig]]:
  """``{model name: its registered schema}``."""
  load_schemas()
  return dict(_MODEL_SCHEMAS)


def registered_input_schemas() -> list[str]:
  """The data processors with a registered input schema."""
  load_schemas()
  return sorted(_INPUT_SCHEMAS)


def unregister_schema(name: str) -> None:
  """Forget a model or input schema registered under ``name`` (for tests)."""
  _MODEL_SCHEMAS.pop(name.lower(), None)
  _INPUT_SCHEMAS.pop(name, None)
  _PROCESSOR_MODELS.pop(name, None)


def section_schema(section: str, data: Any) -> type[Section]:
  """The class that validates ``data`` as ``section`` (a registered schema when one matches)."""
  if section in ("model", "train_input", "eval_input"):
    load_schemas()  # the plugins' strict model and input schemas
  if isinstance(data, dict):
    if section == "model" and isinstance(data.get("name"), str):
      return _MODEL_SCHEMAS.get(data["name"].lower(), ModelConfig)
    if section in ("train_input", "eval_input") and isinstance(data.get("data_processor"), str):
      return _INPUT_SCHEMAS.get(data["data_processor"], InputConfig)
    if section == "optimizer":
      return optimizer_class(data)
  return SECTIONS[section]


class Params(BaseModel):
  """A validated params file (modelzoo legacy layout). Build it with :func:`wafer.config.load_params`.

  Attributes:
    train_input, eval_input: the input sections (None when absent).
    model: the model section (a registered schema's class when ``model.name`` has one).
    optimizer: None when absent (eval-only files).
    runconfig: run keys, defaults when absent.
    csconfig: the 1.x ``csconfig`` section, when present.
    sparsity: the ``sparsity`` section (weight sparsity, `wafer.config.sparsity`), when present.
    source: the file it came from.
    lines: the loader's line map, ``{key path: 1-based line}`` of the file as written (empty for a
      mapping); `line` reads it.
    origins: ``(key path prefix, origin)`` pairs, latest first: the values under the prefix came from
      ``origin`` (``"override 'model.name=x'"``, a flag), not from the file.
    renames: ``(legacy key path prefix, written key path prefix)`` pairs of a trainer-layout file;
      `locate` reads these, ``origins`` and ``lines``.
    release: the Model Zoo release the file was written for and the defaults that follow from it
      (`wafer.config.modelzoo.Release`); None for a mapping validated without the loader.
    notes: what the loader inferred, ignored and translated, and the release's defaults, one line each
      (``note: ...``); a run prints them first.
  """

  model_config = ConfigDict(extra="forbid", protected_namespaces=(), arbitrary_types_allowed=True)

  train_input: InputConfig | None = None
  eval_input: InputConfig | None = None
  model: ModelConfig
  optimizer: Optimizer | None = None
  runconfig: RunConfig = Field(default_factory=RunConfig)
  csconfig: CSConfig | None = None
  sparsity: SparsityConfig | None = None
  source: str | None = None
  lines: dict[tuple[str | int, ...], int] = Field(default_factory=dict, exclude=True, repr=False)
  origins: tuple[tuple[tuple[str | int, ...], str], ...] = Field(default=(), exclude=True, repr=False)
  renames: tuple[tuple[tuple[str | int, ...], tuple[str | int, ...]], ...] = Field(
    default=(), exclude=True, repr=False
  )
  release: Any = Field(default=None, exclude=True)
  notes: tuple[str, ...] = Field(default=(), exclude=True)

  def line(self, *loc: str | int) -> int | None:
    """The line of key path ``loc`` in the file as written (``params.line("model", "name")``), or None."""
    return self.lines.get(tuple(loc))

  def locate(self, problem: Problem) -> Problem:
    """``problem`` (about a key of this file) with the key as written, and the override that set it or
    its line, as the loader's own problems are (`wafer.config.errors.locate`)."""
    return locate(problem, self.lines, self.origins, self.renames)

  @property
  def fp16_type(self) -> str | None:
    """``model.fp16_type``, with the 1.x spellings (``use_bfloat16``, ``csconfig.use_cbfloat16``); when
    the file gives none, its release's default (`release`), else None (the policy's default)."""
    if self.model.fp16_type is not None:
      return self.model.fp16_type
    if self.csconfig is not None and self.csconfig.use_cbfloat16:
      return "cbfloat16"
    if self.model.use_bfloat16 is not True and self.release is not None:
      return self.release.half_dtype
    return None

  def policy(self) -> Any:
    """The :class:`precision.Policy` of ``model.*`` and ``runconfig.precision_opt_level``."""
    from precision import Policy

    return Policy.from_config(
      mixed_precision=self.model.mixed_precision,
      fp16_type=self.fp16_type,
      precision_opt_level=self.runconfig.precision_opt_level,
      attention_softmax_fp32=self.model.attention_softmax_fp32,
      use_bfloat16=self.model.use_bfloat16,
    )

  def problems(self) -> list[Problem]:
    """Every check that spans keys or sections (each with Cerebras' message where it has one)."""
    from precision import PolicyError

    rc = self.runconfig
    out: list[Problem] = []
    mode = rc.mode
    if mode in TRAIN_MODES:
      if self.train_input is None:
        out.append(Problem(("train_input",), f"required for mode {mode!r}"))
      if self.optimizer is None:
        out.append(Problem(("optimizer",), f"required for mode {mode!r}"))
      if rc.num_epochs is None and rc.num_steps is None and rc.max_steps is None:
        out.append(Problem(("runconfig",), "One of num_epochs, num_steps, or max_steps must be provided"))
    if mode in EVAL_MODES and self.eval_input is None:
      out.append(Problem(("eval_input",), f"required for mode {mode!r}"))
    if rc.num_epochs is not None and rc.num_steps is not None:
      out.append(
        Problem(("runconfig", "num_steps"), "num_epochs and num_steps are mutually exclusive; set one")
      )
    if rc.compile_only and rc.validate_only:
      out.append(
        Problem(("runconfig", "validate_only"), "compile_only and validate_only are mutually exclusive")
      )
    if mode == "train_and_eval":
      if rc.eval_frequency is None and rc.num_epochs is None:
        out.append(
          Problem(
            ("runconfig", "eval_frequency"),
            "eval_frequency or num_epochs must be specified for train_and_eval mode",
          )
        )
      c, f = rc.checkpoint_steps, rc.eval_frequency
      if c and f and c % f and f % c:
        out.append(
          Problem(
            ("runconfig", "checkpoint_steps"),
            f"checkpoint_steps ({c}) and frequency of evaluation steps ({f}) must be multiples "
            "of each other.",
          )
        )
    vocab: tuple[str, int] | None = None  # the largest data vocabulary of the sections the mode reads
    for name, modes in (("train_input", TRAIN_MODES), ("eval_input", EVAL_MODES)):
      section = getattr(self, name)
      if (
        section is None or mode not in modes
      ):  # as modelzoo, which checks a section when it builds its loader
        continue
      if name == "eval_input" and not section.drop_remainder:
        key = "drop_last_batch" if section.drop_last_batch is not None else "drop_last"
        out.append(
          Problem(
            (name, key),
            "must be true: the eval step is a static graph compiled for batch_size rows (as on a Cerebras "
            "system), and a smaller last batch cannot run in it; set it true (a partial last batch is left "
            "out of the eval; none is when batch_size divides the eval data)",
            False,
          )
        )
      b, n = section.batch_size, rc.num_csx
      split = batch_split_problem(b, n)
      if split is not None:
        out.append(Problem((name, "batch_size"), split, b))
      data_vocab = getattr(section, "vocab_size", None)
      if isinstance(data_vocab, int) and data_vocab > (vocab[1] if vocab else 0):
        vocab = (name, data_vocab)
      if split is None and isinstance(section.micro_batch_size, int) and (b // n) % section.micro_batch_size:
        out.append(
          Problem(
            (name, "micro_batch_size"),
            f"must divide the per-system batch batch_size/num_csx = {b // n}; set it to a divisor of "
            f"{b // n}, or to auto to have it chosen",
            section.micro_batch_size,
          )
        )
    model_vocab = getattr(self.model, "vocab_size", None)
    if vocab is not None and isinstance(model_vocab, int) and vocab[1] > model_vocab:
      out.append(  # the run stops at the first token id >= model.vocab_size: say it before any work
        Problem(
          ("model", "vocab_size"),
          f"must be at least {vocab[0]}.vocab_size = {vocab[1]}, the data's vocabulary (its token ids run to "
          f"{vocab[1] - 1}); set both to the tokenizer's size",
          model_vocab,
        )
      )
    try:
      policy = self.policy()
    except PolicyError as e:
      out.append(Problem(("model", "fp16_type"), str(e)))
      policy = None
    if self.optimizer is not None and self.optimizer.adjust_learning_rate and self.model is not None:
      groups = type(self.model).learning_rate_groups
      for group in self.optimizer.adjust_learning_rate:
        if group not in groups:
          close = suggest(group, groups)
          hint = f" (did you mean {close!r}?)" if close else ""
          allowed = ", ".join(groups) if groups else "none (the model has no learning-rate groups)"
          out.append(
            Problem(
              ("optimizer", "adjust_learning_rate", group),
              f"not a learning-rate group of model {self.model.name!r}{hint}; allowed: {allowed}",
            )
          )
      if all(group in groups for group in self.optimizer.adjust_learning_rate):
        try:
          self.model.learning_rate_scales(self.optimizer.adjust_learning_rate)
        except ValueError as e:
          out.append(Problem(("optimizer", "adjust_learning_rate"), str(e)))
    if self.optimizer is not None:
      optimizer_problems = self.optimizer.problems()
      out += optimizer_problems
      if policy is not None and not optimizer_problems:
        from wafer.errors import OptimizerError

        try:  # the loss-scale rules live where the loss scale is built
          self.optimizer.loss_scale(policy.compute)
        except OptimizerError as e:
          out.append(Problem(("optimizer", e.key), e.detail))
      if not optimizer_problems and mode in TRAIN_MODES and rc.max_steps is not None:
        out += self._schedule_overflow(rc.max_steps)
    return out

  def _schedule_overflow(self, max_steps: int) -> list[Problem]:
    """A learning rate that grows past float32 before ``max_steps`` (inf weights, then NaN losses forever)."""
    from wafer.schedules import ScheduleError, first_overflow

    try:
      schedule = self.optimizer.schedule()
    except ScheduleError:  # optimizers without a schedule (Rprop's number, Adafactor's relative steps)
      return []
    found = first_overflow(schedule, max_steps)
    if found is None:
      return []
    step, value = found
    return [
      Problem(
        ("optimizer", "learning_rate"),
        f"reaches {value} by step {step} (beyond float32's largest number, 3.4e38) before runconfig.max_steps="
        f"{max_steps}: the weights would become inf and every later loss NaN. Lower the growth (decay_rate, "
        "gamma, coefficient) or end the schedule (total_iters) before it overflows",
      )
    ]

  def build_optimizer(self) -> tuple[Any, Any]:
    """``(tx, loss_scale)`` of the ``optimizer`` section under this file's policy.

    Eval-only files (no ``optimizer``) get ``optax.identity()`` and a static scale of 1. With a
    ``sparsity`` section the optimizer is wrapped by `wafer.sparsity.sparsify` (its masks live in the
    optimizer state), the filters matching the model's parameter names (`ModelConfig.parameter_name`).
    """
    if self.optimizer is None:
      import optax

      from precision import StaticLossScale

      return optax.identity(), StaticLossScale.create(1.0)
    tx, loss_scale = self.optimizer.build(self.policy().compute)
    if self.sparsity is not None:
      tx = self.sparsity.build(
        tx,
        self.model.parameter_name,
        seed=self.runconfig.run_seed,
        source=self.source,
        modelzoo_names=type(self.model).parameter_name is not ModelConfig.parameter_name,
      )
    return tx, loss_scale

  def build(self) -> Runtime:
    """The runtime objects of this file: optimizer, loss scale, policy and run settings, for
    ``wafer.train.run(task, params.build())``."""
    optimizer, loss_scale = self.build_optimizer()
    return Runtime(optimizer, loss_scale, self.policy(), self.runconfig, self)


@dataclasses.dataclass(frozen=True)
class Runtime:
  """What a run needs besides its `wafer.train.Task`, built from a params file by `Params.build`.

  Attributes:
    optimizer: the optax transformation (``optax.identity()`` for eval-only files).
    loss_scale: the loss-scale state (`precision.DynamicLossScale` / `StaticLossScale`).
    policy: the `precision.Policy` the step runs under.
    runconfig: the run settings (the typed ``runconfig`` section).
    params: the `Params` it was built from, or None; its ``model``, ``train_input`` and ``optimizer``
      settings are saved with every checkpoint, so that a resume with other settings names them.
  """

  optimizer: Any
  loss_scale: Any
  policy: Any
  runconfig: RunConfig
  params: Params | None = None
