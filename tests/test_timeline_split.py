"""bench/timeline_split.py: a step's compute, exposed and overlapped
communication read from a Horovod timeline written here by hand."""
import json

import pytest

from bench import timeline_split


def reduction(pid, negotiate, reduce, transfer, shape="[10, 10]"):
  """One tensor's negotiation and allreduce, times in microseconds."""
  return [
      {"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": negotiate[0],
       "pid": pid},
      {"ph": "E", "ts": negotiate[1], "pid": pid},
      {"ph": "B", "name": "ALLREDUCE", "ts": reduce[0], "pid": pid},
      {"ph": "B", "name": "GLOO_ALLREDUCE", "ts": transfer[0], "pid": pid},
      {"ph": "E", "ts": transfer[1], "pid": pid},
      {"ph": "E", "ts": reduce[1], "pid": pid,
       "args": {"dtype": "float32", "shape": shape}},
  ]


def test_grouped_after_the_backward_pass_nothing_overlaps():
  # Two tensors reduced together at the end of each 10 ms step: ready at
  # 7 ms, reduced from 8 to 10 ms.
  events = []
  for k in range(3):
    t = k * 10_000
    for pid in (1, 2):
      events += reduction(pid, (t + 7000, t + 8000), (t + 8000, t + 10_000),
                          (t + 8100, t + 9900))
  split = timeline_split.steps(timeline_split.spans(events))
  assert len(split) == 2  # from the second step on
  assert split[0] == pytest.approx({
      "step": 0.010, "compute": 0.007, "exposed": 0.003, "overlapped": 0.0,
      "transfer": 0.0018, "bytes": 2 * 400})


def test_a_gradient_reduced_during_the_backward_pass_overlaps():
  # Tensor 1 is ready early and reduced from 3 to 5 ms, while the backward
  # pass goes on until tensor 2 is ready at 7 ms.
  events = []
  for k in range(2):
    t = k * 10_000
    events += reduction(1, (t + 2000, t + 3000), (t + 3000, t + 5000),
                        (t + 3000, t + 5000))
    events += reduction(2, (t + 7000, t + 8000), (t + 8000, t + 10_000),
                        (t + 8000, t + 10_000))
  (step,) = timeline_split.steps(timeline_split.spans(events))
  assert step["compute"] == pytest.approx(0.007)
  assert step["overlapped"] == pytest.approx(0.002)
  assert step["exposed"] == pytest.approx(0.003)
  assert step["transfer"] == pytest.approx(0.004)
  assert step["step"] == pytest.approx(step["compute"] + step["exposed"])


def test_a_tensor_reduced_once_is_not_a_step():
  events = reduction(9, (0, 10), (10, 20), (10, 20))  # a start's broadcast
  for k in range(3):
    t = 1000 + k * 10_000
    events += reduction(1, (t, t + 10), (t + 10, t + 20), (t + 10, t + 20))
  assert len(timeline_split.steps(timeline_split.spans(events))) == 2


def test_fewer_than_two_steps_are_refused():
  with pytest.raises(ValueError, match="fewer than two steps"):
    timeline_split.steps(timeline_split.spans(
        reduction(1, (0, 1), (1, 2), (1, 2))))


def test_covered_counts_overlapping_intervals_once_within_the_bounds():
  assert timeline_split.covered([(0, 4), (2, 6), (8, 9)]) == 7
  assert timeline_split.covered([(0, 4), (2, 6), (8, 9)], 3, 8.5) == 3.5


def test_a_timeline_left_open_is_read(tmp_path):
  # Horovod closes the list only at a clean exit.
  path = tmp_path / "timeline.json"
  events = reduction(1, (0, 1), (1, 2), (1, 2))
  path.write_text("[\n" + "".join(json.dumps(e) + ",\n" for e in events))
  assert timeline_split.load(str(path)) == events
  path.write_text(json.dumps(events))
  assert timeline_split.load(str(path)) == events
