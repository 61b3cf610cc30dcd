#!/usr/bin/env bash
# The NERSC tutorial's scaling exercise as one command: the same recipe on
# 1, 2, 4, ... nodes, one scripts/slurm/train.sbatch job per count, one
# after the other (a dependency chain: they do not compete for nodes or
# the file system), then engine.runs' table of their speeds (img/s,
# speedup and efficiency against the fewest nodes, seconds to --target)
# and a PNG of their validation curves. From the repository root:
#
#   scripts/slurm/scaling.sh --nodes=1,2,4,8 --out=scaling/resnet50 \
#       --sbatch="--ntasks-per-node=4 --gpus-per-node=4" \
#       -- --flagfile=flags/imagenet_resnet50.cfg --epochs=1
#
#   --nodes=N,N,...  node counts, in the order they run (default 1,2,4,8)
#   --out=DIR        each run's model_dir is DIR/nodes_N and its output
#                    DIR/nodes_N.out; the table goes to DIR/scaling.txt and
#                    the plot to DIR/scaling.png (default scaling/<time>)
#   --sbatch="..."   sbatch options for every job (tasks per node, GPUs,
#                    time, account); LAUNCHER and IFACE reach train.sbatch
#                    through the environment, as with sbatch itself
#   --wait           wait for the table and print it
#
# The flags after -- are the engine's, the same for every job; --model_dir
# is set here.
set -euo pipefail
cd "$(dirname "$0")/../.."
fail() {
  echo "scaling.sh: $*" >&2
  exit 2
}

nodes=1,2,4,8
out=scaling/$(date +%Y%m%d-%H%M%S)
wait=no
sbatch_options=()
while [ $# -gt 0 ]; do
  case $1 in
    --nodes=*) nodes=${1#*=} ;;
    --out=*) out=${1#*=} ;;
    --sbatch=*) read -ra sbatch_options <<< "${1#*=}" ;;
    --wait) wait=yes ;;
    --) shift; break ;;
    *) fail "$1 is not an option of this script; put the engine's flags" \
            "after --" ;;
  esac
  shift
done
[[ $nodes =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] ||
  fail "--nodes=$nodes: give node counts separated by commas, e.g. 1,2,4"
command -v sbatch >/dev/null || fail "no sbatch here: run it on a SLURM" \
  "login node"
mkdir -p "$out"
out=$(cd "$out" && pwd)

after=()
for count in ${nodes//,/ }; do
  job=$(sbatch --parsable -N "$count" --job-name="scaling-$count" \
        --output="$out/nodes_$count.out" "${after[@]}" \
        "${sbatch_options[@]}" scripts/slurm/train.sbatch "$@" \
        --model_dir="$out/nodes_$count")
  job=${job%%;*}
  echo "[scaling.sh] $count node(s): job $job, $out/nodes_$count" >&2
  after=(--dependency=afterany:"$job")
done
# The table is made by a job of its own once the last run has ended
# (however it ended: a failed run shows its state in the table).
table=$(sbatch --parsable -N 1 --ntasks=1 --job-name=scaling-table \
        --output="$out/scaling.txt" "${after[@]}" --wrap \
        "$PWD/.venv/bin/python -m engine.runs --scaling \
         --plot=$out/scaling.png $out")
table=${table%%;*}
echo "[scaling.sh] the table: job $table, into $out/scaling.txt" >&2
if [ $wait = yes ]; then
  while squeue --noheader --jobs="$table" --states=PD,R,CG 2>/dev/null |
      grep -q .; do
    sleep 2
  done
  cat "$out/scaling.txt"
fi
