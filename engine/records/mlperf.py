"""The MLPerf HPC log (--mlperf_log): a run as MLPerf's rules log it.

MLPerf HPC times a run from `run_start` to `run_stop` and checks its log
with the compliance checker of the `mlperf-logging` package
(`python -m mlperf_logging.compliance_checker --usage hpc --ruleset 3.0.0
FILE`). This module is the whole mapping from the engine's run to that
log, written through the package's own logger (`mllog`), never by hand:

* at the start, when rank 0 opens model_dir: `init_start` at the time the
  run began building (Horovod, data, model), the submission's keys, the
  hyperparameters the rules ask of CosmoFlow, `staging_start`/`stop` where
  --stage_dir staged the data, then `init_stop` and `run_start`;
* each epoch, from its metrics.jsonl record: `epoch_start`, `eval_start`,
  `eval_stop`, `eval_error` (the deciding validation figure: CosmoFlow's
  is the regression task's val_mae), `epoch_stop`, all with `epoch_num`
  (the engine's epoch, from 1) and the times the record gives;
* at the end: `run_stop`, status `success` when --target was reached and
  `aborted` otherwise (a run without --target, one stopped by a signal,
  diverged or failed), with the target and when it was first reached.

Only rank 0 writes it (RunDirectory holds it). Each run is one log in
MLPerf's eyes: a resumed run appends its own start to the file, after a
`resumed` line, and such a file is no valid submission (the checker asks
for exactly one run_start).
"""
import logging as python_logging
import os
import socket
from typing import Optional

from mlperf_logging import mllog
from mlperf_logging.mllog import constants

from engine import datasets
from engine import distributed
from engine import tasks
from engine.compute import schedules
from engine.core.config import TrainConfig
from engine.core.errors import UserError
from engine.records import storage

# The HPC rules' keys that mllog.constants (mlperf-logging 4.1.68) lacks,
# as the checker's hpc_3.0.0 rules name them.
EVAL_ERROR = "eval_error"
NUMBER_OF_NODES = "number_of_nodes"
ACCELERATORS_PER_NODE = "accelerators_per_node"
GRADIENT_ACCUMULATION_FREQUENCY = "gradient_accumulation_frequency"
DROPOUT = "dropout"
# The engine's own: a start that continued a run (checkpoints in model_dir).
RESUMED = "resumed"
# The logger the package's shared MLLogger writes through: the log file's
# alone (the package's default also prints every line to stdout).
LOGGER_NAME = "engine.mlperf"
_REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


class MLPerfLog:
  """The run's MLPerf HPC log. Built on every rank alike (what it logs is
  every rank's); only rank 0's RunDirectory starts it, so rank 0 alone
  writes. `MLPerfLog.requested` gives one that writes nothing without
  --mlperf_log."""

  def __init__(self, config: TrainConfig, *, began: float,
               world: distributed.World, info: datasets.DatasetInfo,
               staged: Optional[dict], decider: tasks.Decider):
    """`began`: time.time() when the run began building (init_start);
    `staged`: --stage_dir's record (its end time and seconds); `decider`:
    the validation figure eval_error and the target are of."""
    self.path = config.mlperf.log
    self._config = config
    self._began = began
    self._world = world
    self._info = info
    self._staged = staged
    self._decider = decider
    self._logger = None
    self._stopped = False
    self._last_ms = 0  # the last epoch's end

  @classmethod
  def requested(cls, config: TrainConfig, **facts) -> "MLPerfLog":
    """The log --mlperf_log asks for, or one that writes nothing."""
    return cls(config, **facts) if config.mlperf.log else _NoLog()

  def start(self, resumed_at: Optional[str] = None) -> None:
    """Opens the file (appending) and logs the run's start, up to
    run_start; `resumed_at` ("epoch 3, step 0"): this start continues a
    run. An unwritable file is a UserError (exit 2)."""
    self._open()
    mlperf = self._config.mlperf
    with self._writing():
      self._logger.start(constants.INIT_START, time_ms=_ms(self._began))
      if resumed_at:
        self._event(RESUMED, resumed_at, metadata={
            "note": "a resumed run is not a valid MLPerf submission"})
      if self._staged:  # inside init, as it happened (--stage_dir)
        ended = self._staged["time"]
        self._logger.start(constants.STAGING_START,
                           time_ms=_ms(ended - self._staged["seconds"]))
        self._logger.end(constants.STAGING_STOP, time_ms=_ms(ended),
                         metadata={"staged_files": self._staged["files"],
                                   "staged_bytes": self._staged["bytes"]})
      self._event(constants.CACHE_CLEAR, mlperf.cache_clear)
      for key, value in (
          (constants.SUBMISSION_BENCHMARK, mlperf.benchmark),
          (constants.SUBMISSION_ORG, mlperf.org),
          (constants.SUBMISSION_DIVISION, mlperf.division),
          (constants.SUBMISSION_STATUS, mlperf.status),
          (constants.SUBMISSION_PLATFORM,
           mlperf.platform or socket.gethostname()),
          *self.hyperparameters().items()):
        self._event(key, value)
      self._logger.end(constants.INIT_STOP)
      self._logger.start(constants.RUN_START)

  def hyperparameters(self) -> dict:
    """What MLPerf HPC's rules ask a CosmoFlow run to log (its closed
    division's checks), from the flags and the processes."""
    optimization = self._config.optimization
    model, training = self._config.model.params, self._config.training
    micro_batches = self._config.performance.grad_accum_steps
    boundaries, factor = _decay(optimization)
    hosts, per_host = distributed.hosts()
    peak_lr = schedules.scaled_rate(optimization.base_lr, self._world.size,
                                    optimization.lr_scaling)
    return {
        # The train loop's (the processes stay: no --elastic).
        constants.GLOBAL_BATCH_SIZE:
            training.batch_size * micro_batches * self._world.size,
        GRADIENT_ACCUMULATION_FREQUENCY: micro_batches,
        constants.SEED: training.seed,
        constants.TRAIN_SAMPLES: self._info.num_train,
        constants.EVAL_SAMPLES: self._info.num_test,
        NUMBER_OF_NODES: hosts,
        # One device a process; CPU processes use no accelerator.
        ACCELERATORS_PER_NODE: per_host if self._world.device == "GPU" else 0,
        constants.OPT_NAME: optimization.optimizer,
        # Warmup rises from --base_lr to it times the factor (the rate
        # --lr_scaling gives these processes); then the decay (_decay).
        constants.OPT_BASE_LR: optimization.base_lr,
        constants.OPT_LR_WARMUP_EPOCHS: optimization.warmup_epochs,
        constants.OPT_LR_WARMUP_FACTOR: (peak_lr / optimization.base_lr
                                         if optimization.base_lr else 1.0),
        constants.OPT_LR_DECAY_SCHEDULE: optimization.lr_schedule,
        constants.OPT_LR_DECAY_BOUNDARY_EPOCHS: boundaries,
        constants.OPT_LR_DECAY_FACTOR: factor,
        DROPOUT: model.get("dropout", 0.0),
        constants.OPT_WEIGHT_DECAY: model.get("weight_decay", 0.0),
    }

  def epoch(self, record: dict) -> None:
    """An epoch's lines, at the times its metrics.jsonl `record` gives:
    it ended at `time`, began `epoch_seconds` before, and was evaluated in
    its last `eval_seconds` (None: not evaluated)."""
    number = {constants.EPOCH_NUM: record["epoch"]}
    ended, eval_seconds = record["time"], record["eval_seconds"]
    # Not before the last epoch's end, which the record's rounding may put
    # a millisecond after its start.
    began = max(_ms(ended - record["epoch_seconds"]), self._last_ms)
    self._last_ms = _ms(ended)
    with self._writing():
      self._logger.start(constants.EPOCH_START, metadata=number,
                         time_ms=began)
      if eval_seconds is not None:
        self._logger.start(constants.EVAL_START, metadata=number,
                           time_ms=_ms(ended - eval_seconds))
        self._logger.end(constants.EVAL_STOP, metadata=number,
                         time_ms=_ms(ended))
        self._event(EVAL_ERROR, record[self._decider.key], metadata=number,
                    time_ms=_ms(ended))
      self._logger.end(constants.EPOCH_STOP, metadata=number,
                       time_ms=_ms(ended))

  def stop(self, *, target: float, first_reached_epoch: Optional[int],
           reason: str = "") -> None:
    """run_stop, once: `success` when the target was reached (at
    `first_reached_epoch`), else `aborted` (`reason`: why the run ended
    before its end)."""
    if self._stopped or self._logger is None:
      return
    self._stopped = True
    reached = bool(target) and first_reached_epoch is not None
    metadata = {
        constants.STATUS: constants.SUCCESS if reached else constants.ABORTED,
        "target": target or None,
        "target_metric": str(self._decider),
        "target_reached": reached,
        "first_reached_epoch": first_reached_epoch}
    if reason:
      metadata["reason"] = reason
    with self._writing():
      self._logger.end(constants.RUN_STOP, metadata=metadata)

  def close(self) -> None:
    """Closes the file; the package's logger writes nowhere after it."""
    if self._logger is None:
      return
    logger = python_logging.getLogger(LOGGER_NAME)
    for handler in list(logger.handlers):
      logger.removeHandler(handler)
      handler.close()
    self._logger = None

  def _open(self) -> None:
    logger = python_logging.getLogger(LOGGER_NAME)
    logger.propagate = False
    logger.setLevel(python_logging.INFO)
    for handler in list(logger.handlers):  # an earlier run's, in-process
      logger.removeHandler(handler)
      handler.close()
    try:
      logger.addHandler(_FileHandler(self.path))
    except OSError as e:
      raise UserError(f"--mlperf_log={self.path}: cannot write it "
                      f"({e.strerror}); pass a file in a writable "
                      "directory") from None
    # The lines name their source file from the repository's root.
    mllog.config(logger=logger, root_dir=_REPOSITORY)
    self._logger = mllog.get_mllogger()

  def _event(self, key, value, **kwargs) -> None:
    self._logger.event(key, value, **kwargs)

  def _writing(self):
    return storage.writing("the MLPerf log", self.path)


class _NoLog:
  """No --mlperf_log: nothing is written."""

  def start(self, resumed_at: Optional[str] = None) -> None:
    pass

  def epoch(self, record: dict) -> None:
    pass

  def stop(self, **unused) -> None:
    pass

  def close(self) -> None:
    pass


class _FileHandler(python_logging.FileHandler):
  """logging's file handler (appending), whose failed writes raise, to
  become one line (storage.writing): logging's own print a traceback and
  go on."""

  def __init__(self, path: str):
    super().__init__(os.path.abspath(path), mode="a")

  def handleError(self, record):
    raise  # pylint: disable=misplaced-bare-raise  (emit's, being handled)


def _decay(optimization) -> tuple[list, object]:
  """The decay's boundaries and factor as MLPerf names them: --lr_schedule=
  step's epochs and factor (which compounds at each); table's epochs and
  their factors of the peak, as the CosmoFlow reference's decay_schedule
  gives them (epochs from 0, each applying from the next); none and 1 for
  a schedule without boundaries."""
  if optimization.lr_schedule == "step":
    return list(optimization.lr_decay_epochs), optimization.lr_decay_factor
  if optimization.lr_schedule == "table":
    return ([epoch for epoch, _ in optimization.lr_decay_table],
            [factor for _, factor in optimization.lr_decay_table])
  return [], 1.0


def _ms(seconds: float) -> int:
  return int(round(seconds * 1000))
