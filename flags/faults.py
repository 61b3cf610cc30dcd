"""Flags: what a divergence does (docs/checkpoints-and-faults.md)."""
from absl import flags

NONFINITE_ACTIONS = ("stop", "rollback")

flags.DEFINE_enum("on_nonfinite", "stop", NONFINITE_ACTIONS,
                  "When a step's loss or gradients are not finite (NaN, "
                  "inf) on any process; the step is never applied. stop: "
                  "end the run with exit code 3, saving nothing after the "
                  "last good checkpoint. rollback: go back to the last good "
                  "checkpoint with the learning rate times "
                  "--rollback_lr_factor, at most --max_rollbacks times.",
                  case_sensitive=False)
flags.DEFINE_float("rollback_lr_factor", 0.5,
                   "Multiplies the learning rate at each rollback; kept in "
                   "checkpoints, so a resumed run keeps the lowered rate.",
                   lower_bound=0.0, upper_bound=1.0)
flags.DEFINE_integer("max_rollbacks", 3,
                     "Rollbacks allowed in one start of the command; the "
                     "next divergence stops the run.", lower_bound=0)
