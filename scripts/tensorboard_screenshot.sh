#!/usr/bin/env bash
# Takes docs/watching.md's screenshot of TensorBoard (docs/tensorboard.png): TensorBoard
# on LOGDIR, photographed by headless Chromium (Debian's `chromium` package:
# apt-get install chromium), on the Scalars dashboard filtered to the epoch
# curves, so each card shows train and validation overlaid.
#
#   scripts/tensorboard_screenshot.sh LOGDIR [OUT.png]
set -euo pipefail
logdir=${1:?usage: $0 LOGDIR [OUT.png]}
out=${2:-docs/tensorboard.png}
port=6123
cd "$(dirname "$0")/.."
.venv/bin/tensorboard --logdir "$logdir" --host 127.0.0.1 --port "$port" \
    2>/dev/null &
server=$!
trap 'kill $server' EXIT
until curl -sf "http://127.0.0.1:$port/data/runs" | grep -q train; do
  sleep 1
done
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars \
    --window-size=1500,900 --virtual-time-budget=20000 \
    --screenshot="$out" \
    "http://127.0.0.1:$port/#scalars&tagFilter=epoch_(loss%7Caccuracy)&_smoothingWeight=0"
echo "wrote $out"
