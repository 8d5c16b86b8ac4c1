"""precision.Policy: construction, the level rule table, parsing, modelzoo keys, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import precision
from precision.policy import LEVEL_RULES, Policy, PolicyError


def test_defaults_and_format_resolution():
  p = precision.Policy()
  assert (p.param, p.compute, p.output, p.level) == (
    precision.float32,
    precision.cbfloat16,
    precision.float32,
    1,
  )
  q = precision.Policy(param=precision.float32, compute="bf16", output="f32", level=0)
  assert q.compute is precision.bfloat16
  assert hash(q) == hash(precision.Policy(compute="bfloat16", level=0))  # usable as a jit static
  assert p.is_mixed and not precision.Policy(compute="f32").is_mixed


def test_level_rows_follow_the_documented_levels():
  # POL 0: fp32 accumulation everywhere; POL 1: attention in fp32, mixed matmuls;
  # POL 2: mixed everywhere and 16-bit attention softmax (docs/references.md, "Precision optimisation levels").
  assert {LEVEL_RULES[0]["matmul"], LEVEL_RULES[0]["attention_matmul"]} == {"float32_accumulate"}
  assert LEVEL_RULES[1]["matmul"] == "mixed_accumulate"
  assert LEVEL_RULES[1]["attention_matmul"] == "float32_accumulate"
  assert LEVEL_RULES[1]["attention_softmax"] == "float32"
  assert LEVEL_RULES[2]["attention_matmul"] == "mixed_accumulate"
  assert LEVEL_RULES[2]["attention_softmax"] == "round"
  for level in (0, 1, 2):
    assert precision.Policy(level=level).rule_table == LEVEL_RULES[level]


def test_rule_overrides():
  p = precision.Policy(level=1, rules={"transcendental": "round"})
  assert p.rule("transcendental") == "round" and p.rule("matmul") == "mixed_accumulate"
  assert p.with_rules(matmul="float32").rule_table["matmul"] == "float32"
  assert "transcendental=round" in str(p)


@pytest.mark.parametrize(
  "kwargs, fragment",
  [
    ({"level": 3}, "must be 0, 1 or 2"),
    ({"level": True}, "must be 0, 1 or 2"),
    ({"rules": {"softmax": "round"}}, "unknown op class 'softmax'. Did you mean 'attention_softmax'?"),
    ({"rules": {"matmul": "round"}}, "allowed for matmul: float32_accumulate, mixed_accumulate, float32"),
    ({"rules": {"reduction": "bf16"}}, "allowed for reduction: round, float32"),
    ({"accumulation_block": 0}, "accumulation_block=0; allowed: an int >= 1"),
  ],
)
def test_bad_settings_say_what_is_allowed(kwargs, fragment):
  with pytest.raises(PolicyError, match=None) as info:
    precision.Policy(**kwargs)
  assert fragment in str(info.value)


def test_unknown_format_is_a_format_error():
  with pytest.raises(precision.FormatError, match="Did you mean"):
    precision.Policy(compute="cbfloat61")


def test_parse():
  p = precision.Policy.parse("p=f32,c=cb16,o=f32")
  assert p == precision.Policy(compute="cbfloat16")
  assert precision.Policy.parse("params=float32, compute=bf16, output=bf16, level=2") == precision.Policy(
    compute="bfloat16", output="bfloat16", level=2
  )
  assert precision.Policy.parse(str(p)) == p  # str round-trips
  with pytest.raises(PolicyError, match="unknown key 'compte'. Did you mean 'compute'"):
    precision.Policy.parse("compte=bf16")
  with pytest.raises(PolicyError, match="is not key=value"):
    precision.Policy.parse("c")
  with pytest.raises(PolicyError, match="level='x'; allowed: 0, 1, 2"):
    precision.Policy.parse("level=x")
  with pytest.raises(PolicyError, match="unknown float format"):
    precision.Policy.parse("c=bf17")
  for rules in ("x", 3, [("matmul",)]):  # a bare ValueError / TypeError of dict() before
    with pytest.raises(PolicyError, match=r"rules=.*: rules are a mapping \{op_class: treatment\}"):
      precision.Policy(compute="cb16", rules=rules)


def test_from_config_modelzoo_keys():
  # The modelzoo default half type is bfloat16 at level 1; attention softmax stays float32.
  p = precision.Policy.from_config()
  assert p.compute is precision.bfloat16 and p.level == 1 and p.rule("attention_softmax") == "float32"
  # Modelzoo forces attention_softmax_fp32 off at level 1 with cbfloat16, and at level 2.
  assert precision.Policy.from_config(fp16_type="cbfloat16").rule("attention_softmax") == "round"
  assert (
    precision.Policy.from_config(fp16_type="float16", precision_opt_level=2).rule("attention_softmax")
    == "round"
  )
  assert precision.Policy.from_config(fp16_type="cbfloat16", precision_opt_level=0).rule(
    "attention_softmax"
  ) == ("float32")
  assert precision.Policy.from_config(fp16_type="float16", attention_softmax_fp32=False).rule(
    "attention_softmax"
  ) == ("round")
  assert precision.Policy.from_config(use_bfloat16=True).compute is precision.bfloat16
  assert not precision.Policy.from_config(mixed_precision=False).is_mixed
  with pytest.raises(
    PolicyError, match=r"precision_opt_level=3: the precision optimisation level must be 0, 1 or 2"
  ):
    precision.Policy.from_config(precision_opt_level=3)
  with pytest.raises(PolicyError, match="Did you mean 'cbfloat16'"):
    precision.Policy.from_config(fp16_type="cbfloat61")
  with pytest.raises(PolicyError, match="conflicts"):
    precision.Policy.from_config(fp16_type="float16", use_bfloat16=True)


def test_cast_helpers_round_float32_leaves_only():
  p = precision.Policy(compute="cb16", output="f16")
  tree = {"w": jnp.float32(1.0 + 2.0**-10), "n": jnp.int32(3), "h": np.float32(70000.0)}
  assert float(p.cast_to_compute(tree)["w"]) == 1.0  # cbfloat16: 9 fraction bits, the tie to even
  assert np.isinf(float(p.cast_to_output(tree)["h"]))  # float16 overflows at 65520
  assert p.cast_to_compute(tree)["n"].dtype == jnp.int32
  assert jax.tree.structure(p.cast_to_compute(tree)) == jax.tree.structure(tree)


# ---- issue 11: param has a meaning, str parses back, settings are validated ----


@pytest.mark.parametrize("param", ["bf16", "float8_e4m3fn", "cb16"])
def test_param_other_than_float32_is_an_error_not_ignored(param):
  # Weights are stored and updated in float32 (Cerebras); a narrower `param` used to be
  # accepted and silently ignored by autocast.
  with pytest.raises(PolicyError, match="stored and updated in float32"):
    precision.Policy(param=param)
  with pytest.raises(PolicyError, match="stored and updated in float32"):
    precision.Policy.parse(f"p={param},c=cb16")
  assert precision.Policy(param="f32").param is precision.float32


@pytest.mark.parametrize(
  "policy",
  [
    precision.Policy(rules={"attention_softmax": "round"}),
    precision.Policy(compute="bf16", level=2, accumulation_block=256),
    precision.Policy(level=0, rules={"matmul": "float32", "transcendental": "round"}, accumulation_block=7),
    precision.Policy.from_config(fp16_type="cbfloat16"),
  ],
)
def test_str_parses_back(policy):
  assert precision.Policy.parse(str(policy)) == policy


def test_parse_rejects_duplicate_keys():
  with pytest.raises(PolicyError, match="compute is given twice"):
    precision.Policy.parse("c=bf16,compute=cb16")
  with pytest.raises(PolicyError, match="level is given twice"):
    precision.Policy.parse("level=1,pol=2")
  with pytest.raises(PolicyError, match="attention_softmax is given twice"):
    precision.Policy.parse("attention_softmax=round,attention_softmax=float32")


@pytest.mark.parametrize(
  "text", ["c=bf16;level=2", "c=bf16 level=2", "level=2;c=bf16", "c=bf16,level=2 block=64"]
)
def test_parse_says_to_separate_items_with_commas(text):
  """'c=bf16;level=2' was read as the format name 'bf16;level=2' ("unknown float format")."""
  with pytest.raises(PolicyError, match="holds two settings; separate items with commas"):
    precision.Policy.parse(text)


@pytest.mark.parametrize("text", ["c=cb16,,level=2", ",c=cb16", "c=cb16,", "c=cb16, ,level=1"])
def test_parse_refuses_empty_items(text):
  """Two commas (or one at an end) were dropped silently, where `wafer sweep --formats` refuses them."""
  with pytest.raises(PolicyError, match="an empty item"):
    precision.Policy.parse(text)


@pytest.mark.parametrize("text", [None, 16, b"c=bf16"])
def test_parse_of_something_not_a_string_is_a_policy_error(text):
  with pytest.raises(PolicyError, match="a policy string is text"):
    precision.Policy.parse(text)


def test_level_and_block_types():
  for bad in (1.0, "1", 1.5):
    with pytest.raises(PolicyError, match="must be 0, 1 or 2"):
      precision.Policy(level=bad)
  with pytest.raises(PolicyError, match=r"precision_opt_level=1.0: .* must be 0, 1 or 2"):
    precision.Policy.from_config(precision_opt_level=1.0)  # one wording for the rule, as Policy(level=)
  p = precision.Policy(level=np.int64(2), accumulation_block=np.int64(64))
  assert p == precision.Policy(level=2, accumulation_block=64)
  assert type(p.level) is int and type(p.accumulation_block) is int
  with pytest.raises(PolicyError, match="accumulation_block=64.0"):
    precision.Policy(accumulation_block=64.0)


@pytest.mark.parametrize("key", ["mixed_precision", "attention_softmax_fp32", "use_bfloat16"])
@pytest.mark.parametrize("text", ["false", "False", "0", "no", "true", ""])
def test_from_config_flags_that_are_strings_are_errors(key, text):
  """``from_config(mixed_precision="false")`` (a value read from a quoted YAML entry, an argparse
  option or an environment variable) gave a bfloat16 policy: the truth value of any non-empty
  string is True."""
  with pytest.raises(PolicyError, match=rf"{key}='{text}' \(str\): a flag is True or False"):
    precision.Policy.from_config(**{key: text})


@pytest.mark.parametrize("flag", [True, False, np.bool_(True), np.bool_(False), 0, 1])
def test_from_config_flags_accept_booleans_and_0_or_1(flag):
  assert precision.Policy.from_config(mixed_precision=flag).is_mixed == bool(flag)
  softmax = precision.Policy.from_config(fp16_type="float16", attention_softmax_fp32=flag)
  assert softmax.rule("attention_softmax") == ("float32" if flag else "round")
  with pytest.raises(PolicyError, match="mixed_precision=None"):
    precision.Policy.from_config(mixed_precision=None)


def test_only_the_compute_format_is_positional():
  """``Policy(compute, *, output, level, ...)``: the first field was ``param``, so
  ``Policy("float32", "bfloat16")`` (the docs' order: compute, output) was a bfloat16-compute policy,
  silently, and ``Policy("cb16")`` an error about ``param``. Two positional formats are refused, as
  the docs' order and jmp's (param, compute, output) would read them differently."""
  assert Policy("cb16") == Policy(compute="cbfloat16")
  assert Policy("bf16", output="bf16", level=2) == Policy(compute="bfloat16", output="bfloat16", level=2)
  for args in (("float32", "bfloat16"), ("float32", "cbfloat16", "float32"), ("cb16", "f32", 2)):
    with pytest.raises(TypeError, match="positional argument"):
      Policy(*args)
  assert Policy(param="float32").param.name == "float32"


def test_a_format_variant_says_how_to_name_it_and_then_round_trips():
  """str() of a policy over a FloatFormat.replace variant ('cbfloat16[overflow=saturate]') was
  refused as an item that "holds two settings"."""
  variant = precision.cbfloat16.replace(overflow="saturate")
  with pytest.raises(
    precision.PolicyError, match=r"is a format variant \(FloatFormat.replace\).*register_format"
  ):
    precision.Policy.parse(str(precision.Policy(variant)))
  named = precision.register_format(precision.cbfloat16.replace(overflow="saturate", name="test_cb16_sat"))
  policy = precision.Policy(named, level=2)
  assert precision.Policy.parse(str(policy)) == policy
