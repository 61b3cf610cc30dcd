"""Flags: which data, where it is, how training examples are augmented."""
from absl import flags

from engine import datasets

flags.DEFINE_string(
    "dataset", "fashion_mnist",
    "Data set: fashion_mnist and cifar10 (their original files, in memory), "
    "image_folder (DIR/train/<class>/ and DIR/validation/<class>/ of JPEG, "
    "PNG, BMP or GIF images, streamed), arrays (an .npz, .h5 or directory of "
    ".npy files with x_train, y_train, x_test, y_test, read by rows), "
    "tfrecord (a directory of TFRecord files of encoded images, streamed), "
    "synthetic (random images, no I/O), or your own loader as "
    "package.module:function or path/to/file.py:function returning "
    "engine.datasets.Splits (docs/your-data.md).")
flags.register_validator(
    "dataset", datasets.is_known,
    f"value should be one of {', '.join(datasets.names())}, or "
    "package.module:function or path/to/file.py:function")
flags.DEFINE_string("data_dir", "",
                    "Directory holding the data set's files. Empty: the data "
                    "set's default (fashion_mnist: "
                    "/usr/share/datasets/fashion-mnist, from Debian's "
                    "dataset-fashion-mnist).")
# The augmentation flags whose defaults apply only to a task whose targets
# they keep (Task.augmentation_keeps_targets). flags.txt records them only
# when given (as_flagfile), so a run started again from it decides as the
# run did.
TASK_DEFAULTS = ("random_flip", "random_shift", "random_transpose")
flags.DEFINE_bool("random_flip", True,
                  "Augment training images with random horizontal flips "
                  "(volumes: along each axis). On by default for tasks whose "
                  "targets a flip keeps (classification, segmentation, "
                  "reconstruction, regression of volumes; "
                  "Task.augmentation_keeps_targets); off for others, "
                  "unless given, with a warning.")
flags.DEFINE_bool("eval_flip", False,
                  "Evaluate each test image and its mirror image, and "
                  "predict the mean of their probabilities (test-time "
                  "augmentation, twice the evaluation's cost), as "
                  "engine.evaluate does for the run. The export is the "
                  "model alone.")
flags.DEFINE_float("eval_shift", 0.0,
                   "Also evaluate each test image (and its mirror, with "
                   "--eval_flip) moved left and right by this fraction of "
                   "its width, rounded to whole pixels (0.04 of 28 pixels: "
                   "1), and predict the mean probabilities of all the views "
                   "(three times the evaluation's cost): for models trained "
                   "with --random_shift, which takes the same unit. 0 "
                   "disables.", lower_bound=0.0, upper_bound=0.5)
flags.DEFINE_float("random_shift", 0.1,
                   "Augment training images (not volumes) with random "
                   "shifts of up to this fraction of height and width (the "
                   "Horovod lab uses 0.2; CIFAR's pad-4-and-crop is 0.125); "
                   "0 disables. The default applies as --random_flip's "
                   "does: to tasks whose targets a shift keeps.",
                   lower_bound=0.0, upper_bound=0.5)
flags.DEFINE_list(
    "progressive_resizing", [],
    "Train the first epochs on smaller images, as SIDE:EPOCHS stages: "
    "20:6 trains epochs 1-6 on images resized to 20x20 pixels and the rest "
    "at full size; 16:3,20:6 trains 1-3 at 16, 4-6 at 20. A smaller epoch "
    "costs about (SIDE / full side) squared of a full one; evaluation is "
    "always at full size. For square images and models that take any size "
    "(resnet9, wrn, resnet50, resnet_small; a model of your own that builds "
    "keras.Input((None, None, channels)) and pools globally). Empty: "
    "every epoch at full size.")


def resizing_stages(values) -> tuple:
  """--progressive_resizing's SIDE:EPOCHS values as ((side, last epoch),
  ...); a ValueError for a value that is not two integers."""
  stages = tuple(tuple(int(part) for part in value.split(":"))
                 for value in values)
  if any(len(stage) != 2 for stage in stages):
    raise ValueError("SIDE:EPOCHS")
  return stages


def _valid_resizing(values) -> bool:
  try:
    stages = resizing_stages(values)
  except ValueError:
    return False
  ends = [last for _, last in stages]
  return (all(side >= 8 for side, _ in stages)
          and ends == sorted(set(ends)) and all(end > 0 for end in ends))


flags.register_validator(
    "progressive_resizing", _valid_resizing,
    "must be SIDE:EPOCHS stages, e.g. 16:3,20:6: sides of at least 8 "
    "pixels, each stage ending at a later epoch than the one before")
flags.DEFINE_integer("image_size", 0,
                     "tfrecord, image_folder, synthetic: the square size "
                     "images are cropped and resized to (tfrecord), resized "
                     "to (image_folder) or generated at (synthetic). 0: the "
                     "data set's default, 224 (synthetic: 32).",
                     lower_bound=0)
flags.register_validator("image_size", lambda size: size == 0 or size >= 8,
                         "must be 0 (the data set's default) or at least 8")
flags.DEFINE_enum("channels", "3", ["1", "3"],
                  "image_folder: channels to decode every image to "
                  "(grayscale, RGB and RGBA files may be mixed; alpha is "
                  "dropped); synthetic: channels to generate.",
                  case_sensitive=False)
flags.DEFINE_float("validation_split", 0.0,
                   "image_folder without a validation/ folder: the fraction "
                   "of each class's files held out for validation, chosen "
                   "by a hash of their paths (the same on every rank and "
                   "rerun).", lower_bound=0.0, upper_bound=0.9)
flags.DEFINE_bool("skip_bad_files", False,
                  "image_folder: skip (and count) empty, unreadable and "
                  "non-image files instead of stopping at the first.")
flags.DEFINE_list("array_keys", [],
                  "arrays: names stored under other keys, as "
                  "STANDARD=STORED pairs, e.g. x_train=images,y_train=labels.")
flags.DEFINE_list("image_mean", [],
                  "Per-channel mean of the training images on their stored "
                  "scale (0-255 for uint8), instead of the data set's own "
                  "(measured on a sample at start-up for arrays and "
                  "image_folder, ImageNet's for tfrecord). Give --image_std "
                  "too. A resumed run keeps the statistics it started with "
                  "(model_dir/normalization.json).")
flags.DEFINE_list("image_std", [], "As --image_mean: per-channel std.")


def _statistics_given_together(values):
  return bool(values["image_mean"]) == bool(values["image_std"])


flags.register_multi_flags_validator(
    ["image_mean", "image_std"], _statistics_given_together,
    "--image_mean and --image_std go together")
flags.DEFINE_integer("num_classes", 0,
                     "tfrecord, synthetic: number of classes. 0: the data "
                     "set's default, 1000 (ImageNet's; synthetic: 10).",
                     lower_bound=0)
flags.register_validator("num_classes", lambda num: num == 0 or num >= 2,
                         "must be 0 (the data set's default) or at least 2")
flags.DEFINE_integer("label_offset", 0,
                     "tfrecord: subtracted from stored labels (1 for "
                     "ImageNet TFRecords, whose labels run 1..1000).")
flags.DEFINE_string(
    "tfrecord_features", "",
    "tfrecord: the records' input and label fields, NAME:KIND[:SHAPE] each, "
    "the input first: KIND raw_<dtype> for an array's raw bytes (int16, "
    "uint8, float32, ...), float32 or int64 for a list of values; e.g. "
    "CosmoFlow's x:raw_int16:128x128x128x4,y:float32:4. Inputs are images "
    "HxWxC or volumes DxHxWxC. Empty: features.txt beside the files (one "
    "entry a line), else ImageNet's layout of encoded images "
    "(docs/your-data.md).")
flags.DEFINE_enum("tfrecord_compression", "auto",
                  ["auto", "none", "gzip", "zlib"],
                  "tfrecord: how the files are compressed; auto: detected "
                  "from the first file's first bytes.",
                  case_sensitive=False)
flags.DEFINE_bool("log_transform", False,
                  "tfrecord with declared features: each stored value x "
                  "becomes log(1 + x) before normalization (CosmoFlow's "
                  "apply_log, for counts spanning orders of magnitude); the "
                  "statistics are measured after it.")
flags.DEFINE_bool("cache_records", False,
                  "tfrecord with declared features: each process decodes "
                  "its training records once, before training, and its "
                  "validation records at the first evaluation, and holds "
                  "them in memory, volumes normalized (a 32^3 x 4 volume: "
                  "512 KB as float32); every epoch then reads the same "
                  "batches as streaming would, without decompressing, "
                  "parsing and normalizing them. For data whose share fits "
                  "in each process's memory.")
flags.DEFINE_bool("random_transpose", False,
                  "Volumes (DxDxDxC): augment training examples with a "
                  "random order of their three spatial axes (--random_flip "
                  "flips volumes along each of the three).")
flags.DEFINE_string(
    "stage_dir", "",
    "TFRecord files: before training, each process copies the files it "
    "reads (its share) into this node-local directory ($TMPDIR, /tmp, a "
    "burst buffer) and reads them there; a rerun reuses the copies of the "
    "same size. The directory must exist. Empty: read from --data_dir.")
flags.DEFINE_integer("train_examples", 0,
                     "tfrecord: training examples in the train-* files; "
                     "synthetic: how many to generate. 0: count the files "
                     "(tfrecord, one read at start-up) or 10000 (synthetic).",
                     lower_bound=0)
flags.DEFINE_integer("test_examples", 0,
                     "As --train_examples, for the evaluation split "
                     "(synthetic default 1000).", lower_bound=0)

