"""Timed allreduces inside each host and across hosts: what each level of
a run's links carries.

One ring over every rank moves its bytes at its slowest link's bandwidth,
which on several hosts is the network's; it cannot say whether a host's
own links (shared memory, loopback) keep up, nor what the network gives a
ring of its own. Horovod's Gloo has no hierarchical allreduce to read the
levels from, so `LinkProbe.probe` times allreduces of its own on Horovod
process sets: one on each host's ranks (the hosts at once: each host's
links are its own), then one on a rank of each host. The step report
turns the times into each level's bus bandwidth
(engine/records/link_levels.py).

Process sets made after hvd.init need Horovod started to take them
(`World.dynamic_process_sets`, engine/distributed/world.py), which an
elastic run is not: Horovod reports hangs when dynamic process sets meet
a change of workers (horovod#4021). Without them, nothing is probed.
"""
import socket
import time

import horovod.tensorflow as hvd
import tensorflow as tf

INSIDE, ACROSS = "inside a host", "across hosts"
REPEATS = 3  # timed, after one that sets the process set's links up


class LinkProbe:
  """Every rank probes at the same point (a window's end): the process
  sets are made at the first probe, a collective of every rank."""

  def __init__(self, dynamic_process_sets: bool):
    """`dynamic_process_sets`: whether Horovod was started to take them;
    if not, nothing is probed."""
    self._dynamic_process_sets = dynamic_process_sets
    self._sets = None  # level -> the process set this rank is in

  def probe(self, nbytes: int) -> dict:
    """`bytes` allreduced (`nbytes`, as many as the link's speed and the
    hosts need: records/link_levels.probe_bytes), and `seconds`: the
    levels this rank took part in -> its seconds for each repeat; no
    levels where the run has one (a host, or a rank a host) or Horovod
    takes no process sets now."""
    if self._sets is None:
      self._sets = _process_sets() if (
          hvd.size() > 1 and self._dynamic_process_sets) else {}
    data = tf.zeros([nbytes // 4], tf.float32)
    return dict(bytes=nbytes, seconds={
        level: _timed(data, process_set, level.replace(" ", "_"))
        for level, process_set in self._sets.items()})


def _process_sets() -> dict:
  """Each host's ranks, and the first rank of each host, as process sets
  (made by every rank, in the same order); the levels this rank is in."""
  hosts = hvd.allgather_object(socket.gethostname(), name="link_probe_hosts")
  by_host = {}
  for rank, host in enumerate(hosts):
    by_host.setdefault(host, []).append(rank)
  inside = [ranks for ranks in by_host.values() if len(ranks) > 1]
  across = [ranks[0] for ranks in by_host.values()]
  if not inside or len(across) < 2:
    return {}
  mine = {}
  for level, ranks in [*((INSIDE, r) for r in inside), (ACROSS, across)]:
    process_set = hvd.add_process_set(ranks)
    if hvd.rank() in ranks:
      mine[level] = process_set
  return mine


def _timed(data: tf.Tensor, process_set, name: str) -> list[float]:
  hvd.allreduce(data, op=hvd.Sum, process_set=process_set, name=name)
  seconds = []
  for _ in range(REPEATS):
    began = time.perf_counter()
    hvd.allreduce(data, op=hvd.Sum, process_set=process_set, name=name)
    seconds.append(time.perf_counter() - began)
  return seconds
