#!/usr/bin/env bash
# The test command of README.md: sets up (packages, the build, the package installed into
# .venv from that build), then runs the C++ suite (ctest, which also builds a C++ project
# against an install of the library: tests/cmake_consumer/) and the Python suite (pytest with
# the venv's python, against the INSTALLED package: no PYTHONPATH). GPU tests skip themselves
# with a message where no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
VENV=${VENV:-.venv}
(cd "$BUILD_DIR" && ctest --output-on-failure --timeout 300 -j2 ${CTEST_ARGS:-})
"$VENV/bin/python" -m pytest -q tests/python ${PYTEST_ARGS:-}
