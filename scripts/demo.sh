#!/usr/bin/env bash
# The README's demo: sets up (packages, build, the package installed into .venv), cuts a small
# dataset of real photos (Debian's mate-backgrounds), then serves it to 2 collocated consumers
# and, side by side, runs 2 independent torch DataLoaders on the same files; prints throughput
# and the CPU saved.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV=${VENV:-.venv}
"$VENV/bin/batchcast" bench --data data/demo --classes 10 --per-class 30 \
  --trainers 2 --models none --steps 40 --warmup 5 --batch-size 32 --image-size 160 --workers 1 \
  --out runs/demo "$@"
echo "demo: results in runs/demo; plots: $VENV/bin/batchcast report runs/demo/shared-none-N2 runs/demo/baseline-none-N2"
