"""Flags: checkpoints, and resuming from them."""
from absl import flags

from engine.records import checkpoint

flags.DEFINE_enum("resume", "auto", checkpoint.RESUME_MODES,
                  "auto: a model_dir holding checkpoints continues from the "
                  "latest readable one. never: refuse to start in a "
                  "model_dir that holds an earlier run.",
                  case_sensitive=False)
flags.DEFINE_string("resume_from", "",
                    "Start this (new) model_dir from another run's "
                    "checkpoint: a model_dir, its checkpoints/ directory, or "
                    "a checkpoint prefix. Ignored once model_dir has "
                    "checkpoints of its own, so rerunning the same command "
                    "continues this run.")
flags.DEFINE_string("init_from", "",
                    "Start a new run from these weights, not the optimizer "
                    "or the position: a .keras file, a .weights.h5 file, or "
                    "another run's model_dir, checkpoints/ directory or "
                    "checkpoint prefix. Ignored by a run that resumes from "
                    "its model_dir's checkpoints.")
flags.DEFINE_integer("keep_checkpoints", 3,
                     "Latest checkpoints kept in model_dir/checkpoints (the "
                     "best by validation accuracy is kept apart, in best/).",
                     lower_bound=1)
flags.DEFINE_integer("checkpoint_every_steps", 0,
                     "Also save every this many steps (0: at epoch ends "
                     "only).", lower_bound=0)
