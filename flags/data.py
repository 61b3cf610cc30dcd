"""Flags: which data, where it is, how training examples are augmented."""
from absl import flags

from engine import datasets

flags.DEFINE_enum("dataset", "fashion_mnist", datasets.names(),
                  "Data set: fashion_mnist and cifar10 (their original "
                  "files, in memory), tfrecord (a directory of TFRecord "
                  "files of encoded images, streamed), synthetic (random "
                  "images, no I/O).")
flags.DEFINE_string("data_dir", "",
                    "Directory holding the data set's files. Empty: the data "
                    "set's default (fashion_mnist: "
                    "/usr/share/datasets/fashion-mnist, from Debian's "
                    "dataset-fashion-mnist).")
flags.DEFINE_bool("random_flip", True,
                  "Augment training images with random horizontal flips.")
flags.DEFINE_float("random_shift", 0.1,
                   "In-memory data sets: augment training images with random "
                   "shifts of up to this fraction of height and width (the "
                   "Horovod lab uses 0.2; CIFAR's pad-4-and-crop is 0.125); "
                   "0 disables.", lower_bound=0.0, upper_bound=0.5)
flags.DEFINE_integer("image_size", 224,
                     "tfrecord: images are cropped and resized to this square "
                     "size.", lower_bound=8)
flags.DEFINE_integer("num_classes", 1000, "tfrecord: number of classes.",
                     lower_bound=2)
flags.DEFINE_integer("label_offset", 0,
                     "tfrecord: subtracted from stored labels (1 for "
                     "ImageNet TFRecords, whose labels run 1..1000).")
flags.DEFINE_integer("train_examples", 0,
                     "tfrecord: training examples in the train-* files; "
                     "synthetic: how many to generate. 0: count the files "
                     "(tfrecord, one read at start-up) or 10000 (synthetic).",
                     lower_bound=0)
flags.DEFINE_integer("test_examples", 0,
                     "As --train_examples, for the evaluation split "
                     "(synthetic default 1000).", lower_bound=0)
flags.DEFINE_list("synthetic_image_shape", ["32", "32", "3"],
                  "synthetic: height,width,channels of the images.")
flags.DEFINE_integer("synthetic_classes", 10, "synthetic: number of classes.",
                     lower_bound=2)
