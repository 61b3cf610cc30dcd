"""TFRecords of any layout, read by a declared feature spec.

ImageNet's TFRecords hold encoded images and class ids (tfrecord.py); a
scientist's hold arrays: CosmoFlow's (MLPerf HPC) each record a 128^3 x 4
volume of int16 particle counts as raw bytes, `x`, and 4 cosmological
parameters, `y`, GZIP-compressed. A spec names the two fields a run reads,
the input first and the label second, each as NAME:KIND[:SHAPE]:

  x:raw_int16:128x128x128x4,y:float32:4

* `raw_<dtype>`: a bytes field holding an array's raw bytes (little-endian,
  C order) of that element type and SHAPE, as `tf.io.decode_raw` reads it;
* `float32` or `int64`: a list of that many values, SHAPE (none for a
  scalar, such as a class id).

Given as --tfrecord_features, or one entry a line in `features.txt` beside
the files. The input's shape is [H, W, C] (images) or [D, H, W, C]
(volumes); the label is a class id (int64 scalar), float targets [k], or a
mask [H, W]. Every record is checked against the spec as it is decoded; one
that does not match stops the run with one line naming its file, its index
in the file and the field.
"""
import dataclasses
import math
import os
import re
from typing import Optional

import numpy as np
import tensorflow as tf

from engine.core.errors import op_detail
from engine.core.errors import UserError
from engine.datasets import statistics

# Beside the TFRecord files: the spec, one entry a line.
FEATURES_FILE = "features.txt"
RAW_DTYPES = ("uint8", "int8", "uint16", "int16", "int32", "float16",
              "float32", "float64")
LIST_DTYPES = ("float32", "int64")
COMPRESSIONS = ("none", "gzip", "zlib")
# What TensorFlow's message says when a record does not match the spec.
MISMATCH = "record does not match the feature spec: "
# Examples the normalization statistics are measured on at start-up:
# spread over the files, the first records of each.
STATISTICS_SAMPLE = 64


@dataclasses.dataclass(frozen=True)
class Feature:
  name: str
  dtype: str                # the element type
  shape: tuple[int, ...]
  raw: bool                 # raw bytes of an array, or a list of values

  def __str__(self) -> str:
    kind = f"raw_{self.dtype}" if self.raw else self.dtype
    return ":".join([self.name, kind] + (["x".join(map(str, self.shape))]
                                         if self.shape else []))

  def size(self) -> int:
    return math.prod(self.shape)

  def parsed_as(self):
    """How tf.io.parse_single_example reads it: leniently (a missing field
    is empty, a list of any length), so `values` can say which field of
    which record is wrong."""
    if self.raw:
      return tf.io.FixedLenFeature([], tf.string, default_value="")
    return tf.io.VarLenFeature(tf.as_dtype(self.dtype))

  def values(self, parsed, where) -> tf.Tensor:
    """The field's array of `shape`, or a failed assertion naming `where`
    (the record's file and index) and the field."""
    if self.raw:
      count, unit = tf.strings.length(parsed), "bytes"
      expected = self.size() * tf.as_dtype(self.dtype).size
      values = tf.io.decode_raw(parsed, self.dtype, little_endian=True)
    else:
      values = parsed.values
      count, unit, expected = tf.size(values), "values", self.size()
    found = tf.where(count > 0, tf.strings.as_string(count) + " " + unit,
                     "nothing (missing or empty)")
    message = tf.strings.join([
        MISMATCH, where, ": field ", self.name, " holds ", found,
        f"; the spec {self} takes {expected} {unit}"])
    check = tf.debugging.Assert(tf.equal(count, expected), [message])
    with tf.control_dependencies([check]):
      return tf.reshape(values, self.shape)


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
  input: Feature
  label: Feature

  def __str__(self) -> str:
    return f"{self.input},{self.label}"

  def decode(self, file, index, record):
    """(input, label) of one serialized record, the `index`th of `file`
    (as `records` gives them)."""
    parsed = tf.io.parse_single_example(
        record, {f.name: f.parsed_as() for f in (self.input, self.label)})
    where = tf.strings.join([file, ": record ", tf.strings.as_string(index)])
    return (self.input.values(parsed[self.input.name], where),
            self.label.values(parsed[self.label.name], where))


def parse(text: str, where: str) -> FeatureSpec:
  """The spec in `text` (entries separated by commas or lines); `where`
  names its source in errors (--tfrecord_features, or the file)."""
  entries = [e.strip() for e in re.split(r"[,\n]", text) if e.strip()]
  if len(entries) != 2:
    raise UserError(f"{where}: {len(entries)} features declared; declare two, "
                    "the input then the label, e.g. "
                    "x:raw_int16:128x128x128x4,y:float32:4")
  spec = FeatureSpec(*(_feature(entry, where) for entry in entries))
  if spec.input.name == spec.label.name:
    raise UserError(f"{where}: the input and the label are both "
                    f"{spec.input.name}")
  if len(spec.input.shape) not in (3, 4):
    raise UserError(f"{where}: the input {spec.input} has "
                    f"{len(spec.input.shape)} dimensions; give images "
                    "HxWxC or volumes DxHxWxC")
  return spec


def _feature(entry: str, where: str) -> Feature:
  name, _, rest = entry.partition(":")
  kind, _, shape = rest.partition(":")
  raw = kind.startswith("raw_")
  dtype = kind[len("raw_"):] if raw else kind
  if not name or (dtype not in (RAW_DTYPES if raw else LIST_DTYPES)):
    raise UserError(
        f"{where}: {entry!r} is not NAME:KIND[:SHAPE]; KIND is "
        f"raw_<{'|'.join(RAW_DTYPES)}> (an array's bytes) or "
        f"{' or '.join(LIST_DTYPES)} (a list), SHAPE as 128x128x4")
  try:
    dims = tuple(int(d) for d in shape.split("x")) if shape else ()
  except ValueError:
    dims = (0,)
  if min(dims, default=1) < 1 or (raw and not dims):
    raise UserError(f"{where}: {entry!r}: the shape must be positive sizes "
                    "joined by x, as 128x128x4 (a raw field needs one)")
  return Feature(name=name, dtype=dtype, shape=dims, raw=raw)


def spec_of(data_dir: str, text: str) -> Optional[FeatureSpec]:
  """--tfrecord_features's spec, else features.txt's in data_dir, else
  None (ImageNet's layout)."""
  if text:
    return parse(text, f"--tfrecord_features={text}")
  path = os.path.join(data_dir, FEATURES_FILE)
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      return parse(f.read(), path)
  except (OSError, UnicodeDecodeError) as e:
    raise UserError(f"{path}: unreadable ({e}); it declares the records' "
                    "features, one NAME:KIND[:SHAPE] a line") from None


def compression_of(files, flag: str) -> str:
  """TensorFlow's compression_type for the files: --tfrecord_compression,
  or detected from the first file's first bytes (GZIP's magic number,
  zlib's header), else none."""
  if flag != "auto":
    return "" if flag == "none" else flag.upper()
  try:
    with open(files[0], "rb") as f:
      head = f.read(2)
  except OSError as e:
    raise UserError(f"{files[0]}: unreadable ({e.strerror})") from None
  if head == b"\x1f\x8b":
    return "GZIP"
  if len(head) == 2 and head[0] == 0x78 and (head[0] * 256 + head[1]) % 31 == 0:
    return "ZLIB"
  return ""


def records(file: str, compression: str) -> tf.data.Dataset:
  """(file, index, record) of each record in `file`."""
  return tf.data.TFRecordDataset(file, compression).enumerate().map(
      lambda index, record: (file, index, record))


def check_and_count(files, spec: FeatureSpec, compression: str) -> int:
  """Decodes every record of `files` as training will: their number, or a
  UserError naming the first that does not match (its file, index and
  field) or cannot be read.

  One stream over all the files, several read at once; only when it fails
  are they read again one by one, to name the file and the record.
  """
  try:
    return int(_decoded(files, spec, compression).reduce(
        np.int64(0), lambda count, _: count + 1))
  except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as e:
    raise UserError(mismatch(e) or _first_bad_record(files, spec,
                                                     compression)) from None


def _decoded(files, spec: FeatureSpec, compression: str) -> tf.data.Dataset:
  return tf.data.Dataset.from_tensor_slices(list(files)).interleave(
      lambda file: records(file, compression), cycle_length=4,
      num_parallel_calls=4).map(spec.decode, num_parallel_calls=4)


def _first_bad_record(files, spec: FeatureSpec, compression: str) -> str:
  """The line naming the first record of `files` that fails to decode."""
  for file in files:
    index = 0
    try:
      for _ in records(file, compression).map(spec.decode):
        index += 1
    except tf.errors.InvalidArgumentError as e:
      return mismatch(e) or f"{file}: record {index}: {op_detail(e)}"
    except tf.errors.DataLossError as e:
      return (f"{file}: record {index}: unreadable ({op_detail(e)}); a "
              "truncated or damaged file, or one compressed otherwise than "
              f"{(compression or 'none').lower()} (--tfrecord_compression)")
  return f"{files[0]}, ...: a record failed to decode, then decoded"


def mismatch(error: tf.errors.OpError) -> str:
  """The one line of a record that does not match the spec, from the
  error of its failed check; '' for another error."""
  found = re.search(re.escape(MISMATCH) + r"(.*?)(\]|$)", error.message,
                    flags=re.DOTALL)
  return " ".join(found.group(1).split()) if found else ""


def sample_statistics(files, spec: FeatureSpec, compression: str,
               transform) -> dict:
  """Per channel, the mean and std of the inputs (after `transform`), and
  float labels' each, over a sample of the training records: the first
  records of up to STATISTICS_SAMPLE files spread over them."""
  per_file = max(1, math.ceil(STATISTICS_SAMPLE / len(files)))
  chosen = files[::max(1, len(files) // STATISTICS_SAMPLE)][:STATISTICS_SAMPLE]
  sample = tf.data.Dataset.from_tensor_slices(list(chosen)).interleave(
      lambda file: records(file, compression).take(per_file),
      cycle_length=4, num_parallel_calls=4).map(spec.decode,
                                                num_parallel_calls=4)
  channel = statistics.Moments()
  label = statistics.Moments()
  try:
    for inputs, labels in sample:
      channel.add(transform(tf.cast(inputs, tf.float32)).numpy().reshape(
          -1, spec.input.shape[-1]))
      label.add(labels.numpy().reshape(1, -1))
  except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as e:
    raise UserError(mismatch(e) or _first_bad_record(chosen, spec,
                                                     compression)) from None
  mean, std = channel.result()
  measured = dict(mean=mean, std=std)
  if not spec.label.raw and spec.label.dtype == "float32":
    measured.update(zip(("label_mean", "label_std"), label.result()))
  return measured
