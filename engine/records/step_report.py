"""The step report of a profiled window: where each rank's step went, step
by step, the ranks side by side and grouped by host, the slowest named
(a rank, or a node whose ranks are all slow), and how fast the allreduce
moved the gradients against the link it runs on.

Each rank times its own window (engine/loop/profiling.py): per call, the
wait for its batch, the phases inside the compiled step on its own clock
(engine/compute/step_outcome.py), the rest of the call (launching it and
reading its result) and the host's time between calls, each per step of
the call; they add up to the step. The ranks' series are gathered; rank 0
appends the report to model_dir/profile/step_reports.jsonl (a line a
window), writes the latest to step_report.json and logs a table.

Across ranks, the allreduce ends together: in each step the rank that
reaches it last waits least, so the smallest communication is about the
transfer itself, and each rank's excess over it is waiting for a slower
one. A rank's lateness in a step is how much later than the first rank it
reached the allreduce (the first one's communication less its own): no
clocks are compared across hosts. The slowest rank is the one busiest
outside the allreduce on average; a straggler is named with how often and
by how much it was late, and where all ranks of one host were late
together, the host is named instead. Where Horovod's timeline recorded the
window, the collective's own time is read from it
(engine/records/horovod_timeline.py), and each rank's communication split
into that and its negotiation.

The transfer's bus bandwidth, bytes * 2 (N - 1) / N / seconds (nccl-tests'
measure: a ring's bus bandwidth is its slowest link's), is set against the
scaling model's time for the link the run says it has
(--profile_link_gbit; engine/records/scaling.py).

The verdict reads the slowest rank, whose step the others wait for: the
part of its step that is largest bounds the run (`BOUNDS`), and each part
that takes a fair share of it (`NOTABLE_SHARE`) gets what the engine
offers against it, leaving out what the run already does
(engine/records/step_advice.py).
"""
import dataclasses
import json
import os
import statistics
from typing import Optional

from engine.records import link_levels
from engine.records import scaling
from engine.records import step_advice
from engine.core import run_files

# A step's parts, in the order a step runs them: its input (read on the
# host, or inside a call of several steps), the phases of the compiled
# step, and the host's own.
PARTS = ("input", "forward", "backward", "communication", "optimizer",
         "launch_and_read", "between_calls")
# A task's own train step is one phase (step_outcome.py): a part of its own,
# shown where it was measured, and compute.
TASK_STEP = "task_step"
# What can bound a step, and the parts that make it: its input, the
# device's work, the allreduce's exposed time, the host's work around the
# calls (launching, reading the outcome, the loop's own).
BOUNDS = {"input": ("input",),
          "compute": ("forward", "backward", "optimizer"),
          "communication": ("communication",),
          "host": ("launch_and_read", "between_calls")}
# A bound this share of the step or more gets its suggestions.
NOTABLE_SHARE = 0.25
# The slowest rank is a straggler when it is busy this share of its step
# longer than the least busy rank, on average; and a rank is late in a
# step when it reaches the allreduce this share of the step after the
# first (at least LATE_FLOOR seconds), a straggler when late in
# LATE_OFTEN of the steps or more (at least 2), twice as often as the
# median rank elsewhere (`_stands_out`).
STRAGGLER_SHARE = 0.1
LATE_FLOOR = 0.0005
LATE_OFTEN = 0.1
# The allreduce's bus bandwidth below this share of the link's, where the
# run names its link: the network is slower than it should be.
SLOW_LINK_SHARE = 0.5


def of_rank(calls: list[dict], *, host: str = "", local_rank: int = 0,
            link_probe: Optional[dict] = None, profiled: bool = False
            ) -> dict:
  """One rank's window from its timed `calls` (each a dict of a part ->
  seconds a step, `steps` it ran and `graph`, the seconds its clock
  stamped; a phase the call does not have counts 0; a part None was not
  measured that call, and is the mean of the others): each part's mean,
  p50, p95 and max a step, the series, their sum (the step), and the share
  of the call the clock covers. `profiled`: TensorFlow's profiler traced
  this rank's window, which slows it."""
  measured = [p for p in (*PARTS, TASK_STEP)
              if p in PARTS or any(p in call for call in calls)]
  series, mean, spread = {}, {}, {}
  for part in measured:
    values = [call.get(part, 0.0) for call in calls]
    known = [v for v in values if v is not None]
    fill = sum(known) / len(known) if known else 0.0
    series[part] = [fill if v is None else v for v in values]
    mean[part] = fill
    spread[part] = _distribution(series[part])
  graph = sum(call.get("graph", sum(call.get(part) or 0.0 for part in (
      *BOUNDS["compute"], TASK_STEP, "communication"))) for call in calls
              ) / max(1, len(calls))
  call_seconds = graph + mean["launch_and_read"]
  steps = [sum(series[part][i] for part in measured)
           for i in range(len(calls))]
  return dict(host=host, local_rank=local_rank, profiled=profiled,
              link_probe=link_probe or dict(bytes=0, seconds={}),
              steps=sum(call.get("steps", 1) for call in calls),
              calls=len(calls), step=sum(mean.values()), parts=mean,
              distribution=dict(spread, step=_distribution(steps)),
              series=dict(series, step=steps),
              in_graph=graph / call_seconds if call_seconds else 0.0)


def across(ranks: list[dict], window: tuple[int, int],
           settings: step_advice.Settings,
           collective: Optional[list[float]] = None) -> dict:
  """The report of every rank's `of_rank`, for global steps `window`: the
  transfer, each rank's wait in the allreduce and lateness step by step,
  the hosts, the slowest rank and where its extra time goes, the link,
  and the verdict (`verdict`, given the run's `settings`). `collective`,
  from Horovod's timeline (horovod_timeline.py), the seconds a step the
  collective itself ran, call by call: each rank's communication is then
  split into that and its negotiation, and the link's bandwidth is the
  collective's own."""
  transfer = min(rank["parts"]["communication"] for rank in ranks)
  busy = [rank["step"] - rank["parts"]["communication"] for rank in ranks]
  slowest = max(range(len(ranks)), key=busy.__getitem__)
  least = min(range(len(ranks)), key=busy.__getitem__)
  extra = {bound: _of(ranks[slowest], bound) - _of(ranks[least], bound)
           for bound in BOUNDS if bound != "communication"}
  lateness = _lateness(ranks)
  report = dict(
      window=list(window),
      ranks=[dict(rank, rank=r, waiting=rank["parts"]["communication"]
                  - transfer, busy=busy[r], late=lateness["ranks"][r])
             for r, rank in enumerate(ranks)],
      hosts=_hosts(ranks, lateness),
      transfer=transfer, slowest_rank=slowest,
      slowest_by=busy[slowest] - busy[least],
      slowest_in=max(extra, key=extra.get),
      late_threshold=lateness["threshold"], late_in=_calls_of(ranks[0]),
      link=_link(ranks, settings, collective),
      settings=_flat(settings))
  if collective:
    report = _split_communication(report, collective)
  return dict(report, verdict=verdict(report, settings))


def _split_communication(report: dict, collective: list[float]) -> dict:
  """Each rank's communication split, step by step, into the collective's
  own time (the timeline's, at most the rank's communication: with the
  allreduces overlapping the backward pass some of it is hidden there)
  and the rest, its negotiation: Horovod's cycle and waiting for the
  others."""
  ranks = []
  for rank in report["ranks"]:
    series = rank["series"]["communication"]
    negotiation = [max(0.0, c - t) for c, t in zip(series, collective)]
    ranks.append(dict(rank, negotiation=sum(negotiation) / max(
        1, len(negotiation))))
  return dict(report, ranks=ranks, collective=dict(
      seconds=sum(collective) / len(collective), series=collective,
      source="Horovod's timeline"))


def _flat(settings: step_advice.Settings) -> dict:
  """`settings` as the report's JSON keeps them: the performance flags'
  beside the rest, as a run's flags name them."""
  flat = dataclasses.asdict(settings)
  return {**flat.pop("performance"), **flat}


def _calls_of(rank: dict) -> str:
  """What the window's series count: steps, or calls of several."""
  per_call = rank["steps"] // max(1, rank["calls"])
  return "steps" if per_call == 1 else f"calls of {per_call} steps"


def _distribution(values: list[float]) -> dict:
  """p50, p95 and max of `values`, each percentile interpolated between
  the two samples around it (numpy's default): of 20 samples or fewer, the
  nearest rank's p95 is the max, which says nothing of the tail."""
  ordered = sorted(values)
  def percentile(q):
    if not ordered:
      return 0.0
    at = q * (len(ordered) - 1)
    below = int(at)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (at - below) * (ordered[above] - ordered[below])
  return dict(p50=percentile(0.5), p95=percentile(0.95),
              max=ordered[-1] if ordered else 0.0)


def _lateness(ranks: list[dict]) -> dict:
  """Step by step, how much later than the first each rank reached the
  allreduce; which steps it was late in (`threshold`, from the median
  step), and by how much."""
  communication = [rank["series"]["communication"] for rank in ranks]
  calls = min(len(series) for series in communication)
  steps = [s for rank in ranks for s in rank["series"]["step"]]
  threshold = max(LATE_FLOOR, STRAGGLER_SHARE * statistics.median(steps)
                  ) if steps else LATE_FLOOR
  by_step = [[max(c[i] for c in communication) - own[i]
              for i in range(calls)] for own in communication]
  return dict(threshold=threshold, by_step=by_step,
              ranks=[_late(series, threshold) for series in by_step])


def _late(series: list[float], threshold: float) -> dict:
  """The steps of `series` (seconds late, a step) that were late, the
  range of their lateness, and the series."""
  late = [i for i, seconds in enumerate(series) if seconds >= threshold]
  return dict(steps=late, of=len(series), seconds=series,
              by=[min(series[i] for i in late),
                  max(series[i] for i in late)] if late else None)


def _hosts(ranks: list[dict], lateness: dict) -> list[dict]:
  """The hosts, each with its ranks (by local rank) and the steps all of
  them were late in together."""
  found = {}
  for r, rank in enumerate(ranks):
    found.setdefault(rank["host"], []).append(r)
  hosts = []
  for host, members in found.items():
    members.sort(key=lambda r: ranks[r]["local_rank"])
    together = [min(lateness["by_step"][r][i] for r in members)
                for i in range(len(lateness["by_step"][members[0]]))]
    hosts.append(dict(host=host, ranks=members,
                      late=_late(together, lateness["threshold"])))
  return hosts


def _link(ranks: list[dict], settings: step_advice.Settings,
          collective: Optional[list[float]]) -> Optional[dict]:
  """The allreduce's bus bandwidth step by step (over the collective's
  own time where the timeline gives it, else the step's smallest
  communication across ranks: its transfer), and the scaling model's
  time for the run's link, where it names one."""
  processes = len(ranks)
  if processes < 2 or not settings.gradient_bytes:
    return None
  communication = [rank["series"]["communication"] for rank in ranks]
  transfers = collective or [
      min(c[i] for c in communication)
      for i in range(min(len(c) for c in communication))]
  bus_bytes = settings.gradient_bytes * 2 * (processes - 1) / processes
  gbit = [8e-9 * bus_bytes / seconds for seconds in transfers if seconds > 0]
  hosts = len({rank["host"] for rank in ranks})
  found = dict(gradient_bytes=settings.gradient_bytes, processes=processes,
               crosses="hosts" if hosts > 1 else "one host",
               controller=settings.controller,
               bus_gbit=_distribution(gbit), levels=link_levels.of(ranks))
  if settings.link:
    expected = scaling.update_allreduce_seconds(settings.gradient_bytes,
                                                processes, settings.link)
    found.update(link_gbit=8e-9 * settings.link.bandwidth,
                 expected_seconds=expected,
                 transfer_seconds=_distribution(transfers)["p50"],
                 share=found["bus_gbit"]["p50"]
                 / (8e-9 * settings.link.bandwidth))
  return found


def shares(rank: dict) -> dict:
  """Each of BOUNDS' share of the rank's step."""
  return {bound: _of(rank, bound) / rank["step"] if rank["step"] else 0.0
          for bound in BOUNDS}


def verdict(report: dict, settings: step_advice.Settings) -> dict:
  """What bounds the step (the largest of BOUNDS on the slowest rank),
  each bound's share, what makes a rank or a node straggle (or None: none
  does), what the network achieves against its link, and what to try."""
  slowest = report["ranks"][report["slowest_rank"]]
  split = shares(slowest)
  bound = max(split, key=split.get)
  notable = sorted((b for b in split if split[b] >= NOTABLE_SHARE
                    or b == bound), key=split.get, reverse=True)
  stragglers = _stragglers(report)
  return dict(bound=bound, shares=split,
              straggler=stragglers[0] if stragglers else None,
              stragglers=stragglers,
              network=_network(report["link"], "communication" in notable),
              suggestions=step_advice.against(notable, settings))


def _stragglers(report: dict) -> list[str]:
  """Who straggles, where its extra time goes, how often and by how much,
  the most late first: each node whose ranks were all often late
  together, each rank often late elsewhere (with its host); or, where none
  was, the slowest rank if it is busier on average."""
  ranks, hosts = report["ranks"], report["hosts"]
  # TensorFlow's profiler slows the rank it traces: a straggler of its
  # own making, unless every rank is traced alike.
  unfair = profiled_alone(report)
  nodes = sorted((h for h in hosts if len(hosts) > 1 and len(h["ranks"]) > 1
                  and _stands_out(h["late"], [
                      ranks[r]["late"] for r in range(len(ranks))
                      if r not in h["ranks"]])),
                 key=lambda h: _total(h["late"]), reverse=True)
  found = [_STRAGGLER[_extra_in(report, max(
      node["ranks"], key=lambda r: ranks[r]["busy"]))].format(
          who=f"node {node['host']}") + f"; its ranks "
           f"{', '.join(map(str, node['ranks']))} reached the allreduce "
           f"last together {_how_often(node['late'], report)}"
           for node in nodes]
  on_nodes = {r for node in nodes for r in node["ranks"]}
  late = sorted((r for r in range(len(ranks)) if r not in on_nodes
                 and r not in unfair and _stands_out(ranks[r]["late"], [
                     ranks[o]["late"] for o in range(len(ranks))
                     if o != r and o not in on_nodes])),
                key=lambda r: _total(ranks[r]["late"]), reverse=True)
  slowest = report["slowest_rank"]
  if not found and not late and slowest not in unfair and report[
      "slowest_by"] >= STRAGGLER_SHARE * ranks[slowest]["step"]:
    late = [slowest]
  for r in late:
    rank = ranks[r]
    text = _STRAGGLER[_extra_in(report, r)].format(who=f"rank {r}")
    if rank["host"]:
      text += f"; on {rank['host']} (local rank {rank['local_rank']})"
    if rank["late"]["steps"]:
      text += (", it reached the allreduce last "
               + _how_often(rank["late"], report))
    found.append(text)
  return found


def profiled_alone(report: dict) -> list[int]:
  """The ranks TensorFlow's profiler traced, where it did not trace all."""
  profiled = [rank["rank"] for rank in report["ranks"]
              if rank.get("profiled")]
  return profiled if len(profiled) < len(report["ranks"]) else []


def _extra_in(report: dict, r: int) -> str:
  """Where rank `r`'s step is longer than the others', outside the
  allreduce: the bound with the most extra time over the least of the
  other ranks', in the steps it was late (all, if none)."""
  ranks = report["ranks"]
  steps = ranks[r]["late"]["steps"] or range(ranks[r]["late"]["of"])
  def of(rank, bound, i):
    return sum(rank["series"].get(part, [0.0] * (i + 1))[i]
               for part in _parts_of(bound))
  extra = {bound: sum(of(ranks[r], bound, i) - min(
      of(other, bound, i) for other in ranks if other is not ranks[r])
                      for i in steps)
           for bound in BOUNDS if bound != "communication"}
  return max(extra, key=extra.get)


def _total(late: dict) -> float:
  return len(late["steps"]) * (late["by"][1] if late["by"] else 0.0)


def _stands_out(late: dict, others: list[dict]) -> bool:
  """Whether `late` (a rank's or a node's) was late often, and at least
  twice as often as the median of `others` (the ranks outside it): on a
  busy machine every rank is late now and then."""
  count = len(late["steps"])
  return count >= max(2, LATE_OFTEN * late["of"]) and count >= 2 * (
      statistics.median(len(other["steps"]) for other in others)
      if others else 0)


def _how_often(late: dict, report: dict) -> str:
  low, high = (1e3 * seconds for seconds in late["by"])
  by = f"{low:.0f} ms" if round(low) == round(high) else (
      f"{low:.0f}-{high:.0f} ms")
  return (f"in {len(late['steps'])} of {late['of']} {report['late_in']}, "
          f"by {by} a step")


def _network(link: Optional[dict], matters: bool) -> Optional[str]:
  """What the allreduce achieved, against the link where the run names
  it; None for a process alone."""
  if not link:
    return None
  on = f", on Horovod's {link['controller']}" if link["controller"] else ""
  achieved = (f"the allreduce's bus bandwidth "
              f"{link_levels.rate(link['bus_gbit']['p50'])} (p50 of its "
              f"steps; {link['processes']} processes, across "
              f"{link['crosses']}{on})")
  if "link_gbit" not in link:
    return achieved + "; give --profile_link_gbit to set it against the link"
  achieved += (f", {link['share']:.0%} of the "
               f"{link_levels.rate(link['link_gbit'])} link (the scaling model's transfer "
               f"{1e3 * link['expected_seconds']:.2f} ms, measured "
               f"{1e3 * link['transfer_seconds']:.2f} ms)")
  probed = [level["bus_gbit"] / link["link_gbit"] for level in link["levels"]
            if level["level"] == link_levels.ACROSS]
  if link["share"] < SLOW_LINK_SHARE and probed and (
      probed[0] >= SLOW_LINK_SHARE):
    return achieved + (f": the network does what the link allows (probed "
                       f"across hosts, {probed[0]:.0%}), but the step's "
                       "allreduce moves too few bytes at a time to fill it")
  if link["share"] < SLOW_LINK_SHARE:
    return achieved + (": the network is slower than it should be (other "
                       "traffic, its interfaces' settings, the route)"
                       if matters else ": slower than the link, but the "
                       "allreduce is a small part of the step")
  return achieved + ": the network does what the link allows"


# The slowest rank's (or node's) extra time, by where it is.
_STRAGGLER = {
    "compute": "{who} computes longer than the others: a slower or "
               "busier host (what else runs on its cores; --bind_cpus)",
    "input": "{who} waits longer for its batches: its storage or its "
             "share of the files",
    "host": "{who} spends longer around its calls on the host: other "
            "processes on its cores",
}


def _parts_of(bound: str) -> tuple:
  """BOUNDS' parts of `bound`; a task's own step is compute."""
  return (*BOUNDS[bound], TASK_STEP) if bound == "compute" else BOUNDS[bound]


def _of(rank: dict, bound: str) -> float:
  return sum(rank["parts"].get(part, 0.0) for part in _parts_of(bound))


def write(model_dir: str, report: dict) -> str:
  """The window's report, appended to model_dir/profile/step_reports.jsonl
  and as the latest, step_report.json; the latter's path."""
  directory = run_files.profile_dir(model_dir, rank=0)
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, run_files.STEP_REPORTS_FILE), "a") as f:
    f.write(json.dumps(report) + "\n")
  run_files.write_record(directory, run_files.STEP_REPORT_FILE, report)
  return os.path.join(directory, run_files.STEP_REPORT_FILE)
