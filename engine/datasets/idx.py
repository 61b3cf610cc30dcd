"""The idx file format of MNIST and Fashion-MNIST, plain or gzipped.

An idx file is a 4-byte magic (two zero bytes, a type code, the number of
dimensions), one big-endian uint32 per dimension, then the values. We read
only unsigned bytes (type 0x08), the one type these data sets use, and check
the length against the header so a truncated download is caught here rather
than as a shape error deep inside TensorFlow.
"""
import gzip
import zlib

import numpy as np

from engine.core.errors import UserError

_UNSIGNED_BYTE = 0x08


def read(path: str) -> np.ndarray:
  """Returns the array stored in the idx file at `path` (.gz or not)."""
  try:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
      raw = f.read()
  except FileNotFoundError:
    raise UserError(f"{path}: file not found") from None
  except (OSError, EOFError, zlib.error) as e:
    raise UserError(f"{path}: truncated or corrupt gzip file ({e}); "
                    "replace it with a fresh copy") from None
  return parse(raw, path)


def parse(raw: bytes, path: str = "<bytes>") -> np.ndarray:
  """Decodes the bytes of an idx file; `path` only names it in errors."""
  if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
    raise UserError(f"{path}: not an idx file (bad magic number)")
  if raw[2] != _UNSIGNED_BYTE:
    raise UserError(f"{path}: idx type 0x{raw[2]:02x} is not supported "
                    "(only unsigned bytes, 0x08)")
  ndim = raw[3]
  header = 4 + 4 * ndim
  if ndim == 0 or len(raw) < header:
    raise UserError(f"{path}: truncated idx header")
  shape = tuple(int(d) for d in np.frombuffer(raw, ">u4", ndim, offset=4))
  expected = header + int(np.prod(shape))
  if len(raw) != expected:
    raise UserError(f"{path}: idx header promises {expected} bytes for shape "
                    f"{shape}, file has {len(raw)}; the file is truncated or "
                    "corrupt")
  return np.frombuffer(raw, np.uint8, offset=header).reshape(shape)


def encode(array: np.ndarray) -> bytes:
  """The idx bytes of a uint8 array: how tests make real-format files."""
  array = np.asarray(array, np.uint8)
  header = bytes([0, 0, _UNSIGNED_BYTE, array.ndim])
  return header + np.array(array.shape, ">u4").tobytes() + array.tobytes()
