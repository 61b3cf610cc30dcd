"""engine.find_lr: the learning-rate range test."""
import csv

import pytest

from engine import find_lr
from tests import fixtures


def test_the_rate_rises_by_a_constant_factor_from_min_to_max():
  rate = find_lr.ExponentialRange(1e-4, 1.0, 5)
  assert [float(rate(step)) for step in range(5)] == pytest.approx(
      [1e-4, 1e-3, 1e-2, 1e-1, 1.0], rel=1e-5)


def test_the_suggestion_is_a_tenth_of_the_rate_at_the_lowest_smoothed_loss():
  rates = [0.001, 0.01, 0.1, 1.0, 10.0, 100.0]
  # A single low batch at 10 is noise; the smoothed curve is lowest at 1.
  losses = [2.0, 1.5, 1.0, 0.5, 0.2, 9.0]
  assert find_lr.smoothed([2.0, 2.0]) == pytest.approx([2.0, 2.0])
  assert find_lr.suggested_rate(rates, losses) == pytest.approx(1.0)
  assert find_lr.suggested_rate(rates, [3.0, 2.0, 1.0, 2.0, 30.0, 90.0]) \
      == pytest.approx(0.01)


def test_a_range_test_on_two_processes_stops_when_the_loss_climbs(tmp_path):
  data_dir = fixtures.write_fashion_mnist(str(tmp_path / "fm"), 601, 11)
  plot = tmp_path / "range.png"
  result = fixtures.launch(
      ["-m", "engine.find_lr", f"--data_dir={data_dir}", "--filters=4",
       "--batch_size=16", "--optimizer=sgd", "--min_lr=1e-4",
       "--max_lr=1e4", "--range_steps=36", f"--plot={plot}",
       "--progress=none"], processes=2, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  with open(tmp_path / "range.csv") as f:
    rows = list(csv.DictReader(f))
  rates = [float(row["learning_rate"]) for row in rows]
  assert rates == sorted(rates) and rates[0] == pytest.approx(1e-4)
  assert len(rows) < 36  # a rate of 1e4 diverges well before the end
  [line] = [l for l in result.stdout.splitlines() if "suggested" in l]
  assert "(the loss diverged)" in line
  base_lr = float(line.split("--base_lr=")[1].split()[0])
  # Linear scaling on 2 processes: half the suggested applied rate.
  assert base_lr == pytest.approx(find_lr.suggested_rate(
      rates, [float(row["loss"]) for row in rows]) / 2, rel=1e-2)
  assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
