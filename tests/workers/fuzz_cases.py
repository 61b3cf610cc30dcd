"""Run by tests/test_fuzz.py: seeded corruptions of every input the engine
reads, each run through the engine's entry point, all in this one process.

  python -m tests.workers.fuzz_cases SEED SCRATCH_DIR [CASE_INDEX ...]

Why in one process: a fresh `python -m engine.train` spends seconds
importing TensorFlow, so some 120 of them would take many minutes. Here
TensorFlow and Horovod start once, and each case runs what
`python -m engine.train ARGS` runs, `app.run(train.main, argv,
flags_parser=cli.parse_flags)`, which
re-parses the flags on a rerun; `FLAGS.unparse_flags()` first returns the
flags a case does not give to their defaults, and clearing Keras' session
after it gives the next case fresh layer names, as a new process would.

A case copies good inputs (written once, by tests/fixtures.py) into its own
directory and corrupts one of them: bytes truncated, flipped, zeroed,
appended, replaced; headers, counts, labels or keys that disagree; files
missing, swapped, or in the way. It runs tiny settings (one step an epoch),
in a model_dir that either does not exist yet or starts as a copy of an
earlier complete run on the same data (always, for checkpoint cases), and
passes if the run

* trained: exit 0; or
* was refused: a non-zero exit, exactly one line starting
  `engine.train: error:` with nothing but log lines after it (the message
  is one line), and its model_dir exactly as it was (the same files, byte
  for byte; a model_dir that did not exist still does not); or
* stopped while training, on data the start-up checks cannot see (a
  divergence, exit 3, or an error "found while training"): one line as
  above, and nothing in model_dir changed but the records every start
  writes (flags, classes.txt, normalization.json, TensorBoard events);

and in either case printed no Python traceback and ended within
CASE_SECONDS. File descriptors 1 and 2 are captured below Python, so absl's
log lines, TensorFlow's C++ logs and anything printed land in the capture;
the error line is told from log lines by its prefix. An exception escaping
`app.run` is a traceback (a real process would print one and die).

Each case draws from `random.Random(f"{SEED}/{INDEX}")`, so any case can be
rerun alone by its index. A case that hangs is ended by a watchdog, which
prints the summary so far with that case as a failure and exits.

Prints one JSON object on stdout: the seed, the number of cases, outcomes
(trained, refused) overall and by input kind, every case's outcome, and the
failures with their description, arguments, problems and stderr's last
lines.
"""
import contextlib
import dataclasses
import gzip
import hashlib
import io
import json
import os
import pickle
import random
import re
import resource
import shutil
import sys
import tarfile
import threading
import time
import traceback

from absl import app
from absl import flags
import h5py
import numpy as np
import keras
import tensorflow as tf

from engine import cli
from engine import distributed
from engine import train
from engine.datasets import cifar10, fashion_mnist
from tests import fixtures
from tests import timeouts

FLAGS = flags.FLAGS
# A case's bound: 60 nominal seconds, stretched here (tests/timeouts.py).
CASE_SECONDS = timeouts.bound(60)
# A corrupt size can make a run allocate without bound; past this a run
# fails to allocate, as on a smaller host, rather than swap this one to
# death (this process maps about 2.5 GB).
ADDRESS_SPACE_BYTES = 12 * 2**30
# Every run: a model of 1762 parameters, one step an epoch. Cases' own
# flags come after these, so a flagfile can override them. --nobind_cpus:
# one process would be bound to every core anyway.
TINY = ["--model=cnn", "--filters=2", "--batch_size=4", "--steps_per_epoch=1",
        "--progress=none", "--nobind_cpus"]
# The earlier runs trained this many epochs; a case in a copy of one trains
# one more.
EARLIER_EPOCHS = 2
# Share of data cases whose model_dir starts as a copy of an earlier run.
EARLIER_RUN_SHARE = 0.25
ERROR_PREFIX = "engine.train: error:"
# What every start writes before its first step, so a run stopped while
# training may have changed them.
START_RECORDS = ("flags.txt", "flags.latest.txt", "classes.txt",
                 "normalization.json", "tensorboard/")
# absl's log lines: I1122 11:29:18.240020 ...
LOG_LINE = re.compile(r"[IWEF]\d{4} \d\d:\d\d:\d\d")


# Good inputs: written once, copied by each case before it corrupts them.

class Good:
  """The uncorrupted inputs under `root`, by name, and an earlier complete
  run on each data set (`earlier_run`)."""

  DATASETS = {
      # name: (the data set's flags for data at PATH, how to write it)
      "fashion_mnist": (
          ["--dataset=fashion_mnist", "--data_dir={}"],
          lambda path: fixtures.write_fashion_mnist(path, 40, 10)),
      "cifar10": (
          ["--dataset=cifar10", "--data_dir={}"],
          lambda path: fixtures.write_cifar10(path, num_per_batch=4,
                                              num_test=6)),
      "cifar10_archive": (
          ["--dataset=cifar10", "--data_dir={}"],
          lambda path: fixtures.write_cifar10(path, num_per_batch=4,
                                              num_test=6, layout="tar")),
      "tfrecord": (
          ["--dataset=tfrecord", "--data_dir={}", "--image_size=8",
           "--num_classes=10"],
          lambda path: fixtures.write_tfrecords(path, num_files=2,
                                                per_file=4, test_files=1)),
      "image_folder": (
          ["--dataset=image_folder", "--data_dir={}", "--image_size=8"],
          fixtures.write_image_folder),
      # The format by the name: .npz, .h5, a directory of .npy files.
      **{name: (["--dataset=arrays", "--data_dir={}"],
                lambda path: fixtures.write_arrays(path, num_train=24,
                                                   num_test=8))
         for name in ("arrays.npz", "arrays.h5", "arrays")},
  }
  # The earlier run a copy of the archive's data starts from: the same
  # data set (an identity of model and data), read from batches.
  EARLIER_RUN_OF = {"cifar10_archive": "cifar10"}

  def __init__(self, root: str):
    self.root = root
    for name, (_, write) in self.DATASETS.items():
      write(os.path.join(root, "data", name))

  def data(self, name: str) -> str:
    return os.path.join(self.root, "data", name)

  @staticmethod
  def args(name: str, path: str) -> list[str]:
    """The flags that read data set `name` at `path`."""
    return [a.format(path) for a in Good.DATASETS[name][0]]

  def copy(self, name: str, case_dir: str) -> str:
    """A copy of data set `name` in `case_dir`, under the same base name
    (the data set's name in a run's identity)."""
    source, target = self.data(name), os.path.join(case_dir, name)
    if os.path.isdir(source):
      shutil.copytree(source, target)
    else:
      shutil.copyfile(source, target)
    return target

  def earlier_run(self, name: str) -> str:
    return os.path.join(self.root, "runs", self.EARLIER_RUN_OF.get(name, name))

  def train_earlier_runs(self) -> None:
    """A complete run (checkpoints, best, metrics, exports) on each data
    set, from which model_dirs of cases start."""
    for name in self.DATASETS:
      if name in self.EARLIER_RUN_OF:
        continue
      args = [*TINY, f"--epochs={EARLIER_EPOCHS}", *self.args(
          name, self.data(name)), f"--model_dir={self.earlier_run(name)}"]
      run = run_engine(args, self.root)
      if run.code != 0 or run.escaped:
        raise RuntimeError(f"the earlier run on {name} failed: {run.escaped}"
                           f"\n{run.stderr[-3000:]}")


# Damage to a file's bytes, the same for every format.

def damage(raw: bytes, rng: random.Random, *,
           header: int) -> tuple[bytes, str]:
  """`raw` truncated, flipped, zeroed, extended or replaced, and how.

  Half the time the damage lands in the first `header` bytes, where a
  format keeps its magic, sizes and counts; a flip in pixels mostly trains.
  """
  span = max(1, min(len(raw), header if rng.random() < 0.5 else len(raw)))
  how = rng.choice(("truncate", "truncate", "flip", "flip", "flip", "zeros",
                    "append", "garbage", "empty"))
  if how == "truncate":
    cut = rng.randrange(span)
    return raw[:cut], f"truncated to {cut} of {len(raw)} bytes"
  if how == "flip":
    data = bytearray(raw or b"\0")
    positions = sorted(rng.sample(range(span), min(span, rng.randint(1, 4))))
    for p in positions:
      data[p] ^= rng.randint(1, 255)
    return bytes(data), f"bytes at {positions} flipped"
  if how == "zeros":
    start, count = rng.randrange(span), rng.randint(1, 256)
    end = min(len(raw), start + count)
    return (raw[:start] + bytes(end - start) + raw[end:],
            f"bytes {start}..{end} zeroed")
  if how == "append":
    count = rng.randint(1, 300)
    return raw + rng.randbytes(count), f"{count} random bytes appended"
  if how == "garbage":
    count = rng.randint(1, 2000)
    return rng.randbytes(count), f"replaced by {count} random bytes"
  return b"", "emptied"


def read(path: str) -> bytes:
  with open(path, "rb") as f:
    return f.read()


def write(path: str, raw: bytes) -> None:
  with open(path, "wb") as f:
    f.write(raw)


def damage_file(path: str, rng: random.Random, *, header: int) -> str:
  raw, what = damage(read(path), rng, header=header)
  write(path, raw)
  return what


def relative(path: str, start: str) -> str:
  return os.path.relpath(path, start)


@dataclasses.dataclass
class Corruption:
  """What a case did to its inputs, and the flags that read them."""
  description: str
  args: list[str]  # after TINY and --epochs; --model_dir is added last
  dataset: str     # whose earlier run a model_dir may start as a copy of
  # "either": new, or a copy of the earlier run (by the seed); "fresh": new;
  # "in_place": the case made CASE_DIR/run itself.
  model_dir: str = "either"


# Fashion-MNIST's idx files.

def idx_case(rng: random.Random, good: Good, case_dir: str) -> Corruption:
  data_dir = good.copy("fashion_mnist", case_dir)
  stems = list(fashion_mnist.FILES.values())
  stem = rng.choice(stems)
  path = os.path.join(data_dir, stem + ".gz")
  raw = gzip.decompress(read(path))
  ndim = raw[3]
  how = rng.choice(("gzip", "idx", "idx", "magic", "count", "count",
                    "labels", "plain", "missing", "swap"))
  if how == "labels" and ndim != 1:
    how = "count"
  if how == "gzip":
    what = "its gzip stream " + damage_file(path, rng, header=32)
  elif how == "idx":
    damaged, what = damage(raw, rng, header=4 + 4 * ndim)
    write(path, gzip.compress(damaged))
    what = "its idx bytes " + what
  elif how == "magic":
    position = rng.randrange(4)
    value = rng.choice([v for v in (0, 1, 2, 3, 8, 9, 13, 255)
                        if v != raw[position]])
    write(path, gzip.compress(raw[:position] + bytes([value]) +
                              raw[position + 1:]))
    what = f"magic byte {position} set to {value}"
  elif how == "count":
    dim = rng.randrange(ndim)
    old = int.from_bytes(raw[4 + 4 * dim:8 + 4 * dim], "big")
    new = rng.choice((old - 1, old + 1, old * 2, 0,
                      rng.randrange(2**32))) % 2**32
    header = (raw[:4 + 4 * dim] + new.to_bytes(4, "big") +
              raw[8 + 4 * dim:4 + 4 * ndim])
    body = raw[4 + 4 * ndim:]
    what = f"dimension {dim} of the header set from {old} to {new}"
    if dim == 0 and new <= 2 * old and rng.random() < 0.6:
      # A consistent file whose count disagrees with its partner's.
      row = len(body) // old
      body = (body + bytes(row * new))[:row * new]
      what += ", the data cut or padded to match"
    write(path, gzip.compress(header + body))
  elif how == "labels":
    labels = bytearray(raw)
    rows = rng.sample(range(8, len(raw)), rng.randint(1, 3))
    for r in rows:
      labels[r] = rng.randint(10, 255)
    write(path, gzip.compress(bytes(labels)))
    what = f"labels at byte {sorted(rows)} set to 10 or more"
  elif how == "plain":
    os.remove(path)
    if rng.random() < 0.5:
      write(path[:-3], raw)
      what = "stored uncompressed, without .gz"
    else:
      write(path, raw)
      what = "stored uncompressed under its .gz name"
  elif how == "missing":
    os.remove(path)
    what = "removed"
  else:
    other = os.path.join(data_dir, rng.choice(
        [s for s in stems if s != stem]) + ".gz")
    swapped = read(other)
    write(other, read(path))
    write(path, swapped)
    what = f"swapped with {os.path.basename(other)}"
  return Corruption(f"{stem}.gz: {what}", good.args("fashion_mnist", data_dir),
                    "fashion_mnist")


# CIFAR-10's pickled batches, as files and in the archive.

# A pickle whose loading would call os.system("true").
MALICIOUS_PICKLE = (b"\x80\x02cos\nsystem\nq\x00X\x04\x00\x00\x00trueq\x01\x85"
                    b"q\x02Rq\x03.")


def changed_batch(raw: bytes, rng: random.Random) -> tuple[bytes, str]:
  """A CIFAR-10 batch pickle with one field wrong, or bytes damaged
  (batches.meta, which holds no images, only damaged)."""
  batch = pickle.loads(raw, encoding="bytes")
  if b"data" not in batch:
    return damage(raw, rng, header=96)
  data, labels = batch[b"data"], list(batch[b"labels"])
  how = rng.choice(("bytes", "bytes", "bytes", "dtype", "size", "labels_length",
                    "label_range", "label_type", "missing_key", "not_a_dict",
                    "empty", "data_list", "str_keys", "malicious",
                    "protocol_5"))
  if how == "bytes":
    return damage(raw, rng, header=96)
  if how == "malicious":
    return MALICIOUS_PICKLE, "a pickle that calls os.system"
  if how == "dtype":
    dtype = rng.choice(("float32", "int16", "uint16", "int64"))
    batch[b"data"] = data.astype(dtype)
    what = f"b'data' as {dtype}"
  elif how == "size":
    cut = rng.randint(1, 3071)
    batch[b"data"] = data.reshape(-1)[:-cut]
    what = f"b'data' cut by {cut} bytes"
  elif how == "labels_length":
    batch[b"labels"] = labels[:-1] if rng.random() < 0.5 else labels + [0]
    what = f"{len(batch[b'labels'])} labels for {len(data)} images"
  elif how == "label_range":
    value = rng.choice((-1, 10, 255, 1000))
    labels[rng.randrange(len(labels))] = value
    batch[b"labels"] = labels
    what = f"a label set to {value}"
  elif how == "label_type":
    batch[b"labels"] = ([str(l) for l in labels] if rng.random() < 0.5
                        else [l + 0.5 for l in labels])
    what = "labels as strings or fractions"
  elif how == "missing_key":
    key = rng.choice((b"data", b"labels"))
    del batch[key]
    what = f"no {key!r}"
  elif how == "not_a_dict":
    batch = rng.choice(([data, labels], None, "a string"))
    what = f"a {type(batch).__name__} instead of a dict"
  elif how == "empty":
    batch[b"data"], batch[b"labels"] = data[:0], []
    what = "no images"
  elif how == "data_list":
    batch[b"data"] = data.tolist()
    what = "b'data' as a list"
  elif how == "str_keys":
    batch = {k.decode(): v for k, v in batch.items()}
    what = "str keys (a Python 3 pickle)"
  else:
    return pickle.dumps(batch, protocol=5), "pickled with protocol 5"
  return pickle.dumps(batch, protocol=2), what


def cifar10_case(rng: random.Random, good: Good,
                 case_dir: str) -> Corruption:
  data_dir = good.copy("cifar10", case_dir)
  batches_dir = os.path.join(data_dir, cifar10.BATCHES_DIR)
  name = rng.choice((*cifar10.TRAIN_BATCHES, cifar10.TEST_BATCH,
                     "batches.meta"))
  path = os.path.join(batches_dir, name)
  how = rng.random()
  if how < 0.75:
    raw, what = changed_batch(read(path), rng)
    write(path, raw)
  elif how < 0.85:
    os.remove(path)
    what = "removed"
  else:
    os.rename(path, path + ".bak")
    what = "renamed to .bak"
  # The batches directory itself, as in the Keras cache, half the time.
  where = batches_dir if rng.random() < 0.5 else data_dir
  return Corruption(f"{cifar10.BATCHES_DIR}/{name}: {what} (--data_dir="
                    f"{relative(where, case_dir)})",
                    good.args("cifar10", where), "cifar10")


def cifar10_archive_case(rng: random.Random, good: Good,
                         case_dir: str) -> Corruption:
  data_dir = good.copy("cifar10_archive", case_dir)
  archive = os.path.join(data_dir, cifar10.ARCHIVE)
  with tarfile.open(archive, "r:gz") as tar:
    members = [(m, tar.extractfile(m).read() if m.isfile() else None)
               for m in tar.getmembers()]
  how = rng.choice(("gzip", "gzip", "tar", "tar", "member", "member",
                    "member", "drop", "directory", "symlink", "plain_tar"))
  if how == "gzip":
    what = "the archive " + damage_file(archive, rng, header=64)
  elif how == "tar":
    raw, what = damage(gzip.decompress(read(archive)), rng, header=1024)
    write(archive, gzip.compress(raw))
    what = "the tar stream " + what
  elif how == "plain_tar":
    write(archive, gzip.decompress(read(archive)))
    what = "not gzipped (a plain tar named .tar.gz)"
  else:
    files = [i for i, (m, _) in enumerate(members) if m.isfile()]
    index = rng.choice(files)
    member, content = members[index]
    if how == "member":
      raw, what = changed_batch(content, rng)
      member.size = len(raw)
      members[index] = (member, raw)
      what = f"member {member.name}: {what}"
    elif how == "drop":
      del members[index]
      what = f"member {member.name} left out"
    elif how == "directory":
      member.type, member.size = tarfile.DIRTYPE, 0
      members[index] = (member, None)
      what = f"member {member.name} a directory"
    else:
      target = members[rng.choice([i for i in files if i != index])][0]
      member.type, member.size = tarfile.SYMTYPE, 0
      member.linkname = os.path.basename(target.name)
      members[index] = (member, None)
      what = f"member {member.name} a symlink to {member.linkname}"
    with tarfile.open(archive, "w:gz") as tar:
      for member, content in members:
        tar.addfile(member, io.BytesIO(content) if content is not None
                    else None)
  return Corruption(f"{cifar10.ARCHIVE}: {what}",
                    good.args("cifar10_archive", data_dir),
                    "cifar10_archive")


# TFRecords of encoded images.

def example_bytes(features: dict) -> bytes:
  """A serialized tf.train.Example of bytes and int64 (lists) features."""
  def feature(value):
    if isinstance(value, bytes):
      return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
    values = value if isinstance(value, list) else [value]
    return tf.train.Feature(int64_list=tf.train.Int64List(value=values))
  return tf.train.Example(features=tf.train.Features(feature={
      key: feature(value) for key, value in features.items()})
                          ).SerializeToString()


def changed_record(record: bytes, rng: random.Random) -> tuple[bytes, str]:
  """A TFRecord record, framed correctly, whose content is wrong."""
  parsed = tf.train.Example.FromString(record).features.feature
  image = parsed["image/encoded"].bytes_list.value[0]
  label = parsed["image/class/label"].int64_list.value[0]
  how = rng.choice(("not_an_example", "no_image", "not_an_image",
                    "truncated_image", "label_range", "label_bytes",
                    "two_labels", "empty"))
  if how == "not_an_example":
    return rng.randbytes(rng.randint(1, 200)), "random bytes, not an Example"
  if how == "no_image":
    return example_bytes({"image/class/label": label}), "no image/encoded"
  if how == "not_an_image":
    return (example_bytes({"image/encoded": rng.randbytes(100),
                      "image/class/label": label}),
            "image/encoded random bytes")
  if how == "truncated_image":
    cut = rng.randrange(len(image))
    return (example_bytes({"image/encoded": image[:cut],
                      "image/class/label": label}),
            f"image/encoded truncated to {cut} of {len(image)} bytes")
  if how == "label_range":
    value = rng.choice((10, 57, 1000, -1, 2**40))
    return (example_bytes({"image/encoded": image, "image/class/label": value}),
            f"label {value}")
  if how == "label_bytes":
    return (example_bytes({"image/encoded": image, "image/class/label": b"3"}),
            "label as bytes")
  if how == "two_labels":
    return (example_bytes({"image/encoded": image,
                      "image/class/label": [label, label]}), "two labels")
  return b"", "an empty record"


def tfrecord_case(rng: random.Random, good: Good,
                  case_dir: str) -> Corruption:
  data_dir = good.copy("tfrecord", case_dir)
  files = sorted(f for f in os.listdir(data_dir) if "-of-" in f)
  name = rng.choice(files)
  path = os.path.join(data_dir, name)
  how = rng.choice(("bytes", "bytes", "bytes", "record", "record", "record",
                    "classes", "no_validation", "directory", "counts"))
  if how == "bytes":
    what = f"{name}: " + damage_file(path, rng, header=16)
  elif how == "record":
    records = [r.numpy() for r in tf.data.TFRecordDataset(path)]
    index = rng.randrange(len(records))
    records[index], what = changed_record(records[index], rng)
    with tf.io.TFRecordWriter(path) as writer:
      for record in records:
        writer.write(record)
    what = f"{name}: record {index}: {what}"
  elif how == "classes":
    classes = os.path.join(data_dir, "classes.txt")
    content = rng.choice((rng.randbytes(64), b"ant\nbee\ncat\n",
                          b"".join(b"c%d\n" % i for i in range(12)), b""))
    write(classes, content)
    what = f"classes.txt of {len(content)} bytes: {content[:24]!r}"
  elif how == "no_validation":
    for f in files:
      if f.startswith("validation"):
        os.remove(os.path.join(data_dir, f))
    what = "validation-* removed"
  elif how == "directory":
    os.makedirs(os.path.join(data_dir, "train-99999-of-99999"))
    what = "a directory named train-99999-of-99999"
  else:
    counts = [f"--train_examples={rng.choice((1, 9, 1000))}",
              f"--test_examples={rng.choice((1, 5, 1000))}"]
    return Corruption(f"counts other than the files' 8 and 4: {counts}",
                      [*good.args("tfrecord", data_dir), *counts], "tfrecord")
  args = good.args("tfrecord", data_dir)
  if rng.random() < 0.4:
    # Counts from flags: the files are not read at start-up.
    args += ["--train_examples=8", "--test_examples=4"]
    what += " (counts given)"
  return Corruption(what, args, "tfrecord")


# Image folders of JPEG, PNG, BMP and GIF files.

def image_folder_case(rng: random.Random, good: Good,
                      case_dir: str) -> Corruption:
  data_dir = good.copy("image_folder", case_dir)
  images = sorted(os.path.join(root, name)
                  for root, _, names in os.walk(data_dir) for name in names)
  path = rng.choice(images)
  name = relative(path, data_dir)
  how = rng.choice(("bytes", "bytes", "bytes", "truncated_body",
                    "truncated_body", "other_format", "text", "directory",
                    "empty_class", "extra_validation_class", "no_validation",
                    "stray"))
  extra = []
  if how == "bytes":
    what = f"{name}: " + damage_file(path, rng, header=32)
  elif how == "truncated_body":
    raw = read(path)
    cut = rng.randrange(8, len(raw))
    write(path, raw[:cut])
    what = f"{name}: truncated to {cut} of {len(raw)} bytes (magic kept)"
  elif how == "other_format":
    other = rng.choice([i for i in images
                        if os.path.splitext(i)[1] != os.path.splitext(path)[1]])
    write(path, read(other))
    what = f"{name}: holds {relative(other, data_dir)}'s bytes"
  elif how == "text":
    write(path, b"not an image\n")
    what = f"{name}: a text file"
  elif how == "directory":
    os.remove(path)
    os.makedirs(path)
    what = f"{name}: a directory"
  elif how == "empty_class":
    folder = os.path.dirname(path)
    for f in os.listdir(folder):
      os.remove(os.path.join(folder, f))
    what = f"{relative(folder, data_dir)}: emptied"
  elif how == "extra_validation_class":
    folder = os.path.join(data_dir, "validation", "dog")
    os.makedirs(folder)
    shutil.copy(path, folder)
    what = "validation/dog: a class train/ lacks"
  elif how == "no_validation":
    shutil.rmtree(os.path.join(data_dir, "validation"))
    split = rng.choice((0.0, 0.3))
    extra.append(f"--validation_split={split}")
    what = f"validation/ removed, --validation_split={split}"
  else:
    for stray in ("readme.txt", ".DS_Store", "notes.PNG.txt"):
      write(os.path.join(os.path.dirname(path), stray), rng.randbytes(20))
    what = f"{relative(os.path.dirname(path), data_dir)}: stray non-images"
  options = []
  if rng.random() < 0.3:
    # Statistics given: no training image is decoded at start-up.
    options += ["--image_mean=100,100,100", "--image_std=50,50,50"]
  if rng.random() < 0.2:
    options.append("--skip_bad_files")
  if rng.random() < 0.15:
    options.append("--channels=1")
    options = [o.replace("100,100,100", "100").replace("50,50,50", "50")
               for o in options]
  return Corruption(f"{what} {' '.join(options)}".strip(),
                    [*good.args("image_folder", data_dir), *extra, *options],
                    "image_folder")


# Arrays: .npz, a directory of .npy files, HDF5.

def changed_arrays(arrays: dict, rng: random.Random,
                   kind: str) -> tuple[dict, str]:
  """The fixture's arrays with one of them wrong."""
  arrays = dict(arrays)
  x, y = arrays["x_train"], arrays["y_train"]
  changes = ["missing", "x_dtype", "x_ndim", "x_empty_dim", "shapes",
             "y_fraction", "y_negative", "y_2d", "y_length", "y_huge",
             "names_2d", "names_few", "x_nan", "x_no_rows"]
  if kind != "h5":
    changes += ["x_object", "fortran"]
  how = rng.choice(changes)
  if how == "missing":
    key = rng.choice(("x_train", "y_train", "x_test", "y_test"))
    del arrays[key]
    return arrays, f"no {key}"
  if how == "x_dtype":
    dtype = rng.choice(("int32", "bool", "complex64", "int8"))
    arrays["x_train"] = x.astype(dtype)
    return arrays, f"x_train as {dtype}"
  if how == "x_ndim":
    flat = rng.random() < 0.5
    arrays["x_train"] = x.reshape(len(x), -1) if flat else x[..., None, None]
    return arrays, f"x_train of shape {arrays['x_train'].shape}"
  if how == "x_empty_dim":
    arrays["x_train"] = x[:, :0]
    return arrays, "x_train of height 0"
  if how == "shapes":
    arrays["x_test"] = arrays["x_test"][:, :-2]
    return arrays, "x_test 2 rows of pixels shorter than x_train"
  if how == "y_fraction":
    arrays["y_train"] = y + 0.5
    return arrays, "y_train fractions"
  if how == "y_negative":
    y = y.copy()
    y[rng.randrange(len(y))] = -3
    arrays["y_train"] = y
    return arrays, "a y_train label -3"
  if how == "y_2d":
    arrays["y_train"] = np.stack([y, y], axis=1)
    return arrays, "y_train of shape (N, 2)"
  if how == "y_length":
    arrays["y_test"] = arrays["y_test"][:-1]
    return arrays, "one y_test label too few"
  if how == "y_huge":
    y = y.copy()
    y[rng.randrange(len(y))] = value = rng.choice((2**24, 2**31, 2**40))
    arrays["y_train"] = y
    del arrays["class_names"]
    return arrays, f"a y_train label {value}, no class_names"
  if how == "names_2d":
    arrays["class_names"] = np.array([["a", "b"], ["c", "d"]])
    return arrays, "class_names 2-D"
  if how == "names_few":
    arrays["class_names"] = arrays["class_names"][:2]
    return arrays, "2 class_names for labels up to 3"
  if how == "x_nan":
    bad = x.astype("float32")
    bad[rng.randrange(len(bad))] = rng.choice((np.nan, np.inf))
    arrays["x_train"] = bad
    return arrays, "x_train float with an image of NaN or inf"
  if how == "x_no_rows":
    arrays["x_train"], arrays["y_train"] = x[:0], y[:0]
    return arrays, "x_train and y_train with no rows"
  if how == "x_object":
    arrays["x_train"] = np.array(list(x) + [None], dtype=object)[:-1]
    return arrays, "x_train an object array"
  arrays["x_train"] = np.asfortranarray(x)
  return arrays, "x_train in Fortran order"


def save_arrays(arrays: dict, path: str, rng: random.Random) -> str:
  """Writes `arrays` as `path` is: .npz (stored or compressed), .h5, or a
  directory of .npy files."""
  if path.endswith(".npz"):
    if rng.random() < 0.3:
      np.savez_compressed(path, **arrays)
      return " (compressed .npz)"
    np.savez(path, **arrays)
  elif path.endswith(".h5"):
    with h5py.File(path, "w") as f:
      for name, array in arrays.items():
        f[name] = array.astype("S") if array.dtype.kind == "U" else array
  else:
    shutil.rmtree(path)
    os.makedirs(path)
    for name, array in arrays.items():
      np.save(os.path.join(path, name + ".npy"), array)
  return ""


def arrays_case(kind: str):
  """The case generator for arrays stored as `kind` (npz, h5, npy)."""
  name = {"npz": "arrays.npz", "h5": "arrays.h5", "npy": "arrays"}[kind]

  def case(rng: random.Random, good: Good, case_dir: str) -> Corruption:
    path = good.copy(name, case_dir)
    how = rng.random()
    if how < 0.5:
      if kind == "npy":
        target = os.path.join(path, rng.choice(sorted(os.listdir(path))))
        what = f"{os.path.basename(target)}: "
      else:
        target, what = path, ""
      what += damage_file(target, rng, header=512 if kind == "h5" else 128)
    else:
      arrays = dict(np.load(good.data("arrays.npz")))
      arrays, what = changed_arrays(arrays, rng, kind)
      what += save_arrays(arrays, path, rng)
    return Corruption(f"{name}: {what}", good.args(name, path), name)

  return case


# A run's model_dir: checkpoints, and the files a resumed run reads.

def checkpoint_case(rng: random.Random, good: Good,
                    case_dir: str) -> Corruption:
  data_args = good.args("fashion_mnist", good.data("fashion_mnist"))
  run = os.path.join(case_dir, "run")
  resume_from = rng.random() < 0.15
  if resume_from:
    # Another run's damaged checkpoints, into a new model_dir.
    run = os.path.join(case_dir, "other")
  shutil.copytree(good.earlier_run("fashion_mnist"), run)
  how = rng.choice(("file", "file", "file", "file", "remove", "state",
                    "every_latest", "normalization", "metrics"))
  # The state files, and each checkpoint's .index and .data, latest and best.
  checkpoint_files = sorted(
      relative(os.path.join(root, name), run)
      for root, _, names in os.walk(os.path.join(run, "checkpoints"))
      for name in names)
  if how == "file":
    name = rng.choice(checkpoint_files)
    what = f"{name}: " + damage_file(os.path.join(run, name), rng,
                                     header=64)
  elif how == "remove":
    name = rng.choice(checkpoint_files)
    os.remove(os.path.join(run, name))
    what = f"{name}: removed"
  elif how == "state":
    content = rng.choice((
        'model_checkpoint_path: "ckpt-7"\nall_model_checkpoint_paths: '
        '"ckpt-7"\n',
        'model_checkpoint_path: "/nonexistent/ckpt-2"\n',
        'model_checkpoint_path: "ckpt-2"\nall_model_checkpoint_paths: '
        '"ckpt-1"\nall_model_checkpoint_paths: "ckpt-2"\n'
        'all_model_checkpoint_paths: "ckpt-9"\n',
        "model_checkpoint_path: ckpt-2 {\n"))
    write(os.path.join(run, "checkpoints/checkpoint"), content.encode())
    what = f"checkpoints/checkpoint: {content!r}"
  elif how == "every_latest":
    for n in (1, 2):
      damage_file(os.path.join(run, f"checkpoints/ckpt-{n}.index"), rng,
                  header=64)
    what = "checkpoints/ckpt-1.index and ckpt-2.index damaged"
  elif how == "normalization":
    content = rng.choice((rng.randbytes(30), b'{"mean": "abc", "std": "d"}',
                          b'{"mean": [1, 2], "std": [1, 2]}',
                          b'{"mean": [0], "std": [0]}', b'{"mean": [0]}',
                          b'{"mean": [NaN], "std": [1]}', b"[]"))
    write(os.path.join(run, "normalization.json"), content)
    what = f"normalization.json: {content[:40]!r}"
  else:
    path = os.path.join(run, "metrics.jsonl")
    lines = read(path).splitlines(keepends=True)
    change = rng.choice(("garbage", "cut", "no_epoch", "binary"))
    if change == "garbage":
      lines.insert(1, b"not json\n")
    elif change == "cut":
      lines[-1] = lines[-1][:rng.randrange(len(lines[-1]))]
    elif change == "no_epoch":
      lines[0] = b'{"global_step": 1}\n'
    else:
      lines.append(rng.randbytes(40) + b"\n")
    write(path, b"".join(lines))
    what = f"metrics.jsonl: {change}"
  if resume_from:
    return Corruption(f"--resume_from another run whose {what}",
                      [*data_args, f"--resume_from={run}"], "fashion_mnist",
                      model_dir="fresh")
  return Corruption(what, data_args, "fashion_mnist", model_dir="in_place")


# Flagfiles with random lines.

# Lines of a flagfile, by what the engine should make of them; a flagfile
# mixes harmless lines with at most one line of each other kind, so that a
# line absl refuses does not always hide one the engine must refuse.
FLAGFILE_LINES = {
    "harmless": ("# a comment", "// another comment", "", "   ",
                 "--seed=7", "--random_flip=false", "--norandom_flip",
                 "--random_shift=0.05", "--momentum=0.8", "--flagfile=",
                 "--flagfile={self}"),
    "refused_by_the_flags": (
        "--no_such_flag=1", "--batchsize=4", "-x", "--data-dir=/tmp",
        "--batch_size=-3", "--batch_size=four", "--epochs=0",
        "--model=resnet9000", "--dataset=mnist3d", "--random_shift=0.9",
        "--seed=-1", "--lr_schedule=zigzag", "--image_mean=1,2",
        "--resume=sometimes", "--optimizer=sgdd", "--profile_steps=5,2",
        "--steps_per_epoch=-1", "--channels=2", "--keep_checkpoints=0",
        "--base_lr=fast", "--lr_decay_epochs=a,b", "--horovod_timeline",
        "--flagfile=/nonexistent/x.cfg", "--flagfile={dir}",
        "--synthetic_classes=5"),
    "refused_by_the_engine": (
        "--data_dir=/nonexistent", "--dataset=cifar10",
        "--image_mean=x\n--image_std=1", "--image_mean=1,2\n--image_std=1,2",
        "--resume_from=/nonexistent",
        "--dataset=/nonexistent/data.py:load", "--model=os:getcwd"),
    "not_flags": ("hello world", "--", "-", "=5", "--=3", "batch_size=4"),
}
# The chance of a line of each kind but the harmless in a flagfile.
FLAGFILE_ODDS = {"refused_by_the_flags": 0.3, "refused_by_the_engine": 0.5,
                 "not_flags": 0.15, "not_utf8": 0.1}


def flagfile_case(rng: random.Random, good: Good,
                  case_dir: str) -> Corruption:
  path = os.path.join(case_dir, "run.cfg")
  how = rng.random()
  if how < 0.85:
    def line(kind: str) -> str:
      if kind == "not_utf8":
        return "--" + rng.randbytes(8).decode("latin-1")
      return rng.choice(FLAGFILE_LINES[kind]).format(dir=case_dir, self=path)

    lines = [line("harmless") for _ in range(rng.randint(0, 3))]
    for kind, odds in FLAGFILE_ODDS.items():
      if rng.random() < odds:
        lines.insert(rng.randrange(len(lines) + 1), line(kind))
    write(path, ("\n".join(lines) + "\n").encode("latin-1"))
    what = f"flagfile lines {lines!r}"
  elif how < 0.92:
    raw = rng.randbytes(rng.randint(1, 200))
    write(path, raw)
    what = f"flagfile of {len(raw)} random bytes"
  else:
    path = rng.choice((os.path.join(case_dir, "missing.cfg"), case_dir))
    what = f"--flagfile={relative(path, case_dir) or '.'}, not a file"
  return Corruption(what, [*good.args("fashion_mnist",
                                      good.data("fashion_mnist")),
                           f"--flagfile={path}"], "fashion_mnist")


KINDS = {
    # kind: (cases, generator)
    "idx": (14, idx_case),
    "cifar10_pickle": (12, cifar10_case),
    "cifar10_archive": (10, cifar10_archive_case),
    "tfrecord": (14, tfrecord_case),
    "image_folder": (14, image_folder_case),
    "npz": (10, arrays_case("npz")),
    "npy": (8, arrays_case("npy")),
    "h5": (10, arrays_case("h5")),
    "checkpoint": (16, checkpoint_case),
    "flagfile": (12, flagfile_case),
}


def plan() -> list[tuple[str, object]]:
  """Every case's (kind, generator), in a fixed order: the kinds in turn,
  so a run cut short has covered all of them."""
  queues = [[(kind, generator)] * count
            for kind, (count, generator) in KINDS.items()]
  cases = []
  while any(queues):
    for queue in queues:
      if queue:
        cases.append(queue.pop())
  return cases


# Running the engine in this process.

@dataclasses.dataclass
class EngineRun:
  code: int                    # the exit code a process would have had
  escaped: str                 # an exception out of app.run, or ""
  stdout: str
  stderr: str


@contextlib.contextmanager
def captured_output(directory: str):
  """File descriptors 1 and 2 into files in `directory`, below Python:
  absl's handler, TensorFlow's C++ logs and print all land there."""
  sys.stdout.flush()
  sys.stderr.flush()
  saved = {fd: os.dup(fd) for fd in (1, 2)}
  try:
    for fd, name in ((1, "stdout"), (2, "stderr")):
      with open(os.path.join(directory, name), "wb") as f:
        os.dup2(f.fileno(), fd)
    yield
  finally:
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, copy in saved.items():
      os.dup2(copy, fd)
      os.close(copy)


def run_engine(args: list[str], directory: str) -> EngineRun:
  """`python -m engine.train ARGS`, in this process."""
  FLAGS.unparse_flags()
  code, escaped = 0, ""
  with captured_output(directory):
    try:
      app.run(train.main, argv=["engine.train", *fixtures.ENGINE_FLAGS,
                                *args],
              flags_parser=cli.parse_flags)
    except SystemExit as e:
      code = (0 if e.code is None else e.code if isinstance(e.code, int)
              else 1)
    except Exception as e:  # pylint: disable=broad-except
      # What a process would print as its traceback, in one line: the
      # exception and where it was raised.
      frame = traceback.extract_tb(e.__traceback__)[-1]
      message = (str(e).strip().splitlines() or [""])[0]
      escaped = (f"{type(e).__name__}: {message[:300]} (at "
                 f"{frame.filename}:{frame.lineno})")
      code = 1
  keras.backend.clear_session()
  outputs = {}
  for name in ("stdout", "stderr"):
    with open(os.path.join(directory, name), "rb") as f:
      outputs[name] = f.read().decode(errors="replace")
  return EngineRun(code, escaped, **outputs)


def snapshot(directory: str):
  """Every file and folder under `directory` with a hash of its bytes
  (metrics.jsonl with its records, to tell what was added); None if it
  does not exist."""
  if not os.path.exists(directory):
    return None
  entries = {}
  for root, dirs, files in os.walk(directory):
    for name in dirs:
      entries[relative(os.path.join(root, name), directory) + "/"] = ""
    for name in files:
      path = os.path.join(root, name)
      entries[relative(path, directory)] = (
          read(path).decode(errors="replace").splitlines()
          if name == "metrics.jsonl" else hashlib.sha256(
              read(path)).hexdigest())
  return entries


def changes(before, after) -> str:
  if before is None:
    return f"created, holding {sorted(after)[:6]}"
  added = sorted(set(after) - set(before))
  removed = sorted(set(before) - set(after))
  modified = sorted(k for k in set(before) & set(after)
                    if before[k] != after[k])
  return (f"added {added[:6]}, removed {removed[:6]}, modified "
          f"{modified[:6]}")


def problems_of(run: EngineRun, before, after) -> list[str]:
  """What is wrong with a case's run, each as "what: details"; empty if it
  trained or was refused properly."""
  problems = []
  if run.escaped:
    problems.append(f"traceback: {run.escaped}")
  elif "Traceback" in run.stderr + run.stdout:
    problems.append("traceback printed")
  lines = run.stderr.splitlines()
  errors = [i for i, line in enumerate(lines) if line.startswith(ERROR_PREFIX)]
  if run.code == 0:
    if errors:
      problems.append(f"trained, but printed: {lines[errors[0]][:300]!r}")
    return problems
  error = lines[errors[0]][:300] if len(errors) == 1 else ""
  others = [line[:200] for line in lines
            if line.strip() and not LOG_LINE.match(line)]
  if len(errors) != 1 and not run.escaped:
    problems.append(f"{len(errors)} error lines: exit {run.code}, stderr "
                    f"from {others[:1]} to {others[-1:]}")
  elif error:
    after_error = [line for line in lines[errors[0] + 1:]
                   if line.strip() and not LOG_LINE.match(line)]
    if after_error:
      problems.append(f"error over {len(after_error) + 1} lines: {error!r} "
                      f"then {after_error[0][:200]!r}")
  stopped_while_training = (run.code == 3 or "while training" in error)
  if after != before and not (stopped_while_training
                              and only_start_records_changed(before, after)):
    problems.append(f"model_dir changed by a refused run ({error!r}): "
                    f"{changes(before, after)}")
  return problems


def only_start_records_changed(before, after) -> bool:
  """Whether a run stopped while training changed only what every start
  writes, and recorded in metrics.jsonl how it ended, after the epochs it
  found there."""
  before = before or {}
  changed = set(before) ^ set(after) | {
      k for k in set(before) & set(after) if before[k] != after[k]}
  metrics = changed & {"metrics.jsonl"}
  if metrics:
    *kept, end = after["metrics.jsonl"]
    if (kept != before.get("metrics.jsonl", [])
        or json.loads(end).get("event") != "end"):
      return False
  return set(before) <= set(after) and all(
      name.startswith(START_RECORDS) for name in changed - metrics)


def run_case(index: int, kind: str, generator, seed: int, good: Good,
             scratch: str, running: dict) -> dict:
  """Corrupts, runs and judges case `index`; `running` holds what is known
  of it while it runs, for the watchdog."""
  rng = random.Random(f"{seed}/{index}")
  case_dir = os.path.join(scratch, f"case{index:03d}")
  if os.path.exists(case_dir):
    shutil.rmtree(case_dir)
  os.makedirs(case_dir)
  corruption = generator(rng, good, case_dir)
  model_dir = os.path.join(case_dir, "run")
  earlier = corruption.model_dir == "in_place" or (
      corruption.model_dir == "either" and rng.random() < EARLIER_RUN_SHARE)
  if earlier and corruption.model_dir != "in_place":
    shutil.copytree(good.earlier_run(corruption.dataset), model_dir)
  epochs = EARLIER_EPOCHS + 1 if earlier else 1
  args = [*TINY, f"--epochs={epochs}", *corruption.args,
          f"--model_dir={model_dir}"]
  result = {"index": index, "kind": kind,
            "description": corruption.description,
            "model_dir": "earlier run" if earlier else "new"}
  running.update(result, args=[a.replace(scratch, "SCRATCH") for a in args])
  before = snapshot(model_dir)
  started = time.perf_counter()
  run = run_engine(args, case_dir)
  seconds = time.perf_counter() - started
  problems = problems_of(run, before, snapshot(model_dir))
  if seconds > CASE_SECONDS:
    problems.append(f"took {seconds:.0f}s, over {CASE_SECONDS:.0f}s")
  result.update(outcome="trained" if run.code == 0 else "refused",
                exit_code=run.code, seconds=round(seconds, 2))
  if problems:
    result.update(problems=problems, args=running["args"],
                  stderr_tail=[l for l in run.stderr.splitlines()
                               if not LOG_LINE.match(l)][-12:])
  else:
    shutil.rmtree(case_dir)
  return result


def summary(seed: int, results: list[dict]) -> dict:
  by_kind = {}
  for r in results:
    counts = by_kind.setdefault(r["kind"],
                                {"trained": 0, "refused": 0, "failed": 0})
    counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    counts["failed"] += bool(r.get("problems"))
  return {
      "seed": seed, "cases": len(results),
      "outcomes": {o: sum(r["outcome"] == o for r in results)
                   for o in ("trained", "refused")},
      "by_kind": by_kind,
      "failures": [dict(r, seed=seed) for r in results if r.get("problems")],
      "results": [{k: r.get(k) for k in ("index", "kind", "outcome",
                                         "seconds", "model_dir",
                                         "description")}
                  for r in results],
  }


def main(seed: int, scratch: str, only: list[int]) -> None:
  resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_BYTES,
                                          ADDRESS_SPACE_BYTES))
  out = os.dup(1)  # the summary's, whatever a case does with fd 1
  os.makedirs(scratch, exist_ok=True)
  os.chdir(scratch)  # a relative path a case writes stays in here
  # As each run will, and before writing the inputs runs TensorFlow ops:
  # thread pools are fixed at the first op, and every run sets them again,
  # to the same sizes.
  distributed.init(bind_cpus=False)
  good = Good(os.path.join(scratch, "good"))
  good.train_earlier_runs()
  results, running = [], {}

  def report(extra=()) -> None:
    os.write(out, (json.dumps(summary(seed, [*results, *extra])) +
                   "\n").encode())

  def hang() -> None:
    report([dict(running, outcome="hung", seconds=round(CASE_SECONDS, 2),
                 problems=[f"no result within {CASE_SECONDS:.0f}s: a hang"])])
    os._exit(3)  # pylint: disable=protected-access

  cases = plan()
  for index in only or range(len(cases)):
    kind, generator = cases[index]
    print(f"case {index} ({kind})", file=sys.stderr, flush=True)
    running.clear()
    running.update(index=index, kind=kind, description="(corrupting)")
    watchdog = threading.Timer(CASE_SECONDS, hang)
    watchdog.start()
    try:
      results.append(run_case(index, kind, generator, seed, good, scratch,
                              running))
    finally:
      watchdog.cancel()
  report()


if __name__ == "__main__":
  main(int(sys.argv[1]), os.path.abspath(sys.argv[2]),
       [int(i) for i in sys.argv[3:]])
