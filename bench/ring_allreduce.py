"""(library) The ring allreduce's cost as nccl-tests counts it, and the
alpha-beta model fitted to measured times: no TensorFlow, no Horovod. The
model itself is engine/records/scaling.py's, which engine.runs --scaling predicts
with (its Link: alpha is `latency`, beta `bandwidth`).

A ring allreduce of `bytes` over n processes sends 2(n-1)/n x bytes out of
each process, in 2(n-1) steps that each pay the link's latency alpha once:

  t(bytes) = 2(n-1) alpha + 2(n-1)/n x bytes / beta

where beta is the link's bandwidth in bytes/s. nccl-tests
(github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md) reports the algorithm
bandwidth algbw = bytes / t and the bus bandwidth busbw = algbw x 2(n-1)/n,
which is the bandwidth each link carried, and so comparable with the
link's rate whatever n is.
"""
from typing import Sequence

import numpy as np

from engine.records import scaling


def bus_factor(processes: int) -> float:
  """busbw / algbw for an allreduce over `processes`: 2(n-1)/n."""
  if processes < 2:
    raise ValueError(f"an allreduce over {processes} process(es) moves no "
                     "data between them; busbw needs 2 or more")
  return 2 * (processes - 1) / processes


def algbw(nbytes: float, seconds: float) -> float:
  """The algorithm bandwidth, bytes/s: the message's bytes over the time."""
  return nbytes / seconds


def busbw(nbytes: float, seconds: float, processes: int) -> float:
  """The bus bandwidth, bytes/s: algbw x 2(n-1)/n."""
  return algbw(nbytes, seconds) * bus_factor(processes)


def fit(nbytes: Sequence[float], seconds: Sequence[float],
        processes: int) -> scaling.Link:
  """The link (alpha and beta) fitted by least squares to allreduce times, each
  residual relative to its time (weights 1/t): plain least squares would
  fit the largest messages alone, whose times are a thousand times the
  smallest's, and say nothing of alpha.

  Raises ValueError for fewer than two distinct sizes, or where the fit
  gives a non-positive bandwidth (times that do not grow with the size).
  """
  x = np.asarray(nbytes, dtype=float)
  t = np.asarray(seconds, dtype=float)
  if x.shape != t.shape:
    raise ValueError(f"{x.size} sizes but {t.size} times")
  if len(set(x.tolist())) < 2:
    raise ValueError("fitting alpha and beta needs two or more sizes")
  if (t <= 0).any():
    raise ValueError("every time must be positive")
  # t = a + b x, each row divided by t: minimises the relative residuals.
  design = np.stack([np.ones_like(x), x], axis=1) / t[:, None]
  (a, b), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
  if b <= 0:
    raise ValueError("the times do not grow with the size: no bandwidth "
                     f"to fit (slope {b:.3g} s/byte)")
  return scaling.Link(latency=float(a) / (2 * (processes - 1)),
                      bandwidth=bus_factor(processes) / float(b))
