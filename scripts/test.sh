#!/usr/bin/env bash
# The test command of README.md: sets up (packages + build), then runs the C++ suite (ctest) and
# the Python suite (pytest, with Debian's /usr/bin/python3 and its torch). GPU tests skip
# themselves with a message where no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
(cd "$BUILD_DIR" && ctest --output-on-failure --timeout 300 -j2 ${CTEST_ARGS:-})
export BATCHCAST_BUILD_DIR="$PWD/$BUILD_DIR"
PYTHONPATH="$PWD/python" /usr/bin/python3 -m pytest -q tests/python ${PYTEST_ARGS:-}
