"""The training runtime: one train state, steps under the precision policy, the run loop, checkpoints.

* `Task`: what to train (params init, loss, data, eval metric); `BatchSource`, `IndexedBatches`;
* `TrainState` (`state`): params, optimizer state, loss-scale state, the global step, the data
  position; `initial_state`;
* `make_train_step` / `make_eval_step` (`step`): ``(state, batch) -> (state, metrics)`` and the
  eval metric, both under the `precision.Policy`;
* `run` (`loop`): the modes train / eval / eval_all / train_and_eval on the typed
  `wafer.config.RunConfig`;
* `Checkpoints` (`checkpoint`): orbax, damaged checkpoints reported and skipped;
* `Metrics` / `Progress` (`metrics`): metrics.jsonl, TensorBoard, log lines (process 0);
  `read_metrics`: the records of a metrics.jsonl (a partial line of a killed run skipped, with file:line);
* `RunInterrupted`: the `KeyboardInterrupt` of a ctrl-C, saying how to resume;
* `lock`: one run at a time in a model_dir (``model_dir/wafer.lock``, held by process 0).
"""

from wafer.errors import ExecutorError as ExecutorError
from wafer.errors import RunInterrupted as RunInterrupted
from wafer.train.checkpoint import Checkpoints as Checkpoints
from wafer.train.loop import MODES as MODES
from wafer.train.loop import checkpoint_iterations as checkpoint_iterations
from wafer.train.loop import run as run
from wafer.train.loop import seed_of as seed_of
from wafer.train.loop import steps_to_run as steps_to_run
from wafer.train.metrics import Metrics as Metrics
from wafer.train.metrics import Progress as Progress
from wafer.train.metrics import read_metrics as read_metrics
from wafer.train.state import TrainState as TrainState
from wafer.train.state import initial_state as initial_state
from wafer.train.state import schedule_counts as schedule_counts
from wafer.train.state import step_shapes as step_shapes
from wafer.train.step import make_eval_step as make_eval_step
from wafer.train.step import make_train_step as make_train_step
from wafer.train.summary import RunSummary as RunSummary
from wafer.train.task import BatchSource as BatchSource
from wafer.train.task import IndexedBatches as IndexedBatches
from wafer.train.task import Task as Task

__all__ = (
  "MODES",
  "BatchSource",
  "Checkpoints",
  "ExecutorError",
  "IndexedBatches",
  "Metrics",
  "Progress",
  "RunInterrupted",
  "RunSummary",
  "Task",
  "TrainState",
  "checkpoint_iterations",
  "initial_state",
  "step_shapes",
  "make_eval_step",
  "make_train_step",
  "read_metrics",
  "run",
  "schedule_counts",
  "seed_of",
  "steps_to_run",
)
