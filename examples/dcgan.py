"""TensorFlow's DCGAN tutorial as a task with a train step of its own.

  horovodrun --gloo -np 2 .venv/bin/python -m engine.train \
      --task=examples/dcgan.py:DCGAN --epochs=2 --base_lr=0.0001 \
      --model_dir=runs/dcgan

Two models (the generator and the discriminator, held by one Keras model),
two optimizers (--optimizer, each at the learning-rate schedule), two tapes
a step: the tutorial's step (tensorflow.org/tutorials/generative/dcgan),
with each rank's gradients averaged across ranks by the engine's helper and
applied by its other helper, which refuses non-finite ones. The engine
keeps the rest: the sharded data, identical weights on every rank, exact
validation, both models and optimizers checkpointed and resumed, the
generator exported (noise in, images out), a grid of samples in
TensorBoard each epoch.

Validation shows each test image to the discriminator, beside a fake made
from noise seeded by that image (the same on any rank and in any batch):
`real_accuracy` (real images taken for real), `fake_accuracy` (fakes taken
for fakes), and `fooled`, the share of fakes taken for real, which decides
best/: a rough measure of the generator, as a GAN has no loss to minimize.
"""
import numpy as np
import keras
import tensorflow as tf

from engine.tasks import Task

layers = keras.layers


class GAN(keras.Model):
  """The tutorial's generator and discriminator for 28x28 images, widths
  scaled by `width` (64 in the tutorial), the discriminator's dropout
  `dropout` (0.3). Called on images, it gives the
  discriminator's logits for them and for a fake seeded by each."""

  def __init__(self, image_shape, latent: int, width: int, dropout: float):
    super().__init__(name="dcgan")
    self.latent = latent
    height = image_shape[0] // 4
    self.generator = keras.Sequential([
        keras.Input((latent,)),
        layers.Dense(height * height * 4 * width, use_bias=False),
        layers.BatchNormalization(), layers.LeakyReLU(),
        layers.Reshape((height, height, 4 * width)),
        layers.Conv2DTranspose(2 * width, 5, padding="same", use_bias=False),
        layers.BatchNormalization(), layers.LeakyReLU(),
        layers.Conv2DTranspose(width, 5, strides=2, padding="same",
                               use_bias=False),
        layers.BatchNormalization(), layers.LeakyReLU(),
        layers.Conv2DTranspose(image_shape[-1], 5, strides=2, padding="same",
                               dtype="float32"),
    ], name="generator")
    self.discriminator = keras.Sequential([
        keras.Input(image_shape),
        layers.Conv2D(width, 5, strides=2, padding="same"), layers.LeakyReLU(),
        layers.Dropout(dropout),
        layers.Conv2D(2 * width, 5, strides=2, padding="same"),
        layers.LeakyReLU(), layers.Dropout(dropout),
        layers.Flatten(), layers.Dense(1, dtype="float32"),
    ], name="discriminator")

  def noise(self, images, step=0):
    """Each image's own noise: seeded by its fingerprint (and the step)."""
    seeds = tf.bitcast(tf.fingerprint(images), tf.int64)
    return tf.map_fn(lambda seed: tf.random.stateless_normal(
        [self.latent], tf.stack([seed, tf.cast(step, tf.int64)])), seeds,
                     fn_output_signature=tf.float32)

  def call(self, images, training=False):
    fakes = self.generator(self.noise(images), training=training)
    return tf.concat([self.discriminator(images, training=training),
                      self.discriminator(fakes, training=training)], axis=1)


def cross_entropy(real: bool, logits):
  """Each example's binary cross-entropy against all real or all fake."""
  labels = tf.ones_like(logits) if real else tf.zeros_like(logits)
  return tf.nn.sigmoid_cross_entropy_with_logits(labels, logits)[:, 0]


class DCGAN(Task):
  optimizers = ("generator", "discriminator")
  best_metric = "fooled:max"
  # What it learns to make are the images: a flipped or shifted garment is
  # still one, so --random_flip and --random_shift apply.
  augmentation_keeps_targets = True
  latent = 100
  width = 64
  dropout = 0.3  # the discriminator's

  def build_model(self, build):
    return GAN(self.info.image_shape, self.latent, self.width, self.dropout)

  def output_shape(self):
    return (2,)

  def optimized_variables(self, model):
    return {"generator": model.generator.trainable_variables,
            "discriminator": model.discriminator.trainable_variables}

  def train_step(self, model, optimizers, images, labels, step):
    noise = model.noise(images, optimizers["generator"].iterations)
    with tf.GradientTape() as g_tape, tf.GradientTape() as d_tape:
      fakes = model.generator(noise, training=True)
      real = model.discriminator(images, training=True)
      fake = model.discriminator(fakes, training=True)
      g_loss = cross_entropy(True, fake)
      d_loss = cross_entropy(True, real) + cross_entropy(False, fake)
      means = {"generator": tf.reduce_mean(g_loss),
               "discriminator": tf.reduce_mean(d_loss)}
    tapes = {"generator": g_tape, "discriminator": d_tape}
    for name, variables in self.optimized_variables(model).items():
      gradients = step.average_gradients(tapes[name], means[name], variables)
      step.apply_gradients(optimizers[name], gradients, variables)
    return (means["generator"] + means["discriminator"],
            self._sums(d_loss, g_loss, real, fake))

  def loss(self, labels, outputs):
    return cross_entropy(True, outputs[:, :1]) + cross_entropy(
        False, outputs[:, 1:])

  def sums(self):
    return {"loss": (), "generator_loss": (), "real_right": (),
            "fake_right": ()}

  def batch_sums(self, labels, outputs, loss):
    real, fake = outputs[:, :1], outputs[:, 1:]
    return self._sums(loss, cross_entropy(True, fake), real, fake)

  def _sums(self, d_loss, g_loss, real, fake):
    def total(values):
      return tf.reduce_sum(tf.cast(values, tf.float64))
    return {"loss": total(d_loss), "generator_loss": total(g_loss),
            "real_right": total(real > 0), "fake_right": total(fake < 0)}

  def figures(self, sums):
    n = max(float(sums["examples"]), 1.0)
    return {"loss": sums["loss"] / n,
            "generator_loss": sums["generator_loss"] / n,
            "real_accuracy": sums["real_right"] / n,
            "fake_accuracy": sums["fake_right"] / n,
            "fooled": 1.0 - sums["fake_right"] / n}

  def serving(self, model):
    """Noise [batch, latent] in, images on the stored scale out."""
    mean = tf.constant(self.info.mean, tf.float32)
    std = tf.constant(self.info.std, tf.float32)

    @tf.function(input_signature=[tf.TensorSpec([None, self.latent],
                                                 tf.float32, name="noise")])
    def serve(noise):
      images = model.generator(noise, training=False) * std + mean
      return {"images": tf.clip_by_value(images, 0.0, 255.0)}

    return serve

  def sample_images(self, model, images, labels):
    """16 fakes from fixed noise, 4 x 4: the same noise every epoch."""
    noise = tf.random.stateless_normal([16, self.latent], [0, 0])
    fakes = self.stored(model.generator(noise, training=False))
    grid = np.concatenate([np.concatenate(list(row), axis=1)
                           for row in fakes.reshape(4, 4, *fakes.shape[1:])])
    grid = np.clip(grid, 0, 255).astype(np.uint8)
    if grid.shape[-1] == 1:
      grid = np.repeat(grid, 3, axis=-1)
    return {"samples": (np.kron(grid, np.ones((3, 3, 1), np.uint8))[None],
                        "16 fakes from the same noise each epoch.")}
