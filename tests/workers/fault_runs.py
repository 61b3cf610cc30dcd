"""Run by tests/test_faults.py under `horovodrun -np 2`: faults, for real.

Several engine runs in one launch, since each TensorFlow process takes
seconds to start; each is a call of engine.train.train, so an error it ends
with is caught here, on every rank, and described in OUT/rank<r>.json:

1. good: one epoch, saved.
2. diverged: the same model_dir continued with a rate that diverges in
   epoch 2 (--on_nonfinite=stop). Rank 0 hashes the checkpoints and
   exports before and after.
3. rolled_back: the same again with --on_nonfinite=rollback; it diverges
   in epochs 2 and 3, rolls back twice, and finishes.
4. (as root) disk_full: on a tmpfs of 14 MB, one epoch is saved, the next
   save fails; the tmpfs is enlarged and the rerun resumes.
5. (as root) read_only: model_dir becomes a read-only bind mount of itself
   after the first epoch's checkpoint (a remount of its file system would
   be refused while TensorBoard's events file is open for writing).
6. removed: model_dir is removed after the first epoch's checkpoint.
"""
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from engine import distributed
from engine import train as engine_train
from engine.core.errors import UserError
from tests import fixtures

# One epoch's checkpoint, best/ and exports fit (3.2 + 3.2 MB, and 1.6 MB
# for each of the two SavedModels and two .keras files), one more
# checkpoint not.
TMPFS_MEGABYTES = 14


def config(data_dir, model_dir, epochs=1, **changes):
  """A run of `epochs` in `model_dir`, with `changes` by section."""
  defaults = fixtures.train_config()
  return fixtures.train_config(
      data=dict(dir=data_dir),
      model=dict(params={**defaults.model.params, "filters": 32}),
      training=dict(model_dir=model_dir, batch_size=16, steps_per_epoch=6,
                    epochs=epochs, progress="none"),
      optimization=dict(optimizer="sgd", base_lr=0.02),
      checkpoints=dict(keep_checkpoints=3)).replace(**changes)


def diverging(**faults):
  """From epoch 2 on, the rate is 10^5 times the first epoch's; `faults`:
  the fault flags."""
  return dict(epochs=3, optimization=dict(
      lr_schedule="step", lr_decay_epochs=(1,), lr_decay_factor=1e5),
              faults=faults)


def attempt(run_config) -> dict:
  """Trains; what this rank saw: its error, or its epochs."""
  try:
    result = engine_train.train(run_config)
  except UserError as e:
    return {"error": type(e).__name__, "message": str(e)}
  weights = np.concatenate([v.numpy().ravel()
                            for v in result.model.variables])
  everyone = hvd.allgather(tf.constant(weights[None]),
                           name="weights_" + str(len(weights))).numpy()
  return {"epochs": [r["epoch"] for r in result.history],
          "max_weight_difference_across_ranks":
              float(np.abs(everyone - everyone[0]).max())}


def files(directory: str) -> dict:
  """Rank 0's view: every file under `directory` and its hash."""
  found = {}
  for path in sorted(glob.glob(os.path.join(directory, "**"),
                               recursive=True)):
    if os.path.isfile(path):
      with open(path, "rb") as f:
        found[os.path.relpath(path, directory)] = hashlib.sha256(
            f.read()).hexdigest()
  return found


def metrics(model_dir: str) -> list:
  with open(os.path.join(model_dir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def checkpoint_value(model_dir: str, key: str) -> float:
  path = tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints"))
  return float(tf.train.load_checkpoint(path).get_tensor(
      key + "/.ATTRIBUTES/VARIABLE_VALUE"))


def on_chief(action, name: str):
  """`action()` on rank 0 while the others wait for it."""
  distributed.on_chief(action if distributed.is_chief() else None, name=name)


def after_first_checkpoint(model_dir: str, action) -> threading.Thread:
  """Rank 0: runs `action` in the background once the first epoch's
  checkpoint is recorded, as a user or another program would mid-run."""
  def wait_then_act():
    state = os.path.join(model_dir, "checkpoints", "checkpoint")
    while not os.path.exists(state):
      time.sleep(0.02)
    action()
  thread = threading.Thread(target=wait_then_act, daemon=True)
  if distributed.is_chief():
    thread.start()
  return thread


def mount_tmpfs(path: str, megabytes: int, *options: str) -> None:
  os.makedirs(path, exist_ok=True)
  subprocess.run(["mount", "-t", "tmpfs", "-o",
                  ",".join((f"size={megabytes}m",) + options), "tmpfs",
                  path], check=True)


def remount(path: str, option: str) -> None:
  subprocess.run(["mount", "-o", f"remount,{option}", path], check=True)


def make_read_only(path: str) -> None:
  subprocess.run(["mount", "--bind", path, path], check=True)
  remount(path, "bind,ro")


def main(out_dir: str, data_dir: str) -> None:
  distributed.start_horovod()
  observed = {}
  chief = distributed.is_chief()
  model_dir = os.path.join(out_dir, "run")

  # 1-3: a good epoch, a divergence that stops, one that rolls back.
  observed["good"] = attempt(config(data_dir, model_dir))
  saved = ("checkpoints", "export")
  before = ({name: files(os.path.join(model_dir, name)) for name in saved}
            if chief else {})
  observed["diverged"] = attempt(config(data_dir, model_dir, **diverging()))
  if chief:
    observed["saved_files_unchanged"] = before == {
        name: files(os.path.join(model_dir, name)) for name in saved}
  observed["rolled_back"] = attempt(config(
      data_dir, model_dir, **diverging(on_nonfinite="rollback",
                                       rollback_lr_factor=1e-5)))
  if chief:
    observed["records"] = metrics(model_dir)
    observed["saved_lr_factor"] = checkpoint_value(model_dir, "lr_factor")

  # 4-5: a file system that fills up; a model_dir that turns read-only.
  if os.geteuid() == 0:
    tiny = os.path.join(out_dir, "tiny")
    on_chief(lambda: mount_tmpfs(tiny, TMPFS_MEGABYTES), name="mount")
    try:
      full_dir = os.path.join(tiny, "run")
      observed["disk_first_epoch"] = attempt(config(data_dir, full_dir))
      before = files(full_dir) if chief else {}
      observed["disk_full"] = attempt(config(data_dir, full_dir, epochs=2))
      if chief:
        after = files(full_dir)
        observed["disk_full_checkpoints_unchanged"] = all(
            after.get(name) == digest for name, digest in before.items()
            if name.startswith("checkpoints"))
        observed["disk_full_new_files"] = [
            name for name in after if name not in before
            and not name.startswith("tensorboard")]
      on_chief(lambda: remount(tiny, f"size={8 * TMPFS_MEGABYTES}m"),
               name="enlarge")
      observed["disk_enlarged"] = attempt(config(data_dir, full_dir,
                                                 epochs=2))
      if chief:
        observed["disk_records"] = [r["epoch"] for r in metrics(full_dir)]
    finally:
      on_chief(lambda: subprocess.run(["umount", tiny], check=True),
               name="unmount")

    read_only_dir = os.path.join(out_dir, "read_only")
    thread = after_first_checkpoint(read_only_dir,
                                    lambda: make_read_only(read_only_dir))
    try:
      observed["read_only"] = attempt(config(data_dir, read_only_dir,
                                             epochs=3))
    finally:
      if chief:
        thread.join(timeout=60)
      on_chief(lambda: subprocess.run(["umount", read_only_dir],
                                      check=True), name="unbind")

  # 6: model_dir removed mid-run.
  removed_dir = os.path.join(out_dir, "removed")

  def remove():
    for _ in range(10):  # files may be appearing while it goes
      shutil.rmtree(removed_dir, ignore_errors=True)
      if not os.path.exists(removed_dir):
        return
  thread = after_first_checkpoint(removed_dir, remove)
  observed["removed"] = attempt(config(data_dir, removed_dir, epochs=3))
  if chief:
    thread.join(timeout=60)

  with open(os.path.join(out_dir, f"rank{hvd.rank()}.json"), "w") as f:
    json.dump(observed, f)


if __name__ == "__main__":
  main(*sys.argv[1:])
