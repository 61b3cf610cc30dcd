"""Each level of a run's links, inside a host and across hosts, from the
allreduces every rank timed at the window's end
(engine/distributed/link_probe.py).

As in the step's allreduce, a repeat ends together on every rank of its
process set: the rank that reached it last waited least, so the least
time any rank took is the transfer. Its bus bandwidth is bytes * 2 (N - 1)
/ N over that (nccl-tests' measure). Inside a host, the slowest host's is
the level's.
"""
import statistics
from typing import Optional

from engine.records import scaling

# The level the allreduce over every rank runs at: its slowest link's.
ACROSS = "across hosts"
# The probe's bytes without a link named: the gradients' (what the step
# moves), within these.
SMALLEST_BYTES, LARGEST_BYTES = 1 << 20, 16 << 20
# With a link named (--profile_link_gbit): enough bytes that the ring's
# bandwidth term is this many times its latency term (over 90% of the
# time is the bandwidth's), however fast the link and many the hosts, and
# at most what a repeat moves in SECONDS_A_REPEAT.
BANDWIDTH_OVER_LATENCY = 9
SECONDS_A_REPEAT = 0.5


def probe_bytes(gradient_bytes: int, hosts: int,
                link: Optional[scaling.Link]) -> int:
  """The bytes each probe allreduces across `hosts` (a multiple of 4):
  16 MiB measure a 1 Gbit/s link's bandwidth, but on a 100 Gbit/s ring
  over 64 hosts, 126 hops of 5 us are a fifth of their time."""
  if link is None:
    nbytes = min(max(gradient_bytes, SMALLEST_BYTES), LARGEST_BYTES)
  else:
    # A ring of N: 2 (N - 1) hops of alpha, 2 (N - 1) / N * bytes / beta.
    ring = max(hosts, 2)
    filled = BANDWIDTH_OVER_LATENCY * ring * link.latency * link.bandwidth
    most = SECONDS_A_REPEAT * link.bandwidth * ring / (2 * (ring - 1))
    nbytes = min(max(gradient_bytes, filled, SMALLEST_BYTES), most)
  return int(nbytes) // 4 * 4


def of(ranks: list[dict]) -> list[dict]:
  """Each level probed: its name, processes, hosts (inside a host: how
  many were probed, and the slowest), and bus bandwidth (the median of
  the repeats); [] where nothing was probed."""
  levels = {}
  for rank in ranks:
    for level, seconds in rank["link_probe"]["seconds"].items():
      group = rank["host"] if level != ACROSS else ACROSS
      levels.setdefault(level, {}).setdefault(group, []).append(seconds)
  found = []
  for level, groups in levels.items():
    measured = [_measured(ranks[0]["link_probe"]["bytes"], timed)
                for timed in groups.values()]
    slowest = min(range(len(measured)),
                  key=lambda i: measured[i]["bus_gbit"])
    if level == ACROSS:  # one process set, a process a host
      found.append(dict(measured[0], level=level,
                        hosts=measured[0]["processes"]))
    else:
      found.append(dict(measured[slowest], level=level, hosts=len(groups),
                        host=list(groups)[slowest]))
  return sorted(found, key=lambda level: level["level"] == ACROSS)


def _measured(nbytes: int, timed: list[list[float]]) -> dict:
  """A process set's repeats, each rank's seconds: its bus bandwidth."""
  processes = len(timed)
  transfers = [min(repeat) for repeat in zip(*timed)]
  bus_bytes = nbytes * 2 * (processes - 1) / processes
  return dict(processes=processes, bytes=nbytes,
              bus_gbit=8e-9 * bus_bytes / statistics.median(transfers))


def described(levels: list[dict], link_gbit: Optional[float]) -> str:
  """The levels as the report's table says them: "probed with 1.05 MB
  allreduces: inside a host 3.2 Gbit/s (...), across hosts ..."."""
  said = []
  for level in levels:
    if level["level"] == ACROSS:
      where = f"{level['processes']} processes, one a host"
      if link_gbit:
        where += f"; {level['bus_gbit'] / link_gbit:.0%} of the link"
    else:
      where = f"{level['host']}'s {level['processes']} processes" + (
          f", the slowest of {level['hosts']} hosts" if level["hosts"] > 1
          else "")
    said.append(f"{level['level']} {rate(level['bus_gbit'])} ({where})")
  return (f"probed with {levels[0]['bytes'] / 1e6:.3g} MB allreduces: "
          + ", ".join(said))


def rate(gbit: float) -> str:
  return f"{gbit:.3g} Gbit/s" if gbit >= 1 else f"{1e3 * gbit:.3g} Mbit/s"
