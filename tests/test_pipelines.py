"""A user's tf.data.Dataset as a source (engine/datasets/pipelines.py)."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from engine.core.errors import UserError
from engine.datasets import pipelines
from engine.datasets.splits import Augmentation, Epochs, Shard

ONE = Shard(0, 1)


def examples(n=12):
  """n examples (x [2] float32 whose first value is the example's id, y)."""
  x = np.stack([np.arange(n), np.zeros(n)], axis=1).astype(np.float32)
  return x, np.arange(n, dtype=np.int64) % 3


def ids(batches) -> list:
  """The example ids of every batch, batch by batch."""
  return [[int(v) for v in np.asarray(tf.nest.flatten(x)[0])[:, 0]]
          for x, _ in batches.as_numpy_iterator()]


def train(pipeline, *, steps, shard=ONE, first_epoch=0, first_step=0,
          batch_size=2, take=None):
  batches = pipeline.train_batches(
      None, shard=shard, epochs=Epochs(batch_size=batch_size, steps=steps,
                                       seed=0),
      augmentation=Augmentation(), first_epoch=first_epoch,
      first_step=first_step)
  return batches.take(take or steps)


def test_x_y_elements_unbatched_are_batched_here_and_come_as_they_are():
  splits = pipelines.splits_of(
      tf.data.Dataset.from_tensor_slices(examples()),
      tf.data.Dataset.from_tensor_slices(examples(5)), batch_size=4)
  assert not splits.train.batched and splits.train.batch_size == 4
  assert (splits.info.num_train, splits.info.num_test) == (12, 5)
  assert splits.info.image_shape == (2,) and splits.info.mean == (0.0, 0.0)
  assert splits.info.std == (1.0, 1.0) and splits.info.label_shape == ()
  assert not splits.train.normalizes
  x, y = next(iter(train(splits.train, steps=3, batch_size=4)))
  # (x, y): no sample weights made for the step to read.
  assert x.shape == (4, 2) and list(y.numpy()) == [0, 1, 2, 0]


def test_sample_weights_and_dict_features_in_a_batched_pipeline():
  x, y = examples()
  features = {"image": x, "extra": x[:, :1]}
  weights = np.linspace(0, 1, 12)
  dataset = tf.data.Dataset.from_tensor_slices(
      (features, y, weights)).batch(3)
  pipeline = pipelines.Pipeline.of(dataset, batch_size=100)
  assert pipeline.batched and pipeline.batch_size == 3
  assert pipeline.shards_by == "batches"
  (got_x, (got_y, got_w)), = train(pipeline, steps=4).take(1)
  assert set(got_x) == {"image", "extra"} and got_x["image"].shape == (3, 2)
  assert got_w.dtype == tf.float32
  np.testing.assert_allclose(got_w.numpy(), weights[:3], rtol=1e-6)
  info = pipelines.splits_of(dataset, None, batch_size=100).info
  assert info.num_train == 12 and info.image_shape == (2,)  # the first's


def test_batched_is_decided_by_the_models_input_rank_when_it_has_one():
  # Batched by 4, the static batch of a drop_remainder batch, and an
  # unbatched dataset of 4x2 examples: alike in their element spec.
  x = np.zeros((8, 4, 2), np.float32)
  unbatched = tf.data.Dataset.from_tensor_slices((x, np.zeros((8, 4))))
  model = keras.Sequential([keras.Input((4, 2)), keras.layers.Dense(1)])
  assert not pipelines.Pipeline.of(unbatched, batch_size=2,
                                   model=model).batched
  flat = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
  assert pipelines.Pipeline.of(unbatched, batch_size=2, model=flat).batched
  # Without a model: the graph's batch op decides.
  assert not pipelines.Pipeline.of(unbatched, batch_size=2).batched
  assert pipelines.Pipeline.of(
      unbatched.unbatch().batch(4, drop_remainder=True), batch_size=2).batched


@pytest.mark.parametrize("batched", [False, True])
def test_two_shards_evaluate_every_example_once(batched):
  dataset = tf.data.Dataset.from_tensor_slices(examples(11))
  pipeline = pipelines.Pipeline.of(dataset.batch(2) if batched else dataset,
                                   batch_size=2)
  seen = [i for rank in range(2) for batch in ids(pipeline.eval_batches(
      None, shard=Shard(rank, 2), batch_size=2)) for i in batch]
  assert sorted(seen) == list(range(11))


def test_a_tensors_pipeline_is_sharded_by_example():
  pipeline = pipelines.Pipeline.of(
      tf.data.Dataset.from_tensor_slices(examples(8)), batch_size=2)
  assert pipeline.shards_by == "examples"
  assert ids(train(pipeline, steps=2, shard=Shard(1, 2))) == [[1, 3], [5, 7]]


def write_files(tmp_path, count=4, per_file=3) -> list:
  files = []
  for f in range(count):
    files.append(str(tmp_path / f"part-{f}.tfrecord"))
    with tf.io.TFRecordWriter(files[-1]) as writer:
      for i in range(per_file):
        writer.write(np.float32([f * 10 + i, f]).tobytes())
  return files


def parsed(record):
  values = tf.io.decode_raw(record, tf.float32)
  values.set_shape([2])
  return values, tf.cast(values[1], tf.int64)


def test_a_files_pipeline_is_sharded_by_file(tmp_path):
  files = write_files(tmp_path)
  dataset = tf.data.Dataset.list_files(str(tmp_path / "*.tfrecord"),
                                       shuffle=False).interleave(
      tf.data.TFRecordDataset).map(parsed)
  pipeline = pipelines.Pipeline.of(dataset, batch_size=3)
  assert pipeline.shards_by == "files"
  by_rank = [sorted(i for batch in ids(pipeline.eval_batches(
      None, shard=Shard(rank, 2), batch_size=3)) for i in batch)
             for rank in range(2)]
  # Whole files each: rank 0 files 0 and 2, rank 1 files 1 and 3.
  assert by_rank == [[0, 1, 2, 20, 21, 22], [10, 11, 12, 30, 31, 32]]
  assert pipelines.Pipeline.of(tf.data.TFRecordDataset(files).map(parsed),
                               batch_size=3).shards_by == "files"
  with pytest.raises(UserError, match="fewer files than the 5 processes"):
    pipeline.eval_batches(None, shard=Shard(0, 5), batch_size=3)


def test_a_resumed_stream_gives_the_straight_streams_batches(tmp_path):
  # Each stream of a pipeline built afresh, as a resumed process builds it:
  # a seeded reshuffle's state is the dataset object's, and goes on from
  # one of its iterators to the next.
  def shuffled():
    return pipelines.Pipeline.of(
        tf.data.Dataset.from_tensor_slices(examples(12)).shuffle(
            12, seed=7, reshuffle_each_iteration=True), batch_size=2)

  assert shuffled().resumes_mid_epoch and not shuffled().why_not_mid_epoch
  straight = ids(train(shuffled(), steps=6, take=18))
  assert straight[0:6] != straight[6:12]  # every epoch reshuffled
  assert ids(train(shuffled(), steps=6, first_epoch=1, first_step=3,
                   take=9)) == straight[9:18]
  # Likewise a files pipeline, its files and records shuffled.
  write_files(tmp_path)

  def files():
    return pipelines.Pipeline.of(tf.data.Dataset.list_files(
        str(tmp_path / "*.tfrecord"), seed=3).interleave(
            tf.data.TFRecordDataset).map(parsed).shuffle(6, seed=1),
                                 batch_size=2)

  straight = ids(train(files(), steps=3, shard=Shard(1, 2), take=9))
  assert straight[0:3] != straight[3:6]
  assert ids(train(files(), steps=3, shard=Shard(1, 2), first_epoch=1,
                   first_step=1, take=5)) == straight[4:9]


def test_an_epochs_stream_runs_on_through_a_short_shard():
  pipeline = pipelines.Pipeline.of(
      tf.data.Dataset.from_tensor_slices(examples(5)), batch_size=2)
  # 2 whole batches a pass; 3 steps an epoch read the pass again.
  assert ids(train(pipeline, steps=3, take=4)) == [[0, 1], [2, 3], [0, 1],
                                                   [2, 3]]


@pytest.mark.parametrize("make, reason", [
    (lambda d: d.map(lambda x, y: (tf.py_function(
        lambda v: v, [x], tf.float32), y)), "tf.py_function"),
    (lambda d: tf.data.Dataset.from_generator(
        lambda: iter(zip(*examples())), output_signature=(
            tf.TensorSpec([2], tf.float32), tf.TensorSpec([], tf.int64))),
     "from_generator"),
    (lambda d: d.shuffle(4), "without a seed")])
def test_a_pipeline_a_replay_cannot_repeat_resumes_at_its_epochs_start(
    make, reason):
  # No global seed (an earlier test's keras.utils.set_random_seed), which
  # would seed the shuffle.
  tf.random.set_seed(None)

  def pipeline():
    return pipelines.Pipeline.of(
        make(tf.data.Dataset.from_tensor_slices(examples())), batch_size=2)

  assert not pipeline().resumes_mid_epoch
  assert reason in pipeline().why_not_mid_epoch
  assert "\n" not in pipeline().why_not_mid_epoch
  # Started afresh, not skipped into: a whole pass, the stream's first.
  resumed = ids(train(pipeline(), steps=6, first_epoch=1, first_step=3))
  assert sorted(sum(resumed, [])) == list(range(12))
  if reason != "without a seed":
    assert resumed == ids(train(pipeline(), steps=6))


def test_elements_of_another_structure_are_refused_in_one_line():
  with pytest.raises(UserError) as error:
    pipelines.splits_of(tf.data.Dataset.from_tensor_slices(
        (np.zeros(4),) * 4), None, batch_size=2)
  assert "a 4-tuple" in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("element", [
    np.arange(8.0).reshape(4, 2), (np.arange(8.0).reshape(4, 2),),
    {"image": np.arange(8.0).reshape(4, 2), "label": np.zeros(4)}])
def test_x_alone_reaches_the_step_with_no_labels(element):
  # As Keras' fit unpacks it: a tensor, a 1-tuple or a dict is x alone,
  # for a model whose own train_step reads x (Keras' GAN guide).
  pipeline = pipelines.Pipeline.of(
      tf.data.Dataset.from_tensor_slices(element), batch_size=2)
  x_spec, _, parts = pipeline.batch_specs()
  assert parts == 1
  x, y = next(iter(pipeline.eval_batches(None, shard=ONE, batch_size=2)))
  image = x["image"] if isinstance(x, dict) else x
  np.testing.assert_array_equal(image, [[0, 1], [2, 3]])
  np.testing.assert_array_equal(y, [0, 0])  # labels nothing reads
  assert tf.nest.map_structure(lambda s: s.shape.as_list(), x_spec) == (
      {"image": [None, 2], "label": [None]} if isinstance(x, dict)
      else [None, 2])


@pytest.mark.parametrize("dataset", [
    tf.data.Dataset.from_tensor_slices(examples(0)),
    tf.data.Dataset.from_tensor_slices(examples()).filter(
        lambda x, y: y > 5),
    tf.data.Dataset.from_tensor_slices(examples()).filter(
        lambda x, y: y > 5).batch(2)])
def test_a_dataset_that_yields_nothing_is_refused(dataset):
  with pytest.raises(UserError, match="yields nothing"):
    pipelines.splits_of(dataset, None, batch_size=2)


def test_a_repeating_dataset_and_the_engines_augmentation_are_refused():
  dataset = tf.data.Dataset.from_tensor_slices(examples())
  with pytest.raises(UserError, match="repeats forever"):
    pipelines.splits_of(dataset.repeat(), None, batch_size=2)
  pipeline = pipelines.Pipeline.of(dataset, batch_size=2)
  with pytest.raises(UserError, match="--random_flip"):
    pipeline.train_batches(None, shard=ONE, epochs=Epochs(2, 3, 0),
                           augmentation=Augmentation(flip=True),
                           first_epoch=0, first_step=0)
