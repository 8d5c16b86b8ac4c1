"""The ``optimizer`` section: one class per ``optimizer_type``, each building its optax transformation.

The section is a discriminated union on ``optimizer_type`` (case-insensitive): `optimizer_class`
picks the class, whose fields are exactly the keys that optimizer takes (an unknown key is an
error with a "did you mean"), and ``.build(half_dtype)`` returns ``(tx, loss_scale)``: the optax
``GradientTransformation`` (clipping, weight decay, the update rule, the learning-rate schedule)
and the initial loss-scale state. ``learning_rate`` is validated by building its schedule, so a
schedule error is reported at the key's line in the file.

========================  ======================================================================
optimizer_type            update rule (``g`` the clipped gradient, ``lr`` the schedule's value)
========================  ======================================================================
SGD / Momentum            torch SGD: ``g += wd p``; ``buf = momentum buf + g``; ``p -= lr buf``
Adam / AdamW / Lamb       `wafer.optim.scale_by_adam` (coupled decay for Adam, decoupled for AdamW
                          and Lamb; Lamb adds optax's trust ratio)
Adamax                    torch Adamax: ``u = max(b2 u, |g| + eps)``; ``p -= lr m / ((1 - b1^k) u)``
Adadelta                  optax ``scale_by_adadelta(rho, eps)``
Adagrad                   optax ``scale_by_rss(initial_accumulator_value, eps)``
Lion                      optax ``scale_by_lion(b1, b2)``
NAdam                     optax ``scale_by_adam(nesterov=True)`` (Dozat's NAdam, no torch momentum
                          decay schedule)
RAdam                     optax ``scale_by_radam``
RMSprop                   torch RMSprop: ``v = alpha v + (1 - alpha) g^2``; ``g / (sqrt(v) + eps)``
                          (centered: optax ``scale_by_stddev``), then momentum
Rprop                     optax ``scale_by_rprop`` (its step sizes replace the learning rate, which
                          must be a number)
Adafactor                 optax ``adafactor``
ASGD                      not implemented (optax has no averaged SGD): an error naming the key
========================  ======================================================================

Example:

>>> from wafer.config.optimizer import optimizer_class
>>> cfg = optimizer_class({"optimizer_type": "adamw"}).model_validate(
...   {"optimizer_type": "AdamW", "learning_rate": 0.001, "weight_decay": 0.01})
>>> tx, loss_scale = cfg.build("float32")
>>> float(loss_scale.loss_scale)
1.0
"""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Union

import jax
import optax
from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from precision.formats import FloatFormat, get_format
from precision.loss_scale import DynamicLossScale, StaticLossScale
from wafer.config.errors import Problem, suggest
from wafer.config.schema import MIN_DLS_LOSS_SCALE, NonNegFloat, PosFloat, PosInt, Section

Beta = Annotated[float, Field(ge=0, lt=1)]
Betas = Annotated[list[Beta], Field(min_length=2, max_length=2)]

# ASSUMPTION: cstorch's Adam/AdamW/Lamb default eps is 1e-6 (HF-style); the configs in docs/references.md
# section 8 that care set eps explicitly.
DEFAULT_EPS = 1e-6


def _number(v: Any) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool)


class OptimizerConfig(Section):
  """The keys every optimizer takes: type, learning rate, weight decay, clipping, loss scaling.

  Subclasses (one per ``optimizer_type``) add their own keys and `_update` (the update rule).
  """

  kind: ClassVar[str] = ""

  optimizer_type: str
  learning_rate: Any
  weight_decay: NonNegFloat | None = None
  weight_decay_rate: NonNegFloat | None = None
  max_gradient_norm: PosFloat | None = None
  max_gradient_value: PosFloat | None = None
  loss_scaling_factor: Any = 1.0
  initial_loss_scale: PosFloat | None = None
  steps_per_increase: PosInt = 2000
  min_loss_scale: PosFloat | None = None
  max_loss_scale: PosFloat | None = None
  overflow_tolerance: NonNegFloat = 0.0
  # the loss scale is always a column of metrics.jsonl; the key is accepted for modelzoo's files
  log_loss_scale: bool | None = None
  log_summaries: bool = False
  disable_lr_steps_reset: bool = False
  grad_accum_steps: PosInt = 1
  # {group: factor}: the learning rate of a model's parameter group (muP); the model names its
  # groups (ModelConfig.learning_rate_groups) and its task applies them (Task.learning_rate_multipliers)
  adjust_learning_rate: dict[str, NonNegFloat] | None = None

  @field_validator("learning_rate", mode="before")
  @classmethod
  def _learning_rate(cls, v: Any) -> Any:
    if _number(v):
      from wafer.schedules import FLOAT32_MAX

      try:
        f = float(v)
      except OverflowError:  # an int literal beyond float64
        f = math.inf
      if not 0 <= f <= FLOAT32_MAX:  # schedules compute in float32: a larger rate is inf there
        raise ValueError(
          "must be a finite number >= 0, a scheduler ({scheduler: Name, ...}) or a list of schedulers"
        )
      return f
    if not isinstance(v, (dict, list)):
      raise ValueError("must be a number, a scheduler ({scheduler: Name, ...}) or a list of schedulers")
    return v

  @field_validator("learning_rate", mode="after")
  @classmethod
  def _builds(cls, v: Any) -> Any:
    """The schedule is built here, so its errors are reported at this key (and its line)."""
    from wafer.schedules import ScheduleError, build_schedule

    try:
      build_schedule(v, path="learning_rate")
    except ScheduleError as e:
      raise ValueError(str(e).removeprefix("learning_rate: ")) from None
    return v

  @field_validator("loss_scaling_factor", mode="before")
  @classmethod
  def _loss_scaling_factor(cls, v: Any) -> Any:
    if v is None or v == "dynamic" or (_number(v) and v > 0 and math.isfinite(v)):
      return float(v) if _number(v) else v
    raise ValueError(
      "Optimizer param 'loss_scaling_factor' must be a float, None, or 'dynamic'. Allowed: a finite "
      "number > 0 (a static scale), 'dynamic', or null (no scaling)"
    )

  @field_validator("grad_accum_steps", mode="after")
  @classmethod
  def _grad_accum_steps(cls, v: int) -> int:
    if v != 1:
      raise ValueError(
        "gradient accumulation is not emulated: a step is one global batch; set grad_accum_steps: 1 (the "
        "per-system micro batch is train_input.micro_batch_size)"
      )
    return v

  # ------------------------------------------------------------------ derived values

  @property
  def name(self) -> str:
    """``optimizer_type`` lowercased (``AdamW`` -> ``adamw``)."""
    return self.optimizer_type.lower()

  @property
  def dynamic_loss_scaling(self) -> bool:
    return self.loss_scaling_factor == "dynamic"

  @property
  def decay(self) -> float:
    """The weight decay (``weight_decay`` or the 1.x ``weight_decay_rate``), default 0."""
    return self.weight_decay if self.weight_decay is not None else (self.weight_decay_rate or 0.0)

  def schedule(self) -> Any:
    """The learning-rate `wafer.schedules.Schedule` (raises `ScheduleError`)."""
    from wafer.schedules import build_schedule

    return build_schedule(
      self.learning_rate, path="learning_rate", disable_lr_steps_reset=self.disable_lr_steps_reset
    )

  def problems(self) -> list[Problem]:
    """Checks across optimizer keys (Cerebras' messages where it has one)."""
    out = []
    at = ("optimizer",)
    if self.max_gradient_norm is not None and self.max_gradient_value is not None:
      out.append(
        Problem(
          at + ("max_gradient_value",),
          f"Gradients can be clipped by norm(={self.max_gradient_norm}) or by value"
          f"(={self.max_gradient_value}), but not both. Do not set both `max_gradient_norm` "
          "and `max_gradient_value`.",
        )
      )
    if self.weight_decay is not None and self.weight_decay_rate is not None:
      out.append(
        Problem(
          at + ("weight_decay_rate",), "set only one of weight_decay and weight_decay_rate (the 1.x spelling)"
        )
      )
    if (
      self.dynamic_loss_scaling
      and self.min_loss_scale is not None
      and self.min_loss_scale < MIN_DLS_LOSS_SCALE
    ):
      out.append(
        Problem(
          at + ("min_loss_scale",),
          "min_loss_scale too small: must be >= 2**-14 with dynamic loss scaling",
          self.min_loss_scale,
        )
      )
    if (
      self.min_loss_scale is not None
      and self.max_loss_scale is not None
      and self.min_loss_scale > self.max_loss_scale
    ):
      out.append(
        Problem(
          at + ("min_loss_scale",), f"must be <= max_loss_scale ({self.max_loss_scale})", self.min_loss_scale
        )
      )
    return out

  # ------------------------------------------------------------------ building

  def loss_scale(self, half_dtype: FloatFormat | str) -> StaticLossScale | DynamicLossScale:
    """The initial loss-scale state for a run whose half-precision format is ``half_dtype``.

    bfloat16 needs no scaling (static 1.0, as Cerebras); cbfloat16 requires ``dynamic``.

    Raises:
      OptimizerError: cbfloat16 without dynamic loss scaling, or a setting the scaler rejects.
    """
    from wafer.errors import OptimizerError

    fmt = get_format(half_dtype)
    factor, dynamic = self.loss_scaling_factor, self.dynamic_loss_scaling
    if fmt.name == "bfloat16":
      return StaticLossScale.create(1.0)
    if fmt.name == "cbfloat16" and not dynamic:
      raise OptimizerError(
        "loss_scaling_factor",
        f"cbfloat16 requires dynamic loss scaling, or gradients may underflow/overflow and produce NaNs; "
        f"set optimizer.loss_scaling_factor: dynamic (got {factor!r})",
      )
    try:
      if not dynamic:
        return StaticLossScale.create(1.0 if factor is None else float(factor))
      return DynamicLossScale.create(
        fmt,
        initial_loss_scale=self.initial_loss_scale,
        steps_per_increase=self.steps_per_increase,
        min_loss_scale=self.min_loss_scale,
        max_loss_scale=self.max_loss_scale,
        overflow_tolerance=self.overflow_tolerance,
      )
    except ValueError as err:
      keys = (
        "min_loss_scale",
        "max_loss_scale",
        "initial_loss_scale",
        "overflow_tolerance",
        "steps_per_increase",
      )
      key = next((k for k in keys if str(err).startswith(k)), next((k for k in keys if k in str(err)), ""))
      raise OptimizerError(key or "loss_scaling_factor", str(err)) from None

  def _update(self) -> list[optax.GradientTransformation]:
    """The update rule after clipping and before the learning rate (weight decay included)."""
    raise NotImplementedError

  def build(
    self, half_dtype: FloatFormat | str = "float32"
  ) -> tuple[optax.GradientTransformation, StaticLossScale | DynamicLossScale]:
    """``(tx, loss_scale)``: the optax transformation and the initial loss-scale state.

    ``tx`` chains clipping (norm as torch ``clip_grad_norm_``, or value), the update rule with its
    weight decay, and ``optax.scale_by_learning_rate(schedule)``.
    """
    from wafer.optim import clip_by_global_norm

    parts: list[optax.GradientTransformation] = []
    if self.max_gradient_norm is not None:
      parts.append(clip_by_global_norm(self.max_gradient_norm))
    if self.max_gradient_value is not None:
      parts.append(optax.clip(self.max_gradient_value))
    parts += self._update()
    parts.append(optax.scale_by_learning_rate(self.schedule()))
    return optax.chain(*parts), self.loss_scale(half_dtype)


def _coupled(wd: float) -> list[optax.GradientTransformation]:
  """Weight decay ``u += wd p``, except for biases and normalization gains (`wafer.optim.decays`)."""
  from wafer.optim import add_decayed_weights

  return [add_decayed_weights(wd)] if wd else []


def _standard_promotion(tx: optax.GradientTransformation) -> optax.GradientTransformation:
  """``tx`` traced under standard dtype promotion (optax mixes Python floats and int32 counts)."""

  def init(params: Any) -> Any:
    with jax.numpy_dtype_promotion("standard"):
      return tx.init(params)

  def update(updates: Any, state: Any, params: Any = None) -> Any:
    with jax.numpy_dtype_promotion("standard"):
      out, new = tx.update(updates, state, params)
    return jax.tree.map(lambda u, g: u.astype(g.dtype), out, updates), new

  return optax.GradientTransformation(init, update)


class _BetasMixin(Section):
  betas: Betas | None = None
  beta1: Beta | None = None
  beta2: Beta | None = None
  eps: PosFloat | None = None
  epsilon: PosFloat | None = None
  default_betas: ClassVar[tuple[float, float]] = (0.9, 0.999)
  default_eps: ClassVar[float] = DEFAULT_EPS

  @model_validator(mode="after")
  def _one_spelling(self) -> _BetasMixin:
    if self.betas is not None and (self.beta1 is not None or self.beta2 is not None):
      raise ValueError("set either betas or beta1/beta2, not both")
    if self.eps is not None and self.epsilon is not None:
      raise ValueError("set only one of eps and epsilon (the same key)")
    return self

  @property
  def b1_b2(self) -> tuple[float, float]:
    if self.betas is not None:
      return self.betas[0], self.betas[1]
    d1, d2 = self.default_betas
    return (d1 if self.beta1 is None else self.beta1), (d2 if self.beta2 is None else self.beta2)

  @property
  def epsilon_value(self) -> float:
    return (
      self.eps if self.eps is not None else self.epsilon if self.epsilon is not None else self.default_eps
    )


class SGDConfig(OptimizerConfig):
  """``SGD``: torch SGD with optional (Nesterov) momentum and coupled weight decay."""

  kind = "sgd"
  momentum: Annotated[float, Field(ge=0, lt=1)] = 0.0
  nesterov: bool = False
  dampening: NonNegFloat = 0.0

  @field_validator("dampening", mode="after")
  @classmethod
  def _dampening(cls, v: float) -> float:
    if v != 0:
      raise ValueError(
        "only dampening: 0 is implemented (torch's first step is undamped; optax.trace has none)"
      )
    return v

  def _update(self) -> list[optax.GradientTransformation]:
    out = _coupled(self.decay)
    if self.momentum:
      out.append(optax.trace(decay=self.momentum, nesterov=self.nesterov))
    return out


class MomentumConfig(SGDConfig):
  """``Momentum``: SGD whose momentum defaults to 0.9."""

  kind = "momentum"
  momentum: Annotated[float, Field(ge=0, lt=1)] = 0.9


class AdamConfig(OptimizerConfig, _BetasMixin):
  """``Adam``: `wafer.optim.scale_by_adam` with coupled weight decay (``g += wd p``)."""

  kind = "adam"
  correct_bias: bool = True
  amsgrad: bool = False

  @field_validator("amsgrad", mode="after")
  @classmethod
  def _amsgrad(cls, v: bool) -> bool:
    if v:
      raise ValueError("amsgrad: true is not implemented; use amsgrad: false")
    return v

  def _adam(self) -> optax.GradientTransformation:
    from wafer.optim import scale_by_adam

    b1, b2 = self.b1_b2
    return scale_by_adam(b1, b2, self.epsilon_value, bias_correction=self.correct_bias)

  def _update(self) -> list[optax.GradientTransformation]:
    return _coupled(self.decay) + [self._adam()]


class AdamWConfig(AdamConfig):
  """``AdamW``: Adam with decoupled weight decay (``u += wd p`` after the Adam ratio)."""

  kind = "adamw"

  def _update(self) -> list[optax.GradientTransformation]:
    return [self._adam()] + _coupled(self.decay)


class LambConfig(AdamWConfig):
  """``Lamb``: AdamW's update scaled by optax's trust ratio ``||p|| / ||u||``."""

  kind = "lamb"

  def _update(self) -> list[optax.GradientTransformation]:
    return super()._update() + [optax.scale_by_trust_ratio()]


class AdamaxConfig(OptimizerConfig, _BetasMixin):
  """``Adamax`` (torch): ``m = b1 m + (1-b1) g``; ``u = max(b2 u, |g| + eps)``; ``m / ((1-b1^k) u)``."""

  kind = "adamax"
  default_eps: ClassVar[float] = 1e-8

  def _update(self) -> list[optax.GradientTransformation]:
    from wafer.optim import scale_by_adamax

    b1, b2 = self.b1_b2
    return _coupled(self.decay) + [scale_by_adamax(b1, b2, self.epsilon_value)]


class AdadeltaConfig(OptimizerConfig):
  """``Adadelta``: optax ``scale_by_adadelta(rho, eps)``."""

  kind = "adadelta"
  rho: Annotated[float, Field(ge=0, le=1)] = 0.9
  eps: PosFloat = 1e-6

  def _update(self) -> list[optax.GradientTransformation]:
    return _coupled(self.decay) + [optax.scale_by_adadelta(rho=self.rho, eps=self.eps)]


class AdagradConfig(OptimizerConfig):
  """``Adagrad``: optax ``scale_by_rss`` (``g / sqrt(sum g^2 + eps)``)."""

  kind = "adagrad"
  initial_accumulator_value: NonNegFloat = 0.0
  eps: PosFloat = 1e-10
  lr_decay: NonNegFloat = 0.0

  @field_validator("lr_decay", mode="after")
  @classmethod
  def _lr_decay(cls, v: float) -> float:
    if v != 0:
      raise ValueError("only lr_decay: 0 is implemented; decay the rate with a learning_rate scheduler")
    return v

  def _update(self) -> list[optax.GradientTransformation]:
    rss = optax.scale_by_rss(initial_accumulator_value=self.initial_accumulator_value, eps=self.eps)
    return _coupled(self.decay) + [rss]


class LionConfig(OptimizerConfig, _BetasMixin):
  """``Lion``: optax ``scale_by_lion(b1, b2)`` with decoupled weight decay."""

  kind = "lion"
  default_betas: ClassVar[tuple[float, float]] = (0.9, 0.99)

  def _update(self) -> list[optax.GradientTransformation]:
    b1, b2 = self.b1_b2
    return [optax.scale_by_lion(b1=b1, b2=b2)] + _coupled(self.decay)


class NAdamConfig(OptimizerConfig, _BetasMixin):
  """``NAdam``: optax ``scale_by_adam(nesterov=True)``."""

  kind = "nadam"
  default_eps: ClassVar[float] = 1e-8

  def _update(self) -> list[optax.GradientTransformation]:
    b1, b2 = self.b1_b2
    adam = optax.scale_by_adam(b1=b1, b2=b2, eps=self.epsilon_value, nesterov=True)
    return _coupled(self.decay) + [_standard_promotion(adam)]


class RAdamConfig(OptimizerConfig, _BetasMixin):
  """``RAdam``: optax ``scale_by_radam``."""

  kind = "radam"
  default_eps: ClassVar[float] = 1e-8

  def _update(self) -> list[optax.GradientTransformation]:
    b1, b2 = self.b1_b2
    return _coupled(self.decay) + [
      _standard_promotion(optax.scale_by_radam(b1=b1, b2=b2, eps=self.epsilon_value))
    ]


class RMSpropConfig(OptimizerConfig):
  """``RMSprop`` (torch): ``g / (sqrt(v) + eps)``, ``v`` an ``alpha`` moving average; then momentum."""

  kind = "rmsprop"
  alpha: Annotated[float, Field(ge=0, lt=1)] = 0.99
  eps: PosFloat = 1e-8
  momentum: Annotated[float, Field(ge=0, lt=1)] = 0.0
  centered: bool = False

  def _update(self) -> list[optax.GradientTransformation]:
    scale = optax.scale_by_stddev if self.centered else optax.scale_by_rms
    out = _coupled(self.decay) + [scale(decay=self.alpha, eps=self.eps, eps_in_sqrt=False)]
    if self.momentum:
      out.append(optax.trace(decay=self.momentum))
    return out


class RpropConfig(OptimizerConfig):
  """``Rprop``: optax ``scale_by_rprop``; ``learning_rate`` (a number) is the initial step size."""

  kind = "rprop"
  etas: Annotated[list[PosFloat], Field(min_length=2, max_length=2)] = [0.5, 1.2]
  step_sizes: Annotated[list[PosFloat], Field(min_length=2, max_length=2)] = [1e-6, 50.0]

  @field_validator("learning_rate", mode="after")
  @classmethod
  def _number_only(cls, v: Any) -> Any:
    if not isinstance(v, float):
      raise ValueError("Rprop adapts its own step sizes: learning_rate must be a number (the initial step)")
    return v

  def _update(self) -> list[optax.GradientTransformation]:
    rprop = optax.scale_by_rprop(
      learning_rate=self.learning_rate,
      eta_minus=self.etas[0],
      eta_plus=self.etas[1],
      min_step_size=self.step_sizes[0],
      max_step_size=self.step_sizes[1],
    )
    # scale_by_rprop returns the step; the chain's scale_by_learning_rate(lr) would multiply it
    # by -lr, so divide by lr here (learning_rate > 0 is checked) and let it restore the sign.
    lr = self.learning_rate
    return _coupled(self.decay) + [_standard_promotion(rprop), optax.scale(1.0 / lr if lr else 0.0)]


class AdafactorConfig(OptimizerConfig):
  """``Adafactor``: optax ``adafactor`` (factored second moments, update clipping)."""

  kind = "adafactor"
  eps: PosFloat = 1e-30
  clip_threshold: PosFloat = 1.0
  decay_rate: float = -0.8
  beta1: Beta | None = None
  scale_parameter: bool = True
  relative_step: bool = False
  warmup_init: bool = False

  @field_validator("relative_step", "warmup_init", mode="after")
  @classmethod
  def _hf_only(cls, v: bool) -> bool:
    if v:
      raise ValueError("HF's relative step sizes are not implemented; set it false and give a learning_rate")
    return v

  def _update(self) -> list[optax.GradientTransformation]:
    tx = optax.adafactor(
      learning_rate=None,
      decay_rate=abs(self.decay_rate),
      multiply_by_parameter_scale=self.scale_parameter,
      clipping_threshold=self.clip_threshold,
      momentum=self.beta1,
      eps=self.eps,
    )
    # optax.adafactor(learning_rate=None) ends with scale(-1); the chain's learning rate adds it again
    return _coupled(self.decay) + [_standard_promotion(tx), optax.scale(-1.0)]


OPTIMIZERS: dict[str, type[OptimizerConfig]] = {
  c.kind: c
  for c in (
    SGDConfig,
    MomentumConfig,
    AdamConfig,
    AdamWConfig,
    LambConfig,
    AdamaxConfig,
    AdadeltaConfig,
    AdagradConfig,
    LionConfig,
    NAdamConfig,
    RAdamConfig,
    RMSpropConfig,
    RpropConfig,
    AdafactorConfig,
  )
}
# Cerebras' spelling of each type, for messages.
OPTIMIZER_TYPES = (
  "SGD",
  "Momentum",
  "Adam",
  "AdamW",
  "Lamb",
  "Adamax",
  "Adadelta",
  "Adagrad",
  "Lion",
  "NAdam",
  "RAdam",
  "RMSprop",
  "Rprop",
  "Adafactor",
)
NOT_IMPLEMENTED = {
  "asgd": "ASGD (averaged SGD) is not implemented: optax has no averaged SGD; use SGD or Momentum",
}


class UnknownOptimizer(OptimizerConfig):
  """Stands in for an ``optimizer_type`` that names no implemented optimizer: validation fails."""

  @field_validator("optimizer_type", mode="after")
  @classmethod
  def _unknown(cls, v: str) -> str:
    if v.lower() in NOT_IMPLEMENTED:
      raise ValueError(NOT_IMPLEMENTED[v.lower()])
    close = suggest(v, OPTIMIZER_TYPES)
    hint = f"; did you mean {close!r}?" if close else ""
    raise ValueError(
      f"unknown optimizer {v!r}{hint} Allowed (case-insensitive): {', '.join(OPTIMIZER_TYPES)}"
    )

  model_config = {**Section.model_config, "extra": "ignore"}
  learning_rate: Any = None


def optimizer_class(data: Any) -> type[OptimizerConfig]:
  """The discriminator: the class of an ``optimizer`` mapping (or object), by its ``optimizer_type``."""
  kind = data.get("optimizer_type") if isinstance(data, dict) else getattr(data, "optimizer_type", None)
  return OPTIMIZERS.get(kind.lower(), UnknownOptimizer) if isinstance(kind, str) else OptimizerConfig


def _tag(data: Any) -> str:
  return optimizer_class(data).kind or "unknown"


_TAGGED = tuple(Annotated[c, Tag(k)] for k, c in OPTIMIZERS.items()) + (
  Annotated[OptimizerConfig, Tag("unknown")],
)
Optimizer = Annotated[Union[_TAGGED], Discriminator(_tag)]  # noqa: UP007
"""The ``optimizer`` section's type: a union discriminated by ``optimizer_type`` (case-insensitive)."""
