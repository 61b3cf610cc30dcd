"""Run by tests/test_steps_per_call.py under `horovodrun -np 2`:
--steps_per_call=K, several steps in one call of the compiled step, against
one step a call. Each rank writes OUT/rank<r>.json.

1. The same run (deterministic, 10 steps an epoch, a checkpoint every 3
   steps and a summary every 5) at K = 1 and K = 4: weights, records,
   checkpoints, summaries, the calls' sizes.
2. At K = 4, a stop asked for on rank 1 alone after 6 steps (as a signal
   to one rank would), then the same command again: where it stopped,
   and the resumed run's weights and records.
3. A run whose learning rate makes its 4th step non-finite, at K = 1 and
   K = 4 (the third step of a call of four): the error each raises.
4. A task with a train step of its own (the DCGAN of examples/), at K = 1
   and K = 4.
5. --progressive_resizing (images of 12, then 20, then 28 pixels, an
   epoch each) with a BatchNorm model (the 94% recipe's ResNet-9: a
   whitened stem fitted to the data, pooling first) at K = 1 and K = 4,
   straight through, and stopped on rank 1 in the second epoch and
   resumed: calls whose images change size between epochs.
"""
import json
import os
import signal
import sys

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from engine import train as engine_train
from engine.compute import step as steps
from engine.core import errors
from engine.loop import preemption
from engine.loop import run_directory
from engine.records import report
from tests import fixtures

# What the wrapped parts saw during the current run.
seen = {"calls": [], "saves": [], "summaries": [], "steps_run": 0,
        "stop_after": None}


BEFORE = object()  # what `note` is given before the call


def watched(cls, name, note):
  """`cls.name`, noting each call's arguments in `seen` before it runs,
  and its result after (unless it raised)."""
  original = getattr(cls, name)

  def wrapper(self, *args, **options):
    note(BEFORE, *args)
    result = original(self, *args, **options)
    note(result, *args)
    return result

  setattr(cls, name, wrapper)


def note_call(result, count, stop_requested=False):
  del stop_requested
  if result is BEFORE:
    seen["calls"].append(count)
  else:
    seen["steps_run"] += result.steps


def note_step(note, argument):
  """Notes the global step, the call's `argument`-th argument."""
  return lambda result, *args: (result is BEFORE
                                and note.append(args[argument]))


watched(steps.TrainStep, "train", note_call)
watched(run_directory.RunDirectory, "save", note_step(seen["saves"], 1))
watched(report.Reporter, "steps", note_step(seen["summaries"], 0))
# A stop asked for on rank 1 alone, once `stop_after` steps have run (in
# calls of several steps or one).
# (The signal's record: what its handler would set is not kept.)
preemption.StopRequests.signum = property(
    lambda self: signal.SIGTERM if (
        hvd.rank() == 1 and seen["stop_after"] is not None
        and seen["steps_run"] >= seen["stop_after"]) else 0,
    lambda self, signum: None)


def weights(model) -> np.ndarray:
  return np.concatenate([v.numpy().ravel() for v in model.variables])


def trained(config, stop_after=None) -> dict:
  """`config`'s run: what this rank holds and saw, or how it stopped."""
  for notes in ("calls", "saves", "summaries"):
    seen[notes].clear()
  seen.update(steps_run=0, stop_after=stop_after)
  try:
    result = engine_train.train(config)
  except (preemption.Preempted, errors.Diverged) as e:
    return {"stopped": str(e), "calls": list(seen["calls"]),
            "steps_run": seen["steps_run"]}
  flat = weights(result.model)
  everyone = hvd.allgather(tf.constant(flat[None]),
                           name=os.path.basename(
                               config.training.model_dir)).numpy()
  return {"weights": flat.tolist(),
          "max_weight_difference_across_ranks":
              float(np.abs(everyone - everyone[0]).max()),
          "history": result.history, "traces": result.train_step.traces,
          "calls": list(seen["calls"]), "saves": list(seen["saves"]),
          "summaries": list(seen["summaries"])}


def main(out_dir: str, data_dir: str) -> None:
  config = fixtures.train_config(
      data=dict(dir=data_dir),
      model=dict(name="cnn", params={
          **fixtures.train_config().model.params, "filters": 4}),
      training=dict(batch_size=8, epochs=2, steps_per_epoch=10,
                    summary_every_steps=5, progress="none"),
      devices=dict(deterministic=True),
      checkpoints=dict(checkpoint_every_steps=3))
  def at(k, name, base=config, training=(), **changes):
    """`base` at --steps_per_call=k in OUT/name, with `changes` by
    section."""
    return base.replace(
        performance=dict(steps_per_call=k),
        training=dict(training, model_dir=os.path.join(out_dir, name)),
        **changes)

  observed = {"k1": trained(at(1, "k1")), "k4": trained(at(4, "k4")),
              "k4_stopped": trained(at(4, "k4_resumed"), stop_after=6)}
  observed["k4_resumed"] = trained(at(4, "k4_resumed"))
  for k in (1, 4):
    observed[f"diverged_k{k}"] = trained(at(
        k, f"diverged_k{k}",
        optimization=dict(optimizer="sgd", base_lr=200.0, warmup_epochs=0.0,
                          lr_schedule="constant"),
        checkpoints=dict(checkpoint_every_steps=0),
        training=dict(summary_every_steps=0)))
  for k in (1, 4):
    observed[f"gan_k{k}"] = trained(at(
        k, f"gan_k{k}", task=dict(name="tests/workers/tiny_gan.py:TinyDCGAN")))
  resized = config.replace(
      model=dict(name="resnet9",
                 params={**config.model.params, "stem": "whitened",
                         "pool_first": True}),
      training=dict(epochs=3),
      data=dict(progressive_resizing=((12, 1), (20, 2))))
  for k in (1, 4):
    observed[f"resized_k{k}"] = trained(at(k, f"resized_k{k}", resized))
    resumed = at(k, f"resized_k{k}_resumed", resized)
    observed[f"resized_k{k}_stopped"] = trained(resumed, stop_after=12)
    observed[f"resized_k{k}_resumed"] = trained(resumed)
  with open(os.path.join(out_dir, f"rank{hvd.rank()}.json"), "w") as f:
    json.dump(observed, f)


if __name__ == "__main__":
  main(*sys.argv[1:])
