r"""The scaling model (engine/scaling.py) against measured allreduce times
at more hosts: the link fitted at the fewest hosts predicts the others.

  for n in 2 3 4; do
    .venv/bin/python -m bench.allreduce_link --hosts=$n --links=1gbit \
        --controllers=gloo --sizes=1048576,4194304,16777216,67108864 \
        --repeats=2 --out=bench/out/scaling_check_h$n.json
  done
  .venv/bin/python -m bench.scaling_check bench/out/scaling_check_h*.json

Each FILE is bench.allreduce_link's --out at one number of hosts. The
fewest hosts' ring fit (alpha, beta) predicts every size at every other
host count with engine.scaling.ring_allreduce_seconds. For each (hosts,
size) this prints the measured median time, the prediction and their
ratio.
"""
import json
import sys

from absl import app

from engine import scaling


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
        print(f"| {count} | {size['bytes']} | {size['seconds'] * 1e3:.1f} | "
              f"{predicted * 1e3:.1f} | {size['seconds'] / predicted:.2f} |")


if __name__ == "__main__":
  app.run(main)
