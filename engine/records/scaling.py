"""A scaling model: what a run's step would take on more nodes.

`python -m engine.runs --scaling --link_gbit=G --link_latency_us=L DIR`
prints it for each run under DIR.

It predicts weak scaling, which is how Horovod's users scale: each process
keeps its batch, and each update's gradients go through a ring allreduce
(Gloo's and NCCL's algorithm for large messages) over the slowest link,
the network between nodes. Take a link of latency alpha and bandwidth
beta. A ring over N processes reduces a message of `bytes` in

  t(N) = 2 (N - 1) alpha + 2 (N - 1) / N * bytes / beta

because each process sends and receives 2 (N - 1) chunks of bytes / N
(nccl-tests' bus bandwidth, bytes / t * 2 (N - 1) / N, is beta for this
reason). Horovod sends an update's gradients as ceil(bytes / fusion
threshold) messages, one fusion buffer each. A step on N nodes then lies
between two bounds:

- no overlap: compute + t(N). This is the engine's step on CPU, whose
  allreduce follows the backward pass (engine/compute/step.py).
- full overlap: max(compute, t(N)). This is a GPU's best case, where the
  transfers hide behind the backward pass.

Efficiency is compute / step: 100% is linear scaling.

`compute` is the run's own step time: the median over its epochs after
the first (which includes tracing) of rank 0's seconds in its step calls
per step. A run of one process, or of one node, gives the compute alone.
A run across nodes includes its own communication, so its predictions err
on the pessimistic side.

The model stops being trustworthy where its assumptions break. It does
not see a switch's contention or oversubscription, stragglers (the slowest
rank sets every step), or a hierarchical or tree allreduce. It also
misses the input pipeline at larger scale, and GPUs of one node sharing a
link. docs/scaling-out.md compares it with measured allreduce times.
"""
import dataclasses
import math
import statistics
from typing import Optional

from engine.compute import communication
from engine.core import run_files
from engine.core.errors import UserError

# Horovod's fusion buffer: its default, which the engine leaves as it is.
FUSION_THRESHOLD_BYTES = communication.HOROVOD_FUSION_THRESHOLD_BYTES
NODES = (8, 16, 32, 64, 128, 256, 512)


@dataclasses.dataclass(frozen=True)
class Link:
  """The network between nodes: seconds per message hop, bytes per
  second."""
  latency: float
  bandwidth: float

  @classmethod
  def of(cls, gbit_per_sec: float, latency_us: float) -> "Link":
    """A link of `gbit_per_sec` Gbit/s and `latency_us` microseconds."""
    if not gbit_per_sec > 0:
      raise UserError(f"--link_gbit={gbit_per_sec:g}: give the link's "
                      "bandwidth in Gbit/s, above 0 (e.g. 10)")
    if not latency_us >= 0:
      raise UserError(f"--link_latency_us={latency_us:g}: give the link's "
                      "latency in microseconds, 0 or more (e.g. 20)")
    return cls(latency=latency_us * 1e-6, bandwidth=gbit_per_sec * 1e9 / 8)


def ring_allreduce_seconds(message_bytes: float, processes: int,
                           link: Link) -> float:
  """A ring allreduce of one message of `message_bytes` over `processes`
  (module docstring); 0 for a process alone."""
  if processes < 2:
    return 0.0
  hops = 2 * (processes - 1)
  return (hops * link.latency
          + hops / processes * message_bytes / link.bandwidth)


def update_allreduce_seconds(gradient_bytes: int, processes: int,
                             link: Link) -> float:
  """One update's allreduce: its gradients in fusion buffers, each a ring
  allreduce."""
  messages = max(1, math.ceil(gradient_bytes / FUSION_THRESHOLD_BYTES))
  return messages * ring_allreduce_seconds(gradient_bytes / messages,
                                           processes, link)


@dataclasses.dataclass(frozen=True)
class Prediction:
  """The step on `nodes` nodes, and its efficiency between the bounds."""
  nodes: int
  allreduce_seconds: float
  efficiency_no_overlap: float    # compute / (compute + allreduce)
  efficiency_full_overlap: float  # compute / max(compute, allreduce)


def predict(compute_seconds: float, gradient_bytes: int, link: Link,
            nodes=NODES) -> list[Prediction]:
  """The step of `compute_seconds` and `gradient_bytes` at each of `nodes`
  over `link` (one process a node)."""
  predictions = []
  for count in nodes:
    allreduce = update_allreduce_seconds(gradient_bytes, count, link)
    predictions.append(Prediction(
        nodes=count, allreduce_seconds=allreduce,
        efficiency_no_overlap=compute_seconds / (compute_seconds
                                                 + allreduce),
        efficiency_full_overlap=compute_seconds / max(compute_seconds,
                                                      allreduce)))
  return predictions


@dataclasses.dataclass(frozen=True)
class Measured:
  """What the model takes from a run's records."""
  compute_seconds: float  # a step's, as the run measured it
  gradient_bytes: int
  world_size: int


def measured(records: list[dict]) -> Optional[Measured]:
  """The run's step time and gradient bytes (module docstring), or None
  when its records do not give them (no epoch done yet)."""
  usable = [r for r in records
            if run_files.is_finite(r.get("step_seconds"))
            and r.get("steps_run") and r.get("gradient_bytes")]
  if not usable:
    return None
  timed = [r for r in usable if r["epoch"] != 1] or usable
  return Measured(
      compute_seconds=statistics.median(
          r["step_seconds"] / r["steps_run"] for r in timed),
      gradient_bytes=usable[-1]["gradient_bytes"],
      world_size=usable[-1]["world_size"])


def described(label: str, run: Optional[Measured], link: Link,
              nodes=NODES) -> str:
  """The prediction for run `label` as text lines: one per node count."""
  if run is None:
    return f"{label}: no finished epoch with step times to predict from"
  lines = [f"{label}: {run.world_size} processes, a step "
           f"{run.compute_seconds * 1e3:.1f} ms, gradients "
           f"{run.gradient_bytes / 1e6:.2f} MB",
           "   nodes  allreduce ms  efficiency: no overlap  full overlap"]
  for prediction in predict(run.compute_seconds, run.gradient_bytes, link,
                            nodes):
    lines.append(f"{prediction.nodes:8d}  "
                 f"{prediction.allreduce_seconds * 1e3:12.2f}  "
                 f"{prediction.efficiency_no_overlap:22.0%}  "
                 f"{prediction.efficiency_full_overlap:12.0%}")
  return "\n".join(lines)
