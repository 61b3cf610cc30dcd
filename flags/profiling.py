"""Flags: profiling a range of train steps."""
from absl import flags

flags.DEFINE_string("profile_steps", "",
                    "START,END: trace global steps START to END (1-based, "
                    "inclusive) with the TensorFlow profiler into "
                    "model_dir/profile (open with TensorBoard's Profile tab), "
                    "and time each rank's steps into "
                    "model_dir/profile/step_report.json (rank 0 logs its "
                    "table: input, forward, backward, communication, "
                    "optimizer, the host's share; what bounds the step, "
                    "the slowest rank, and flags to try; TensorBoard shows "
                    "it under profile/; docs/performance.md). The window's "
                    "first step, which includes tracing, is left out of "
                    "the report. Empty: off.")
flags.DEFINE_bool("profile_all_ranks", False,
                  "Profile every process, not rank 0 alone; rank r > 0 "
                  "writes model_dir/profile/rank_<r>.")
flags.DEFINE_bool("horovod_timeline", False,
                  "Also record Horovod's timeline of the --profile_steps "
                  "range (its allreduces, negotiation and wait) to "
                  "model_dir/timeline.json, for chrome://tracing or "
                  "Perfetto). Not named --timeline: horovodrun would take "
                  "that for its own --timeline-filename.")


def _is_step_range(value):
  if not value:
    return True
  parts = value.split(",")
  return (len(parts) == 2 and all(p.strip().isdigit() for p in parts)
          and 1 <= int(parts[0]) <= int(parts[1]))


flags.register_validator("profile_steps", _is_step_range,
                         "must be START,END with 1 <= START <= END, e.g. "
                         "10,20")


flags.register_multi_flags_validator(
    ["horovod_timeline", "profile_steps"],
    lambda values: (not values["horovod_timeline"]
                    or values["profile_steps"]),
    "--horovod_timeline records the --profile_steps range; give "
    "--profile_steps too, e.g. --profile_steps=10,20")
