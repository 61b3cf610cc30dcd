"""The engine's command-line flags, one module per concern.

Importing this package defines them all. `--helpfull` lists them grouped by
these modules: flags.data, flags.model, flags.task, flags.optimization, flags.training,
flags.checkpoints, flags.faults, flags.elastic, flags.devices,
flags.performance, flags.profiling, flags.mlperf, flags.trial. Their defaults are the CPU preset
(flags/fashion_mnist_cpu.cfg): with no flags at all, the engine trains a
small CNN on Fashion-MNIST to over 90% test accuracy in minutes.
"""
from absl import flags as absl_flags

from flags import (checkpoints, data, devices, elastic, faults, mlperf,
                   model, optimization, performance, profiling, task, trial,
                   training)

MODULES = (data, model, task, optimization, training, checkpoints, faults,
           elastic, devices, performance, profiling, mlperf, trial)


def as_flagfile() -> str:
  """The engine's flags with their current values, as a flagfile's lines.

  Only the engine's own flags: absl's logging and debugging flags are not
  part of what a run is; nor the augmentation flags not given, whose
  defaults the task decides (data.TASK_DEFAULTS).
  """
  values = absl_flags.FLAGS
  lines = [flag.serialize()
           for module in MODULES
           for flag in values.get_flags_for_module(module.__name__)
           if flag.present or flag.name not in data.TASK_DEFAULTS]
  return "\n".join(lines) + "\n"
