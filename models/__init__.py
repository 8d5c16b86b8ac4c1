"""Reference Flax NNX models with modelzoo-style params YAML under ``models/<name>/configs``.

Importing the package registers each model's strict ``model:`` schema with
`wafer.config.register_model_schema` (``fc_mnist``, ``bert``, ``gpt2``, ``gpt3``), so that a
misspelled model key in a params file is an error.

Mixed precision never appears in model code: the models are float32 and `precision.autocast`
rounds them. ``model.attention_softmax_fp32`` reaches the attention softmax only through
``Params.policy()`` (the policy's ``attention_softmax`` rule; modelzoo forces it off at
precision_opt_level 2, and at level 1 with cbfloat16).

Importing it also registers the models' executor tasks (`models.registry`) with `wafer.registry`
(``bert``, ``gpt2``, ``gpt3``, ``fc_mnist``) and the embedded default job `wafer run` runs
without ``--params`` (``models/bert/configs/params_bert_tiny_default.yaml``).
"""

from models import bert as bert
from models import fc_mnist as fc_mnist
from models import gpt2 as gpt2
from models import registry as registry
from models.common import abstract_parameter_count as abstract_parameter_count
from models.common import parameter_count as parameter_count
from models.zoo import abstract_model as abstract_model
from models.zoo import build_model as build_model
from models.zoo import functional as functional
from models.zoo import loss_function as loss_function

__all__ = (
  "abstract_model",
  "abstract_parameter_count",
  "bert",
  "build_model",
  "fc_mnist",
  "functional",
  "gpt2",
  "loss_function",
  "parameter_count",
  "registry",
)
