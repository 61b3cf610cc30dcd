"""A frozen first layer that whitens the images' patches, adapted to the
training data before training (Keller Jordan's airbench, "94% on CIFAR-10
in 3.29 seconds on a single GPU", 2024).

A k x k convolution whose filters are the eigenvectors of the covariance of
the training images' k x k patches, each divided by the square root of its
eigenvalue, followed by their negatives (so that a ReLU after it passes
both signs): its outputs are the patches decorrelated, each direction of
unit variance. Frozen, it spares the network learning the pixels'
correlations, and the first epochs learn faster (bench/RESULTS.md, "Toward
94%: airbench's stem and pooling"). Its bias is learnt.

The filters come from data, not from an initializer: the engine calls
`adapt` on every PatchWhitening of a model it builds with its first
training images (engine/build.py), the same images on every rank. Until
then the filters are random. A checkpoint holds them, so a resumed run and
engine.evaluate use the ones its first start computed.
"""
import numpy as np
import keras
import tensorflow as tf

# Patches are counted in chunks of about this many, bounding adapt's
# memory for large images (a 224 x 224 x 3 image has 49,729 patches of 12
# values).
CHUNK_PATCHES = 1 << 18


# Registered, so that an exported .keras file of a model with it loads
# wherever `models` is importable (engine/records/export.py).
@keras.saving.register_keras_serializable(package="engine")
class PatchWhitening(keras.layers.Layer):
  """k x k patches whitened: 2 k^2 C channels from C, at the same height
  and width ("same" padding)."""

  def __init__(self, kernel_size: int = 2, epsilon: float = 5e-4, **kwargs):
    super().__init__(**kwargs)
    self.kernel_size = kernel_size
    self.epsilon = epsilon  # added to the eigenvalues: noise isn't blown up

  def build(self, input_shape):
    size = self.kernel_size * self.kernel_size * input_shape[-1]
    self.kernel = self.add_weight(
        name="kernel", shape=(self.kernel_size, self.kernel_size,
                         input_shape[-1], 2 * size), trainable=False)
    self.bias = self.add_weight(name="bias", shape=(2 * size,),
                                initializer="zeros")
    super().build(input_shape)

  def call(self, images):
    return tf.nn.conv2d(images, tf.cast(self.kernel, images.dtype), 1,
                        "SAME") + tf.cast(self.bias, images.dtype)

  def adapt(self, images: np.ndarray) -> None:
    """Sets the filters from `images` [N, H, W, C], normalized as the
    model receives them."""
    k, channels = self.kernel_size, images.shape[-1]
    size = channels * k * k
    patches = np.lib.stride_tricks.sliding_window_view(
        images, (k, k), axis=(1, 2))  # a view: [N, H', W', C, k, k]
    per_image = patches.shape[1] * patches.shape[2]
    covariance = np.zeros((size, size))
    step = max(1, CHUNK_PATCHES // per_image)
    for start in range(0, len(images), step):
      chunk = patches[start:start + step].reshape(-1, size).astype(np.float64)
      covariance += chunk.T @ chunk
    covariance /= len(images) * per_image
    eigenvalues, eigenvectors = np.linalg.eigh(covariance)
    filters = eigenvectors.T / np.sqrt(eigenvalues[:, None] + self.epsilon)
    filters = np.concatenate([filters, -filters])  # [2 k^2 C, C k k]
    if not self.built:
      self.build(images.shape)
    self.kernel.assign(filters.reshape(-1, channels, k, k).transpose(
        2, 3, 1, 0).astype(np.float32))

  def get_config(self):
    return dict(super().get_config(), kernel_size=self.kernel_size,
                epsilon=self.epsilon)


def adapt(model: keras.Model, images) -> None:
  """Adapts every PatchWhitening in `model` to `images()`, called only if
  there is one (it reads the data)."""
  layers = [layer for layer in _layers_within(model)
            if isinstance(layer, PatchWhitening)]
  if layers:
    first_images = images()
    for layer in layers:
      layer.adapt(first_images)


def _layers_within(layer: keras.layers.Layer):
  """Every layer inside `layer`, nested models' included."""
  for inner in getattr(layer, "layers", []):
    yield inner
    yield from _layers_within(inner)
