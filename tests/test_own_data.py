"""A user's own data and models under `horovodrun -np 2`, for real.

One launch (tests/workers/own_data_run.py) trains and resumes each case: an
image folder (JPEG, PNG, BMP, GIF; odd counts), an .npz, a directory of
.npy files and an .h5 (arrays), a user's own model module (functional and
subclassed) and a user's own data set function. Then the exports are
loaded by a process that cannot import the user's module, and
engine.evaluate finds the model again from flags.txt.
"""
import json
import os
import subprocess

import pytest

from tests import fixtures
from tests import timeouts

WORKER = os.path.join(fixtures.REPO, "tests", "workers", "own_data_run.py")
CASES = ["image_folder", "npz", "npy", "h5", "users_data"]
CLASS_NAMES = {
    "image_folder": list(fixtures.IMAGE_CLASSES),
    "npz": [f"class_{i}" for i in range(4)],
    "npy": [f"class_{i}" for i in range(4)],
    "h5": [f"class_{i}" for i in range(4)],
    "users_data": ["w", "x", "y", "z"],
}


@pytest.fixture(scope="module")
def code_dir(tmp_path_factory):
  return fixtures.write_user_code(str(tmp_path_factory.mktemp("code")))


@pytest.fixture(scope="module")
def launched(tmp_path_factory, code_dir):
  image_dir = fixtures.write_image_folder(
      str(tmp_path_factory.mktemp("images")))
  arrays_dir = tmp_path_factory.mktemp("arrays")
  for name in ("a.npz", "a.h5", "npy"):
    fixtures.write_arrays(str(arrays_dir / name))
  out = tmp_path_factory.mktemp("own")
  result = fixtures.launch([WORKER, str(out), image_dir, str(arrays_dir),
                            code_dir], processes=2, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
  return out, ranks


@pytest.mark.parametrize("case", CASES)
def test_trains_on_two_processes_with_one_model_and_exact_figures(launched,
                                                                  case):
  _, ranks = launched
  for run in ("first", "resumed"):
    observed = [r[case][run] for r in ranks]
    assert [o["max_weight_difference_across_ranks"] for o in observed] == \
        [0, 0]
    for o in observed:
      assert o["reported_val_loss"] == pytest.approx(o["full_test_loss"],
                                                     rel=1e-5)
      assert o["reported_val_accuracy"] == o["full_test_accuracy"]
      assert (o["train_traces"], o["eval_traces"]) == (1, 1)


@pytest.mark.parametrize("case", CASES)
def test_resumes_from_its_checkpoint(launched, case):
  out, ranks = launched
  first, resumed = ranks[0][case]["first"], ranks[0][case]["resumed"]
  assert [h["epoch"] for h in first["history"]] == [1]
  assert [h["epoch"] for h in resumed["history"]] == [2]  # not 1 again
  records = [json.loads(line) for line in
             (out / case / "metrics.jsonl").read_text().splitlines()]
  assert [r["epoch"] for r in records] == [1, 2]
  assert (out / case / "classes.txt").read_text().split() == \
      CLASS_NAMES[case]
  assert set(json.loads((out / case / "normalization.json").read_text())) \
      == {"mean", "std"}


# Loads every case's exports and classifies one blank image, in a process
# whose path does not have the user's modules.
LOAD_EXPORTS = """
import json, sys
import numpy as np
import tensorflow as tf
assert "users_model" not in sys.modules
found = {}
for path in sys.argv[1:]:
  serve = tf.saved_model.load(path).signatures["serving_default"]
  spec = serve.structured_input_signature[1]["images"]
  outputs = serve(images=tf.zeros([2, *spec.shape[1:]], spec.dtype))
  found[path] = [n.decode() for n in outputs["class_names"].numpy()]
print(json.dumps(found))
"""


def test_exports_load_without_the_users_code(launched):
  out, _ = launched
  paths = [str(out / case / "export" / which) for case in CASES
           for which in ("final", "best")]
  result = subprocess.run(
      [fixtures.PYTHON, "-c", LOAD_EXPORTS, *paths], cwd="/",
      capture_output=True, text=True, timeout=timeouts.bound(300),
      env={"PATH": os.environ["PATH"], "TF_CPP_MIN_LOG_LEVEL": "2"})
  assert result.returncode == 0, result.stderr[-3000:]
  found = json.loads(result.stdout)
  for case in CASES:
    for which in ("final", "best"):
      names = found[str(out / case / "export" / which)]
      assert len(names) == 2 and set(names) <= set(CLASS_NAMES[case])


@pytest.fixture(scope="module")
def command_line_run(tmp_path_factory, code_dir):
  """The command line with a user's model from a file, on one process."""
  data = fixtures.write_arrays(str(tmp_path_factory.mktemp("cli") / "a.h5"))
  model_dir = tmp_path_factory.mktemp("cli") / "run"
  result = fixtures.launch([
      "-m", "engine.train", "--dataset=arrays", f"--data_dir={data}",
      f"--model={code_dir}/users_model.py:build_subclassed", "--epochs=1",
      "--batch_size=8", f"--model_dir={model_dir}", "--progress=none"])
  assert result.returncode == 0, result.stderr[-3000:]
  return model_dir


def test_evaluate_finds_the_users_model_and_prints_each_class(
    command_line_run):
  model_dir = command_line_run
  result = fixtures.launch(["-m", "engine.evaluate",
                            f"--model_dir={model_dir}"], timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  lines = result.stdout.splitlines()
  [record] = [json.loads(line) for line in
              (model_dir / "metrics.jsonl").read_text().splitlines()]
  assert f"test accuracy {record['val_accuracy']:.4f} (23 examples)" in \
      lines[0]
  assert [line.split()[0] for line in lines[1:]] == CLASS_NAMES["h5"]
  per_class = [float(line.split()[1]) for line in lines[1:]]
  assert all(0 <= a <= 1 for a in per_class)
