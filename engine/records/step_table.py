"""The step report (step_report.py) as the log's table: milliseconds a
step, a row a rank, then the window, the verdict, what to try, the ranks'
spread, and the link.

Up to SHOWN_RANKS ranks, every rank has its row and its spread. Beyond,
the table stays as short at 512 ranks as at 16: the slowest SHOWN_SLOWEST
ranks (the others wait for them), the least busy for comparison and a line
for the rest; then the hosts, the slowest SHOWN_HOSTS by their slowest
rank, each with its ranks' spread. At most SHOWN_SLOWEST stragglers are
named, at any number of ranks. The report's JSON keeps every rank.
"""
from engine.records import link_levels
from engine.records import step_report

SHOWN_RANKS = 8
SHOWN_SLOWEST = 4
SHOWN_HOSTS = 4


def table(report: dict) -> str:
  ranks = report["ranks"]
  shown = _shown(ranks)
  parts = [part for part in (*step_report.PARTS, step_report.TASK_STEP)
           if part in ranks[0]["parts"]]
  heads = ["rank", "step", *parts, "waiting"]
  widths = [max(len(head), 7) for head in heads]
  lines = ["  ".join(f"{h:>{w}}" for h, w in zip(heads, widths))]
  for rank in shown:
    cells = [rank["step"], *(rank["parts"][p] for p in parts),
             rank["waiting"]]
    lines.append("  ".join([f"{rank['rank']:>{widths[0]}}", *(
        f"{1e3 * c:>{w}.2f}" for c, w in zip(cells, widths[1:]))]))
  if len(shown) < len(ranks):
    lines.append(_the_rest(ranks, shown))
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
  stragglers = found["stragglers"]
  lines += [f"a straggler: {text}" for text in stragglers[:SHOWN_SLOWEST]]
  if len(stragglers) > SHOWN_SLOWEST:
    lines.append(f"{len(stragglers) - SHOWN_SLOWEST} more stragglers (the "
                 "report's JSON, verdict.stragglers)")
  lines += [f"rank {r} ran TensorFlow's profiler, which slows it: not "
            "named a straggler (--profile_all_ranks traces every rank)"
            for r in step_report.profiled_alone(report)]
  lines += [f"  try {text}" for text in found["suggestions"]]
  lines += [_spread(rank, report) for rank in shown]
  if len(shown) < len(ranks):
    lines += _hosts(report)
  if found["network"]:
    lines.append(f"network: {found['network']}")
  if "collective" in report:
    lines.append(_split(report, shown))
  if report["link"] and report["link"]["levels"]:
    lines.append("link levels: " + link_levels.described(
        report["link"]["levels"], report["link"].get("link_gbit")))
  return "\n".join(lines)


def _shown(ranks: list[dict]) -> list[dict]:
  """Every rank, or beyond SHOWN_RANKS the slowest few and the least busy,
  in rank order."""
  if len(ranks) <= SHOWN_RANKS:
    return ranks
  by_busy = sorted(ranks, key=lambda rank: rank["busy"], reverse=True)
  shown = by_busy[:SHOWN_SLOWEST] + by_busy[-1:]
  return sorted(shown, key=lambda rank: rank["rank"])


def _range(values: list[float]) -> str:
  return f"{1e3 * min(values):.2f}-{1e3 * max(values):.2f}"


def _the_rest(ranks: list[dict], shown: list[dict]) -> str:
  numbers = {rank["rank"] for rank in shown}
  rest = [rank for rank in ranks if rank["rank"] not in numbers]
  return (f"{'...':>7}  {len(rest)} more ranks: step "
          f"{_range([r['step'] for r in rest])} ms, waiting "
          f"{_range([r['waiting'] for r in rest])} ms")


def _split(report: dict, shown: list[dict]) -> str:
  """Communication as Horovod's timeline splits it."""
  return (f"communication, from Horovod's timeline: the collective itself "
          f"{1e3 * report['collective']['seconds']:.2f} ms a step; "
          "negotiating and waiting for the others " + ", ".join(
              f"rank {rank['rank']} {1e3 * rank['negotiation']:.2f} ms"
              for rank in shown))


def _spread(rank: dict, report: dict) -> str:
  step = rank["distribution"]["step"]
  return (f"rank {rank['rank']} on {rank['host'] or '?'} (local rank "
          f"{rank['local_rank']}): step p50 {1e3 * step['p50']:.2f}, p95 "
          f"{1e3 * step['p95']:.2f}, max {1e3 * step['max']:.2f} ms over "
          f"{rank['calls']} {report['late_in']}" + (
              f"; late to the allreduce in {len(rank['late']['steps'])}"
              f" of {rank['late']['of']}" if rank["late"]["steps"] else ""))


def _hosts(report: dict) -> list[str]:
  """The slowest SHOWN_HOSTS hosts by their slowest rank, each with its
  ranks' spread of steps and busy time; a line for the rest."""
  ranks = report["ranks"]
  hosts = sorted(report["hosts"], key=lambda host: max(
      ranks[r]["busy"] for r in host["ranks"]), reverse=True)
  lines = []
  for host in hosts[:SHOWN_HOSTS]:
    members = [ranks[r] for r in host["ranks"]]
    late = host["late"]
    lines.append(
        f"host {host['host'] or '?'}: {len(members)} ranks "
        f"({_rank_list(host['ranks'])}), step "
        f"{_range([r['step'] for r in members])} ms, busy "
        f"{_range([r['busy'] for r in members])} ms" + (
            f"; late together in {len(late['steps'])} of {late['of']}"
            if late["steps"] else ""))
  if len(hosts) > SHOWN_HOSTS:
    rest = [ranks[r] for host in hosts[SHOWN_HOSTS:] for r in host["ranks"]]
    lines.append(f"{len(hosts) - SHOWN_HOSTS} more hosts: busy "
                 f"{_range([r['busy'] for r in rest])} ms")
  return lines


def _rank_list(members: list[int]) -> str:
  """Ranks as runs: 0-7, 12."""
  runs = []
  for r in sorted(members):
    if runs and r == runs[-1][1] + 1:
      runs[-1][1] = r
    else:
      runs.append([r, r])
  return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
