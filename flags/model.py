"""Flags: the model and its size. Each model uses the flags it has a use for."""
from absl import flags

import models

flags.DEFINE_enum("model", "cnn", models.names(),
                  "Model to train: cnn (small, fast, for CPUs) or wrn "
                  "(WideResNet-depth-width).")
flags.DEFINE_integer("depth", 16, "wrn: depth, 6n+4 (16 in WRN-16-10).",
                     lower_bound=10)
flags.DEFINE_integer("width", 10, "wrn: widening factor (10 in WRN-16-10).",
                     lower_bound=1)
flags.DEFINE_integer("filters", 32,
                     "cnn: filters of the first convolution (doubled in the "
                     "second).", lower_bound=1)
flags.DEFINE_float("dropout", 0.0, "Dropout rate inside the model.",
                   lower_bound=0.0, upper_bound=0.95)
flags.DEFINE_float("weight_decay", 0.0,
                   "L2 penalty on every kernel, added to the loss (so it "
                   "applies the same way under every optimizer).",
                   lower_bound=0.0)
