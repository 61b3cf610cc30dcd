"""Flags: batch, epochs, optimizer, seed and where the run writes."""
from absl import flags

from engine import optimizers

flags.DEFINE_integer("batch_size", 128,
                     "Examples per process per step. The global batch is "
                     "batch_size x the number of processes.", lower_bound=1)
flags.DEFINE_integer("epochs", 7, "Epochs to train.", lower_bound=1)
flags.DEFINE_integer("steps_per_epoch", 0,
                     "Steps per epoch, the same on every process. 0: one pass "
                     "over the training set, floor(examples / global batch).",
                     lower_bound=0)
flags.DEFINE_string("model_dir", "",
                    "Directory for the run's outputs (metrics.jsonl). Empty: "
                    "runs/<dataset>_<model>.")
flags.DEFINE_integer("seed", 0,
                     "Seed of the initial weights, the data order and the "
                     "augmentation.", lower_bound=0)
flags.DEFINE_enum("optimizer", "adam", optimizers.names(), "Optimizer.")
flags.DEFINE_float("base_lr", 0.001,
                   "Learning rate of one process. The rate applied is "
                   "base_lr x the number of processes (linear scaling, as the "
                   "global batch grows with them).", lower_bound=0.0)
flags.DEFINE_float("momentum", 0.9, "sgd: momentum.", lower_bound=0.0)
flags.DEFINE_bool("nesterov", False, "sgd: use Nesterov momentum.")
flags.DEFINE_integer("intra_op_threads", 0,
                     "CPU only: threads per process for one op's kernels. "
                     "0: the process's share of the cores "
                     "(cores / processes on the host).", lower_bound=0)
flags.DEFINE_integer("inter_op_threads", 0,
                     "CPU only: threads per process running independent ops "
                     "side by side. 0: 1.", lower_bound=0)
flags.DEFINE_bool("bind_cpus", True,
                  "CPU only: bind each process to its own slice of the "
                  "host's cores (as mpirun --bind-to core). Turn off when the "
                  "launcher already binds processes to distinct cores.")
