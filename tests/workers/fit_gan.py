"""Run by tests/test_fit_ranks.py under `horovodrun -np 2`: Keras' GAN
guide's model (its own train_step, two optimizers it holds), trained by
engine.fit on each rank's share of random images; each rank writes its
variables to MODEL_DIR/rank<r>.npz.

  fit_gan.py MODEL_DIR [engine flags]
"""
import json
import os
import sys

import engine
import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

LATENT = 4


class GAN(keras.Model):
  """As Keras' guide writes it (dcgan_overriding_train_step), small."""

  def __init__(self):
    super().__init__()
    self.discriminator = keras.Sequential([
        keras.Input((8,)), keras.layers.Dense(8, activation="relu"),
        keras.layers.Dense(1)])
    self.generator = keras.Sequential([keras.Input((LATENT,)),
                                       keras.layers.Dense(8)])
    self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
    self.g_loss_tracker = keras.metrics.Mean(name="g_loss")
    self.seed_generator = keras.random.SeedGenerator(1337)

  def compile(self, d_optimizer, g_optimizer, loss_fn):
    super().compile()
    self.d_optimizer, self.g_optimizer = d_optimizer, g_optimizer
    self.loss_fn = loss_fn

  @property
  def metrics(self):
    return [self.d_loss_tracker, self.g_loss_tracker]

  def train_step(self, data):
    real = data  # the images alone, as the guide's dataset yields them
    batch = tf.shape(real)[0]
    noise = keras.random.normal((batch, LATENT), seed=self.seed_generator)
    images = tf.concat([self.generator(noise), real], 0)
    labels = tf.concat([tf.ones((batch, 1)), tf.zeros((batch, 1))], 0)
    with tf.GradientTape() as tape:
      d_loss = self.loss_fn(labels, self.discriminator(images))
    grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
    self.d_optimizer.apply_gradients(
        zip(grads, self.discriminator.trainable_weights))
    noise = keras.random.normal((batch, LATENT), seed=self.seed_generator)
    with tf.GradientTape() as tape:
      g_loss = self.loss_fn(tf.zeros((batch, 1)),
                            self.discriminator(self.generator(noise)))
    grads = tape.gradient(g_loss, self.generator.trainable_weights)
    self.g_optimizer.apply_gradients(
        zip(grads, self.generator.trainable_weights))
    self.d_loss_tracker.update_state(d_loss)
    self.g_loss_tracker.update_state(g_loss)
    return {m.name: m.result() for m in self.metrics}


def images(seed):
  x = np.random.default_rng(seed).normal(size=(256, 8)).astype("float32")
  return tf.data.Dataset.from_tensor_slices(x).shuffle(256, seed=0).batch(16)


def main(model_dir):
  # Each rank its own initial weights: the engine's broadcast makes them one.
  keras.utils.set_random_seed(int(os.environ["HOROVOD_RANK"]))
  gan = GAN()
  gan.compile(d_optimizer=keras.optimizers.Adam(1e-3),
              g_optimizer=keras.optimizers.Adam(1e-3),
              loss_fn=keras.losses.BinaryCrossentropy(from_logits=True))
  # A batch hook, as LambdaCallback sets one: the logs it gets, per step.
  batch_logs = []
  seen = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs:
                                        batch_logs.append([batch, logs]))
  history = engine.fit(gan, images(0), epochs=2, model_dir=model_dir,
                       callbacks=[seen])
  assert set(history.history) >= {"d_loss", "g_loss"}, history.history
  np.savez(os.path.join(model_dir, f"rank{hvd.rank()}.npz"),
           *[v.numpy() for v in gan.variables])
  with open(os.path.join(model_dir, f"batches{hvd.rank()}.json"), "w") as f:
    json.dump(batch_logs, f)


if __name__ == "__main__":
  main(sys.argv.pop(1))
