"""The params YAML: typed, validated config objects, overrides and errors users can act on.

Example (a ConfigError's text names the file, the line, the key path, the value and what is allowed):

>>> from wafer.config import ConfigError, load_params
>>> data = {
...   "train_input": {"batch_size": 8},
...   "model": {"name": "mlp_example", "fp16_type": "bfloat16"},
...   "optimizer": {"optimizer_type": "SGD", "learning_rate": 0.1, "momentum": 0.9},
...   "runconfig": {"max_steps": 100},
... }
>>> params = load_params(data, ["runconfig.max_steps=10"])
>>> params.runconfig.max_steps, params.policy().compute.name
(10, 'bfloat16')
>>> tx, loss_scale = params.build_optimizer()   # the optax transformation and the loss scale
>>> runtime = params.build()   # optimizer, loss scale, policy and run settings, for wafer.train.run
>>> try:
...   load_params(data, ["optimizer.momentun=0.5"])
... except ConfigError as e:
...   print(str(e).split(": ", 1)[1])
optimizer.momentun (from override 'optimizer.momentun=0.5'): unknown key 'momentun'; did you mean 'momentum'? (got 0.5)

Files in modelzoo's legacy layout (``train_input``, ``eval_input``, ``model``, ``optimizer``,
``runconfig``) are validated directly; files in the trainer (v2) layout are detected and
converted (:func:`from_trainer_layout`; the module ``wafer.config.trainer`` lists what converts).
"""

from wafer.config.errors import ConfigError as ConfigError
from wafer.config.errors import Problem as Problem
from wafer.config.errors import format_config_error as format_config_error
from wafer.config.loader import build_optimizer as build_optimizer
from wafer.config.loader import load_params as load_params
from wafer.config.loader import parse_override as parse_override
from wafer.config.loader import validate_params as validate_params
from wafer.config.loader import validate_section as validate_section
from wafer.config.optimizer import Optimizer as Optimizer
from wafer.config.optimizer import OptimizerConfig as OptimizerConfig
from wafer.config.params import Params as Params
from wafer.config.params import Runtime as Runtime
from wafer.config.params import add_model_check as add_model_check
from wafer.config.params import add_schema_source as add_schema_source
from wafer.config.params import register_input_schema as register_input_schema
from wafer.config.params import register_model_schema as register_model_schema
from wafer.config.schema import CSConfig as CSConfig
from wafer.config.schema import InputConfig as InputConfig
from wafer.config.schema import ModelConfig as ModelConfig
from wafer.config.schema import RunConfig as RunConfig
from wafer.config.trainer import from_trainer_layout as from_trainer_layout

__all__ = (
  "CSConfig",
  "ConfigError",
  "InputConfig",
  "ModelConfig",
  "Optimizer",
  "OptimizerConfig",
  "Params",
  "Problem",
  "RunConfig",
  "Runtime",
  "add_model_check",
  "add_schema_source",
  "build_optimizer",
  "format_config_error",
  "from_trainer_layout",
  "load_params",
  "parse_override",
  "register_input_schema",
  "register_model_schema",
  "validate_params",
  "validate_section",
)
