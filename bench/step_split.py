r"""The engine's train step across two simulated hosts on a shaped link,
split into compute, communication and their overlap (Horovod's timeline).

  .venv/bin/python -m bench.step_split --links=1gbit --repeats=2 \
      --link_fits=bench/out/allreduce_link.json

As root, on tests/simulated_hosts.py's hosts, links shaped as
bench/allreduce_link.py shapes them: `engine.train` on --hosts hosts, one
process each, pinned to its host's core (bench/host_core.py), with
HOROVOD_TIMELINE set, for --steps steps of each --workloads:

  resnet50   ResNet-50 on synthetic 32x32 images, 10 classes, batch 8
  cosmoflow  flags/cosmoflow_mini.cfg on 128 generated 32^3 x 4 volumes
             (engine/tools/make_volumes.py, into --out_dir once), batch 16

Each run's timeline gives every step's compute, exposed and overlapped
communication and transfer (bench/timeline_split.py); the steps after the
first --skip are kept, and their medians printed. With --link_fits (the
JSON of bench/allreduce_link.py), the ring model's time for the step's
bytes on that link and controller is printed beside them. Each round runs
every (workload, link, controller) once, the order reversed every other
round.
"""
import json
import os
import shutil
import statistics
import sys

from absl import app
from absl import flags

from bench import interleaved
from bench import shaped_links
from bench import timeline_split
from engine import scaling
from engine.compute import communication
from tests import simulated_hosts

FLAGS = flags.FLAGS
flags.DEFINE_list("workloads", ["resnet50", "cosmoflow"], "What to train.")
flags.DEFINE_list("links", ["1gbit"], "As bench/allreduce_link.py's.")
flags.DEFINE_list("controllers", ["gloo"], "Horovod's controllers.")
flags.DEFINE_list("compressions", ["none"], "--gradient_compression of the "
                  "runs: none, fp16, auto (measured at the start).")
flags.DEFINE_integer("hosts", 2, "Simulated hosts, one process each.",
                     lower_bound=2)
flags.DEFINE_integer("steps", 16, "Steps per run (one epoch).", lower_bound=4)
flags.DEFINE_integer("skip", 4, "First steps left out (tracing, warm-up).")
flags.DEFINE_integer("repeats", 2, "Rounds.", lower_bound=1)
flags.DEFINE_float("burst_ms", 2.0, "As bench/allreduce_link.py's.")
flags.DEFINE_string("link_fits", None, "bench/allreduce_link.py's --out.")
flags.DEFINE_string("out_dir", os.path.join(interleaved.REPO, "bench", "out",
                                            "step_split"),
                    "Runs, timelines and the generated volumes.")

WORKLOADS = {
    "resnet50": ["--dataset=synthetic", "--image_size=32", "--num_classes=10",
                 "--train_examples=1024", "--test_examples=16",
                 "--model=resnet50", "--batch_size=8"],
    # One epoch: no warmup, a constant rate (the schedule's check).
    "cosmoflow": ["--flagfile=flags/cosmoflow_mini.cfg", "--stage_dir=",
                  "--batch_size=16", "--warmup_epochs=0",
                  "--lr_schedule=constant"],
}


def volumes() -> str:
  """CosmoFlow's volumes for the runs, generated once."""
  path = os.path.join(FLAGS.out_dir, "volumes")
  if not os.path.isdir(path):
    interleaved.launch([interleaved.PYTHON, "-m", "engine.tools.make_volumes",
                        f"--output_dir={path}", "--size=32", "--train=128",
                        "--validation=32"])
  return path


def run(hosts, workload: str, link: str, controller: str, compression: str,
        round_: int):
  shaped_links.shape(hosts, link, FLAGS.burst_ms)
  name = f"{workload}-{link}-{controller}-{compression}-r{round_}"
  model_dir = os.path.join(FLAGS.out_dir, name)
  shutil.rmtree(model_dir, ignore_errors=True)
  os.makedirs(model_dir)
  timeline = os.path.join(model_dir, "horovod_timeline.json")
  engine = [*WORKLOADS[workload], "--epochs=1",
            f"--steps_per_epoch={FLAGS.steps}", "--mixed_precision=none",
            f"--gradient_compression={compression}", "--progress=none",
            f"--model_dir={model_dir}"]
  if workload == "cosmoflow":
    engine.append(f"--data_dir={volumes()}")
  command = [
      interleaved.HOROVODRUN, f"--{controller}", "-np", str(len(hosts.names)),
      "-H", ",".join(f"{n}:1" for n in hosts.names),
      "--ssh-port", str(hosts.ssh_port), "--ssh-identity-file", hosts.ssh_key,
      "--network-interface", hosts.interface,
      interleaved.PYTHON, "-m", "bench.host_core", "engine.train", *engine]
  result = hosts.run(command, env=interleaved.engine_env(
      HOROVOD_TIMELINE=timeline), timeout=1200)
  if result.returncode:
    sys.exit(f"{name}: {' '.join(command)} failed (exit "
             f"{result.returncode}):\n"
             f"{(result.stdout + result.stderr)[-3000:]}")
  if compression == "auto":
    chosen = communication.recorded(model_dir)
    print(f"  {name}: auto chose {chosen['compression']} "
          f"({chosen.get('images_per_sec')})", flush=True)
  split = timeline_split.steps(timeline_split.spans(
      timeline_split.load(timeline)))
  return split[FLAGS.skip:]


def predicted(fits, link: str, controller: str, nbytes: int,
              processes: int):
  for found in fits or []:
    if found["link"] == link and found["controller"] == controller:
      return scaling.ring_allreduce_seconds(nbytes, processes, scaling.Link(
          latency=found["alpha"], bandwidth=found["beta"]))
  return None


def main(argv):
  del argv
  reason = simulated_hosts.unavailable()
  if reason:
    sys.exit(f"step_split: {reason}")
  fits = None
  if FLAGS.link_fits:
    with open(FLAGS.link_fits) as f:
      fits = json.load(f)["links"]
  configs = [(w, l, c, z) for w in FLAGS.workloads for l in FLAGS.links
             for c in FLAGS.controllers for z in FLAGS.compressions]
  found = {config: [] for config in configs}
  print(f"load {os.getloadavg()[0]:.2f}", flush=True)
  with simulated_hosts.SimulatedHosts(FLAGS.hosts) as hosts:
    for round_ in range(FLAGS.repeats):
      for config in configs[::-1] if round_ % 2 else configs:
        split = run(hosts, *config, round_ + 1)
        found[config].append(timeline_split.medians(split))
        m = found[config][-1]
        print(f"  round {round_ + 1} {' '.join(config)}: step "
              f"{m['step'] * 1e3:.0f} ms, compute {m['compute'] * 1e3:.0f}, "
              f"exposed {m['exposed'] * 1e3:.0f} (transfer "
              f"{m['transfer'] * 1e3:.0f}), overlapped "
              f"{m['overlapped'] * 1e3:.0f}; {m['bytes'] / 1e6:.1f} MB "
              f"(load {os.getloadavg()[0]:.2f})", flush=True)
  print("\n| workload | link | controller | compression | MB a step | "
        "step, ms | compute "
        "| exposed comm. | of which transfer | overlapped | exposed / step "
        "| ring model, ms |\n|---|---|---|---|---:|---:|---:|---:|---:|---:"
        "|---:|---:|")
  rows = []
  for config, runs in found.items():
    m = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    model = predicted(fits, config[1], config[2], m["bytes"], FLAGS.hosts)
    rows.append({"workload": config[0], "link": config[1],
                 "controller": config[2], "compression": config[3], **m,
                 "model": model,
                 "runs": runs})
    print(f"| {' | '.join(config)} | {m['bytes'] / 1e6:.1f} | "
          f"{m['step'] * 1e3:.0f} | {m['compute'] * 1e3:.0f} | "
          f"{m['exposed'] * 1e3:.0f} | {m['transfer'] * 1e3:.0f} | "
          f"{m['overlapped'] * 1e3:.0f} | {m['exposed'] / m['step']:.0%} | "
          + ("" if model is None else f"{model * 1e3:.0f}") + " |")
  with open(os.path.join(FLAGS.out_dir, "step_split.json"), "w") as f:
    json.dump({"command": sys.argv, "rows": rows,
               "load_after": os.getloadavg()}, f, indent=1)


if __name__ == "__main__":
  app.run(main)
