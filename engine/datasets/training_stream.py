"""A rank's training batches as a run's flags ask for them, set up once for
the train loop's start (engine/loop/session.py), `auto`'s measurement
(engine/compute/auto.py) and the learning-rate range test
(engine/find_lr.py).

The batch sizes are computed here, once, where the number of processes is
known: each process's step takes --grad_accum_steps micro-batches of
--batch_size, the global batch is that on every process, and an epoch is
--steps_per_epoch steps, or as many global batches as the data holds.
"""
import dataclasses

import tensorflow as tf

from engine.core.config import TrainConfig
from engine.datasets.sources import steps_per_epoch, train_stream
from engine.datasets.splits import Augmentation, Epochs, Shard, Splits


@dataclasses.dataclass(frozen=True)
class TrainingStream:
  """This rank's shard of the training split, in epochs of per-process
  batches, augmented as the flags (and the task's targets) allow."""
  splits: Splits
  shard: Shard
  epochs: Epochs
  augmentation: Augmentation
  micro_batches: int

  @classmethod
  def of(cls, config: TrainConfig, splits: Splits, *, rank: int,
         world_size: int, task=None, resizing: bool = True,
         steps: int = 0) -> "TrainingStream":
    """The run's stream on rank `rank` of `world_size`, for `task`'s
    targets (none: as the flags say). A measurement's takes `steps` steps
    an epoch at the images' own size (`resizing` off)."""
    training = config.training
    micro_batches = config.performance.grad_accum_steps
    step_batch = training.batch_size * micro_batches
    steps = steps or steps_per_epoch(
        num_train=splits.info.num_train, batch_size=step_batch,
        world_size=world_size, requested=training.steps_per_epoch)
    return cls(splits=splits, shard=Shard(rank, world_size),
               epochs=Epochs(batch_size=step_batch, steps=steps,
                             seed=training.seed),
               augmentation=Augmentation.requested(config.data, task,
                                                   resizing=resizing),
               micro_batches=micro_batches)

  @property
  def steps_per_epoch(self) -> int:
    return self.epochs.steps

  @property
  def global_batch(self) -> int:
    """The examples of one step on every process together."""
    return self.epochs.batch_size * self.shard.world_size

  def batches(self, first_epoch: int = 0,
              first_step: int = 0) -> tf.data.Dataset:
    """The stream from step `first_step` of epoch `first_epoch` on: the very
    batches an uninterrupted run has there."""
    return train_stream(self.splits.train, self.splits.info,
                        shard=self.shard, epochs=self.epochs,
                        augmentation=self.augmentation,
                        first_epoch=first_epoch, first_step=first_step)
