"""Run the built-in example job to max_steps and save its final parameters (kill-and-resume test)."""

import sys

import jax
import numpy as np

from models.mlp import example_run
from wafer.executor import run

model_dir, max_steps, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
task, settings, optimizer, loss_scale, policy = example_run(
  model_dir, num_steps=None, max_steps=max_steps, checkpoint_steps=5, log_steps=5, progress=False
)
summary = run(task, settings, optimizer, loss_scale, policy)
leaves = jax.tree_util.tree_flatten_with_path(summary["params"])[0]
np.savez(out, **{jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in leaves})
