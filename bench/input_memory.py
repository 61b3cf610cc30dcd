r"""Peak memory per rank of the streamed inputs, at two data set sizes.

  .venv/bin/python -m bench.input_memory [--sizes=10000,50000] [--repeats=2]

For each format and size, 32x32x3 images of 10 classes are generated into
--out_dir, and the engine trains on them under `horovodrun -np 2` (the cnn,
batch 128 per process) for as many steps as one epoch of the largest size:
the smaller sizes for several whole epochs. So every rank reads every row
or file of its share, and a run's length, which by itself moves the peak a
little (allocators, caches), is the same at every size. Each rank's peak
resident memory (ru_maxrss) is read at its exit (bench/peak_rss.py). Runs
are interleaved over --repeats rounds.

Formats:
  image_folder  PNG files in class folders (--dataset=image_folder)
  arrays_npy    a directory of .npy files (--dataset=arrays, read by rows)
  arrays_h5     an HDF5 file (--dataset=arrays, read by slices)
  in_memory     the control: a compressed .npz, which is loaded whole; its
                peak must grow with the data, or the measurement is blind
  volumes       16^3 x 4 volumes of CosmoFlow's layout, one a GZIP TFRecord
                file (engine.tools.make_volumes; --dataset=tfrecord), trained
                as regression by --model=cosmoflow: a size is that many
                volumes (--sizes=1000,10000 --formats=volumes)

Streamed formats pass when the larger size's peak is within --tolerance_mb
of the smaller's, per rank.
"""
import json
import os
import shutil
import statistics

from absl import app
from absl import flags
import numpy as np

from bench import generated_images
from bench import interleaved
from engine.tools import make_volumes


FLAGS = flags.FLAGS
flags.DEFINE_list("sizes", ["10000", "50000"], "Training images per size.")
flags.DEFINE_list("formats", ["image_folder", "arrays_npy", "arrays_h5",
                              "in_memory"], "Formats to measure.")
flags.DEFINE_integer("repeats", 2, "Interleaved rounds.")
flags.DEFINE_string("out_dir", "bench/out/input_memory", "Data and runs.")
flags.DEFINE_float("tolerance_mb", 50.0,
                   "Largest growth of a streamed format's peak, per rank.")
flags.DEFINE_string("json", "", "Also write every run's figures here.")

def write(fmt: str, size: int, directory: str) -> tuple[str, list]:
  """The data set of `size` training images (and size/10 test images) in
  `fmt`; returns its path and the engine flags that read it."""
  os.makedirs(directory, exist_ok=True)
  if fmt == "volumes":
    path = os.path.join(directory, "volumes")
    make_volumes.write(path, size=16, channels=4, train=size,
                       validation=size // 10)
    return path, ["--dataset=tfrecord", "--task=regression",
                  "--model=cosmoflow", "--filters=4", "--log_transform",
                  "--random_transpose"]
  train = generated_images.images(size, 0)
  test = generated_images.images(size // 10, 1)
  arrays = dict(x_train=train[0], y_train=train[1], x_test=test[0],
                y_test=test[1])
  if fmt == "image_folder":
    path = os.path.join(directory, "images")
    generated_images.write_folder(path, size, "png")
    return path, ["--dataset=image_folder", "--image_size=32"]
  if fmt == "arrays_npy":
    path = os.path.join(directory, "npy")
    os.makedirs(path, exist_ok=True)
    for name, array in arrays.items():
      np.save(os.path.join(path, name + ".npy"), array)
  elif fmt == "arrays_h5":
    import h5py  # pylint: disable=import-outside-toplevel
    path = os.path.join(directory, "data.h5")
    with h5py.File(path, "w") as f:
      for name, array in arrays.items():
        f[name] = array
  elif fmt == "in_memory":
    path = os.path.join(directory, "data.npz")
    np.savez_compressed(path, **arrays)
  else:
    raise app.UsageError(f"unknown format {fmt}")
  return path, ["--dataset=arrays"]


def run(data_flags: list, data_path: str, run_dir: str,
        epochs: int) -> list[float]:
  """A run under horovodrun -np 2; each rank's peak RSS in MB."""
  prefix = os.path.join(run_dir, "peak_rss")
  command = [interleaved.HOROVODRUN, "--gloo", "-np", "2",
             interleaved.PYTHON, "-m",
             "bench.peak_rss", prefix, f"--epochs={epochs}",
             "--batch_size=128", "--model=cnn", "--progress=none",
             # float32, unmeasured: no models built but the run's.
             "--mixed_precision=none",
             *data_flags, f"--data_dir={data_path}",
             f"--model_dir={run_dir}", "--resume=never"]
  interleaved.launch(command)
  peaks = []
  for rank in (0, 1):
    with open(f"{prefix}.rank{rank}") as f:
      peaks.append(int(f.read()) / 1024)  # ru_maxrss is in KB on Linux
  return peaks


def main(argv):
  del argv
  sizes = [int(s) for s in FLAGS.sizes]
  data = {}
  for fmt in FLAGS.formats:
    for size in sizes:
      data[fmt, size] = write(fmt, size, os.path.join(
          FLAGS.out_dir, f"{fmt}-{size}"))
  names = {f"{fmt}-{size}": (fmt, size) for fmt, size in data}

  def measure(name: str, round_: int) -> list[float]:
    fmt, size = names[name]
    run_dir = os.path.join(FLAGS.out_dir, "runs", f"{name}-r{round_}")
    shutil.rmtree(run_dir, ignore_errors=True)
    path, data_flags = data[fmt, size]
    return run(data_flags, path, run_dir, epochs=max(sizes) // size)

  def line(name: str, round_: int, peaks: list[float]) -> str:
    fmt, size = names[name]
    return (f"{fmt:12} {size:6d} images, round {round_ + 1}: peak RSS "
            f"{peaks[0]:.0f} MB (rank 0), {peaks[1]:.0f} MB (rank 1)")

  found = interleaved.rounds(list(names), measure, FLAGS.repeats, show=line)
  runs = [{"format": fmt, "size": size, "repeat": repeat,
           "peak_rss_mb": peaks}
          for name, (fmt, size) in names.items()
          for repeat, peaks in enumerate(found[name])]
  print(f"\n| format | {' | '.join(f'{s} images' for s in sizes)} | growth "
        "| verdict |")
  print(f"|---|{'---|' * len(sizes)}---|---|")
  for fmt in FLAGS.formats:
    medians = [statistics.median(
        p for r in runs if (r["format"], r["size"]) == (fmt, size)
        for p in r["peak_rss_mb"]) for size in sizes]
    every = [", ".join(f"{p:.0f}" for r in runs
                       if (r["format"], r["size"]) == (fmt, size)
                       for p in r["peak_rss_mb"]) for size in sizes]
    growth = medians[-1] - medians[0]
    verdict = ("control: must grow" if fmt == "in_memory" else
               "PASS" if growth <= FLAGS.tolerance_mb else "FAIL")
    cells = " | ".join(f"{m:.0f} MB ({e})" for m, e in zip(medians, every))
    print(f"| {fmt} | {cells} | {growth:+.0f} MB | {verdict} |")
  if FLAGS.json:
    with open(FLAGS.json, "w") as f:
      json.dump(runs, f, indent=1)


if __name__ == "__main__":
  app.run(main)
