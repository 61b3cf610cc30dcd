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
  kwargs = dict(warmup_epochs=2, decay=decay, decay_epochs=(5,),
                decay_table=((5, 0.5),), epochs=10)
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


# The table schedule: MLPerf HPC CosmoFlow's decay_schedule, as its
# reference applies it (mlcommons/hpc, cosmoflow/utils/optimizers.py):
# Keras' LearningRateScheduler gives it the epoch counted from 0, and the
# factor of the last key before that epoch multiplies the peak.
COSMOFLOW = ((32, 0.25), (64, 0.125))


def reference_rate(epoch, *, base_lr, peak_lr, n_warmup_epochs,
                   decay_schedule):
  """The reference's _lr_schedule, restated: its warmup per epoch, then
  the peak x the factor of the latest key below `epoch`."""
  if epoch < n_warmup_epochs:
    return epoch * (peak_lr - base_lr) / n_warmup_epochs + base_lr
  keys = [e for e in decay_schedule if e < epoch]
  return peak_lr * (decay_schedule[max(keys)] if keys else 1.0)


@pytest.mark.parametrize("step, expected", [
    (0, 0.4),
    (33 * STEPS_PER_EPOCH - 1, 0.4),    # the last step of epoch 32
    (33 * STEPS_PER_EPOCH, 0.1),        # the first of epoch 33: x 0.25
    (65 * STEPS_PER_EPOCH - 1, 0.1),    # the last of epoch 64
    (65 * STEPS_PER_EPOCH, 0.05),       # epoch 65: x 0.125 (not 0.25 x 0.125)
    (10 ** 6, 0.05),
])
def test_table_lands_on_the_epoch_after_each_key(step, expected):
  assert rate(step, decay="table", decay_table=COSMOFLOW) == pytest.approx(
      expected)


def test_table_is_the_references_rate_at_each_epochs_steps():
  # Its warmup is a value per epoch, ours per step: they meet where each
  # epoch starts, and agree on every step once warmup is over.
  learning_rate = schedule(warmup_epochs=4, decay="table",
                           decay_table=COSMOFLOW)
  for epoch in range(100):
    expected = reference_rate(epoch, base_lr=0.1, peak_lr=0.4,
                              n_warmup_epochs=4,
                              decay_schedule=dict(COSMOFLOW))
    steps = ([epoch * STEPS_PER_EPOCH] if epoch < 4 else
             range(epoch * STEPS_PER_EPOCH, (epoch + 1) * STEPS_PER_EPOCH))
    for step in steps:
      assert float(learning_rate(step)) == pytest.approx(expected), step


def test_table_composes_with_warmup_and_a_new_world():
  # A key inside warmup waits for it to end, as the reference's does.
  kwargs = dict(warmup_epochs=2, decay="table", decay_table=((0, 0.5),))
  assert rate(10, **kwargs) == pytest.approx(0.25)  # warming up
  assert rate(20, **kwargs) == pytest.approx(0.2)   # peak x 0.5
  # Twice the steps per epoch on 2 processes: the boundary moves with it.
  learning_rate = schedule(decay="table", decay_table=COSMOFLOW)
  learning_rate.set_world(world_size=2, steps_per_epoch=2 * STEPS_PER_EPOCH)
  assert float(learning_rate(66 * STEPS_PER_EPOCH - 1)) == pytest.approx(0.2)
  assert float(learning_rate(66 * STEPS_PER_EPOCH)) == pytest.approx(0.05)


def test_the_tables_flag_reads_epochs_and_factors():
  assert schedules.decay_table("32:0.25,64:0.125") == COSMOFLOW
  assert schedules.decay_table(" 0:2 , 7:1e-3 ") == ((0, 2.0), (7, 0.001))
  assert schedules.decay_table("") == ()


@pytest.mark.parametrize("text, says", [
    ("64:0.125,32:0.25", "--lr_decay_table=64:0.125,32:0.25: its epochs must "
     "increase, each once, from 0 on, e.g. 32:0.25,64:0.125"),
    ("32:0.25,32:0.1", "--lr_decay_table=32:0.25,32:0.1: its epochs must "
     "increase"),
    ("32:0", "--lr_decay_table=32:0: factor 0: each factor must be a "
     "positive number"),
    ("32:-0.5", "--lr_decay_table=32:-0.5: factor -0.5: each factor must be "
     "a positive number"),
    ("32:inf", "--lr_decay_table=32:inf: factor inf: each factor must be"),
    ("32=0.25", "--lr_decay_table=32=0.25: '32=0.25' is not EPOCH:FACTOR; "
     "give whole epochs and factors, e.g. 32:0.25,64:0.125"),
    ("32:a", "--lr_decay_table=32:a: '32:a' is not EPOCH:FACTOR"),
    ("32.5:0.25", "--lr_decay_table=32.5:0.25: '32.5:0.25' is not "
     "EPOCH:FACTOR"),
    ("-1:0.5", "--lr_decay_table=-1:0.5: '-1:0.5' is not EPOCH:FACTOR"),
    ("32:0.25:1", "--lr_decay_table=32:0.25:1: '32:0.25:1' is not "
     "EPOCH:FACTOR"),
], ids=["unsorted", "repeated", "zero", "negative", "infinite",
        "no_colon", "no_number", "fractional_epoch", "negative_epoch",
        "three_parts"])
def test_a_bad_table_is_one_line(text, says):
  with pytest.raises(UserError) as raised:
    schedules.decay_table(text)
  assert str(raised.value).startswith(says)
  assert "\n" not in str(raised.value)


def test_a_table_is_needed_and_checked_when_built():
  with pytest.raises(UserError, match="--lr_schedule=table needs "
                     "--lr_decay_table=EPOCH:FACTOR,..., e.g. the CosmoFlow "
                     "reference's 32:0.25,64:0.125"):
    schedule(decay="table")
  with pytest.raises(UserError, match="--lr_decay_table=64:0.5,32:0.5: its "
                     "epochs must increase"):
    schedule(decay="table", decay_table=((64, 0.5), (32, 0.5)))
