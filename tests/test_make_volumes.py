"""engine.tools.make_volumes: CosmoFlow-style volumes whose targets can be
learnt from them."""
import glob
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from engine.core.errors import UserError
from engine.tools import make_volumes
from tests import fixtures

SIZE = 16


def cosmoflow_parse(record, shape):
  """CosmoFlow's own parse of a record (MLPerf HPC's cosmoflow data.py)."""
  features = tf.io.parse_single_example(record, {
      "x": tf.io.FixedLenFeature([], tf.string),
      "y": tf.io.FixedLenFeature([4], tf.float32)})
  x = tf.reshape(tf.io.decode_raw(features["x"], tf.int16), shape)
  return x, features["y"]


def read(path, compression_type="GZIP", shape=(SIZE, SIZE, SIZE, 4)):
  """(x, y) of each record of one file, as numpy arrays."""
  return [(x.numpy(), y.numpy()) for x, y in
          tf.data.TFRecordDataset(path, compression_type=compression_type).map(
              lambda record: cosmoflow_parse(record, shape))]


def files(out, split):
  return sorted(glob.glob(os.path.join(out, split, "*")))


def contents(out):
  """Every file under out, hidden ones too: name -> bytes."""
  found = {}
  for directory, _, names in os.walk(out):
    for name in names:
      path = os.path.join(directory, name)
      with open(path, "rb") as f:
        found[os.path.relpath(path, out)] = f.read()
  return found


def test_the_layout_is_cosmoflows(tmp_path):
  out = str(tmp_path / "volumes")
  manifest = make_volumes.write(out, size=SIZE, train=5, validation=3)
  assert [os.path.basename(p) for p in files(out, "train")] == [
      f"cosmo_{i:05d}.tfrecord.gz" for i in range(5)]
  assert len(files(out, "validation")) == 3
  with open(os.path.join(out, "features.txt")) as f:
    assert f.read() == "x:raw_int16:16x16x16x4\ny:float32:4\n"
  with open(os.path.join(out, "classes.txt")) as f:
    assert f.read().split() == ["amplitude", "slope", "smoothing",
                                "nonlinearity"]
  with open(os.path.join(out, "volumes.json")) as f:
    assert json.load(f) == manifest
  assert manifest["examples"] == manifest["files"] == {"train": 5,
                                                       "validation": 3}
  assert [p["name"] for p in manifest["parameters"]] == [
      "amplitude", "slope", "smoothing", "nonlinearity"]
  assert all(p["low"] < p["high"] for p in manifest["parameters"])
  for split, count in (("train", 5), ("validation", 3)):
    for index, path in enumerate(files(out, split)):
      (x, y), = read(path)
      assert x.dtype == np.int16 and x.min() >= 0
      assert y.dtype == np.float32 and y.shape == (4,)
      assert np.all(np.abs(y) <= 1)
      expected_x, expected_y = make_volumes.sample(0, split, index, size=SIZE,
                                                   channels=4)
      np.testing.assert_array_equal(x, expected_x)
      np.testing.assert_array_equal(y, expected_y)
    assert index == count - 1
  # Nothing left under a temporary name.
  assert not [name for name in contents(out) if ".tmp-" in name]


def test_the_counts_are_particle_counts_of_a_few_hundred_at_most():
  volumes = [make_volumes.sample(0, "train", i, size=SIZE, channels=4)[0]
             for i in range(20)]
  counts = np.stack(volumes)
  assert 30 < np.median(counts) < 70
  assert 100 < np.percentile(counts, 99) < 1000


def test_the_same_seed_gives_the_same_bytes_another_seed_others(tmp_path):
  runs = {name: str(tmp_path / name) for name in ("a", "b", "c")}
  for name, seed in (("a", 0), ("b", 0), ("c", 1)):
    make_volumes.write(runs[name], size=SIZE, train=3, validation=2,
                       seed=seed)
  a, b, c = (contents(runs[name]) for name in ("a", "b", "c"))
  assert a == b
  volumes = [name for name in a if name.endswith(".tfrecord.gz")]
  assert len(volumes) == 5
  assert all(a[name] != c[name] for name in volumes)
  # The splits are drawn apart: validation is not train again.
  (_, train_y), = read(os.path.join(runs["a"], "train",
                                    "cosmo_00000.tfrecord.gz"))
  (_, validation_y), = read(os.path.join(runs["a"], "validation",
                                         "cosmo_00000.tfrecord.gz"))
  assert train_y.tolist() != validation_y.tolist()


def test_samples_per_file_leaves_the_last_file_short(tmp_path):
  out = str(tmp_path / "volumes")
  manifest = make_volumes.write(out, size=SIZE, channels=2, train=10,
                                validation=1, samples_per_file=4)
  assert manifest["files"] == {"train": 3, "validation": 1}
  shape = (SIZE, SIZE, SIZE, 2)
  stored = [read(path, shape=shape) for path in files(out, "train")]
  assert [len(records) for records in stored] == [4, 4, 2]
  for index, (x, y) in enumerate(r for records in stored for r in records):
    expected_x, expected_y = make_volumes.sample(0, "train", index,
                                                 size=SIZE, channels=2)
    np.testing.assert_array_equal(x, expected_x)
    np.testing.assert_array_equal(y, expected_y)


@pytest.mark.parametrize("compression, compression_type",
                         [("zlib", "ZLIB"), ("none", "")])
def test_zlib_and_uncompressed_files_are_readable(tmp_path, compression,
                                                  compression_type):
  out = str(tmp_path / "volumes")
  make_volumes.write(out, size=8, train=2, validation=1,
                     compression=compression)
  assert [os.path.basename(p) for p in files(out, "train")] == [
      "cosmo_00000.tfrecord", "cosmo_00001.tfrecord"]
  (x, y), = read(files(out, "train")[1], compression_type, (8, 8, 8, 4))
  expected_x, expected_y = make_volumes.sample(0, "train", 1, size=8,
                                               channels=4)
  np.testing.assert_array_equal(x, expected_x)
  np.testing.assert_array_equal(y, expected_y)


def test_a_rerun_overwrites_and_other_flags_or_data_are_refused(tmp_path):
  out = str(tmp_path / "volumes")
  make_volumes.write(out, size=8, train=2, validation=1)
  first = contents(out)
  make_volumes.write(out, size=8, train=2, validation=1)
  assert contents(out) == first
  with pytest.raises(UserError, match="holds volumes made otherwise"):
    make_volumes.write(out, size=8, train=3, validation=1)
  other = tmp_path / "other"
  (other / "train").mkdir(parents=True)
  (other / "train" / "mine.tfrecord").write_bytes(b"someone's data")
  with pytest.raises(UserError, match="holds other data .*mine.tfrecord"):
    make_volumes.write(str(other), size=8, train=2, validation=1)


@pytest.mark.parametrize("settings, message", [
    (dict(size=4), "--size=4: must be at least 8"),
    (dict(train=0), "--train=0: must be at least 1"),
    (dict(seed=-1), "--seed=-1: must be at least 0"),
    (dict(compression="lz4"), "--compression=lz4: must be one of gzip"),
])
def test_bad_settings_are_named(tmp_path, settings, message):
  with pytest.raises(UserError, match=message):
    make_volumes.write(str(tmp_path / "volumes"), **settings)
  assert not os.path.exists(tmp_path / "volumes")


def statistics(counts):
  """Summaries of a volume a physicist would look at first, on
  log(1 + counts) as CosmoFlow trains on: per channel the log-variance and
  the skewness; of the latest channel the log-power in four bands of |k|
  and the gradient energy relative to the variance (smoothness)."""
  x = np.log1p(counts.astype(np.float64))
  centered = x - x.mean(axis=(0, 1, 2))
  variance = (centered ** 2).mean(axis=(0, 1, 2))
  skewness = (centered ** 3).mean(axis=(0, 1, 2)) / variance ** 1.5
  latest = centered[..., 0]
  k = make_volumes.wavenumbers(latest.shape[0])
  power = np.abs(np.fft.rfftn(latest)) ** 2
  edges = (1e-9, 0.8, 1.6, 2.4, np.inf)  # radians per voxel
  bands = [np.log(power[(k > low) & (k <= high)].mean())
           for low, high in zip(edges[:-1], edges[1:])]
  gradient = sum((np.roll(latest, 1, axis) - latest) ** 2
                 for axis in range(3)).mean()
  return dict(log_variance=np.log(variance), skewness=skewness,
              bands=np.array(bands),
              smoothness=np.log(gradient / variance[0]))


def test_each_parameter_moves_its_own_statistic():
  """With the same noise, raising one parameter from its low to its high
  end raises the variance (amplitude), tilts the power to high |k|
  (slope), smooths the field (smoothing), skews it (nonlinearity)."""
  middle = [(p.low + p.high) / 2 for p in make_volumes.PARAMETERS]
  measures = {
      "amplitude": lambda s: s["log_variance"][0],
      "slope": lambda s: s["bands"][-1] - s["bands"][0],
      "smoothing": lambda s: -s["smoothness"],
      "nonlinearity": lambda s: s["skewness"][0],
  }
  for index, parameter in enumerate(make_volumes.PARAMETERS):
    measured = []
    for value in np.linspace(parameter.low, parameter.high, 3):
      params = list(middle)
      params[index] = value
      counts = make_volumes.volume(params, 32, 4, np.random.default_rng(7))
      measured.append(measures[parameter.name](statistics(counts)))
    assert measured == sorted(measured), (parameter.name, measured)


@pytest.mark.parametrize("size, minimum", [(16, 0.7), (32, 0.85)])
def test_the_targets_can_be_learnt_from_simple_statistics(size, minimum):
  """A linear least-squares fit from the statistics to the 4 targets, on
  volumes it was not fitted to: R^2 well above chance for every target."""
  fitted, held_out = 128, 64
  samples = [make_volumes.sample(0, "train", i, size=size, channels=4)
             for i in range(fitted + held_out)]
  features = np.array([np.concatenate([np.ravel(v) for v in
                                       statistics(counts).values()] + [[1]])
                       for counts, _ in samples])
  targets = np.array([t for _, t in samples])
  weights, *_ = np.linalg.lstsq(features[:fitted], targets[:fitted],
                                rcond=None)
  truth = targets[fitted:]
  error = ((features[fitted:] @ weights - truth) ** 2).sum(axis=0)
  r2 = 1 - error / ((truth - truth.mean(axis=0)) ** 2).sum(axis=0)
  assert np.all(r2 > minimum), r2


def test_the_command_line_writes_volumes_and_names_what_it_needs(tmp_path):
  out = tmp_path / "volumes"
  result = fixtures.launch(["-m", "engine.tools.make_volumes",
                            f"--output_dir={out}", "--size=8", "--train=3",
                            "--validation=2", "--samples_per_file=2"],
                           timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  assert "make_volumes: 5/5 volumes" in result.stderr
  assert (f"{out}: 3 training and 2 validation volumes of 8x8x8x4 in 2 + 1 "
          "files" in result.stdout)
  assert (out / "features.txt").read_text() == "x:raw_int16:8x8x8x4\n" \
      "y:float32:4\n"
  assert [len(read(p, shape=(8, 8, 8, 4))) for p in files(out, "train")] == [
      2, 1]
  missing = fixtures.launch(["-m", "engine.tools.make_volumes"], timeout=120)
  assert missing.returncode == 2
  assert missing.stderr.strip().splitlines() == [
      "make_volumes: error: --output_dir=DIR is required"]
