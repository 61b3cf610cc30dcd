"""A user's `tf.data.Dataset` as a split: the pipeline a Keras fit script
already has, sharded by rank and read as the engine reads any source.

The dataset is given to the model as it yields it: the engine neither
normalizes (`Pipeline.normalizes`) nor augments its examples, and a batch
of `(x, y)` reaches the step as it comes; one of `(x, y, sample_weight)`
reaches it as `(x, (y, sample_weight))`, and x alone as `(x, zeros)`: the
step's `(x, labels)`, which the compiled task and the model's own step
read by the parts the pipeline yields (engine/tasks/compiled.py).

What the engine learns of a pipeline it learns from the pipeline itself:
its element spec (the structure and shapes of its examples), its
cardinality (or, where unknown, a count), and the ops of its graph (which
files it reads, whether it holds Python code or unseeded shuffles).
"""
import dataclasses
from typing import Optional

from absl import logging
import keras
import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.python.data.experimental.ops.distribute import (
    _AutoShardDataset)

from engine.core.errors import UserError
from engine.datasets.splits import (Augmentation, DatasetInfo, Epochs, Shard,
                                    Source, Splits)

# Ops of a pipeline that reads files: tf.data's file sharding (FILE
# auto-sharding) splits the files these read across ranks.
_READERS = frozenset({
    "TFRecordDataset", "TFRecordDatasetV2", "TextLineDataset",
    "FixedLengthRecordDataset", "FixedLengthRecordDatasetV2"})
# Ops that make a pipeline batched, where the element spec alone cannot
# tell (a batch of a fixed size has no leading None).
_BATCHING = frozenset({
    "BatchDataset", "BatchDatasetV2", "PaddedBatchDataset",
    "PaddedBatchDatasetV2", "ParallelBatchDataset", "MapAndBatchDataset",
    "ExperimentalMapAndBatchDataset"})
# Ops whose output a replay cannot be trusted to give again: Python code,
# which tf.data runs but cannot see into. A generator first: it holds a
# PyFunc too, and is the one the user wrote.
_PYTHON = (("GeneratorDataset", "Dataset.from_generator"),
           ("EagerPyFunc", "a tf.py_function"),
           ("PyFunc", "a tf.numpy_function"),
           ("PyFuncStateless", "a tf.numpy_function"))
_FILE_SHARDING_FAILED = "Could not apply FILE based sharding"


@dataclasses.dataclass(frozen=True)
class Pipeline(Source):
  """One split as a user's `tf.data.Dataset`; made by `Pipeline.of`.

  Batched or not (`batched`): when `model` has inputs, x's rank against
  the model input's decides (one more: batched); else the element spec
  and the graph do: batched when every component has a leading dimension
  in common (None, or one size) and the pipeline batches (a batch op in
  its graph). A batched pipeline's batch is each process's batch, as in
  Horovod's examples (`batch_size` is its size, for the engine's Epochs);
  an unbatched one is batched here by the batch size asked for.

  Sharding (`shards_by`): "files" where the pipeline reads files (a
  TFRecordDataset, TextLineDataset, ... in its graph): tf.data's FILE
  auto-sharding gives rank r the files r, r + N, ... before anything
  reads them (a file order shuffle, `list_files`', must be seeded, or
  ranks share files); else "examples", `shard(N, r)` before our batching;
  or, of a batched pipeline, "batches", whole batches by `shard(N, r)`.

  Resuming mid-epoch replays: the stream is skipped to the step, reading
  and discarding what it skips, which gives the very batches a straight
  run had for a deterministic pipeline with seeded shuffles. Not tf.data's
  iterator checkpointing: that needs each rank's iterator in the run's
  checkpoint, which the engine's checkpoint does not hold. A seeded
  reshuffle's state is the dataset object's and goes on from one of its
  iterators to the next: exact because each process builds its dataset
  afresh and reads it the same way before training (a count, a first
  batch, a probe of its file sharding). A pipeline a replay cannot be
  trusted with (Python code, an unseeded shuffle) has `resumes_mid_epoch`
  False, and `why_not_mid_epoch` says why, in a line.
  """
  dataset: tf.data.Dataset
  batched: bool
  batch_size: int  # each process's
  shards_by: str  # "files", "examples" or "batches"
  resumes_mid_epoch: bool
  why_not_mid_epoch: str = ""

  # Given to the model as it yields it: sources.py's normalization is not
  # for this kind.
  normalizes = False

  @classmethod
  def of(cls, dataset: tf.data.Dataset, *, batch_size: int, model=None,
         name: str = "dataset") -> "Pipeline":
    """The pipeline `dataset`, checked: elements (x, y) or (x, y,
    sample_weight); `batch_size` batches it if it is unbatched."""
    _check_structure(dataset.element_spec, name)
    ops = _ops(dataset)
    batched = _is_batched(dataset.element_spec, ops, model)
    why = _why_not_replayable(ops)
    return cls(
        dataset=dataset, batched=batched,
        batch_size=_own_batch(dataset, name) if batched else batch_size,
        shards_by=("files" if ops.names & _READERS else
                   "batches" if batched else "examples"),
        resumes_mid_epoch=not why, why_not_mid_epoch=why)

  def train_batches(self, info: DatasetInfo, *, shard: Shard, epochs: Epochs,
                    augmentation: Augmentation, first_epoch: int,
                    first_step: int) -> tf.data.Dataset:
    """One stream for the run: this rank's share, batched (whole batches
    only, if batched here) and repeated, so a rank whose share is short
    reads it again and epoch k is the stream's k-th run of `epochs.steps`
    batches. A pipeline that cannot be replayed starts afresh: what it
    would skip would not be the batches it had."""
    del info  # the dataset says all
    if augmentation != Augmentation():
      raise UserError(
          "--random_flip, --random_shift, --random_transpose and "
          "--progressive_resizing are for the engine's own data: a "
          "tf.data pipeline augments its own examples; turn them off")
    stream = self._batches(shard, epochs.batch_size, training=True).repeat()
    if not self.resumes_mid_epoch:
      if first_step:
        logging.info("resuming at step %d of epoch %d on a fresh pass of "
                     "the dataset: %s", first_step, first_epoch + 1,
                     self.why_not_mid_epoch)
      return stream
    return stream.skip(first_epoch * epochs.steps + first_step)

  def example_shape(self) -> tuple:
    """One example's x shape, without the batch (of a dict of features,
    the first feature's)."""
    return _example_shape(_first(_parts(self.dataset.element_spec)[0]),
                          self.batched)

  def batch_specs(self) -> tuple:
    """A batch's x and y specs as the pipeline yields them, the batch
    dimension None, and how many parts its elements have: 1, x alone (y
    then stands for nothing, float32 [batch]), 2, (x, y), or 3, with
    sample weights."""
    parts = _parts(self.dataset.element_spec)

    def of_a_batch(example: tf.TensorSpec) -> tf.TensorSpec:
      if example.shape.rank is None:  # (a parsed tensor's, say)
        return tf.TensorSpec(None, example.dtype)
      shape = example.shape.as_list()
      return tf.TensorSpec([None, *(shape[1:] if self.batched else shape)],
                           example.dtype)

    y_spec = parts[1] if len(parts) > 1 else tf.TensorSpec(
        [None] if self.batched else [], tf.float32)
    return (tf.nest.map_structure(of_a_batch, parts[0]),
            tf.nest.map_structure(of_a_batch, y_spec), len(parts))

  def described(self) -> str:
    """How the pipeline is read, for the log."""
    return (f"a tf.data pipeline, {'batched' if self.batched else 'batched here'}"
            f" by {self.batch_size} a process, sharded by {self.shards_by}"
            + ("" if self.resumes_mid_epoch else
               f"; {self.why_not_mid_epoch}"))

  def eval_batches(self, info: DatasetInfo, *, shard: Shard,
                   batch_size: int) -> tf.data.Dataset:
    """This rank's share, each example once across ranks: no repetition
    and no drop, so the last batch may be short."""
    del info
    return self._batches(shard, batch_size, training=False)

  def _batches(self, shard: Shard, batch_size: int, *,
               training: bool) -> tf.data.Dataset:
    dataset = self._sharded(shard)
    if not self.batched:
      dataset = dataset.batch(batch_size, drop_remainder=training)
    # (x, y) as it comes: a map costs each batch a function call (0.06-0.2
    # ms of CPU, bench/RESULTS.md's fit-script section).
    if len(_parts(dataset.element_spec)) == 2:
      return dataset
    return dataset.map(_as_step_takes)

  def _sharded(self, shard: Shard) -> tf.data.Dataset:
    """This rank's share, split as `shards_by` says."""
    if shard.world_size == 1:
      return self.dataset
    if self.shards_by != "files":
      return self.dataset.shard(shard.world_size, shard.rank)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.FILE)
    sharded = _AutoShardDataset(self.dataset.with_options(options),
                                shard.world_size, shard.rank)
    try:  # too few files fails only when read: here, in one line
      next(iter(sharded.take(1)), None)
    except tf.errors.InvalidArgumentError as error:
      if _FILE_SHARDING_FAILED not in error.message:
        raise
      raise UserError(
          f"the dataset reads fewer files than the {shard.world_size} "
          "processes, which split them: write the data in at least as many "
          "files as processes") from None
    return sharded


@dataclasses.dataclass(frozen=True)
class Datasets:
  """What a user's --dataset function may return in place of Splits: its
  training and validation tf.data datasets, trained as engine.fit trains
  them (engine/given.py)."""
  train: tf.data.Dataset
  validation: Optional[tf.data.Dataset] = None

  @classmethod
  def returned(cls, value, name: str) -> Optional["Datasets"]:
    """`value` as Datasets if it is a dataset, or a pair (train,
    validation or None) of them; else None (Splits, or something wrong)."""
    if isinstance(value, tf.data.Dataset):
      return cls(value)
    if not (isinstance(value, (tuple, list)) and value
            and isinstance(value[0], tf.data.Dataset)):
      return None
    if len(value) == 2 and isinstance(value[1], (tf.data.Dataset,
                                                 type(None))):
      return cls(*value)
    raise UserError(f"--dataset={name} returned {len(value)} values, "
                    f"{', '.join(type(v).__name__ for v in value)}; return "
                    "(train, validation) tf.data datasets (validation may be "
                    "None), or engine.datasets.Splits")


def splits_of(train: tf.data.Dataset, validation: Optional[tf.data.Dataset],
              *, batch_size: int, model=None, steps_per_epoch: int = 0
              ) -> Splits:
  """Splits of a user's training and validation datasets; without
  validation, `test` is None and `num_test` 0. A training dataset that
  repeats forever (Horovod's examples: `.repeat()` and fit's
  steps_per_epoch) takes `steps_per_epoch` steps an epoch, and counts as
  that many of its batches (each process's epoch).

  DatasetInfo is the datasets': x's shape and dtype without the batch
  (of a dict of features, the first feature's), the labels' likewise, the
  examples' number from the cardinality where tf.data knows it, else
  counted (one pass; `tf.data.experimental.assert_cardinality` spares
  it), and a mean of 0 and std of 1: nothing is normalized."""
  pipeline = Pipeline.of(train, batch_size=batch_size, model=model,
                         name="the training dataset")
  if int(train.cardinality()) == tf.data.INFINITE_CARDINALITY:
    if not steps_per_epoch:
      raise UserError("the training dataset repeats forever: give "
                      "steps_per_epoch (each process's steps an epoch), or "
                      "drop its .repeat(): the engine repeats it and counts "
                      "its epochs")
    num_train = steps_per_epoch * pipeline.batch_size
  else:
    num_train = _count(pipeline, "the training dataset")
  test, num_test = None, 0
  if validation is not None:
    test = Pipeline.of(validation, batch_size=batch_size, model=model,
                       name="the validation dataset")
    num_test = _count(test, "the validation dataset")
  return Splits(train=pipeline, test=test, info=_info(
      pipeline, num_train=num_train, num_test=num_test, model=model))


def _info(pipeline: Pipeline, *, num_train: int, num_test: int,
          model) -> DatasetInfo:
  x_spec, y_spec, _ = pipeline.batch_specs()
  x, y = _first(x_spec), _first(y_spec)
  image_shape = pipeline.example_shape()
  channels = image_shape[-1] if image_shape and image_shape[-1] else 1
  return DatasetInfo(
      name="pipeline", image_shape=image_shape,
      num_classes=_model_classes(model), num_train=num_train,
      num_test=num_test, mean=(0.0,) * channels, std=(1.0,) * channels,
      image_dtype=x.dtype.name,
      label_shape=_example_shape(y, batched=True),  # (a batch's spec)
      label_dtype=y.dtype.name)


def _first(spec) -> tf.TensorSpec:
  """A tensor's spec, or of a dict of them the first, in the dict's order
  (tf.nest's would be its keys' sorted order)."""
  return _first(next(iter(spec.values()))) if isinstance(spec, dict) else (
      tf.nest.flatten(spec)[0])


def _example_shape(spec: tf.TensorSpec, batched: bool) -> tuple:
  dims = spec.shape.as_list() if spec.shape.rank is not None else []
  return tuple(dims[1:] if batched else dims)


def _model_classes(model) -> int:
  """The model's outputs per example (its last dimension), or 0."""
  outputs = getattr(model, "outputs", None)
  return int(outputs[0].shape[-1] or 0) if outputs else 0


def _as_step_takes(*element):
  """A batch of three parts as `(x, (y, sample_weight))`, sample_weight
  float32 [batch], as Keras' fit unpacks it; of x alone, `(x, zeros)`,
  the labels the step's `(x, labels)` needs and nothing reads."""
  x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(element)
  if y is None:
    return x, tf.zeros(tf.shape(tf.nest.flatten(x)[0])[:1])
  return x, (y, tf.cast(sample_weight, tf.float32))


def _parts(spec) -> tuple:
  """An element's parts as Keras' fit unpacks them: (x, y[, sample_weight])
  of a tuple, else (x,): a tensor, or a dict of features."""
  return spec if isinstance(spec, tuple) else (spec,)


def _check_structure(spec, name: str) -> None:
  """A UserError unless the elements are x alone (a tensor or a dict of
  features, for a model's own train_step), (x, y) or (x, y,
  sample_weight)."""
  if not isinstance(spec, tuple) or len(spec) in (1, 2, 3):
    return
  raise UserError(f"{name} yields a {len(spec)}-tuple: yield (x, y) or (x, "
                  "y, sample_weight), x a tensor or a dict of features")


def _own_batch(dataset: tf.data.Dataset, name: str) -> int:
  """A batched pipeline's batch size: its static one, else its first
  batch's."""
  first = tf.nest.flatten(dataset.element_spec)[0]
  if first.shape[0] is not None:
    return int(first.shape[0])
  batch = next(iter(dataset.take(1)), None)
  if batch is None:
    raise _empty(name)
  return int(tf.shape(tf.nest.flatten(batch)[0])[0])


def _count(pipeline: Pipeline, name: str) -> int:
  """The pipeline's examples: from its cardinality where known, else
  counted."""
  dataset = pipeline.dataset
  cardinality = int(dataset.cardinality())
  if cardinality == tf.data.INFINITE_CARDINALITY:
    raise UserError(f"{name} repeats forever: drop its .repeat(), the "
                    "engine reads it whole, each example once")
  static_batch = tf.nest.flatten(dataset.element_spec)[0].shape[0]
  if cardinality >= 0 and not pipeline.batched:
    count = cardinality
  elif cardinality >= 0 and static_batch is not None:
    count = cardinality * int(static_batch)
  else:
    sizes = dataset.map(lambda *e: tf.shape(
        tf.nest.flatten(e)[0], out_type=tf.int64)[0]) if pipeline.batched else (
            dataset.map(lambda *e: tf.constant(1, tf.int64)))
    count = int(sizes.reduce(tf.constant(0, tf.int64), lambda n, s: n + s))
  if not count:
    raise _empty(name)
  return count


def _empty(name: str) -> UserError:
  return UserError(f"{name} yields nothing: check its files or its filter")


# The pipeline's graph.

@dataclasses.dataclass(frozen=True)
class _Ops:
  names: frozenset  # every op type, in the graph and its functions
  unseeded_shuffle: bool


def _ops(dataset: tf.data.Dataset) -> _Ops:
  """What the dataset's graph holds, its functions' (a map's) included."""
  graph = graph_pb2.GraphDef()
  graph.ParseFromString(dataset._as_serialized_graph().numpy())  # pylint: disable=protected-access
  names = {node.op for node in graph.node}
  for function in graph.library.function:
    names |= {node.op for node in function.node_def}
  consts = {node.name: node for node in graph.node if node.op == "Const"}

  def seed(name):
    node = consts.get(name.split(":")[0])
    return node is not None and tf.make_ndarray(node.attr["value"].tensor)

  # Shuffles take (dataset, buffer_size, seed, seed2, ...): both 0 when
  # neither the op nor the program set a seed, and then every pass
  # differs from any replay of it.
  unseeded = any(node.op.startswith("Shuffle") and not any(
      seed(given) for given in node.input[2:4]) for node in graph.node)
  return _Ops(names=frozenset(names), unseeded_shuffle=unseeded)


def _why_not_replayable(ops: _Ops) -> str:
  """Why a replay of the pipeline may not give its batches again, in a
  line; "" where it does."""
  for op, written in _PYTHON:
    if op in ops.names:
      return (f"the dataset runs {written}, which a replay cannot be "
              "trusted to repeat: a resumed run starts its epoch afresh")
  if ops.unseeded_shuffle:
    return ("the dataset shuffles without a seed: a resumed run starts its "
            "epoch afresh (give shuffle a seed to resume mid-epoch)")
  return ""


def _is_batched(spec, ops: _Ops, model) -> bool:
  """Whether the elements are batches (the rule: `Pipeline`)."""
  x_spec = _parts(spec)[0]
  features = x_spec if isinstance(x_spec, dict) else {None: x_spec}
  inputs = getattr(model, "inputs", None)
  if inputs:
    named = {getattr(i, "name", None): i for i in inputs}
    key = next((k for k in features if k in named), next(iter(features)))
    model_input = named.get(key, inputs[0])
    return features[key].shape.rank == len(model_input.shape)
  leading = {s.shape[0] if s.shape.rank else "scalar"
             for s in tf.nest.flatten(spec)}
  return len(leading) == 1 and "scalar" not in leading and bool(
      ops.names & _BATCHING)
