"""`precision.testing.ulp_distance` / `assert_close` against an independent float64 ulp oracle.

The oracle below reads ``floor(log2|x|)`` from ``np.frexp`` on float64 values and derives the
exponent range from the format's fields; `precision` computes the ulp with integer bit
arithmetic on float32 (``FloatFormat.ulp``) after narrowing float64 references toward zero.
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import precision
from precision.testing import assert_close, assert_same_floats, ulp_distance

PREDEFINED = [f.name for f in precision.formats.PREDEFINED]
CUSTOM = [
  precision.cbfloat16.replace(subnormals=False),
  precision.FloatFormat("e3m4_bias1", 3, 4, bias=1),
  precision.float8_e4m3fn.replace(overflow="saturate"),
]
F32_MAX = float(np.finfo(np.float32).max)
N = 16  # one array length, so each format compiles FloatFormat.ulp once
# Per format and test: the bulk test below covers 2^17 random values, hypothesis adds the edges.
EXAMPLES = settings(max_examples=40)


def oracle_ulp(x: np.ndarray, fmt: precision.FloatFormat) -> np.ndarray:
  """Spacing of ``fmt`` at float64 ``x``: 2^(clip(floor(log2|x|), emin, emax) - m); NaN at inf/NaN."""
  e, m = fmt.exponent_bits, fmt.mantissa_bits
  top_code = 2**e - (2 if fmt.specials == "ieee" else 1)
  emin, emax = 1 - fmt.bias, top_code - fmt.bias
  _, p = np.frexp(np.abs(x))  # |x| = r 2^p, r in [0.5, 1): floor(log2|x|) = p - 1
  k = np.where(x == 0, emin, np.clip(p.astype(np.int64) - 1, emin, emax))
  return np.where(np.isfinite(x), np.ldexp(1.0, (k - m).astype(np.int32)), np.nan)


def oracle_distance(a: np.ndarray, e: np.ndarray, fmt: precision.FloatFormat) -> np.ndarray:
  """|a - e| / ulp(e) for finite a and e (float64); inf for zeros of different sign."""
  opposite_zeros = (a == 0) & (e == 0) & (np.signbit(a) != np.signbit(e))
  return np.where(opposite_zeros, np.inf, np.abs(a - e) / oracle_ulp(e, fmt))


def assert_bits_equal(got: np.ndarray, want: np.ndarray) -> None:
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  bad = got.view(np.uint64) != want.view(np.uint64)
  assert not bad.any(), (
    f"{bad.sum()} differ, first at {np.flatnonzero(bad)[0]}: {got[bad][0]!r} vs {want[bad][0]!r}"
  )


def in_range_values(fmt: precision.FloatFormat):
  """float64 values spread over the format's binades, two beyond each end, and float32 values."""
  f = precision.get_format(fmt)
  scaled = st.builds(
    lambda k, r, s: float(np.ldexp(s * r, k)),
    st.integers(f.emin - f.mantissa_bits - 3, f.emax + 2),
    st.floats(1.0, 2.0, exclude_max=True),
    st.sampled_from([1.0, -1.0]),
  )
  return st.one_of(scaled, st.floats(width=32, allow_nan=False, allow_infinity=False), st.just(0.0))


@pytest.mark.formats(*PREDEFINED, *CUSTOM)
def test_ulp_distance_matches_the_oracle_on_random_bit_patterns(fmt, rng):
  bits = rng.integers(0, 2**32, size=2**16, dtype=np.uint64).astype(np.uint32)
  e = bits.view(np.float32)
  e = e[np.isfinite(e)]
  near = e.astype(np.float64) * (1 + rng.uniform(-(2.0**-6), 2.0**-6, e.size))
  a = np.clip(near, -F32_MAX, F32_MAX).astype(np.float32)
  b = rng.permutation(e)  # far from e
  for actual in (a, b):
    assert_bits_equal(
      ulp_distance(actual, e, fmt), oracle_distance(actual.astype(np.float64), e.astype(np.float64), fmt)
    )


@pytest.mark.formats(*PREDEFINED, *CUSTOM)
@EXAMPLES
@given(data=st.data())
def test_ulp_distance_matches_the_oracle_on_float32_values(fmt, data):
  values = st.lists(in_range_values(fmt), min_size=N, max_size=N).map(lambda v: np.clip(v, -F32_MAX, F32_MAX))
  e = np.float32(data.draw(values)).astype(np.float64)  # float32 expected and actual values
  a = np.float32(data.draw(values)).astype(np.float64)
  near = np.clip(e * (1 + data.draw(st.floats(-0.01, 0.01))), -F32_MAX, F32_MAX).astype(
    np.float32
  )  # close pairs
  for actual in (a, near.astype(np.float64), e):
    assert_bits_equal(
      ulp_distance(actual.astype(np.float32), e.astype(np.float32), fmt), oracle_distance(actual, e, fmt)
    )


@pytest.mark.formats(*PREDEFINED, *CUSTOM)
@EXAMPLES
@given(data=st.data())
def test_ulp_distance_matches_the_oracle_on_float64_references(fmt, data):
  # float64 expected values, including ones just below a power of two that round *up* to it in float32
  # (2^k - tiny must keep the ulp of binade k-1) and ones beyond float32's range.
  scaled = st.lists(in_range_values(fmt), min_size=N, max_size=N)
  e = np.asarray(data.draw(scaled))
  e = e * (1 - data.draw(st.sampled_from([0.0, 2.0**-53, 2.0**-30, 2.0**-25])))
  e = np.where(np.arange(N) == 0, data.draw(st.sampled_from([1e39, -1e300, 1e-50, 5e-324])), e)
  a = e + data.draw(st.floats(-1e-3, 1e-3)) * np.abs(e)
  assert_bits_equal(ulp_distance(a, e, fmt), oracle_distance(a, e, fmt))


@pytest.mark.formats(*PREDEFINED, *CUSTOM)
@EXAMPLES
@given(data=st.data())
def test_k_steps_on_the_grid_are_k_ulps(fmt, data):
  # e a value of the format, a = e + k ulp(e) within e's binade: the distance is exactly |k|.
  codes = data.draw(st.lists(st.integers(0, 2**fmt.bits - 1), min_size=N, max_size=N))
  e = precision.decode(np.asarray(codes), fmt)
  e = np.where(np.isfinite(e), e, np.float32(1.0)).astype(np.float64)
  k = np.asarray(data.draw(st.lists(st.integers(-3, 3), min_size=N, max_size=N)), np.float64)
  a = e + k * oracle_ulp(e, fmt)
  expected = np.abs(k)
  expected[(a == 0) & (e == 0) & (np.signbit(a) != np.signbit(e))] = np.inf  # -0.0 + 0 ulp = +0.0
  assert_bits_equal(ulp_distance(a, e, fmt), expected)


@pytest.mark.parametrize("name", PREDEFINED)
def test_ulp_boundaries_of_each_format(name):
  f = precision.get_format(name)
  m = f.mantissa_bits
  e = np.asarray(
    [f.min_normal, f.min_normal * (1 - 2.0**-m), 2.0 ** (f.emin - m), 0.0, f.max, 2 * f.max, 1024 * f.max]
  )
  sub = 2.0 ** (f.emin - m)
  top = 2.0 ** (f.emax - m)
  assert_bits_equal(ulp_distance(e + sub, e, f)[:4], [1.0, 1.0, 1.0, 1.0])  # subnormal spacing, zero too
  assert_bits_equal(ulp_distance(e + top, e, f)[4:], [1.0, 1.0, 1.0])  # beyond max: the ulp at max


SPECIAL_CASES = [
  # actual, expected, distance (check_zero_sign=True), distance (check_zero_sign=False)
  (np.nan, np.nan, 0.0, 0.0),
  (-np.nan, np.nan, 0.0, 0.0),
  (np.nan, 1.0, np.inf, np.inf),
  (1.0, np.nan, np.inf, np.inf),
  (np.inf, np.inf, 0.0, 0.0),
  (-np.inf, -np.inf, 0.0, 0.0),
  (-np.inf, np.inf, np.inf, np.inf),
  (3.0e38, np.inf, np.inf, np.inf),
  (np.nan, np.inf, np.inf, np.inf),
  (np.inf, 1.0, np.inf, np.inf),
  (np.inf, 1e38, np.inf, np.inf),  # even beyond every format's max
  (0.0, 0.0, 0.0, 0.0),
  (-0.0, -0.0, 0.0, 0.0),
  (-0.0, 0.0, np.inf, 0.0),
  (0.0, -0.0, np.inf, 0.0),
]


@pytest.mark.formats("cbfloat16", "float8_e4m3fn")
@pytest.mark.parametrize("a, e, strict, lenient", SPECIAL_CASES)
def test_special_values(fmt, a, e, strict, lenient):
  assert_bits_equal(ulp_distance([a], [e], fmt), [strict])
  assert_bits_equal(ulp_distance([a], [e], fmt, check_zero_sign=False), [lenient])
  if strict == 0:
    assert_close([a], [e], fmt, ulps=0)
  else:
    with pytest.raises(AssertionError, match="1 of 1 elements differ"):
      assert_close([a], [e], fmt, ulps=1e9)
  if lenient == 0:
    assert_close([a], [e], fmt, ulps=0, check_zero_sign=False)


def test_infinite_tolerance_still_checks_special_values():
  assert_close([1.0, 1e30, np.nan], [2.0, -1e30, np.nan], "bf16", ulps=float("inf"))
  with pytest.raises(
    AssertionError, match=r"1 of 2 elements differ by more than inf ulp.*NaN matches only NaN"
  ):
    assert_close([1.0, np.nan], [5.0, 1.0], "bf16", ulps=float("inf"))


def test_signaling_nans_are_nans():
  snan = np.uint32([0x7F800001, 0xFF800123]).view(np.float32)  # a float32 -> float64 cast raises "invalid"
  assert_close(snan, np.float32([np.nan, -np.nan]), "float32", ulps=0)
  with pytest.raises(AssertionError, match="NaN matches only NaN"):
    assert_close(snan, np.float32([1.0, 2.0]), "float32", ulps=1)


def test_zero_against_a_non_zero_is_a_finite_distance():
  sub = precision.cbfloat16.min_subnormal
  assert_bits_equal(ulp_distance([-0.0, 0.0], [sub, -3 * sub], "cb16"), [1.0, 3.0])


def test_threshold_is_inclusive_and_rounding_happened():
  x = np.append(np.linspace(1.0, 1000.0, 4096, dtype=np.float32), np.float32(1 + 2.0**-10))  # and a tie
  r = np.asarray(precision.round(x, "cbfloat16"))
  assert (r != x).mean() > 0.9  # rounding happened
  assert_close(r, x, "cbfloat16", ulps=0.5)  # one correct rounding: at most half an ulp
  with pytest.raises(AssertionError, match="differ by more than 0.4 ulp of cbfloat16"):
    assert_close(r, x, "cbfloat16", ulps=0.4)
  assert ulp_distance(r, x, "cbfloat16").max() == 0.5  # the bound is reached (ties), so <= matters


def test_failure_message_names_the_worst_element():
  expected = np.ones((3, 4), np.float32)
  actual = expected.copy()
  actual[1, 2] = 1 + 5 * 2.0**-9  # 5 ulp of cbfloat16 at 1.0
  actual[2, 0] = 1 + 2 * 2.0**-9
  actual[0, 3] = np.nan
  with pytest.raises(AssertionError) as info:
    assert_close(actual, expected, precision.cbfloat16, ulps=1, context="layer 3")
  lines = str(info.value).splitlines()
  assert lines[0] == (
    "layer 3: 3 of 12 elements differ by more than 1 ulp of cbfloat16; worst: at index (0, 3): "
    "actual nan, expected 1.0 (NaN matches only NaN)"
  )
  assert lines[1].strip() == (
    "5 ulp at index (1, 2): actual 1.009765625, expected 1.0, ulp of cbfloat16 at expected 0.001953125"
  )
  assert lines[2].strip().startswith("2 ulp at index (2, 0): actual 1.00390625")
  assert len(lines) == 3


def test_failure_message_for_signed_zeros_and_infinities():
  with pytest.raises(AssertionError, match=r"zeros of different sign; pass check_zero_sign=False"):
    assert_close(np.float32([-0.0]), np.float32([0.0]), "bf16", ulps=1)
  with pytest.raises(AssertionError, match=r"an infinity where a finite value was expected"):
    assert_close([np.inf], [70000.0], "float16", ulps=1)
  with pytest.raises(AssertionError, match=r"an infinity matches only the same infinity"):
    assert_close([-np.inf], [np.inf], "float16", ulps=1)


def test_at_most_five_mismatches_are_listed_worst_first():
  e = np.ones(100, np.float32)
  a = e + np.float32(2.0**-9) * np.arange(100, dtype=np.float32)
  with pytest.raises(AssertionError) as info:
    assert_close(a, e, "cb16", ulps=2)
  lines = str(info.value).splitlines()
  assert lines[0].startswith(
    "97 of 100 elements differ by more than 2 ulp of cbfloat16; worst: 99 ulp at index (99,)"
  )
  assert [line.split(" ulp")[0].strip() for line in lines[1:]] == ["98", "97", "96", "95"]


def test_inputs_jax_bfloat16_lists_and_float64():
  x = jnp.asarray([1.0, 2.5, -3.0], jnp.bfloat16)
  assert_close(x, np.asarray([1.0, 2.5, -3.0]), "bfloat16", ulps=0)
  assert_close(np.asarray(x).astype(ml_dtypes.bfloat16), [1.0, 2.5, -3.0], "bf16", ulps=0)
  assert_close(jnp.float32(2.0), 2.0 + 2.0**-30, "float32", ulps=2.0**-6)  # 0-d, float64 expected
  assert_close([1, 2], [1, 2], "float16", ulps=0)


def test_usage_errors():
  with pytest.raises(AssertionError, match=r"layer 1: shapes differ: actual \(2,\), expected \(3,\)"):
    assert_close([1.0, 2.0], [1.0, 2.0, 3.0], "cb16", ulps=1, context="layer 1")
  with pytest.raises(ValueError, match=r"shapes differ: actual \(\), expected \(1,\); nothing is broadcast"):
    ulp_distance(1.0, [1.0], "cb16")
  with pytest.raises(ValueError, match="ulps=-1; allowed: a number >= 0"):
    assert_close([1.0], [1.0], "cb16", ulps=-1)
  with pytest.raises(ValueError, match="ulps=nan"):
    assert_close([1.0], [1.0], "cb16", ulps=float("nan"))
  with pytest.raises(TypeError, match="ulps=True"):
    assert_close([1.0], [1.0], "cb16", ulps=True)
  with pytest.raises(TypeError, match="complex"):
    assert_close([1j], [1.0], "cb16", ulps=1)
  with pytest.raises(precision.FormatError, match="unknown float format 'cbfloat61'"):
    assert_close([1.0], [1.0], "cbfloat61", ulps=1)


# ---- assert_same_floats on the leaves of other people's pytrees: integers, bit patterns, keys, complex ----


@pytest.mark.parametrize(
  ("a", "e"),
  [
    (np.int32(16777217), np.int32(16777216)),  # 2^24 + 1: float32 holds integers only up to 2^24
    (np.uint32(0xFFFFFFFF), np.uint32(0xFFFFFFFE)),  # bit patterns (precision.encode, key data)
    (np.array([2**31 - 1], np.int32), np.array([2**31 - 2], np.int32)),
    (np.int32(16777217), np.float32(16777216)),
    (np.array([1 + 2j], np.complex64), np.array([1 + 3j], np.complex64)),  # only the imaginary part
    (np.complex64(1 + 2j), np.complex64(1 - 2j)),
  ],
  ids=["int32-2^24+1", "uint32-bits", "int32-max", "int-vs-float", "complex-imag", "complex-0d"],
)
def test_assert_same_floats_compares_integers_and_complex_exactly(a, e):
  """Every leaf was converted to float32: integers above 2^24 and uint32 bit patterns that differ
  in their last bits compared equal, and a complex leaf lost its imaginary part (NumPy's
  ComplexWarning, an error under filterwarnings=error)."""
  with pytest.raises(AssertionError, match="1 of"):
    assert_same_floats(a, e)
  assert_same_floats(a, a)


def test_assert_same_floats_compares_prng_keys_by_their_data():
  """A tree holding a PRNG key (a train state, an NNX module's Rngs) was a bare TypeError:
  'JAX array with PRNGKey dtype cannot be converted to a NumPy array'."""
  tree = {"key": jax.random.key(0), "w": jnp.ones(2), "raw": jax.random.PRNGKey(3)}
  assert_same_floats(tree, {"key": jax.random.key(0), "w": jnp.ones(2), "raw": jax.random.PRNGKey(3)})
  with pytest.raises(AssertionError, match=r"\['key'\]"):
    assert_same_floats(tree, {**tree, "key": jax.random.key(1)})


def test_a_pytree_failure_names_its_worst_leaf_first_and_counts_the_others():
  """It named the first failing leaf in key order and said nothing of the others (a worse one
  included)."""
  one = np.ones(4, np.float32)
  with pytest.raises(AssertionError) as info:
    assert_close({"a": one, "b": one, "c": one * 3}, {"a": one + 1, "b": one, "c": one}, "bf16", ulps=1)
  text = str(info.value)
  assert text.startswith("['c']: 4 of 4 elements"), text  # 256 ulp, against 'a''s 64
  assert text.endswith("1 other leaf(s) fail too, worst first: ['a']"), text


@pytest.mark.parametrize("helper", ["assert_close", "assert_same_floats"])
def test_a_key_whose_value_is_none_is_part_of_the_structure(helper):
  """JAX's trees drop None: ``{"a": x, "b": None}`` flattened like ``{"a": x}``, and a missing
  optimizer slot or dropped buffer passed."""
  x = jnp.arange(3.0)
  check = (
    (lambda a, e: assert_close(a, e, "bf16", ulps=0)) if helper == "assert_close" else assert_same_floats
  )
  for actual, expected in [
    ({"a": x, "b": None}, {"a": x}),
    ({"opt_state": (None, None)}, {"opt_state": ()}),
    ({"a": x, "b": None}, {"a": x, "b": x}),
  ]:
    with pytest.raises(AssertionError, match="differ|None"):
      check(actual, expected)
    with pytest.raises(AssertionError, match="differ|None"):
      check(expected, actual)
  check({"a": x, "b": None, "c": (None,)}, {"a": x, "b": None, "c": (None,)})  # the same: passes


def test_a_0d_array_is_a_number_of_ulps():
  """A probe: ``ulps=jnp.float32(1)`` and ``ulps=np.array(1.0)`` were refused as not numbers."""
  for ulps in (jnp.float32(1), np.array(1.0), np.int32(1), jnp.array(1)):
    assert_close([1.0], [1.0 + 2.0**-9], "cbfloat16", ulps=ulps)
    with pytest.raises(AssertionError, match="differ by more than"):
      assert_close([1.0], [1.0 + 2.0**-7], "cbfloat16", ulps=ulps)
  for bad in (np.array([1.0]), np.array(True), "1"):
    with pytest.raises(TypeError, match="allowed: a number >= 0"):
      assert_close([1.0], [1.0], "cbfloat16", ulps=bad)
