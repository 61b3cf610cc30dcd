"""Bad input on the command line: one clear line, a non-zero exit."""
import gzip
import shutil

import pytest

from tests import fixtures


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return fixtures.write_fashion_mnist(str(tmp_path_factory.mktemp("fm")),
                                      num_train=40, num_test=10)


def fails_with(args, message):
  result = fixtures.launch(["-m", "engine.train", *args], timeout=120)
  assert result.returncode != 0
  assert "Traceback" not in result.stderr, result.stderr
  errors = [l for l in result.stderr.splitlines()
            if "error" in l.lower() and "pass --help" not in l.lower()]
  assert len(errors) == 1, result.stderr
  assert message in errors[0], errors[0]


def test_missing_data_dir(tmp_path):
  fails_with([f"--data_dir={tmp_path}/none"],
             f"--data_dir={tmp_path}/none: no such directory")


def test_truncated_idx_file(data_dir, tmp_path):
  copy = shutil.copytree(data_dir, tmp_path / "copy")
  images = copy / "train-images-idx3-ubyte.gz"
  raw = gzip.decompress(images.read_bytes())
  images.write_bytes(gzip.compress(raw[:-784]))
  fails_with([f"--data_dir={copy}"],
             "train-images-idx3-ubyte.gz: idx header promises")


def test_corrupt_gzip(data_dir, tmp_path):
  copy = shutil.copytree(data_dir, tmp_path / "copy")
  (copy / "t10k-labels-idx1-ubyte.gz").write_bytes(b"\x1f\x8b\x08 garbage")
  fails_with([f"--data_dir={copy}"], "truncated or corrupt gzip")


@pytest.mark.parametrize("flag, message", [
    ("--model=resnet9000", "flag --model=resnet9000: value should be one of"),
    ("--dataset=mnist3d", "flag --dataset=mnist3d: value should be one of"),
    ("--batch_size=0", "flag --batch_size=0: 0 is not a positive integer"),
    ("--batch_size=-4", "flag --batch_size=-4"),
    ("--profile_steps=5,2", "flag --profile_steps=5,2: must be START,END"),
    ("--horovod_timeline", "--horovod_timeline records the --profile_steps "
     "range; give --profile_steps too"),
    ("--grad_accum_steps=0", "flag --grad_accum_steps=0: 0 is not a positive"),
    ("--commit_every_steps=0",
     "flag --commit_every_steps=0: 0 is not a positive"),
    ("--elastic", "--elastic needs an elastic launch: horovodrun -np N "
     "--min-np M"),
])
def test_bad_flags(flag, message):
  fails_with([flag], message)


def test_global_batch_larger_than_the_data(data_dir):
  fails_with([f"--data_dir={data_dir}", "--batch_size=64"],
             "--batch_size=64 on 1 processes is a global batch of 64")


def test_unwritable_model_dir_stops_every_process_with_one_line(tmp_path):
  blocker = tmp_path / "a_file"
  blocker.write_text("")
  result = fixtures.launch(
      ["-m", "engine.train", f"--model_dir={blocker}/run", "--epochs=1",
       "--steps_per_epoch=1"], processes=2, timeout=120)
  assert result.returncode != 0
  ranks = [l for l in result.stderr.splitlines() if l[:3] in ("[0]", "[1]")]
  assert not [l for l in ranks if "Traceback" in l], result.stderr[-3000:]
  for rank in ("[0]", "[1]"):
    errors = [l for l in ranks if l.startswith(rank) and "error:" in l]
    assert len(errors) == 1, result.stderr[-3000:]
    assert f"--model_dir={blocker}/run: cannot create it" in errors[0]


def test_tfrecord_found_corrupt_while_training(tmp_path):
  data_dir = fixtures.write_tfrecords(str(tmp_path / "records"), num_files=2)
  path = tmp_path / "records" / "train-00001-of-00002"
  path.write_bytes(path.read_bytes()[:-10])
  fails_with([f"--data_dir={data_dir}", "--dataset=tfrecord",
              "--image_size=16", "--num_classes=10", "--train_examples=16",
              "--test_examples=16", "--batch_size=4", "--epochs=2",
              f"--model_dir={tmp_path}/run"],
             "corrupt input data (truncated record at ")
