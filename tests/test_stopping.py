from engine.loop import stopping


def run(target, patience, accuracies):
  stop = stopping.Target(target, patience)
  for epoch, accuracy in enumerate(accuracies, start=1):
    if stop.update(epoch=epoch, value=accuracy,
                   cumulative_seconds=10.0 * epoch):
      return epoch, stop
  return None, stop


def test_stops_after_patience_consecutive_epochs_at_or_above_target():
  epoch, stop = run(0.85, 2, [0.80, 0.85, 0.84, 0.86, 0.90, 0.95])
  assert epoch == 5  # 0.85 counts (at the target); the dip at 3 resets
  assert (stop.first_reached_epoch, stop.first_reached_seconds) == (2, 20.0)


def test_patience_one_stops_at_the_first_epoch_reaching_it():
  assert run(0.5, 1, [0.4, 0.6, 0.7])[0] == 2


def test_no_target_never_stops():
  epoch, stop = run(0.0, 1, [0.99] * 5)
  assert epoch is None and stop.first_reached_epoch is None


def test_never_reached():
  epoch, stop = run(0.99, 2, [0.5, 0.6])
  assert epoch is None and stop.first_reached_epoch is None
