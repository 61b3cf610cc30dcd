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
import math
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
from typing import Optional

from absl import app
from absl import flags

from bench import flops
from bench import interleaved
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

RUNNERS = ("engine", "keras_fit", "plain_loop")
PROCESSES = (1, 2)
# Matmuls of this size reach the same FLOP/s as 4096 here, in a tenth of
# the time; the best of the repeats is the peak.
MATMUL_SIZE, MATMUL_REPEATS = 2048, 10
# A run going slower than this is taken as hung (expected: about 2000
# images/s per core).
SLOWEST_IMAGES_PER_SEC = 200
START_UP_SECONDS = 120
# Other load (in cores) above which a run's figures are not to be trusted.
DISTURBED_LOAD = 0.1
# The first issue's targets, and the floor of the time-to-accuracy issue:
# engine / keras_fit at least 1.0 in every configuration, on the pooled
# medians and in at least half the rounds (a pooled figure alone can be one
# round's drift).
TARGETS = {"engine_vs_keras_fit": 1.15, "overhead_at_1": 0.03,
           "real_vs_synthetic": 0.05, "floor_vs_keras_fit": 1.0}


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


def summarize(results: dict) -> dict:
  """Rows per (runner, processes, data), the ratios, and the targets."""
  per_image = results["training_flops_per_image"]["profiled"]
  peak = results["matmul_peak_flops"]
  pooled = {}
  for run in results["runs"]:
    key = (run["runner"], run["processes"], run["data"])
    entry = pooled.setdefault(key, {"rates": [], "threads": run["threads"],
                                    "other_load": 0.0})
    entry["rates"] += interleaved.measured(run["records"])
    entry["other_load"] = max(entry["other_load"], run["other_load"])

  def order(item):
    (runner, processes, data), _ = item
    return (processes, RUNNERS.index(runner),
            list(workload.DATASETS).index(data))

  rows = []
  for (runner, processes, data), entry in sorted(pooled.items(), key=order):
    rates = entry["rates"]
    median = statistics.median(rates)
    rows.append({"runner": runner, "processes": processes, "data": data,
                 "threads": entry["threads"], "other_load": entry["other_load"],
                 "images_per_sec": median,
                 "min": min(rates), "max": max(rates), "epochs": len(rates),
                 "flops_per_sec": median * per_image,
                 "fraction_of_peak": median * per_image / peak})
  rate = {(r["runner"], r["processes"], r["data"]): r["images_per_sec"]
          for r in rows}

  def measured(*keys):
    return all(key in rate for key in keys)

  ratios = {
      "engine_vs_keras_fit": {
          f"np{n} {data}": rate["engine", n, data] / rate["keras_fit", n, data]
          for n in PROCESSES for data in workload.DATASETS
          if measured(("engine", n, data), ("keras_fit", n, data))},
      # Throughput the engine loses at 1 process against the plain loop.
      "overhead_at_1": {
          data: 1 - rate["engine", 1, data] / rate["plain_loop", 1, data]
          for data in workload.DATASETS
          if measured(("engine", 1, data), ("plain_loop", 1, data))},
      "real_vs_synthetic": {
          f"np{n}": rate["engine", n, "real"] / rate["engine", n, "synthetic"]
          for n in PROCESSES
          if measured(("engine", n, "real"), ("engine", n, "synthetic"))},
      "engine_vs_keras_fit_by_round": _by_round(results["runs"]),
  }
  targets = {
      "engine_vs_keras_fit": all(
          v >= TARGETS["engine_vs_keras_fit"]
          for v in ratios["engine_vs_keras_fit"].values()),
      "overhead_at_1": all(v <= TARGETS["overhead_at_1"]
                           for v in ratios["overhead_at_1"].values()),
      "real_vs_synthetic": all(
          abs(v - 1) <= TARGETS["real_vs_synthetic"]
          for v in ratios["real_vs_synthetic"].values()),
      "floor_vs_keras_fit": all(
          ratios["engine_vs_keras_fit"][key] >= TARGETS["floor_vs_keras_fit"]
          and 2 * _ahead(by_round) >= len(by_round)
          for key, by_round in ratios["engine_vs_keras_fit_by_round"].items()),
  }
  return {"rows": rows, "ratios": ratios, "targets": targets}


def _by_round(runs: list[dict]) -> dict[str, list[float]]:
  """engine / keras_fit in each round, of the two runs' medians."""
  median = {(r["runner"], r["processes"], r["data"], r["repeat"]):
            statistics.median(interleaved.measured(r["records"]))
            for r in runs}
  pairs = {}
  for (runner, n, data, repeat), engine in sorted(median.items()):
    keras = median.get(("keras_fit", n, data, repeat))
    if runner == "engine" and keras:
      pairs.setdefault(f"np{n} {data}", []).append(engine / keras)
  return pairs


# Student's t, 97.5th percentile, for 1-30 degrees of freedom: the two-sided
# 95% interval of a mean of that many + 1 rounds.
_T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262,
          2.228, 2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101,
          2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052,
          2.048, 2.045, 2.042)


def _interval(by_round: list[float]) -> Optional[tuple[float, float, float]]:
  """The geometric mean of the rounds' ratios and its 95% interval (t, on
  the logarithms), or None under 2 rounds: how well the rounds resolve the
  ratio from the machine's drift. An interval above 1.0 shows the engine
  ahead, one that holds 1.0 does not tell the two apart."""
  if len(by_round) < 2:
    return None
  logs = [math.log(ratio) for ratio in by_round]
  mean = statistics.mean(logs)
  t = _T_975[min(len(logs), len(_T_975) + 1) - 2]
  half = t * statistics.stdev(logs) / math.sqrt(len(logs))
  return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def _ahead(by_round: list[float]) -> int:
  """Rounds in which the engine was at or above the floor."""
  return sum(ratio >= TARGETS["floor_vs_keras_fit"] for ratio in by_round)


def print_report(results: dict, summary: dict) -> None:
  settings, machine = results["settings"], results["machine"]
  per_image = results["training_flops_per_image"]
  ratios = summary["ratios"]
  print(f"\n## Throughput: {machine['cpu']}, {machine['cores']} cores\n")
  print(f"Batch {settings['batch_size']} per process, "
        f"{settings['steps_per_epoch']} steps per epoch, epochs 2-"
        f"{settings['epochs']} measured, {settings['repeats']} repeat(s); "
        f"augmentation off.")
  print(f"Training FLOPs per image (forward, backward, Adam): "
        f"{per_image['profiled'] / 1e6:.2f} M counted by TensorFlow's "
        f"profiler on the step's graph; {per_image['analytic'] / 1e6:.2f} M "
        f"counted analytically (convolutions and dense layers only, "
        f"{per_image['analytic'] / per_image['profiled'] - 1:+.1%}).")
  print(f"float32 matmul peak: {results['matmul_peak_flops'] / 1e9:.1f} "
        f"GFLOP/s ({results['matmul']['size']}-square, every core, best of "
        f"{results['matmul']['repeats']}, before and after the runs).\n")
  print("| runner | processes | data | threads | images/s | min-max | "
        "epochs | GFLOP/s | of peak | other load |")
  print("|---|---|---|---|---|---|---|---|---|---|")
  for r in summary["rows"]:
    print(f"| {r['runner']} | {r['processes']} | {r['data']} | "
          f"{r['threads']} | {r['images_per_sec']:.0f} | "
          f"{r['min']:.0f}-{r['max']:.0f} | {r['epochs']} | "
          f"{r['flops_per_sec'] / 1e9:.1f} | {r['fraction_of_peak']:.0%} | "
          f"{r['other_load']:.2f} |")
  if any(r["fraction_of_peak"] > 1 for r in summary["rows"]):
    print("\nA run above the matmul peak: the peak was measured while "
          "something else used the cores. Rerun on a quiet machine.")
  print("\nthreads: intra-op x inter-op per process. other load: cores "
        "kept busy by anything else during the run, on average.")
  if any(r["other_load"] > DISTURBED_LOAD for r in summary["rows"]):
    print(f"Runs with other load above {DISTURBED_LOAD} cores were slowed "
          "by something else on the machine: rerun when it is quiet.")
  print("\nRatios of medians (n/a: a runner not run):\n")
  print(f"| ratio | {' | '.join(workload.DATASETS)} |\n|---|---|---|")
  for n in PROCESSES:
    cells = [_figure(ratios["engine_vs_keras_fit"].get(f"np{n} {data}"))
             for data in workload.DATASETS]
    print(f"| engine / keras_fit, {_processes(n)} | {' | '.join(cells)} |")
  cells = [_figure(1 - ratios["overhead_at_1"][data]) +
           f" (overhead {ratios['overhead_at_1'][data]:.1%})"
           if data in ratios["overhead_at_1"] else "n/a"
           for data in workload.DATASETS]
  print(f"| engine@1 / plain_loop | {' | '.join(cells)} |")
  print("\nengine real / synthetic: " + (", ".join(
      f"{_processes(int(key[2:]))} {value:.3f}"
      for key, value in ratios["real_vs_synthetic"].items()) or "n/a"))
  print("\nengine / keras_fit by round (each run's median):\n")
  for key, by_round in ratios["engine_vs_keras_fit_by_round"].items():
    interval = _interval(by_round)
    resolved = ("" if interval is None else
                "; geometric mean {:.3f}, 95% interval {:.3f}-{:.3f}".format(
                    *interval))
    print(f"- {key}: {', '.join(f'{r:.3f}' for r in by_round)}; engine at "
          f"or ahead in {_ahead(by_round)} of {len(by_round)} "
          f"rounds{resolved}")
  print()
  targets = summary["targets"]
  lines = {
      "engine_vs_keras_fit": (
          f"engine >= {TARGETS['engine_vs_keras_fit']}x keras_fit",
          ", ".join(f"{k}: {v:.2f}x"
                    for k, v in ratios["engine_vs_keras_fit"].items())),
      "overhead_at_1": (
          f"Horovod overhead at 1 process <= {TARGETS['overhead_at_1']:.0%}",
          ", ".join(f"{k}: {v:.1%}"
                    for k, v in ratios["overhead_at_1"].items())),
      "real_vs_synthetic": (
          f"real within {TARGETS['real_vs_synthetic']:.0%} of synthetic",
          ", ".join(f"{k}: {v - 1:+.1%}"
                    for k, v in ratios["real_vs_synthetic"].items())),
      "floor_vs_keras_fit": (
          f"engine >= {TARGETS['floor_vs_keras_fit']}x keras_fit pooled and "
          "in at least half the rounds",
          ", ".join(f"{k}: {ratios['engine_vs_keras_fit'][k]:.2f}x, "
                    f"{_ahead(v)} of {len(v)} rounds" for k, v in
                    ratios["engine_vs_keras_fit_by_round"].items())),
  }
  for key, (target, detail) in lines.items():
    # A detail lists what was measured: empty, nothing was.
    verdict = ("n/a " if not detail else
               "PASS" if targets[key] else "FAIL")
    print(f"{verdict}  {target}  ({detail})")


def draw_chart(results: dict, summary: dict, path: str) -> None:
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  groups = [(r, n) for n in PROCESSES for r in RUNNERS
            if any(row["runner"] == r and row["processes"] == n
                   for row in summary["rows"])]
  figure, axes = plt.subplots(figsize=(9, 4.8))
  width = 0.38
  for i, data in enumerate(workload.DATASETS):
    rows = [row for r, n in groups for row in summary["rows"]
            if row["runner"] == r and row["processes"] == n
            and row["data"] == data]
    if len(rows) < len(groups):  # --only: not every runner saw this data
      continue
    medians = [row["images_per_sec"] for row in rows]
    spread = [[m - row["min"] for m, row in zip(medians, rows)],
              [row["max"] - m for m, row in zip(medians, rows)]]
    x = [g + (i - 0.5) * width for g in range(len(groups))]
    bars = axes.bar(x, medians, width, yerr=spread, capsize=3, label=data)
    axes.bar_label(bars, fmt="%.0f", padding=2, fontsize=8)
  axes.set_xticks(range(len(groups)),
                  [f"{r}\n{_processes(n)}" for r, n in groups])
  axes.set_ylabel("images/s (median of epochs 2+, bars: min-max)")
  settings, machine = results["settings"], results["machine"]
  axes.set_title(f"Training throughput, batch {settings['batch_size']} per "
                 f"process: {machine['cpu']}, {machine['cores']} cores")
  axes.legend(title="data")
  figure.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  figure.savefig(path, dpi=120)
  plt.close(figure)


def _figure(value) -> str:
  return "n/a" if value is None else f"{value:.3f}"


def _processes(n: int) -> str:
  return f"{n} process{'es' if n > 1 else ''}"


if __name__ == "__main__":
  app.run(main)
