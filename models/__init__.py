"""Reference Flax NNX models, each a `wafer` plugin: model, data processors, params YAML, `ModelSpec`.

========================  =====================================================================
package                   contents
========================  =====================================================================
``models/bert``           ``model.py`` (BERT MLM+NSP), ``data.py`` (MLM/NSP examples, HDF5/CSV,
                          the BERT processors' strict input schema), ``configs/params_*.yaml``
``models/gpt2``           ``model.py`` (GPT-2 / GPT-3), ``data.py`` (next-token windows, GPT HDF5,
                          the GPT processors' input schema), ``configs/``
``models/fc_mnist``       ``model.py`` (the MLP), ``data.py`` (MNIST IDX, scikit-learn digits,
                          ``MNISTDataProcessor``'s input schema), ``configs/``
``models/mlp``            the small example MLP on a synthetic teacher task (the fallback default job)
``models/registry.py``    the task builders and the `wafer.registry.ModelSpec` s ``BERT``, ``GPT``,
                          ``FC_MNIST``
========================  =====================================================================

The specs are found through the ``wafer.models`` entry points in ``pyproject.toml``; each registers
its strict ``model:`` schema and the strict input schema of each of its data processors, so a
misspelled key in a params file is an error. BERT's spec carries the embedded default job that
``wafer run`` runs without ``--params`` (``models/bert/configs/params_bert_tiny_default.yaml``).

Mixed precision never appears in model code: the models are float32 and `precision.autocast`
rounds them. ``model.attention_softmax_fp32`` reaches the attention softmax only through
``Params.policy()`` (the policy's ``attention_softmax`` rule; modelzoo forces it off at
precision_opt_level 2, and at level 1 with cbfloat16).
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
