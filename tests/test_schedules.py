import math

import pytest
import tensorflow as tf

from engine.compute import schedules
from engine.core.errors import UserError

STEPS_PER_EPOCH = 10


def schedule(world_size=4, steps_per_epoch=STEPS_PER_EPOCH, **kwargs):
  """0.1 per process, linear scaling: 0.4 on 4 processes."""
  params = dict(base_lr=0.1, scaling="linear", warmup_epochs=0,
                decay="constant", epochs=100)
  params.update(kwargs)
  learning_rate = schedules.WarmupThenDecay(**params)
  learning_rate.set_world(world_size=world_size,
                          steps_per_epoch=steps_per_epoch)
  return learning_rate


def rate(step, **kwargs):
  return float(schedule(**kwargs)(step))


@pytest.mark.parametrize("scaling, size, expected", [
    ("linear", 4, 0.4), ("sqrt", 4, 0.2), ("none", 4, 0.1),
    ("linear", 1, 0.1), ("sqrt", 2, 0.1 * math.sqrt(2)),
])
def test_scaling_with_the_number_of_processes(scaling, size, expected):
  assert schedules.scaled_rate(0.1, size, scaling) == pytest.approx(expected)


@pytest.mark.parametrize("decay", schedules.DECAYS)
def test_warmup_starts_at_base_and_reaches_the_scaled_rate_on_time(decay):
  kwargs = dict(warmup_epochs=2, decay=decay, decay_epochs=(5,), epochs=10)
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
  kwargs = dict(warmup_epochs=5, decay="step", decay_epochs=(15, 25, 35))
  assert rate(5 * STEPS_PER_EPOCH, **kwargs) == pytest.approx(0.4)
  assert rate(15 * STEPS_PER_EPOCH, **kwargs) == pytest.approx(0.04)


def test_cosine_falls_from_the_peak_after_warmup_to_zero_at_the_end():
  kwargs = dict(warmup_epochs=1, decay="cosine", epochs=11)
  assert rate(10, **kwargs) == pytest.approx(0.4)
  assert rate(60, **kwargs) == pytest.approx(0.2)
  assert rate(110, **kwargs) == pytest.approx(0.0, abs=1e-7)
  assert rate(500, **kwargs) == pytest.approx(0.0, abs=1e-7)


def test_linear_falls_from_the_peak_after_warmup_to_zero_at_the_end():
  kwargs = dict(warmup_epochs=1, decay="linear", epochs=11)
  assert rate(10, **kwargs) == pytest.approx(0.4)
  assert rate(35, **kwargs) == pytest.approx(0.3)
  assert rate(85, **kwargs) == pytest.approx(0.1)
  assert rate(110, **kwargs) == pytest.approx(0.0, abs=1e-7)
  assert rate(500, **kwargs) == pytest.approx(0.0, abs=1e-7)
  with pytest.raises(UserError, match="linear needs more epochs"):
    rate(0, decay="linear", warmup_epochs=5, epochs=5)


def test_constant_without_warmup():
  assert rate(0) == rate(12345) == pytest.approx(0.4)


def test_cosine_needs_epochs_after_warmup():
  with pytest.raises(UserError, match="cosine needs more epochs"):
    rate(0, decay="cosine", warmup_epochs=5, epochs=5)


def test_unknown_scaling_is_refused_when_built():
  with pytest.raises(UserError, match="--lr_scaling=cubic is unknown"):
    schedule(scaling="cubic")


def test_a_new_world_changes_the_rate_without_retracing_the_step():
  # An elastic run shrinking from 4 processes to 2 mid-warmup: the peak
  # halves, and an epoch takes twice the steps.
  learning_rate = schedule(warmup_epochs=2, decay="cosine", epochs=10)
  traces = []

  @tf.function
  def rate_at(step):
    traces.append(step)
    return learning_rate(step)

  assert float(rate_at(tf.constant(10))) == pytest.approx(0.25)
  learning_rate.set_world(world_size=2, steps_per_epoch=2 * STEPS_PER_EPOCH)
  assert learning_rate.peak_lr == pytest.approx(0.2)
  assert float(rate_at(tf.constant(20))) == pytest.approx(0.15)  # halfway
  assert float(rate_at(tf.constant(40))) == pytest.approx(0.2)   # the peak
  assert float(rate_at(tf.constant(200))) == pytest.approx(0.0, abs=1e-7)
  assert len(traces) == 1
