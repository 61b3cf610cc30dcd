r"""The scaling model (engine/scaling.py) against measured allreduce times
at more hosts: the link fitted at the fewest hosts predicts the others.

  for n in 2 3 4; do
    .venv/bin/python -m bench.allreduce_link --hosts=$n --links=1gbit \
        --controllers=gloo --sizes=1048576,4194304,16777216,67108864 \
        --repeats=2 --out=bench/out/scaling_check_h$n.json
  done
  .venv/bin/python -m bench.scaling_check bench/out/scaling_check_h*.json \
      --plot=docs/scaling_model.png

Each FILE is bench.allreduce_link's --out at one number of hosts. The
fewest hosts' ring fit (alpha, beta) predicts every size at every other
host count with engine.scaling.ring_allreduce_seconds. For each (hosts,
size) this prints the measured median time, the prediction and their
ratio.
"""
import json
import sys

from absl import app
from absl import flags

from engine import scaling

FLAGS = flags.FLAGS
flags.DEFINE_string("plot", None, "A PNG to draw into.")
# bench/step_split.py's figures (bench/RESULTS.md): compute per step and
# the gradients' bytes.
WORKLOADS = {"ResNet-50, 32x32, batch 8": (0.26, 94.4e6),
             "CosmoFlow mini, batch 16": (0.12, 0.906e6)}
LINKS = {"1 Gbit/s": scaling.Link.of(1, 20),
         "10 Gbit/s": scaling.Link.of(10, 20)}
NODES = [2 ** i for i in range(1, 10)]


def main(argv):
  files = argv[1:]
  if not files:
    sys.exit("scaling_check: give bench.allreduce_link --out files, one per "
             "number of hosts")
  found = {}
  for path in files:
    with open(path) as f:
      result = json.load(f)
    for link in result["links"]:
      found[(link["link"], link["controller"], link["processes"])] = link
  checks = []
  for link_name, controller in sorted({key[:2] for key in found}):
    counts = sorted(n for l, c, n in found if (l, c) == (link_name,
                                                          controller))
    base = found[(link_name, controller, counts[0])]
    link = scaling.Link(latency=base["alpha"], bandwidth=base["beta"])
    print(f"{link_name}, {controller}: fitted at {counts[0]} hosts, alpha "
          f"{link.latency * 1e6:.0f} us, beta "
          f"{link.bandwidth * 8 / 1e9:.3f} Gbit/s")
    print("| hosts | bytes | measured, ms | predicted, ms | measured / "
          "predicted |")
    print("|---:|---:|---:|---:|---:|")
    for count in counts:
      for size in found[(link_name, controller, count)]["sizes"]:
        predicted = scaling.ring_allreduce_seconds(size["bytes"], count, link)
        checks.append((count, size["bytes"], size["seconds"], predicted))
        print(f"| {count} | {size['bytes']} | {size['seconds'] * 1e3:.1f} | "
              f"{predicted * 1e3:.1f} | {size['seconds'] / predicted:.2f} |")


  if FLAGS.plot:
    plot(checks, FLAGS.plot)
    print(f"wrote {FLAGS.plot}")


def plot(checks, path: str) -> None:
  """Measured against predicted allreduce times (left); the predicted
  efficiency without overlap on more nodes (right)."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure

  figure = Figure(figsize=(11, 4.5), dpi=100)
  FigureCanvasAgg(figure)
  left, right = figure.subplots(1, 2)
  for count in sorted({c[0] for c in checks}):
    points = [c for c in checks if c[0] == count]
    left.loglog([c[1] / 1e6 for c in points], [c[2] * 1e3 for c in points],
                "o", label=f"{count} hosts, measured")
    left.loglog([c[1] / 1e6 for c in points], [c[3] * 1e3 for c in points],
                "-", color=left.lines[-1].get_color(),
                label=f"{count} hosts, predicted")
  left.set(xlabel="message, MB", ylabel="allreduce, ms",
           title="1 Gbit/s, Gloo: fitted at 2 hosts")
  left.legend(fontsize=8)
  for name, (compute, nbytes) in WORKLOADS.items():
    for link_name, link in LINKS.items():
      efficiency = [p.efficiency_no_overlap for p in scaling.predict(
          compute, nbytes, link, NODES)]
      right.semilogx(NODES, [e * 100 for e in efficiency], marker=".",
                     label=f"{name}, {link_name}")
  right.set(xlabel="nodes (one process each)", ylabel="efficiency, %",
            ylim=(0, 105), title="predicted, no overlap, 20 us latency")
  right.set_xticks(NODES, [str(n) for n in NODES])
  right.legend(fontsize=8)
  figure.tight_layout()
  figure.savefig(path)


if __name__ == "__main__":
  app.run(main)
