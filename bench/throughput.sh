#!/usr/bin/env bash
# The throughput benchmark (bench/README.md), from anywhere:
#   bash bench/throughput.sh [--quick] [--repeats=N] [--report=FILE] ...
set -euo pipefail
cd "$(dirname "$0")/.."
export TF_CPP_MIN_LOG_LEVEL=2
exec .venv/bin/python -m bench.throughput "$@"
