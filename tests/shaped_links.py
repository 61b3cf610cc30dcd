"""Links between simulated hosts shaped with tc, inside their
namespaces (SimulatedHosts.shape, tests/simulated_hosts.py): a rate on
every host's egress; here, its arithmetic.

tc's token bucket (`tbf`) on each host's interface shapes what the host
sends, so that each direction of every path between two hosts is shaped
once. A delay cannot be added on this machine's kernel: it has no
sch_netem ("Specified qdisc kind is unknown"), so the links keep the
veth's own latency. The shaping goes with the hosts' namespaces.
"""
import re
from typing import Optional

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
