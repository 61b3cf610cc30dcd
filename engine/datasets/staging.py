"""Staging: each process copies the TFRecord files it reads to node-local
storage before training, and reads them there.

Why: at HPC scale the parallel file system cannot feed every node at once
(MLPerf HPC's CosmoFlow stages its 1.7 TB this way, and the time counts in
its time to train). Rank r reads files r, r + N, ... of each split
(RecordFiles.rank_files), so each process copies exactly those: every file is
copied once in the whole job, the processes of a node split their node's
copying, and no process waits for another's files. A copy of the same size
and modification time as its source is already staged: a resume or a
rerun copies nothing. A copy is written under a temporary name and renamed
when complete, so an interrupted staging leaves no half file under a
file's name.
"""
import dataclasses
import hashlib
import os
import shutil
import time

from engine.core.errors import UserError
from engine.datasets.splits import Shard, Splits

MB = 1 << 20


@dataclasses.dataclass(frozen=True)
class Staged:
  """What one process staged: its files, their bytes, the bytes it copied
  (0 when all were there), and the seconds it took."""
  files: int
  bytes: int
  copied_bytes: int
  seconds: float


def stage(splits: Splits, *, data_dir: str, stage_dir: str, rank: int,
          world_size: int) -> tuple[Splits, Staged]:
  """The splits reading this rank's files from `stage_dir`, copied there
  if they are not yet."""
  began = time.monotonic()
  stage_dir = _expanded(stage_dir)
  if not (splits.train.stageable and splits.test.stageable):
    raise UserError(f"--stage_dir={stage_dir}: staging copies TFRecord files "
                    "(--dataset=tfrecord); these data are not in them")
  if not os.path.isdir(stage_dir):
    raise UserError(f"--stage_dir={stage_dir}: no such directory; give "
                    "node-local storage that exists on every node ($TMPDIR, "
                    "/tmp, a burst buffer)")
  root = os.path.join(stage_dir, _staged_name(data_dir))
  staged = {}  # source path: its copy
  for source in (splits.train, splits.test):
    for path in source.rank_files(Shard(rank, world_size)):
      staged[path] = os.path.join(root, os.path.relpath(path, data_dir))
  missing = [(path, copy) for path, copy in staged.items()
             if not _is_copy(copy, path)]
  needed = sum(os.path.getsize(path) for path, _ in missing)
  free = shutil.disk_usage(stage_dir).free
  if needed > free:
    raise UserError(f"--stage_dir={stage_dir}: this process's share of the "
                    f"files needs {needed / MB:.1f} MB and {free / MB:.1f} MB "
                    "are free; free space or give larger node-local storage")
  for path, copy in missing:
    _copy(path, copy, stage_dir)

  def staged_files(source):
    return dataclasses.replace(source, files=tuple(
        staged.get(path, path) for path in source.files))

  return (dataclasses.replace(splits, train=staged_files(splits.train),
                              test=staged_files(splits.test)),
          Staged(files=len(staged),
                 bytes=sum(map(os.path.getsize, staged.values())),
                 copied_bytes=needed, seconds=time.monotonic() - began))


def _expanded(stage_dir: str) -> str:
  """`stage_dir` with this process's environment variables ('$TMPDIR',
  quoted on the command line: each node's own)."""
  expanded = os.path.expandvars(stage_dir)
  if "$" in expanded:
    raise UserError(f"--stage_dir={stage_dir}: {expanded} names an "
                    "environment variable this process does not have")
  return expanded


def _staged_name(data_dir: str) -> str:
  """The data's directory in stage_dir: its name and a digest of its full
  path, so two data sets of one name do not share copies."""
  path = os.path.realpath(data_dir)
  digest = hashlib.sha1(path.encode()).hexdigest()[:10]
  return f"{os.path.basename(path)}-{digest}"


def _is_copy(copy: str, path: str) -> bool:
  try:
    mine, source = os.stat(copy), os.stat(path)
  except FileNotFoundError:
    return False
  return (mine.st_size == source.st_size
          and int(mine.st_mtime) == int(source.st_mtime))


def _copy(path: str, copy: str, stage_dir: str) -> None:
  partial = f"{copy}.partial-{os.getpid()}"
  try:
    os.makedirs(os.path.dirname(copy), exist_ok=True)
    shutil.copyfile(path, partial)
    shutil.copystat(path, partial)
    os.replace(partial, copy)
  except OSError as e:
    if os.path.exists(partial):
      os.remove(partial)
    raise UserError(f"--stage_dir={stage_dir}: copying {path} failed "
                    f"({e.strerror}); free space or give other node-local "
                    "storage") from None
