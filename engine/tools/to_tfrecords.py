r"""Converts an image folder or arrays into sharded TFRecords, for speed at
scale.

  .venv/bin/python -m engine.tools.to_tfrecords --from=DIR --to=OUT --shards=N

writes OUT/train-00000-of-0000N, ..., OUT/validation-*, and OUT/classes.txt:
the ImageNet layout that `--dataset=tfrecord --data_dir=OUT` reads, with
the class names and count beside it. `--from` is an image folder
(train/<class>/, validation/<class>/, or --validation_split) or arrays (an
.npz, .h5, or a directory of .npy files), as --dataset=image_folder and
--dataset=arrays read them.

Examples are shuffled once (seeded) and dealt into shards, so every shard
holds every class. Image files are stored as they are, not decoded and
encoded again; arrays are encoded as PNG. Shards are written by several
threads at once, each to a temporary name renamed when complete, so an
interrupted conversion run again keeps the shards it finished and writes
the others. docs/your-data.md says when converting pays.
"""
import concurrent.futures
import json
import os
import sys
import threading
import time

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

from engine import datasets
from engine.core import run_files
from engine.core.errors import UserError
from engine.datasets import ArrayRows, Examples, image_folder
# --validation_split and --array_keys, as engine.train reads them.
from flags import data as engine_data_flags  # noqa: F401 pylint: disable=unused-import

FLAGS = flags.FLAGS
flags.DEFINE_string("from", "", "An image folder, or arrays (.npz, .h5, or a "
                    "directory of .npy files).")
flags.DEFINE_string("to", "", "Directory to write the TFRecords into.")
flags.DEFINE_integer("shards", 16, "Training shards; at least the number of "
                     "processes that will read them.", lower_bound=1)
flags.DEFINE_integer("validation_shards", 0,
                     "Validation shards; 0: the same share of examples per "
                     "shard as training, at least 1.", lower_bound=0)
flags.DEFINE_integer("threads", 0, "Shards written at once; 0: one per core.",
                     lower_bound=0)

MANIFEST = "conversion.json"
SHUFFLE_SEED = 0


def convert(source: str, out: str, *, shards: int, validation_shards: int = 0,
            threads: int = 0, validation_split: float = 0.0,
            array_keys=(), progress=None) -> dict:
  """Writes the shards that are not there yet; returns the manifest."""
  class_names, splits = _read(source, validation_split, array_keys)
  validation_shards = validation_shards or max(1, round(
      shards * splits["validation"].count / max(splits["train"].count, 1)))
  manifest = {"from": os.path.abspath(source), "classes": len(class_names),
              "train": splits["train"].count,
              "validation": splits["validation"].count,
              "shards": {"train": shards, "validation": validation_shards}}
  _check_or_write_manifest(out, manifest)
  run_files.write_classes(out, class_names)
  jobs = [(split, index, count)
          for split, count in (("train", shards),
                               ("validation", validation_shards))
          for index in range(count)]
  todo = [job for job in jobs if not os.path.exists(_shard_path(out, *job))]
  progress = progress or _Progress(sum(_shard_size(splits[split], index,
                                                   count)
                                       for split, index, count in todo))
  if len(todo) < len(jobs):
    progress.note(f"{len(jobs) - len(todo)} of {len(jobs)} shards are done "
                  "already; writing the others")
  with concurrent.futures.ThreadPoolExecutor(
      threads or len(os.sched_getaffinity(0))) as pool:
    list(pool.map(lambda job: _write_shard(out, splits[job[0]], *job,
                                           progress), todo))
  progress.finish()
  return manifest


class _Split:
  """One split's examples, shuffled once, and how to encode example i."""

  def __init__(self, count: int, encode, labels: np.ndarray):
    self.count = count
    self.order = np.random.default_rng(SHUFFLE_SEED).permutation(count)
    self._encode = encode
    self.labels = labels

  def record(self, index: int) -> bytes:
    feature = {
        "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(
            value=[self._encode(index)])),
        "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(
            value=[int(self.labels[index])])),
    }
    return tf.train.Example(features=tf.train.Features(
        feature=feature)).SerializeToString()


def _read(source: str, validation_split: float, array_keys):
  if not os.path.exists(source):
    raise UserError(f"--from={source}: no such file or directory")
  if os.path.isdir(os.path.join(source, image_folder.TRAIN_DIR)):
    class_names, train, validation = image_folder.list_files(
        source, validation_split=validation_split, skip_bad_files=False)
    return class_names, {name: _file_split(files) for name, files in
                         (("train", train), ("validation", validation))}
  splits = datasets.load("arrays", data_dir=source, array_keys=array_keys)
  if splits.info.image_dtype != "uint8":
    raise UserError(f"--from={source}: float images; TFRecords hold encoded "
                    "uint8 images, so scale them to 0-255 uint8 first")
  return splits.info.classes(), {"train": _array_split(splits.train),
                                 "validation": _array_split(splits.test)}


def _file_split(files) -> _Split:
  paths = [path for path, _ in files]

  def encode(index):
    with open(paths[index], "rb") as f:
      return f.read()

  return _Split(len(files), encode,
                np.array([label for _, label in files], np.int64))


def _array_split(source: Examples | ArrayRows) -> _Split:
  def encode(index):
    if isinstance(source, Examples):
      image = source.images[index]
    else:
      image = source.images.read([index])[0]
    return tf.io.encode_png(image).numpy()

  return _Split(len(source.labels), encode, source.labels)


def _shard_size(split: _Split, index: int, count: int) -> int:
  return len(range(index, split.count, count))


def _shard_path(out: str, split: str, index: int, count: int) -> str:
  return os.path.join(out, f"{split}-{index:05d}-of-{count:05d}")


def _write_shard(out: str, split: _Split, name: str, index: int, count: int,
                 progress) -> str:
  """Examples index, index + count, ... of the shuffled order, to a
  temporary file renamed when complete."""
  path = _shard_path(out, name, index, count)
  temporary = f"{path}.tmp-{os.getpid()}"
  with tf.io.TFRecordWriter(temporary) as writer:
    for example in split.order[index::count]:
      writer.write(split.record(int(example)))
      progress.add(1)
  os.replace(temporary, path)
  return path


def _check_or_write_manifest(out: str, manifest: dict) -> None:
  """A rerun continues only the same conversion: another one into the same
  directory would mix shards of two."""
  os.makedirs(out, exist_ok=True)
  path = os.path.join(out, MANIFEST)
  if os.path.exists(path):
    with open(path) as f:
      earlier = json.load(f)
    if earlier != manifest:
      raise UserError(f"--to={out} holds another conversion ({path}: "
                      f"{earlier}); choose another --to, or empty it")
    return
  leftovers = [n for n in os.listdir(out) if n.startswith(("train-",
                                                            "validation-"))]
  if leftovers:
    raise UserError(f"--to={out} holds TFRecords of something else "
                    f"({leftovers[0]}, ...); choose another --to")
  with open(path, "w") as f:
    json.dump(manifest, f, indent=1)


class _Progress:
  """A bar on a terminal, a line per tenth otherwise; shared by the
  threads that write shards."""

  def __init__(self, total: int):
    self._lock = threading.Lock()
    self._total = max(total, 1)
    self._done = 0
    self._start = time.perf_counter()
    self._shown = -1
    self._bar = sys.stderr.isatty()

  def note(self, message: str) -> None:
    print(f"to_tfrecords: {message}", file=sys.stderr)

  def add(self, count: int) -> None:
    with self._lock:
      self._done += count
      self._show()

  def _show(self) -> None:
    tenth = self._done * 10 // self._total
    if self._bar:
      if self._done % 64 == 0 or self._done == self._total:
        filled = self._done * 30 // self._total
        print(f"\r[{'#' * filled}{'.' * (30 - filled)}] {self._done}/"
              f"{self._total} images, {self._rate():.0f}/s", end="",
              file=sys.stderr, flush=True)
    elif tenth > self._shown:
      self._shown = tenth
      self.note(f"{self._done}/{self._total} images, {self._rate():.0f}/s")

  def finish(self) -> None:
    if self._bar:
      print(file=sys.stderr)

  def _rate(self) -> float:
    return self._done / max(time.perf_counter() - self._start, 1e-9)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  try:
    if not FLAGS["from"].value or not FLAGS.to:
      raise UserError("--from=DIR and --to=OUT are required")
    manifest = convert(FLAGS["from"].value, FLAGS.to, shards=FLAGS.shards,
                       validation_shards=FLAGS.validation_shards,
                       threads=FLAGS.threads,
                       validation_split=FLAGS.validation_split,
                       array_keys=FLAGS.array_keys)
  except UserError as e:
    print(f"to_tfrecords: error: {e}", file=sys.stderr)
    sys.exit(2)
  print(f"{FLAGS.to}: {manifest['train']} training and "
        f"{manifest['validation']} validation examples of "
        f"{manifest['classes']} classes in {manifest['shards']['train']} + "
        f"{manifest['shards']['validation']} shards; train with "
        f"--dataset=tfrecord --data_dir={FLAGS.to}")


if __name__ == "__main__":
  app.run(main)
