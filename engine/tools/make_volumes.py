r"""Generates CosmoFlow-style volumes offline: a regression data set whose
targets are the parameters of the physics that made each input.

  .venv/bin/python -m engine.tools.make_volumes --output_dir=DIR --size=32 \
      --train=1024 --validation=256 --seed=0

writes CosmoFlow's (MLPerf HPC) layout, which --dataset=tfrecord reads:

  DIR/train/cosmo_00000.tfrecord.gz, ...   --samples_per_file records each
  DIR/validation/cosmo_00000.tfrecord.gz, ...
  DIR/features.txt   x:raw_int16:32x32x32x4 and y:float32:4, a line each
  DIR/classes.txt    the targets' names, in order
  DIR/volumes.json   the flags, the counts, each parameter's physical range

Each record is a tf.train.Example: `x` the raw little-endian int16 bytes of
a [size, size, size, channels] volume of particle counts (C order), `y` the
4 parameters, each scaled from its physical range to [-1, 1] as CosmoFlow's
normalized parameters are (volumes.json gives the ranges back).

The physics, per sample: a Gaussian random field g in a periodic box, white
noise shaped in Fourier space to the power spectrum
P(k) ∝ k^slope exp(-(k smoothing)^2) and scaled to rms `amplitude`. Like
CosmoFlow's 4 redshifts, the channels are that one field grown to growth
factors D = 1, 3/4, 1/2, 1/4 (1 - c / channels) and each turned non-linear,
rho = 1 + (exp(b D g) - 1) / b with b the `nonlinearity`: rho ~ 1 + δ +
b δ^2 / 2 for small δ = D g, second-order perturbation theory's form
(skewness 3 b σ; gravity's tree-level 34/7 σ is b ~ 1.6), and positive for
b >= 1. The counts are Poisson draws of MEAN_COUNT rho / <rho>: a median
near 45, a few hundred in the densest voxels, int16's 32767 capping the
rare extreme. Each parameter shows in its own statistic (the variance, the
spectrum's slope and cutoff, the skewness), so a model can learn them;
tests/test_make_volumes.py checks that a linear fit from such statistics
does. The fields are isotropic, so flips and axis transposes of a volume
keep its targets.

Sample i of a split is drawn from its own generator, seeded by (--seed, the
split, i): reproducible alone, and the splits differ. Files are written to
hidden temporary names (the reader takes every visible file of train/)
renamed when complete; a rerun with the same flags overwrites them.
"""
import dataclasses
import json
import math
import os
import sys
import time
from typing import Callable, Optional

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

from engine.core.errors import UserError

FLAGS = flags.FLAGS


def _define_flags() -> None:
  """The command line's flags, defined only when run as a program: some
  share names with the engine's (--seed, --channels), which a process
  importing both (the tests, a user's script) would define twice."""
  flags.DEFINE_string("output_dir", "", "Directory to write the volumes "
                      "into: train/, validation/ and their description.")
  flags.DEFINE_integer("size", 32, "Voxels along each side of a volume; at "
                       "least 8 (CosmoFlow's are 128).")
  flags.DEFINE_integer("channels", 4, "Growth stages per volume, as "
                       "CosmoFlow's 4 redshifts; at least 1.")
  flags.DEFINE_integer("train", 1024, "Training volumes; at least 1.")
  flags.DEFINE_integer("validation", 256, "Validation volumes; 0 for none.")
  flags.DEFINE_integer("samples_per_file", 1, "Volumes per file "
                       "(CosmoFlow's 1); the last file may hold fewer.")
  flags.DEFINE_integer("seed", 0, "Seeds every volume and its parameters; "
                       "non-negative.")
  flags.DEFINE_enum("compression", "gzip", ["gzip", "zlib", "none"],
                    "How the TFRecord files are compressed (CosmoFlow's: "
                    "gzip).",
                    case_sensitive=False)


@dataclasses.dataclass(frozen=True)
class Parameter:
  """A target: drawn uniformly in [low, high], stored scaled to [-1, 1]."""
  name: str
  low: float
  high: float
  meaning: str

  def physical(self, target: float) -> float:
    return self.low + (target + 1) / 2 * (self.high - self.low)


# Each range as wide as volumes of 16^3 still show. The amplitude's and the
# nonlinearity's high ends keep the densest voxels mostly within int16; a
# nonlinearity below 1 would make densities negative. The slope runs from
# the matter spectrum's on small scales (-3) to white noise. A smoothing
# wider than a voxel would leave a 16^3 box too few wavenumbers below its
# cutoff to measure the slope on.
PARAMETERS = (
    Parameter("amplitude", 0.3, 0.8, "rms of the linear field g (at growth "
              "factor 1), as sigma_8"),
    Parameter("slope", -3.0, 0.0, "n of P(k) ∝ k^n, k in radians per voxel: "
              "from -3 (large blobs) to 0 (white noise)"),
    Parameter("smoothing", 0.25, 1.0, "s of P(k)'s cutoff exp(-(k s)^2): "
              "the field is smoothed by a Gaussian of s voxels"),
    Parameter("nonlinearity", 1.0, 3.0, "b of rho = 1 + (exp(b D g) - 1) / b: "
              "1 lognormal, larger more skewed (gravity's S3 is b ~ 1.6)"),
)
# Particles in a voxel of mean density: counts run from 0 to a few hundred.
MEAN_COUNT = 64
INT16_MAX = np.iinfo(np.int16).max
SPLITS = ("train", "validation")
MANIFEST = "volumes.json"
FEATURES_FILE = "features.txt"
CLASSES_FILE = "classes.txt"
# zlib's fastest: 7 times faster than its default (6) for 4% larger files;
# noisy counts hardly compress further.
COMPRESSION_LEVEL = 1
COMPRESSIONS = {"gzip": ("GZIP", ".tfrecord.gz"), "zlib": ("ZLIB", ".tfrecord"),
                "none": ("", ".tfrecord")}


def write(output_dir: str, *, size: int = 32, channels: int = 4,
          train: int = 1024, validation: int = 256, samples_per_file: int = 1,
          seed: int = 0, compression: str = "gzip",
          report: Optional[Callable[[int, int], None]] = None) -> dict:
  """Writes the data set; returns its manifest (volumes.json's contents).
  `report(done, total)` is called after each volume."""
  settings = dict(size=size, channels=channels, train=train,
                  validation=validation, samples_per_file=samples_per_file,
                  seed=seed, compression=compression)
  _check(settings)
  counts = {"train": train, "validation": validation}
  manifest = {
      "flags": settings,
      "examples": counts,
      "files": {split: math.ceil(count / samples_per_file)
                for split, count in counts.items()},
      "targets": "y = 2 (p - low) / (high - low) - 1 for each parameter p",
      "parameters": [dataclasses.asdict(p) for p in PARAMETERS],
      "growth_factors": growth_factors(channels).tolist(),
      "mean_count": MEAN_COUNT,
  }
  _claim(output_dir, manifest)
  compression_type, suffix = COMPRESSIONS[compression]
  done, total = 0, train + validation
  for split, count in counts.items():
    directory = os.path.join(output_dir, split)
    os.makedirs(directory, exist_ok=True)
    for file_index, first in enumerate(range(0, count, samples_per_file)):
      path = os.path.join(directory, f"cosmo_{file_index:05d}{suffix}")
      temporary = _temporary(path)
      with tf.io.TFRecordWriter(temporary, tf.io.TFRecordOptions(
          compression_type=compression_type,
          compression_level=COMPRESSION_LEVEL)) as writer:
        for index in range(first, min(first + samples_per_file, count)):
          writer.write(example(*sample(seed, split, index, size=size,
                                       channels=channels)))
          done += 1
          if report:
            report(done, total)
      os.replace(temporary, path)
  # Last: a reader finds the spec only beside complete files.
  _write_text(os.path.join(output_dir, FEATURES_FILE),
              f"x:raw_int16:{size}x{size}x{size}x{channels}\n"
              f"y:float32:{len(PARAMETERS)}\n")
  _write_text(os.path.join(output_dir, CLASSES_FILE),
              "".join(p.name + "\n" for p in PARAMETERS))
  return manifest


def sample(seed: int, split: str, index: int, *, size: int,
           channels: int) -> tuple[np.ndarray, np.ndarray]:
  """Volume `index` of `split` and its targets in [-1, 1] (float32)."""
  rng = np.random.default_rng([seed, SPLITS.index(split), index])
  targets = rng.uniform(-1, 1, len(PARAMETERS)).astype(np.float32)
  # From the stored float32 targets, so that y maps back to exactly these.
  params = [p.physical(float(t)) for p, t in zip(PARAMETERS, targets)]
  return volume(params, size, channels, rng), targets


def volume(params, size: int, channels: int,
           rng: np.random.Generator) -> np.ndarray:
  """int16 particle counts [size, size, size, channels] for the physical
  parameters (amplitude, slope, smoothing, nonlinearity)."""
  amplitude, slope, smoothing, nonlinearity = params
  shape = (size,) * 3
  k = wavenumbers(size)
  power = np.zeros_like(k)
  nonzero = k > 0  # no k = 0 mode: the mean density is fixed
  power[nonzero] = (k[nonzero] ** slope *
                    np.exp(-(k[nonzero] * smoothing) ** 2))
  # The field's expected variance is its correlation function at zero lag.
  variance = np.fft.irfftn(power, s=shape, axes=(0, 1, 2))[0, 0, 0]
  noise = np.fft.rfftn(rng.standard_normal(shape))
  field = np.fft.irfftn(noise * np.sqrt(power / variance), s=shape,
                       axes=(0, 1, 2))
  field *= amplitude
  counts = np.empty(shape + (channels,), np.int16)
  for channel, growth in enumerate(growth_factors(channels)):
    density = 1 + np.expm1(nonlinearity * growth * field) / nonlinearity
    # <exp(b δ)> = exp(b^2 σ^2 / 2) for Gaussian δ of rms σ.
    rms = nonlinearity * growth * amplitude
    mean = 1 + np.expm1(rms ** 2 / 2) / nonlinearity
    counts[..., channel] = np.minimum(
        rng.poisson(MEAN_COUNT * density / mean), INT16_MAX)
  return counts


def wavenumbers(size: int) -> np.ndarray:
  """|k| in radians per voxel on rfftn's half grid of a size^3 box."""
  full = 2 * np.pi * np.fft.fftfreq(size)
  half = 2 * np.pi * np.fft.rfftfreq(size)
  return np.sqrt(full[:, None, None] ** 2 + full[None, :, None] ** 2 +
                 half[None, None, :] ** 2)


def growth_factors(channels: int) -> np.ndarray:
  """1, ..., 1/channels: the latest, most non-linear stage first."""
  return 1 - np.arange(channels) / channels


def example(volume_counts: np.ndarray, targets: np.ndarray) -> bytes:
  """A serialized tf.train.Example in CosmoFlow's layout."""
  feature = {
      "x": tf.train.Feature(bytes_list=tf.train.BytesList(
          value=[volume_counts.astype("<i2").tobytes()])),
      "y": tf.train.Feature(float_list=tf.train.FloatList(value=targets)),
  }
  return tf.train.Example(features=tf.train.Features(
      feature=feature)).SerializeToString()


def _check(settings: dict) -> None:
  lowest = dict(size=8, channels=1, train=1, validation=0, samples_per_file=1,
                seed=0)
  for name, low in lowest.items():
    if settings[name] < low:
      raise UserError(f"--{name}={settings[name]}: must be at least {low}")
  if settings["compression"] not in COMPRESSIONS:
    raise UserError(f"--compression={settings['compression']}: must be one "
                    f"of {', '.join(COMPRESSIONS)}")


def _claim(output_dir: str, manifest: dict) -> None:
  """Writes the manifest, unless output_dir holds other data: a run with
  other flags would leave two data sets' files mixed."""
  path = os.path.join(output_dir, MANIFEST)
  if os.path.exists(path):
    try:
      with open(path) as f:
        earlier = json.load(f)
    except (OSError, ValueError):
      earlier = None
    if earlier != manifest:
      raise UserError(f"--output_dir={output_dir} holds volumes made "
                      f"otherwise ({path} says how); choose another "
                      "--output_dir, or empty it")
    return
  found = [os.path.join(output_dir, name)
           for name in (FEATURES_FILE, CLASSES_FILE)
           if os.path.exists(os.path.join(output_dir, name))]
  for split in SPLITS:
    directory = os.path.join(output_dir, split)
    if os.path.isdir(directory):
      found += [os.path.join(directory, name)
                for name in sorted(os.listdir(directory))
                if not name.startswith(".")]
  if found:
    raise UserError(f"--output_dir={output_dir} holds other data "
                    f"({found[0]}, ...); choose a new or empty directory")
  os.makedirs(output_dir, exist_ok=True)
  _write_text(path, json.dumps(manifest, indent=1) + "\n")


def _temporary(path: str) -> str:
  directory, name = os.path.split(path)
  return os.path.join(directory, f".{name}.tmp-{os.getpid()}")


def _write_text(path: str, text: str) -> None:
  temporary = _temporary(path)
  with open(temporary, "w") as f:
    f.write(text)
  os.replace(temporary, path)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  start = time.perf_counter()
  shown = 0  # tenths of the volumes reported

  def report(done, total):
    nonlocal shown
    if done * 10 // total > shown:
      shown = done * 10 // total
      print(f"make_volumes: {done}/{total} volumes, "
            f"{done / (time.perf_counter() - start):.0f}/s", file=sys.stderr)

  try:
    if not FLAGS.output_dir:
      raise UserError("--output_dir=DIR is required")
    manifest = write(FLAGS.output_dir, size=FLAGS.size,
                     channels=FLAGS.channels, train=FLAGS.train,
                     validation=FLAGS.validation,
                     samples_per_file=FLAGS.samples_per_file, seed=FLAGS.seed,
                     compression=FLAGS.compression, report=report)
  except UserError as e:
    print(f"make_volumes: error: {e}", file=sys.stderr)
    sys.exit(e.exit_code)
  size, channels = FLAGS.size, FLAGS.channels
  print(f"{FLAGS.output_dir}: {FLAGS.train} training and {FLAGS.validation} "
        f"validation volumes of {size}x{size}x{size}x{channels} in "
        f"{manifest['files']['train']} + {manifest['files']['validation']} "
        f"files, {time.perf_counter() - start:.1f} s; train with "
        f"--task=regression --dataset=tfrecord --data_dir={FLAGS.output_dir} "
        "--log_transform")


if __name__ == "__main__":
  _define_flags()
  app.run(main)
