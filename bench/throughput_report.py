"""The throughput benchmark's report (bench/throughput.py measures): the
rows per runner, processes and data, the ratios against Keras' fit and the
plain loop, their rounds and intervals, the targets, and the chart."""
import math
import os
import statistics
from typing import Optional

from bench import interleaved
from bench import workload

RUNNERS = ("engine", "keras_fit", "plain_loop")
PROCESSES = (1, 2)
# Other load (in cores) above which a run's figures are not to be trusted.
DISTURBED_LOAD = 0.1
# The first issue's targets, and the floor of the time-to-accuracy issue:
# engine / keras_fit at least 1.0 in every configuration, on the pooled
# medians and in at least half the rounds (a pooled figure alone can be one
# round's drift).
TARGETS = {"engine_vs_keras_fit": 1.15, "overhead_at_1": 0.03,
           "real_vs_synthetic": 0.05, "floor_vs_keras_fit": 1.0}


def summarize(results: dict) -> dict:
  """Rows per (runner, processes, data), the ratios, and the targets."""
  rows = _rows(results)
  ratios = _ratios({(r["runner"], r["processes"], r["data"]):
                    r["images_per_sec"] for r in rows}, results["runs"])
  return {"rows": rows, "ratios": ratios, "targets": _targets(ratios)}


def _rows(results: dict) -> list[dict]:
  """Each configuration's epochs pooled over its rounds: the median, the
  spread, the FLOP/s against the matmul peak."""
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
  return rows


def _ratios(rate: dict, runs: list[dict]) -> dict:
  """The ratios of the pooled medians `rate` the engine is held to, and
  engine / keras_fit in each round of `runs`."""
  def measured(*keys):
    return all(key in rate for key in keys)

  return {
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
      "engine_vs_keras_fit_by_round": _by_round(runs),
  }


def _targets(ratios: dict) -> dict:
  """Whether each target is met."""
  return {
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
  """The report in Markdown: the setting, every row, the ratios, the
  rounds and the targets' verdicts."""
  _print_rows(results, summary["rows"])
  _print_ratios(summary["ratios"])
  _print_targets(summary["ratios"], summary["targets"])


def _print_rows(results: dict, rows: list[dict]) -> None:
  settings, machine = results["settings"], results["machine"]
  per_image = results["training_flops_per_image"]
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
  for r in rows:
    print(f"| {r['runner']} | {r['processes']} | {r['data']} | "
          f"{r['threads']} | {r['images_per_sec']:.0f} | "
          f"{r['min']:.0f}-{r['max']:.0f} | {r['epochs']} | "
          f"{r['flops_per_sec'] / 1e9:.1f} | {r['fraction_of_peak']:.0%} | "
          f"{r['other_load']:.2f} |")
  if any(r["fraction_of_peak"] > 1 for r in rows):
    print("\nA run above the matmul peak: the peak was measured while "
          "something else used the cores. Rerun on a quiet machine.")
  print("\nthreads: intra-op x inter-op per process. other load: cores "
        "kept busy by anything else during the run, on average.")
  if any(r["other_load"] > DISTURBED_LOAD for r in rows):
    print(f"Runs with other load above {DISTURBED_LOAD} cores were slowed "
          "by something else on the machine: rerun when it is quiet.")


def _print_ratios(ratios: dict) -> None:
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


def _print_targets(ratios: dict, targets: dict) -> None:
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
