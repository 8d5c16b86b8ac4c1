"""muP (maximal update parametrization) as modelzoo's GPT-2/3 and BERT implement it.

A muP run trains a wide model with the hyperparameters tuned on a narrow base model: the width
multipliers ``w = hidden_size / mup_base_hidden_size`` and ``f = filter_size /
mup_base_filter_size`` rescale the attention logits, the output logits, some initializers and the
learning rate of the hidden weights. The keys and their effects, with the modelzoo source of each
(``https://github.com/Cerebras/modelzoo/blob/<tag>/src/cerebras/modelzoo/...``):

* ``mup_base_hidden_size`` and ``mup_base_filter_size``: both or neither (``models/nlp/gpt2/
  gpt2_model.py`` ``validate_mup``, Release_2.4.3). Either makes the run a muP run (``common/utils/
  model/mup_utils.py`` ``is_mup``).
* ``embeddings_scale`` (default 1): multiplies the embeddings. GPT: after word + position
  embeddings, before dropout (``gpt2_model.py`` ``compute_input_embeddings``); BERT: before the
  embedding LayerNorm (``models/nlp/bert/bert_model.py``).
* ``scale_qk_dot_by_d`` (default: true in a muP run, else false) and ``attention_logits_alpha``
  (default 1): the attention logits are ``alpha * q.k / d_head`` instead of ``alpha * q.k /
  sqrt(d_head)`` (``layers/AttentionLayer.py``: q and k each times ``1 / sqrt(d_head)``, the
  product times alpha).
* ``output_logits_alpha`` (default 1) and ``scale_output_logits_by_d`` (default true): in a muP
  run the output logits (GPT's LM head; BERT's MLM and NSP logits, the MLM bias included) are
  multiplied by ``alpha / w`` (``alpha / sqrt(w)`` when false). GPT's legacy
  ``output_logits_scale`` (Release_1.9.1 - 2.3.1 files, no base sizes) is the multiplier itself.
* Initializers (GPT, muP runs): q/k/v and the first FFN layer ``std * w**-0.5``; the attention
  output projection ``std * w**-0.5 * (2 L)**-0.5`` (its ``output_layer_initializer``, default
  0.02); the second FFN layer ``0.02 * f**-0.5 * (2 L)**-0.5`` (the default initializer, not the
  file's: ``gpt2_model.py`` ``ffn_output_layer_initializer``); truncation at the same multiple
  of the std. BERT's muP initializers are not rescaled: its ``bert_model.py`` (Release_2.4.3 to
  2.10.0) calls ``scale_initializers_by_dimension`` and drops the scaled copies it returns, so
  those releases initialize a BERT muP run as without muP; wafer does the same. (Release_2.3.1's
  BERT scaled them in place, as GPT's; a 2.3-layout BERT muP file initializes here as 2.4+ does.)
* Learning rates: parameter groups (`GROUPS`), each a factor on the scheduled learning rate,
  decoupled weight decay included: in a muP run the attention kernels and the first FFN layer
  ``1 / w``, the second FFN layer ``1 / f`` (BERT's pooler ``1 / w`` too); a group named in
  ``optimizer.adjust_learning_rate`` takes the file's factor instead (``mup_utils.py``
  ``process_lr_adjustment_params``). The 1.x/2.3 key ``decoder_kernel`` covers every decoder
  kernel. A parameter in two groups with different factors is refused (modelzoo would put it in
  two torch parameter groups, which torch refuses).

>>> from models.gpt2.model import GPT2Config
>>> c = GPT2Config(hidden_size=1088, num_heads=17, filter_size=4352, num_hidden_layers=14,
...                mup_base_hidden_size=256, mup_base_filter_size=1024)
>>> round(c.output_logits_multiplier(), 6), c.attention_scale(64), round(c.learning_rate_scales()["decoder_attention"], 6)
(0.235294, 0.015625, 0.235294)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import jax
from pydantic import Field, model_validator

from models.common import AttentionConfig
from wafer.optim import path_names


class MupConfig(AttentionConfig):
  """The muP keys of a transformer's ``model:`` section (module docstring); a subclass names its
  learning-rate groups (``learning_rate_groups``, `groups_of`) and the muP factor of each
  (`mup_learning_rate_scales`)."""

  kernel_groups: ClassVar[dict[str, tuple[str, ...]]] = {}
  """``{module name: groups}``: the learning-rate groups of a ``kernel`` under a module of that name."""

  embeddings_scale: float = Field(default=1.0, gt=0.0)
  output_logits_alpha: float | None = Field(default=None, gt=0.0)
  scale_output_logits_by_d: bool = True
  attention_logits_alpha: float = Field(default=1.0, gt=0.0)
  scale_qk_dot_by_d: bool | None = None
  mup_base_hidden_size: float | None = Field(default=None, gt=0.0)
  mup_base_filter_size: float | None = Field(default=None, gt=0.0)

  @model_validator(mode="after")
  def _both_base_sizes(self) -> MupConfig:
    given = [k for k in ("mup_base_hidden_size", "mup_base_filter_size") if getattr(self, k) is not None]
    if len(given) == 1:
      other = "mup_base_filter_size" if given[0] == "mup_base_hidden_size" else "mup_base_hidden_size"
      raise ValueError(
        f"muP needs both mup_base_hidden_size and mup_base_filter_size (modelzoo's rule); {given[0]} is set, "
        f"{other} is not"
      )
    return self

  @property
  def is_mup(self) -> bool:
    """A muP run: the base sizes are set."""
    return self.mup_base_hidden_size is not None

  @property
  def width_multiplier(self) -> float:
    """``w = hidden_size / mup_base_hidden_size`` (1 without muP)."""
    return self.hidden_size / self.mup_base_hidden_size if self.mup_base_hidden_size else 1.0

  @property
  def filter_multiplier(self) -> float:
    """``f = filter_size / mup_base_filter_size`` (1 without muP)."""
    return self.filter_size / self.mup_base_filter_size if self.mup_base_filter_size else 1.0

  def attention_scale(self, head_dim: int) -> float | None:
    """The factor on ``q.k``: ``alpha / d_head`` with ``scale_qk_dot_by_d`` (default: a muP run),
    else ``alpha / sqrt(d_head)``; None for the plain ``1 / sqrt(d_head)``."""
    by_d = self.is_mup if self.scale_qk_dot_by_d is None else self.scale_qk_dot_by_d
    if not by_d and self.attention_logits_alpha == 1.0:
      return None
    return self.attention_logits_alpha / (head_dim if by_d else math.sqrt(head_dim))

  def output_logits_multiplier(self) -> float | None:
    """The factor on the output logits: ``alpha / w`` (``alpha / sqrt(w)``) in a muP run, else None."""
    if not self.is_mup:
      return None
    alpha = self.output_logits_alpha or 1.0
    w = self.width_multiplier
    return alpha / w if self.scale_output_logits_by_d else alpha / math.sqrt(w)

  def mup_learning_rate_scales(self) -> dict[str, float]:
    """``{group: factor}`` that muP sets (empty without muP)."""
    return {}

  def learning_rate_scales(self, adjust: Mapping[str, float] | None = None) -> dict[str, float]:
    """``{group: factor}``: muP's factors, each group named in ``adjust`` (``optimizer.adjust_learning_rate``)
    taking the file's value; factors of 1 are left out.

    Raises:
      ValueError: a parameter would be in two groups with different factors.
    """
    scales = {**self.mup_learning_rate_scales(), **dict(adjust or {})}
    scales = {g: float(s) for g, s in scales.items() if s != 1.0}
    for groups in self.kernel_groups.values():
      found = {g: scales[g] for g in groups if g in scales}
      values = list(found.values())
      if any(not math.isclose(v, values[0], rel_tol=1e-9) for v in values):
        shown = ", ".join(f"{g} ({s!r})" for g, s in found.items())
        raise ValueError(
          f"a parameter would be in learning-rate groups with different factors: {shown}; modelzoo puts it "
          "in two torch parameter groups, which torch refuses. Set them equal or leave one out"
        )
    return scales

  def groups_of(self, names: tuple[str, ...]) -> tuple[str, ...]:
    """The learning-rate groups of the parameter at ``names`` (`path_names`)."""
    if names and names[-1] == "kernel":
      for module in names[:-1]:
        if module in self.kernel_groups:
          return self.kernel_groups[module]
    if names and names[-1] == "embedding" and any(n.endswith("_embeddings") for n in names):
      return ("embedding",)
    return ()

  def describe(self, adjust: Mapping[str, float] | None = None) -> str | None:
    """One line for a run's notes: the muP factors in effect (None when there is none)."""
    parts = []
    if self.is_mup:
      parts.append(
        f"width x{self.width_multiplier:g} (hidden_size {self.hidden_size} / {self.mup_base_hidden_size:g}), "
        f"filter x{self.filter_multiplier:g}"
      )
    head_dim = self.hidden_size // self.num_heads
    scale = self.attention_scale(head_dim)
    if scale is not None:
      parts.append(f"attention logits x{scale:.6g} (1 / sqrt(d_head) = {head_dim**-0.5:.6g} without muP)")
    logits = self.output_logits_multiplier()
    if logits is not None and logits != 1.0:
      parts.append(f"output logits x{logits:.6g}")
    if self.embeddings_scale != 1.0:
      parts.append(f"embeddings x{self.embeddings_scale:g}")
    by_factor: dict[float, list[str]] = {}
    for group, factor in self.learning_rate_scales(adjust).items():
      by_factor.setdefault(factor, []).append(group)
    for factor, groups in by_factor.items():
      parts.append(f"learning rate x{factor:.6g} for {', '.join(groups)}")
    return "note: muP: " + "; ".join(parts) if parts else None

  def learning_rate_multipliers(
    self, adjust: Mapping[str, float] | None = None
  ) -> Callable[[Any], Any] | None:
    """``params -> pytree of factors`` for `wafer.train.Task.learning_rate_multipliers`, or None
    when every factor is 1."""
    scales = self.learning_rate_scales(adjust)
    if not scales:
      return None

    def multipliers(tree: Any) -> Any:
      def factor(path: Any, leaf: Any) -> float:
        del leaf
        return next((scales[g] for g in self.groups_of(path_names(path)) if g in scales), 1.0)

      return jax.tree_util.tree_map_with_path(factor, tree)

    return multipliers
