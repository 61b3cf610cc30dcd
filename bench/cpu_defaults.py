r"""The engine's CPU defaults, each measured against its alternatives.

Four parts, each the measurement behind one setting the engine makes when
it trains on CPU; `--only` picks some. Every measurement is a fresh process
(the settings are fixed when TensorFlow or Horovod starts), and each part
runs its variants in --rounds interleaved rounds (bench/interleaved.py), so
a slow spell of the machine lands on every variant alike. Every figure is
printed as it comes, then a table per part.

  threads    core binding and thread pools (engine/distributed/world.py:
             bind_to_own_cores, cpu_threads): whole 2-process runs of the
             engine's defaults (the cnn on real Fashion-MNIST) bound to
             their own cores or not, with the intra-op threads of their
             share of the cores or twice that, and 1 or 2 inter-op threads
  cycle      Horovod's 3 ms cycle on CPU (engine/distributed/world.py): 2 processes
             that only run hvd.init() and sleep, the CPU time and context
             switches each spends a second; then whole 2-process runs of
             the throughput workload (bench/workload.py, synthetic data),
             at each of --cycle_ms
  kernels    oneDNN's kernels against Eigen's (TF_ENABLE_ONEDNN_OPTS,
             engine/__init__.py): the engine's TrainStep of ResNet-9 at
             widths 8 and 16 with the fast recipe's SGD, batch 256
  precision  the step's precision and XLA options (flags/performance.py's
             defaults, the warnings of a CPU run asking for float16 or XLA):
             the engine's TrainStep of the CPU preset's cnn (or WRN-16-2)
             in float32, bfloat16, float16 and float32 with XLA. float16 is
             timed over 2 steps: without float16 arithmetic it is tens of
             times slower

The step parts time one process on all cores, with random images, after 2
warm-up steps. Whole runs give images/s of their epochs after the first.

  .venv/bin/python -m bench.cpu_defaults      # everything: about 40 minutes
  .venv/bin/python -m bench.cpu_defaults --only=kernels,precision
  .venv/bin/python -m bench.cpu_defaults --only=precision \
      --precision_models=cnn,wrn
"""
import dataclasses
import json
import os
import re
import resource
import shutil
import statistics
import time

from absl import app
from absl import flags

from bench import interleaved

FLAGS = flags.FLAGS
flags.DEFINE_list("only", ["threads", "cycle", "kernels", "precision"],
                  "Parts to run.")
flags.DEFINE_integer("rounds", 3, "Rounds over each part's variants.",
                     lower_bound=1)
flags.DEFINE_integer("epochs", 3, "Epochs of a whole run (threads, cycle); "
                     "the first is left out.", lower_bound=2)
flags.DEFINE_integer("steps_per_epoch", 100, "Steps per epoch of a whole "
                     "run.", lower_bound=1)
flags.DEFINE_list("cycle_ms", ["1", "2", "3", "5"], "Horovod cycle times "
                  "to compare, in ms; the first is the reference (1: "
                  "Horovod's default).")
flags.DEFINE_enum("controller", "gloo", ["gloo", "mpi"], "horovodrun's "
                  "controller for the cycle and threads parts' processes "
                  "(under MPI, yielding while it waits, as the engine "
                  "sets it on CPU).")
flags.DEFINE_integer("idle_seconds", 10, "How long the idle processes of "
                     "the cycle part sleep.", lower_bound=1)
flags.DEFINE_integer("steps", 10, "Timed steps of a step measurement "
                     "(kernels, precision).", lower_bound=1)
flags.DEFINE_list("kernels_models", ["resnet9_8", "resnet9_16"],
                  "Models the kernels part times: cnn, wrn, resnet9_8, "
                  "resnet9_16.")
flags.DEFINE_list("precision_models", ["cnn"], "Models the precision part "
                  "times, as --kernels_models.")
flags.DEFINE_string("out_dir", os.path.join(interleaved.REPO, "bench", "out",
                                            "cpu_defaults"),
                    "Whole runs' model directories.")
flags.DEFINE_enum("worker", None, ["idle", "step"], "Internal: be one "
                  "measured process of the cycle part (idle) or of a step "
                  "part (step, with --worker_model and --worker_option).")
flags.DEFINE_string("worker_model", "cnn", "Internal: a step's model.")
flags.DEFINE_string("worker_option", "float32", "Internal: a step's option.")

PROCESSES = 2  # of whole runs and of the idle measurement


@dataclasses.dataclass(frozen=True)
class StepModel:
  """A model whose train step a step part times, as the engine trains it."""
  model: str  # in the models/ registry
  params: dict
  batch_size: int
  optimizer: dict  # engine.compute.optimizers.build's arguments


ADAM = dict(name="adam", learning_rate=1e-3, momentum=0.0, nesterov=False)
STEP_MODELS = {
    "cnn": StepModel("cnn", dict(filters=32), 128, ADAM),  # the CPU preset
    "wrn": StepModel("wrn", dict(depth=16, width=2), 32, ADAM),
    # flags/fashion_mnist_fast.cfg's model and optimizer
    **{f"resnet9_{width}": StepModel(
        "resnet9", dict(filters=width, weight_decay=5e-4), 256,
        dict(name="sgd", learning_rate=0.1, momentum=0.9, nesterov=True))
       for width in (8, 16)},
}
IMAGE_SHAPE, NUM_CLASSES = (28, 28, 1), 10
KERNELS = {"eigen": "0", "onednn": "1"}  # variant: TF_ENABLE_ONEDNN_OPTS
OPTIONS = {  # variant: (--mixed_precision, --xla)
    "float32": ("none", False),
    "bfloat16": ("bfloat16", False),
    "float16": ("float16", False),
    "float32+xla": ("none", True),
}
WARM_UP_STEPS, FLOAT16_STEPS = 2, 2


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if FLAGS.worker == "idle":
    _idle_worker()
    return
  if FLAGS.worker == "step":
    _step_worker()
    return
  unknown = set(FLAGS.only) - set(PARTS)
  unknown |= set(FLAGS.kernels_models + FLAGS.precision_models) - set(
      STEP_MODELS)
  if unknown:
    raise app.UsageError(f"unknown parts or models: {sorted(unknown)}")
  print(f"{_cores()} cores; {FLAGS.rounds} rounds, in alternating order",
        flush=True)
  for name, part in PARTS.items():
    if name in FLAGS.only:
      print(f"\n## {name}", flush=True)
      part()


# The parts.


def threads() -> None:
  """Binding and thread pools: the engine's default and its alternatives."""
  share = max(1, _cores() // PROCESSES)
  settings = {
      f"{'bound' if bind else 'unbound'} {intra}x{inter}": [
          f"--{'' if bind else 'no'}bind_cpus", f"--intra_op_threads={intra}",
          f"--inter_op_threads={inter}"]
      for bind, intra, inter in ((True, share, 1), (True, 2 * share, 1),
                                 (True, share, 2), (False, share, 1),
                                 (False, 2 * share, 1))}
  figures = interleaved.pooled(interleaved.rounds(
      list(settings),
      lambda variant, round_: _whole_run("threads", variant, round_,
                                         settings[variant]),
      FLAGS.rounds))
  _table(f"{PROCESSES} processes, the engine's defaults, images/s of epochs "
         f"2-{FLAGS.epochs} (intra-op x inter-op threads per process)",
         figures, reference=list(settings)[0])


def cycle() -> None:
  """Horovod's cycle time: what it costs idle, and whole runs at each."""
  # workload imports TensorFlow, which logs at import unless told not to.
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  from bench import workload  # pylint: disable=import-outside-toplevel
  print(f"idle, {PROCESSES} processes for {FLAGS.idle_seconds} s: CPU and "
        "voluntary context switches per process per second", flush=True)
  for ms in FLAGS.cycle_ms:
    output = interleaved.launch(
        [*_horovodrun(), interleaved.PYTHON,
         "-m", "bench.cpu_defaults", "--worker=idle",
         f"--idle_seconds={FLAGS.idle_seconds}"], HOROVOD_CYCLE_TIME=ms,
        **_controller_env())
    # horovodrun prefixes each line of rank r with "[r]<stdout>:" (Gloo)
    # or "[1,r]<stdout>:" (MPI, which may run two ranks' lines together).
    reports = sorted((json.loads(report) for report in
                      re.findall(r"<stdout>:(\{[^}]*\})", output)),
                     key=lambda report: report["rank"])
    print(f"  {ms} ms: " + "; ".join(
        f"rank {r['rank']} {r['cpu_per_second']:.1%} of a core, "
        f"{r['switches_per_second']:.0f} switches/s" for r in reports),
          flush=True)
  variants = {f"{ms} ms": ms for ms in FLAGS.cycle_ms}
  engine_flags = [*workload.engine_flags("synthetic"), "--batch_size=128"]
  figures = interleaved.pooled(interleaved.rounds(
      list(variants),
      lambda variant, round_: _whole_run(
          "cycle", variant, round_, engine_flags,
          HOROVOD_CYCLE_TIME=variants[variant]),
      FLAGS.rounds))
  _table(f"{PROCESSES} processes, the throughput workload on synthetic "
         f"data, images/s of epochs 2-{FLAGS.epochs}, by HOROVOD_CYCLE_TIME",
         figures, reference=list(variants)[0])


def kernels() -> None:
  """oneDNN's kernels against Eigen's, for each of --kernels_models."""
  for model in FLAGS.kernels_models:
    figures = interleaved.pooled(interleaved.rounds(
        list(KERNELS),
        lambda variant, round_, model=model: [_step_run(
            model, "float32", TF_ENABLE_ONEDNN_OPTS=KERNELS[variant])],
        FLAGS.rounds))
    _table(_step_title(model, "TF_ENABLE_ONEDNN_OPTS=0 (eigen) or 1 "
                       "(onednn)"), figures, reference="eigen",
           batch_size=STEP_MODELS[model].batch_size)


def precision() -> None:
  """The precision and XLA options, for each of --precision_models."""
  for model in FLAGS.precision_models:
    figures = interleaved.pooled(interleaved.rounds(
        list(OPTIONS),
        lambda variant, round_, model=model: [_step_run(model, variant)],
        FLAGS.rounds))
    _table(_step_title(model, "the kernels the engine chooses"), figures,
           reference="float32", batch_size=STEP_MODELS[model].batch_size)


PARTS = {"threads": threads, "cycle": cycle, "kernels": kernels,
         "precision": precision}


# The measurements.


def _whole_run(part: str, variant: str, round_: int, engine_flags: list[str],
               **env: str) -> list[float]:
  """A run of engine.train on PROCESSES processes; its images/s after the
  first epoch."""
  model_dir = os.path.join(FLAGS.out_dir, part,
                           f"{variant.replace(' ', '_')}-r{round_ + 1}")
  shutil.rmtree(model_dir, ignore_errors=True)
  interleaved.launch(
      [*_horovodrun(), interleaved.PYTHON,
       "-m", "engine.train", f"--model_dir={model_dir}", "--progress=none",
       *engine_flags, f"--epochs={FLAGS.epochs}",
       f"--steps_per_epoch={FLAGS.steps_per_epoch}"],
      **_controller_env(), **env)
  return interleaved.images_per_sec(model_dir)


def _horovodrun() -> list[str]:
  return [interleaved.HOROVODRUN, f"--{FLAGS.controller}", "-np",
          str(PROCESSES)]


def _controller_env() -> dict:
  """Under MPI, yielding as the engine sets it (the idle processes do not
  run the engine's set-up)."""
  if FLAGS.controller == "gloo":
    return {}
  return dict(OMPI_MCA_mpi_yield_when_idle="1")


def _step_run(model: str, option: str, **env: str) -> float:
  """One process timing one train step (`_step_worker`); its images/s."""
  output = interleaved.launch(
      [interleaved.PYTHON, "-m", "bench.cpu_defaults", "--worker=step",
       f"--worker_model={model}", f"--worker_option={option}",
       f"--steps={FLAGS.steps}"], **env)
  return float(output.split()[-1])


def _idle_worker() -> None:
  """hvd.init(), then nothing: what Horovod's background thread alone
  costs. Prints this rank's CPU and context switches per second."""
  import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel
  hvd.init()
  before, start = resource.getrusage(resource.RUSAGE_SELF), time.time()
  time.sleep(FLAGS.idle_seconds)
  after = resource.getrusage(resource.RUSAGE_SELF)
  seconds = time.time() - start
  cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
  print(json.dumps({
      "rank": hvd.rank(), "cpu_per_second": cpu / seconds,
      "switches_per_second": (after.ru_nvcsw - before.ru_nvcsw) / seconds}),
        flush=True)


def _step_worker() -> None:
  """Times the engine's TrainStep of --worker_model under --worker_option
  in this process, on all cores; prints its images/s."""
  # Imported here: the parent process has no use for TensorFlow, and the
  # kernels are chosen by this process's environment when it starts.
  # pylint: disable=import-outside-toplevel
  import keras
  import numpy as np
  import tensorflow as tf

  from engine import distributed
  from engine.compute import optimizers
  from engine.compute import precision as precisions
  from engine.compute import step as steps
  from models import batch_norm
  import models
  # pylint: enable=import-outside-toplevel

  spec = STEP_MODELS[FLAGS.worker_model]
  mode, xla = OPTIONS[FLAGS.worker_option]
  distributed.init()  # one process: the engine's threads for all cores
  keras.utils.set_random_seed(0)
  with precisions.policy(mode):  # the model's layers compute in `mode`
    model = models.build(spec.model, input_shape=IMAGE_SHAPE,
                         num_classes=NUM_CLASSES, **spec.params)
    batch_norm.fuse(model)  # as the engine trains it
  optimizer = precisions.with_loss_scaling(
      optimizers.build(**spec.optimizer), mode)
  step = steps.TrainStep(model=model, optimizer=optimizer, xla=xla)
  rng = np.random.default_rng(0)
  images = tf.constant(rng.normal(size=(spec.batch_size, *IMAGE_SHAPE)),
                       tf.float32)
  labels = tf.constant(rng.integers(0, NUM_CLASSES, spec.batch_size),
                       tf.int64)
  step.start(tf.data.Dataset.from_tensors((images, labels)).repeat())
  for _ in range(WARM_UP_STEPS):  # tracing, compilation, first allocations
    step.train(1)
  count = (min(FLOAT16_STEPS, FLAGS.steps) if mode == "float16"
           else FLAGS.steps)
  start = time.perf_counter()
  for _ in range(count):
    step.train(1)
  print(count * spec.batch_size / (time.perf_counter() - start))


# Reporting.


def _table(title: str, figures: dict[str, list[float]], *, reference: str,
           batch_size: int = 0) -> None:
  """A part's images/s as a table for RESULTS.md: each variant's median
  (and, for a step, its ms per step), every figure in round order, and the
  median over `reference`'s."""
  medians = {variant: statistics.median(found)
             for variant, found in figures.items()}
  print(f"\n{title}\n\n| variant | images/s, median | every figure | "
        f"/ {reference} |\n|---|---|---|---|")
  for variant, found in figures.items():
    step = (f" ({batch_size / medians[variant] * 1000:.1f} ms/step)"
            if batch_size else "")
    print(f"| {variant} | {medians[variant]:.0f}{step} | "
          f"{', '.join(f'{figure:.0f}' for figure in found)} | "
          f"{medians[variant] / medians[reference]:.3f} |", flush=True)


def _step_title(model: str, kernels: str) -> str:
  spec = STEP_MODELS[model]
  return (f"{model} ({spec.model} {spec.params}), batch {spec.batch_size}, "
          f"{spec.optimizer['name']}; 1 process on {_cores()} cores, "
          f"{kernels}; {FLAGS.steps} timed steps a run")


def _cores() -> int:
  return len(os.sched_getaffinity(0))


if __name__ == "__main__":
  app.run(main)
