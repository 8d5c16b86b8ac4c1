"""Mixed-precision policies: which format each value is stored and computed in.

A `Policy` names three formats and a precision optimisation level (POL):

* ``param``: the format weights are stored and updated in. It must be float32: on Cerebras
  weights are stored in fp32 and the weight update runs in fp32 (``docs/references.md``, "Precision optimisation levels"),
  and `precision.autocast` rounds a weight to ``compute`` where a matmul uses it, never the
  stored weight. The key exists so that jmp-style strings (``"p=f32,c=bf16,o=f32"``) parse;
  any other format is a `PolicyError` (it used to be accepted and ignored);
* ``compute``: the 16-bit format of activations and of the arithmetic `precision.autocast`
  emulates (cbfloat16, bfloat16 or float16);
* ``output``: the format of the autocast function's float32 results (float32: the loss and
  gradients leave the region unrounded);
* ``level``: 0, 1 or 2, choosing a row of the rule table below.

Rule table
----------
`precision.autocast` sorts every equation of a traced function into an *op class* (the
mapping from primitives is `precision.autocast.PRIMITIVE_CLASSES`) and treats it as the
policy's rule for that class says. Classes that compute:

====================  ===========================================================================
op class              what it covers
====================  ===========================================================================
matmul                ``dot_general`` / ``conv_general_dilated`` / ``ragged_dot`` that are not
                      attention: dense layers, projections, convolutions, batched products
attention_matmul      attention's ``Q K^T`` (a product whose result goes through a softmax that
                      feeds another product) and ``P V`` (a product of that softmax), recognised
                      by that data flow, not by names or batch dimensions (`precision.autocast`)
elementwise           arithmetic (+ - * /, max, tanh, erf, logistic, sqrt, ...) outside attention
transcendental        exp, log, pow, rsqrt, ... (PyTorch autocast's float32 list) outside attention
reduction             sum, prod, cumulative sums, scatter-add; normalisation statistics and the
                      loss are reductions
attention_softmax     any non-matmul float op applied to values that came out of an
                      attention_matmul before the next matmul: the scaling, mask, softmax and
                      dropout of attention scores (and their gradients)
====================  ===========================================================================

Treatments: ``"round"`` rounds the result to ``compute`` (round-to-nearest-even);
``"float32"`` computes in float32 and keeps the result in float32; for the two matmul
classes ``"float32_accumulate"`` rounds both operands to ``compute``, accumulates the
products in float32 and rounds the result once, and ``"mixed_accumulate"`` splits the
contraction into chunks of ``accumulation_block`` products, accumulates each chunk in
float32, rounds each chunk sum to ``compute`` and adds the chunk sums one after another in
``compute`` (each addition rounded), which models float32 accumulation inside a processing
element and 16-bit reduction across them; ``"float32"`` leaves a matmul unrounded.

The default rows (Cerebras documents the levels only in words, ``docs/references.md``, "Precision optimisation levels";
the row entries that go beyond those words are our choice):

=================  ==================  ==================  ==================
op class           level 0             level 1 (default)   level 2
=================  ==================  ==================  ==================
matmul             float32_accumulate  mixed_accumulate    mixed_accumulate
attention_matmul   float32_accumulate  float32_accumulate  mixed_accumulate
elementwise        round               round               round
transcendental     float32             float32             float32
reduction          float32             float32             float32
attention_softmax  float32             float32             round
=================  ==================  ==================  ==================

"POL 0: fp32 accumulations" gives the level-0 matmul rows; "POL 1: fp32 reductions in
attention and a mix of fp32 and 16-bit reductions in matmuls" gives level 1; "POL 2: mixed
reductions in attention and matmuls, plus 16-bit softmax in attention" gives level 2.
Override any entry with ``Policy(..., rules={"attention_softmax": "round"})``.

Values that are not float32 (integers, booleans, real bfloat16 arrays) are never touched.
An elementwise op whose float inputs are all float32-kept values (outputs of ``"float32"``
rules) or constants (Python scalars, literals) stays float32: normalisation statistics
(``var + eps``) and a loss scaled by a Python number are computed in float32, as PyTorch
autocast does. A 0-d *array* is a value like any other (see `precision.autocast`).

Stochastic rounding
-------------------
``Policy(..., stochastic=("matmul", "elementwise"))`` (string form
``stochastic=matmul+elementwise``, or ``sr=...``) makes every rounding that the rules insert
for equations of those op classes stochastic instead of nearest-even: unbiased, with bits
from a key the caller passes (``autocast(f, policy)(..., rounding_key=key)``; see
`precision.autocast` for the sites, the streams and the transformations). Each named class
must be one whose rule rounds (not ``"float32"``). A float32 ``compute`` policy ignores the
option (it stays the identity).

Products on GPUs
----------------
``products`` says how `precision.autocast` binds a matrix product of two rounded operands on a
GPU (it changes no bit on a CPU, where every choice computes exact products summed in float32
in the same order). ``"native"`` (the default): where a native 16-bit dtype holds every value
of ``compute`` exactly (bfloat16 and float16; the float8 formats, which bfloat16 holds), the
operands are converted to it and the product runs on its tensor cores with float32
accumulation (``preferred_element_type=float32``); other formats (cbfloat16) use TF32
(``Precision.HIGH``). ``"tf32"``: TF32 for every format, for comparison (string form
``products=tf32``). Both compute every product exactly; only the float32 summation order of a
GPU library may differ. See ``docs/gpu.md``.

A policy's string form lists every setting that differs from the defaults and parses back:
``Policy.parse(str(p)) == p`` for formats known by name (predefined or `register_format`-ed); a
variant made with ``FloatFormat.replace`` is named ``cbfloat16[overflow=saturate]``, which a policy
string cannot hold: name and register it (``register_format(fmt.replace(..., name="cb16_sat"))``)
or pass the `FloatFormat` itself.
"""

from __future__ import annotations

import dataclasses
import difflib
import operator
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from precision.formats import FloatFormat, FormatError, float32, get_format
from precision.rounding import round as _round

LEVELS = (0, 1, 2)
MATMUL_CLASSES = ("matmul", "attention_matmul")
VALUE_CLASSES = ("elementwise", "transcendental", "reduction", "attention_softmax")
RULE_CLASSES = MATMUL_CLASSES + VALUE_CLASSES
MATMUL_TREATMENTS = ("float32_accumulate", "mixed_accumulate", "float32")
VALUE_TREATMENTS = ("round", "float32")

LEVEL_RULES: dict[int, dict[str, str]] = {
  0: {
    "matmul": "float32_accumulate",
    "attention_matmul": "float32_accumulate",
    "elementwise": "round",
    "transcendental": "float32",
    "reduction": "float32",
    "attention_softmax": "float32",
  },
  1: {
    "matmul": "mixed_accumulate",
    "attention_matmul": "float32_accumulate",
    "elementwise": "round",
    "transcendental": "float32",
    "reduction": "float32",
    "attention_softmax": "float32",
  },
  2: {
    "matmul": "mixed_accumulate",
    "attention_matmul": "mixed_accumulate",
    "elementwise": "round",
    "transcendental": "float32",
    "reduction": "float32",
    "attention_softmax": "round",
  },
}

DEFAULT_ACCUMULATION_BLOCK = 1024
PRODUCTS = ("native", "tf32")
_FP16_TYPES = ("float16", "bfloat16", "cbfloat16")
_PARSE_KEYS = {
    "p": "param", "param": "param", "params": "param",
    "c": "compute", "compute": "compute",
    "o": "output", "output": "output",
    "l": "level", "level": "level", "pol": "level",
    "block": "accumulation_block", "accumulation_block": "accumulation_block",
    "sr": "stochastic", "stochastic": "stochastic",
    "products": "products",
}  # fmt: skip


class PolicyError(ValueError):
  """A policy setting that cannot be used; the message says which and what is allowed."""


@dataclasses.dataclass(frozen=True)
class Policy:
  """Formats and precision level of a mixed-precision computation (hashable, immutable).

  ``Policy(compute, *, output, level, rules, ...)``: the compute format by position or by name, the
  rest by name only (``Policy("float32", "bfloat16")`` would mean compute, output here and param,
  compute in jmp's order, so it is refused).

  Args:
    compute: activation / arithmetic format, e.g. ``"cbfloat16"``, ``"bf16"``, ``"fp16"``.
    output: format of the autocast function's float32 outputs.
    level: precision optimisation level, 0, 1 or 2 (see the module docstring's table).
    rules: overrides of the level's rule table, ``{op_class: treatment}``.
    accumulation_block: products per chunk in ``"mixed_accumulate"`` matmuls (>= 1).
    stochastic: op classes whose roundings are stochastic (a tuple, or one string with the
      classes joined by ``+``); each must be rounded by the rule table. Kept in the order of
      `RULE_CLASSES`.
    products: how products of rounded operands run on a GPU: ``"native"`` (bfloat16 / float16
      tensor cores where that dtype holds the compute format exactly, else TF32) or
      ``"tf32"`` (always TF32, for comparison); no effect on CPUs (module docstring).
    param: weight storage format; must be float32 (see the module docstring).

  Raises:
    PolicyError: unknown level, op class or treatment, a repeated stochastic class or one
      whose rule keeps it float32; FormatError for unknown formats.

  >>> Policy(compute="bf16", level=0).compute.name
  'bfloat16'
  >>> str(Policy("cb16", level=2))
  'p=float32,c=cbfloat16,o=float32,level=2'
  """

  compute: FloatFormat | str = "cbfloat16"
  # the rest by name only: jmp's order (param, compute, output) and this one's would read
  # ``Policy("float32", "bfloat16")`` differently, silently
  _: dataclasses.KW_ONLY
  output: FloatFormat | str = "float32"
  level: int = 1
  rules: Mapping[str, str] | tuple[tuple[str, str], ...] = ()
  accumulation_block: int = DEFAULT_ACCUMULATION_BLOCK
  stochastic: tuple[str, ...] | str = ()
  products: str = "native"
  param: FloatFormat | str = "float32"

  def __post_init__(self) -> None:
    for field in ("param", "compute", "output"):
      object.__setattr__(self, field, get_format(getattr(self, field)))
    if self.param != float32:
      raise PolicyError(
        f"param={self.param.name!r}: weights are stored and updated in float32 (as on Cerebras); "
        "autocast rounds each weight to `compute` where it is used. Use param='float32' (or leave "
        "it out); to study narrower stored weights, round them yourself with precision.round."
      )
    level = _as_int(self.level)
    if level not in LEVELS:
      raise PolicyError(f"level={self.level!r}: the precision optimisation level must be 0, 1 or 2")
    object.__setattr__(self, "level", level)
    block = _as_int(self.accumulation_block)
    if block is None or block < 1:
      raise PolicyError(f"accumulation_block={self.accumulation_block!r}; allowed: an int >= 1")
    object.__setattr__(self, "accumulation_block", block)
    try:
      overrides = dict(self.rules)
    except (TypeError, ValueError):
      raise PolicyError(
        f"rules={self.rules!r}: rules are a mapping {{op_class: treatment}} (or its (op_class, "
        f"treatment) pairs), e.g. rules={{'attention_softmax': 'round'}}; op classes: "
        f"{', '.join(LEVEL_RULES[1])}"
      ) from None
    for op_class, treatment in overrides.items():
      _check_rule(op_class, treatment)
    object.__setattr__(self, "rules", tuple(sorted(overrides.items())))
    object.__setattr__(self, "stochastic", _check_stochastic(self.stochastic, self.rule_table))
    if self.products not in PRODUCTS:
      raise PolicyError(f"products={self.products!r}; allowed: {', '.join(PRODUCTS)}")

  @property
  def rule_table(self) -> dict[str, str]:
    """The level's rules with the overrides applied: ``{op_class: treatment}``."""
    return {**LEVEL_RULES[self.level], **dict(self.rules)}

  def rule(self, op_class: str) -> str:
    """The treatment of one op class."""
    return self.rule_table[op_class]

  @property
  def is_mixed(self) -> bool:
    """Whether autocast changes anything (the compute format is narrower than float32)."""
    return self.compute != float32

  def with_rules(self, **rules: str) -> Policy:
    """A copy with more rule overrides, e.g. ``policy.with_rules(attention_softmax="round")``."""
    return dataclasses.replace(self, rules={**dict(self.rules), **rules})

  def cast_to_compute(self, tree: Any) -> Any:
    """Round every float32 leaf of ``tree`` to ``compute`` (nearest even)."""
    return _round_tree(tree, self.compute)

  def cast_to_output(self, tree: Any) -> Any:
    """Round every float32 leaf of ``tree`` to ``output`` (nearest even)."""
    return _round_tree(tree, self.output)

  def __str__(self) -> str:
    extra = "".join(f",{k}={v}" for k, v in self.rules)
    if self.accumulation_block != DEFAULT_ACCUMULATION_BLOCK:
      extra += f",block={self.accumulation_block}"
    if self.stochastic:
      extra += f",stochastic={'+'.join(self.stochastic)}"
    if self.products != "native":
      extra += f",products={self.products}"
    return f"p={self.param.name},c={self.compute.name},o={self.output.name},level={self.level}{extra}"

  @classmethod
  def parse(cls, text: str) -> Policy:
    """Parse ``"p=f32,c=cb16,o=f32"`` (jmp's syntax) plus ``level=N``, ``block=N`` and rules.

    Keys: ``p``/``param``/``params``, ``c``/``compute``, ``o``/``output``, ``l``/``level``/``pol``,
    ``block``/``accumulation_block``, ``stochastic``/``sr`` (op classes joined by ``+``:
    ``stochastic=matmul+elementwise``), ``products`` (``native`` or ``tf32``), and any op class (``attention_softmax=round``) as a rule
    override. Missing keys take the constructor defaults; ``str(policy)`` parses back (formats known
    by name: see the module docstring).

    Raises:
      PolicyError: a malformed item, an unknown or repeated key (with a suggestion).
    """
    if not isinstance(text, str):
      raise PolicyError(f"policy {text!r}: a policy string is text such as 'c=cb16,level=1'")
    settings: dict[str, Any] = {}
    rules: dict[str, str] = {}
    seen: dict[str, str] = {}
    items = [part.strip() for part in text.split(",")]
    if text.strip() and not all(items):
      raise PolicyError(
        f"policy {text!r}: an empty item (two commas, or one at an end); items are key=value separated "
        "by single commas (e.g. 'c=cb16,level=2')"
      )
    for item in filter(None, items):
      key, sep, value = item.partition("=")
      key, value = key.strip().lower(), value.strip()
      if not sep or not value:
        raise PolicyError(f"policy {text!r}: item {item!r} is not key=value (e.g. 'c=cb16')")
      if "[" in value:  # str() of a policy whose format is a FloatFormat.replace variant
        raise PolicyError(
          f"policy {text!r}: {value!r} is a format variant (FloatFormat.replace), which a policy string "
          "cannot name; give it a name and register it, precision.register_format(fmt.replace(..., "
          "name='my_fmt')), then write c=my_fmt; or pass the FloatFormat itself: Policy(compute=fmt)"
        )
      if "=" in value:  # 'c=bf16;level=2', 'c=bf16 level=2'
        raise PolicyError(
          f"policy {text!r}: item {item!r} holds two settings; separate items with commas "
          "(e.g. 'c=cb16,level=2')"
        )
      if key not in _PARSE_KEYS and key not in RULE_CLASSES:
        close = difflib.get_close_matches(key, [*_PARSE_KEYS, *RULE_CLASSES], n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise PolicyError(
          f"policy {text!r}: unknown key {key!r}.{hint} Allowed: p, c, o, level, block, stochastic, products, or an op class "
          f"({', '.join(RULE_CLASSES)})"
        )
      field = _PARSE_KEYS.get(key, key)
      if field in seen:
        raise PolicyError(
          f"policy {text!r}: {field} is given twice ({seen[field]!r} and {key!r}); give it once"
        )
      seen[field] = key
      if field in RULE_CLASSES:
        rules[field] = value
      elif field == "stochastic":
        settings[field] = tuple(part.strip() for part in value.split("+"))
      elif field in ("level", "accumulation_block"):
        try:
          settings[field] = int(value)
        except ValueError:
          allowed = "0, 1, 2" if field == "level" else "an int >= 1"
          raise PolicyError(f"policy {text!r}: {key}={value!r}; allowed: {allowed}") from None
      else:
        settings[field] = value
    try:
      return cls(**settings, rules=rules)
    except FormatError as error:
      raise PolicyError(f"policy {text!r}: {error}") from None

  @classmethod
  def from_config(
    cls,
    mixed_precision: bool = True,
    fp16_type: str | None = None,
    precision_opt_level: int | None = None,
    attention_softmax_fp32: bool | None = None,
    use_bfloat16: bool | None = None,
  ) -> Policy:
    """The policy of a modelzoo params file's keys.

    Args:
      mixed_precision: ``model.mixed_precision``. ``False`` gives an all-float32 policy (a
        CS system would force mixed precision on; here a float32 run is the baseline).
      fp16_type: ``model.fp16_type``: ``float16``, ``bfloat16`` or ``cbfloat16``; default
        ``bfloat16`` (the modelzoo Trainer's default).
      precision_opt_level: ``runconfig.precision_opt_level``; default 1.
      attention_softmax_fp32: ``model.attention_softmax_fp32`` (default True). Modelzoo
        forces it to False at level 2, and at level 1 with cbfloat16; the result sets the
        ``attention_softmax`` rule ("float32" or "round").
      use_bfloat16: the 1.x-era spelling of ``fp16_type: bfloat16``.

    Raises:
      PolicyError: an unknown ``fp16_type`` or level, conflicting keys, or a flag that is not
        a boolean (a string ``"false"`` would be true: flags are ``True``/``False``, or ``0``/``1``).
    """
    mixed_precision = _as_flag("mixed_precision", mixed_precision, optional=False)
    attention_softmax_fp32 = _as_flag("attention_softmax_fp32", attention_softmax_fp32)
    use_bfloat16 = _as_flag("use_bfloat16", use_bfloat16)
    level = 1 if precision_opt_level is None else _as_int(precision_opt_level)
    if level not in LEVELS:
      raise PolicyError(
        f"precision_opt_level={precision_opt_level!r}: the precision optimisation level must be 0, 1 or 2"
      )
    if use_bfloat16 and fp16_type not in (None, "bfloat16"):
      raise PolicyError(f"use_bfloat16: True conflicts with fp16_type: {fp16_type}; set only fp16_type")
    half = fp16_type or "bfloat16"
    if half not in _FP16_TYPES:
      close = difflib.get_close_matches(str(half), _FP16_TYPES, n=1)
      hint = f" Did you mean {close[0]!r}?" if close else ""
      raise PolicyError(f"fp16_type={half!r} is not one of {', '.join(_FP16_TYPES)}.{hint}")
    if not mixed_precision:
      return cls(compute="float32", level=level)
    softmax_fp32 = True if attention_softmax_fp32 is None else bool(attention_softmax_fp32)
    if level == 2 or (level == 1 and half == "cbfloat16"):
      softmax_fp32 = False  # modelzoo's override (docs/references.md, "Precision optimisation levels")
    default = LEVEL_RULES[level]["attention_softmax"]
    wanted = "float32" if softmax_fp32 else "round"
    rules = {} if wanted == default else {"attention_softmax": wanted}
    return cls(compute=half, level=level, rules=rules)


def _as_flag(name: str, value: Any, optional: bool = True) -> bool | None:
  """A modelzoo boolean key: ``True``/``False`` (Python or NumPy) or the integers 0 and 1; None
  (the key is absent) where ``optional``. Anything else is a `PolicyError`: Python's truth value
  of the string ``"false"`` is True, which would switch mixed precision on."""
  if value is None and optional:
    return None
  if isinstance(value, (bool, np.bool_)):
    return bool(value)
  if _as_int(value) in (0, 1):
    return bool(value)
  raise PolicyError(
    f"{name}={value!r} ({type(value).__name__}): a flag is True or False (unquoted in YAML: "
    f"{name}: false){'; or None for the default' if optional else ''}"
  )


def _as_int(value: Any) -> int | None:
  """``value`` as an int if it is an integer (Python or NumPy; not a bool or a float), else None."""
  if isinstance(value, (bool, np.bool_)):
    return None
  try:
    return operator.index(value)
  except TypeError:
    return None


def _suggest(name: str, options: tuple[str, ...]) -> str:
  """`` Did you mean 'x'?`` for the closest option (by similarity or containment), or ''."""
  close = difflib.get_close_matches(name, options, n=1, cutoff=0.5)
  close = close or [o for o in options if name and name in o]
  return f" Did you mean {close[0]!r}?" if close else ""


def _check_rule(op_class: Any, treatment: Any) -> None:
  if op_class not in RULE_CLASSES:
    hint = _suggest(str(op_class), RULE_CLASSES)
    raise PolicyError(f"rules: unknown op class {op_class!r}.{hint} Op classes: {', '.join(RULE_CLASSES)}")
  allowed = MATMUL_TREATMENTS if op_class in MATMUL_CLASSES else VALUE_TREATMENTS
  if treatment not in allowed:
    raise PolicyError(f"rules: {op_class}={treatment!r}; allowed for {op_class}: {', '.join(allowed)}")


def _check_stochastic(stochastic: Any, rule_table: Mapping[str, str]) -> tuple[str, ...]:
  """The stochastic op classes, checked, in `RULE_CLASSES` order."""
  classes = (
    tuple(part.strip() for part in stochastic.split("+"))
    if isinstance(stochastic, str)
    else tuple(stochastic)
  )
  classes = tuple(c for c in classes if c != "")
  for op_class in classes:
    if op_class not in RULE_CLASSES:
      hint = _suggest(str(op_class), RULE_CLASSES)
      raise PolicyError(
        f"stochastic: unknown op class {op_class!r}.{hint} Op classes: {', '.join(RULE_CLASSES)}"
      )
    if classes.count(op_class) > 1:
      raise PolicyError(f"stochastic: {op_class} is given twice; give it once")
    if rule_table[op_class] == "float32":
      raise PolicyError(
        f"stochastic: {op_class} is kept in float32 by the rule table (rule {op_class}=float32), so it "
        f"has no rounding to make stochastic. Drop it from stochastic=, or give it a rounding rule "
        f"(e.g. {op_class}={'float32_accumulate' if op_class in MATMUL_CLASSES else 'round'})."
      )
  return tuple(c for c in RULE_CLASSES if c in classes)


def _round_tree(tree: Any, fmt: FloatFormat) -> Any:
  def leaf(x: Any) -> Any:
    if isinstance(x, (jax.Array, np.ndarray, np.generic)) and x.dtype == np.float32 and fmt != float32:
      return _round(jnp.asarray(x), fmt)
    return x

  return jax.tree.map(leaf, tree)
