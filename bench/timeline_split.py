"""(library) A train step's time split into compute, communication and their
overlap, from Horovod's timeline alone. No TensorFlow, no Horovod.

Horovod's timeline (HOROVOD_TIMELINE; the engine's --horovod_timeline) is
a Chrome trace written by rank 0: one trace "process" per tensor, and for
each reduction of it a NEGOTIATE_ALLREDUCE span (from the tensor's
negotiation start on rank 0 until every rank has it ready) followed by an
ALLREDUCE span (the fusion-buffer copies and the collective itself,
GLOO_ALLREDUCE or MPI_ALLREDUCE, nested in it). A tensor reduced once a
step is reduced for the k-th time in step k. For step k, with end(k) the
end of its last ALLREDUCE and ready(k) the start of its last negotiation
(the last gradient handed to Horovod):

  step        end(k) - end(k-1)
  compute     ready(k) - end(k-1): the update, the next batch, the forward
              and backward passes, until the last gradient is handed over
  exposed     end(k) - ready(k): communication nothing hides, the wait for
              the other ranks and Horovod's cycle included
  overlapped  the ALLREDUCE spans of step k inside [end(k-1), ready(k)]:
              communication hidden behind compute
  transfer    the collectives' spans of step k (inside ALLREDUCE)
  bytes       what step k reduced: the tensors' bytes

so that step = compute + exposed. A negotiation starts when Horovod's
background thread takes the tensor from its queue, at its first cycle
after the step handed it over: up to one cycle (3 ms, the engine's on
CPU) of waiting counts as compute. On CPU the engine reduces every gradient
in one group after the backward pass (engine/compute/step.py), and
overlapped is zero by construction.
"""
import dataclasses
import json
import statistics
from typing import Iterable

TRANSFERS = ("GLOO_ALLREDUCE", "MPI_ALLREDUCE")
_ITEM_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8,
               "int32": 4, "int64": 8}


@dataclasses.dataclass(frozen=True)
class Span:
  name: str
  start: float  # microseconds, as the trace gives them
  end: float
  children: tuple = ()
  args: tuple = ()  # the end event's (key, value) pairs: dtype, shape


def load(path: str) -> list[dict]:
  """A timeline's events. Horovod writes `[` and then each event followed
  by a comma, and closes the list only at a clean exit."""
  with open(path) as f:
    text = f.read().rstrip().rstrip(",")
  return json.loads(text if text.endswith("]") else text + "]")


def spans(events: Iterable[dict]) -> dict[int, list[Span]]:
  """Each tensor's (trace pid's) top-level spans in order, their nested
  spans as children, from the trace's begin and end events."""
  found: dict[int, list[Span]] = {}
  open_: dict[int, list] = {}
  for event in events:
    pid, phase = event.get("pid"), event.get("ph")
    if phase == "B":
      open_.setdefault(pid, []).append([event["name"], event["ts"], []])
    elif phase == "E":
      name, start, children = open_[pid].pop()
      span = Span(name, start, event["ts"], tuple(children),
                  tuple(sorted(event.get("args", {}).items())))
      if open_[pid]:
        open_[pid][-1][2].append(span)
      else:
        found.setdefault(pid, []).append(span)
  return found


def covered(intervals: Iterable[tuple[float, float]],
            low: float = float("-inf"), high: float = float("inf")) -> float:
  """The length of the union of `intervals`, clipped to [low, high]."""
  total, reach = 0.0, low
  for start, end in sorted(intervals):
    start, end = max(start, reach), min(end, high)
    if end > start:
      total += end - start
      reach = end
  return total


def nbytes(span: Span) -> int:
  """The bytes of the tensor an ALLREDUCE span reduced (its end event's
  dtype and shape, "[3, 3, 64]")."""
  args = dict(span.args)
  dims = [int(d) for d in args["shape"].strip("[]").split(",") if d.strip()]
  count = 1
  for d in dims:
    count *= d
  return count * _ITEM_BYTES[args["dtype"]]


def steps(per_tensor: dict[int, list[Span]]) -> list[dict]:
  """Each step's split (seconds), from the second step on; the tensors
  reduced once a step are those reduced the most times (a broadcast at the
  start or a reduction at an epoch's end is not)."""
  allreduces = {pid: [s for s in found if s.name == "ALLREDUCE"]
                for pid, found in per_tensor.items()}
  negotiations = {pid: [s for s in found if s.name == "NEGOTIATE_ALLREDUCE"]
                  for pid, found in per_tensor.items()}
  count = max((len(a) for a in allreduces.values()), default=0)
  stepped = [pid for pid, a in allreduces.items()
             if len(a) == count and len(negotiations[pid]) == count]
  if count < 2 or not stepped:
    raise ValueError("the timeline holds fewer than two steps' allreduces")
  split = []
  for k in range(1, count):
    before = max(allreduces[pid][k - 1].end for pid in stepped)
    end = max(allreduces[pid][k].end for pid in stepped)
    ready = max(negotiations[pid][k].start for pid in stepped)
    reducing = [(allreduces[pid][k].start, allreduces[pid][k].end)
                for pid in stepped]
    transfers = [(c.start, c.end) for pid in stepped
                 for c in allreduces[pid][k].children if c.name in TRANSFERS]
    seconds = {"step": end - before, "compute": ready - before,
               "exposed": end - ready,
               "overlapped": covered(reducing, before, ready),
               "transfer": covered(transfers)}
    split.append({**{key: us / 1e6 for key, us in seconds.items()},
                  "bytes": sum(nbytes(allreduces[pid][k])
                               for pid in stepped)})
  return split


def medians(split: list[dict]) -> dict:
  """Each figure's median over the steps."""
  return {key: statistics.median(s[key] for s in split) for key in split[0]}
