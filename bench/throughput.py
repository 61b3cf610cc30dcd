r"""Training throughput of the engine against Keras `fit` and a plain loop.

One invocation measures, on this machine, one model, data and batch size:

  engine      horovodrun --gloo -np N .venv/bin/python -m engine.train ...  N = 1, 2
  keras_fit   horovodrun --gloo -np N .venv/bin/python -m bench.keras_fit   N = 1, 2
  plain_loop  .venv/bin/python -m bench.plain_loop                   1 process

each on real Fashion-MNIST and on synthetic images of its shape, one run at
a time (on 2 cores, two runs at once would measure each other). A run's
figure is the median images/s of its epochs after the first. It prints a
table, the ratios the engine is held to with PASS/FAIL, and the FLOP/s each
run achieves against the machine's measured matmul peak; it writes the raw
figures as JSON and a bar chart as PNG into --out_dir.

  bash bench/throughput.sh              # the full benchmark (README.md)
  bash bench/throughput.sh --quick      # 2 short epochs per run: does it work?
  bash bench/throughput.sh --report=bench/out/throughput.json   # re-report
  bash bench/throughput.sh --only=np2-synthetic --repeats=10  # one pairing

Each round runs every configuration once; the report gives engine /
keras_fit for each round as well as for the pooled medians, so a
difference is told from the machine's drift by how many rounds agree.
"""
import dataclasses
import json
import os
import platform
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import time

from absl import app
from absl import flags

from bench import flops
from bench import interleaved
from bench.throughput_report import PROCESSES, RUNNERS
from bench.throughput_report import draw_chart, print_report, summarize
from bench import workload
from engine import distributed
from engine.core import run_files

FLAGS = flags.FLAGS
flags.DEFINE_integer("epochs", 4, "Epochs per run; the first is warm-up and "
                     "not measured.", lower_bound=2)
flags.DEFINE_integer("steps_per_epoch", 100, "Steps per epoch, every run.",
                     lower_bound=1)
flags.DEFINE_integer("batch_size", 128, "Examples per process per step.",
                     lower_bound=1)
flags.DEFINE_integer("repeats", 1, "Runs of each configuration; their "
                     "measured epochs are pooled.", lower_bound=1)
flags.DEFINE_string("out_dir", "bench/out", "Each run's directory (logs, "
                    "model_dir, epoch records), emptied before it runs.")
flags.DEFINE_string("json", "", "Raw figures. Empty: "
                    "OUT_DIR/throughput.json.")
flags.DEFINE_string("chart", "", "Bar chart. Empty: OUT_DIR/throughput.png.")
flags.DEFINE_bool("quick", False, "A check that everything runs: 2 epochs "
                  "of 20 steps, 1 repeat (overrides those flags).")
flags.DEFINE_string("report", "", "Measure nothing: print the report and "
                    "draw the chart from this JSON of an earlier run.")
flags.DEFINE_list("only", [], "Configurations to run, as npN-DATA (np2-"
                  "synthetic, np1-real, ...); empty: all. Ratios need both "
                  "runners of a configuration.")

# Matmuls of this size reach the same FLOP/s as 4096 here, in a tenth of
# the time; the best of the repeats is the peak.
MATMUL_SIZE, MATMUL_REPEATS = 2048, 10
# A run going slower than this is taken as hung (expected: about 2000
# images/s per core).
SLOWEST_IMAGES_PER_SEC = 200
START_UP_SECONDS = 120


@dataclasses.dataclass(frozen=True)
class Run:
  runner: str
  processes: int
  data: str  # a key of workload.DATASETS
  repeat: int

  @property
  def name(self) -> str:
    return f"{self.runner}-np{self.processes}-{self.data}-r{self.repeat + 1}"


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if FLAGS.report:
    with open(FLAGS.report) as f:
      results = json.load(f)
  else:
    results = measure(_settings())
  summary = summarize(results)
  print_report(results, summary)
  chart_path, json_path = _output_paths()
  draw_chart(results, summary, chart_path)
  if not FLAGS.report:
    with open(json_path, "w") as f:
      json.dump({**results, "summary": summary}, f, indent=1)
    print(f"\nraw figures: {json_path}\nchart: {chart_path}\n"
          f"run logs: {results['settings']['out_dir']}")
  else:
    print(f"\nchart: {chart_path}")


def _settings() -> dict:
  quick = FLAGS.quick
  return {
      "epochs": 2 if quick else FLAGS.epochs,
      "steps_per_epoch": 20 if quick else FLAGS.steps_per_epoch,
      "repeats": 1 if quick else FLAGS.repeats,
      "batch_size": FLAGS.batch_size,
      "quick": quick,
      "only": FLAGS.only,
      "out_dir": os.path.abspath(FLAGS.out_dir),
      "command": " ".join(sys.argv),
  }


def _output_paths() -> tuple[str, str]:
  """(chart, json): the flags, else in out_dir, with the runs: what a run
  wrote is not kept in git; RESULTS.md records its figures."""
  return (FLAGS.chart or os.path.join(FLAGS.out_dir, "throughput.png"),
          FLAGS.json or os.path.join(FLAGS.out_dir, "throughput.json"))


# Measuring.


def measure(settings: dict) -> dict:
  started = time.perf_counter()
  machine = _machine()
  print(f"{machine['cpu']}, {machine['cores']} cores", flush=True)
  info = workload.load("synthetic").info
  per_image = flops.training_flops_per_image(info, settings["batch_size"])
  print(f"training: {per_image['profiled'] / 1e6:.2f} MFLOP per image",
        flush=True)
  plan = [run for repeat in range(settings["repeats"])
          for run in _round(repeat, settings["only"])]
  # The peak is taken before and after the runs, in this process (every
  # core, then idle), and the higher kept: a measurement that something
  # else on the machine slowed shows as the lower one.
  peaks = [flops.matmul_peak(MATMUL_SIZE, MATMUL_REPEATS)]
  runs = []
  for i, run in enumerate(plan, 1):
    print(f"[{i}/{len(plan)}] {run.name}: ", end="", flush=True)
    result = _launch(run, settings)
    rates = interleaved.measured(result["records"])
    print(f"{statistics.median(rates):.0f} images/s (epochs 2-"
          f"{settings['epochs']}: {' '.join(f'{r:.0f}' for r in rates)}), "
          f"{result['wall_seconds']:.0f} s, other load "
          f"{result['other_load']:.2f} cores", flush=True)
    runs.append(result)
  peaks.append(flops.matmul_peak(MATMUL_SIZE, MATMUL_REPEATS))
  print(f"float32 matmul peak: {', '.join(f'{p / 1e9:.1f}' for p in peaks)} "
        "GFLOP/s (before, after the runs)", flush=True)
  return {"settings": settings, "machine": machine,
          "matmul_peak_flops": max(peaks),
          "matmul": {"size": MATMUL_SIZE, "repeats": MATMUL_REPEATS,
                     "before_and_after": peaks},
          "training_flops_per_image": per_image, "runs": runs,
          "total_seconds": time.perf_counter() - started}


def _round(repeat: int, only: list[str]) -> list[Run]:
  """Round `repeat`'s runs, in an order that alternates from round to round.

  In a fixed order each runner always followed the same one (the engine at
  2 processes the plain loop, Keras `fit` the engine), so whatever a run
  leaves behind or whatever drifts through a round would land on the same
  runner every time. Reversing every other round (ABBA) gives each runner
  each place equally often over an even number of rounds.
  """
  runs = [Run(runner, processes, data, repeat)
          for data in workload.DATASETS
          for processes in PROCESSES
          for runner in RUNNERS
          if not (runner == "plain_loop" and processes > 1)
          and (not only or f"np{processes}-{data}" in only)]
  return runs[::-1] if repeat % 2 else runs


def _machine() -> dict:
  return {"cpu": interleaved.cpu(), "cores": distributed.available_cores(),
          "python": platform.python_version()}


def _launch(run: Run, settings: dict) -> dict:
  """Runs one configuration in a fresh directory; its records and command."""
  run_dir = os.path.join(settings["out_dir"], run.name)
  shutil.rmtree(run_dir, ignore_errors=True)
  os.makedirs(run_dir)
  command, model_dir = _command(run, settings, run_dir)
  log_path = os.path.join(run_dir, "log.txt")
  images = (settings["epochs"] * settings["steps_per_epoch"] *
            settings["batch_size"] * run.processes)
  start, busy, ours = time.perf_counter(), _busy_cpu(), _children_cpu()
  with open(log_path, "w") as log:
    returncode = _run(command, log, timeout=START_UP_SECONDS +
                      images / SLOWEST_IMAGES_PER_SEC)
  wall = time.perf_counter() - start
  # Cores kept busy by anything but this run, on average over it.
  other_load = max(0.0, (_busy_cpu() - busy) - (_children_cpu() - ours)) / wall
  records, _, _ = run_files.epochs_and_events(model_dir)
  if returncode != 0 or len(records) != settings["epochs"]:
    with open(log_path) as f:
      tail = f.read()[-3000:]
    sys.exit(f"{tail}\nthroughput: {run.name} failed (exit {returncode}, "
             f"{len(records)} of {settings['epochs']} epochs recorded); "
             f"its log: {log_path}")
  return {**dataclasses.asdict(run), "command": command, "records": records,
          "threads": _threads(run, records, log_path), "wall_seconds": wall,
          "other_load": other_load}


def _busy_cpu() -> float:
  """CPU seconds the whole machine has spent busy (steal included: time
  the hypervisor gave to someone else is time this run did not have)."""
  with open("/proc/stat") as f:
    user, nice, system, _, _, irq, softirq, steal = map(
        int, f.readline().split()[1:9])
  ticks = user + nice + system + irq + softirq + steal
  return ticks / os.sysconf("SC_CLK_TCK")


def _children_cpu() -> float:
  """CPU seconds of this process's finished children and theirs (a
  launcher reaps its workers, so theirs count too)."""
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


def _command(run: Run, settings: dict,
             run_dir: str) -> tuple[list[str], str]:
  """The run's command line and the directory whose metrics.jsonl its
  epoch records land in (every runner's in the engine's shape)."""
  dataset = workload.DATASETS[run.data]
  sizes = [f"--batch_size={settings['batch_size']}",
           f"--epochs={settings['epochs']}",
           f"--steps_per_epoch={settings['steps_per_epoch']}"]
  model_dir = os.path.join(run_dir, "model")
  if run.runner == "engine":
    args = ["-m", "engine.train", f"--model_dir={model_dir}",
            *workload.engine_flags(dataset), *sizes]
  else:
    os.makedirs(model_dir)
    args = ["-m", f"bench.{run.runner}", f"--dataset={dataset}", *sizes,
            f"--records={os.path.join(model_dir, run_files.METRICS_FILE)}"]
  if run.runner == "plain_loop":
    # What the engine's set-up gives one process (see plain_loop.py).
    intra, inter = distributed.cpu_threads(distributed.available_cores(), 1)
    return [interleaved.PYTHON, *args, f"--intra_op_threads={intra}",
            f"--inter_op_threads={inter}"], model_dir
  return ([interleaved.HOROVODRUN, "--gloo", "-np", str(run.processes),
           interleaved.PYTHON, *args],
          model_dir)


def _run(command: list[str], log, timeout: float) -> int:
  """Runs `command` in its own process group, which is ended whole if it
  hangs or we are interrupted: horovodrun's workers are its grandchildren.

  os.environ carries engine/__init__.py's settings (imported with
  engine.distributed), so every runner gets the engine's oneDNN kernels.
  """
  process = subprocess.Popen(command, cwd=interleaved.REPO,
                             env=interleaved.engine_env(), stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
  try:
    return process.wait(timeout=timeout)
  except subprocess.TimeoutExpired:
    log.write(f"\nthroughput: no end after {timeout:.0f} s; stopped\n")
    return _stop(process)
  except KeyboardInterrupt:
    _stop(process)
    raise


def _stop(process: subprocess.Popen) -> int:
  os.killpg(process.pid, signal.SIGTERM)
  try:
    return process.wait(timeout=30)
  except subprocess.TimeoutExpired:
    os.killpg(process.pid, signal.SIGKILL)
    return process.wait()


def _threads(run: Run, records: list[dict], log_path: str) -> str:
  """'intra x inter' per process, as the run reported it."""
  if run.runner != "engine":
    return f"{records[0]['intra_op_threads']}x{records[0]['inter_op_threads']}"
  with open(log_path) as f:
    found = re.search(r"(\d+) intra-op and (\d+) inter-op threads", f.read())
  return f"{found.group(1)}x{found.group(2)}" if found else "?"


# Reporting.


if __name__ == "__main__":
  app.run(main)
