"""precision: bit-exact emulation of low-precision float formats in float32 JAX arrays.

Numerics only; this package imports nothing else of the project.

>>> import precision
>>> float(precision.round(1.0 + 2.0**-10, "cbfloat16"))   # 9 fraction bits: the tie goes to even
1.0
>>> int(precision.encode(1.0, precision.cbfloat16))        # sign 0, exponent 31 (bias 31), fraction 0
15872
"""

from precision import testing as testing
from precision._op_classes import PRIMITIVE_CLASSES as PRIMITIVE_CLASSES
from precision._op_classes import UnknownPrimitiveWarning as UnknownPrimitiveWarning
from precision.autocast import autocast as autocast
from precision.autocast import cast_report as cast_report
from precision.autocast import float32_region as float32_region
from precision.autocast import whole_products as whole_products
from precision.cast_report import CastCounts as CastCounts
from precision.cast_report import CastReport as CastReport
from precision.formats import FloatFormat as FloatFormat
from precision.formats import FormatError as FormatError
from precision.formats import bfloat16 as bfloat16
from precision.formats import cbfloat16 as cbfloat16
from precision.formats import float8_e4m3fn as float8_e4m3fn
from precision.formats import float8_e5m2 as float8_e5m2
from precision.formats import float16 as float16
from precision.formats import float32 as float32
from precision.formats import format_table as format_table
from precision.formats import get_format as get_format
from precision.formats import register_format as register_format
from precision.loss_scale import DynamicLossScale as DynamicLossScale
from precision.loss_scale import StaticLossScale as StaticLossScale
from precision.loss_scale import all_finite as all_finite
from precision.loss_scale import select_tree as select_tree
from precision.numerics_report import NumericsReport as NumericsReport
from precision.numerics_report import numerics_report as numerics_report
from precision.policy import Policy as Policy
from precision.policy import PolicyError as PolicyError
from precision.rounding import decode as decode
from precision.rounding import encode as encode
from precision.rounding import round as round

__all__ = (
  "CastCounts",
  "CastReport",
  "DynamicLossScale",
  "FloatFormat",
  "FormatError",
  "NumericsReport",
  "PRIMITIVE_CLASSES",
  "Policy",
  "PolicyError",
  "StaticLossScale",
  "UnknownPrimitiveWarning",
  "all_finite",
  "autocast",
  "bfloat16",
  "cast_report",
  "cbfloat16",
  "decode",
  "encode",
  "float8_e4m3fn",
  "float8_e5m2",
  "float16",
  "float32",
  "float32_region",
  "format_table",
  "get_format",
  "numerics_report",
  "register_format",
  "round",
  "select_tree",
  "testing",
  "whole_products",
)
