"""Run by tests/test_own_data.py under `horovodrun -np 2`: a user's own data
and models, trained, then resumed, in one launch.

Each case trains 1 epoch, then the same config with --epochs=2 resumes it
from its checkpoint. Each rank writes what it observed (weights across
ranks, reported against full-split figures, histories) to
OUT/rank<r>.json; the run directories stay in OUT/<case>/ for the test to
read (checkpoints, classes.txt, exports).
"""
import json
import os
import sys

import horovod.tensorflow as hvd

from tests import fixtures
from tests.workers.multiprocess_checks import engine_run


def cases(image_dir: str, arrays_dir: str, code_dir: str) -> dict:
  """Each format with a built-in or a user's model."""
  model_file = os.path.join(code_dir, "users_model.py")
  npz = os.path.join(arrays_dir, "a.npz")
  return {
      "image_folder": dict(dataset="image_folder", data_dir=image_dir,
                           model="cnn", image_size=16),
      "npz": dict(dataset="arrays", data_dir=npz, model=f"{model_file}:build"),
      "npy": dict(dataset="arrays", data_dir=os.path.join(arrays_dir, "npy"),
                  model="resnet_small"),
      "h5": dict(dataset="arrays", data_dir=os.path.join(arrays_dir, "a.h5"),
                 model=f"{model_file}:build_subclassed"),
      "users_data": dict(
          dataset=f"{os.path.join(code_dir, 'users_data.py')}:load",
          data_dir=npz, model="cnn"),
  }


def main(out_dir: str, image_dir: str, arrays_dir: str, code_dir: str):
  defaults = fixtures.train_config()
  observed = {}
  for name, case in cases(image_dir, arrays_dir, code_dir).items():
    image_size = case.get("image_size", defaults.data.params["image_size"])
    config = fixtures.train_config(
        data=dict(name=case["dataset"], dir=case["data_dir"],
                  params={**defaults.data.params, "image_size": image_size}),
        model=dict(name=case["model"],
                   params={**defaults.model.params, "filters": 4,
                           "dropout": 0.1}),
        training=dict(model_dir=os.path.join(out_dir, name), epochs=1,
                      batch_size=4, progress="none"),
        optimization=dict(optimizer="sgd", base_lr=0.05))
    first = engine_run(config)
    resumed = engine_run(config.replace(training=dict(epochs=2)))
    observed[name] = {"first": first, "resumed": resumed}
  with open(os.path.join(out_dir, f"rank{hvd.rank()}.json"), "w") as f:
    json.dump(observed, f)


if __name__ == "__main__":
  main(*sys.argv[1:])
