"""Flags: which data, where it is, how training examples are augmented."""
from absl import flags

from engine import datasets

flags.DEFINE_enum("dataset", "fashion_mnist", datasets.names(),
                  "Data set to train and evaluate on.")
flags.DEFINE_string("data_dir", "",
                    "Directory holding the data set's files. Empty: the data "
                    "set's default (fashion_mnist: "
                    "/usr/share/datasets/fashion-mnist, from Debian's "
                    "dataset-fashion-mnist).")
flags.DEFINE_bool("random_flip", True,
                  "Augment training images with random horizontal flips.")
flags.DEFINE_float("random_shift", 0.1,
                   "Augment training images with random shifts of up to this "
                   "fraction of height and width (the Horovod lab uses 0.2); "
                   "0 disables.", lower_bound=0.0, upper_bound=0.5)
