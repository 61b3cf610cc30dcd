"""engine/records/scaling.py: the ring allreduce's arithmetic, the bounds on a
step at more nodes, and what it takes from a run's records."""
import json
import subprocess
import sys

import pytest

from engine.records import scaling
from engine.core.errors import UserError
from tests import fixtures

GBIT_10 = scaling.Link.of(gbit_per_sec=10, latency_us=20)


def test_a_link_in_gbit_and_microseconds():
  assert GBIT_10.bandwidth == 1.25e9 and GBIT_10.latency == pytest.approx(2e-5)
  with pytest.raises(UserError, match=r"--link_gbit=0: give the link's "
                     r"bandwidth in Gbit/s, above 0"):
    scaling.Link.of(0, 20)
  with pytest.raises(UserError, match=r"--link_latency_us=-1: "):
    scaling.Link.of(10, -1)


def test_the_ring_sends_2_n_minus_1_over_n_of_the_message():
  link = scaling.Link(latency=1e-3, bandwidth=1e6)
  assert scaling.ring_allreduce_seconds(1e6, 1, link) == 0.0
  # 2 processes: 2 hops, and each sends its half and receives the other's.
  assert scaling.ring_allreduce_seconds(1e6, 2, link) == pytest.approx(
      2e-3 + 1.0)
  assert scaling.ring_allreduce_seconds(1e6, 4, link) == pytest.approx(
      6e-3 + 1.5)
  # The bandwidth term tends to twice the message: busbw is the link's.
  many = scaling.ring_allreduce_seconds(1e6, 1000, scaling.Link(0.0, 1e6))
  assert many == pytest.approx(2 * 999 / 1000) and many < 2.0


def test_gradients_beyond_the_fusion_buffer_take_more_messages():
  link = scaling.Link(latency=1e-3, bandwidth=1e9)
  one = scaling.update_allreduce_seconds(1000, 8, link)
  assert one == pytest.approx(scaling.ring_allreduce_seconds(1000, 8, link))
  # Three of Horovod's 128 MiB buffers: three rings' latency (3 x 14 hops
  # of 1 ms, 42 ms) and 7/4 of the 402.7 MB once (704.6 ms).
  assert scaling.FUSION_THRESHOLD_BYTES == 128 * 2**20
  assert scaling.update_allreduce_seconds(3 * 128 * 2**20, 8, link) == (
      pytest.approx(0.7466431))


def test_efficiency_lies_between_no_overlap_and_full_overlap():
  # 6 MB of gradients (CosmoFlow's 1.47 M parameters) and a 50 ms step.
  predictions = scaling.predict(0.05, 6_000_000, GBIT_10, nodes=(2, 8, 512))
  assert [p.nodes for p in predictions] == [2, 8, 512]
  # Worked by hand: 2 nodes, 2 hops of 20 us and 6 MB at 1.25 GB/s, 4.84
  # ms against the 50 ms step; 8 nodes, 14 hops and 1.75 x 4.8 ms, 8.68
  # ms; 512 nodes, 30.02 ms.
  assert [p.efficiency_no_overlap for p in predictions] == pytest.approx(
      [0.05 / 0.05484, 0.05 / 0.05868, 0.05 / 0.0800213], abs=1e-5)
  for p in predictions:
    assert p.efficiency_no_overlap < p.efficiency_full_overlap == 1.0
  # 512 nodes: 2 x 511 hops of 20 us (20.44 ms), and nearly 2 x 6 MB at
  # 1.25 GB/s (9.58 ms).
  assert predictions[-1].allreduce_seconds == pytest.approx(0.03002125)
  # A link slower than the step (1 Gbit/s: 14 hops of 20 us and 1.75 x 6
  # MB at 125 MB/s, 84.28 ms): overlap hides at most the 1 ms of compute.
  slow = scaling.predict(0.001, 6_000_000, scaling.Link.of(1, 20),
                         nodes=(8,))[0]
  assert slow.allreduce_seconds == pytest.approx(0.08428)
  assert slow.efficiency_full_overlap == pytest.approx(0.001 / 0.08428)


def record(epoch, step_seconds, steps=10, **more):
  return dict(epoch=epoch, step_seconds=step_seconds, steps_run=steps,
              gradient_bytes=4000, world_size=2, **more)


def test_the_step_time_is_the_median_after_the_first_epoch():
  records = [record(1, 9.0), record(2, 1.0), record(3, 1.2), record(4, 5.0)]
  run = scaling.measured(records)
  assert run == scaling.Measured(compute_seconds=0.12, gradient_bytes=4000,
                                 world_size=2)
  assert scaling.measured(records[:1]).compute_seconds == 0.9
  assert scaling.measured([]) is None
  # Records without the figures (an epoch not run here) give nothing.
  assert scaling.measured([dict(epoch=1, step_seconds=1.0)]) is None


def test_the_runs_table_predicts_over_a_link(tmp_path):
  run_dir = tmp_path / "np2"
  run_dir.mkdir()
  with open(run_dir / "metrics.jsonl", "w") as f:
    for epoch in (1, 2, 3):
      f.write(json.dumps(record(epoch, 0.5, epochs=3, images_per_sec=100.0,
                                val_accuracy=0.5, time=1.0)) + "\n")
  command = [sys.executable, "-m", "engine.runs", str(tmp_path), "--scaling"]
  ran = subprocess.run(command + ["--link_gbit=10", "--link_latency_us=20"],
                       capture_output=True, text=True, cwd=fixtures.REPO,
                       check=True)
  assert ("Predicted on more nodes, one process each, over 10 Gbit/s and "
          "20 us") in ran.stdout
  assert "np2: 2 processes, a step 50.0 ms, gradients 0.00 MB" in ran.stdout
  lines = ran.stdout.splitlines()
  at_8 = next(line for line in lines if line.split()[:1] == ["8"])
  assert at_8.split()[1:] == ["0.29", "99%", "100%"]
  assert [line.split()[0] for line in lines[-7:]] == [
      "8", "16", "32", "64", "128", "256", "512"]
  # One of the two, or a link without --scaling: one line, exit 2.
  for flags in (["--link_gbit=10"], ["--link_latency_us=20"]):
    bad = subprocess.run(command + flags, capture_output=True, text=True,
                         cwd=fixtures.REPO)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().splitlines() == [
        "engine.runs: error: --link_gbit and --link_latency_us go together, "
        "with --scaling: the link between nodes that the scaling model "
        "predicts over (e.g. --scaling --link_gbit=10 --link_latency_us=20)"]
  bad = subprocess.run(command + ["--link_gbit=-1", "--link_latency_us=20"],
                       capture_output=True, text=True, cwd=fixtures.REPO)
  assert bad.returncode == 2
  assert "--link_gbit=-1: give the link's bandwidth" in bad.stderr
