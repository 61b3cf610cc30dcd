"""Arrays on disk by name, none read until asked: the members of an .npz,
the .npy files of a directory, the datasets of an HDF5 file.

Each is read by rows, so that no rank holds a data set that does not fit
in memory: .npy files and the members of an uncompressed .npz (what
`np.savez` writes) by offset with `os.pread`, HDF5 datasets by slices
through h5py. A compressed .npz (`np.savez_compressed`) cannot be read by
rows and is loaded into memory. engine/datasets/arrays.py checks what
they hold and makes the splits.
"""
import os
import zipfile

from absl import logging
import numpy as np

from engine.core.errors import UserError

FORMATS = ("an .npz, an .h5/.hdf5 file, or a directory of x_train.npy, "
           "y_train.npy, x_test.npy, y_test.npy")
HDF5_SUFFIXES = (".h5", ".hdf5")


def open_arrays(path: str) -> dict:
  """The arrays at `path` by name (an HDF5 dataset by its full path)."""
  if os.path.isdir(path):
    return {name[:-4]: _NpyFile(os.path.join(path, name))
            for name in sorted(os.listdir(path)) if name.endswith(".npy")}
  if not os.path.exists(path):
    raise UserError(f"--data_dir={path}: no such file or directory; give "
                    f"{FORMATS}")
  if path.endswith(".npz"):
    return _open_npz(path)
  if path.endswith(HDF5_SUFFIXES):
    return _open_hdf5(path)
  raise UserError(f"--data_dir={path}: not an .npz, .h5 or .hdf5 file; give "
                  f"{FORMATS}")


def _open_npz(path: str) -> dict:
  try:
    archive = zipfile.ZipFile(path)
    members = archive.infolist()
  except (zipfile.BadZipFile, OSError) as e:
    raise UserError(f"{path}: not a readable .npz ({e})") from None
  arrays = {}
  for member in members:
    if not member.filename.endswith(".npy"):
      continue
    name = member.filename[:-4]
    if member.compress_type == zipfile.ZIP_STORED:
      arrays[name] = _NpyFile(path, _stored_member_offset(path, member),
                              label=f"{path}:{name}")
    else:
      arrays[name] = _load_compressed(archive, member, path)
  return arrays


def _stored_member_offset(path: str, member: zipfile.ZipInfo) -> int:
  """Where an uncompressed member's bytes start: after its local header
  (30 bytes, its name, and its extra field, which may differ from the
  central directory's)."""
  with open(path, "rb") as f:
    f.seek(member.header_offset)
    header = f.read(30)
  if len(header) < 30 or header[:4] != b"PK\x03\x04":
    raise UserError(f"{path}: damaged .npz (bad header of {member.filename})")
  name_length = int.from_bytes(header[26:28], "little")
  extra_length = int.from_bytes(header[28:30], "little")
  return member.header_offset + 30 + name_length + extra_length


def _open_hdf5(path: str) -> dict:
  import h5py  # pylint: disable=import-outside-toplevel
  arrays = {}

  def add(name, item):
    if isinstance(item, h5py.Dataset):  # by its full path: group/name
      arrays[name] = _Hdf5Dataset(item, f"{path}:{name}")

  try:
    h5py.File(path, "r").visititems(add)
  # Damaged metadata makes h5py raise many exception types (OSError,
  # RuntimeError, KeyError, ...) at the open or the walk, each meaning the
  # same.
  except Exception as e:  # pylint: disable=broad-except
    raise UserError(f"{path}: not a readable HDF5 file ({e})") from None
  return arrays


class Stored:
  """An array by name. Each kind has `shape`, `dtype`, `label` (where it
  is, for messages), `read(rows)` for increasing rows, and `all()`."""

  def names(self) -> tuple[str, ...]:
    """The array as class names: 1-D strings (or bytes)."""
    if len(self.shape) != 1:
      raise UserError(f"{self.label}: class names must be a 1-D array of "
                      "strings")
    return tuple(n.decode() if isinstance(n, bytes) else str(n)
                 for n in self.all())


class _NpyFile(Stored):
  """An .npy array on disk (a file, or a member of an uncompressed .npz at
  `offset`), read by rows with os.pread."""

  def __init__(self, path: str, offset: int = 0, label: str = ""):
    self.label = label or path
    try:
      self._fd = os.open(path, os.O_RDONLY)
      with open(path, "rb") as f:
        f.seek(offset)
        version = np.lib.format.read_magic(f)
        read_header = (np.lib.format.read_array_header_1_0 if version ==
                       (1, 0) else np.lib.format.read_array_header_2_0)
        shape, fortran, dtype = read_header(f)
        self._data_offset = f.tell()
    except OSError as e:
      raise UserError(f"{self.label}: cannot read it ({e.strerror})") from None
    # A garbled header makes numpy's parser raise almost any exception type
    # (ValueError, SyntaxError, tokenize.TokenError), each meaning the same.
    except Exception as e:  # pylint: disable=broad-except
      raise UserError(f"{self.label}: not an .npy array ({e})") from None
    if fortran and len(shape) > 1:
      raise UserError(f"{self.label}: stored in Fortran order, which cannot "
                      "be read by rows; save it with np.ascontiguousarray")
    if dtype.hasobject:
      raise UserError(f"{self.label}: holds Python objects; save plain "
                      "numbers (or strings, for class_names)")
    self.shape, self.dtype = tuple(shape), dtype
    self._row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
    expected = self._data_offset + self._row_bytes * (shape[0] if shape else 1)
    if os.fstat(self._fd).st_size < expected:
      raise UserError(f"{self.label}: truncated (its header promises "
                      f"{shape}, {expected} bytes with the header; the file "
                      f"has {os.fstat(self._fd).st_size})")

  def read(self, rows) -> np.ndarray:
    chunks = [os.pread(self._fd, self._row_bytes,
                       self._data_offset + int(r) * self._row_bytes)
              for r in rows]
    return np.frombuffer(b"".join(chunks), self.dtype).reshape(
        len(chunks), *self.shape[1:])

  def all(self) -> np.ndarray:
    """In one read (labels: a million rows are a million reads by row)."""
    count = self.shape[0] if self.shape else 1
    raw = os.pread(self._fd, self._row_bytes * count, self._data_offset)
    return np.frombuffer(raw, self.dtype).reshape(self.shape)


class _Hdf5Dataset(Stored):
  """An HDF5 dataset, read by slices (h5py reads only the rows asked)."""

  def __init__(self, dataset, label: str):
    self._dataset = dataset
    self.label = label
    self.shape, self.dtype = tuple(dataset.shape), dataset.dtype

  def read(self, rows) -> np.ndarray:
    return self._dataset[np.asarray(rows, dtype=np.int64)]

  def all(self) -> np.ndarray:
    return self._dataset[()]


class InMemory(Stored):
  """An array already in memory, with the interface of the readers."""

  def __init__(self, array: np.ndarray, label: str = ""):
    self.array = array
    self.label = label
    self.shape, self.dtype = array.shape, array.dtype

  def read(self, rows) -> np.ndarray:
    return self.array[np.asarray(rows, dtype=np.int64)]

  def all(self) -> np.ndarray:
    return self.array


def _load_compressed(archive: zipfile.ZipFile, member: zipfile.ZipInfo,
                      path: str) -> InMemory:
  """A compressed .npz member, loaded whole (zip streams cannot be read by
  rows)."""
  label = f"{path}:{member.filename[:-4]}"
  logging.info("%s is compressed and is read into memory; save with "
               "np.savez (not savez_compressed) to read it by rows", label)
  try:
    with archive.open(member) as f:
      return InMemory(np.lib.format.read_array(f, allow_pickle=False), label)
  except (ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
    raise UserError(f"{label}: cannot read it ({e})") from None
