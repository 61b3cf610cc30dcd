"""A task's metrics kept as sums, reduced exactly across ranks.

Each rank accumulates, inside the compiled step, the sums its task declares
(engine/tasks: a loss sum, correct predictions, a confusion matrix, squared
errors) and the number of examples, in one float64 vector. Only when a
figure is read are the sums added across ranks, once, and the task turns
them into its figures. Means of per-rank means would be wrong whenever
ranks hold different numbers of examples (the last eval batch, uneven
shards), and a per-step allreduce of metrics would cost a collective on
every step for figures read once an epoch.
"""
import dataclasses

import numpy as np
import tensorflow as tf

from engine import distributed
from engine import tasks as tasks_lib


@dataclasses.dataclass(frozen=True)
class Result:
  """A task's figures over some examples; `result.loss`, `result.accuracy`
  read the figures by name. `sums` are what they were computed from."""
  figures: dict
  examples: int
  sums: dict = dataclasses.field(default_factory=dict, compare=False,
                                 repr=False)

  def __getattr__(self, name: str) -> float:
    figures = self.__dict__.get("figures", {})
    if name in figures:
      return figures[name]
    raise AttributeError(f"no figure {name!r} (the task's figures are "
                         f"{', '.join(figures)})")


class Totals:
  """This rank's running sums of a task's metrics, in one flat vector (one
  allreduce reads them all); `result()` gives the figures over all ranks."""

  def __init__(self, name: str, task):
    self._name = name
    self._task = task
    self._shapes = {**{key: tuple(shape) for key, shape in
                       task.sums().items()}, tasks_lib.EXAMPLES: ()}
    self._sizes = [int(np.prod(shape)) for shape in self._shapes.values()]
    self._sums = tf.Variable(tf.zeros([sum(self._sizes)], tf.float64),
                             trainable=False, name=name)

  def update(self, labels: tf.Tensor, outputs: tf.Tensor,
             loss: tf.Tensor) -> None:
    """Adds one batch; meant to run inside the step's tf.function."""
    self.add(self._task.batch_sums(labels, outputs, loss),
             tf.shape(outputs)[0])

  def add(self, batch_sums: dict, examples: tf.Tensor) -> None:
    """Adds one batch's sums (as the task's batch_sums gives them) of
    `examples` examples; inside the step's tf.function."""
    sums = {**batch_sums, tasks_lib.EXAMPLES: examples}
    self._sums.assign_add(tf.concat(
        [tf.reshape(tf.cast(sums[key], tf.float64), [-1])
         for key in self._shapes], axis=0))

  def reset(self) -> None:
    self._sums.assign(tf.zeros_like(self._sums))

  def local_sums(self) -> np.ndarray:
    """This rank's flat sums; no collective."""
    return self._sums.numpy()

  def sums(self) -> np.ndarray:
    """The flat sums over every rank. A collective: call on all ranks."""
    return distributed.sum_across_ranks(self._sums.numpy(), name=self._name)

  def result(self) -> Result:
    """The figures over every rank's examples. A collective, as `sums`."""
    return self.result_of(self.sums())

  def result_of(self, flat: np.ndarray) -> Result:
    """The figures of flat sums (from `sums`, or added up from several)."""
    sums = self._unflattened(np.broadcast_to(flat, self._sums.shape))
    return Result(figures=self._task.figures(sums),
                  examples=int(sums[tasks_lib.EXAMPLES]), sums=sums)

  def _unflattened(self, flat: np.ndarray) -> dict[str, np.ndarray]:
    pieces = np.split(flat, np.cumsum(self._sizes)[:-1])
    return {key: piece.reshape(shape) for (key, shape), piece in
            zip(self._shapes.items(), pieces)}


class StepWindow:
  """One rank's figures over the steps since it was last read, within an
  epoch: differences of the epoch's running sums (Totals) and step seconds
  (profiling.EpochTimes). For summaries within an epoch at no cost to the
  step: no collective, and the sums are read after a step whose result
  the host has read already."""

  def __init__(self, totals: Totals):
    self._totals = totals
    self.start_epoch(0)

  def start_epoch(self, first_step: int) -> None:
    self._sums, self._step_seconds, self._step = 0.0, 0.0, first_step

  def read(self, step: int, sums: np.ndarray, step_seconds: float) -> dict:
    """The task's figures and seconds per step over steps after the last
    read up to `step` (of the epoch), given the running figures at
    `step`."""
    steps = step - self._step
    figures = dict(self._totals.result_of(sums - self._sums).figures,
                   step_seconds=(step_seconds - self._step_seconds)
                   / max(steps, 1))
    self._sums, self._step_seconds, self._step = sums, step_seconds, step
    return figures
