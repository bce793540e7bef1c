#!/usr/bin/env bash
# The README's demo: sets up (packages, build, the package installed into .venv), cuts a small
# dataset of real photos (Debian's mate-backgrounds), then serves it to 2 collocated consumers
# and, side by side, runs 2 independent torch DataLoaders on the same files; prints throughput
# and the CPU cores each keeps busy.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV=${VENV:-.venv}
"$VENV/bin/batchcast" bench --data data/demo --classes 10 --per-class 30 \
  --regimes none:160:2 --peers dataloader,batchcast-cpu --device cpu --batch-size 32 \
  --seconds 4 --out runs/demo "$@"
echo "demo: results in runs/demo (results.md, results.json, results.png)"
