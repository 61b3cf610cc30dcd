"""Image-to-image: a denoising autoencoder that restores each image.

The target is the input image itself, as the pipeline gives it (augmented,
normalized); the model sees it with Gaussian noise of `noise` standard
deviations added (0: a plain autoencoder, which a U-Net's skips make
trivial). Each image's noise is drawn from a seed that is the image's own
fingerprint, so an image gets the same noise on every rank, in every
batch, in a resumed run and in engine.evaluate: validation stays exactly
the whole split's, and a run resumes exactly. (Augmented training images
differ from epoch to epoch, and so does their noise.)

Loss: MSE or MAE per pixel on normalized images. Figures on the images'
stored scale (0-255 for uint8): MSE, MAE, and PSNR, 10 log10(peak² /
MSE) of the split's MSE: a ratio of sums, not a mean of per-image PSNRs.
"""
import numpy as np
import tensorflow as tf

from engine.core.errors import UserError
from engine.tasks.task import Task

LOSSES = ("mse", "mae")


class Reconstruction(Task):
  """Any labels (unused); float32 outputs shaped as the images."""

  best_metric = "psnr:max"
  # The targets are the images, augmented as the inputs are.
  augmentation_keeps_targets = True

  def __init__(self, info, *, loss: str = "", noise: float = 0.5,
               seed: int = 0):
    """`loss` (--loss): mse (the default) or mae; `noise` (--noise): the
    noise's standard deviation, in the normalized images' units."""
    super().__init__(info)
    self.loss_name = loss or "mse"
    if self.loss_name not in LOSSES:
      raise UserError(f"--loss={loss}: the reconstruction task's losses are "
                      f"{', '.join(LOSSES)}")
    self.noise = noise
    self._seed = seed
    self._std = np.array(info.std, np.float64)
    self._peak = 255.0 if info.image_dtype == "uint8" else 1.0

  def output_shape(self):
    return tuple(self.info.image_shape)

  def inputs_and_targets(self, images, labels):
    return self.noisy(images), images

  def noisy(self, images: tf.Tensor) -> tf.Tensor:
    """`images` with each one's own noise (seeded by its fingerprint)."""
    if not self.noise:
      return images
    seeds = tf.bitcast(tf.fingerprint(images), tf.int64)  # [batch]
    noise = tf.map_fn(
        lambda seed: tf.random.stateless_normal(
            images.shape[1:], tf.stack([seed, self._seed])),
        seeds, fn_output_signature=tf.float32)
    return images + self.noise * noise

  def loss(self, labels, outputs):
    error = outputs - labels
    each = tf.abs(error) if self.loss_name == "mae" else tf.square(error)
    return tf.reduce_mean(each, axis=[1, 2, 3])

  def sums(self):
    channels = (self.info.image_shape[-1],)
    return {"loss": (), "squared_error": channels,
            "absolute_error": channels}

  def batch_sums(self, labels, outputs, loss):
    error = tf.cast(outputs - labels, tf.float64)
    return {"loss": tf.reduce_sum(tf.cast(loss, tf.float64)),
            "squared_error": tf.reduce_sum(tf.square(error), axis=[0, 1, 2]),
            "absolute_error": tf.reduce_sum(tf.abs(error), axis=[0, 1, 2])}

  def figures(self, sums):
    pixels = max(float(sums["examples"]), 1.0) * np.prod(
        self.info.image_shape[:2])
    # Per channel, from normalized units back to the stored scale.
    mse = float((sums["squared_error"] * self._std ** 2).sum() / pixels
                / len(self._std))
    mae = float((sums["absolute_error"] * self._std).sum() / pixels
                / len(self._std))
    return {"loss": float(sums["loss"]) / max(float(sums["examples"]), 1.0),
            "mse": mse, "mae": mae,
            "psnr": 10 * np.log10(self._peak ** 2 / mse) if mse else None}

  def serve(self, outputs):
    """The restored images on the stored scale (clipped to it)."""
    images = (outputs * tf.constant(self.info.std, tf.float32)
              + tf.constant(self.info.mean, tf.float32))
    return {"images": tf.clip_by_value(images, 0.0, self._peak)}

  def sample_images(self, model, images, labels):
    inputs, targets = self.inputs_and_targets(images, labels)
    rows = [self.stored(targets), self.stored(inputs),
            self.stored(model(inputs, training=False))]
    picture = np.concatenate(
        [np.concatenate(columns, axis=1) for columns in zip(*rows)], axis=0)
    picture = np.clip(picture * (255.0 / self._peak), 0, 255).astype(np.uint8)
    if picture.shape[-1] == 1:
      picture = np.repeat(picture, 3, axis=-1)
    scale = max(1, 96 // self.info.image_shape[0])
    return {"reconstructions": (
        np.kron(picture, np.ones((scale, scale, 1), np.uint8))[None],
        "Each row a test example: the image, the image with its noise, "
        "the model's reconstruction.")}
