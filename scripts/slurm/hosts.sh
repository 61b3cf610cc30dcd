#!/usr/bin/env bash
# Prints the hosts of the current SLURM job with their task counts, in
# horovodrun's -H form ("node1:4,node2:4") or, with --hostfile, as a
# hostfile ("node1 slots=4" per line, for horovodrun --hostfile or mpirun).
#
# From SLURM's environment: SLURM_JOB_NODELIST (expanded by
# `scontrol show hostnames`) and SLURM_TASKS_PER_NODE, whose "4(x2),3" means
# 4 tasks on each of the first two nodes and 3 on the third.
set -euo pipefail
: "${SLURM_JOB_NODELIST:?not inside a SLURM job (no SLURM_JOB_NODELIST)}"
: "${SLURM_TASKS_PER_NODE:?SLURM_TASKS_PER_NODE is not set: pass --ntasks-per-node to sbatch}"

mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
slots=()
IFS=, read -ra groups <<< "$SLURM_TASKS_PER_NODE"
for group in "${groups[@]}"; do
  if [[ $group =~ ^([0-9]+)\(x([0-9]+)\)$ ]]; then
    for ((i = 0; i < BASH_REMATCH[2]; i++)); do slots+=("${BASH_REMATCH[1]}"); done
  elif [[ $group =~ ^[0-9]+$ ]]; then
    slots+=("$group")
  else
    echo "hosts.sh: cannot read SLURM_TASKS_PER_NODE=$SLURM_TASKS_PER_NODE" >&2
    exit 2
  fi
done
if [ "${#nodes[@]}" -ne "${#slots[@]}" ]; then
  echo "hosts.sh: ${#nodes[@]} nodes but ${#slots[@]} task counts" \
       "(SLURM_TASKS_PER_NODE=$SLURM_TASKS_PER_NODE)" >&2
  exit 2
fi

for i in "${!nodes[@]}"; do
  if [ "${1:-}" = --hostfile ]; then
    echo "${nodes[$i]} slots=${slots[$i]}"
  else
    printf '%s%s:%s' "$([ "$i" -gt 0 ] && echo ,)" "${nodes[$i]}" "${slots[$i]}"
  fi
done
[ "${1:-}" = --hostfile ] || echo
