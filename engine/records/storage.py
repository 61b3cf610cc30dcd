"""Writing to model_dir: room for checkpoints, and writes that fail.

A full disk, a quota, a model_dir removed or remounted read-only: any write
of the run (a checkpoint, metrics.jsonl, TensorBoard events, an export,
flags.txt) that fails becomes one line (errors.WriteFailed) naming what was
being written, where, its size and the free space left, instead of a
traceback from deep inside TensorFlow. Callers remove what the failed write
left half-done, so the checkpoints before it stay the run's latest.
"""
import contextlib
import errno
import os
import shutil
from typing import Iterator, Optional

from absl import logging
import numpy as np
import tensorflow as tf

from engine.core.errors import WriteFailed

# Failures a user can act on, by what their messages say (TensorFlow's file
# errors carry the system's text, not its errno).
_REASONS = {code: os.strerror(code) for code in (
    errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.ENOENT, errno.EACCES,
    errno.EPERM, errno.ENOTDIR, errno.EIO)}
_ADVICE = {
    errno.ENOSPC: "free some space",
    errno.EDQUOT: "free some space under your quota",
    errno.EROFS: "make the file system writable",
    errno.ENOENT: "was model_dir removed? put it back",
    errno.ENOTDIR: "was model_dir replaced by a file? put it back",
    errno.EACCES: "make model_dir writable",
    errno.EPERM: "make model_dir writable",
}


@contextlib.contextmanager
def writing(what: str, path: str,
            size: Optional[int] = None) -> Iterator[None]:
  """Turns an error while writing `what` (of `size` bytes, if known) to
  `path` into WriteFailed, whose message ends with what to do."""
  try:
    yield
  except (OSError, tf.errors.OpError) as error:
    code, reason = _reason(error)
    advice = _ADVICE.get(code, "check the file system")
    of_size = f" ({human(size)})" if size is not None else ""
    raise WriteFailed(
        f"could not write {what} {path}{of_size}: {reason}; "
        f"{human(free_space(path))} free on its file system; {advice}"
        ) from None


def free_space(path: str) -> int:
  """Bytes free on the file system that holds `path` (or would: its
  nearest existing ancestor)."""
  directory = os.path.abspath(path)
  while not os.path.isdir(directory):
    directory = os.path.dirname(directory)
  return shutil.disk_usage(directory).free


def size_of(variables) -> int:
  """Bytes of the variables' values: about a checkpoint's size."""
  return sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size
             for v in variables)


def warn_if_short_of_space(model_dir: str, *, checkpoint_size: int,
                           keep: int) -> None:
  """Warns when model_dir's file system has less room than the run's
  checkpoints need: the `keep` latest, the one being written before the
  oldest goes, and the best."""
  needed = (keep + 2) * checkpoint_size
  free = free_space(model_dir)
  if free < needed:
    logging.warning(
        "%s has %s free, and %d checkpoints of %s need %s (--keep_checkpoints"
        "=%d, one being written, the best): a save may fail; free space or "
        "choose a --model_dir with room", model_dir, human(free), keep + 2,
        human(checkpoint_size), human(needed), keep)


def remove(*paths: str) -> None:
  """Removes files and directories that a failed write left, if there."""
  for path in paths:
    if os.path.isdir(path):
      shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
      with contextlib.suppress(OSError):
        os.remove(path)


def human(size: int) -> str:
  """A size as people read it: 612 bytes, 12.3 KB, 4.5 MB, 1.2 GB."""
  for unit, scale in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
    if size >= scale:
      return f"{size / scale:.1f} {unit}"
  return f"{size} bytes"


def _reason(error: Exception) -> tuple[int, str]:
  if isinstance(error, OSError) and error.errno in _REASONS:
    return error.errno, error.strerror
  message = getattr(error, "message", None) or str(error)
  for code, text in _REASONS.items():
    if text.lower() in message.lower():
      return code, text
  lines = message.strip().splitlines()
  return 0, lines[0] if lines else type(error).__name__

