"""The example MLP: the job `wafer run` falls back to without ``--params`` (a `wafer.registry.ModelSpec`).

A 3-layer MLP classifies 32-dimensional inputs into 8 classes labelled by a fixed random
teacher network; the batch of step ``k`` is drawn from a generator seeded with ``(seed, k)``,
so the data position is just the step and a resumed run sees exactly the batches it would
have seen. It trains in cbfloat16 mixed precision (level 1) with dynamic loss scaling.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from pydantic import ConfigDict

import precision
from wafer.config import InputConfig, ModelConfig
from wafer.registry import ModelSpec
from wafer.train import IndexedBatches, Task

IN, HIDDEN, CLASSES = 32, 64, 8


def _teacher_labels(x: np.ndarray) -> np.ndarray:
  w = np.random.default_rng(0).standard_normal((IN, CLASSES)).astype(np.float32)
  return np.argmax(np.tanh(x @ w) + 0.1 * x[:, :CLASSES], axis=1).astype(np.int32)


def _batch(seed: int, step: int, batch_size: int) -> dict[str, np.ndarray]:
  x = np.random.default_rng([seed, step]).standard_normal((batch_size, IN)).astype(np.float32)
  return {"x": x, "label": _teacher_labels(x)}


def init_params(key: jax.Array) -> dict[str, Any]:
  sizes = [(IN, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN, CLASSES)]
  keys = jax.random.split(key, len(sizes))
  return {
    f"layer{i}": {
      "w": jax.random.normal(k, s, jnp.float32) / np.sqrt(s[0]),
      "b": jnp.zeros(s[1], jnp.float32),
    }
    for i, (k, s) in enumerate(zip(keys, sizes))
  }


def logits(params: dict[str, Any], x: jax.Array) -> jax.Array:
  for i in range(3):
    x = x @ params[f"layer{i}"]["w"] + params[f"layer{i}"]["b"][None]
    if i < 2:
      x = jax.nn.relu(x)
  return x


def loss_fn(params: dict[str, Any], batch: dict[str, Any]) -> jax.Array:
  return optax.softmax_cross_entropy_with_integer_labels(logits(params, batch["x"]), batch["label"]).mean()


def accuracy(params: dict[str, Any], batch: dict[str, Any]) -> jax.Array:
  return jnp.mean((jnp.argmax(logits(params, batch["x"]), axis=-1) == batch["label"]).astype(jnp.float32))


def example_task(batch_size: int = 64, eval_batches: int = 4, eval_batch_size: int | None = None) -> Task:
  """The example task: training batches of ``batch_size``; ``eval_batches`` held-out batches of
  ``eval_batch_size`` (default: ``batch_size``)."""
  eval_rows = batch_size if eval_batch_size is None else eval_batch_size
  return Task(
    name="mlp_example",
    init_params=init_params,
    loss_fn=loss_fn,
    train_data=lambda seed: IndexedBatches(lambda step: _batch(seed, step, batch_size)),
    eval_data=lambda: (_batch(10_000, i, eval_rows) for i in range(eval_batches)),
    eval_metric=accuracy,
    eval_metric_name="accuracy",
    batch_size=batch_size,
  )


CONFIG = Path(__file__).parent / "configs" / "params_mlp.yaml"
# The params file of the built-in job (modelzoo's legacy layout).
EXAMPLE_PARAMS = CONFIG.read_text()


def build_task(params: Any) -> Task:
  """The registry builder: the example task at the params file's batch sizes (``train_input`` and
  ``eval_input``'s ``batch_size``; an eval-only file's train batch is its eval batch)."""
  train = params.train_input.batch_size if params.train_input is not None else None
  evaluate = params.eval_input.batch_size if params.eval_input is not None else None
  batch = train or evaluate or 64
  return example_task(
    batch_size=batch, eval_batches=params.runconfig.eval_steps or 4, eval_batch_size=evaluate
  )


class MlpConfig(ModelConfig):
  """``model:`` of the example MLP: no keys beyond the shared precision ones."""

  model_config = ConfigDict(extra="forbid")


class SyntheticTeacherInput(InputConfig):
  """``train_input`` / ``eval_input`` of the example: batches drawn from a seeded generator."""

  model_config = ConfigDict(extra="forbid")


SPEC = ModelSpec(
  names=("mlp_example",),
  config=MlpConfig,
  build_task=build_task,
  data_processors={"SyntheticTeacher": SyntheticTeacherInput},
  eval_metric="accuracy",
  default_job=(
    str(CONFIG),
    "a 3-layer MLP on a synthetic teacher task, cbfloat16 with dynamic loss scaling",
    0,
  ),
)


def example_run(model_dir: str = "model_dir", **overrides: Any) -> tuple:
  """``(task, runconfig, optimizer, loss scale, policy)`` of the built-in job, for `wafer.train.run`.

  ``overrides`` replace ``runconfig`` keys of `EXAMPLE_PARAMS` (validated by the same schema
  as a params file: a misspelled key is an error).
  """
  import yaml

  from wafer.config import RunConfig

  section = {**yaml.safe_load(EXAMPLE_PARAMS)["runconfig"], "model_dir": model_dir, **overrides}
  runconfig = RunConfig.model_validate(section)
  policy = precision.Policy(compute="cbfloat16", level=1)
  return (
    example_task(),
    runconfig,
    optax.sgd(0.05, momentum=0.9),
    precision.DynamicLossScale.create("cbfloat16"),
    policy,
  )
