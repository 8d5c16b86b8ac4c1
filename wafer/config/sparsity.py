"""The ``sparsity`` section: which weights are sparse, how sparse, and how their masks change.

Modelzoo's files write it in three ways; each is read as its release reads it (the semantics are
`wafer.sparsity`'s):

=====================  =========================================  ============================================
release                where, discriminator                       which parameters; update cadence
=====================  =========================================  ============================================
1.7 - 1.9              top-level ``sparsity``, ``type: sideband``  ``param_name_patterns`` (regex, searched)
                       (static)
2.0 - 2.1              top-level ``sparsity``, ``type`` (static,   ``param_name_patterns`` (regex, searched;
                       set, rigl)                                 a ``{pattern: overrides}`` dict makes one
                                                                  group per pattern); ``schedule``
2.2 - 2.3, 2.4+        top-level ``sparsity`` or                   ``param_filter`` (glob, whole name); ``update``
                       ``trainer.init.sparsity``, ``algorithm``    (``schedule`` is the sparsity level's alias)
                       (default static); a number, a mapping or
                       a list of groups
=====================  =========================================  ============================================

Without a filter, every parameter with more than one dimension whose lower-cased name contains none
of ``embedding``, ``norm``, ``lm_head``, ``pe_helper`` is sparse (Cerebras' default filter). A parameter
belongs to the first group whose filter matches it. Names are the model's modelzoo names
(`wafer.config.ModelConfig.parameter_name`: ``model.transformer_decoder.layers.0.self_attn.
proj_q_dense_layer.weight`` for GPT); a filter that matches no parameter is an error.

The update cadence is ``{freq, start, stop}`` (``stop`` exclusive), ``{steps: [...]}``, or a number
(``freq``); the drop fraction a number or ``{type: cosine, init, half_period, minimum}``. Not
available (an error naming the key): ``gmp`` and sparsity levels that change over the run, the
``checkerboard`` init, ``balance_in_groups`` / ``balance_out_groups``, 1.x ``in_groups`` / ``out_groups``.

Example:

>>> cfg = SparsityConfig.model_validate({"algorithm": "set", "sparsity": 0.75, "update": {"freq": 100}})
>>> [(g.level, g.group().algorithm, g.group().update.freq) for g in cfg.all_groups()]
[(0.75, 'set', 100)]
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from collections.abc import Callable
from typing import Any

from pydantic import Field, model_validator

from wafer.config.schema import Section
from wafer.sparsity import ALGORITHMS, INIT_METHODS

_DEFAULT_EXCLUDED = ("embedding", "norm", "lm_head", "pe_helper")
_NOT_AVAILABLE = {
  "balance_in_groups": "balancing the mask over groups of rows",
  "balance_out_groups": "balancing the mask over groups of columns",
  "in_groups": "1.x grouped sparsity",
  "out_groups": "1.x grouped sparsity",
}


def _one_of(options: tuple[str, ...]) -> str:
  """``a, b or c``."""
  return ", ".join(options[:-1]) + " or " + options[-1]


def default_filter(name: str, ndim: int) -> bool:
  """Cerebras' default: a parameter of more than one dimension, no embedding, norm or LM head.

  >>> default_filter("model.transformer_decoder.layers.0.ffn.ffn.0.linear_layer.weight", 2)
  True
  >>> default_filter("model.embedding_layer.word_embeddings.weight", 2)
  False
  """
  lowered = name.lower()
  return ndim > 1 and not any(word in lowered for word in _DEFAULT_EXCLUDED)


def _cadence(value: Any) -> bool:
  """Whether a 2.0 - 2.1 ``schedule`` value is an update cadence (not a sparsity level)."""
  if isinstance(value, bool):
    return False
  if isinstance(value, int):
    return value >= 1
  if isinstance(value, dict):
    return bool({"freq", "start", "stop", "steps"} & set(value))
  return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


class SparsityConfig(Section):
  """One sparsity group (``groups`` holds the others of a list).

  Attributes:
    algorithm: ``static``, ``set`` or ``rigl`` (2.2+; default static). ``type``: its 1.x - 2.1 name
      (``sideband`` is 1.x static sparsity).
    sparsity: the fraction of each tensor's weights pruned, in ``[0, 1)``.
    init_method: ``random`` (default), ``topk`` or ``from_zeros``.
    drop_fraction: a number (default 0.3) or a cosine ``{type, init, half_period, minimum}``.
    update: the dynamic algorithms' update cadence; ``schedule``: its 2.0 - 2.1 name (2.2+: the
      sparsity's alias).
    param_filter: glob(s) matched against whole names (2.2+); ``param_name_patterns``: regex(es)
      searched in names, or ``{regex: overrides}`` (1.x - 2.1).
    seed: 1.x's mask seed (else ``runconfig.seed``).
    add_summaries: accepted; wafer logs no sparsity summaries.
  """

  algorithm: str | None = None
  type: str | None = None
  sparsity: float | None = Field(default=None, ge=0.0, lt=1.0)
  init_method: str = "random"
  drop_fraction: float | dict[str, Any] = 0.3
  update: int | dict[str, Any] | None = None
  schedule: Any = None
  param_filter: str | list[str] | None = None
  param_name_patterns: str | list[str] | dict[str, Any] | None = None
  seed: int | None = None
  add_summaries: bool = False
  balance_in_groups: Any = None
  balance_out_groups: Any = None
  in_groups: Any = None
  out_groups: Any = None
  groups: list[SparsityConfig] | None = None

  @model_validator(mode="before")
  @classmethod
  def _forms(cls, data: Any) -> Any:
    if isinstance(data, (int, float)) and not isinstance(data, bool):
      return {"sparsity": float(data)}
    if isinstance(data, list):
      return {"groups": data}
    return data

  @model_validator(mode="after")
  def _check(self) -> SparsityConfig:
    if self.groups is not None:
      others = sorted(self.model_fields_set - {"groups"})
      if others:
        raise ValueError(
          f"{', '.join(others)}: next to a list of groups; give them in each group (a group's own keys are all "
          "it has)"
        )
      return self
    for key, what in _NOT_AVAILABLE.items():
      if getattr(self, key) is not None:
        raise ValueError(f"{key}: wafer does not have {what}; remove the key to run with ungrouped masks")
    if self.algorithm is not None and self.type is not None and self.algorithm.lower() != self.type.lower():
      raise ValueError(
        f"algorithm {self.algorithm!r} and type {self.type!r} disagree; type is algorithm's old name"
      )
    name = self.algorithm_name
    given = "algorithm" if self.algorithm is not None else "type"  # the key the file (or an override) set
    if name == "gmp":
      raise ValueError(
        f"{given}={getattr(self, given)!r}: gmp (gradual magnitude pruning, a sparsity level that changes over "
        "the run) is not available in wafer; static, set and rigl are"
      )
    if name not in ALGORITHMS:
      raise ValueError(
        f"{given}={getattr(self, given)!r}: must be {_one_of(ALGORITHMS)} (type: also sideband)"
      )
    if self.init_method not in INIT_METHODS:
      raise ValueError(f"init_method={self.init_method!r}: must be {_one_of(INIT_METHODS)}")
    if self.param_filter is not None and self.param_name_patterns is not None:
      raise ValueError(
        "param_filter (2.2+, globs) and param_name_patterns (2.1 and earlier, regexes): give one"
      )
    if self.schedule is not None and not self.schedule_is_cadence and self.sparsity is not None:
      raise ValueError("schedule is sparsity's other name (2.2+): give one of them")
    if self.level is None:
      raise ValueError("sparsity: required (the fraction of each tensor's weights pruned, in [0, 1))")
    dynamic = name != "static"
    given = self.model_fields_set
    if not dynamic:
      extra = sorted({"update", "drop_fraction"} & given) + (["schedule"] if self.schedule_is_cadence else [])
      if extra:
        raise ValueError(
          f"{', '.join(extra)}: only set and rigl change their masks; a {name} group takes none"
        )
    elif self.type is not None and self.algorithm is None and self.schedule is None and self.update is None:
      raise ValueError(
        f"schedule: required for type {self.type} (2.0 - 2.1: when the masks change, e.g. schedule: {{freq: 100}})"
      )
    for key in ("param_filter", "param_name_patterns"):
      value = getattr(self, key)
      patterns = [value] if isinstance(value, str) else list(value or [])
      for pattern in patterns:
        try:
          re.compile(fnmatch.translate(pattern) if key == "param_filter" else pattern)
        except re.error as e:
          raise ValueError(
            f"{key}: {pattern!r} is not a valid {'glob' if key == 'param_filter' else 'regex'} ({e})"
          ) from None
    self.group()  # the cadence and drop fraction are valid
    if isinstance(self.param_name_patterns, dict):
      for pattern, overrides in self.param_name_patterns.items():
        if overrides is not None and not isinstance(overrides, dict):
          raise ValueError(
            f"param_name_patterns.{pattern}: must be a mapping of overrides, not {overrides!r}"
          )
    return self

  @staticmethod
  def _constant_level(value: Any) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1:
      return float(value)
    if isinstance(value, dict) and str(value.get("type", "")).lower() == "constant" and "value" in value:
      return SparsityConfig._constant_level(value["value"])
    raise ValueError(
      f"schedule: a sparsity level that changes over the run ({value!r}) is not available in wafer; give a "
      "constant sparsity in [0, 1)"
    )

  @property
  def level(self) -> float | None:
    """The sparsity: ``sparsity``, or the constant ``schedule`` of 2.2+ (its alias)."""
    if self.schedule is not None and not self.schedule_is_cadence:
      return self._constant_level(self.schedule)
    if self.sparsity is None and "sparsity" in self.model_fields_set:
      return 0.0  # sparsity: null (2.2+): the group's parameters stay dense
    return self.sparsity

  @property
  def algorithm_name(self) -> str:
    name = (self.algorithm or self.type or "static").lower()
    return "static" if name == "sideband" else name

  @property
  def schedule_is_cadence(self) -> bool:
    """``schedule`` gives the update cadence (2.0 - 2.1, no ``update`` key), not the sparsity level."""
    return self.schedule is not None and self.update is None and _cadence(self.schedule)

  def group(self) -> Any:
    """The `wafer.sparsity.Group` of this section's keys."""
    from wafer.sparsity import Group, UpdateSchedule

    cadence = self.schedule if self.schedule_is_cadence else self.update
    key = (
      "schedule" if self.schedule_is_cadence else "update"
    )  # the file's name for the cadence (2.0 - 2.1: schedule)
    if cadence is None:
      update = UpdateSchedule()
    elif isinstance(cadence, int) and not isinstance(cadence, bool):
      update = UpdateSchedule(freq=cadence)
    elif isinstance(cadence, list):
      if not all(isinstance(s, int) and not isinstance(s, bool) for s in cadence):
        raise ValueError(f"{key}: a list of step numbers, not {cadence!r}")
      update = UpdateSchedule(steps=tuple(cadence))
    elif isinstance(cadence, dict):
      unknown = set(cadence) - {"freq", "start", "stop", "steps"}
      if unknown:
        raise ValueError(
          f"{key}: unknown key(s) {', '.join(sorted(unknown))}; allowed: freq, start, stop, steps"
        )
      for sub, value in cadence.items():
        ints = value if sub == "steps" and isinstance(value, list) else [value]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ints) or (
          sub == "steps" and not isinstance(value, list)
        ):
          if not (sub == "stop" and value is None):
            what = "a list of step numbers" if sub == "steps" else "a step number (a non-negative integer)"
            shown = (
              "[...]" if isinstance(value, (list, dict)) else repr(value)
            )  # no colon: errors.py locates it
            raise ValueError(f"{key}.{sub}={shown}: must be {what}")
      if "steps" in cadence:
        if set(cadence) - {"steps"}:
          raise ValueError(f"{key}: steps lists the update steps; freq, start and stop cannot come with it")
        update = UpdateSchedule(steps=tuple(cadence["steps"]))
      else:
        update = UpdateSchedule(
          freq=cadence.get("freq", 1), start=cadence.get("start") or 0, stop=cadence.get("stop")
        )
      if update.freq < 1:
        raise ValueError(f"{key}.freq={update.freq}: must be at least 1 (masks change every freq steps)")
    else:
      raise ValueError(f"{key} must be a mapping {{freq, start, stop}} or {{steps}}, not {cadence!r}")
    return Group(
      algorithm=self.algorithm_name,
      init_method=self.init_method,
      drop_fraction=_drop_fraction(self.drop_fraction),
      update=update,
      rounding="round" if (self.type or "").lower() == "sideband" else "floor",  # 1.9: N - round(s N)
    )

  def all_groups(self) -> list[SparsityConfig]:
    """Every group, in matching order: the list's, or one per ``{pattern: overrides}``, or this one."""
    if self.groups is not None:
      return [g for group in self.groups for g in group.all_groups()]
    if isinstance(self.param_name_patterns, dict):
      base = self.model_dump(exclude={"param_name_patterns", "groups"}, exclude_unset=True)
      return [
        SparsityConfig.model_validate({**base, **(over or {}), "param_name_patterns": p})
        for p, over in self.param_name_patterns.items()
      ]
    return [self]

  def matcher(self) -> Callable[[str, int], bool]:
    """``(name, ndim) -> bool``: whether this group's filter selects a parameter."""
    if self.param_filter is not None:
      globs = [self.param_filter] if isinstance(self.param_filter, str) else self.param_filter
      compiled = [re.compile(fnmatch.translate(g)) for g in globs]
      return lambda name, ndim: any(c.match(name) for c in compiled)
    if self.param_name_patterns is not None:
      patterns = (
        [self.param_name_patterns] if isinstance(self.param_name_patterns, str) else self.param_name_patterns
      )
      regexes = [re.compile(p) for p in patterns]
      return lambda name, ndim: any(r.search(name) for r in regexes)
    return default_filter

  def build(
    self,
    inner: Any,
    name_of: Callable[[tuple[str, ...]], str],
    *,
    seed: int = 0,
    source: str | None = None,
    modelzoo_names: bool = True,
  ) -> Any:
    """``inner`` wrapped by `wafer.sparsity.sparsify` with this section's groups.

    Args:
      inner: the optimizer the ``optimizer`` section built.
      name_of: the model's parameter names (`wafer.config.ModelConfig.parameter_name`), what the
        filters match.
      seed: the masks' key (the section's 1.x ``seed`` wins).
      source: the params file, for the error a filter that matches nothing raises.
      modelzoo_names: whether ``name_of`` gives modelzoo's names (else the error says the filters
        see wafer's own names).

    Raises:
      ConfigError: (when the optimizer state is built) a group whose filter matches no parameter.
    """
    from wafer.config.errors import ConfigError, Problem
    from wafer.optim import path_names
    from wafer.sparsity import sparsify

    groups = self.all_groups()
    matchers = [g.matcher() for g in groups]

    def assign(params: Any) -> list[tuple[str, int | None]]:
      import jax

      out = []
      for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        name = name_of(path_names(path))
        ndim = len(getattr(leaf, "shape", ()))
        out.append((name, next((i for i, m in enumerate(matchers) if m(name, ndim)), None)))
      unmatched = [i for i in range(len(groups)) if all(g != i for _, g in out)]
      if unmatched:
        names = [n for n, _ in out]

        def closest(group: SparsityConfig) -> str:
          """The 4 names sharing the longest run of characters with the filter (its wildcards removed)."""
          target = re.sub(r"[^A-Za-z0-9_.]", "", str(group.param_filter or group.param_name_patterns or ""))

          def shared(name: str) -> int:
            return (
              difflib.SequenceMatcher(None, target, name)
              .find_longest_match(0, len(target), 0, len(name))
              .size
            )

          return ", ".join(sorted(names, key=shared, reverse=True)[:4]) + f" ({len(names)} in all)"

        raise ConfigError(
          [
            Problem(
              ("sparsity",) if len(groups) == 1 else ("sparsity", i),
              f"{groups[i].filter_text()} selects no parameter of the model (a group of nothing is an error in "
              f"Cerebras' library too); the closest names of its parameters: {closest(groups[i])}"
              + (
                ""
                if modelzoo_names
                else ". This model has no modelzoo names for its parameters: filters match wafer's own names"
              ),
            )
            for i in unmatched
          ],
          source,
        )
      return out

    def levels(params: Any) -> Any:
      import jax

      found = iter(assign(params))
      return jax.tree.map(lambda _: (lambda g: 0.0 if g is None else groups[g].level)(next(found)[1]), params)

    def group_of(params: Any) -> Any:
      import jax

      found = iter(assign(params))
      return jax.tree.map(lambda _: next(found)[1] or 0, params)

    return sparsify(
      inner,
      levels,
      [g.group() for g in groups],
      seed=self.seed if self.seed is not None else seed,
      group_of=group_of,
    )

  def filter_text(self) -> str:
    """The filter as the file wrote it (for messages)."""
    if self.param_filter is not None:
      return f"param_filter {self.param_filter!r}"
    if self.param_name_patterns is not None:
      return f"param_name_patterns {self.param_name_patterns!r}"
    return "the default filter (parameters of 2+ dimensions, no embedding, norm or lm_head)"


def _drop_fraction(value: Any) -> Any:
  from wafer.sparsity import DropFraction

  if isinstance(value, (int, float)) and not isinstance(value, bool):
    if not 0 <= value <= 1:
      raise ValueError(f"drop_fraction={value}: must be in [0, 1]")
    return DropFraction(float(value))
  if isinstance(value, dict):
    kind = str(value.get("type", "")).lower()
    keys = set(value) - {"type"}
    if kind == "constant" and keys <= {"value"}:
      return _drop_fraction(value.get("value", 0.3))
    if kind == "cosine" and {"init", "half_period"} <= keys <= {"init", "half_period", "minimum"}:
      numbers = all(isinstance(value.get(k, 0), (int, float)) for k in keys)
      if not numbers or value["half_period"] <= 0:
        raise ValueError(
          f"drop_fraction: half_period must be a positive number, init and minimum in [0, 1]: {value!r}"
        )
      for sub in ("init", "minimum"):
        if not 0 <= value.get(sub, 0.0) <= 1:
          raise ValueError(f"drop_fraction.{sub}={value[sub]!r}: must be in [0, 1] (init and minimum both)")
      return DropFraction(float(value["init"]), float(value["half_period"]), float(value.get("minimum", 0.0)))
  raise ValueError(
    f"drop_fraction must be a number or {{type: cosine, init, half_period[, minimum]}}, not {value!r}"
  )
