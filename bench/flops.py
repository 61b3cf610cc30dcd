"""The model's training FLOPs per image, and the machine's matmul peak.

Two counts of one training step (forward, backward, Adam update), one the
check of the other:
- `profiled`: TensorFlow's profiler over the graph of the traced step
  (workload.train_step), each op costed by its registered statistics. Ops
  whose outputs nothing reads are left out: the gradient with respect to the
  input images is built by the tape but pruned before the step runs.
- `analytic`: 2 FLOPs per multiply-add of the convolutions and dense layers,
  forward, plus the gradients with respect to their weights and, but for the
  first layer, their inputs. Bias, pooling, loss and optimizer ops are
  what the profiled count has in addition.
"""
import math
import time

import keras
import tensorflow as tf
from tensorflow.python.profiler import option_builder

from bench import workload


def training_flops_per_image(info, batch_size: int) -> dict[str, float]:
  model = workload.build_model(info)
  step = workload.train_step(model).get_concrete_function(
      tf.TensorSpec([batch_size, *info.image_shape], tf.float32),
      tf.TensorSpec([batch_size], tf.int64))
  return {"profiled": _profiled(step.graph) / batch_size,
          "analytic": _analytic(model)}


def _profiled(graph) -> float:
  options = option_builder.ProfileOptionBuilder(
      option_builder.ProfileOptionBuilder.float_operation()
  ).with_empty_output().build()
  logger = tf.get_logger()
  level = logger.level
  logger.setLevel("ERROR")  # the profiler's own use of deprecated v1 calls
  try:
    root = tf.compat.v1.profiler.profile(graph=graph, options=options,
                                         cmd="graph")
  finally:
    logger.setLevel(level)
  total = 0
  pending = list(root.children)
  while pending:
    node = pending.pop()
    pending.extend(node.children)
    op = graph.get_operation_by_name(node.name)
    if any(output.consumers() for output in op.outputs):
      total += node.float_ops
  return float(total)


def _analytic(model: keras.Model) -> float:
  forward = input_gradients = 0
  for layer in model.layers:
    if isinstance(layer, keras.layers.Conv2D):
      height, width = layer.output.shape[1:3]
      flops = 2 * height * width * math.prod(layer.kernel.shape)
    elif isinstance(layer, keras.layers.Dense):
      flops = 2 * math.prod(layer.kernel.shape)
    else:
      continue
    if forward:  # the first layer's input is the images: no gradient
      input_gradients += flops
    forward += flops
  weight_gradients = forward
  return float(forward + weight_gradients + input_gradients)


def matmul_peak(size: int, repeats: int) -> float:
  """The best float32 FLOP/s of `size`-square matmuls on every core."""
  a = tf.random.normal([size, size])
  b = tf.random.normal([size, size])
  tf.matmul(a, b).numpy()  # warm-up: thread pools, kernel selection
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    tf.matmul(a, b).numpy()
    best = min(best, time.perf_counter() - start)
  return 2 * size**3 / best
