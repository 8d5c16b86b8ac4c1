"""Run the built-in example job to max_steps and save its final parameters (kill-and-resume test)."""

import sys

import jax
import numpy as np

import wafer
from models.mlp import example_run
from wafer.train import run

model_dir, max_steps, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
wafer.enable_compilation_cache(f"{model_dir}/compile_cache")  # what `wafer run` does
task, runconfig, optimizer, loss_scale, policy = example_run(
  model_dir, max_steps=max_steps, checkpoint_steps=5, log_steps=5
)
summary = run(task, runconfig, optimizer, loss_scale, policy, progress=False)
leaves = jax.tree_util.tree_flatten_with_path(summary["params"])[0]
np.savez(out, **{jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in leaves})
