"""Tasks other than classification keep every guarantee, on two processes.

Two launches of `horovodrun -np 2`: the worker (tests/workers/task_runs.py:
regression, segmentation, reconstruction, a GAN and CosmoFlow's volumes,
each straight through and resumed; a diverged regression; a damaged
volume), and the command
line with a user's task from a file (examples/focal_task.py), whose
model_dir the tests read with TensorBoard's reader, engine.runs, the
SavedModel loader and engine.evaluate.
"""
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from engine import runs
from engine.core import cpu
from engine.datasets import record_features
from engine.tools import make_volumes
from tests import fixtures

WORKER = os.path.join(fixtures.REPO, "tests", "workers", "task_runs.py")
# 16^3 volumes of 2 channels, 2 a file: 12 training files, 5 validation
# files (3 on rank 0, 2 on rank 1: uneven).
VOLUMES = dict(size=16, channels=2, train=24, validation=10,
               samples_per_file=2, seed=3)
DAMAGED_FILE = "{}/validation/cosmo_00003.tfrecord.gz"
FOCAL = "examples/focal_task.py:FocalLoss"


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
  out = tmp_path_factory.mktemp("tasks")
  arrays = fixtures.write_regression_arrays(str(out / "targets.npz"),
                                           num_train=193)
  fashion_mnist = fixtures.write_fashion_mnist(str(out / "fashion_mnist"),
                                               101, 37)
  volumes, damaged = (str(out / name) for name in ("volumes_data", "damaged"))
  for directory in (volumes, damaged):
    make_volumes.write(directory, **VOLUMES)
  with tf.io.TFRecordWriter(DAMAGED_FILE.format(damaged), "GZIP") as writer:
    writer.write(make_volumes.example(
        np.zeros((16, 16, 16, 2), np.int16), np.zeros(3, np.float32)))
  (out / "stage").mkdir()
  result = fixtures.launch([WORKER, str(out), arrays, fashion_mnist, volumes,
                            damaged], processes=2)
  assert result.returncode == 0, result.stderr[-3000:]
  return out, [json.loads((out / f"rank{r}.json").read_text())
               for r in range(2)]


@pytest.fixture(scope="module")
def regression(worker):
  out, ranks = worker
  return out, [rank["regression"] for rank in ranks]


@pytest.fixture(scope="module",
                params=["regression", "segmentation", "reconstruction",
                        "gan", "volumes"])
def each_task(worker, request):
  out, ranks = worker
  return out, request.param, [rank[request.param] for rank in ranks]


@pytest.fixture(scope="module")
def focal(tmp_path_factory):
  out = tmp_path_factory.mktemp("focal")
  data_dir = fixtures.write_fashion_mnist(str(out / "data"), 301, 53)
  model_dir = out / "run"
  result = fixtures.launch(
      ["-m", "engine.train", f"--task={FOCAL}", f"--data_dir={data_dir}",
       "--epochs=2", "--batch_size=16", "--filters=4", "--progress=none",
       f"--model_dir={model_dir}"], processes=2)
  assert result.returncode == 0, result.stderr[-3000:]
  return model_dir, result


def test_weights_are_identical_on_every_rank(each_task):
  _, _, ranks = each_task
  assert [r["max_weight_difference_across_ranks"] for r in ranks] == [0, 0]


def test_figures_are_exactly_the_whole_test_splits(each_task):
  _, task, ranks = each_task
  named = {"regression": {"val_mae", "val_rmse", "val_r2",
                          "val_mae/brightness", "val_r2/top"},
           "segmentation": {"val_pixel_accuracy", "val_mean_iou",
                            "val_iou/background", "val_iou/Ankle boot"},
           "reconstruction": {"val_mse", "val_mae", "val_psnr"},
           "gan": {"val_fooled", "val_real_accuracy", "train_generator_loss"},
           "volumes": {"val_mae", "val_rmse", "val_r2", "val_mae/amplitude",
                       "val_mae/slope", "val_r2/nonlinearity"}}
  for rank in ranks:
    reported = rank["history"][-1]
    for name, value in rank["whole_split"].items():
      if value is None:  # the IoU of a class in no mask nor prediction
        assert reported[f"val_{name}"] is None, name
      else:
        assert reported[f"val_{name}"] == pytest.approx(value, rel=1e-5), \
            name
    assert named[task] <= reported.keys()
  assert ranks[0]["history"][-1]["best_metric"] == {
      "regression": "val_mae:min", "segmentation": "val_mean_iou:max",
      "reconstruction": "val_psnr:max", "gan": "val_fooled:max",
      "volumes": "val_mae:min"}[task]
  figures = [[{k: v for k, v in record.items()
               if k.startswith(("train_", "val_"))}
              for record in rank["history"]] for rank in ranks]
  assert figures[0] == figures[1]


def test_regression_learns_the_targets_the_images_carry(regression):
  _, ranks = regression
  first, *_, last = ranks[0]["history"]
  assert last["val_mae"] < first["val_mae"]
  assert last["val_r2"] > max(first["val_r2"], 0.1)


def test_a_resumed_run_continues_exactly(each_task):
  out, task, ranks = each_task
  assert [r["resumed_weight_difference"] for r in ranks] == [0, 0]
  straight, resumed = (
      [{k: v for k, v in r.items() if k.startswith(("train_", "val_"))
        or k in ("epoch", "global_step")} for r in
       runs.read_run(str(out / name)).records]
      for name in (task, task + "_resumed"))
  assert len(straight) == len(ranks[0]["history"]) and resumed == straight


def test_a_diverging_regression_stops_on_every_rank(regression):
  out, ranks = regression
  for rank in ranks:
    assert rank["diverged"].startswith("training diverged at global step")
  records = runs.read_run(str(out / "diverged"))
  assert records.state == "diverged"


def test_the_regression_model_dir_records_the_targets_statistics(
    regression):
  out, _ = regression
  recorded = json.loads((out / "regression" / "normalization.json")
                        .read_text())
  targets = np.load(out / "targets.npz")["y_train"].astype(np.float64)
  np.testing.assert_allclose(recorded["target_mean"], targets.mean(axis=0))
  np.testing.assert_allclose(recorded["target_std"], targets.std(axis=0))


def test_the_regression_export_serves_predictions_in_the_targets_units(
    regression):
  out, ranks = regression
  exported = tf.saved_model.load(str(out / "regression" / "export" /
                                     "final"))
  arrays = np.load(out / "targets.npz")
  served = exported.signatures["serving_default"](
      images=tf.constant(arrays["x_test"][..., None]))
  predictions = served["predictions"].numpy()
  assert predictions.shape == (31, 2)
  mae = np.abs(predictions - arrays["y_test"]).mean()
  assert mae == pytest.approx(ranks[0]["history"][-1]["val_mae"], rel=1e-4)


def scalar_tags(model_dir, run):
  tags = set()
  for path in (model_dir / "tensorboard" / run).glob("events.*"):
    for event in tf.compat.v1.train.summary_iterator(str(path)):
      tags |= {value.tag for value in event.summary.value}
  return tags


def test_a_users_task_reaches_every_report(focal):
  model_dir, result = focal
  records = [json.loads(line) for line in
             (model_dir / "metrics.jsonl").read_text().splitlines()]
  assert [r["epoch"] for r in records] == [1, 2]
  assert {"train_top2_accuracy", "val_top2_accuracy"} <= records[-1].keys()
  assert records[-1]["best_metric"] == "val_top2_accuracy:max"
  assert "epoch_top2_accuracy" in scalar_tags(model_dir, "train")
  assert "epoch_top2_accuracy" in scalar_tags(model_dir, "validation")
  assert "best_val_top2_accuracy" in scalar_tags(model_dir, "")
  assert "top2_accuracy" in result.stderr.split("epoch 2/2")[1]
  assert f"--task={FOCAL}" in (model_dir / "flags.txt").read_text()


def test_the_hparams_carry_the_task(focal):
  model_dir, _ = focal
  [path] = (model_dir / "tensorboard").glob("events.*")
  plugin_data = b"".join(
      value.metadata.plugin_data.content
      for event in tf.compat.v1.train.summary_iterator(str(path))
      for value in event.summary.value
      if value.metadata.plugin_data.plugin_name == "hparams")
  assert FOCAL.encode() in plugin_data


def test_the_runs_table_shows_the_deciding_figure(focal, regression):
  model_dir, _ = focal
  out, _ = regression
  found = runs.find_runs([str(model_dir), str(out / "regression")])
  table = runs.table({label: runs.read_run(path)
                      for label, path in found.items()})
  header, *rows = table.splitlines()
  assert "metric" in header.split()
  assert any("val_top2_accuracy" in row for row in rows)
  assert any("val_mae" in row for row in rows)


def test_the_users_task_exports_without_its_code_and_evaluates(focal):
  model_dir, _ = focal
  served = fixtures.launch(["-c", (
      "import sys, numpy as np, tensorflow as tf\n"
      f"m = tf.saved_model.load({str(model_dir / 'export' / 'best')!r})\n"
      "out = m.signatures['serving_default'](\n"
      "    images=tf.zeros([3, 28, 28, 1], tf.uint8))\n"
      "print(sorted(out), out['outputs'].shape)\n"
      "assert 'user_code' not in ' '.join(sys.modules)\n")])
  assert served.returncode == 0, served.stderr[-2000:]
  assert "['outputs'] (3, 10)" in served.stdout
  evaluated = fixtures.launch(["-m", "engine.evaluate",
                               f"--model_dir={model_dir}",
                               "--checkpoint=best"])
  assert evaluated.returncode == 0, evaluated.stderr[-2000:]
  records = [json.loads(line) for line in
             (model_dir / "metrics.jsonl").read_text().splitlines()]
  best = max(r["val_top2_accuracy"] for r in records)
  assert f"test top2_accuracy {best:.4f} (53 examples)" in evaluated.stdout


@pytest.mark.parametrize("task, pictures", [
    ("segmentation", ["confusion_matrix", "masks"]),
    ("reconstruction", ["reconstructions"]), ("gan", ["samples"])])
def test_the_task_draws_test_examples_in_tensorboard_each_epoch(
    worker, task, pictures):
  out, _ = worker
  [events] = (out / task / "tensorboard" / "validation").glob("events.*")
  drawn = [(value.tag, event.step) for event in
           tf.compat.v1.train.summary_iterator(str(events))
           for value in event.summary.value
           if value.metadata.plugin_data.plugin_name == "images"]
  assert sorted(drawn) == [(tag, epoch) for tag in pictures
                           for epoch in (1, 2)]


def test_the_denoiser_exports_restored_images(worker):
  out, _ = worker
  exported = tf.saved_model.load(str(out / "reconstruction" / "export" /
                                     "final"))
  served = exported.signatures["serving_default"](
      images=tf.fill([2, 28, 28, 1], tf.constant(200, tf.uint8)))
  restored = served["images"].numpy()
  assert restored.shape == (2, 28, 28, 1)
  assert 0 <= restored.min() and restored.max() <= 255


def test_the_gan_exports_its_generator(worker):
  out, _ = worker
  exported = tf.saved_model.load(str(out / "gan" / "export" / "best"))
  served = exported.signatures["serving_default"](
      noise=tf.random.normal([3, 8]))
  assert served["images"].shape == (3, 28, 28, 1)


def test_the_gan_checkpoints_both_optimizers(worker):
  out, _ = worker
  names = [name for name, _ in tf.train.list_variables(
      str(out / "gan" / "checkpoints"))]
  for optimizer in ("generator", "discriminator"):
    assert any(name.startswith(f"optimizer_variables/{optimizer}_")
               for name in names)


def test_each_process_stages_its_share_once_and_a_rerun_copies_nothing(
    worker):
  out, _ = worker
  data_dir = out / "volumes_data"
  sources = sorted(p.relative_to(data_dir) for p in data_dir.glob("*/*.gz"))
  assert len(sources) == 17
  (folder,) = (out / "stage").iterdir()
  assert sorted(p.relative_to(folder) for p in folder.glob("*/*")) == sources
  size = sum(os.path.getsize(data_dir / p) for p in sources)
  staged = [[r for r in map(json.loads, (out / name / "metrics.jsonl")
                            .read_text().splitlines())
             if r.get("event") == "staged"]
            for name in ("volumes", "volumes_resumed")]
  # Straight through; then stopped after epoch 1, and resumed: 3 starts.
  assert [[(r["files"], r["bytes"], r["copied_bytes"]) for r in starts]
          for starts in staged] == [[(17, size, size)],
                                    [(17, size, 0), (17, size, 0)]]
  assert all(r["seconds"] >= 0 for starts in staged for r in starts)


def test_the_volumes_train_through_our_winograd_kernels(worker):
  # Their second block, 8^3 voxels from 16 channels; so every guarantee
  # above holds through them.
  out, ranks = worker
  assert [rank["volumes"]["by_winograd"] for rank in ranks] == [
      [False, True, False]] * 2
  # In the step that ran: the convolution, and the transforms and kernel
  # gradient its backward pass takes (models/kernels/winograd3d.cc).
  assert [rank["volumes"]["winograd_ops_in_step"] for rank in ranks] == [[
      "Winograd3DConv", "Winograd3DKernelGradient",
      "Winograd3DTransformKernel", "Winograd3DUntransformKernel"]] * 2
  # Each start's record names the build each rank loaded: the widest this
  # CPU runs (models/winograd3d.py).
  widest = "avx512" if "avx512f" in cpu.features() else "avx2"
  kernels = [[r for r in map(json.loads, (out / name / "metrics.jsonl")
                             .read_text().splitlines())
              if r.get("event") == "cpu_kernels"]
             for name in ("volumes", "volumes_resumed")]
  assert [[(r["blocks"], r["choice"], r["by_rank"]) for r in starts]
          for starts in kernels] == [
              [(1, "auto", [f"winograd3d_{widest}"] * 2)]] + [
              [(1, "auto", [f"winograd3d_{widest}"] * 2)] * 2]


def test_the_volumes_export_takes_stored_counts(worker):
  out, ranks = worker
  exported = tf.saved_model.load(str(out / "volumes" / "export" / "final"))
  spec = record_features.spec_of(str(out / "volumes_data"), "")
  volumes, targets = [], []
  for path in sorted((out / "volumes_data" / "validation").glob("*")):
    for volume, target in record_features.records(
        str(path), "GZIP").map(spec.decode):
      volumes.append(volume.numpy())
      targets.append(target.numpy())
  served = exported.signatures["serving_default"](
      images=tf.constant(np.stack(volumes)))["predictions"].numpy()
  assert served.shape == (10, 4)
  mae = np.abs(served - np.stack(targets)).mean()
  assert mae == pytest.approx(ranks[0]["volumes"]["history"][-1]["val_mae"],
                              rel=1e-4)


def test_a_damaged_volume_is_named_on_every_rank_touching_nothing(worker):
  out, ranks = worker
  path = DAMAGED_FILE.format(out / "damaged")
  for rank in ranks:
    assert rank["volumes"]["damaged"] == (
        f"{path}: record 0: field y holds 3 values; the spec y:float32:4 "
        "takes 4 values")
    assert rank["volumes"]["damaged_model_dir_made"] is False
