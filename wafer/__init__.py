"""wafer: the emulated Cerebras system (runtime, cost model, CLI). Imports `precision`.

* `wafer.compile`: ahead-of-time compilation of a step whose graph must not change
  (`StaticGraphError` otherwise), with step closures (`step_closure`, `add_step_closure`,
  `checkpoint_closure`) that run on host values after a step;
* `wafer.cluster`: ``num_csx`` data parallelism over JAX devices, in one or many processes;
* `wafer.train`: the run loop (one train state, train and eval steps under the policy, checkpoints);
* `wafer.estimate`: the tiled wafer cost model, returning a `wafer.Report`;
* the ``wafer`` console script (``wafer demo``, ``wafer estimate``).
"""

from wafer import registry as registry  # the config's schema source: the model plugins (wafer.registry)
from wafer.closures import add_step_closure as add_step_closure
from wafer.closures import checkpoint_closure as checkpoint_closure
from wafer.closures import step_closure as step_closure
from wafer.compile import CompiledStep as CompiledStep
from wafer.compile import compile as compile
from wafer.compile import enable_compilation_cache as enable_compilation_cache
from wafer.costmodel import Report as Report
from wafer.costmodel import estimate as estimate
from wafer.errors import ClusterConfigError as ClusterConfigError
from wafer.errors import StaticGraphError as StaticGraphError
from wafer.errors import StepUsageError as StepUsageError
from wafer.errors import WaferError as WaferError

#: The version of the wafer distribution.
__version__ = "0.1.0"

__all__ = (
  "ClusterConfigError",
  "CompiledStep",
  "Report",
  "StaticGraphError",
  "StepUsageError",
  "WaferError",
  "__version__",
  "add_step_closure",
  "checkpoint_closure",
  "compile",
  "enable_compilation_cache",
  "estimate",
  "step_closure",
)
