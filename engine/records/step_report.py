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

The verdict reads the slowest rank, whose step the others wait for: the
part of its step that is largest bounds the run (`BOUNDS`), and each part
that takes a fair share of it (`NOTABLE_SHARE`) gets what the engine
offers against it, leaving out what the run already does (`settings`).
"""
import os

from engine.compute import step_clock
from engine.core import run_files

# A step's parts, in the order a step runs them.
PARTS = ("input", *step_clock.PHASES, "launch_and_read", "between_calls")
# What can bound a step, and the parts that make it: its input, the
# device's work, the allreduce's exposed time, the host's work around the
# calls (launching, reading the outcome, the loop's own).
BOUNDS = {"input": ("input",), "compute": ("forward", "backward", "optimizer"),
          "communication": ("communication",),
          "host": ("launch_and_read", "between_calls")}
# A bound this share of the step or more gets its suggestions.
NOTABLE_SHARE = 0.25
# The slowest rank is a straggler when it is busy this share of its step
# longer than the least busy rank.
STRAGGLER_SHARE = 0.1


def of_rank(steps: list[dict]) -> dict:
  """One rank's mean seconds per part over its window's `steps` (each a
  part -> seconds dict; a phase the step does not have counts 0; a part
  None was not measured that step, and is the mean of the others), their
  sum (the step), and the share of the call the phases cover."""
  mean = {}
  for part in PARTS:
    measured = [step.get(part, 0.0) for step in steps
                if step.get(part, 0.0) is not None]
    mean[part] = sum(measured) / len(measured) if measured else 0.0
  phases = sum(mean[phase] for phase in step_clock.PHASES)
  call = phases + mean["launch_and_read"]
  return dict(steps=len(steps), step=sum(mean.values()), parts=mean,
              in_graph=phases / call if call else 0.0)


def across(ranks: list[dict], window: tuple[int, int],
           settings: dict) -> dict:
  """The report of every rank's `of_rank`, for global steps `window`: the
  transfer, each rank's wait in the allreduce, the slowest rank and where
  its extra time goes, and the verdict (`verdict`, given the run's
  `settings`)."""
  transfer = min(rank["parts"]["communication"] for rank in ranks)
  busy = [rank["step"] - rank["parts"]["communication"] for rank in ranks]
  slowest = max(range(len(ranks)), key=busy.__getitem__)
  least = min(range(len(ranks)), key=busy.__getitem__)
  extra = {bound: _of(ranks[slowest], bound) - _of(ranks[least], bound)
           for bound in BOUNDS if bound != "communication"}
  report = dict(
      window=list(window),
      ranks=[dict(rank, rank=r, waiting=rank["parts"]["communication"]
                  - transfer, busy=busy[r]) for r, rank in enumerate(ranks)],
      transfer=transfer, slowest_rank=slowest,
      slowest_by=busy[slowest] - busy[least],
      slowest_in=max(extra, key=extra.get), settings=settings)
  return dict(report, verdict=verdict(report))


def shares(rank: dict) -> dict:
  """Each of BOUNDS' share of the rank's step."""
  return {bound: _of(rank, bound) / rank["step"] if rank["step"] else 0.0
          for bound in BOUNDS}


def verdict(report: dict) -> dict:
  """What bounds the step (the largest of BOUNDS on the slowest rank),
  each bound's share, what makes a rank straggle (or None: none does),
  and what to try."""
  slowest = report["ranks"][report["slowest_rank"]]
  split = shares(slowest)
  bound = max(split, key=split.get)
  straggler = report["slowest_by"] >= STRAGGLER_SHARE * slowest["step"]
  notable = sorted((b for b in split if split[b] >= NOTABLE_SHARE
                    or b == bound), key=split.get, reverse=True)
  return dict(bound=bound, shares=split,
              straggler=_STRAGGLER[report["slowest_in"]].format(
                  rank=report["slowest_rank"]) if straggler else None,
              suggestions=_once_a_flag(
                  text for b in notable
                  for text in _suggestions(b, report["settings"])))


def _once_a_flag(suggestions) -> list[str]:
  """`suggestions` in their order, a flag offered against two bounds
  (--cache_records against input and compute) kept where it comes first."""
  kept, flags = [], set()
  for text in suggestions:
    flag = text.split(":")[0].split(" ")[0] if text.startswith("--") else text
    if flag not in flags:
      flags.add(flag)
      kept.append(text)
  return kept


# The slowest rank's extra time, by where it is.
_STRAGGLER = {
    "compute": "rank {rank} computes longer than the others: a slower or "
               "busier host (what else runs on its cores; --bind_cpus)",
    "input": "rank {rank} waits longer for its batches: its storage or its "
             "share of the files",
    "host": "rank {rank}'s host spends longer around its calls: other "
            "processes on its cores",
}


def _suggestions(bound: str, settings: dict) -> list[str]:
  """What the engine offers against `bound`, leaving out what a run with
  `settings` already does."""
  gpu = settings.get("device") == "GPU"
  offered = {
      "input": [
          (settings.get("records") and not settings.get("cache_records")
           and not settings.get("image_records"),
           "--cache_records: TFRecords of declared features decoded once "
           "and kept in memory"),
          (settings.get("records") and not settings.get("stage_dir"),
           "--stage_dir: TFRecords copied to node-local storage first"),
          (True, "more cores for each process's reads (tf.data reads in "
                 "parallel, as many as it has cores)")],
      "compute": [
          (settings.get("mixed_precision") in (None, "none"),
           "--mixed_precision=" + ("float16" if gpu else "bfloat16 (where "
                                   "the CPU has AVX512_BF16 or AMX)")),
          # On a CPU tf.data decodes on the cores the step computes on:
          # the decoding shows as longer forward and backward passes, not
          # as input wait (bench/RESULTS.md, "The step at float32 is the
          # core's peak").
          (not gpu and settings.get("streams_declared_records"),
           "--cache_records: the records are decoded on the cores that "
           "compute, which shows in forward and backward, not in input"),
          (gpu and not settings.get("xla"), "--xla")],
      "communication": [
          (settings.get("gradient_compression") in (None, "none"),
           "--gradient_compression=fp16: half the bytes"),
          (settings.get("grad_accum_steps", 1) == 1,
           "--grad_accum_steps: one allreduce for several batches"),
          (True, "Horovod's fusion and cycle (horovodrun --fusion-"
                 "threshold-mb, --cycle-time-ms)"),
          (settings.get("processes_per_host", 1) > 1,
           "fewer processes per host, each with more threads"),
          (settings.get("allreduce_op", "average") == "average",
           "--allreduce_op=adasum, where Horovod runs on MPI")],
      "host": [
          (True, f"--steps_per_call above "
                 f"{settings.get('steps_per_call', 1)}: several steps a "
                 "call, one launch and read")],
  }[bound]
  return [text for applies, text in offered if applies]


def _of(rank: dict, bound: str) -> float:
  return sum(rank["parts"][part] for part in BOUNDS[bound])


def table(report: dict) -> str:
  """The report as the log's table: milliseconds per step, a row a rank."""
  heads = ["rank", "step", *PARTS, "waiting"]
  widths = [max(len(head), 7) for head in heads]
  lines = ["  ".join(f"{h:>{w}}" for h, w in zip(heads, widths))]
  for rank in report["ranks"]:
    cells = [rank["step"], *rank["parts"].values(), rank["waiting"]]
    lines.append("  ".join([f"{rank['rank']:>{widths[0]}}", *(
        f"{1e3 * c:>{w}.2f}" for c, w in zip(cells, widths[1:]))]))
  first, last = report["window"]
  lines.append(
      f"steps {first}-{last}, ms a step; slowest rank {report['slowest_rank']}"
      f", busy {1e3 * report['slowest_by']:.2f} ms a step longer than the "
      f"least busy, in its {report['slowest_in']}; the allreduce's transfer "
      f"about {1e3 * report['transfer']:.2f} ms")
  found = report["verdict"]
  lines.append(f"{found['bound']}-bound: " + ", ".join(
      f"{bound} {share:.0%}" for bound, share in found["shares"].items())
               + " of the slowest rank's step")
  if found["straggler"]:
    lines.append(f"a straggler: {found['straggler']}")
  lines += [f"  try {text}" for text in found["suggestions"]]
  return "\n".join(lines)


def write(model_dir: str, report: dict) -> str:
  """model_dir/profile/step_report.json; its path."""
  directory = run_files.profile_dir(model_dir, rank=0)
  os.makedirs(directory, exist_ok=True)
  run_files.write_record(directory, run_files.STEP_REPORT_FILE, report)
  return os.path.join(directory, run_files.STEP_REPORT_FILE)
