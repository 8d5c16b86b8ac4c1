"""Binary floating-point formats: the `FloatFormat` descriptor and the predefined formats.

A format is ``1`` sign bit, ``exponent_bits`` exponent bits and ``mantissa_bits``
stored fraction bits. A finite non-zero value is

* normal (exponent code ``E`` in ``1 .. E_top``):  ``(-1)^s * 2^(E - bias) * (1 + f / 2^m)``
* subnormal (``E == 0``, when ``subnormals``):     ``(-1)^s * 2^(1 - bias) * (f / 2^m)``

Special values:

* ``specials="ieee"``: the all-ones exponent holds ``+-inf`` (fraction 0) and NaN (fraction != 0),
  so ``E_top = 2^e - 2``.
* ``specials="finite_only"`` (the ``fn`` formats, e.g. ``float8_e4m3fn``): no infinities;
  only the all-ones code ``S.1..1.1..1`` is NaN, so ``E_top = 2^e - 1`` and the largest
  fraction at ``E_top`` is ``2^m - 2``.

Every format here must fit inside float32, because values are emulated as float32 numbers
that are exactly representable in the format: at most 8 exponent bits, at most 22 fraction
bits (23 only for float32 itself), and normals that are float32 normals
(``2^-126 <= min_normal``, ``max`` finite in float32).
"""

from __future__ import annotations

import dataclasses
import difflib
import operator
import re
from collections.abc import Iterable
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from precision._table import Table

Specials = Literal["ieee", "finite_only"]
Overflow = Literal["inf", "saturate"]
_SPECIALS = ("ieee", "finite_only")
_OVERFLOWS = ("inf", "saturate")


class FormatError(ValueError):
  """A format description or format name that cannot be used."""


def _int_field(where: str, field: str, value: Any, allowed: str) -> int:
  if isinstance(value, (bool, np.bool_)):
    raise FormatError(f"{where}: {field}={value!r}; allowed: {allowed}")
  try:
    return operator.index(value)
  except TypeError:
    raise FormatError(f"{where}: {field}={value!r}; allowed: {allowed}") from None


@dataclasses.dataclass(frozen=True)
class FloatFormat:
  """A frozen description of a binary floating-point format (hashable; usable as a jit static).

  Attributes:
    name: display name, e.g. ``"cbfloat16"``.
    exponent_bits: ``e``, 2..8.
    mantissa_bits: ``m``, stored fraction bits, 1..22 (23 only for float32 itself; the leading
      1 of normals is implicit).
    bias: exponent bias; ``None`` means the IEEE default ``2^(e-1) - 1``. The smallest normal
      ``2^(1 - bias)`` must be at least float32's ``2^-126``.
    subnormals: whether codes with exponent 0 are subnormal values (gradual underflow).
      ``False`` flushes: a result whose magnitude, rounded at normal precision, is below
      ``min_normal`` becomes a signed zero (XLA's ``reduce_precision`` behaves this way).
    specials: ``"ieee"`` (inf and NaN at the all-ones exponent) or ``"finite_only"``.
    overflow: what rounding does with magnitudes beyond ``max``: ``"inf"`` gives +-inf, or
      NaN in a format without infinities (as ml_dtypes casts do); ``"saturate"`` gives
      +-``max``, infinite inputs included. Rounding toward zero never overflows a finite
      input to infinity (IEEE 754 section 7.4).
    notes: free text shown by `describe` (provenance, which parts are documented).
  """

  name: str
  exponent_bits: int
  mantissa_bits: int
  bias: int = None  # type: ignore[assignment]  # resolved to the IEEE default in __post_init__
  subnormals: bool = True
  specials: Specials = "ieee"
  overflow: Overflow = "inf"
  notes: str = dataclasses.field(default="", compare=False, repr=False)

  def __post_init__(self) -> None:
    where = f"FloatFormat {self.name!r}"
    if not isinstance(self.name, str):
      raise FormatError(f"FloatFormat name={self.name!r}; allowed: a str")
    e = _int_field(where, "exponent_bits", self.exponent_bits, "an int in 2..8 (float32 holds the values)")
    m = _int_field(where, "mantissa_bits", self.mantissa_bits, "an int in 1..22, or 23 for float32 itself")
    if not 2 <= e <= 8:
      raise FormatError(f"{where}: exponent_bits={e!r}; allowed: an int in 2..8 (float32 holds the values)")
    if not 1 <= m <= 23:
      raise FormatError(f"{where}: mantissa_bits={m!r}; allowed: an int in 1..22, or 23 for float32 itself")
    object.__setattr__(self, "exponent_bits", e)
    object.__setattr__(self, "mantissa_bits", m)
    if self.bias is None:
      object.__setattr__(self, "bias", 2 ** (e - 1) - 1)
    object.__setattr__(self, "bias", _int_field(where, "bias", self.bias, "an int, or None for 2^(e-1)-1"))
    if not isinstance(self.subnormals, (bool, np.bool_)):
      raise FormatError(f"{where}: subnormals={self.subnormals!r}; allowed: True or False")
    object.__setattr__(self, "subnormals", bool(self.subnormals))
    if self.specials not in _SPECIALS:
      raise FormatError(f"{where}: specials={self.specials!r}; allowed: {', '.join(_SPECIALS)}")
    if self.overflow not in _OVERFLOWS:
      raise FormatError(f"{where}: overflow={self.overflow!r}; allowed: {', '.join(_OVERFLOWS)}")
    if m == 23 and (e, self.bias) != (8, 127):
      raise FormatError(
        f"{where}: mantissa_bits=23 is float32 itself (exponent_bits=8, bias=127); use at most 22"
      )
    if self.emax > 127:
      raise FormatError(f"{where}: largest exponent {self.emax} exceeds float32's 127; raise the bias")
    if self.emin < -126:
      raise FormatError(
        f"{where}: smallest normal 2^{self.emin} is below float32's 2^-126 (bias {self.bias}); "
        f"use a bias of at most {self.bias + self.emin + 126}"
      )

  # ---- derived quantities (Python floats; all exact powers of two or sums of them) ----

  @property
  def bits(self) -> int:
    """Total width: 1 + exponent_bits + mantissa_bits."""
    return 1 + self.exponent_bits + self.mantissa_bits

  @property
  def has_inf(self) -> bool:
    return self.specials == "ieee"

  @property
  def emax(self) -> int:
    """Unbiased exponent of the largest finite binade."""
    top = 2**self.exponent_bits - (2 if self.specials == "ieee" else 1)
    return top - self.bias

  @property
  def emin(self) -> int:
    """Unbiased exponent of the smallest normal binade, ``1 - bias``."""
    return 1 - self.bias

  @property
  def max(self) -> float:
    """Largest finite value: ``(2 - 2^-m) 2^emax`` (ieee) or ``(2 - 2^(1-m)) 2^emax`` (finite_only)."""
    top_fraction = 2**self.mantissa_bits - (1 if self.specials == "ieee" else 2)
    return float((2**self.mantissa_bits + top_fraction) * 2.0 ** (self.emax - self.mantissa_bits))

  @property
  def min_normal(self) -> float:
    """Smallest positive normal value, ``2^emin``."""
    return float(2.0**self.emin)

  @property
  def min_subnormal(self) -> float:
    """Smallest positive value: ``2^(emin - m)``, or ``min_normal`` without subnormals."""
    return float(2.0 ** (self.emin - self.mantissa_bits)) if self.subnormals else self.min_normal

  @property
  def eps(self) -> float:
    """Spacing of values at 1.0, ``2^-m``."""
    return float(2.0**-self.mantissa_bits)

  def ulp(self, x: Any) -> jnp.ndarray:
    """Spacing of the format's values at ``x``: ``2^(max(floor(log2|x|), emin) - m)``, float32.

    Magnitudes beyond ``max`` get the spacing of the top binade; zero gets
    ``2^(emin - m)``; inf and NaN give NaN.
    """
    # Integer bit arithmetic: XLA on CPU flushes float32 subnormals in float ops (frexp, ldexp).
    x = jnp.asarray(x, jnp.float32)
    a = jax.lax.bitcast_convert_type(x, jnp.uint32) & jnp.uint32(0x7FFF_FFFF)
    biased = (a >> 23).astype(jnp.int32)
    subnormal_lead = 31 - jax.lax.clz(a).astype(jnp.int32) - 149  # floor(log2|x|) for E == 0
    lead = jnp.where(biased > 0, biased - 127, subnormal_lead)
    binade = jnp.where(a == 0, self.emin, jnp.clip(lead, self.emin, self.emax))
    spacing_exponent = binade - self.mantissa_bits  # >= -149 for every valid format
    bits = jnp.where(
      spacing_exponent >= -126,
      (spacing_exponent + 127).astype(jnp.uint32) << 23,
      jnp.uint32(1) << jnp.maximum(spacing_exponent + 149, 0).astype(jnp.uint32),
    )
    spacing = jax.lax.bitcast_convert_type(bits, jnp.float32)
    return jnp.where(biased < 255, spacing, jnp.float32(jnp.nan))

  # ---- presentation ----

  def __repr__(self) -> str:
    parts = [f"{self.name}: 1-{self.exponent_bits}-{self.mantissa_bits}", f"bias={self.bias}"]
    if not self.subnormals:
      parts.append("no subnormals")
    parts.append("inf/NaN" if self.has_inf else "finite only, NaN")
    if self.overflow == "saturate":
      parts.append("saturating")
    return f"FloatFormat({', '.join(parts)})"

  def summary(self) -> dict[str, Any]:
    """The format's fields and derived values as a plain dict."""
    return {
      "name": self.name,
      "bits": self.bits,
      "layout": f"1-{self.exponent_bits}-{self.mantissa_bits}",
      "bias": self.bias,
      "subnormals": self.subnormals,
      "specials": self.specials,
      "overflow": self.overflow,
      "max": self.max,
      "min_normal": self.min_normal,
      "min_subnormal": self.min_subnormal,
      "eps": self.eps,
    }

  def describe(self) -> Table:
    """A two-column table of the fields and derived values (prints; renders in notebooks)."""
    rows = [[k, v] for k, v in self.summary().items()]
    return Table(["property", "value"], rows, title=repr(self), footer=self.notes)

  def replace(self, **changes: Any) -> FloatFormat:
    """A copy with some fields changed; the name and notes record the change unless given.

    >>> cbfloat16.replace(subnormals=False).name
    'cbfloat16[subnormals=False]'
    """
    tag = ",".join(f"{k}={v}" for k, v in changes.items() if k not in ("name", "notes"))
    if tag and "name" not in changes:
      changes["name"] = f"{self.name}[{tag}]"
    if tag and "notes" not in changes:
      changes["notes"] = f"Variant of {self.name} with {tag}."
    if "bias" not in changes and "exponent_bits" in changes:
      changes["bias"] = None
    return dataclasses.replace(self, **changes)


def format_table(formats: Iterable[FloatFormat | str] | None = None) -> Table:
  """A table comparing formats (default: every predefined one), one row per format."""
  fmts = [get_format(f) for f in (formats if formats is not None else PREDEFINED)]
  columns = ["name", "bits", "layout", "bias", "max", "min_normal", "min_subnormal", "eps", "specials"]
  rows = [[f.summary()[c] for c in columns] for f in fmts]
  return Table(columns, rows, title="Floating-point formats")


# ---- predefined formats ----

#: IEEE 754 binary32 (1-8-23): the format values are stored in; rounding to it changes nothing but NaNs.
float32 = FloatFormat(
  "float32", 8, 23, notes="IEEE 754 binary32; rounding to it changes nothing but NaNs (quieted)."
)
#: bfloat16 (1-8-7): float32's exponent range with 7 mantissa bits; bit-exact with ml_dtypes.bfloat16.
bfloat16 = FloatFormat("bfloat16", 8, 7, notes="Brain float; bit-exact with ml_dtypes.bfloat16.")
#: IEEE 754 binary16 (1-5-10); bit-exact with numpy.float16.
float16 = FloatFormat("float16", 5, 10, notes="IEEE 754 binary16; bit-exact with numpy.float16.")
#: Cerebras' cbfloat16 (1-6-9). The layout is documented; bias 31, subnormals, inf/NaN at exponent 63, overflow to inf and round-to-nearest-even are inferred (docs/references.md, cbfloat16).
cbfloat16 = FloatFormat(
  "cbfloat16",
  6,
  9,
  bias=31,
  notes=(
    "Cerebras CB16. Documented: 1 sign, 6 exponent, 9 mantissa bits; 'double the range of "
    "fp16'. Inferred (unpublished; see docs/references.md, cbfloat16): bias 31, subnormals, inf/NaN "
    "at exponent 63, overflow to inf, round to nearest even. Change any inferred part "
    "with cbfloat16.replace(bias=..., subnormals=..., specials=..., overflow=...)."
  ),
)
#: OCP FP8 E4M3 (finite only, no inf); bit-exact with ml_dtypes.
float8_e4m3fn = FloatFormat(
  "float8_e4m3fn", 4, 3, specials="finite_only", notes="OCP FP8 E4M3; bit-exact with ml_dtypes."
)
#: OCP FP8 E5M2; bit-exact with ml_dtypes.
float8_e5m2 = FloatFormat("float8_e5m2", 5, 2, notes="OCP FP8 E5M2; bit-exact with ml_dtypes.")

PREDEFINED: tuple[FloatFormat, ...] = (float32, bfloat16, float16, cbfloat16, float8_e4m3fn, float8_e5m2)

_ALIASES: dict[str, tuple[str, ...]] = {
  "float32": ("f32", "fp32", "single"),
  "bfloat16": ("bf16",),
  "float16": ("f16", "fp16", "half"),
  "cbfloat16": ("cb16", "cbf16"),
  "float8_e4m3fn": ("e4m3fn", "f8e4m3fn", "fp8_e4m3fn", "e4m3"),
  "float8_e5m2": ("e5m2", "f8e5m2", "fp8_e5m2"),
}
_REGISTRY: dict[str, FloatFormat] = {}


_NAME = re.compile(r"[A-Za-z0-9_.+\-]+")


def register_format(fmt: FloatFormat, aliases: Iterable[str] = ()) -> FloatFormat:
  """Make ``fmt`` known to `get_format` under its name and ``aliases`` (lower-cased).

  Names are letters, digits and ``_ . + -`` (a policy string such as ``"c=my_fmt,level=1"`` must
  be able to hold them). Registering a format equal to one already registered under its name adds
  the aliases to that one. Returns the registered format.

  Raises:
    FormatError: ``fmt`` is not a `FloatFormat`, ``aliases`` is not a sequence of names, a name is
      not a valid one, or a name is taken by another format. Nothing is registered then.
  """
  if not isinstance(fmt, FloatFormat):
    raise FormatError(
      f"register_format: {fmt!r} is a {type(fmt).__name__}, not a FloatFormat; build one first, "
      "e.g. precision.FloatFormat('my_e4m3', exponent_bits=4, mantissa_bits=3)"
    )
  given = aliases
  try:
    aliases = tuple(aliases) if not isinstance(aliases, str) else None  # (a generator is read once)
  except TypeError:
    aliases = None
  if aliases is None or not all(isinstance(a, str) for a in aliases):
    raise FormatError(
      f"register_format({fmt.name!r}): aliases={given!r}; allowed: a sequence of names, e.g. aliases=('e34',)"
    )
  keys = [key.lower() for key in (fmt.name, *aliases)]
  for key in keys:  # check every name before registering any: a failure leaves nothing behind
    if not _NAME.fullmatch(key):
      raise FormatError(
        f"register_format({fmt.name!r}): {key!r} is not a format name; allowed: letters, digits and _ . + -"
      )
    if key in _REGISTRY and _REGISTRY[key] != fmt:
      raise FormatError(f"format name {key!r} is already registered for {_REGISTRY[key]!r}")
  fmt = _REGISTRY.get(keys[0], fmt)  # an equal format already registered keeps its aliases
  for key in keys:
    _REGISTRY[key] = fmt
  return fmt


for _fmt in PREDEFINED:
  register_format(_fmt, _ALIASES[_fmt.name])


def get_format(name: FloatFormat | str | Any) -> FloatFormat:
  """Resolve a format name, alias (``cb16``, ``bf16``, ``fp16``, ``f32``, ...) or dtype.

  A `FloatFormat` is returned unchanged; NumPy/JAX dtypes with a format of the same name
  (``jnp.bfloat16``, ``np.float16``, ...) resolve too.

  Raises:
    FormatError: the name is unknown. The message lists the known names.
  """
  if isinstance(name, FloatFormat):
    return name
  if name is None:
    raise FormatError("no float format given (None); give a name such as 'cb16' or a FloatFormat")
  if not isinstance(name, str):
    try:
      name = np.dtype(name).name
    except TypeError:
      raise FormatError(f"cannot read a float format from {name!r}; give a name such as 'cb16'") from None
  found = _REGISTRY.get(name.strip().lower())
  if found is None:
    known = sorted(_REGISTRY)
    close = difflib.get_close_matches(name.lower(), known, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    listing = "; ".join(
      f"{f.name} ({', '.join(a for a in sorted(_REGISTRY) if _REGISTRY[a] is f and a != f.name)})"
      for f in dict.fromkeys(_REGISTRY.values())
    )
    raise FormatError(f"unknown float format {name!r}.{hint} Known formats: {listing}")
  return found
