"""Run by tests/test_model_forms.py under `horovodrun -np 2`: the
subclassed model of model_forms.py (its layers in lists, dicts and
tuples) trained from a script, stopped by SIGTERM on rank 1 alone at
global step STOP_AT (0: never), as a preempted job is.

  model_forms_run.py DATA_DIR MODEL_DIR STOP_AT

Each rank writes its model's variables at the end to
MODEL_DIR/rank<r>.npz.
"""
import os
import signal
import sys

import horovod.tensorflow as hvd
import numpy as np

import engine.train
from engine.loop import actions

FORMS = os.path.join(os.path.dirname(__file__), "model_forms.py")


def main(data_dir: str, model_dir: str, stop_at: str):
  stop_at = int(stop_at)

  def preempt(at):
    if at.global_step == stop_at and hvd.rank() == 1:
      signal.raise_signal(signal.SIGTERM)

  sys.argv[1:] = []  # (the flags are the defaults given below)
  result = engine.train.run(
      model=f"{FORMS}:listed", actions=[actions.Every(1, preempt)],
      data_dir=data_dir, model_dir=model_dir, epochs=2, batch_size=16,
      steps_per_epoch=0, optimizer="sgd", base_lr=0.05, progress="none",
      deterministic=True, mixed_precision="none", gradient_compression="none")
  np.savez(os.path.join(model_dir, f"rank{hvd.rank()}.npz"),
           *[v.numpy() for v in result.model.variables])


if __name__ == "__main__":
  main(*sys.argv[1:4])
