"""The route of one batch of `make train` (tests/batch_path.py says how it
is found): the shape the trainer that owns its input promises, and no
longer than it is.

The route today: 21 files and 66 functions (37 on the host, 29 traced
into the input's and the step's graphs); docs/architecture.md, "One
batch's route", lists them, and what it was before.
"""
import json

import pytest

from tests import fixtures

# The route as long as it is today: a longer one is a hand-off added, which
# the test names; a shorter one lowers these.
MOST_FILES = 21
MOST_FUNCTIONS = 66


@pytest.fixture(scope="module")
def route(tmp_path_factory):
  data_dir = fixtures.write_fashion_mnist(
      str(tmp_path_factory.mktemp("fashion")), num_train=601, num_test=101)
  model_dir = tmp_path_factory.mktemp("route") / "run"
  result = fixtures.launch(
      ["-m", "tests.batch_path", "--flagfile=flags/fashion_mnist_fast.cfg",
       f"--data_dir={data_dir}", f"--model_dir={model_dir}", "--epochs=2",
       "--steps_per_epoch=2", "--batch_size=16", "--mixed_precision=none"],
      timeout=240)
  assert result.returncode == 0, result.stderr[-3000:]
  return [json.loads(line) for line in result.stdout.splitlines()]


def named(route, file):
  return [f["function"] for f in route if f["file"] == file]


def test_the_route_starts_at_the_loader_and_ends_in_the_update(route):
  assert route[0] == dict(file="engine/datasets/fashion_mnist.py",
                          function="load", graph=False)
  assert route[-1] == dict(file="engine/compute/step.py", function="_update",
                           graph=True)


def test_the_route_is_no_longer_than_it_was(route):
  files = {f["file"] for f in route}
  assert len(files) <= MOST_FILES, sorted(files)
  assert len(route) <= MOST_FUNCTIONS, [
      f"{f['file']}:{f['function']}" for f in route]


def test_the_loop_hands_the_stream_to_the_step_and_never_reads_a_batch(route):
  loop = [f for f in route if f["file"].startswith("engine/loop/")]
  assert loop and not any(f["graph"] for f in loop), loop
  # Set up once, where the world is known, and handed to the step.
  assert named(route, "engine/datasets/training_stream.py") == [
      "TrainingStream.of", "TrainingStream.batches"]
  assert "Session.read_from_state" in named(route, "engine/loop/session.py")


def test_the_step_has_one_entry_and_reads_its_own_batches(route):
  host = [f["function"] for f in route
          if f["file"] == "engine/compute/step.py" and not f["graph"]]
  assert host == ["TrainStep.start", "TrainStep.train"]
  step = named(route, "engine/compute/step.py")
  assert step.index("_next_step") < step.index("_train_step")


def test_the_step_reduces_through_one_call(route):
  reduction = [f for f in route
               if f["file"] == "engine/distributed/gradients.py"]
  assert reduction[0]["function"] == "step"
  assert all(f["graph"] for f in reduction)
