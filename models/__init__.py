"""Reference Flax NNX models with modelzoo-style params YAML under ``models/<name>/configs``.

Importing the package registers each model's strict ``model:`` schema with
`wafer.config.register_model_schema` (``fc_mnist``, ``bert``, ``gpt2``, ``gpt3``), so that a
misspelled model key in a params file is an error.

Mixed precision never appears in model code: the models are float32 and `precision.autocast`
rounds them. ``model.attention_softmax_fp32`` reaches the attention softmax only through
``Params.policy()`` (the policy's ``attention_softmax`` rule; modelzoo forces it off at
precision_opt_level 2, and at level 1 with cbfloat16).
"""

from models import bert as bert
from models import fc_mnist as fc_mnist
from models import gpt2 as gpt2

__all__ = ("bert", "fc_mnist", "gpt2")
