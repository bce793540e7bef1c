#!/usr/bin/env bash
# Sanitizer builds of the C++ test suite (no Python module, no benchmarks):
#   build-asan/  BATCHCAST_SANITIZE=address,undefined   ctest without the soak
#   build-tsan/  BATCHCAST_SANITIZE=thread              ctest without the soak, decoders and the
#                                                       forged-release flood (too slow under TSan)
# Any sanitizer report fails the run (halt_on_error / exitcode). Usage:
#   scripts/sanitize.sh [asan|tsan|all]   (default all); CTEST_ARGS adds ctest arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
WHAT=${1:-all}
JOBS=${JOBS:-$(nproc)}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/scripts/tsan.supp}

build() {  # build <dir> <sanitizers>
  # -O1 -g1: what the sanitizers' docs advise for speed, and line tables (file:line in every
  # report's stack) instead of full debug info, which made the ASan+UBSan build 10 minutes.
  cmake -S . -B "$1" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBATCHCAST_SANITIZE="$2" \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
    -DBATCHCAST_PYTHON=OFF -DBATCHCAST_BENCH=OFF -DBATCHCAST_CUDA=OFF >/dev/null
  cmake --build "$1" -j"$JOBS"
}

if [[ $WHAT == asan || $WHAT == all ]]; then
  echo "== ASan+UBSan (build-asan)"
  build build-asan address,undefined
  (cd build-asan && ctest --output-on-failure --timeout 300 -j"$JOBS" -LE soak ${CTEST_ARGS:-})
fi
if [[ $WHAT == tsan || $WHAT == all ]]; then
  echo "== TSan (build-tsan)"
  build build-tsan thread
  # decoders (single-threaded image code, slow under TSan) are covered by the ASan run. The
  # forged-release flood (~100k messages/s) outruns a TSan-instrumented server and stalls its
  # consumers past their timeout; the main and ASan runs cover it.
  (cd build-tsan && ctest --output-on-failure --timeout 300 -j"$JOBS" -LE "soak|decoders" \
     -E "ForgedAndDoubleReleases" ${CTEST_ARGS:-})
fi
