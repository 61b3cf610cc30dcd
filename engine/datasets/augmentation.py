"""What training examples become: random flips and shifts of images,
flips and axis orders of volumes, and smaller images in the first epochs.

Every draw is stateless, keyed by (seed, epoch, step, rank) by the source
that reads the batch (engine/datasets/sources.py), so a run's batches are
reproducible, every epoch differs, no two ranks augment alike, and a
resumed run gets the very batches it would have had. Images are
transformed a whole batch at a time with a few ops, cheaper than a
per-example map; volumes one by one, each copied once or twice, cheaper
than whole-batch copies of every flip (`augment_volumes`).
"""
import dataclasses
import itertools

from absl import logging
import tensorflow as tf

from engine.core.errors import UserError

# A volume's three axes, in each of their orders.
_AXIS_ORDERS = tuple(itertools.permutations(range(3)))


@dataclasses.dataclass(frozen=True)
class Augmentation:
  """How training augments its examples (the --random_* flags, as the
  task's targets allow, and --progressive_resizing). Images are flipped
  left and right and shifted by up to `shift` of their size (`augment`);
  volumes flipped along each spatial axis and, with `transpose`, their
  axes put in a random order (`augment_volumes`). `resizing`, ((side,
  last epoch), ...), makes the images of the first epochs smaller
  (engine/datasets/sources.py)."""
  flip: bool = False
  shift: float = 0.0
  transpose: bool = False
  resizing: tuple = ()

  @classmethod
  def requested(cls, data_config, task=None, *,
                resizing: bool = True) -> "Augmentation":
    """What a run's data flags (config.DataConfig) ask for, for `task`'s
    targets; without `resizing`, at the images' own size (a measurement's
    batches).

    Flips, shifts and transposes move the images and not a label: right
    for a task whose targets do not change with them or that moves them
    too (`Task.augmentation_keeps_targets`); for any other, a position
    or an angle would be learned wrong, so their defaults are off and a
    flag that asks for one anyway is warned about (`_moving`). Without a
    task (a benchmark's batches), as the flags say."""
    flip, shift = data_config.random_flip, data_config.random_shift
    transpose = data_config.random_transpose
    if task is not None and not task.augmentation_keeps_targets:
      given = data_config.given_augmentation
      flip = flip and "random_flip" in given
      shift = shift if "random_shift" in given else 0.0
      transpose = transpose and "random_transpose" in given
      _warn_moving(type(task).__name__, flip=flip, shift=shift,
                   transpose=transpose)
    return cls(flip=flip, shift=shift, transpose=transpose,
               resizing=data_config.progressive_resizing if resizing else ())

  def check(self, image_shape) -> None:
    """A UserError if these examples cannot be augmented so."""
    volumes = len(image_shape) == 4
    if self.transpose and not (volumes and len(set(image_shape[:3])) == 1):
      raise UserError(
          "--random_transpose puts a volume's three axes in a random order: "
          "for cubic volumes (DxDxDxC); these examples are "
          f"{'x'.join(map(str, image_shape))}")


def _warn_moving(task: str, *, flip: bool, shift: float,
                 transpose: bool) -> None:
  """One line saying what the flags given do to targets that stay put."""
  moving = [name for name, on in (("--random_flip", flip),
                                  ("--random_shift", shift),
                                  ("--random_transpose", transpose)) if on]
  if moving:
    logging.warning(
        "%s move%s the training images of %s and not its targets, which "
        "it does not say are kept (Task.augmentation_keeps_targets): a "
        "target that moves with the image, a position or an angle, is "
        "learned wrong", " and ".join(moving),
        "" if len(moving) > 1 else "s", task)


def augment(images: tf.Tensor, key: tf.Tensor, *, flip: bool, shift: float,
            fill: str = "nearest") -> tf.Tensor:
  """Random horizontal flips and shifts of a uint8 batch, as the Horovod lab.

  The lab's ImageDataGenerator shifted by up to `shift` of the width and
  height and filled the border with the nearest pixel; we shift by whole
  pixels, the same transform without interpolation blur. With
  `fill="constant"` the border is zeros: CIFAR's pad-4-and-crop is a shift
  of up to 4/32 = 0.125. One image transform op for the whole batch is far
  cheaper than a per-example map.
  """
  batch = tf.shape(images)[0]
  flip_key = tf.random.experimental.stateless_fold_in(key, 0)
  shift_key = tf.random.experimental.stateless_fold_in(key, 1)
  if flip:
    flipped = tf.random.stateless_uniform([batch], flip_key) < 0.5
    images = tf.where(flipped[:, None, None, None],
                      tf.reverse(images, axis=[2]), images)
  height, width = images.shape[1], images.shape[2]
  max_dy, max_dx = round(shift * height), round(shift * width)
  if max_dx or max_dy:
    offsets = tf.random.stateless_uniform(
        [batch, 2], shift_key, minval=-1.0, maxval=1.0)
    offsets = tf.round(offsets * tf.constant([max_dx, max_dy], tf.float32))
    ones, zeros = tf.ones([batch, 1]), tf.zeros([batch, 1])
    # Each output pixel (x, y) samples the input at (x + dx, y + dy).
    transforms = tf.concat([ones, zeros, offsets[:, :1], zeros, ones,
                            offsets[:, 1:], zeros, zeros], axis=1)
    images = tf.raw_ops.ImageProjectiveTransformV3(
        images=images, transforms=transforms,
        output_shape=tf.constant([height, width]), fill_value=0.0,
        interpolation="NEAREST", fill_mode=fill.upper())
  return images


def augment_volumes(volumes: tf.Tensor, key: tf.Tensor, *, flip: bool,
                    transpose: bool) -> tf.Tensor:
  """Random flips of a batch of volumes [B, D, H, W, C] along each spatial
  axis and, with `transpose`, a random order of the three axes, each
  example its own: the symmetries of a box of matter (CosmoFlow's
  augmentation), which change no physical parameter.

  Example by example: each volume reversed along its flipped axes at once,
  then transposed, a copy each. Flipping the whole batch along each axis
  and selecting (tf.where) made the same volumes at five times the cost,
  more than a CosmoFlow step's (bench/RESULTS.md, "CosmoFlow's step")."""
  if not (flip or transpose):
    return volumes
  count = tf.shape(volumes)[0]
  flips = tf.zeros([3, count], tf.bool)
  if flip:
    flips = tf.random.stateless_uniform(
        [3, count], tf.random.experimental.stateless_fold_in(key, 0)) < 0.5
  orders = tf.zeros([count], tf.int32)  # _AXIS_ORDERS[0]: as stored
  if transpose:
    orders = tf.random.stateless_uniform(
        [count], tf.random.experimental.stateless_fold_in(key, 1),
        maxval=len(_AXIS_ORDERS), dtype=tf.int32)
  permutations = tf.constant([order + (3,) for order in _AXIS_ORDERS])

  def augmented(example):
    volume, flipped, order = example
    volume = tf.reverse(volume, tf.boolean_mask(tf.range(3), flipped))
    return tf.transpose(volume, tf.gather(permutations, order))

  return tf.map_fn(augmented, (volumes, tf.transpose(flips), orders),
                   fn_output_signature=volumes.dtype)
