"""Flags: optimizer and learning rate (scaling, warmup, decay)."""
from absl import flags

from engine.compute import optimizers, schedules

flags.DEFINE_enum(
    "optimizer", "adam", optimizers.names(),
    "Optimizer. Weight decay (--weight_decay) is an L2 term in the loss for "
    "all but adamw: for sgd it is classic weight decay; for adam it is L2 "
    "regularization scaled by Adam's second moments; for novograd it is "
    "normalized per layer with the gradient; for lamb it passes through "
    "LAMB's per-layer trust ratio. adamw decays the weights itself, "
    "decoupled from the gradient (Loshchilov and Hutter), by weight_decay "
    "x the learning rate a step.",
    case_sensitive=False)
flags.DEFINE_float("base_lr", 0.001,
                   "Learning rate of one process; scaled by --lr_scaling.",
                   lower_bound=0.0)
flags.DEFINE_enum("lr_scaling", "linear", schedules.SCALINGS,
                  "How the rate grows with N processes (the global batch "
                  "grows N-fold): linear, base_lr x N; sqrt, base_lr x "
                  "sqrt(N); none.",
                  case_sensitive=False)
flags.DEFINE_float("warmup_epochs", 0.0,
                   "Epochs over which the rate rises, per step, from base_lr "
                   "to the scaled rate (Goyal et al. 2017).",
                   lower_bound=0.0)
flags.DEFINE_enum("lr_schedule", "constant", schedules.DECAYS,
                  "After warmup: constant; step (x --lr_decay_factor at each "
                  "of --lr_decay_epochs); table (x the factor of "
                  "--lr_decay_table's last epoch before this one, "
                  "MLPerf HPC CosmoFlow's); cosine or linear (to 0 at the "
                  "last step; after warmup, linear is one-cycle's shape).",
                  case_sensitive=False)
flags.DEFINE_list("lr_decay_epochs", ["15", "25", "35"],
                  "step schedule: epochs (counted from the start) at which "
                  "the rate is multiplied by --lr_decay_factor.")
flags.DEFINE_float("lr_decay_factor", 0.1, "step schedule: the multiplier.",
                   lower_bound=0.0)
flags.DEFINE_string(
    "lr_decay_table", "",
    "table schedule: EPOCH:FACTOR,... with epochs counted from 0 and "
    "increasing, e.g. CosmoFlow's 32:0.25,64:0.125: the rate is the peak x "
    "FACTOR from the epoch after EPOCH on (from epoch 33, the 34th, for "
    "32), as the reference's Keras LearningRateScheduler applies its "
    "decay_schedule; the factors replace each other, they do not "
    "compound.")
flags.DEFINE_float("label_smoothing", 0.0,
                   "Train against targets with this share of the "
                   "probability spread over all classes (0.1 is common); "
                   "reported losses stay plain cross-entropy.",
                   lower_bound=0.0, upper_bound=0.5)
flags.DEFINE_float("ema_decay", 0.0,
                   "Keep an exponential moving average of the weights with "
                   "this decay per step (0.999 is common), and evaluate, "
                   "choose the best checkpoint and export with it. 0: none.",
                   lower_bound=0.0, upper_bound=0.99999)
flags.DEFINE_float("momentum", 0.9, "sgd: momentum.", lower_bound=0.0)
flags.DEFINE_bool("nesterov", False, "sgd: use Nesterov momentum.")


def _decay_epochs_are_integers(values):
  return all(v.strip().isdigit() for v in values)


flags.register_validator("lr_decay_epochs", _decay_epochs_are_integers,
                         "must be a comma-separated list of epoch numbers, "
                         "e.g. 15,25,35")


def decay_table(text: str) -> tuple:
  """--lr_decay_table as ((epoch, factor), ...), or a UserError naming it
  (engine.compute.schedules.decay_table)."""
  return schedules.decay_table(text)
