"""Checkpoints and resume, with real runs on 1 and 2 processes.

The model is the small CNN without dropout or BatchNorm, in deterministic
mode, so that a resumed run can be compared with an uninterrupted one
weight for weight. Runs are module-scoped fixtures, each asserted on by
several tests.
"""
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time

from absl.testing import flagsaver
import numpy as np
import pytest
import tensorflow as tf

from engine import build
from engine import runs as engine_runs
from engine.core.errors import UserError
from engine.distributed import elastic
from engine.loop.loop import TrainLoop
import flags as engine_flags
from tests import fixtures
from tests import timeouts

# Serial (make test): SIGTERM and SIGKILL land in horovodrun's 5 s grace and
# the survivors' 2.5 s watch.
pytestmark = pytest.mark.serial

STEPS = 40  # per epoch: long enough to signal a run mid-epoch


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return fixtures.write_fashion_mnist(str(tmp_path_factory.mktemp("fm")),
                                      num_train=601, num_test=101)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  return tmp_path_factory.mktemp("runs")


def command(data_dir, model_dir, *extra, epochs=4):
  return ["-m", "engine.train", f"--data_dir={data_dir}",
          f"--model_dir={model_dir}", f"--epochs={epochs}",
          f"--steps_per_epoch={STEPS}", "--batch_size=16", "--filters=4",
          "--optimizer=sgd", "--base_lr=0.02", "--progress=none",
          "--deterministic", "--summary_every_steps=5", *extra]


def train(data_dir, model_dir, *extra, epochs=4, processes=1, ok=True):
  result = fixtures.launch(command(data_dir, model_dir, *extra,
                                   epochs=epochs), processes=processes)
  if ok:
    assert result.returncode == 0, result.stderr[-3000:]
  return result


def final_weights(model_dir):
  reader = tf.train.load_checkpoint(
      tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints")))
  # Every variable of the model and of the optimizer (engine/records/
  # checkpoint.py keys them).
  names = [n for n in reader.get_variable_to_shape_map()
           if n.startswith(("model_variables/", "optimizer_variables/"))]
  assert names
  return {n: reader.get_tensor(n) for n in names}


def assert_same_weights(a, b):
  a, b = final_weights(a), final_weights(b)
  assert a.keys() == b.keys()
  for name in a:
    np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-6,
                               err_msg=name)


def records(model_dir):
  with open(os.path.join(model_dir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def tensorboard_steps(model_dir, run, tag):
  """The steps of `tag` in TensorBoard run `run`, over all its files."""
  return sorted(event.step for path in (model_dir / "tensorboard" / run).glob(
      "events.*") for event in tf.compat.v1.train.summary_iterator(str(path))
                for value in event.summary.value if value.tag == tag)


def digest(directory):
  """A hash of every file under `directory`: proof nothing was touched."""
  h = hashlib.sha256()
  for root, _, files in sorted(os.walk(directory)):
    for name in sorted(files):
      path = os.path.join(root, name)
      h.update(path.encode() + open(path, "rb").read())
  return h.hexdigest()


# Uninterrupted references, and runs stopped after 2 epochs and resumed.


@pytest.fixture(scope="module")
def uninterrupted(data_dir, runs):
  for processes in (1, 2):
    train(data_dir, runs / f"whole{processes}", processes=processes)
  return runs


@pytest.fixture(scope="module")
def two_then_two(data_dir, runs):
  for processes in (1, 2):
    model_dir = runs / f"resumed{processes}"
    train(data_dir, model_dir, epochs=2, processes=processes)
    second = train(data_dir, model_dir, processes=processes)
    (runs / f"resumed{processes}.log").write_text(second.stderr)
  return runs


@pytest.mark.parametrize("processes", [1, 2])
def test_resumed_run_ends_on_the_uninterrupted_runs_weights(
    uninterrupted, two_then_two, processes):
  assert_same_weights(uninterrupted / f"whole{processes}",
                      two_then_two / f"resumed{processes}")
  log = (two_then_two / f"resumed{processes}.log").read_text()
  assert "resuming" in log and "at epoch 3, step 0" in log


@pytest.mark.parametrize("processes", [1, 2])
def test_resumed_metrics_continue_the_run(two_then_two, processes):
  history = records(two_then_two / f"resumed{processes}")
  assert [r["epoch"] for r in history] == [1, 2, 3, 4]
  steps = [r["global_step"] for r in history]
  assert steps == [STEPS, 2 * STEPS, 3 * STEPS, 4 * STEPS]
  # The run's clock continues from the checkpoint's.
  seconds = [r["cumulative_seconds"] for r in history]
  assert seconds[2] - seconds[1] == pytest.approx(history[2]["epoch_seconds"])


def test_model_dir_records_the_flags_and_keeps_the_first(two_then_two):
  model_dir = two_then_two / "resumed1"
  first = (model_dir / "flags.txt").read_text()
  assert "--epochs=2" in first and "--filters=4" in first
  assert "--epochs=4" in (model_dir / "flags.latest.txt").read_text()


# A resume with other flags, in this process: the engine's train step, 2
# steps an epoch, each start's flags parsed as its command line's.


def start_here(data_dir, model_dir, **given):
  """One start of the train loop (engine.train's, without its exports) on
  the tiny run's flags with `given` over them, as a command line gives
  them, so flags.txt records what the start was given; its history."""
  fixtures.train_config()  # the engine's flags, parsed once
  tiny = dict(data_dir=data_dir, model_dir=str(model_dir), epochs="1",
              steps_per_epoch="2", batch_size="16", filters="4",
              optimizer="sgd", base_lr="0.02", progress="none")
  with flagsaver.as_parsed(**{**tiny, **given}):
    config = engine_flags.config_from_flags()
  loop = TrainLoop(build.training_parts(config))
  return loop(elastic.TrainingState(loop.variables, run_state=None))


def events(model_dir):
  return [{k: v for k, v in r.items() if k != "time"}
          for r in records(model_dir) if "event" in r]


def test_a_resume_with_another_rate_names_the_change_and_honours_it(
    data_dir, tmp_path, caplog):
  start_here(data_dir, tmp_path)
  with caplog.at_level("INFO", logger="absl"):
    history = start_here(data_dir, tmp_path, epochs="2", base_lr="0.01")
  assert f"resuming {tmp_path} at epoch 2, step 0 with flags changed: " \
      "--base_lr 0.02 → 0.01, --epochs 1 → 2" in caplog.text
  assert history[-1]["learning_rate"] == pytest.approx(0.01)
  # In that start's first epoch record, the change: no line of its own,
  # which every reader of metrics.jsonl would take for an epoch.
  assert [r["epoch"] for r in records(tmp_path)] == [1, 2]
  assert [r.get("flags_changed") for r in records(tmp_path)] == [None, dict(
      step=0, flags={"base_lr": ["0.02", "0.01"], "epochs": ["1", "2"]})]
  # flags.txt reruns the run from its start; flags.latest.txt holds the
  # flags in force, which the runs table shows with the first start's.
  assert "--base_lr=0.02" in (tmp_path / "flags.txt").read_text()
  assert "--base_lr=0.01" in (tmp_path / "flags.latest.txt").read_text()
  header, row = engine_runs.table(
      {"run": engine_runs.read_run(str(tmp_path))}).splitlines()
  assert header.split()[:3] == ["run", "--base_lr", "--epochs"]
  assert row.split()[:4] == ["run", "0.02→0.01", "1→2", "2/2"]


@pytest.mark.parametrize("flag, value, was", [("model", "resnet9", "cnn"),
                                              ("seed", "1", "0")])
def test_a_resume_that_changes_the_model_or_seed_is_refused_untouched(
    data_dir, tmp_path, flag, value, was):
  start_here(data_dir, tmp_path)
  before = digest(tmp_path)
  with pytest.raises(UserError) as refused:
    start_here(data_dir, tmp_path, epochs="2", **{flag: value})
  message = str(refused.value)
  assert refused.value.exit_code == 2 and "\n" not in message
  assert f"changes --{flag} {was} → {value}, which" in message
  assert f"(--flagfile={tmp_path}/flags.txt), or start a new run in " \
      "another --model_dir" in message
  assert digest(tmp_path) == before


def test_a_resume_with_the_same_flags_names_no_change(data_dir, tmp_path,
                                                      caplog):
  start_here(data_dir, tmp_path)
  # The same directories spelled otherwise, and how the start is watched:
  # none of them a change of the run.
  with caplog.at_level("INFO", logger="absl"):
    start_here(f"{data_dir}/", f"{tmp_path}/.", summary_every_steps="1",
               progress="log")
  assert f"resuming {tmp_path}/. at epoch 2, step 0\n" in caplog.text + "\n"
  assert "changed" not in caplog.text
  assert events(tmp_path) == []
  assert not any("flags_changed" in r for r in records(tmp_path))


# Preemption and failures on 2 processes.


def start(data_dir, model_dir, processes=2, epochs=4):
  argv = [fixtures.PYTHON,
          *fixtures.engine_args(command(data_dir, model_dir, epochs=epochs))]
  argv = [*fixtures.horovodrun(processes), *argv]
  return subprocess.Popen(argv, cwd=fixtures.REPO, env=fixtures.engine_env(),
                          text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT)


def wait_for(path, process, timeout=120):
  deadline = time.time() + timeouts.bound(timeout)
  while not os.path.exists(path):
    assert process.poll() is None, process.stdout.read()[-3000:]
    assert time.time() < deadline, f"{path} never appeared"
    time.sleep(0.02)


@pytest.fixture(scope="module")
def sigterm(data_dir, runs):
  model_dir = runs / "sigterm"
  run = start(data_dir, model_dir)
  wait_for(model_dir / "checkpoints" / f"ckpt-{STEPS}.index", run)
  run.send_signal(signal.SIGTERM)  # horovodrun passes it to every rank
  output, _ = run.communicate(timeout=timeouts.bound(120))
  checkpoints = sorted(os.listdir(model_dir / "checkpoints"))
  resumed = train(data_dir, model_dir, processes=2)
  return model_dir, run.returncode, output, checkpoints, resumed.stderr


def test_sigterm_saves_on_rank_zero_and_every_rank_exits_cleanly(sigterm):
  _, _, output, checkpoints, _ = sigterm
  lines = output.splitlines()
  saved = [l for l in lines if l.startswith("[0]") and "stopped by SIGTERM"
           in l]
  assert len(saved) == 1 and "; saved " in saved[0], output[-3000:]
  other = [l for l in lines if l.startswith("[1]") and "stopped by" in l]
  assert len(other) == 1 and "saved" not in other[0]
  # (horovodrun itself reports the ranks' exit code 143 with a traceback.)
  assert not [l for l in lines if l[:3] in ("[0]", "[1]")
              and "Traceback" in l], output[-3000:]
  step = int(saved[0].split("/ckpt-")[1].split(";")[0])
  assert f"ckpt-{step}.index" in checkpoints and step > STEPS


def test_a_run_stopped_mid_epoch_continues_from_the_next_step(
    sigterm, uninterrupted):
  model_dir, _, output, _, resumed_log = sigterm
  stopped = [l for l in output.splitlines() if "stopped by SIGTERM" in l][0]
  epoch, step = (int(x) for x in stopped.split(" at epoch ")[1]
                 .split(";")[0].split(", step "))
  assert f"at epoch {epoch}, step {step}" in resumed_log
  assert_same_weights(uninterrupted / "whole2", model_dir)
  assert [r["epoch"] for r in records(model_dir)] == [1, 2, 3, 4]


def test_sigkill_of_a_worker_ends_the_job_and_a_rerun_resumes(data_dir,
                                                              runs):
  import psutil  # pylint: disable=import-outside-toplevel
  model_dir = runs / "sigkill"
  run = start(data_dir, model_dir, epochs=6)
  wait_for(model_dir / "checkpoints" / f"ckpt-{STEPS}.index", run)
  workers = [p for p in psutil.Process(run.pid).children(recursive=True)
             if p.cmdline()[:1] == [fixtures.PYTHON]
             and p.environ().get("HOROVOD_RANK") == "1"]
  assert workers
  workers[0].kill()
  output, _ = run.communicate(timeout=timeouts.bound(120))  # no hang
  assert run.returncode != 0
  assert re.search(r"\[0\]<stderr>:engine.train: error: rank 1 stopped \d+ s "
                   r"ago \(its error, if any, is above\); run the same "
                   r"command again: it resumes from \S+/ckpt-\d+", output), \
      "\n".join(l for l in output.splitlines() if l.startswith("[0]"))[-3000:]
  rerun = train(data_dir, model_dir, epochs=6, processes=2)
  assert "resuming" in rerun.stderr
  assert [r["epoch"] for r in records(model_dir)] == [1, 2, 3, 4, 5, 6]
  # One curve, whatever the killed start wrote past its checkpoint.
  assert tensorboard_steps(model_dir, "train", "batch_loss") == list(
      range(5, 6 * STEPS + 1, 5))
  assert tensorboard_steps(model_dir, "validation", "epoch_accuracy") == [
      1, 2, 3, 4, 5, 6]
  assert output


def test_a_signal_on_one_rank_stops_every_rank_by_its_name(data_dir, runs):
  # horovodrun's SIGTERM can reach one rank after the others agreed to stop:
  # here it reaches rank 1 alone, and rank 0 still saves and names it.
  import psutil  # pylint: disable=import-outside-toplevel
  model_dir = runs / "one_rank_signalled"
  run = start(data_dir, model_dir)
  wait_for(model_dir / "checkpoints" / f"ckpt-{STEPS}.index", run)
  workers = [p for p in psutil.Process(run.pid).children(recursive=True)
             if p.cmdline()[:1] == [fixtures.PYTHON]
             and p.environ().get("HOROVOD_RANK") == "1"]
  assert workers
  workers[0].send_signal(signal.SIGTERM)
  output, _ = run.communicate(timeout=timeouts.bound(120))
  saved = re.findall(r"\[0\]<stderr>:engine.train: stopped by SIGTERM at "
                     r"epoch 2, step \d+; saved \S+/ckpt-(\d+);", output)
  assert len(saved) == 1, output[-3000:]
  assert os.path.exists(model_dir / "checkpoints" / f"ckpt-{saved[0]}.index")
  for rank in (0, 1):
    assert f"Process {rank} exit with status code 143" in output, \
        output[-3000:]


def test_resume_on_another_number_of_processes(data_dir, runs):
  model_dir = runs / "resized"
  train(data_dir, model_dir, "--steps_per_epoch=0", epochs=1, processes=1)
  second = train(data_dir, model_dir, "--steps_per_epoch=0", epochs=2,
                 processes=2)
  assert "continuing on 2 processes (was 1): global batch 32 (was 16)" in \
      second.stderr
  history = records(model_dir)
  assert [r["world_size"] for r in history] == [1, 2]
  assert history[0]["global_step"] == 601 // 16
  assert history[1]["global_step"] == 2 * (601 // 32)  # recomputed
  assert history[1]["learning_rate"] == pytest.approx(0.04)  # 0.02 x 2


# Bad checkpoints, on one process.


def copy_of(source, runs, name):
  target = runs / name
  shutil.copytree(source, target)
  return target


def test_a_damaged_latest_checkpoint_is_reported_and_the_previous_used(
    data_dir, uninterrupted, runs):
  model_dir = copy_of(uninterrupted / "whole1", runs, "damaged")
  data = model_dir / "checkpoints" / f"ckpt-{4 * STEPS}.data-00000-of-00001"
  data.write_bytes(data.read_bytes()[:64])
  result = train(data_dir, model_dir, epochs=4)
  warnings = [l for l in result.stderr.splitlines() if "unreadable" in l]
  assert len(warnings) == 1 and f"ckpt-{4 * STEPS}" in warnings[0]
  assert "at epoch 4, step 0" in result.stderr  # from ckpt-120, epoch 3's
  assert_same_weights(uninterrupted / "whole1", model_dir)
  assert [r["epoch"] for r in records(model_dir)] == [1, 2, 3, 4]


@pytest.mark.parametrize("flags, message", [
    # Named by the flags a resume may not change (KEPT_FLAGS); the
    # checkpoint's identity refuses what no flag says (test_checkpoint).
    (["--model=resnet9"], "changes --model cnn → resnet9, which its "
     "checkpoints, data order and figures are of"),
    (["--filters=8"], "changes --filters 4 → 8, which"),
    (["--resume=never"], "holds checkpoints of an earlier run and "
     "--resume=never"),
])
def test_refused_checkpoints_are_left_untouched(data_dir, uninterrupted,
                                                runs, flags, message):
  model_dir = uninterrupted / "whole1"
  before = digest(model_dir)
  result = train(data_dir, model_dir, *flags, ok=False)
  assert result.returncode == 2
  errors = [l for l in result.stderr.splitlines() if "error:" in l]
  assert len(errors) == 1 and "Traceback" not in result.stderr
  assert __import__("re").search(message, errors[0]), errors[0]
  assert digest(model_dir) == before


def test_resume_from_starts_a_new_run_from_another_runs_checkpoint(
    data_dir, uninterrupted, runs):
  model_dir = runs / "continued"
  result = train(data_dir, model_dir,
                 f"--resume_from={uninterrupted / 'whole1'}", epochs=5)
  assert "starting" in result.stderr and "(epoch 5, step 0)" in result.stderr
  assert [r["epoch"] for r in records(model_dir)] == [5]


# Using the result.


def test_exported_savedmodel_predicts_from_uint8_images(data_dir,
                                                        uninterrupted):
  from engine import datasets  # pylint: disable=import-outside-toplevel
  model_dir = uninterrupted / "whole2"
  test = datasets.load("fashion_mnist", data_dir=data_dir).test
  for which in ("final", "best"):
    served = tf.saved_model.load(str(model_dir / "export" / which))
    outputs = served.signatures["serving_default"](
        images=tf.constant(test.images))
    accuracy = float(np.mean(outputs["classes"].numpy() == test.labels))
    np.testing.assert_allclose(outputs["probabilities"].numpy().sum(1), 1,
                               rtol=1e-5)
    if which == "final":
      assert accuracy == pytest.approx(records(model_dir)[-1]["val_accuracy"])
    else:
      assert accuracy == pytest.approx(
          max(r["val_accuracy"] for r in records(model_dir)))


@pytest.mark.parametrize("processes", [1, 2])
def test_evaluate_reproduces_the_final_figures(uninterrupted, processes):
  model_dir = uninterrupted / "whole2"
  result = fixtures.launch(["-m", "engine.evaluate",
                            f"--model_dir={model_dir}"], processes=processes)
  assert result.returncode == 0, result.stderr[-3000:]
  line = [l for l in result.stdout.splitlines() if "test accuracy" in l]
  assert len(line) == 1  # rank 0 only
  last = records(model_dir)[-1]
  assert f"test loss {last['val_loss']:.4f}" in line[0]
  assert f"test accuracy {last['val_accuracy']:.4f}" in line[0]
  assert f"ckpt-{4 * STEPS}" in line[0]


def test_rerunning_a_finished_run_says_so_and_keeps_it(data_dir,
                                                       uninterrupted, runs):
  model_dir = copy_of(uninterrupted / "whole1", runs, "finished")
  before = records(model_dir)
  result = train(data_dir, model_dir)
  assert "has finished its 4 epochs already" in result.stderr
  assert records(model_dir) == before
