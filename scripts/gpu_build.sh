#!/usr/bin/env bash
# Builds batchcast with CUDA on a GPU node that has no apt and no network (e.g. the device
# machine): unpacks the packages of scripts/make_gpu_bundle.sh (.bundle/debs) into
# .bundle/prefix, configures build-gpu/ with CUDA on against that prefix, and builds (the bundle's
# jconfig.h goes first on the include path: the node's own libjpeg8 headers must not mix with the
# bundle's libjpeg62). The Python
# module uses Debian's pybind11 CMake files with the newer pybind11 headers torch ships (Debian's
# 2.10 headers predate Python 3.12). Prints the LD_LIBRARY_PATH to run with, also written to
# build-gpu/gpu_env.sh (source it). Idempotent; BUILD_DIR and BATCHCAST_CMAKE_ARGS
# override the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PREFIX=$ROOT/.bundle/prefix
BUILD_DIR=${BUILD_DIR:-build-gpu}
LIB=$PREFIX/usr/lib/x86_64-linux-gnu

if [[ ! -f $PREFIX/.unpacked ]]; then
  rm -rf "$PREFIX"
  mkdir -p "$PREFIX"
  for deb in .bundle/debs/*.deb; do dpkg-deb -x "$deb" "$PREFIX"; done
  for deb in .bundle/debs/fallback/*.deb; do
    # Unpacked only when the node has none of its shared libraries.
    libs=$(dpkg-deb -c "$deb" | grep -o '[^/ ]*\.so\.[0-9][^ ]*' | sort -u || true)
    have=0
    for l in $libs; do ldconfig -p | grep -q " $l " && have=1; done
    if ((have == 0)); then
      echo "gpu_build: the node lacks $(basename "$deb" | cut -d_ -f1): using the bundle's"
      dpkg-deb -x "$deb" "$PREFIX"
    fi
  done
  torch_pybind=$(python3 -c 'import torch.utils.cpp_extension as c, os
for p in c.include_paths():
    if os.path.exists(os.path.join(p, "pybind11", "pybind11.h")): print(os.path.join(p, "pybind11")); break' 2>/dev/null || true)
  if [[ -n $torch_pybind ]]; then
    echo "gpu_build: pybind11 headers from torch ($torch_pybind)"
    rm -rf "$PREFIX/usr/include/pybind11"
    ln -s "$torch_pybind" "$PREFIX/usr/include/pybind11"
  fi
  touch "$PREFIX/.unpacked"
fi

export LD_LIBRARY_PATH=$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$BUILD_DIR"
echo "export LD_LIBRARY_PATH=$LIB\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" >"$BUILD_DIR/gpu_env.sh"
export CUDACXX=${CUDACXX:-/usr/local/cuda/bin/nvcc}
cmake -S . -B "$BUILD_DIR" -DBATCHCAST_CUDA=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_PREFIX_PATH="$PREFIX/usr" -DCMAKE_LIBRARY_PATH="$LIB" \
  -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$LIB" -DCMAKE_SHARED_LINKER_FLAGS="-Wl,-rpath-link,$LIB" \
  -DCMAKE_CXX_FLAGS="-isystem $PREFIX/usr/include/x86_64-linux-gnu" \
  -Dpybind11_DIR="$PREFIX/usr/lib/cmake/pybind11" -DPython_EXECUTABLE="$(command -v python3)" \
  ${BATCHCAST_CMAKE_ARGS:-}
# -k: a target that fails does not stop the others; the exit status says whether all built.
# (decoders_test, which compares with OpenCV imgcodecs, is left out where imgcodecs is absent, as
# in the bundle: its dependencies are large.)
status=0
cmake --build "$BUILD_DIR" -j"$(nproc)" -- -k || status=$?
echo "gpu_build: built $BUILD_DIR. Run with: export LD_LIBRARY_PATH=$LIB:\$LD_LIBRARY_PATH" \
  "(or: source $BUILD_DIR/gpu_env.sh)"
exit $status
