#!/usr/bin/env bash
# Start `batchcast serve` by hand and attach two consumers (Python Loaders) to it.
#   bash examples/standalone_server.sh [DATA_DIR]
# Without DATA_DIR a tiny ImageFolder is made with `batchcast make-dataset`.
set -euo pipefail
cd "$(dirname "$0")/.."
# The environment where batchcast is installed is the one on PATH (`batchcast` and its `python`).
BIN=batchcast
PYTHON=python
EP=ipc:///tmp/batchcast-example-$$.sock
DATA=${1:-}
if [[ -z "$DATA" ]]; then
  DATA=$(mktemp -d)/data
  "$BIN" make-dataset --out "$DATA" --classes 4 --per-class 8 >/dev/null
fi
# The model's output width: one class per folder, as ImageFolder counts them.
CLASSES=$(find "$DATA" -mindepth 1 -maxdepth 1 -type d | wc -l)
# Two consumers, 2 epochs; the server exits by itself once both got the last epoch.
"$BIN" serve --data "$DATA" --endpoint "$EP" --batch-size 16 --image-size 32 --epochs 2 \
  --min-consumers 2 --workers 2 --status-interval 0 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for lr in 0.01 0.05; do
  "$PYTHON" examples/train_shared.py --endpoint "$EP" --lr $lr \
    --epochs 2 --batch-size 8 --classes "$CLASSES" &
done
wait %2 %3
wait $SERVER
echo "server exited with $?"
