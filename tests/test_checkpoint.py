import glob
import json
import os

import numpy as np
import pytest
import keras
import tensorflow as tf

from engine.compute import precision
from engine.core import run_files
from engine.core import user_code
from engine.core.errors import UserError
from engine.loop import run_state
from engine.loop import stopping
from engine.records import checkpoint
import models

IDENTITY = "model cnn_4 (1234 parameters) on fashion_mnist"


def build(seed=0, filters=4):
  keras.utils.set_random_seed(seed)
  model = models.build("cnn", input_shape=(8, 8, 1), num_classes=3,
                       filters=filters)
  optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
  optimizer.build(model.trainable_variables)
  return model, optimizer


def manager(model_dir, model, optimizer, identity=IDENTITY, keep=3):
  return checkpoint.Checkpoints(str(model_dir), model=model,
                                optimizer=optimizer, keep=keep,
                                identity=identity)


def test_save_and_restore_weights_optimizer_and_position(tmp_path):
  model, optimizer = build(seed=1)
  optimizer.iterations.assign(17)
  saved = manager(tmp_path, model, optimizer)
  path = saved.save(checkpoint.Position(2, 5, 64, 2), global_step=17)
  assert os.path.basename(path) == "ckpt-17"
  other, other_optimizer = build(seed=2)
  position = manager(tmp_path, other, other_optimizer).restore_latest_readable()
  assert position == checkpoint.Position(2, 5, 64, 2)
  assert int(other_optimizer.iterations.numpy()) == 17
  for a, b in zip(model.weights, other.weights):
    assert (a.numpy() == b.numpy()).all()


def test_keeps_the_latest_few_and_the_best_apart(tmp_path):
  model, optimizer = build()
  saved = manager(tmp_path, model, optimizer, keep=2)
  for step, accuracy in enumerate([0.5, 0.9, 0.7, 0.8], start=1):
    position = checkpoint.Position(step, 0, 8, 1)
    assert saved.save_at_epoch_end(position, step, accuracy) == (step <= 2)
  assert [os.path.basename(p) for p in saved.existing()] == ["ckpt-3",
                                                             "ckpt-4"]
  assert os.path.basename(saved.best_path) == "best-2"
  assert saved.best_score == 0.9


def test_a_resumed_run_knows_the_best_so_far(tmp_path):
  # The best epoch is also the latest checkpoint: resuming from it, a worse
  # epoch must not replace best/.
  model, optimizer = build()
  saved = manager(tmp_path, model, optimizer)
  saved.save_at_epoch_end(checkpoint.Position(1, 0, 8, 1), 1, 0.5)
  saved.save_at_epoch_end(checkpoint.Position(2, 0, 8, 1), 2, 0.9)
  resumed = manager(tmp_path, *build())
  resumed.restore_latest_readable()
  assert not resumed.save_at_epoch_end(checkpoint.Position(3, 0, 8, 1), 3,
                                       0.7)
  assert os.path.basename(resumed.best_path) == "best-2"
  # And a process that takes over as rank 0 without restoring (elastic).
  assert manager(tmp_path, *build()).best_score == 0.9


def test_a_damaged_latest_falls_back_to_the_one_before(tmp_path, caplog):
  model, optimizer = build()
  saved = manager(tmp_path, model, optimizer)
  saved.save(checkpoint.Position(1, 0, 8, 1), 1)
  saved.save(checkpoint.Position(2, 0, 8, 1), 2)
  data = tmp_path / "checkpoints" / "ckpt-2.data-00000-of-00001"
  data.write_bytes(data.read_bytes()[:100])
  restored = manager(tmp_path, *build()).restore_latest_readable()
  assert restored.epoch == 1
  assert "ckpt-2 is unreadable" in caplog.text


def test_no_readable_checkpoint_at_all(tmp_path):
  model, optimizer = build()
  manager(tmp_path, model, optimizer).save(checkpoint.Position(1, 0, 8, 1), 1)
  (tmp_path / "checkpoints" / "ckpt-1.index").write_bytes(b"garbage")
  with pytest.raises(UserError, match="none of its 1 checkpoints is readable"):
    manager(tmp_path, *build()).restore_latest_readable()


def test_another_models_checkpoint_is_refused_naming_both(tmp_path):
  model, optimizer = build()
  manager(tmp_path, model, optimizer).save(checkpoint.Position(1, 0, 8, 1), 1)
  before = {p: p.read_bytes() for p in (tmp_path / "checkpoints").iterdir()
            if p.is_file()}
  other = build(filters=8)
  with pytest.raises(UserError, match=r"holds model cnn_4 .*, but this run "
                     r"is model cnn_8"):
    manager(tmp_path, *other, identity="model cnn_8 on fashion_mnist") \
        .restore_latest_readable()
  # Same identity but different shapes: refused too, not half-restored.
  with pytest.raises(UserError, match="does not match this model"):
    manager(tmp_path, *other).restore_latest_readable()
  assert before == {p: p.read_bytes() for p in before}


def test_resolve_accepts_a_model_dir_a_checkpoint_dir_or_a_prefix(tmp_path):
  model, optimizer = build()
  manager(tmp_path, model, optimizer).save(checkpoint.Position(1, 0, 8, 1), 7)
  prefix = str(tmp_path / "checkpoints" / "ckpt-7")
  assert checkpoint.resolve(str(tmp_path)) == prefix
  assert checkpoint.resolve(str(tmp_path / "checkpoints")) == prefix
  assert checkpoint.resolve(prefix) == prefix
  with pytest.raises(UserError, match="--resume_from=.*: no checkpoint there"):
    checkpoint.resolve(str(tmp_path / "nothing"))


def test_float16_runs_keep_their_loss_scale_and_change_precision_one_way(
    tmp_path):
  model, inner = build(seed=1)
  scaled = precision.with_loss_scaling(inner, "float16")
  variables = model.trainable_variables
  overflowed = [tf.fill(v.shape, float("inf")) for v in variables]
  scaled.apply_gradients(zip(overflowed, variables))
  assert float(precision.loss_scale(scaled)) == 2.0 ** 14  # halved, from 2^15
  manager(tmp_path / "f16", model, scaled).save(
      checkpoint.Position(1, 0, 8, 1), global_step=3)
  model, inner = build(seed=2)
  resumed = precision.with_loss_scaling(inner, "float16")
  resumed.build(model.trainable_variables)  # as the train step builds it
  manager(tmp_path / "f16", model, resumed).restore_latest_readable()
  assert float(precision.loss_scale(resumed)) == 2.0 ** 14
  model, plain = build(seed=3)  # float16 -> float32: the scale is dropped
  assert manager(tmp_path / "f16", model,
                 plain).restore_latest_readable().epoch == 1

  manager(tmp_path / "f32", model, plain).save(
      checkpoint.Position(1, 0, 8, 1), global_step=3)
  model, inner = build(seed=4)
  scaled = precision.with_loss_scaling(inner, "float16")
  scaled.build(model.trainable_variables)
  with pytest.raises(UserError, match="saved without float16 loss scaling"):
    manager(tmp_path / "f32", model, scaled).restore_latest_readable()


def test_the_learning_rate_factor_is_saved_and_restored(tmp_path):
  model, optimizer = build()
  factor = tf.Variable(0.25)
  checkpoint.Checkpoints(str(tmp_path), model=model, optimizer=optimizer,
                         keep=3, identity=IDENTITY, lr_factor=factor).save(
                             checkpoint.Position(1, 0, 8, 1), 4)
  restored = tf.Variable(1.0)
  checkpoint.Checkpoints(str(tmp_path), model=model, optimizer=optimizer,
                         keep=3, identity=IDENTITY,
                         lr_factor=restored).restore_latest_readable()
  assert float(restored.numpy()) == 0.25


def test_the_runs_clock_is_saved_with_the_position(tmp_path):
  model, optimizer = build()
  manager(tmp_path, model, optimizer).save(
      checkpoint.Position(1, 3, 8, 1, seconds=42.5), 11)
  assert manager(tmp_path, model, optimizer).restore_latest_readable() == \
      checkpoint.Position(1, 3, 8, 1, seconds=42.5)


def test_the_first_save_records_the_checkpoints_format(tmp_path):
  model, optimizer = build()
  saved = manager(tmp_path, model, optimizer)
  assert not (tmp_path / "checkpoints").exists()  # nothing before a save
  saved.save(checkpoint.Position(1, 0, 8, 1), 1)
  assert json.loads((tmp_path / "checkpoints" / "format.json").read_text()) \
      == {"version": run_files.CHECKPOINT_FORMAT}
  assert run_files.checkpoint_format(str(tmp_path / "checkpoints")) == \
      run_files.CHECKPOINT_FORMAT
  assert manager(tmp_path, *build()).restore_latest_readable().epoch == 1


def another_format(model_dir, version):
  """A model_dir of a run whose checkpoints are of format `version` (0:
  no format recorded, as before it was): its files, to compare after."""
  manager(model_dir, *build()).save(checkpoint.Position(1, 0, 8, 1), 1)
  recorded = model_dir / "checkpoints" / "format.json"
  if version:
    recorded.write_text(json.dumps({"version": version}))
  else:
    recorded.unlink()
  return {p: p.read_bytes() for p in model_dir.rglob("*") if p.is_file()}


@pytest.mark.parametrize("version, written", [
    (0, r"format 0 \(written before format.json recorded it\)"),
    (1, "format 1"),  # tf_keras' (Keras 2's)
    (4, "format 4")])
def test_checkpoints_of_another_format_are_one_line_and_kept(
    tmp_path, version, written):
  before = another_format(tmp_path / "run", version)
  reader = {0: r"the engine's revision 27dc95f \(82c6a49 .*\)",
            1: r"the engine's revision 2650be9, the last on tf_keras "
               r"\(Keras 2\)"}.get(version, "the engine that wrote them")
  refusal = (f"holds checkpoints of {written}, and this engine reads formats "
             f"2 and {run_files.CHECKPOINT_FORMAT} only: finish or evaluate "
             "that "
             f"run with {reader}, or ")
  # Resumed, and by engine.evaluate, which restores no optimizer.
  for optimizer in (build()[1], None):
    with pytest.raises(UserError, match=f"^--model_dir={tmp_path}/run "
                       f"{refusal}start a new run in another --model_dir$"):
      checkpoint.Checkpoints(str(tmp_path / "run"), model=build()[0],
                             optimizer=optimizer, keep=3, identity=IDENTITY)
  # Given as another run's checkpoint (--resume_from, --checkpoint).
  path = f"{tmp_path}/run/checkpoints/ckpt-1"
  with pytest.raises(UserError, match=f"^checkpoint {path} is of "
                     f"{written}, and .*: finish or evaluate that run with "
                     f"{reader}, or give another checkpoint$"):
    manager(tmp_path / "new", *build()).restore(path)
  assert before == {p: p.read_bytes() for p in before}
  assert not (tmp_path / "new").exists()


def test_a_damaged_format_record_is_one_line(tmp_path):
  another_format(tmp_path, 1)
  (tmp_path / "checkpoints" / "format.json").write_text('{"version": "1"')
  with pytest.raises(UserError, match=r"checkpoints/format.json: unreadable "
                     r".*; it records the format of the checkpoints beside it "
                     r'\(this engine writes \{"version": 3\}\): restore it'):
    manager(tmp_path, *build())


def test_the_early_stopping_count_goes_back_with_the_checkpoint(tmp_path):
  # What a resume and a rollback continue from: the count as it was saved,
  # not the epochs counted after it, nor a count started again at 0.
  model, optimizer = build()
  stop = stopping.Target(0.5, patience=3)
  saved = checkpoint.Checkpoints(str(tmp_path), model=model,
                                 optimizer=optimizer, keep=3,
                                 identity=IDENTITY, stop=stop)
  stop.update(epoch=1, value=0.6, cumulative_seconds=10.0)
  stop.update(epoch=2, value=0.7, cumulative_seconds=20.0)
  saved.save(checkpoint.Position(2, 0, 8, 1), 2)
  stop.update(epoch=3, value=0.8, cumulative_seconds=30.0)
  resumed = stopping.Target(0.5, patience=3)
  checkpoint.Checkpoints(str(tmp_path), model=model, optimizer=optimizer,
                         keep=3, identity=IDENTITY,
                         stop=resumed).restore_latest_readable()
  assert (resumed.consecutive, resumed.first_reached_epoch,
          resumed.first_reached_seconds) == (2, 1, 10.0)
  saved.restore_latest_readable()  # a rollback's restore
  assert (stop.consecutive, stop.first_reached_epoch) == (2, 1)


def test_a_legacy_optimizers_checkpoint_is_one_line_and_kept(tmp_path):
  # What a TensorFlow 2.15 run with novograd or lamb saved: tensorflow-addons
  # built them on Keras' legacy optimizers, whose slots ours cannot take.
  # Its checkpoints record no format (they are of format 0): refused, for
  # training and evaluation alike, naming the revision that resumes them.
  # (Keras 3 has no legacy optimizers: a checkpoint without format.json
  # stands for it.)
  model, _ = build()
  legacy = keras.optimizers.SGD(0.1, momentum=0.9)
  legacy.apply_gradients([(tf.zeros_like(v), v)
                          for v in model.trainable_variables])
  position = {name: tf.Variable(1, dtype=tf.int64)
              for name in ("epoch", "step", "global_batch", "world_size")}
  path = tf.train.Checkpoint(
      model=model, optimizer=legacy, identity=tf.Variable(IDENTITY),
      best_accuracy=tf.Variable(0.5, dtype=tf.float64), **position).save(
          str(tmp_path / "checkpoints" / "ckpt"))
  before = {p: p.read_bytes() for p in (tmp_path / "checkpoints").iterdir()}
  with pytest.raises(UserError, match=f"checkpoint {path} is of format 0 .*"
                     r"\(82c6a49 for a novograd or lamb run saved on "
                     "TensorFlow 2.15.* or give another checkpoint"):
    manager(tmp_path / "new", *build()).restore(path)
  with pytest.raises(UserError, match=f"--model_dir={tmp_path} holds "
                     "checkpoints of format 0 .*82c6a49 .* or start a new "
                     "run in another --model_dir"):
    manager(tmp_path, *build())
  assert before == {p: p.read_bytes() for p in before}
  # Nor do its weights alone restore, as engine.evaluate would restore
  # them: the revision named evaluates it.
  evaluated, _ = build(seed=3)
  with pytest.raises(UserError, match="format 0 .*82c6a49"):
    checkpoint.Checkpoints(str(tmp_path), model=evaluated, optimizer=None,
                           keep=3, identity=IDENTITY)


def test_the_runs_counts_go_with_the_checkpoint_and_older_ones_count_none(
    tmp_path):
  # Saved without counts: as the engine wrote this format up to ade757c.
  model, optimizer = build()
  counts = run_state.Counts(3)
  counts.epoch_sums.assign([1.0, 2.0, 32.0])
  counts.skipped_steps.assign(1)
  counts.rollbacks.assign(2)
  checkpoint.Checkpoints(str(tmp_path / "now"), model=model,
                         optimizer=optimizer, keep=1, identity=IDENTITY,
                         counts=counts).save(checkpoint.Position(1, 4, 8, 1),
                                             12)
  manager(tmp_path / "before", model, optimizer).save(
      checkpoint.Position(1, 4, 8, 1), 12)
  for run, expected in (("now", ([1.0, 2.0, 32.0], 1, 2)),
                        ("before", ([0.0, 0.0, 0.0], 0, 0))):
    restored = run_state.Counts(3)
    restored.skipped_steps.assign(5)  # what a run counted before restoring
    checkpoint.Checkpoints(
        str(tmp_path / run), model=model, optimizer=optimizer, keep=1,
        identity=IDENTITY, counts=restored).restore_latest_readable()
    assert (restored.epoch_sums.numpy().tolist(),
            int(restored.skipped_steps.numpy()),
            int(restored.rollbacks.numpy())) == expected


FORMS = os.path.join(os.path.dirname(__file__), "workers", "model_forms.py")


def built_form(form, seed):
  """A model of tests/workers/model_forms.py and its optimizer with every
  variable (BatchNorm's statistics, the momentum) set at random by
  `seed`."""
  model = user_code.load(f"{FORMS}:{form}", "model")((8, 8, 1), 3)
  optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
  optimizer.build(model.trainable_variables)
  values = np.random.default_rng(seed)
  for variable in model.variables + optimizer.variables:
    variable.assign(values.uniform(1, 2, variable.shape).astype(
        variable.dtype))
  return model, optimizer


@pytest.mark.parametrize("form", ["listed", "sequential", "functional",
                                  "applications"])
def test_every_variable_is_restored_however_the_model_holds_its_layers(
    tmp_path, form):
  # Layers in lists, dicts and tuples, custom layers in custom layers,
  # nested models; restored into the same code built again after other
  # models, so that its layers' names differ.
  model, optimizer = built_form(form, seed=1)
  manager(tmp_path, model, optimizer).save(checkpoint.Position(1, 0, 8, 1),
                                           1)
  built_form(form, seed=2)
  other, other_optimizer = built_form(form, seed=3)
  assert [v.path for v in other.variables] != [v.path for v in
                                                model.variables]
  manager(tmp_path, other, other_optimizer).restore_latest_readable()
  for ours, theirs in zip(model.variables + optimizer.variables,
                          other.variables + other_optimizer.variables,
                          strict=True):
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy(),
                                  err_msg=ours.path)
  # engine.evaluate's restore, without the optimizer, and the best
  # export's, which puts the run's own weights back after.
  evaluated, _ = built_form(form, seed=4)
  checkpoint.Checkpoints(str(tmp_path), model=evaluated, optimizer=None,
                         keep=3, identity=IDENTITY).restore_latest_readable()
  exported, exported_optimizer = built_form(form, seed=5)
  own = [v.numpy() for v in exported.variables]
  best = manager(tmp_path, exported, exported_optimizer)
  with best.weights_of(best.latest_path):
    seen = [v.numpy() for v in exported.variables]
  for ours, theirs, evaluated_, own_ in zip(model.variables, seen,
                                            evaluated.variables, own):
    np.testing.assert_array_equal(ours.numpy(), theirs)
    np.testing.assert_array_equal(ours.numpy(), evaluated_.numpy())
  for variable, value in zip(exported.variables, own):
    np.testing.assert_array_equal(variable.numpy(), value)


def without(path, dropped):
  """The checkpoint `path` written again without its tensor `dropped`."""
  reader = tf.train.load_checkpoint(path)
  names = sorted(n for n in reader.get_variable_to_shape_map()
                 if n != dropped)
  tensors = [reader.get_tensor(n) for n in names]
  for written in glob.glob(path + ".*"):
    os.remove(written)
  tf.raw_ops.SaveV2(prefix=path, tensor_names=names,
                    shape_and_slices=[""] * len(names), tensors=tensors)


def resume_or_evaluate(model_dir, model, optimizer, with_optimizer):
  """Restores model_dir's latest checkpoint as a resume does (with the
  optimizer), or engine.evaluate (without)."""
  return checkpoint.Checkpoints(
      str(model_dir), model=model,
      optimizer=optimizer if with_optimizer else None, keep=3,
      identity=IDENTITY).restore_latest_readable()


def test_a_checkpoint_without_one_variable_is_refused_naming_it(tmp_path):
  model, optimizer = built_form("listed", seed=1)
  saved = manager(tmp_path, model, optimizer)
  saved.save(checkpoint.Position(1, 0, 8, 1), 1)
  path = saved.save(checkpoint.Position(1, 2, 8, 1), 3)
  moving_mean = next(i for i, v in enumerate(model.variables)
                     if "moving_mean" in v.path)
  without(path, f"model_variables/{moving_mean:04d}/.ATTRIBUTES/"
          "VARIABLE_VALUE")
  before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
  for with_optimizer in (True, False):
    model, optimizer = built_form("listed", 2)
    with pytest.raises(UserError, match=(
        f"^checkpoint {path} lacks 1 of the "
        f"{len(model.variables) + len(optimizer.variables) * with_optimizer} "
        r"variables to restore \(listed/block(_\d+)?/batch_normalization(_\d+)?/"
        r"moving_mean\): it "
        "was damaged or written for other code; give another checkpoint, "
        "or start a new run in another --model_dir$")):
      resume_or_evaluate(tmp_path, model, optimizer, with_optimizer)
  assert before == {p: p.read_bytes() for p in before}


def format_2(model_dir, model, optimizer):
  """A checkpoint as format 2 wrote it: the model and the optimizer by
  TensorFlow's object graph."""
  position = {name: tf.Variable(1, dtype=tf.int64)
              for name in ("epoch", "step", "global_batch", "world_size")}
  path = tf.train.CheckpointManager(tf.train.Checkpoint(
      model=model, optimizer=optimizer, identity=tf.Variable(IDENTITY),
      best_score=tf.Variable(0.5, dtype=tf.float64),
      seconds=tf.Variable(1.0, dtype=tf.float64), **position),
      str(model_dir / "checkpoints"), max_to_keep=3).save(1)
  (model_dir / "checkpoints" / "format.json").write_text('{"version": 2}')
  return path


def test_a_format_2_checkpoint_resumes_where_it_holds_every_variable(
    tmp_path):
  model, optimizer = built_form("functional", seed=1)
  format_2(tmp_path, model, optimizer)
  other, other_optimizer = built_form("functional", seed=2)
  resumed = manager(tmp_path, other, other_optimizer)
  assert resumed.restore_latest_readable() == checkpoint.Position(1, 1, 1, 1,
                                                                  1.0)
  for ours, theirs in zip(model.variables + optimizer.variables,
                          other.variables + other_optimizer.variables):
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
  # Its next save is of this format, and says so.
  resumed.save(checkpoint.Position(1, 2, 1, 1), 3)
  assert run_files.checkpoint_format(resumed.directory) == \
      run_files.CHECKPOINT_FORMAT


def test_a_format_2_checkpoint_without_a_lists_layers_is_one_line(tmp_path):
  # Format 2 saved no layer a model held in a list or dict (their weights
  # lived on in the optimizer's copy, their BatchNorm statistics not).
  path = format_2(tmp_path, *built_form("listed", seed=1))
  before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
  # Resumed, the BatchNorm statistics of its 3 layers are lacking;
  # evaluated, without the optimizer's copy, all 26 of its weights.
  for with_optimizer, lacking, first in ((True, 6, "batch_normalization"),
                                        (False, 26, "conv2d")):
    model, optimizer = built_form("listed", 2)
    restored = len(model.weights) + len(optimizer.variables) * with_optimizer
    with pytest.raises(UserError, match=(
        f"^checkpoint {path} lacks {lacking} of the {restored} variables to "
        rf"restore \(listed/block(_\d+)?/{first}(_\d+)?/\w+, .* more\): it "
        "was written before the engine saved the variables a model holds "
        "in lists and dicts, "
        "and would go on with them as built; train the run again in "
        "another --model_dir$")):
      resume_or_evaluate(tmp_path, model, optimizer, with_optimizer)
  assert before == {p: p.read_bytes() for p in before}


def test_a_checkpoint_of_another_optimizers_state_says_so(tmp_path):
  # SGD at momentum 0 keeps no slots: resumed with momentum, the
  # checkpoint lacks them, and the line names the optimizer, not damage.
  model, _ = built_form("sequential", seed=1)
  plain = keras.optimizers.SGD(0.1)
  plain.build(model.trainable_variables)
  path = manager(tmp_path, model, plain).save(
      checkpoint.Position(1, 0, 8, 1), 1)
  other, with_momentum = built_form("sequential", seed=2)
  with pytest.raises(UserError, match=(
      f"^checkpoint {path} lacks 6 of the 16 variables to restore "
      r"\(sgd(_\d+)?/sequential_form(_\d+)?_conv2d(_\d+)?_kernel_momentum, "
      r".*\): it holds another optimizer's state than this run's \(another "
      r"--optimizer, or --momentum raised from 0\)")):
    manager(tmp_path, other, with_momentum).restore_latest_readable()
