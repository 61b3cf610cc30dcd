"""The step report of a profiled window: where each rank's step went, the
ranks side by side, and the slowest named.

Each rank times its own window (engine/loop/profiling.py): per step, the
wait for its batch, the phases inside the compiled step on its own clock
(engine/compute/step_clock.py), the rest of the call (launching it and
reading its result) and the host's time between calls; they add up to the
step. The ranks' figures are gathered; rank 0 writes them to
model_dir/profile/step_report.json and logs a table.

Across ranks, the allreduce ends together: the rank that reaches it last
waits least, so the smallest communication is about the transfer itself,
and each rank's excess over it is waiting for a slower rank. The slowest
rank is the one busiest outside the allreduce.
"""
import os

from engine.compute import step_clock
from engine.core import run_files

# A step's parts, in the order a step runs them.
PARTS = ("input", *step_clock.PHASES, "launch_and_read", "between_calls")


def of_rank(steps: list[dict]) -> dict:
  """One rank's mean seconds per part over its window's `steps` (each a
  part -> seconds dict; a phase the step does not have counts 0), their
  sum (the step), and the share of the call the phases cover."""
  mean = {part: sum(step.get(part, 0.0) for step in steps) / len(steps)
          for part in PARTS}
  phases = sum(mean[phase] for phase in step_clock.PHASES)
  call = phases + mean["launch_and_read"]
  return dict(steps=len(steps), step=sum(mean.values()), parts=mean,
              in_graph=phases / call if call else 0.0)


def across(ranks: list[dict], window: tuple[int, int]) -> dict:
  """The report of every rank's `of_rank`, for global steps `window`: the
  transfer, each rank's wait in the allreduce, the slowest rank."""
  transfer = min(rank["parts"]["communication"] for rank in ranks)
  busy = [rank["step"] - rank["parts"]["communication"] for rank in ranks]
  slowest = max(range(len(ranks)), key=busy.__getitem__)
  return dict(
      window=list(window),
      ranks=[dict(rank, rank=r, waiting=rank["parts"]["communication"]
                  - transfer, busy=busy[r]) for r, rank in enumerate(ranks)],
      transfer=transfer, slowest_rank=slowest,
      slowest_by=busy[slowest] - min(busy))


def table(report: dict) -> str:
  """The report as the log's table: milliseconds per step, a row a rank."""
  heads = ["rank", "step", *PARTS, "waiting"]
  lines = ["  ".join(f"{h:>13}" for h in heads)]
  for rank in report["ranks"]:
    cells = [rank["step"], *rank["parts"].values(), rank["waiting"]]
    lines.append("  ".join([f"{rank['rank']:>13}",
                            *(f"{1e3 * c:>13.2f}" for c in cells)]))
  first, last = report["window"]
  lines.append(
      f"steps {first}-{last}, ms a step; slowest rank {report['slowest_rank']}"
      f", busy {1e3 * report['slowest_by']:.2f} ms a step longer than the "
      f"least busy; the allreduce's transfer about "
      f"{1e3 * report['transfer']:.2f} ms")
  return "\n".join(lines)


def write(model_dir: str, report: dict) -> str:
  """model_dir/profile/step_report.json; its path."""
  directory = run_files.profile_dir(model_dir, rank=0)
  os.makedirs(directory, exist_ok=True)
  run_files.write_record(directory, run_files.STEP_REPORT_FILE, report)
  return os.path.join(directory, run_files.STEP_REPORT_FILE)
