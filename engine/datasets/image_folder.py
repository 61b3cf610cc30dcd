"""Your own images: a directory of class folders, decoded as they are read.

The layout of Keras' `image_dataset_from_directory` and torchvision's
`ImageFolder`:

  data_dir/train/<class>/*.jpg|.jpeg|.png|.bmp|.gif
  data_dir/validation/<class>/...     (or val/ or test/)

Labels are the class folders' names, sorted. For segmentation
(--task=segmentation), the Oxford-IIIT Pet and Cityscapes way, each image
has a mask of the same name beside it, a single-channel PNG whose values
are class ids, and classes.txt names the classes in label order:

  data_dir/train/images/NAME.jpg    data_dir/train/masks/NAME.png
  data_dir/validation/images/...    data_dir/validation/masks/...
  data_dir/classes.txt

Masks are resized with their images, nearest neighbour. Without a validation folder,
`--validation_split=F` holds out a fraction F of each class's files, chosen
by a hash of each file's path: the same files on every rank, on every
rerun, and mostly the same files when some are added.

Start-up lists the files and reads each one's first bytes (not its image),
so a missing, empty, unreadable or non-image file is named before any
training, at the cost of one small read per file. Images are decoded by the
input pipeline, each rank only its own share: each split is a source of its
own kind, `ImageFiles`, which reads its files by index as they are needed.
Normalization statistics come from a seeded sample of the training images,
unless given.
"""
import dataclasses
import hashlib
import os

from absl import logging
import numpy as np
from PIL import Image
import tensorflow as tf

from engine.core.errors import UserError
from engine.core.run_files import CLASSES_FILE
from engine.datasets import statistics
from engine.datasets.sources import (PARALLEL_BATCHES, batch_augmentation,
                                     decode_parallelism, eval_rows, indices)
from engine.datasets.splits import (Augmentation, DatasetInfo, Epochs,
                                    LabelKind, Shard, Source, Splits)

EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")
TRAIN_DIR = "train"
IMAGES_DIR, MASKS_DIR = "images", "masks"  # segmentation's layout
VALIDATION_DIRS = ("validation", "val", "test")
# Training images decoded at start-up for the normalization statistics.
STATS_SAMPLE = 512
_MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"BM", b"GIF87a", b"GIF89a")


@dataclasses.dataclass(frozen=True)
class ImageFiles(Source):
  """One split as image files (JPEG, PNG, BMP, GIF), one example each.

  Decoded to the image shape's channels and resized to its size as they
  are read; labels are int64 [N], in the order of `paths`, or for
  segmentation the paths of their masks (PNG files, decoded as read).
  """
  paths: tuple[str, ...]
  labels: np.ndarray

  def train_batches(self, info: DatasetInfo, *, shard: Shard, epochs: Epochs,
                    augmentation: Augmentation, first_epoch: int,
                    first_step: int) -> tf.data.Dataset:
    """Each batch's files decoded in parallel, one example per call, and
    batched again with their batch's (key, step)."""
    example = self._example(info)
    augmented = batch_augmentation(info, shard, augmentation)

    def per_example(key, step, rows):
      count = tf.shape(rows)[0]
      return (tf.tile(key[None], [count, 1]), tf.fill([count], step), rows)

    return (indices(len(self.labels), shard=shard, epochs=epochs,
                    first_epoch=first_epoch, first_step=first_step)
            .map(per_example).unbatch()
            .map(lambda key, step, row: (key, step, *example(row)),
                 num_parallel_calls=decode_parallelism())
            .batch(epochs.batch_size, drop_remainder=True)
            .map(lambda keys, steps, images, labels:
                 augmented(keys[0], steps[0], images, labels),
                 num_parallel_calls=PARALLEL_BATCHES))

  def eval_batches(self, info: DatasetInfo, *, shard: Shard,
                   batch_size: int) -> tf.data.Dataset:
    return eval_rows(len(self.labels), shard).map(
        self._example(info),
        num_parallel_calls=decode_parallelism()).batch(batch_size)

  def _example(self, info: DatasetInfo):
    """A function from an example's index to its image and label decoded:
    the label's class id, or its mask's file."""
    paths = tf.constant(list(self.paths))
    labels = tf.constant(self.labels)

    def example(row):
      label = tf.gather(labels, row)
      if info.labels_are_masks():
        label = decode_mask(label, info.image_shape[:2])
      return decode(tf.gather(paths, row), info.image_shape), label

    return example


def decode(path: tf.Tensor, image_shape) -> tf.Tensor:
  """An image file as float32 [H, W, C] on the 0-255 scale, resized.

  Any of the four formats, with 1 to 4 channels: alpha is dropped, and
  grayscale and color are converted to the image shape's channels.
  """
  height, width, channels = image_shape
  image = tf.io.decode_image(tf.io.read_file(path), expand_animations=False)
  have = tf.shape(image)[-1]
  image = tf.cond(have >= 3, lambda: image[..., :3], lambda: image[..., :1])
  if channels == 3:
    image = tf.cond(tf.shape(image)[-1] == 1,
                    lambda: tf.tile(image, [1, 1, 3]), lambda: image)
  else:
    image = tf.cond(tf.shape(image)[-1] == 3,
                    lambda: tf.image.rgb_to_grayscale(image), lambda: image)
  image = tf.image.resize(image, [height, width])
  return tf.ensure_shape(image, image_shape)


def decode_mask(path: tf.Tensor, size) -> tf.Tensor:
  """A mask PNG as uint8 class ids [H, W], resized to `size` (nearest)."""
  mask = tf.io.decode_png(tf.io.read_file(path), channels=1)
  mask = tf.image.resize(mask, size, method="nearest")
  return tf.ensure_shape(tf.cast(mask[..., 0], tf.uint8), size)


def load(*, data_dir: str, image_size: int, channels: int,
         validation_split: float, skip_bad_files: bool,
         normalization=None,
         labels: LabelKind = LabelKind.CLASSES) -> Splits:
  """`normalization` is (mean, std) to use rather than the sample's;
  `labels="masks"` reads the images/ and masks/ layout."""
  if labels == LabelKind.MASKS:
    return _masks_splits(data_dir, (image_size, image_size, channels),
                         normalization)
  class_names, train, validation = list_files(
      data_dir, validation_split=validation_split,
      skip_bad_files=skip_bad_files)
  image_shape = (image_size, image_size, channels)
  splits = [ImageFiles(tuple(p for p, _ in files),
                       np.array([l for _, l in files], np.int64))
            for files in (train, validation)]
  mean, std = normalization or _sample_statistics(splits[0], image_shape)
  info = DatasetInfo(
      name=os.path.basename(os.path.abspath(data_dir)),
      image_shape=image_shape, num_classes=len(class_names),
      num_train=len(train), num_test=len(validation), mean=tuple(mean),
      std=tuple(std), class_names=tuple(class_names))
  return Splits(train=splits[0], test=splits[1], info=info)


def list_files(data_dir: str, *, validation_split: float,
               skip_bad_files: bool):
  """(class names, train files, validation files), the files as sorted
  (path, label) pairs, every one checked at a glance (`_problem`)."""
  train_dir = _train_dir(data_dir)
  class_names = _class_folders(train_dir)
  validation_dir = next((os.path.join(data_dir, name)
                         for name in VALIDATION_DIRS
                         if os.path.isdir(os.path.join(data_dir, name))),
                        None)
  bad = []
  train = _list_files(train_dir, class_names, bad, skip_bad_files)
  if validation_dir:
    if validation_split:
      raise UserError(f"--validation_split={validation_split:g}: "
                      f"{validation_dir} exists and is the validation split; "
                      "drop the flag, or move the folder away")
    extra = sorted(set(_class_folders(validation_dir)) - set(class_names))
    if extra:
      raise UserError(f"{os.path.join(validation_dir, extra[0])}: a class "
                      f"that {train_dir} lacks; every validation class must "
                      "have training images")
    validation = _list_files(validation_dir, class_names, bad,
                             skip_bad_files, may_be_empty=True)
  elif validation_split:
    train, validation = _hold_out(train, validation_split, class_names)
  else:
    raise UserError(f"--data_dir={data_dir}: no validation/ folder; add one "
                    "with the same class folders, or pass "
                    "--validation_split=0.1 to hold out 10% of train/")
  if bad:
    logging.warning("skipped %d bad files (--skip_bad_files), e.g. %s",
                    len(bad), bad[0])
  return class_names, train, validation


def _masks_splits(data_dir: str, image_shape, normalization) -> Splits:
  """The images/ and masks/ layout: each split's (image, mask) pairs, the
  classes from classes.txt."""
  train_dir = _train_dir(data_dir)
  validation_dir = next((os.path.join(data_dir, name)
                         for name in VALIDATION_DIRS
                         if os.path.isdir(os.path.join(data_dir, name))),
                        None)
  if validation_dir is None:
    raise UserError(f"--data_dir={data_dir}: no validation/ folder; add one "
                    "with images/ and masks/ as train/ has")
  names_path = os.path.join(data_dir, CLASSES_FILE)
  if not os.path.isfile(names_path):
    raise UserError(f"{names_path}: missing; masks' classes are named there, "
                    "one a line in label order (the name of 0 first)")
  with open(names_path) as f:
    class_names = tuple(line.strip() for line in f if line.strip())
  splits = []
  for split_dir in (train_dir, validation_dir):
    images, masks = zip(*_mask_pairs(split_dir))
    splits.append(ImageFiles(images, np.array(masks)))
  mean, std = normalization or _sample_statistics(splits[0], image_shape)
  info = DatasetInfo(
      name=os.path.basename(os.path.abspath(data_dir)),
      image_shape=image_shape, num_classes=len(class_names),
      num_train=len(splits[0].paths), num_test=len(splits[1].paths),
      mean=tuple(mean), std=tuple(std), class_names=class_names,
      label_shape=image_shape[:2], label_dtype="uint8",
      label_kind=LabelKind.MASKS)
  return Splits(train=splits[0], test=splits[1], info=info)


def _mask_pairs(split_dir: str) -> list[tuple[str, str]]:
  """(image, mask) paths of a split, sorted by name; an image without its
  mask, a mask of another size than its image, or a mask that is not a
  single-channel PNG is one line."""
  images_dir = os.path.join(split_dir, IMAGES_DIR)
  masks_dir = os.path.join(split_dir, MASKS_DIR)
  for folder in (images_dir, masks_dir):
    if not os.path.isdir(folder):
      raise UserError(f"{folder}: no such folder; segmentation data has "
                      f"{IMAGES_DIR}/ and {MASKS_DIR}/ in each split")
  pairs = []
  for name in sorted(os.listdir(images_dir)):
    if name.startswith(".") or not name.lower().endswith(EXTENSIONS):
      continue
    image = os.path.join(images_dir, name)
    mask = os.path.join(masks_dir, os.path.splitext(name)[0] + ".png")
    problem = _problem(image) or _mask_problem(image, mask)
    if problem:
      raise UserError(problem)
    pairs.append((image, mask))
  if not pairs:
    raise UserError(f"{images_dir}: no images")
  return pairs


def _mask_problem(image: str, mask: str) -> str:
  """What is wrong with an image's mask, in a line naming it, or ''."""
  if not os.path.isfile(mask):
    return f"{mask}: missing, the mask of {image}"
  try:
    with Image.open(image) as opened:
      image_size = opened.size
    with Image.open(mask) as opened:
      mask_size, mode, kind = opened.size, opened.mode, opened.format
  except (OSError, ValueError) as e:
    return f"{mask} or its image: unreadable ({e})"
  if kind != "PNG" or mode not in ("L", "I", "I;16"):
    return (f"{mask}: a {kind} image in mode {mode}; masks are "
            "single-channel PNGs whose values are class ids (convert a "
            "palette PNG to mode L)")
  if mask_size != image_size:
    return (f"{mask}: {mask_size[0]}x{mask_size[1]} pixels, but its image "
            f"{image} is {image_size[0]}x{image_size[1]}")
  return ""


def _train_dir(data_dir: str) -> str:
  if not data_dir:
    raise UserError("--dataset=image_folder needs --data_dir=DIR holding "
                    "train/<class>/ folders of images")
  if not os.path.isdir(data_dir):
    raise UserError(f"--data_dir={data_dir}: no such directory")
  train_dir = os.path.join(data_dir, TRAIN_DIR)
  if not os.path.isdir(train_dir):
    raise UserError(f"--data_dir={data_dir}: no {TRAIN_DIR}/ folder; the "
                    "layout is train/<class>/*.jpg and validation/<class>/")
  return train_dir


def _class_folders(split_dir: str) -> list[str]:
  names = sorted(entry.name for entry in os.scandir(split_dir)
                 if entry.is_dir() and not entry.name.startswith("."))
  if not names:
    raise UserError(f"{split_dir}: no class folders; put each class's "
                    "images in a folder named after it")
  return names


def _list_files(split_dir: str, class_names, bad: list,
                skip_bad_files: bool, may_be_empty: bool = False):
  """Sorted (path, label) pairs; a class folder with no images is an
  error, except a validation folder's missing class (`may_be_empty`)."""
  files = []
  for label, name in enumerate(class_names):
    folder = os.path.join(split_dir, name)
    found = []
    for root, dirs, names in os.walk(folder):
      dirs[:] = sorted(d for d in dirs if not d.startswith("."))
      for file_name in sorted(names):
        if (file_name.startswith(".")
            or not file_name.lower().endswith(EXTENSIONS)):
          continue
        path = os.path.join(root, file_name)
        problem = _problem(path)
        if not problem:
          found.append((path, label))
        elif skip_bad_files:
          bad.append(f"{path}: {problem}")
        else:
          raise UserError(f"{path}: {problem}; remove it, or pass "
                          "--skip_bad_files to skip such files")
    if not found and not (may_be_empty and not os.path.isdir(folder)):
      raise UserError(f"{folder}: no {'/'.join(e[1:] for e in EXTENSIONS)} "
                      "images in this class folder")
    files += found
  return files


def _problem(path: str) -> str:
  """What is wrong with an image file at a glance, or ''."""
  try:
    with open(path, "rb") as f:
      head = f.read(8)
  except OSError as e:
    return f"cannot read it ({e.strerror})"
  if not head:
    return "empty file"
  if not head.startswith(_MAGIC):
    return "not a JPEG, PNG, BMP or GIF image"
  return ""


def _hold_out(files, fraction: float, class_names):
  """Each class's files split by a hash of their paths: the lowest
  `fraction` of hashes are validation."""
  by_class = [[] for _ in class_names]
  for path, label in files:
    by_class[label].append((path, label))
  train, validation = [], []
  for mine in by_class:
    mine.sort(key=lambda f: hashlib.sha1(f[0].encode()).hexdigest())
    held = min(len(mine) - 1, round(fraction * len(mine)))
    validation += mine[:held]
    train += mine[held:]
  return sorted(train), sorted(validation)


def _sample_statistics(images: ImageFiles, image_shape):
  """Per-channel mean and std of a seeded sample of the training images,
  decoded and resized as training reads them."""
  rows = np.sort(np.random.default_rng(0).choice(
      len(images.paths), min(len(images.paths), STATS_SAMPLE), replace=False))
  sample = [images.paths[r] for r in rows]
  decoded = tf.data.Dataset.from_tensor_slices(sample).map(
      lambda path: decode(path, image_shape),
      num_parallel_calls=len(os.sched_getaffinity(0)))
  moments = statistics.Moments()
  try:
    for batch in decoded.batch(64):
      moments.add(batch.numpy().reshape(-1, image_shape[-1]))
  except tf.errors.InvalidArgumentError:
    raise UserError(_first_undecodable(sample, image_shape)) from None
  return moments.result()


def _first_undecodable(paths, image_shape) -> str:
  """The message naming the first of `paths` that does not decode."""
  for path in paths:
    try:
      decode(tf.constant(path), image_shape)
    except tf.errors.InvalidArgumentError as e:
      return (f"{path}: cannot decode it ({e.message.splitlines()[0]}); "
              "remove or replace it")
  return "an image failed to decode"
