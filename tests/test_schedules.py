import math

import pytest

from engine import schedules
from engine.errors import UserError

STEPS_PER_EPOCH = 10


def rate(step, **kwargs):
  params = dict(base_lr=0.1, peak_lr=0.4, warmup_steps=0, decay="constant",
                steps_per_epoch=STEPS_PER_EPOCH)
  params.update(kwargs)
  return float(schedules.WarmupThenDecay(**params)(step))


@pytest.mark.parametrize("scaling, size, expected", [
    ("linear", 4, 0.4), ("sqrt", 4, 0.2), ("none", 4, 0.1),
    ("linear", 1, 0.1), ("sqrt", 2, 0.1 * math.sqrt(2)),
])
def test_scaling_with_the_number_of_processes(scaling, size, expected):
  assert schedules.scaled_rate(0.1, size, scaling) == pytest.approx(expected)


@pytest.mark.parametrize("decay", schedules.DECAYS)
def test_warmup_starts_at_base_and_reaches_the_scaled_rate_on_time(decay):
  kwargs = dict(warmup_steps=20, decay=decay, decay_epochs=(5,),
                total_steps=100)
  assert rate(0, **kwargs) == pytest.approx(0.1)
  assert rate(10, **kwargs) == pytest.approx(0.25)  # halfway, per step
  assert rate(19, **kwargs) == pytest.approx(0.1 + 0.3 * 19 / 20)
  assert rate(20, **kwargs) == pytest.approx(0.4)   # the peak, on time
  rates = [rate(s, **kwargs) for s in range(21)]
  assert rates == sorted(rates)


def test_step_decay_lands_on_the_decay_epochs():
  kwargs = dict(decay="step", decay_epochs=(15, 25, 35), decay_factor=0.1)
  assert rate(15 * STEPS_PER_EPOCH - 1, **kwargs) == pytest.approx(0.4)
  assert rate(15 * STEPS_PER_EPOCH, **kwargs) == pytest.approx(0.04)
  assert rate(25 * STEPS_PER_EPOCH - 1, **kwargs) == pytest.approx(0.04)
  assert rate(25 * STEPS_PER_EPOCH, **kwargs) == pytest.approx(0.004)
  assert rate(35 * STEPS_PER_EPOCH, **kwargs) == pytest.approx(0.0004)


def test_step_decay_after_warmup_counts_epochs_from_the_start():
  # The lab: 5 warmup epochs, then x0.1 at epochs 15, 25, 35.
  kwargs = dict(warmup_steps=5 * STEPS_PER_EPOCH, decay="step",
                decay_epochs=(15, 25, 35))
  assert rate(5 * STEPS_PER_EPOCH, **kwargs) == pytest.approx(0.4)
  assert rate(15 * STEPS_PER_EPOCH, **kwargs) == pytest.approx(0.04)


def test_cosine_falls_from_the_peak_after_warmup_to_zero_at_the_end():
  kwargs = dict(warmup_steps=10, decay="cosine", total_steps=110)
  assert rate(10, **kwargs) == pytest.approx(0.4)
  assert rate(60, **kwargs) == pytest.approx(0.2)
  assert rate(110, **kwargs) == pytest.approx(0.0, abs=1e-7)
  assert rate(500, **kwargs) == pytest.approx(0.0, abs=1e-7)


def test_constant_without_warmup():
  assert rate(0) == rate(12345) == pytest.approx(0.4)


def test_cosine_needs_epochs_after_warmup():
  with pytest.raises(UserError, match="cosine needs more epochs"):
    rate(0, decay="cosine", warmup_steps=50, total_steps=50)
