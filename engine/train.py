r"""Data-parallel training with Horovod: the engine's command.

Launch one process per device:

  horovodrun --gloo -np 2 .venv/bin/python -m engine.train --flagfile=flags/X.cfg

Read `train()` to follow a run: its parts built (build.py: distributed
setup, input pipeline, model, optimizer, steps), then the loop
(loop/loop.py), which a change of workers under --elastic starts again
from the last commit. Beside it: the flags as values (config.py), the
command line and its one-line errors (cli.py); the packages are the
architecture (docs/architecture.md).
"""
import dataclasses
import functools
from typing import Optional, Sequence

from absl import app
import keras

from engine import build
from engine import cli
from engine import distributed
from engine.compute import ema
from engine.compute import eval_step as eval_steps
from engine.compute import step as steps
from engine.core.config import TrainConfig
from engine.core.errors import UserError
from engine.distributed import elastic
from engine.given import Given
from engine.loop import actions
from engine.loop.loop import TrainLoop


@dataclasses.dataclass
class TrainResult:
  model: keras.Model
  history: list[dict]    # the epochs' metrics.jsonl records, on every rank
  train_step: steps.TrainStep
  eval_step: eval_steps.EvalStep
  # --ema_decay's average of the weights, which evaluation used; else None.
  weight_average: Optional[ema.WeightAverage] = None


def train(config: TrainConfig,
          user_actions: Sequence[actions.Action] = (),
          given: Optional[Given] = None) -> TrainResult:
  """Trains as `config` says; `user_actions` run beside the engine's
  cadences (engine/loop/actions.py); `given`: a fit script's model, data
  and callbacks (engine.fit), in place of the flags'."""
  for action in user_actions:
    if not isinstance(action, actions.Action):
      raise UserError(f"run(actions=...): {action!r} is not an action; make "
                      "one with engine.loop.actions.Every(steps, function)")
  elastic.check_launch(config.faults.elastic)
  # Distributed setup, input pipeline, model, optimizer and steps
  # (build.training_parts says in which order, and why).
  parts = build.training_parts(config, given)
  # The train loop, from the checkpoint in model_dir if there is one. Under
  # --elastic, Horovod runs it again after each change of workers, from the
  # state last committed.
  loop = TrainLoop(parts, user_actions=user_actions)
  state = elastic.TrainingState(loop.variables, run_state=None)
  try:
    history = (elastic.restarting(loop)(state)
               if parts.config.faults.elastic else loop(state))
    # Whoever is rank 0 at the end ends the MLPerf log and exports; every
    # rank learns if it failed.
    distributed.on_chief(loop.directory.finish if distributed.is_chief()
                         else None, name="export")
  except BaseException as e:
    if loop.directory:  # rank 0's (Horovod may be shut down: no hvd.rank())
      loop.directory.record_end(e)  # for engine.runs: how the run stopped
    raise
  return TrainResult(model=parts.model, history=history,
                     train_step=parts.train_step, eval_step=parts.eval_step,
                     weight_average=parts.weight_average)


def run(*, model=None, dataset=None, actions=(),  # pylint: disable=redefined-outer-name
        **flag_values) -> TrainResult:
  """Trains from a Python script, launched as `horovodrun --gloo -np N python
  SCRIPT.py`: `model` and `dataset` are functions or names, `actions` the
  script's own (engine/loop/actions.py: `Every(steps, function)`), any other
  keyword a flag's default (engine.cli.run says how)."""
  return cli.run(functools.partial(train, user_actions=actions),
                 model=model, dataset=dataset, **flag_values)


def main(argv):
  # `train` is looked up when called: a test may wrap it.
  cli.train_or_exit(train, argv)


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
