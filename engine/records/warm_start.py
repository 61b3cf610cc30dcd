"""Warm start (--init_from): a new run begins from weights the user has,
the way fine-tuning a pretrained network does: a `.keras` file, a
`.weights.h5` file, or another run's checkpoint. Its weights only: the
optimizer starts afresh and the run at its first step.

Whatever the kind, the file is read as a map from a key to an array and
the model as a map from the same keys to its variables, compared in the
order of `model.variables`; the first variable of the model the file
lacks, or holds in another shape, is named in one line before anything
is assigned, so a file of another model never half-loads.

- Keras' files (`.weights.h5`, and the `model.weights.h5` inside a
  `.keras` archive) key each weight by its place in the model's
  structure (`layers/dense/vars/0`). Keras writes those keys for the
  model itself when it saves it; the model's own save, each variable
  holding its index (`_keras_places`), says which key is which variable.
  The architecture in a `.keras` file is never deserialized: a model
  with the user's own layers loads where their classes are not
  registered. A model saved inside another (the engine's `.keras` export
  puts the trained model behind the normalization, export.py) is found
  under its key in the outer one.
- The engine's checkpoints (format 3) key the model's variables by their
  index in `model.variables` (checkpoint_variables.py).

Layers the builder froze (`trainable = False`) are loaded too, and stay
frozen: the train step takes gradients and builds optimizer slots for
`model.trainable_variables` alone (engine/compute/step.py).
"""
import io
import os
import tempfile
from typing import Optional
import zipfile

import h5py
import keras
import numpy as np
import tensorflow as tf

from engine.core.errors import first_line
from engine.core.errors import UserError
from engine.records import checkpoint
from engine.records import checkpoint_variables

KINDS = ("a .keras file, a .weights.h5 file, or another run's model_dir, "
         "its checkpoints/ directory or a checkpoint prefix")
_KERAS_WEIGHTS = "model.weights.h5"  # a .keras archive's weights
_OPTIMIZER = "optimizer/"  # a compiled model's optimizer, in Keras' files


def start_from(model: keras.Model, init_from: str,
               resuming: bool) -> Optional[str]:
  """Warm-starts `model` from `init_from` in a new run; the line to log,
  None without --init_from. A run that resumes continues its own
  checkpoint: rerunning the same command must not start it over."""
  if not init_from:
    return None
  if resuming:
    return (f"--init_from={init_from} ignored: resuming from the "
            "checkpoint in model_dir")
  return warm_start(model, init_from)


def warm_start(model: keras.Model, path: str) -> str:
  """Loads `model`'s weights from `path` (KINDS); returns a line for the
  log. A path of another model is a UserError naming the first variable
  that differs."""
  source, kind = _source(path)
  try:
    places = source.places(model)
    root = _root(places, source, path)
    for key, variable in places.items():
      variable.assign(source.value(root + key))
  finally:
    source.close()
  return f"warm start: {len(places)} weights from {path} ({kind})"


class _Checkpoint:
  """An engine checkpoint of format 3: model_variables/NNNN."""

  def __init__(self, prefix: str):
    self._prefix = prefix
    try:
      self._reader = tf.train.load_checkpoint(prefix)
    except (tf.errors.OpError, ValueError) as e:
      raise UserError(f"--init_from={prefix}: checkpoint unreadable "
                      f"({first_line(e)}); give another") from None
    tensors = self._reader.get_variable_to_shape_map()
    self._tensors = {key.split("/")[1]: key for key in tensors
                     if key.startswith(checkpoint_variables.MODEL + "/")}
    if not self._tensors:
      raise UserError(f"--init_from={prefix}: this checkpoint holds no "
                      f"{checkpoint_variables.MODEL}/ (not of this engine, "
                      "or of a format before 3); give its run's exported "
                      ".keras file instead")
    self.shapes = {index: tuple(tensors[key])
                   for index, key in self._tensors.items()}
    self.roots = [""]

  def places(self, model: keras.Model) -> dict:
    return checkpoint_variables.keyed(model.variables)

  def value(self, key: str) -> np.ndarray:
    try:
      return self._reader.get_tensor(self._tensors[key])
    except (tf.errors.OpError, OSError) as e:  # a damaged data file
      raise UserError(f"--init_from={self._prefix}: checkpoint unreadable "
                      f"({first_line(e)}); give another") from None

  def close(self) -> None:
    pass


class _KerasWeights:
  """Keras' weights file: a .weights.h5, or the one inside a .keras."""

  def __init__(self, path: str):
    try:
      if path.endswith(".keras"):
        with zipfile.ZipFile(path) as archive:
          self._file = h5py.File(io.BytesIO(archive.read(_KERAS_WEIGHTS)),
                                 "r")
      else:
        self._file = h5py.File(path, "r")
    except (OSError, KeyError, zipfile.BadZipFile) as e:
      raise UserError(f"--init_from={path}: unreadable ({first_line(e)}); "
                      "give a file Keras saved (model.save, "
                      "model.save_weights)") from None
    self.shapes = {}
    self._file.visititems(self._note_shape)
    # The model itself, and each model saved inside it (its layers'
    # weights under layers/ of its own).
    self.roots = [""] + [f"layers/{name}/" for name, group
                         in self._file.get("layers", {}).items()
                         if isinstance(group.get("layers"), h5py.Group)]

  def _note_shape(self, key: str, item) -> None:
    if isinstance(item, h5py.Dataset):
      self.shapes[key] = tuple(item.shape)

  def places(self, model: keras.Model) -> dict:
    return _keras_places(model)

  def value(self, key: str) -> np.ndarray:
    return self._file[key][()]

  def close(self) -> None:
    self._file.close()


def _source(path: str):
  """What `path` holds, and its kind in words; a UserError naming
  --init_from if it is none of KINDS."""
  for suffix in (".keras", ".weights.h5"):
    if path.endswith(suffix) and os.path.isfile(path):
      return _KerasWeights(path), f"a {suffix} file"
  try:
    prefix = checkpoint.resolve(path)
  except UserError:
    found = "is none of" if os.path.exists(path) else "does not exist; give"
    raise UserError(f"--init_from={path} {found} {KINDS}") from None
  return _Checkpoint(prefix), f"checkpoint {prefix}"


def _keras_places(model: keras.Model) -> dict:
  """The keys Keras' weights files hold `model`'s variables under, in the
  order of `model.variables`. Keras derives them from the model's
  structure as it walks it to save; rather than walk it again, the model
  is saved once with every variable holding its own index (what else the
  save holds, a compiled model's optimizer, holds no such variable). Its
  values are as they were after."""
  variables = model.variables
  values = [variable.numpy() for variable in variables]
  index_of = {}

  def note(key, item):
    if isinstance(item, h5py.Dataset) and item.size:
      index = int(item[()].flat[0])
      if (index < len(variables) and item.shape == variables[index].shape
          and np.all(item[()] == index)):
        index_of[key] = index

  try:
    for index, variable in enumerate(variables):
      variable.assign(np.full(variable.shape, index, variable.dtype))
    with tempfile.TemporaryDirectory() as directory:
      path = os.path.join(directory, "places.weights.h5")
      model.save_weights(path)
      with h5py.File(path, "r") as saved:
        saved.visititems(note)
  finally:
    for variable, value in zip(variables, values):
      variable.assign(value)
  keys = {index: key for key, index in index_of.items()}
  return {keys[index]: variable for index, variable in enumerate(variables)
          if index in keys}


def _root(places: dict, source, path: str) -> str:
  """Where in `source` the model's weights are: the first of its roots
  that holds every variable in `places` in its shape, and no more; else a
  UserError with the difference from the root that holds the most."""
  differences = [(_difference(places, source.shapes, root), root)
                 for root in source.roots]
  for difference, root in differences:
    if not difference:
      return root
  difference, _ = min(differences, key=lambda each: each[0][0])
  raise UserError(f"--init_from={path} holds another model: "
                  f"{difference[1]}; give weights of this model")


def _difference(places: dict, shapes: dict, root: str) -> tuple:
  """(how many of `places` match before the first difference, the
  difference in words), or () if `shapes` under `root` fit them all."""
  for matched, (key, variable) in enumerate(places.items()):
    shape = shapes.get(root + key)
    if shape != tuple(variable.shape):
      found = "absent" if shape is None else f"of shape {_shape(shape)}"
      return (-matched, f"{variable.path} of shape {_shape(variable.shape)} "
                        f"is {found} there")
  # A compiled model's file holds its optimizer's state too.
  held = sum(key.startswith(root) and not key.startswith(_OPTIMIZER)
             for key in shapes)
  if held > len(places):
    return (-len(places), f"it holds {held} weights, this model "
                          f"{len(places)}")
  return ()


def _shape(shape) -> str:
  return "(" + ", ".join(map(str, shape)) + ")"
