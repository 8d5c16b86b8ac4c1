"""FloatFormat: fields, derived values against ml_dtypes/NumPy/gfloat, names, errors."""

import dataclasses
import re

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import precision
from precision.formats import FormatError
from precision.testing import gfloat_format_info, reference_dtype

ML_DTYPES = {
  f.name: reference_dtype(f) for f in precision.formats.PREDEFINED if reference_dtype(f) is not None
}


@pytest.mark.parametrize("name", sorted(ML_DTYPES))
def test_derived_values_match_finfo(name):
  fmt = precision.get_format(name)
  info = ml_dtypes.finfo(ML_DTYPES[name])
  assert fmt.max == float(info.max)
  assert fmt.min_normal == float(info.smallest_normal)
  assert fmt.min_subnormal == float(info.smallest_subnormal)
  assert fmt.eps == float(info.eps)
  assert fmt.bits == info.bits
  assert fmt.mantissa_bits == info.nmant
  assert fmt.emax == info.maxexp - 1 and fmt.emin == info.minexp


def test_cbfloat16_derived_values():
  # docs/references.md, "cbfloat16": the derived values (inferred IEEE-like rules).
  cb = precision.cbfloat16
  assert (cb.exponent_bits, cb.mantissa_bits, cb.bias, cb.bits) == (6, 9, 31, 16)
  assert cb.max == 4_290_772_992.0 == (2 - 2**-9) * 2.0**31
  assert cb.min_normal == 2.0**-30
  assert cb.min_subnormal == 2.0**-39
  assert cb.eps == 2.0**-9
  assert (cb.emin, cb.emax) == (-30, 31)
  assert cb.has_inf and cb.subnormals and cb.overflow == "inf"
  fi = gfloat_format_info(cb)
  assert (fi.max, fi.smallest_normal, fi.smallest_subnormal, fi.eps) == (
    cb.max,
    cb.min_normal,
    cb.min_subnormal,
    cb.eps,
  )


def test_cbfloat16_docstring_says_what_is_documented_and_inferred():
  notes = precision.cbfloat16.notes
  assert "Documented" in notes and "Inferred" in notes
  variant = precision.cbfloat16.replace(bias=30, subnormals=False, overflow="saturate")
  assert variant.bias == 30 and not variant.subnormals and variant.overflow == "saturate"
  assert variant.name == "cbfloat16[bias=30,subnormals=False,overflow=saturate]"
  assert variant.notes == "Variant of cbfloat16 with bias=30,subnormals=False,overflow=saturate."
  assert variant != precision.cbfloat16
  assert precision.cbfloat16.replace(notes="mine").name == "cbfloat16"


@pytest.mark.parametrize(
  "alias, name",
  [
    ("cb16", "cbfloat16"),
    ("CBF16", "cbfloat16"),
    ("bf16", "bfloat16"),
    ("fp16", "float16"),
    ("half", "float16"),
    ("f32", "float32"),
    ("fp32", "float32"),
    ("e4m3fn", "float8_e4m3fn"),
    ("e5m2", "float8_e5m2"),
    (" cbfloat16 ", "cbfloat16"),
  ],
)
def test_get_format_aliases(alias, name):
  assert precision.get_format(alias).name == name


def test_get_format_accepts_formats_and_dtypes():
  assert precision.get_format(precision.cbfloat16) is precision.cbfloat16
  assert precision.get_format(jnp.bfloat16) is precision.bfloat16
  assert precision.get_format(np.float16) is precision.float16
  assert precision.get_format(np.dtype("float32")) is precision.float32


def test_unknown_format_lists_known_names_and_suggests():
  with pytest.raises(FormatError) as err:
    precision.get_format("cb17")
  message = str(err.value)
  assert "'cb17'" in message and "Did you mean 'cb16'" in message
  for f in precision.formats.PREDEFINED:
    assert f.name in message
  with pytest.raises(FormatError, match="cannot read a float format"):
    precision.get_format(3.5)


@pytest.mark.parametrize(
  "kwargs, fragment",
  [
    (dict(exponent_bits=9, mantissa_bits=7), "exponent_bits=9"),
    (dict(exponent_bits=1, mantissa_bits=7), "exponent_bits=1"),
    (dict(exponent_bits=5, mantissa_bits=0), "mantissa_bits=0"),
    (dict(exponent_bits=5, mantissa_bits=24), "mantissa_bits=24"),
    (dict(exponent_bits=5, mantissa_bits=2, specials="none"), "specials='none'"),
    (dict(exponent_bits=5, mantissa_bits=2, overflow="wrap"), "overflow='wrap'"),
    (dict(exponent_bits=8, mantissa_bits=7, bias=100), "exceeds float32"),
    (dict(exponent_bits=8, mantissa_bits=7, bias=130), "below float32's 2^-126"),
    (dict(exponent_bits=8, mantissa_bits=7, bias=130, subnormals=False), "below float32's 2^-126"),
    (dict(exponent_bits=7, mantissa_bits=23, bias=63), "float32 itself"),
    (dict(exponent_bits=5, mantissa_bits=2, subnormals="no"), "subnormals='no'"),
    (dict(exponent_bits=True, mantissa_bits=2), "exponent_bits=True"),
    (dict(exponent_bits=5, mantissa_bits=2.5), "mantissa_bits=2.5"),
  ],
)
def test_invalid_formats_say_what_is_allowed(kwargs, fragment):
  with pytest.raises(FormatError, match=re.escape(fragment)):
    precision.FloatFormat("bad", **kwargs)


def test_numpy_integers_are_accepted_and_names_must_be_strings():
  assert precision.FloatFormat("np_ints", np.int64(5), np.int32(2)) == precision.FloatFormat("np_ints", 5, 2)
  with pytest.raises(FormatError, match="name=3"):
    precision.FloatFormat(3, 5, 2)  # type: ignore[arg-type]


def test_format_is_frozen_hashable_and_readable():
  cb = precision.cbfloat16
  with pytest.raises(dataclasses.FrozenInstanceError):
    cb.bias = 30  # type: ignore[misc]
  assert hash(cb) == hash(precision.FloatFormat("cbfloat16", 6, 9, bias=31))
  assert repr(cb) == "FloatFormat(cbfloat16: 1-6-9, bias=31, inf/NaN)"
  assert "finite only" in repr(precision.float8_e4m3fn)
  table = cb.describe()
  text = str(table)
  assert "4.29077e+09" in text and "Inferred" in text
  assert "<table>" in table._repr_html_()
  assert table.to_dict()["rows"][0] == ["name", "cbfloat16"]


def test_format_table_lists_every_predefined_format():
  text = str(precision.format_table())
  for f in precision.formats.PREDEFINED:
    assert f.name in text


def test_register_format():
  fmt = precision.FloatFormat("test_e3m4", 3, 4)
  precision.register_format(fmt, aliases=["e3m4_test"])
  assert precision.get_format("E3M4_TEST") is fmt
  with pytest.raises(FormatError, match="already registered"):
    precision.register_format(precision.FloatFormat("test_e3m4", 3, 3))


def test_register_format_refuses_what_it_could_not_use():
  """aliases="e34" registered the names e, 3 and 4; a name a policy string cannot hold (spaces:
  get_format strips them, so it was never found) and a str for the format were accepted or bare
  errors. Nothing is registered by a refused call."""
  fmt = precision.FloatFormat("test_e3m5", 3, 5)
  before = dict(precision.formats._REGISTRY)
  for call, message in [
    (lambda: precision.register_format(fmt, aliases="e35"), r"aliases='e35'; allowed: a sequence of names"),
    (lambda: precision.register_format(fmt, aliases=[35]), r"aliases=\[35\]; allowed"),
    (lambda: precision.register_format("bf16"), r"'bf16' is a str, not a FloatFormat"),
    (lambda: precision.register_format(fmt, aliases=None), r"aliases=None; allowed"),
    (
      lambda: precision.register_format(precision.FloatFormat(" My Fmt ", 3, 5)),
      r"' my fmt ' is not a format name",
    ),
    (lambda: precision.register_format(fmt, aliases=("",)), r"'' is not a format name"),
    (lambda: precision.register_format(fmt, aliases=("a,b",)), r"'a,b' is not a format name"),
  ]:
    with pytest.raises(FormatError, match=message):
      call()
  assert precision.formats._REGISTRY == before


def test_aliases_given_as_a_generator_are_all_registered():
  fmt = precision.FloatFormat("test_e2m5", 2, 5)
  precision.register_format(fmt, aliases=(a for a in ("e2m5_test", "e25_test")))
  assert precision.get_format("e2m5_test") is fmt and precision.get_format("e25_test") is fmt


def test_registering_an_equal_format_again_keeps_its_aliases():
  again = precision.FloatFormat("bfloat16", 8, 7, notes="another note")
  assert precision.register_format(again) is precision.bfloat16
  with pytest.raises(FormatError, match=r"bfloat16 \(bf16\)"):  # the known-formats listing
    precision.get_format("no_such_format")


@pytest.mark.parametrize("name", ["bfloat16", "float16", "float8_e5m2", "float8_e4m3fn"])
def test_ulp_matches_spacing(name):
  fmt = precision.get_format(name)
  dtype = ML_DTYPES[name]
  # Positive codes in order are the positive values in order: spacing = next value - value.
  codes = np.arange(2 ** (fmt.bits - 1), dtype=np.uint16 if fmt.bits == 16 else np.uint8)
  with np.errstate(invalid="ignore"):
    values = codes.view(dtype).astype(np.float64)
  values = values[np.isfinite(values)]
  spacing = np.diff(values)[1:]  # skip zero, whose "ulp" is defined as min_subnormal
  np.testing.assert_array_equal(np.asarray(fmt.ulp(values[1:-1].astype(np.float32)), np.float64), spacing)
  assert float(fmt.ulp(0.0)) == fmt.min_subnormal
  assert np.isnan(fmt.ulp(np.inf))
