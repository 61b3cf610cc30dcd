"""Every input the engine reads, corrupted some 120 seeded ways: each run
trains, or is refused with one `engine.train: error:` line, no traceback,
and its model_dir as it was.

The inputs: Fashion-MNIST's idx files, CIFAR-10's pickles and archive,
TFRecords, image folders (JPEG, PNG, BMP, GIF), arrays (.npz, .npy, .h5), a
run's checkpoints and the files a resumed run reads, and flagfiles. One
worker process (tests/workers/fuzz_cases.py, whose docstring gives the
design) imports the engine once and runs every case in itself, since a
process per case would cost seconds of TensorFlow import each; it prints a
JSON summary, which the tests below read.

A failing case prints its seed, index and description; rerun it alone with
`python -m tests.workers.fuzz_cases SEED DIR INDEX`.
"""
import json

import pytest

from tests import fixtures

SEED = 11
MIN_CASES = 120
KINDS = ("idx", "cifar10_pickle", "cifar10_archive", "tfrecord",
         "image_folder", "npz", "npy", "h5", "checkpoint", "flagfile")
WORKER_SECONDS = 600


def described(failures: list[dict]) -> str:
  return "\n\n".join(
      f"seed {f.get('seed')} case {f['index']} ({f['kind']}): "
      f"{f['description']}\n  model_dir: {f.get('model_dir')}\n  "
      + "\n  ".join(f["problems"])
      + f"\n  args: {' '.join(f.get('args', []))}\n  stderr: "
      + "\n    ".join(f.get("stderr_tail", []))
      + f"\n  rerun: python -m tests.workers.fuzz_cases {f.get('seed')} "
      f"DIR {f['index']}"
      for f in failures)


@pytest.fixture(scope="module")
def summary(tmp_path_factory):
  scratch = tmp_path_factory.mktemp("fuzz")
  result = fixtures.launch(["-m", "tests.workers.fuzz_cases", str(SEED),
                            str(scratch)], timeout=WORKER_SECONDS)
  # A hang still prints the summary (exit 3); a crash names its case last.
  lines = result.stdout.strip().splitlines()
  assert lines, (f"the worker died (exit {result.returncode}) in the last "
                 f"case on its stderr:\n{result.stderr[-3000:]}")
  return json.loads(lines[-1])


def test_cases_cover_every_input_and_both_outcomes(summary):
  assert summary["cases"] >= MIN_CASES
  assert sorted(summary["by_kind"]) == sorted(KINDS)
  assert summary["outcomes"]["trained"] > 0
  assert summary["outcomes"]["refused"] > 0


def test_every_run_trains_or_is_refused_with_one_line(summary):
  assert not summary["failures"], described(summary["failures"])
