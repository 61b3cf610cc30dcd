"""CIFAR-10 from its original python-pickle batches, extracted or archived.

The "python version" from the CIFAR site is `cifar-10-python.tar.gz`, which
holds `cifar-10-batches-py/`: five training batches, a test batch and
`batches.meta`. `--data_dir` may hold that directory, be that directory (as in
the Keras cache), or hold the archive, which is read in place so that a
read-only data set mount works and nothing is written next to it. There is no
default directory and nothing is downloaded.
"""
import io
import os
import pickle
import posixpath
import tarfile
import zlib

import numpy as np

from engine.core.errors import UserError
from engine.datasets import statistics
from engine.datasets.sources import Examples
from engine.datasets.splits import DatasetInfo, Splits

BATCHES_DIR = "cifar-10-batches-py"
ARCHIVE = "cifar-10-python.tar.gz"
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
IMAGE_SHAPE = (32, 32, 3)
NUM_CLASSES = 10
# batches.meta's label_names, in label order.
CLASS_NAMES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog",
               "horse", "ship", "truck")
_HOW_TO_POINT = f"pass --data_dir=DIR holding {BATCHES_DIR}/ or {ARCHIVE}"
_PIXELS_PER_IMAGE = 32 * 32 * 3


def load(data_dir: str) -> Splits:
  batches = _read_batches(data_dir)
  train = _concatenate([batches[name] for name in TRAIN_BATCHES])
  test = _concatenate([batches[TEST_BATCH]])
  mean, std = statistics.exact_channel_statistics(train.images)
  info = DatasetInfo(
      name="cifar10", image_shape=IMAGE_SHAPE, num_classes=NUM_CLASSES,
      num_train=len(train.images), num_test=len(test.images), mean=mean,
      std=std, shift_fill="constant", class_names=CLASS_NAMES)
  return Splits(train=train, test=test, info=info)


def _read_batches(data_dir: str) -> dict[str, Examples]:
  """Every batch by name, from whichever layout `data_dir` has."""
  if not data_dir:
    raise UserError(f"--data_dir is required for CIFAR-10; {_HOW_TO_POINT}")
  if not os.path.isdir(data_dir):
    problem = ("not a directory" if os.path.exists(data_dir) else
               "no such directory")
    raise UserError(f"--data_dir={data_dir}: {problem}; {_HOW_TO_POINT}")
  nested = os.path.join(data_dir, BATCHES_DIR)
  if os.path.isdir(nested):
    return _read_directory(nested)
  # The batches directory itself, under its own or any other name.
  if any(os.path.exists(os.path.join(data_dir, name))
         for name in (*TRAIN_BATCHES, TEST_BATCH)):
    return _read_directory(data_dir)
  archive = os.path.join(data_dir, ARCHIVE)
  if os.path.isfile(archive):
    return _read_archive(archive)
  raise UserError(f"--data_dir={data_dir}: holds neither {BATCHES_DIR}/ nor "
                  f"{ARCHIVE}; {_HOW_TO_POINT}")


def _read_directory(batches_dir: str) -> dict[str, Examples]:
  batches = {}
  for name in (*TRAIN_BATCHES, TEST_BATCH):
    path = os.path.join(batches_dir, name)
    try:
      with open(path, "rb") as f:
        raw = f.read()
    except FileNotFoundError:
      raise UserError(f"{path}: file not found; {BATCHES_DIR}/ must hold "
                      f"{', '.join(TRAIN_BATCHES)} and {TEST_BATCH}") from None
    except OSError as e:
      raise UserError(f"{path}: cannot read it ({e.strerror})") from None
    batches[name] = _decode(raw, path)
  return batches


def _read_archive(archive: str) -> dict[str, Examples]:
  """Reads the batches out of the .tar.gz in one pass, extracting nothing.

  Stream mode decompresses the archive once, front to back; random access
  into a gzipped tar would decompress it again for every member.
  """
  wanted = {f"{BATCHES_DIR}/{name}": name
            for name in (*TRAIN_BATCHES, TEST_BATCH)}
  batches = {}
  try:
    with tarfile.open(archive, "r|gz") as tar:
      for member in tar:
        member_name = posixpath.normpath(member.name)
        if member.isfile() and member_name in wanted:
          raw = tar.extractfile(member).read()
          batches[wanted.pop(member_name)] = _decode(
              raw, f"{archive} member {member_name}")
  except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
    raise UserError(f"{archive}: truncated or corrupt archive ({e}); replace "
                    "it with a fresh copy") from None
  if wanted:
    raise UserError(f"{archive}: has no member {', '.join(sorted(wanted))}; "
                    "it is not the CIFAR-10 python version")
  return batches


class _BatchUnpickler(pickle.Unpickler):
  """Unpickles only what a CIFAR-10 batch is made of.

  A pickle may call any function it names, so a file from a mirror could run
  code. A batch needs just numpy's array reconstruction and, when re-pickled
  by Python 3 with protocol 2, `_codecs.encode` for bytes; anything else is
  refused instead of imported.
  """
  _ALLOWED = frozenset({
      ("numpy.core.multiarray", "_reconstruct"),
      ("numpy._core.multiarray", "_reconstruct"),  # numpy >= 2
      ("numpy", "ndarray"),
      ("numpy", "dtype"),
      ("_codecs", "encode"),
  })

  def find_class(self, module, name):
    if (module, name) not in self._ALLOWED:
      raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
    return super().find_class(module, name)


def _decode(raw: bytes, where: str) -> Examples:
  """Checks one pickled batch and returns it as NHWC images and labels.

  `where` names the file or archive member in errors. The batches were
  pickled by Python 2, whose byte strings only load unchanged as bytes.
  """
  try:
    batch = _BatchUnpickler(io.BytesIO(raw), encoding="bytes").load()
  # Garbage makes unpickling raise almost any exception type, and each one
  # means the same: the file is not a batch.
  except Exception as e:  # pylint: disable=broad-except
    raise UserError(f"{where}: not a readable pickle ({type(e).__name__}: "
                    f"{e}); the file is truncated or corrupt, replace it with "
                    "a fresh copy") from None
  if not isinstance(batch, dict) or not {b"data", b"labels"} <= batch.keys():
    raise UserError(f"{where}: not a CIFAR-10 batch (a dict with keys "
                    "b'data' and b'labels')")
  data, labels = batch[b"data"], np.asarray(batch[b"labels"])
  if not isinstance(data, np.ndarray) or data.dtype != np.uint8:
    what = data.dtype if isinstance(data, np.ndarray) else type(data).__name__
    raise UserError(f"{where}: b'data' is {what}, not a uint8 array")
  if data.size % _PIXELS_PER_IMAGE:
    raise UserError(f"{where}: b'data' has {data.size} bytes, not a multiple "
                    f"of {_PIXELS_PER_IMAGE} (one 32x32 RGB image)")
  # Each row is three 32x32 planes, red then green then blue.
  images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
  if labels.shape != (len(images),):
    raise UserError(f"{where}: {len(images)} images but labels of shape "
                    f"{labels.shape}")
  if labels.size and labels.dtype.kind not in "iu":
    raise UserError(f"{where}: labels are {labels.dtype}, not integers")
  if labels.size and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
    raise UserError(f"{where}: labels go from {labels.min()} to "
                    f"{labels.max()}, CIFAR-10 has classes 0 to "
                    f"{NUM_CLASSES - 1}")
  return Examples(images, labels.astype(np.int64))


def _concatenate(batches: list[Examples]) -> Examples:
  """One split from its batches, in order, its images in C order.

  The batches' images are transposed views of planar data; given no `out`,
  np.concatenate would keep that planar memory order.
  """
  images = np.empty((sum(len(b.images) for b in batches), *IMAGE_SHAPE),
                    np.uint8)
  np.concatenate([b.images for b in batches], out=images)
  return Examples(images, np.concatenate([b.labels for b in batches]))
