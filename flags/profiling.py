"""Flags: profiling windows of train steps."""
from absl import flags

flags.DEFINE_string("profile_steps", "",
                    "START,END[,START,END...]: windows of global steps "
                    "(1-based, inclusive) to trace with the TensorFlow "
                    "profiler into model_dir/profile (open with "
                    "TensorBoard's Profile tab) and to time on every rank "
                    "into a step report: a line a window in "
                    "model_dir/profile/step_reports.jsonl, the latest in "
                    "step_report.json (rank 0 logs its table: input, "
                    "forward, backward, communication, optimizer, the "
                    "host's share, each rank's host and spread; what "
                    "bounds the step, the slowest rank or node, the "
                    "allreduce's bandwidth, and flags to try; TensorBoard "
                    "shows it under profile/; docs/performance.md). The "
                    "steps run as the run runs them, --steps_per_call a "
                    "call. The first window's first call, which traces the "
                    "timed step, is left out of its report. Empty: off.")
flags.DEFINE_integer("profile_every", 0,
                     "With --profile_steps: its windows again every this "
                     "many steps (e.g. --profile_steps=11,20 "
                     "--profile_every=1000: steps 11-20, 1011-1020, ...), "
                     "so a long run shows how its step evolves. 0: once.",
                     lower_bound=0)
flags.DEFINE_float("profile_link_gbit", None,
                   "The link between hosts, in Gbit/s: the step report sets "
                   "the allreduce's achieved bus bandwidth against it (the "
                   "scaling model's time, engine/records/scaling.py) and says when "
                   "the network is slower than it should be.")
flags.DEFINE_float("profile_link_latency_us", 0.0,
                   "With --profile_link_gbit: the link's latency in "
                   "microseconds.", lower_bound=0.0)
flags.DEFINE_bool("profile_all_ranks", False,
                  "Profile every process, not rank 0 alone; rank r > 0 "
                  "writes model_dir/profile/rank_<r>.")
flags.DEFINE_bool("horovod_timeline", False,
                  "Also record Horovod's timeline of the first "
                  "--profile_steps window (its allreduces, negotiation "
                  "and wait) to model_dir/timeline.json, for "
                  "chrome://tracing or Perfetto); the window's step report "
                  "then splits communication into negotiation and the "
                  "collective itself. Not named --timeline: "
                  "horovodrun would take that for its own "
                  "--timeline-filename.")


def windows(value: str) -> list[tuple[int, int]]:
  """--profile_steps' windows, in order; ValueError if it names none or
  they are not ascending and apart."""
  parts = [p.strip() for p in value.split(",")]
  if len(parts) % 2 or not all(p.isdigit() for p in parts):
    raise ValueError(value)
  found = list(zip(map(int, parts[::2]), map(int, parts[1::2])))
  previous = 0
  for first, last in found:
    if not previous < first <= last:
      raise ValueError(value)
    previous = last
  return found


def _are_windows(value):
  if not value:
    return True
  try:
    return bool(windows(value))
  except ValueError:
    return False


flags.register_validator("profile_steps", _are_windows,
                         "must be START,END with 1 <= START <= END, e.g. "
                         "10,20, or several such windows in order, apart, "
                         "e.g. 10,20,500,510")


flags.register_multi_flags_validator(
    ["horovod_timeline", "profile_steps"],
    lambda values: (not values["horovod_timeline"]
                    or values["profile_steps"]),
    "--horovod_timeline records the --profile_steps range; give "
    "--profile_steps too, e.g. --profile_steps=10,20")


flags.register_multi_flags_validator(
    ["profile_every", "profile_steps"],
    lambda values: not values["profile_every"] or (
        values["profile_steps"] and _are_windows(values["profile_steps"])
        and windows(values["profile_steps"])[-1][1]
        - windows(values["profile_steps"])[0][0] < values["profile_every"]),
    "--profile_every repeats the --profile_steps windows: give "
    "--profile_steps too, its windows within fewer steps than "
    "--profile_every, e.g. --profile_steps=11,20 --profile_every=1000")


flags.register_multi_flags_validator(
    ["profile_link_latency_us", "profile_link_gbit"],
    lambda values: (values["profile_link_gbit"] is None
                    or values["profile_link_gbit"] > 0),
    "--profile_link_gbit is the link's bandwidth in Gbit/s, above 0, "
    "e.g. 10")
