"""What a survivor says about a process that stopped (engine/liveness.py).

The frozen case, with horovodrun's key-value store, runs for real in
tests/test_faults.py.
"""
from engine import liveness


def test_without_heartbeats_the_line_says_what_it_can():
  assert liveness.silent_ranks() == []  # no horovodrun here
  assert liveness.describe_lost_process(None) == (
      "another process stopped the job (its error, if any, is above); run "
      "the same command again: it starts from the beginning (no checkpoint "
      "yet)")


def test_a_process_that_exited_rather_than_froze_is_named_so(monkeypatch):
  monkeypatch.setattr(liveness, "silent_ranks", lambda: [(2, 3.2), (3, 7.0)])
  assert liveness.describe_lost_process("runs/x/checkpoints/ckpt-40") == (
      "rank 2 and rank 3 stopped 7 s ago (its error, if any, is above); run "
      "the same command again: it resumes from runs/x/checkpoints/ckpt-40")
