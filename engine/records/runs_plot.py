"""engine.runs' --plot: the runs' validation figure against their training
time, as a PNG: how fast each run gets how far, which the table's figures
only sum up. `runs` are engine.runs' Runs by label; each one's `records`
are its epochs' metrics.jsonl records.
"""
from engine.core import run_files
from engine.core.errors import WriteFailed


def plot(runs: dict, path: str) -> None:
  """Draws each run's validation accuracy (or the figure its task decides
  by) against its training time (cumulative_seconds) into the PNG file
  `path`: how fast each run gets how far, which the table's figures only
  sum up."""
  # Here, not at the top: matplotlib takes longer to import than the rest
  # of the table takes to make.
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure

  figure = Figure(figsize=(9, 5.5), dpi=100)
  FigureCanvasAgg(figure)
  axes = figure.add_subplot()
  drawn = False
  metrics = {run_files.decided_by(run.records)[0] for run in runs.values()}
  for label, run in runs.items():
    metric = run_files.decided_by(run.records)[0]
    points = [(r["cumulative_seconds"], r[metric]) for r in run.records
              if run_files.is_finite(r.get(metric))]
    if points:
      seconds, values = zip(*points)
      axes.plot(seconds, values, marker="o", label=(
          label if len(metrics) == 1 else f"{label} ({metric})"))
      drawn = True
  shown = (metrics.pop().replace("val_", "validation ", 1).replace("_", " ")
           if len(metrics) == 1 else "validation figure")
  axes.set_title(f"{shown[0].upper()}{shown[1:]} against training time")
  axes.set_xlabel("seconds of training, evaluation and saving "
                  "(cumulative_seconds)")
  axes.set_ylabel(shown)
  axes.grid(True, alpha=0.4)
  if drawn:
    axes.legend()
  figure.tight_layout()
  try:
    figure.savefig(path, format="png")
  except OSError as e:
    raise WriteFailed(f"--plot={path}: cannot write it ({e.strerror}); "
                      "pass a path in a writable directory") from None
