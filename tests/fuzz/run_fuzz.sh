#!/usr/bin/env bash
# Builds every libFuzzer target (tests/fuzz/fuzz_*) with clang + ASan/UBSan in build-fuzz/ and runs
# each for the given seconds, seeded from tests/fuzz/corpus/<name without fuzz_>/.
#   tests/fuzz/run_fuzz.sh [seconds per target, default 60]
# New inputs go to build-fuzz/corpus/<name>/ (not into the repository); crashes to
# build-fuzz/artifacts/. Exits non-zero if any target finds a crash.
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_PER_TARGET=${1:-60}
BUILD=build-fuzz
FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"

CC=${CC:-clang} CXX=${CXX:-clang++} cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DBATCHCAST_FUZZ=ON -DBUILD_TESTING=ON -DBATCHCAST_PYTHON=OFF -DBATCHCAST_BENCH=OFF \
  -DBATCHCAST_CUDA=OFF -DCMAKE_C_FLAGS="$FLAGS" -DCMAKE_CXX_FLAGS="$FLAGS" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target fuzz_targets

mkdir -p "$BUILD/artifacts"
status=0
for target in "$BUILD"/tests/fuzz/fuzz_*; do
  [[ -x "$target" && -f "$target" ]] || continue
  name=$(basename "$target")
  seeds="tests/fuzz/corpus/${name#fuzz_}"
  work="$BUILD/corpus/${name#fuzz_}"
  mkdir -p "$work"
  [[ -d "$seeds" ]] || { echo "run_fuzz: no seed corpus $seeds for $name" >&2; seeds=""; }
  echo "== $name: ${SECONDS_PER_TARGET}s, seeds from ${seeds:-nothing}"
  # -close_fd_mask=2: the target's own stderr (OpenCV prints a line for every input it rejects,
  # megabytes a second) is closed; libFuzzer's lines and sanitizer reports keep a duplicate.
  if ! "$target" -max_total_time="$SECONDS_PER_TARGET" -timeout=10 -rss_limit_mb=2048 \
      -close_fd_mask=2 -print_final_stats=1 -artifact_prefix="$BUILD/artifacts/$name-" "$work" $seeds; then
    echo "run_fuzz: $name FAILED (see $BUILD/artifacts/)" >&2
    status=1
  fi
done
exit $status
