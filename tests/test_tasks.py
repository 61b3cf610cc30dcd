"""engine.tasks: the task interface, its checks, and the built-in tasks'
figures, in one process (tests/test_task_runs.py trains them on two)."""
import dataclasses
import os

import numpy as np
import pytest
import keras
import tensorflow as tf

from engine import build
from engine import tasks
from engine.compute import metrics
from engine.core.errors import UserError
from engine.datasets import arrays
from engine.datasets import DatasetInfo
from engine.datasets import Augmentation, Epochs, Shard
from engine.loop import stopping
from engine.tasks.classification import confusion_image
from tests import fixtures

CLASSES = DatasetInfo(name="shapes", image_shape=(8, 8, 1), num_classes=3,
                      num_train=10, num_test=5, mean=(0.0,), std=(1.0,))
TARGETS = DatasetInfo(name="gauges", image_shape=(8, 8, 1), num_classes=0,
                      num_train=10, num_test=5, mean=(0.0,), std=(1.0,),
                      label_shape=(2,), label_dtype="float32",
                      label_mean=(10.0, -3.0), label_std=(2.0, 0.5),
                      class_names=("speed", "angle"))


def dense_model(outputs: int) -> keras.Model:
  inputs = keras.Input((8, 8, 1))
  return keras.Model(inputs, keras.layers.Dense(outputs)(
      keras.layers.Flatten()(inputs)))


def test_regression_figures_are_the_whole_sets_over_uneven_batches():
  task = tasks.build("regression", TARGETS)
  rng = np.random.default_rng(0)
  labels = rng.normal([10.0, -3.0], [2.0, 0.5], (23, 2)).astype(np.float32)
  outputs = rng.normal(size=(23, 2)).astype(np.float32)
  totals = metrics.Totals("regression", task)
  for batch in np.split(np.arange(23), [7, 16]):  # 7, 9 and 7 examples
    loss = task.loss(labels[batch], outputs[batch])
    totals.update(tf.constant(labels[batch]), tf.constant(outputs[batch]),
                  loss)
  figures = totals.result_of(totals.local_sums()).figures
  predictions = outputs * [2.0, 0.5] + [10.0, -3.0]  # in the targets' units
  error = predictions - labels
  r2 = 1 - (error ** 2).sum(0) / ((labels - labels.mean(0)) ** 2).sum(0)
  standardized = (labels - [10.0, -3.0]) / [2.0, 0.5]
  assert figures["loss"] == pytest.approx(
      ((outputs - standardized) ** 2).mean(), rel=1e-5)
  assert figures["mae"] == pytest.approx(np.abs(error).mean(), rel=1e-5)
  assert figures["rmse"] == pytest.approx(np.sqrt((error ** 2).mean()),
                                          rel=1e-5)
  assert figures["r2"] == pytest.approx(r2.mean(), rel=1e-4)
  assert figures["mae/angle"] == pytest.approx(np.abs(error[:, 1]).mean(),
                                               rel=1e-5)
  assert figures["r2/speed"] == pytest.approx(r2[0], rel=1e-4)


@pytest.mark.parametrize("loss, expected", [
    ("mae", 1.5), ("huber", (0.5 + 1.5) / 2), ("mse", (1.0 + 4.0) / 2)])
def test_regression_losses_on_standardized_targets(loss, expected):
  task = tasks.build("regression", TARGETS, loss=loss)
  # Outputs 1 and 2 stds from the targets.
  labels = tf.constant([[10.0, -3.0]])
  assert float(task.loss(labels, tf.constant([[1.0, -2.0]]))[0]) == \
      pytest.approx(expected)


def test_targets_as_stored_when_not_standardized():
  task = tasks.build("regression", TARGETS, standardize_targets=False)
  labels = tf.constant([[10.0, -3.0]])
  outputs = tf.constant([[9.0, -1.0]])
  assert float(task.loss(labels, outputs)[0]) == pytest.approx(
      (1.0 + 4.0) / 2)
  np.testing.assert_array_equal(task.predictions(outputs), outputs)


def test_an_unknown_regression_loss_is_one_line():
  with pytest.raises(UserError, match=r"--loss=hinge: the regression task's "
                     "losses are mse, mae, huber"):
    tasks.build("regression", TARGETS, loss="hinge")


def test_the_deciding_figure_and_its_direction():
  regression = tasks.build("regression", TARGETS)
  assert str(tasks.Decider.of("val_mae:min", regression)) == "val_mae:min"
  assert tasks.Decider.of("mae", regression).minimize  # the task's own
  assert not tasks.Decider.of("val_r2:max", regression).minimize
  with pytest.raises(UserError, match="--best_metric=val_r2: give a "
                     "validation figure and whether higher or lower"):
    tasks.Decider.of("val_r2", regression, flag="best_metric")
  decider = tasks.Decider.of("val_mae:min", regression)
  assert decider.score(0.5) > decider.score(0.7)
  assert decider.reached(0.1, 0.2) and not decider.reached(0.3, 0.2)


@pytest.mark.parametrize("changes, message", [
    (dict(task=dict(name="regression", best_metric="val_accuracy:max")),
     r"--best_metric=val_accuracy:max: the regression task's figures are "
     r"val_loss, val_mae, val_rmse"),
    (dict(task=dict(name="regression"),
          training=dict(target=0.9, target_accuracy=True)),
     "--target_accuracy: this run is decided by val_mae; give its target as "
     "--target"),
])
def test_flags_a_task_cannot_honour_are_one_line(changes, message):
  config = fixtures.train_config(**changes)
  with pytest.raises(UserError, match=message):
    build.decider(config, tasks.build("regression", TARGETS))


def test_early_stopping_at_a_target_below_which_to_get():
  stop = stopping.Target(0.2, patience=2, minimize=True)
  stops = [stop.update(epoch=epoch, value=value,
                       cumulative_seconds=float(epoch))
           for epoch, value in enumerate([0.5, 0.2, 0.3, 0.1, 0.15], 1)]
  assert stops == [False, False, False, False, True]
  assert stop.first_reached_epoch == 2


@pytest.mark.parametrize("task, info, message", [
    ("regression", CLASSES, r"--task=regression learns float targets "
     r"\[N, k\]; shapes gives class ids"),
    ("classification", TARGETS, "--task=classification learns from class "
     r"ids, one integer per image; gauges gives labels of shape \[N, 2\] "
     "float32"),
])
def test_labels_of_the_wrong_kind_for_the_task_are_one_line(task, info,
                                                            message):
  with pytest.raises(UserError, match=message):
    tasks.build(task, info)


def test_views_are_not_averaged_for_a_task_without_an_average():
  from engine.compute import eval_step as eval_steps  # pylint: disable=import-outside-toplevel
  with pytest.raises(UserError, match="--eval_flip, --eval_shift: the "
                     "regression task has no average"):
    eval_steps.EvalStep(model=dense_model(2),
                        task=tasks.build("regression", TARGETS), flip=True)


GOOD_TASK = '''
import tensorflow as tf
from engine.tasks import Task


class Mean(Task):
  labels = "classes"

  def output_shape(self):
    return (3,)

  def loss(self, labels, outputs):
    return __LOSS__

  def sums(self):
    return __SUMS__

  def batch_sums(self, labels, outputs, loss):
    return __BATCH_SUMS__

  def figures(self, sums):
    return __FIGURES__
'''
GOOD = dict(LOSS="tf.reduce_mean(tf.square(outputs), axis=-1)",
            SUMS='{"loss": ()}',
            BATCH_SUMS='{"loss": tf.reduce_sum(loss)}',
            FIGURES='{"loss": sums["loss"] / sums["examples"]}')


def user_task(tmp_path, **changes) -> str:
  source = GOOD_TASK
  for name, value in {**GOOD, **changes}.items():
    source = source.replace(f"__{name}__", value)
  (tmp_path / "mine.py").write_text(source)
  return f"{tmp_path / 'mine.py'}:Mean"


def checked(spec):
  task = tasks.build(spec, CLASSES)
  tasks.check(task, spec, dense_model(3), (8, 8, 1))
  return task


def test_a_good_user_task_passes_its_checks(tmp_path):
  assert checked(user_task(tmp_path)).best_metric == "loss:min"


@pytest.mark.parametrize("changes, message", [
    (dict(LOSS="tf.reduce_mean(tf.square(outputs))"), r"loss must return "
     r"each example's float32 loss, \[batch\]; it returned float32 of shape "
     r"\[\] for a batch of 2"),
    (dict(LOSS="tf.cast(outputs[:, 0], tf.float64)"), "loss must return "
     r"each example's float32 loss, \[batch\]; it returned float64"),
    (dict(LOSS="outputs.nope"), r"loss\(\) raised AttributeError"),
    (dict(BATCH_SUMS='{"loss": loss}'), r"batch_sums gives 'loss' of "
     r"float32 of shape \[2\]; sums\(\) declares shape \[\]"),
    (dict(BATCH_SUMS='{"losses": tf.reduce_sum(loss)}'), r"batch_sums "
     r"returned \['losses'\]; it must return the sums declared by sums\(\): "
     r"\['loss'\]"),
    (dict(SUMS='{"loss": (), "examples": ()}'), "sums declares 'examples', "
     "which the engine counts itself"),
    (dict(FIGURES='{"mean": 1.0}'), r"figures returned \{'mean': 1.0\}; it "
     "must return a dict of figures including 'loss'"),
], ids=["scalar_loss", "float64_loss", "raises", "sum_shape", "sum_names",
        "examples", "no_deciding_figure"])
def test_a_bad_user_task_is_one_line_naming_it(tmp_path, changes, message):
  spec = user_task(tmp_path, **changes)
  with pytest.raises(UserError, match=f"--task={spec}: {message}"):
    checked(spec)


def test_a_user_task_missing_a_method_is_one_line(tmp_path):
  path = tmp_path / "partial.py"
  path.write_text("from engine.tasks import Task\n\n\n"
                  "class Partial(Task):\n"
                  "  def loss(self, labels, outputs):\n"
                  "    return outputs[:, 0]\n")
  with pytest.raises(UserError, match=f"--task={path}:Partial: Partial does "
                     "not define sums, batch_sums, figures"):
    tasks.build(f"{path}:Partial", CLASSES)


def test_a_user_tasks_keras2_model_is_one_line(tmp_path):
  # tf_keras (Keras 2) is no longer installed: a class of its modules
  # stands for its models.
  source = GOOD_TASK.replace("class Mean(Task):", """class Mean(Task):
  def build_model(self, build):
    import keras
    class Sequential(keras.Sequential):
      pass
    Sequential.__module__ = "tf_keras.src.engine.sequential"
    return Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                       keras.layers.Dense(3)])
""")
  for name, value in GOOD.items():
    source = source.replace(f"__{name}__", value)
  (tmp_path / "keras2.py").write_text(source)
  spec = f"{tmp_path / 'keras2.py'}:Mean"
  task = tasks.build(spec, CLASSES)
  with pytest.raises(UserError, match=f"--task={spec} built a Keras 2 model "
                     r"\(Sequential, from tf_keras\)"):
    tasks.build_model(task, spec, build=None)


def test_arrays_of_float_targets_are_read_as_targets(tmp_path):
  path = fixtures.write_regression_arrays(str(tmp_path / "t.npz"))
  splits = arrays.load(data_dir=path, array_keys=[], labels="targets")
  assert splits.info.label_shape == (2,)
  assert splits.info.label_dtype == "float32"
  assert splits.info.class_names == ("brightness", "top")
  assert splits.train.labels.shape == (97, 2)


def test_a_column_of_targets_is_one_target_a_row(tmp_path):
  path = str(tmp_path / "one.npz")
  np.savez(path, x_train=np.zeros((4, 8, 8), np.uint8),
           y_train=np.arange(4.0), x_test=np.zeros((2, 8, 8), np.uint8),
           y_test=np.arange(2.0))
  splits = arrays.load(data_dir=path, array_keys=[], labels="targets")
  assert splits.info.label_shape == (1,)


@pytest.mark.parametrize("y_test, message", [
    (np.zeros((2, 3)), "2 targets a row in y_train, 3 in y_test"),
    (np.array([[1.0, np.nan], [0.0, 0.0]]), "y_test: row 0 has NaN or "
     "infinite targets"),
    (np.zeros(3), "3 targets for 2 images in x_test"),
])
def test_bad_targets_are_one_line(tmp_path, y_test, message):
  path = str(tmp_path / "bad.npz")
  np.savez(path, x_train=np.zeros((4, 8, 8), np.uint8),
           y_train=np.zeros((4, 2)), x_test=np.zeros((2, 8, 8), np.uint8),
           y_test=y_test)
  with pytest.raises(UserError, match=message):
    arrays.load(data_dir=path, array_keys=[], labels="targets")


def test_the_wrong_task_for_the_data_is_one_line_and_writes_nothing(
    tmp_path):
  model_dir = tmp_path / "run"
  result = fixtures.launch(["-m", "engine.train", "--task=regression",
                            "--dataset=synthetic", "--image_size=8",
                            f"--model_dir={model_dir}"])
  assert result.returncode == 2
  assert result.stderr.strip().splitlines()[-1] == (
      "engine.train: error: --task=regression learns float targets [N, k]; "
      "synthetic gives class ids (arrays: float y_train and y_test)")
  assert not os.path.exists(model_dir)


MASKS = DatasetInfo(name="pets", image_shape=(4, 4, 1), num_classes=3,
                    num_train=10, num_test=5, mean=(0.0,), std=(1.0,),
                    label_shape=(4, 4), label_dtype="uint8",
                    class_names=("background", "cat", "dog"))


def test_segmentation_figures_from_the_pixels_confusion_matrix():
  task = tasks.build("segmentation", MASKS, ignore_label=255)
  labels = np.array([[[0, 0, 1, 1]] * 4, [[2, 2, 255, 255]] * 4], np.uint8)
  predicted = np.array([[[0, 1, 1, 1]] * 4, [[2, 0, 1, 1]] * 4])
  outputs = tf.one_hot(predicted, 3) * 10.0
  totals = metrics.Totals("segmentation", task)
  totals.update(tf.constant(labels), outputs,
                task.loss(tf.constant(labels), outputs))
  figures = totals.result_of(totals.local_sums()).figures
  # 24 labelled pixels (the 8 of 255 ignored): 12 + 4 right.
  assert figures["pixel_accuracy"] == pytest.approx(16 / 24)
  # background: 4 right, 4 predicted from cat, 4 from dog: 4/12;
  # cat: 8 of 8 right and 4 more predicted: 8/12; dog: 4 of 8: 4/8.
  assert figures["iou/background"] == pytest.approx(4 / 12)
  assert figures["iou/cat"] == pytest.approx(8 / 12)
  assert figures["mean_iou"] == pytest.approx((4 / 12 + 8 / 12 + 4 / 8) / 3)
  # Keras' MeanIoU over the same pixels agrees.
  reference = keras.metrics.MeanIoU(3)
  keep = labels != 255
  reference.update_state(labels[keep], predicted[keep])
  assert figures["mean_iou"] == pytest.approx(float(reference.result()))
  # The loss: the mean over each image's labelled pixels only.
  assert task.loss(tf.constant(labels), outputs).shape == (2,)


def test_fashion_mnist_masks_label_each_garment_pixel_with_its_class(
    tmp_path):
  from engine.datasets import fashion_mnist  # pylint: disable=import-outside-toplevel
  data_dir = fixtures.write_fashion_mnist(str(tmp_path), 20, 10)
  classes = fashion_mnist.load(data_dir)
  splits = fashion_mnist.load(data_dir, labels="masks")
  assert splits.info.num_classes == 11
  assert splits.info.class_names[:2] == ("background", "T-shirt/top")
  masks, images = splits.train.labels, splits.train.images[..., 0]
  garment = images > fashion_mnist.MASK_THRESHOLD
  assert (masks[~garment] == 0).all()
  assert (masks == np.where(garment, classes.train.labels[:, None, None] + 1,
                            0)).all()


def test_masks_are_flipped_and_shifted_with_their_images():
  from engine import datasets  # pylint: disable=import-outside-toplevel
  from engine.datasets import Examples  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(0)
  images = rng.integers(0, 3, (32, 4, 4, 1)).astype(np.uint8) * 100
  masks = (images[..., 0] > 0).astype(np.uint8)
  info = dataclasses.replace(MASKS, num_train=32, shift_fill="constant")
  batches = datasets.train_stream(
      Examples(images, masks), info,
      shard=Shard(0, 1),
      epochs=Epochs(batch_size=8, steps=4, seed=1),
      augmentation=Augmentation(flip=True, shift=0.5),
      first_epoch=0)
  stored = {mask.tobytes() for mask in masks}
  moved = 0
  for batch_images, batch_masks in batches.take(4):
    assert ((batch_images.numpy()[..., 0] > 0) ==
            (batch_masks.numpy() == 1)).all()
    moved += sum(mask.tobytes() not in stored for mask in batch_masks.numpy())
  assert moved > 8  # flipped or shifted: no longer any stored mask


@pytest.mark.parametrize("y_test, message", [
    (np.zeros((2, 8, 4), np.int64), r"y_test: masks of shape \[2, 8, 4\] "
     r"for 2 images of 8x8 in x_test; give \[2, 8, 8\]"),
    (np.zeros((2, 8, 8)) + 0.5, "y_test: masks of type float64; give "
     "integer class ids"),
    (np.zeros((2, 8, 8), np.int64) - 1, "y_test: mask value -1 is out of "
     "range"),
])
def test_bad_masks_are_one_line(tmp_path, y_test, message):
  path = str(tmp_path / "bad.npz")
  np.savez(path, x_train=np.zeros((4, 8, 8), np.uint8),
           y_train=np.zeros((4, 8, 8), np.int64),
           x_test=np.zeros((2, 8, 8), np.uint8), y_test=y_test)
  with pytest.raises(UserError, match=message):
    arrays.load(data_dir=path, array_keys=[], labels="masks")


def test_segmentation_on_class_labels_is_one_line():
  with pytest.raises(UserError, match=r"--task=segmentation learns integer "
                     r"masks \[N, 8, 8\], a class per pixel of the images; "
                     "shapes gives class ids"):
    tasks.build("segmentation", CLASSES)


def test_the_unet_outputs_a_class_per_pixel():
  import models  # pylint: disable=import-outside-toplevel
  model = models.build("unet", input_shape=(28, 28, 1), num_classes=11,
                       output_shape=(28, 28, 11), filters=4)
  assert model.output_shape == (None, 28, 28, 11)
  assert [models.unet.levels(size) for size in
          ((28, 28), (32, 32), (7, 7), (256, 512))] == [2, 3, 0, 4]


def test_a_task_class_given_to_a_script_is_named_for_flags_txt():
  from engine.core import user_code  # pylint: disable=import-outside-toplevel
  from engine.tasks.segmentation import Segmentation  # pylint: disable=import-outside-toplevel
  spec = user_code.spec_of(Segmentation)
  assert spec == "engine.tasks.segmentation:Segmentation"
  assert isinstance(tasks.build(spec, MASKS), Segmentation)


PICTURES = DatasetInfo(name="faces", image_shape=(4, 4, 1), num_classes=2,
                       num_train=10, num_test=5, mean=(100.0,), std=(50.0,))


def test_each_image_has_its_own_noise_wherever_it_is():
  task = tasks.build("reconstruction", PICTURES, noise=0.5)
  images = tf.constant(np.random.default_rng(0).normal(size=(5, 4, 4, 1)),
                       tf.float32)
  noisy = task.noisy(images).numpy()
  # The same images, in another order and batch: the same noise each.
  again = task.noisy(tf.gather(images, [4, 2, 0])).numpy()
  np.testing.assert_array_equal(again, noisy[[4, 2, 0]])
  noise = noisy - images.numpy()
  assert 0.3 < noise.std() < 0.7
  assert not np.allclose(noise[0], noise[1])
  inputs, targets = task.inputs_and_targets(images, tf.zeros([5], tf.int64))
  np.testing.assert_array_equal(targets.numpy(), images.numpy())
  assert tasks.build("reconstruction", PICTURES, noise=0.0).noisy(
      images) is images


def test_reconstruction_figures_are_on_the_images_scale():
  task = tasks.build("reconstruction", PICTURES)
  rng = np.random.default_rng(1)
  targets = rng.normal(size=(6, 4, 4, 1)).astype(np.float32)
  outputs = rng.normal(size=(6, 4, 4, 1)).astype(np.float32)
  totals = metrics.Totals("reconstruction", task)
  for batch in (slice(0, 4), slice(4, 6)):
    totals.update(tf.constant(targets[batch]), tf.constant(outputs[batch]),
                  task.loss(targets[batch], outputs[batch]))
  figures = totals.result_of(totals.local_sums()).figures
  error = (outputs - targets) * 50.0  # on the 0-255 scale
  assert figures["mse"] == pytest.approx((error ** 2).mean(), rel=1e-5)
  assert figures["mae"] == pytest.approx(np.abs(error).mean(), rel=1e-5)
  assert figures["psnr"] == pytest.approx(
      10 * np.log10(255.0 ** 2 / (error ** 2).mean()), rel=1e-5)
  assert figures["loss"] == pytest.approx(((outputs - targets) ** 2).mean(),
                                          rel=1e-5)


SMALL = DatasetInfo(name="small", image_shape=(8, 8, 1), num_classes=2,
                    num_train=10, num_test=5, mean=(0.0,), std=(1.0,))


def tiny_gan_step():
  from engine import distributed  # pylint: disable=import-outside-toplevel
  from engine.compute import optimizers  # pylint: disable=import-outside-toplevel
  from engine.compute import task_step  # pylint: disable=import-outside-toplevel
  distributed.start_horovod()
  spec = "tests/workers/tiny_gan.py:TinyDCGAN"
  task = tasks.build(spec, SMALL)
  model = task.build_model(build=None)
  tasks.check(task, spec, model, SMALL.image_shape)
  optimizer = optimizers.Several({name: keras.optimizers.Adam(1e-3)
                                  for name in task.optimizers})
  return model, optimizer, task_step.TaskTrainStep(
      model=model, optimizer=optimizer, task=task)


def test_a_tasks_own_step_updates_each_model_with_its_optimizer():
  model, optimizer, step = tiny_gan_step()
  before = [v.numpy().copy() for v in model.trainable_variables]
  images = tf.random.normal([6, 8, 8, 1])
  for _ in range(2):
    assert fixtures.one_step(step, images,
                             tf.zeros([6], tf.int64)).stop_agreed is False
  assert step.traces == 1
  assert all(not np.array_equal(old, new.numpy())
             for old, new in zip(before, model.trainable_variables))
  assert [int(o.iterations) for o in optimizer.by_name.values()] == [2, 2]
  result = step.totals.result()
  assert result.examples == 12
  assert set(result.figures) == {"loss", "generator_loss", "real_accuracy",
                                 "fake_accuracy", "fooled"}


def test_a_tasks_own_step_applies_no_nonfinite_gradient():
  from engine.compute import step as steps  # pylint: disable=import-outside-toplevel
  model, optimizer, step = tiny_gan_step()
  discriminator = model.discriminator.trainable_variables
  before = [v.numpy().copy() for v in discriminator]
  # Real images of NaN: the discriminator's gradients are NaN (the
  # generator's, from its fakes alone, are not, and are applied).
  with pytest.raises(steps.NonFinite, match="the loss was non-finite on 1 "
                     "of 1 processes .* and the gradients of the task's "
                     "step were non-finite"):
    fixtures.one_step(step, tf.fill([6, 8, 8, 1], np.nan),
                      tf.zeros([6], tf.int64))
  for old, new in zip(before, discriminator):
    np.testing.assert_array_equal(old, new.numpy())
  # Each optimizer counted the step it skipped, as the built-in step does.
  assert [int(o.iterations) for o in optimizer.by_name.values()] == [1, 1]


def test_a_task_with_optimizers_but_no_step_is_one_line(tmp_path):
  path = tmp_path / "half.py"
  path.write_text(GOOD_TASK.replace("class Mean(Task):",
                                    "class Mean(Task):\n  optimizers = ('a',)")
                  .replace("__LOSS__", GOOD["LOSS"])
                  .replace("__SUMS__", GOOD["SUMS"])
                  .replace("__BATCH_SUMS__", GOOD["BATCH_SUMS"])
                  .replace("__FIGURES__", GOOD["FIGURES"]))
  with pytest.raises(UserError, match="Mean does not define "
                     "optimized_variables, train_step"):
    tasks.build(f"{path}:Mean", CLASSES)


def test_a_tasks_own_step_refuses_float16_and_accumulation():
  config = fixtures.train_config(
      task=dict(name="tests/workers/tiny_gan.py:TinyDCGAN"))
  task = tasks.build(config.task.name, SMALL)
  with pytest.raises(UserError, match="--mixed_precision=float16: a task "
                     "with its own train step has no loss scaling"):
    build.optimizer_and_step(config, "float16", "none", task,
                             task.build_model(None), 0.001)
  config = config.replace(performance=dict(grad_accum_steps=2))
  with pytest.raises(UserError, match="--grad_accum_steps: a task with its "
                     "own train step accumulates nothing"):
    build.optimizer_and_step(config, "none", "none", task,
                             task.build_model(None), 0.001)


def test_an_image_folder_with_masks_beside_its_images(tmp_path):
  from engine import datasets  # pylint: disable=import-outside-toplevel
  from engine.datasets import image_folder  # pylint: disable=import-outside-toplevel
  directory = fixtures.write_mask_folder(str(tmp_path))
  splits = image_folder.load(data_dir=directory, image_size=24, channels=3,
                             validation_split=0.0, skip_bad_files=False,
                             labels="masks")
  info = splits.info
  assert (info.num_classes, info.class_names) == (3, ("background", "bright",
                                                      "dark"))
  assert (info.label_shape, info.label_dtype) == ((24, 24), "uint8")
  assert (info.num_train, info.num_test) == (9, 5)
  # Masks resized (nearest) and flipped and shifted with their images.
  batches = datasets.train_stream(
      splits.train, info,
      shard=Shard(0, 1),
      epochs=Epochs(batch_size=3, steps=3, seed=0),
      augmentation=Augmentation(flip=True, shift=0.2),
      first_epoch=0)
  for images, masks in batches.take(3):
    pixels = images.numpy()[..., 0] * info.std[0] + info.mean[0]
    masks = masks.numpy()
    assert set(np.unique(masks)) <= {0, 1, 2}
    # Edges blend with the grey (images resize bilinearly, masks nearest).
    assert (pixels[masks == 1] > 160).all() and (pixels[masks == 2] < 100).all()
  [(images, masks)] = datasets.eval_batches(splits.test, info,
                                        shard=Shard(0, 1), batch_size=5)
  assert masks.shape == (5, 24, 24) and masks.dtype == tf.uint8


@pytest.mark.parametrize("damage, message", [
    ("missing", r"train/masks/003.png: missing, the mask of .*images/003.png"),
    ("size", r"train/masks/003.png: 5x5 pixels, but its image .* is 12x12"),
    ("palette", r"train/masks/003.png: a PNG image in mode P; masks are "
     "single-channel PNGs"),
    ("classes", r"classes.txt: missing; masks' classes are named there"),
])
def test_a_mask_folders_damage_is_one_line(tmp_path, damage, message):
  from PIL import Image  # pylint: disable=import-outside-toplevel
  from engine.datasets import image_folder  # pylint: disable=import-outside-toplevel
  directory = fixtures.write_mask_folder(str(tmp_path))
  mask = tmp_path / "train" / "masks" / "003.png"
  if damage == "missing":
    mask.unlink()
  elif damage == "size":
    Image.fromarray(np.zeros((5, 5), np.uint8), mode="L").save(mask)
  elif damage == "palette":
    Image.open(mask).convert("P").save(mask)
  else:
    (tmp_path / "classes.txt").unlink()
  with pytest.raises(UserError, match=message):
    image_folder.load(data_dir=directory, image_size=12, channels=3,
                      validation_split=0.0, skip_bad_files=False,
                      labels="masks")


def test_segmentation_trains_on_an_image_folder_with_masks(tmp_path):
  directory = fixtures.write_mask_folder(str(tmp_path / "data"))
  model_dir = tmp_path / "run"
  result = fixtures.launch([
      "-m", "engine.train", "--task=segmentation", "--model=unet",
      "--filters=4", "--dataset=image_folder", f"--data_dir={directory}",
      "--image_size=16", "--channels=3", "--batch_size=3", "--epochs=1",
      "--random_flip", "--progress=none", f"--model_dir={model_dir}"])
  assert result.returncode == 0, result.stderr[-2000:]
  import json  # pylint: disable=import-outside-toplevel
  [record] = [json.loads(line) for line in
              (model_dir / "metrics.jsonl").read_text().splitlines()]
  assert 0 <= record["val_mean_iou"] <= 1
  assert record["train_examples"] == 9


def test_fashion_mnist_for_regression_turns_each_image_by_its_target(
    tmp_path):
  from engine.datasets import Examples, Splits  # pylint: disable=import-outside-toplevel
  from engine.datasets import fashion_mnist  # pylint: disable=import-outside-toplevel
  # A bright horizontal bar through the centre of each image.
  images = np.zeros((40, 28, 28, 1), np.uint8)
  images[:, 13:15, 2:26] = 255
  bars = Examples(images, np.zeros(40, np.int64))
  info = dataclasses.replace(PICTURES, image_shape=(28, 28, 1), num_train=40,
                             num_test=40, num_classes=10)
  splits = fashion_mnist.angles(Splits(train=bars, test=bars, info=info))
  assert (splits.info.label_shape, splits.info.label_dtype) == ((1,),
                                                                "float32")
  assert splits.info.class_names == ("angle",)
  degrees = splits.train.labels[:, 0]
  assert np.abs(degrees).max() <= fashion_mnist.MAX_ANGLE
  assert degrees.std() > 15  # spread over the range
  assert not np.array_equal(splits.test.labels, splits.train.labels)
  # Each bar's direction (its bright pixels' principal axis) is its angle,
  # one way round.
  for image, angle in zip(splits.train.images[..., 0], degrees):
    y, x = np.nonzero(image > 128)
    axis = np.linalg.eigh(np.cov(np.stack([x - x.mean(), y - y.mean()])))[1]
    found = np.degrees(np.arctan2(axis[1, -1], axis[0, -1]))
    found = (found + 90) % 180 - 90  # a direction, not a heading
    assert abs(abs(found) - abs(angle)) < 4, (found, angle)
  signs = []
  for image, angle in zip(splits.train.images[..., 0], degrees):
    y, x = np.nonzero(image > 128)
    slope = np.polyfit(x - x.mean(), y - y.mean(), 1)[0]
    if abs(angle) > 5:
      signs.append(np.sign(slope) == np.sign(angle))
  assert all(signs) or not any(signs)  # the same way round for all
  again = fashion_mnist.angles(Splits(train=bars, test=bars, info=info))
  np.testing.assert_array_equal(again.train.labels, splits.train.labels)


def test_a_data_set_function_of_yours_gives_float_targets(tmp_path):
  from engine import datasets  # pylint: disable=import-outside-toplevel
  (tmp_path / "mine.py").write_text(
      "import numpy as np\n"
      "from engine.datasets import from_arrays\n\n\n"
      "def load():\n"
      "  rng = np.random.default_rng(0)\n"
      "  images = rng.integers(0, 255, (20, 8, 8), dtype=np.uint8)\n"
      "  targets = rng.normal(5.0, 2.0, (20, 3))\n"
      "  return from_arrays(images, targets, images[:6], targets[:6])\n")
  splits = datasets.load(f"{tmp_path}/mine.py:load", data_dir="",
                         model_dir=str(tmp_path), labels="targets")
  info = splits.info
  assert (info.label_shape, info.label_dtype) == ((3,), "float32")
  rng = np.random.default_rng(0)
  rng.integers(0, 255, (20, 8, 8), dtype=np.uint8)
  targets = rng.normal(5.0, 2.0, (20, 3)).astype(np.float32)
  np.testing.assert_allclose(info.label_mean, targets.mean(axis=0),
                             rtol=1e-6)
  np.testing.assert_allclose(info.label_std, targets.std(axis=0), rtol=1e-6)
  assert tasks.build("regression", info).output_shape() == (3,)


def test_the_confusion_matrix_is_drawn_row_by_row():
  counts = np.array([[3, 1, 0], [0, 0, 0], [0, 2, 2]], np.float64)
  image = confusion_image(counts, size=30)
  assert image.shape == (1, 30, 30, 3) and image.dtype == np.uint8
  cell = image[0, 5::10, 5::10, 0]  # the red channel at each cell's centre
  # Darker is larger: 3/4 < 1/4 < 0, and an empty row is white.
  assert cell[0, 0] < cell[0, 1] < cell[0, 2] == 255
  assert list(cell[1]) == [255, 255, 255]
  assert cell[2, 1] == cell[2, 2] < cell[2, 0]


def test_a_tasks_own_step_is_timed_in_the_phases_it_runs():
  """A profiled window's step of a task's own (a GAN's: two models, two
  optimizers) is timed as what the engine can see of it: the task's step
  as one phase, then the flags' allreduce (the stamps live in the step,
  not in the helpers the task calls); the phases fit inside the call, and
  the step trains as the plain one."""
  model, _, step = tiny_gan_step()
  images = tf.random.normal([6, 8, 8, 1])
  began = tf.timestamp()
  trained = fixtures.one_step(step, images, tf.zeros([6], tf.int64),
                              timed=True)
  call = float(tf.timestamp() - began)
  seconds = trained.phases
  assert not trained.stop_agreed
  assert list(seconds) == ["input", "task_step", "communication"]
  assert all(s >= 0 for s in seconds.values())
  assert 0 < sum(seconds.values()) <= call
  assert (step.traces, step.timed_traces) == (0, 1)
  assert step.totals.result().examples == 6
