#!/usr/bin/env bash
# Builds the relocatable wheel the way a user's `pip wheel .` does (setup.py's default: a CMake
# build in build-wheel/ with OpenCV linked statically and every other non-system library bundled
# in batchcast/_libs), installs it into a fresh venv, and checks it from outside the source tree:
# tests/python/test_install.py (program on PATH, version, stubs, ldd loads nothing of libzmq,
# TurboJPEG, OpenCV, libpng, libtiff or libwebp from the system), tests/python/test_formats.py
# (an ImageFolder of every format torchvision accepts, served and compared with torchvision) and
# a real run (make-dataset, serve, a Loader, report).
# Run by .ci/run after the test suite. CUDA is left out here (BATCHCAST_CMAKE_ARGS overrides) to
# keep CI short; the GPU node installs with CUDA (scripts/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=$(mktemp -d /tmp/batchcast-wheel.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export BATCHCAST_CMAKE_ARGS=${BATCHCAST_CMAKE_ARGS:--DBATCHCAST_CUDA=OFF}
/usr/bin/python3 -m pip wheel -q --no-build-isolation --no-index --no-deps -w "$WORK/dist" .
wheel=$(ls "$WORK"/dist/batchcast-*.whl)
echo "check_wheel: built $(basename "$wheel") ($(du -h "$wheel" | cut -f1))"
/usr/bin/python3 -m venv --system-site-packages "$WORK/venv"
"$WORK/venv/bin/python" -m pip install -q --no-index --no-deps "$wheel"
cd "$WORK"  # nothing of the source tree is importable from here
PATH="$WORK/venv/bin:$PATH" "$WORK/venv/bin/python" -m pytest -q -p no:cacheprovider \
  --rootdir "$WORK" "$ROOT/tests/python/test_install.py" "$ROOT/tests/python/test_formats.py"
PATH="$WORK/venv/bin:$PATH"
batchcast make-dataset --out "$WORK/data" --classes 2 --per-class 8
batchcast serve --data "$WORK/data" --endpoint "ipc://$WORK/bc.sock" --batch-size 4 \
  --image-size 32 --workers 1 --epochs 1 --metrics-dir "$WORK/run" --status-interval 0 &
server=$!
python - "$WORK" <<'PY'
import sys
import batchcast
loader = batchcast.Loader(f"ipc://{sys.argv[1]}/bc.sock", batch_size=4, timeout=60)
n = sum(images.shape[0] for images, labels in loader)
assert n == 16, n
print(f"check_wheel: a Loader read {n} samples from the installed wheel's server")
PY
wait "$server"
batchcast report "$WORK/run" --out "$WORK/report" >/dev/null
test -s "$WORK/report/index.html"
echo "check_wheel: OK"
