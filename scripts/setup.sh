#!/usr/bin/env bash
# Sets batchcast up on a fresh Debian 12 machine (run as root): installs the Debian packages the
# build, the tests and the demo need (skipping those already there), configures and builds into
# build/ (what ctest runs), then installs the Python package from that same build into the venv
# .venv/ (--system-site-packages over /usr/bin/python3, for Debian's torch): setup.py reuses
# build/ (BATCHCAST_BUILD_DIR), so nothing is compiled twice. Idempotent. CUDA is compiled in
# when /usr/local/cuda/bin/nvcc works. BUILD_DIR, VENV and BATCHCAST_CMAKE_ARGS override.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  cmake g++ make pkg-config libzmq3-dev cppzmq-dev libturbojpeg0-dev libpng-dev libtiff-dev
  libwebp-dev libopencv-core-dev libopencv-imgproc-dev libopencv-imgcodecs-dev libboost-dev
  pybind11-dev python3-dev
  libgtest-dev libgmock-dev libdlpack-dev libspdlog-dev libcli11-dev nlohmann-json3-dev
  libbenchmark-dev python3-torch python3-torchvision python3-numpy python3-pytest
  python3-matplotlib python3-pil python3-venv python3-pip python3-setuptools python3-wheel
  clang libfuzzer-14-dev mate-backgrounds procps python3-optuna
)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
fi

if [[ -x /usr/local/cuda/bin/nvcc && -z "${CUDACXX:-}" ]]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DPython_EXECUTABLE=/usr/bin/python3 -DPYTHON_EXECUTABLE=/usr/bin/python3 \
  ${BATCHCAST_CMAKE_ARGS:-} >"$BUILD_DIR.configure.log" 2>&1 || { cat "$BUILD_DIR.configure.log"; exit 1; }
cmake --build "$BUILD_DIR" -j"$(nproc)"

VENV=${VENV:-.venv}
[[ -x $VENV/bin/python ]] || /usr/bin/python3 -m venv --system-site-packages "$VENV"
BATCHCAST_BUILD_DIR="$PWD/$BUILD_DIR" "$VENV/bin/python" -m pip install -q --no-build-isolation \
  --no-index "$PWD"
