"""What the train loop is built from: engine.build.training_parts builds
them, engine/loop/loop.py's TrainLoop runs them."""
import dataclasses
from typing import Any, Optional

import keras

from engine import datasets
from engine import distributed
from engine import tasks
from engine.compute import communication
from engine.compute import ema
from engine.compute import eval_step as eval_steps
from engine.compute import precision
from engine.compute import schedules
from engine.compute import step as steps
from engine.core.config import TrainConfig
from engine.records import mlperf


@dataclasses.dataclass(frozen=True)
class TrainingParts:
  """What the loop is built from (engine.build.training_parts), in the
  order it is built."""
  config: TrainConfig  # as given
  world: distributed.World
  precision: precision.Choice  # what --mixed_precision decided at start-up
  # What --gradient_compression decided at start-up.
  communication: communication.Choice
  splits: datasets.Splits
  staged: Optional[dict]  # --stage_dir's record, for metrics.jsonl
  cpu_kernels: Optional[dict]  # which ran on each rank, for metrics.jsonl
  task: tasks.Task
  model: keras.Model
  learning_rate: schedules.WarmupThenDecay
  weight_average: Optional[ema.WeightAverage]
  optimizer: Any
  train_step: steps.TrainStep
  eval_step: eval_steps.EvalStep
  decider: tasks.Decider
  mlperf: mlperf.MLPerfLog  # --mlperf_log's, which rank 0 writes
  # A fit script's Keras callbacks (engine.fit), run on every start.
  callbacks: tuple = ()
