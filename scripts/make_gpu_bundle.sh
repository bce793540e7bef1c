#!/usr/bin/env bash
# Downloads (here, on a Debian 12 machine with apt) the Debian packages a GPU node without apt or
# network needs to build batchcast: .bundle/debs/*.deb are always unpacked by gpu_build.sh,
# .bundle/debs/fallback/*.deb only where the node lacks their library (so the node's own libssl,
# libX11, BLAS... are never shadowed). Idempotent: packages already downloaded are kept.
# .bundle/ is git-ignored; pass it to the device tool as carry: [".bundle"].
set -euo pipefail
cd "$(dirname "$0")/.."

# Headers and libraries batchcast builds against (cmake/Dependencies.cmake, decoders/, python/).
BUILD=(
  libzmq5 libzmq3-dev cppzmq-dev libsodium23 libnorm1 libpgm-5.3-0 libbsd0 libmd0
  libturbojpeg0 libturbojpeg0-dev libjpeg62-turbo libjpeg62-turbo-dev
  libpng16-16 libpng-dev libtiff6 libtiff-dev libwebp7 libwebp-dev libwebpdemux2 libwebpmux3
  libopencv-core406 libopencv-core-dev libopencv-imgproc406 libopencv-imgproc-dev libtbb12
  libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 libcli11-dev nlohmann-json3-dev libdlpack-dev
  pybind11-dev
)
# What those libraries need at load time that a CUDA image usually, but not always, has:
# libopencv_core (libGLX, LAPACK, BLAS), libzmq (GSSAPI) and libtiff (its codecs' libraries).
FALLBACK=(
  libglx0 libglvnd0 libx11-6 libxcb1 libxau6 libxdmcp6 liblapack3 libblas3 libgfortran5
  libquadmath0 libgssapi-krb5-2 libkrb5-3 libk5crypto3 libcom-err2 libkrb5support0 libkeyutils1
  libssl3 libjbig0 libdeflate0 liblerc4 libzstd1 liblzma5
)

download() {  # download DIR PACKAGE...: fetches the packages not yet in DIR
  local dir=$1 missing=()
  shift
  mkdir -p "$dir"
  for p in "$@"; do
    compgen -G "$dir/${p}_*.deb" >/dev/null || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "make_gpu_bundle: downloading ${missing[*]}"
    (cd "$dir" && apt-get download "${missing[@]}")
  fi
}
download .bundle/debs "${BUILD[@]}"
download .bundle/debs/fallback "${FALLBACK[@]}"
echo "make_gpu_bundle: $(ls .bundle/debs/*.deb .bundle/debs/fallback/*.deb | wc -l) packages," \
  "$(du -sh .bundle/debs | cut -f1) in .bundle/debs"
