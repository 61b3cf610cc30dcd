"""Links between simulated hosts shaped with tc, inside their
namespaces (tests/simulated_hosts.py): a rate on every host's egress.

tc's token bucket (`tbf`) on each host's interface shapes what the host
sends, so that each direction of every path between two hosts is shaped
once. A delay cannot be added on this machine's kernel: it has no
sch_netem ("Specified qdisc kind is unknown"), so the links keep the
veth's own latency. The shaping goes with the hosts' namespaces.
"""
import re
import subprocess
import sys
from typing import Optional

from tests import simulated_hosts

_RATE = re.compile(r"(\d+(?:\.\d+)?)(mbit|gbit)")


def link_rate(link: str) -> Optional[float]:
  """A --links entry's rate in bits/s; None for `unshaped`."""
  if link == "unshaped":
    return None
  match = _RATE.fullmatch(link)
  if not match:
    raise ValueError(f"--links: {link!r} is neither `unshaped` nor a rate "
                     "such as 1gbit or 500mbit")
  return float(match.group(1)) * {"mbit": 1e6, "gbit": 1e9}[match.group(2)]


def burst_bytes(rate: float, burst_ms: float) -> int:
  """tbf's bucket for `rate` bits/s: `burst_ms` of it, at least 64 KB (a
  GSO packet)."""
  return max(64 * 1024, int(rate / 8 * burst_ms / 1e3))


def shape(hosts: simulated_hosts.SimulatedHosts, link: str,
          burst_ms: float) -> None:
  """Every host's egress shaped to `link` (tbf, a bucket of `burst_ms` at
  the rate), inside its namespace; `unshaped` removes the shaping."""
  rate = link_rate(link)
  for i, _ in enumerate(hosts.names):
    qdisc = ["tc", "qdisc"]
    if rate is None:
      qdisc += ["del", "dev", hosts.interface, "root"]
    else:
      qdisc += ["replace", "dev", hosts.interface, "root", "tbf", "rate",
                f"{rate:.0f}bit", "burst", str(burst_bytes(rate, burst_ms)),
                "latency", "100ms"]
    done = subprocess.run(hosts.on_host(i, qdisc), capture_output=True,
                          text=True)
    # Deleting the root qdisc of an unshaped interface fails: nothing to do.
    if done.returncode and rate is not None:
      sys.exit(f"{' '.join(qdisc)} on {hosts.names[i]} failed: "
               f"{done.stderr.strip()}")
