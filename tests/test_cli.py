"""Bad input on the command line: one clear line, a non-zero exit.

`python -m engine.train ARGS` runs in one long-lived process
(tests/workers/engine_server.py) that runs each command line as a process
would, since a new process per case spends seconds importing TensorFlow;
the other commands, and the runs whose ranks matter, are real processes.
"""
import gzip
import json
import select
import shutil
import subprocess

import numpy as np
import pytest

from tests import fixtures
from tests import timeouts


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return fixtures.write_fashion_mnist(str(tmp_path_factory.mktemp("fm")),
                                      num_train=40, num_test=10)


class TrainCommands:
  """`python -m engine.train ARGS`, answered by tests/workers/engine_server.py
  as a process would have ended: exit code, stdout, stderr."""

  def __init__(self, log_path):
    self._log = open(log_path, "w")
    self._server = None

  def run(self, args, timeout: float) -> subprocess.CompletedProcess:
    """`timeout` in nominal seconds (tests/timeouts.py)."""
    if self._server is None:
      self._server = subprocess.Popen(
          [fixtures.PYTHON, "-m", "tests.workers.engine_server"],
          cwd=fixtures.REPO, text=True, stdin=subprocess.PIPE,
          stdout=subprocess.PIPE, stderr=self._log,
          env=fixtures.engine_env())
    self._server.stdin.write(json.dumps(args) + "\n")
    self._server.stdin.flush()
    seconds = timeouts.bound(timeout)
    ready, _, _ = select.select([self._server.stdout], [], [], seconds)
    answer = self._server.stdout.readline() if ready else ""
    if not answer:  # hung or died: the next command starts a new server
      self.close()
      raise AssertionError(f"engine.train {' '.join(args)}: no answer "
                           f"within {seconds:.0f} s; see {self._log.name}")
    answer = json.loads(answer)
    return subprocess.CompletedProcess(args, answer["code"], answer["stdout"],
                                       answer["stderr"])

  def close(self) -> None:
    if self._server:
      try:  # the end of its stdin ends the server, which removes its files
        self._server.communicate(timeout=timeouts.bound(30))
      except subprocess.TimeoutExpired:  # hung in a command
        self._server.kill()
        self._server.communicate()
      self._server = None


@pytest.fixture(scope="module")
def train_commands(tmp_path_factory):
  commands = TrainCommands(tmp_path_factory.mktemp("server") / "server.log")
  yield commands
  commands.close()


@pytest.fixture
def fails_with(train_commands):
  """Asserts that a command line fails with one error line holding
  `message`, and no traceback."""

  def check(args, message, module="engine.train"):
    if module == "engine.train":
      result = train_commands.run(args, timeout=120)
    else:
      result = fixtures.launch(["-m", module, *args], timeout=120)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    errors = [l for l in result.stderr.splitlines()
              if "error" in l.lower() and "pass --help" not in l.lower()]
    assert len(errors) == 1, result.stderr
    assert message in errors[0], errors[0]
    return result

  return check


def test_missing_data_dir(tmp_path, fails_with):
  fails_with([f"--data_dir={tmp_path}/none"],
             f"--data_dir={tmp_path}/none: no such directory")


def test_truncated_idx_file(data_dir, tmp_path, fails_with):
  copy = shutil.copytree(data_dir, tmp_path / "copy")
  images = copy / "train-images-idx3-ubyte.gz"
  raw = gzip.decompress(images.read_bytes())
  images.write_bytes(gzip.compress(raw[:-784]))
  fails_with([f"--data_dir={copy}"],
             "train-images-idx3-ubyte.gz: idx header promises")


def test_corrupt_gzip(data_dir, tmp_path, fails_with):
  copy = shutil.copytree(data_dir, tmp_path / "copy")
  (copy / "t10k-labels-idx1-ubyte.gz").write_bytes(b"\x1f\x8b\x08 garbage")
  fails_with([f"--data_dir={copy}"], "truncated or corrupt gzip")


@pytest.mark.parametrize("flag, message", [
    ("--model=resnet9000", "flag --model=resnet9000: value should be one of"),
    ("--dataset=mnist3d", "flag --dataset=mnist3d: value should be one of"),
    ("--tfrecord_compression=xz", "flag --tfrecord_compression=xz: value "
     "should be one of <auto|none|gzip|zlib>"),
    ("--batch_size=0", "flag --batch_size=0: 0 is not a positive integer"),
    ("--batch_size=-4", "flag --batch_size=-4"),
    ("--profile_steps=5,2", "flag --profile_steps=5,2: must be START,END"),
    ("--profile_steps=10,20,15,30", "flag --profile_steps=10,20,15,30: must "
     "be START,END"),
    ("--profile_every=100", "--profile_every repeats the --profile_steps "
     "windows: give --profile_steps too"),
    ("--profile_link_gbit=0", "--profile_link_gbit is the link's bandwidth "
     "in Gbit/s, above 0"),
    ("--horovod_timeline", "--horovod_timeline records the --profile_steps "
     "range; give --profile_steps too"),
    ("--grad_accum_steps=0", "flag --grad_accum_steps=0: 0 is not a positive"),
    ("--steps_per_call=0", "flag --steps_per_call=0: 0 is not a positive"),
    ("--commit_every_steps=0",
     "flag --commit_every_steps=0: 0 is not a positive"),
    ("--elastic", "--elastic needs an elastic launch: horovodrun -np N "
     "--min-np M"),
    ("--gradient_compression=auto --elastic", "--gradient_compression=auto "
     "measures at start-up, before an elastic run's workers meet"),
    ("--progressive_resizing=20:3,16:2", "flag --progressive_resizing=['20:3',"
     " '16:2']: must be SIDE:EPOCHS stages"),
    ("--kernel_size=0", "flag --kernel_size=0: 0 is not"),
    ("--lr_schedule=table --lr_decay_table=64:0.1,32:0.2",
     "--lr_decay_table=64:0.1,32:0.2: its epochs must increase"),
    ("--lr_schedule=table", "--lr_schedule=table needs --lr_decay_table="),
    ("--image_mean=1,2", "--image_mean and --image_std go together"),
    ("--image_mean=x --image_std=1", "--image_mean=x --image_std=1: give "
     "numbers, one per channel"),
    ("--image_mean=1,2 --image_std=1,2", "normalization statistics of 2 and "
     "2 values for images of 1 channels"),
])
def test_bad_flags(flag, message, fails_with):
  fails_with(flag.split(), message)


@pytest.mark.parametrize("module", ["engine.evaluate", "engine.find_lr"])
def test_the_other_commands_report_bad_flags_as_train_does(module, fails_with):
  fails_with(["--batch_size=0"],
             f"{module}: error: flag --batch_size=0: 0 is not a positive",
             module=module)


@pytest.mark.parametrize("args, message", [
    ("--model=resnet9 --progressive_resizing=20:2 --epochs=2",
     "--progressive_resizing=20:2: its stages end at epoch 2 of 2; the last "
     "epochs must train at full size"),
    ("--model=resnet9 --progressive_resizing=16:1,28:2 --epochs=3",
     "--progressive_resizing=16:1,28:2: 28 pixels is not smaller than the "
     "images' 28"),
    ("--model=cnn --progressive_resizing=20:1 --epochs=2",
     "--progressive_resizing=20:1: --model=cnn does not take 20x20 images"),
], ids=["no_full_size_epoch", "not_smaller", "fixed_size_model"])
def test_resizing_the_model_or_run_cannot_take_is_one_line(
    args, message, data_dir, tmp_path, fails_with):
  fails_with([f"--data_dir={data_dir}", f"--model_dir={tmp_path}/run",
              *args.split()], message)
  assert not (tmp_path / "run").exists()


def test_global_batch_larger_than_the_data(data_dir, fails_with):
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


def test_tfrecord_found_corrupt_while_training(tmp_path, fails_with):
  data_dir = fixtures.write_tfrecords(str(tmp_path / "records"), num_files=2)
  path = tmp_path / "records" / "train-00001-of-00002"
  path.write_bytes(path.read_bytes()[:-10])
  fails_with([f"--data_dir={data_dir}", "--dataset=tfrecord",
              "--image_size=16", "--num_classes=10", "--train_examples=16",
              "--test_examples=16", "--batch_size=4", "--epochs=2",
              f"--model_dir={tmp_path}/run"],
             "corrupt input data (truncated record at ")


# A user's own data and model: bad input is one line, before anything is
# written, and an existing model_dir is left as it was.

def snapshot(directory):
  return {str(p.relative_to(directory)): p.read_bytes()
          for p in sorted(directory.rglob("*")) if p.is_file()}


# A model_dir whose checkpoints are of another format than this engine's
# (engine/core/run_files.py): one line, exit 2, the model_dir as it was.

@pytest.fixture(scope="module")
def trained(data_dir, train_commands, tmp_path_factory):
  """A model_dir of one epoch, as this engine writes it."""
  model_dir = tmp_path_factory.mktemp("formats") / "run"
  result = train_commands.run(
      [f"--data_dir={data_dir}", f"--model_dir={model_dir}", "--epochs=1",
       "--batch_size=8", "--filters=4"], timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  return model_dir


@pytest.mark.parametrize("version, module, message", [
    (0, "engine.train", "holds checkpoints of format 0 (written before "
     "format.json recorded it), and this engine reads formats 2 and 3 only: finish "
     "or evaluate that run with the engine's revision 27dc95f (82c6a49 for "
     "a novograd or lamb run saved on TensorFlow 2.15), or start a new run "
     "in another --model_dir"),
    (1, "engine.train", "holds checkpoints of format 1, and this engine "
     "reads formats 2 and 3 only: finish or evaluate that run with the engine's "
     "revision 2650be9, the last on tf_keras (Keras 2), or start a new run "
     "in another --model_dir"),
    (4, "engine.train", "holds checkpoints of format 4, and this engine "
     "reads formats 2 and 3 only: finish or evaluate that run with the engine that "
     "wrote them, or start a new run in another --model_dir"),
    (0, "engine.evaluate", "holds checkpoints of format 0"),
    (1, "engine.evaluate", "holds checkpoints of format 1, and this "
     "engine reads formats 2 and 3 only: finish or evaluate that run with the "
     "engine's revision 2650be9"),
], ids=["unrecorded", "keras2", "later", "evaluated", "keras2_evaluated"])
def test_a_model_dir_of_another_checkpoint_format_is_one_line_exit_2(
    trained, data_dir, tmp_path, fails_with, version, module, message):
  model_dir = shutil.copytree(trained, tmp_path / "run")
  recorded = model_dir / "checkpoints" / "format.json"
  if version:
    recorded.write_text(json.dumps({"version": version}))
  else:  # as written before the format was recorded
    recorded.unlink()
  before = snapshot(model_dir)
  args = [f"--model_dir={model_dir}"]
  if module == "engine.train":
    args += [f"--data_dir={data_dir}", "--epochs=2", "--batch_size=8",
             "--filters=4"]
  result = fails_with(args, f"{module}: error: --model_dir={model_dir} "
                      f"{message}", module=module)
  assert result.returncode == 2
  assert snapshot(model_dir) == before


@pytest.fixture
def own(tmp_path):
  """An image folder, arrays, the user's code, and a model_dir holding a
  file of an earlier run."""
  fixtures.write_image_folder(str(tmp_path / "images"))
  fixtures.write_arrays(str(tmp_path / "a.npz"))
  fixtures.write_user_code(str(tmp_path / "code"))
  model_dir = tmp_path / "run"
  model_dir.mkdir()
  (model_dir / "notes.txt").write_text("an earlier run's notes\n")
  return tmp_path


def bad_label_npz(own):
  x, y = fixtures.learnable_images(20, (8, 8), 3, 0)
  np.savez(own / "bad.npz", x_train=x, y_train=y, x_test=x,
           y_test=np.where(y == 2, 7, y))
  return f"--data_dir={own}/bad.npz"


@pytest.mark.parametrize("change, args, message", [
    (lambda own: [p.unlink() for p in (own / "images/train/bee").iterdir()],
     ["--dataset=image_folder", "--data_dir={own}/images"],
     "{own}/images/train/bee: no "),
    (lambda own: (own / "images/train/cat/x.png").write_text("not a png"),
     ["--dataset=image_folder", "--data_dir={own}/images"],
     "{own}/images/train/cat/x.png: not a JPEG, PNG, BMP or GIF image"),
    (None, ["--dataset=arrays", "BAD_LABELS"],
     "{own}/bad.npz:y_test: label 7 is out of range"),
    (None, ["--dataset=arrays", "--data_dir={own}/a.npz",
            "--array_keys=x_test=images"],
     "{own}/a.npz: no images (it holds"),
    (lambda own: (own / "code/broken.py").write_text("import nothing_here\n"),
     ["--model={own}/code/broken.py:build"],
     "cannot import {own}/code/broken.py: ModuleNotFoundError: No module "
     "named 'nothing_here'"),
    (None, ["--dataset=arrays", "--data_dir={own}/a.npz",
            "--model={own}/code/users_data.py:load"],
     "--model={own}/code/users_data.py:load: load() raised"),
    (lambda own: (own / "code/listing.py").write_text(
        "def load(data_dir):\n  return {'x_train': []}\n"),
     ["--dataset={own}/code/listing.py:load"],
     "returned a dict; a data set function returns engine.datasets.Splits"),
], ids=["empty_class", "not_an_image", "label_range", "missing_key",
        "model_import", "model_call", "dataset_type"])
def test_own_data_and_model_errors_leave_model_dir_as_it_was(own, change,
                                                             args, message,
                                                             fails_with):
  if change:
    change(own)
  args = [bad_label_npz(own) if a == "BAD_LABELS" else a.format(own=own)
          for a in args]
  before = snapshot(own / "run")
  fails_with([*args, f"--model_dir={own}/run", "--epochs=1"],
             message.format(own=own))
  assert snapshot(own / "run") == before


def test_a_model_failing_on_one_rank_stops_every_rank_with_its_line(tmp_path):
  code = tmp_path / "rank_model.py"
  code.write_text(
      "import horovod.tensorflow as hvd\n"
      "from models import cnn\n"
      "def build(input_shape, num_classes):\n"
      "  if hvd.rank() == 1:\n"
      "    raise RuntimeError('no GPU memory left on this host')\n"
      "  return cnn.build(input_shape=input_shape, num_classes=num_classes)\n")
  data_dir = fixtures.write_fashion_mnist(str(tmp_path / "fm"), 40, 10)
  result = fixtures.launch(
      ["-m", "engine.train", f"--data_dir={data_dir}", f"--model={code}:build",
       f"--model_dir={tmp_path}/run", "--epochs=1", "--batch_size=4"],
      processes=2, timeout=120)
  assert result.returncode != 0
  lines = [l for l in result.stderr.splitlines() if l[:3] in ("[0]", "[1]")]
  assert not [l for l in lines if "Traceback" in l], result.stderr[-3000:]
  expected = (f"--model={code}:build: build(input_shape, num_classes) raised "
              "RuntimeError: no GPU memory left on this host")
  errors = {rank: [l for l in lines if l.startswith(rank) and "error:" in l]
            for rank in ("[0]", "[1]")}
  assert [len(e) for e in errors.values()] == [1, 1], result.stderr[-3000:]
  assert f"error: on rank 1: {expected}" in errors["[0]"][0]
  assert f"error: {expected}" in errors["[1]"][0]
  assert not (tmp_path / "run").exists()


def test_an_image_found_damaged_while_training_is_one_line(own, fails_with):
  """With the statistics given, no sample decodes it before training."""
  bad = own / "images/train/cat/cat_000.png"
  bad.write_bytes(bad.read_bytes()[:60])
  fails_with(["--dataset=image_folder", f"--data_dir={own}/images",
              "--image_size=16", "--image_mean=1,1,1", "--image_std=1,1,1",
              "--batch_size=2", "--epochs=1", f"--model_dir={own}/run"],
             "an image failed to decode while training")


# A flag the user set that no builder of the run takes (the model's, the
# data set's loader's, the task's): one line naming who would take it, exit
# 2, before anything is built or written (flags/reached.py).

@pytest.mark.parametrize("args, message", [
    ("--model=cnn --depth=28", "--depth=28 reaches nothing: --model=cnn "
     "takes no depth (wrn takes it)"),
    ("--image_size=64", "--image_size=64 reaches nothing: "
     "--dataset=fashion_mnist takes no image_size (image_folder, synthetic, "
     "tfrecord take it)"),
    ("--noise=0.1", "--noise=0.1 reaches nothing: --task=classification "
     "takes no noise (reconstruction takes it)"),
], ids=["another_models", "another_loaders", "another_tasks"])
def test_a_flag_no_builder_takes_is_one_line_naming_who_would(
    args, message, data_dir, tmp_path, fails_with):
  result = fails_with([f"--data_dir={data_dir}", f"--model_dir={tmp_path}/run",
                       *args.split()], f"engine.train: error: {message}")
  assert result.returncode == 2
  assert not (tmp_path / "run").exists()


def test_a_flag_a_users_model_does_not_declare_is_one_line(
    data_dir, tmp_path, fails_with):
  code = tmp_path / "plain.py"
  code.write_text("def build(input_shape, num_classes):\n"
                  "  raise AssertionError('built')\n")
  result = fails_with(
      [f"--data_dir={data_dir}", f"--model_dir={tmp_path}/run",
       f"--model={code}:build", "--dropout=0.3"],
      f"engine.train: error: --dropout=0.3 reaches nothing: --model={code}"
      ":build takes no dropout: build's signature does not declare it (cnn, "
      "cosmoflow, unet, wrn take it)")
  assert result.returncode == 2
  assert not (tmp_path / "run").exists()


def test_a_users_model_with_keyword_arguments_takes_every_flag(
    data_dir, tmp_path, train_commands):
  """**kwargs declares every parameter: --dropout reaches it."""
  code = tmp_path / "open.py"
  code.write_text(
      "import keras\n"
      "def build(input_shape, num_classes, **params):\n"
      "  assert params['dropout'] == 0.3, params\n"
      "  inputs = keras.Input(input_shape)\n"
      "  x = keras.layers.Flatten()(inputs)\n"
      "  return keras.Model(inputs, keras.layers.Dense(num_classes)(x))\n")
  result = train_commands.run(
      [f"--data_dir={data_dir}", f"--model_dir={tmp_path}/run",
       f"--model={code}:build", "--dropout=0.3", "--epochs=1",
       "--steps_per_epoch=1", "--batch_size=8", "--progress=none"],
      timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.parametrize("module", ["engine.evaluate", "engine.find_lr"])
def test_the_other_commands_refuse_a_flag_no_builder_takes_alike(
    module, trained, data_dir, fails_with):
  """engine.evaluate checks the flags given to it, not the run's own
  (flags.txt gives every flag; the run checked those it was given)."""
  args = ([f"--model_dir={trained}"] if module == "engine.evaluate" else
          [f"--data_dir={data_dir}", "--range_steps=2"])
  result = fails_with([*args, "--depth=28"],
                      f"{module}: error: --depth=28 reaches nothing: "
                      "--model=cnn takes no depth (wrn takes it)",
                      module=module)
  assert result.returncode == 2
