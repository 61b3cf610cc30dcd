#!/usr/bin/env bash
# Training throughput of 2 processes on this host's cores for CPU thread and
# binding settings: the measurement behind the defaults in
# engine/distributed.py (init, cpu_threads, bind_to_own_cores); see BUILD.md.
# Usage: bash bench/cpu_threads.sh [repeats]   (about 1 minute per run)
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-2}
export TF_CPP_MIN_LOG_LEVEL=2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "bind  intra inter  img/s of epochs 2 and 3, per repeat"
for setting in "true 1 1" "true 2 1" "true 1 2" "false 1 1" "false 2 1"; do
  set -- $setting
  line=$(printf "%-5s %-5s %-5s " "$1" "$2" "$3")
  for r in $(seq "$repeats"); do
    dir="$out/$1-$2-$3-$r"
    .venv/bin/horovodrun -np 2 .venv/bin/python -m engine.train \
      --epochs=3 --steps_per_epoch=150 --model_dir="$dir" --bind_cpus="$1" \
      --intra_op_threads="$2" --inter_op_threads="$3" >/dev/null 2>&1
    line+=$(.venv/bin/python -c "
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][1:]
print(' '.join(f\"{r['images_per_sec']:.0f}\" for r in rows), end='  ')" \
      "$dir/metrics.jsonl")
  done
  echo "$line"
done
