"""The collective's own time in each profiled call, read from Horovod's
timeline (--horovod_timeline).

A step's "communication" (step_report.py) runs from the end of its
backward pass to its reduced gradients, on the rank's own clock: it holds
the negotiation (Horovod's cycle, and waiting for every rank to ask for the
same tensors) and the collective itself. The timeline, which rank 0 writes
as Horovod's coordinator, marks each tensor's NEGOTIATE_ALLREDUCE and then
its ALLREDUCE (or ADASUM): the fusion buffer's copies and the transfer.
The time the collective ran within a call, its spans merged (fused
tensors share one), is the collective's own; the rest of a rank's
communication is negotiation and waiting.

The timeline's times are microseconds from its start, which its first
record gives since the epoch: they compare with the host's `time.time()`.
"""
import json

# The responses of a step's gradients and statistics: averaged, or summed
# by Adasum.
COLLECTIVES = ("ALLREDUCE", "ADASUM")


def collective_seconds(path: str, calls: list[dict]) -> list[float]:
  """For each call (its `span`, the host's time.time() before and after,
  and its `steps`), the seconds a step the timeline's collectives ran
  within it."""
  spans = _spans(path)
  found = []
  for call in calls:
    began, ended = call["span"]
    inside = [(max(a, began), min(b, ended)) for a, b in spans
              if a < ended and b > began]
    found.append(_merged_length(inside) / max(1, call["steps"]))
  return found


def _spans(path: str) -> list[tuple[float, float]]:
  """Every collective's (start, end) in seconds since the epoch: each
  tensor's top-level event, from its "B" to the "E" that closes it (its
  activities, MEMCPY_IN_FUSION_BUFFER and the like, nest inside)."""
  with open(path) as f:
    events = json.load(f)
  start = events[0]["args"]["start_time_since_epoch_in_micros"]
  spans, open_events = [], {}
  for event in events:
    phase, tensor = event.get("ph"), event.get("pid")
    if phase == "B":
      open_events.setdefault(tensor, []).append(
          (event["name"], event["ts"]))
    elif phase == "E" and open_events.get(tensor):
      name, began = open_events[tensor].pop()
      if name in COLLECTIVES:
        spans.append(((start + began) * 1e-6, (start + event["ts"]) * 1e-6))
  return spans


def _merged_length(spans: list[tuple[float, float]]) -> float:
  """The length of the union of `spans`."""
  total, reach = 0.0, float("-inf")
  for began, ended in sorted(spans):
    if ended > reach:
      total += ended - max(began, reach)
      reach = ended
  return total
