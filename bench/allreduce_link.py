r"""Horovod's allreduce against the link it runs on, across simulated hosts.

  .venv/bin/python -m bench.allreduce_link --repeats=3 \
      --out=bench/out/allreduce_link.json

As root, on tests/simulated_hosts.py's hosts (network namespaces, a veth
from each to a bridge, sshd): one process per host, each pinned to its own
core (bench/allreduce_worker.py), timing allreduces of messages of
--sizes bytes (4 KB to 64 MB, powers of 4) of each --dtypes (float32, and
float16 as --gradient_compression=fp16 sends it: the same bytes, summed by
Gloo's or MPI's own float16 sum) under each --controllers
(`horovodrun --gloo`, and `horovodrun --mpi`: Open MPI's mpirun over the
hosts' ssh), on each --links: `unshaped`, or a rate such as `1gbit` set
with tc's token bucket (`tbf`, a bucket of --burst_ms at the rate) on the
egress of every host's interface, inside its namespace, so that each
direction of every path is shaped once. Horovod's background thread cycles
every --cycle_time_ms (0.1), so that its cycle adds little to the latency.
A delay cannot be added here: this kernel has no sch_netem (tc: "Specified
qdisc kind is unknown"), so the links keep the veth's own latency.

Each round runs every (link, controller, type) once, the order reversed
every other round, and prints every run. Per size: the median time over the
runs' medians, algbw = bytes / time and busbw = algbw x 2(n-1)/n as
nccl-tests defines them (bench/ring_allreduce.py), and busbw as a fraction
of the shaped rate. Per link, controller and type, alpha and beta of the
ring model t = 2(n-1) alpha + 2(n-1)/n x bytes / beta fitted over the sizes,
the smallest message's time (latency) and the largest's busbw
(bandwidth), written with every time to --out. The shaping goes with the
hosts' namespaces at the end, also on a failure.
"""
import json
import os
import statistics
import sys
import time

from absl import app
from absl import flags

from bench import interleaved
from bench import ring_allreduce
from tests import shaped_links
from engine.records import scaling
from tests import simulated_hosts

FLAGS = flags.FLAGS
flags.DEFINE_integer("hosts", 2, "Simulated hosts, one process each.",
                     lower_bound=2)
flags.DEFINE_list("links", ["unshaped", "1gbit", "10gbit"],
                  "`unshaped`, or a rate each host's egress is shaped to "
                  "(tc tbf): a number and mbit or gbit.")
flags.DEFINE_list("controllers", ["gloo", "mpi"], "Horovod's controllers.")
flags.DEFINE_list("dtypes", ["float32"], "The messages' types: float32, "
                  "float16.")
flags.DEFINE_list("sizes", [str(4096 * 4**i) for i in range(8)],
                  "Message sizes in bytes.")
flags.DEFINE_integer("repeats", 3, "Rounds over every link, controller and "
                     "type.", lower_bound=1)
flags.DEFINE_integer("iterations", 20, "Timed allreduces per size, at most "
                     "(fewer for large messages: bench/allreduce_worker.py).")
flags.DEFINE_float("cycle_time_ms", 0.1, "HOROVOD_CYCLE_TIME of the workers: "
                   "an allreduce waits for the background thread's next "
                   "cycle, so this bounds the latency measured (Horovod's "
                   "default is 1, the engine's 3 on CPU).")
flags.DEFINE_float("burst_ms", 2.0, "tbf's bucket, in milliseconds at the "
                   "rate: what may leave at once above the rate. Less loses "
                   "rate to the timer's lateness (a 64 KB bucket gave 0.67 "
                   "Gbit/s of TCP at 1 Gbit/s here).")
flags.DEFINE_string("out", None, "Where to write every time and the fits, "
                    "as JSON.")


def run(hosts: simulated_hosts.SimulatedHosts, link: str, controller: str,
        dtype: str) -> dict:
  """One launch: rank 0's times per size, and its controller and cores."""
  hosts.shape(link, FLAGS.burst_ms)
  command = [
      interleaved.HOROVODRUN, f"--{controller}", "-np", str(len(hosts.names)),
      "-H", ",".join(f"{name}:1" for name in hosts.names),
      "--ssh-port", str(hosts.ssh_port),
      "--ssh-identity-file", hosts.ssh_key,
      "--network-interface", hosts.interface,
      interleaved.PYTHON, "-m", "bench.allreduce_worker",
      f"--sizes={','.join(FLAGS.sizes)}", f"--iterations={FLAGS.iterations}",
      f"--dtype={dtype}"]
  env = interleaved.engine_env(
      HOROVOD_CYCLE_TIME=str(FLAGS.cycle_time_ms))
  result = hosts.run(command, env=env)
  if result.returncode:
    # Once more: on a shared machine another job's set-up can rewrite the
    # venv under a run (a package missing for a moment).
    print(f"{link}, {controller}, {dtype} failed (exit {result.returncode}); "
          f"once more:\n{(result.stdout + result.stderr)[-1000:]}", flush=True)
    result = hosts.run(command, env=env)
  if result.returncode:
    sys.exit(f"{link}, {controller}, {dtype}: {' '.join(command)} failed "
             f"(exit {result.returncode}):\n"
             f"{(result.stdout + result.stderr)[-3000:]}")
  # horovodrun prefixes each line with the rank: `[0]<stdout>:ALLREDUCE`.
  lines = [json.JSONDecoder().raw_decode(line.split("ALLREDUCE ", 1)[1])[0]
           for line in result.stdout.splitlines() if "ALLREDUCE " in line]
  *sizes, about = lines
  if about["controller"] != controller:
    sys.exit(f"asked for {controller}, Horovod ran {about['controller']}")
  return {**about, "times": {str(s["bytes"]): s["seconds"] for s in sizes}}


def summarize(link: str, controller: str, dtype: str,
              runs: list[dict]) -> dict:
  """Per size, the median over the runs of each run's median time, and the
  figures of it; the ring model fitted over the sizes."""
  processes = runs[0]["processes"]
  rate = shaped_links.link_rate(link)
  sizes = []
  for nbytes in map(int, FLAGS.sizes):
    medians = [statistics.median(r["times"][str(nbytes)]) for r in runs]
    seconds = statistics.median(medians)
    bus = ring_allreduce.busbw(nbytes, seconds, processes)
    sizes.append({
        "bytes": nbytes, "seconds": seconds, "run_medians": medians,
        "algbw": ring_allreduce.algbw(nbytes, seconds), "busbw": bus,
        "busbw_per_run": [ring_allreduce.busbw(nbytes, s, processes)
                          for s in medians],
        "of_rate": None if rate is None else bus * 8 / rate})
  try:
    fitted = ring_allreduce.fit([s["bytes"] for s in sizes],
                                [s["seconds"] for s in sizes], processes)
  except ValueError as e:
    print(f"{link}, {controller}, {dtype}: no fit: {e}")
    fitted = scaling.Link(latency=float("nan"), bandwidth=float("nan"))
  return {"link": link, "controller": controller, "dtype": dtype,
          "rate_bits": rate,
          "burst_bytes": (None if rate is None else
                          shaped_links.burst_bytes(rate, FLAGS.burst_ms)),
          "cycle_time_ms": runs[0]["cycle_time_ms"],
          "processes": processes, "cores": [r["cores"] for r in runs],
          "sizes": sizes, "alpha": fitted.latency, "beta": fitted.bandwidth,
          "latency": sizes[0]["seconds"], "bandwidth": sizes[-1]["busbw"]}


def print_summary(summary: dict) -> None:
  rate = summary["rate_bits"]
  print(f"\n{summary['link']}, {summary['controller']}, {summary['dtype']} "
        f"({summary['processes']} hosts, cores {summary['cores'][0]}): "
        f"alpha {summary['alpha'] * 1e6:.0f} us, beta "
        f"{summary['beta'] * 8 / 1e9:.2f} Gbit/s")
  print("| bytes | time, ms | algbw, GB/s | busbw, GB/s | busbw, Gbit/s "
        "| of the rate | busbw by run, Gbit/s |")
  print("|---:|---:|---:|---:|---:|---:|---|")
  for s in summary["sizes"]:
    of_rate = "" if rate is None else f"{s['of_rate']:.0%}"
    print(f"| {s['bytes']} | {s['seconds'] * 1e3:.3f} | "
          f"{s['algbw'] / 1e9:.3f} | {s['busbw'] / 1e9:.3f} | "
          f"{s['busbw'] * 8 / 1e9:.2f} | {of_rate} | "
          + " ".join(f"{b * 8 / 1e9:.2f}" for b in s["busbw_per_run"])
          + " |")


def machine() -> dict:
  return {"cpu": interleaved.cpu(), "cores": os.cpu_count(),
          "kernel": os.uname().release}


def _line(name: str, round_: int, found: dict) -> str:
  gbits = [ring_allreduce.busbw(int(b), statistics.median(t),
                                found["processes"]) * 8 / 1e9
           for b, t in found["times"].items()]
  return (f"  round {round_ + 1} {name}: busbw Gbit/s "
          + " ".join(f"{g:.2f}" for g in gbits)
          + f" (load {interleaved.load():.2f})")


def main(argv):
  del argv
  reason = simulated_hosts.unavailable()
  if reason:
    sys.exit(f"allreduce_link: {reason}")
  for link in FLAGS.links:
    shaped_links.link_rate(link)  # a bad entry: one line, before any run
  for dtype in FLAGS.dtypes:
    if dtype not in ("float32", "float16"):
      sys.exit(f"allreduce_link: --dtypes={dtype}: float32 or float16")
  configs = {f"{link} {c} {d}": (link, c, d) for link in FLAGS.links
             for c in FLAGS.controllers for d in FLAGS.dtypes}
  about = {"machine": machine(), "command": sys.argv,
           "load_before": interleaved.load(), "started": time.time()}
  print(f"{about['machine']['cpu']}, {about['machine']['cores']} cores; "
        f"load {about['load_before']:.2f}", flush=True)
  with simulated_hosts.SimulatedHosts(FLAGS.hosts) as hosts:
    found = interleaved.rounds(
        list(configs), lambda name, _: run(hosts, *configs[name]),
        FLAGS.repeats, show=_line)
  runs = {configs[name]: found_by_round
          for name, found_by_round in found.items()}
  about["load_after"] = interleaved.load()
  summaries = [summarize(*config, runs[config]) for config in runs]
  for summary in summaries:
    print_summary(summary)
  print(f"\nload average (1 min) {about['load_before']:.2f} before, "
        f"{about['load_after']:.2f} after")
  if FLAGS.out:
    os.makedirs(os.path.dirname(os.path.abspath(FLAGS.out)), exist_ok=True)
    with open(FLAGS.out, "w") as f:
      json.dump({**about, "links": summaries,
                 "runs": [{"link": l, "controller": c, "round": i + 1, **r}
                          for (l, c, _), rs in runs.items()
                          for i, r in enumerate(rs)]}, f, indent=1)
    print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
  app.run(main)
