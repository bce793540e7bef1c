"""Builds the batchcast package: CMake builds the extension and the native program, and
installs them into the package (component python of python/CMakeLists.txt).

Two kinds of build (python/README.md, "Install"):
- default: a CMake build in build-wheel/ with BATCHCAST_STATIC_DEPS=ON (OpenCV linked
  statically), then every other (libzmq, TurboJPEG, libpng, libtiff, libwebp, ...) shared library the two
  binaries need beyond glibc, libstdc++ and zlib is copied into batchcast/_libs, which their
  $ORIGIN RPATH names: a relocatable, self-contained wheel.
- BATCHCAST_BUILD_DIR=<dir>: reuse that CMake build (e.g. the one ctest ran), so installing
  after the C++ tests rebuilds nothing; it links the system's libraries as configured there.
CMAKE_BUILD_PARALLEL_LEVEL sets the build's jobs; BATCHCAST_CMAKE_ARGS adds configure arguments.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))

# Libraries every Linux with a C++ runtime has (auditwheel's manylinux policy, trimmed to what
# the binaries use): never bundled.
SYSTEM_LIBRARIES = re.compile(
    r"^(linux-vdso|ld-linux.*|libc|libm|libdl|librt|libpthread|libresolv|libutil|libstdc\+\+"
    r"|libgcc_s|libz)\.so"
)


def cmake_version() -> str:
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        match = re.search(r"project\(batchcast VERSION ([0-9.]+)", f.read())
    if not match:
        raise RuntimeError("CMakeLists.txt: no 'project(batchcast VERSION x.y.z ...)' line")
    return match.group(1)


def run(*cmd: str) -> None:
    print("setup.py:", " ".join(shlex.quote(c) for c in cmd), flush=True)
    subprocess.run(cmd, check=True)


def cache_value(build_dir: str, name: str) -> str:
    with open(os.path.join(build_dir, "CMakeCache.txt")) as f:
        for line in f:
            if line.startswith(name + ":"):
                return line.split("=", 1)[1].strip()
    return ""


def needed_libraries(binary: str) -> list[str]:
    """Paths of the shared libraries `binary` loads, as ldd resolves them."""
    out = subprocess.run(["ldd", binary], check=True, capture_output=True, text=True).stdout
    paths = []
    for line in out.splitlines():
        parts = line.split("=>")
        if len(parts) != 2:
            continue
        name, target = parts[0].strip(), parts[1].split("(")[0].strip()
        if target == "not found":
            raise RuntimeError(f"{binary} needs {name}, which ldd cannot find")
        if target and not SYSTEM_LIBRARIES.match(name):
            paths.append(target)
    return paths


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        reuse = os.environ.get("BATCHCAST_BUILD_DIR")
        build_dir = os.path.abspath(reuse or os.path.join(ROOT, "build-wheel"))
        if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            args = [f"-DPython_EXECUTABLE={sys.executable}", "-DBATCHCAST_BENCH=OFF"]
            if not reuse:
                args += ["-DBATCHCAST_STATIC_DEPS=ON", "-DBUILD_TESTING=OFF",
                         "-DCMAKE_BUILD_TYPE=Release"]
            try:  # pip's pybind11 (the GPU node); Debian's pybind11-dev is found by CMake itself
                import pybind11

                args.append(f"-Dpybind11_DIR={pybind11.get_cmake_dir()}")
            except ImportError:
                pass
            args += shlex.split(os.environ.get("BATCHCAST_CMAKE_ARGS", ""))
            run("cmake", "-S", ROOT, "-B", build_dir, *args)
        built_for = cache_value(build_dir, "Python_EXECUTABLE")
        if built_for and os.path.realpath(built_for) != os.path.realpath(sys.executable):
            raise RuntimeError(
                f"{build_dir} builds the extension for {built_for}, not for {sys.executable}: "
                "remove that directory, or point BATCHCAST_BUILD_DIR at a build for this Python"
            )
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
        run("cmake", "--build", build_dir, "--target", "_batchcast", "batchcast", "-j", jobs)
        package = os.path.join(os.path.abspath(self.build_lib), "batchcast")
        # setuptools' staging outlives a build: a relocatable build's libraries must not leak
        # into a later development install.
        shutil.rmtree(os.path.join(package, "_libs"), ignore_errors=True)
        run("cmake", "--install", build_dir, "--component", "python", "--prefix",
            os.path.dirname(package))
        if cache_value(build_dir, "BATCHCAST_STATIC_DEPS") == "ON":
            self.bundle(package)

    def bundle(self, package: str) -> None:
        """Copies the non-system shared libraries of the extension and the program (and, ldd
        being transitive, theirs) into batchcast/_libs, as auditwheel repair does."""
        libs = os.path.join(package, "_libs")
        os.makedirs(libs)
        binaries = [os.path.join(package, "_bin", "batchcast")] + [
            os.path.join(package, f) for f in os.listdir(package)
            if f.startswith("_batchcast.") and f.endswith(".so")
        ]
        for path in sorted({lib for b in binaries for lib in needed_libraries(b)}):
            shutil.copy2(path, os.path.join(libs, os.path.basename(path)))
            print(f"setup.py: bundled {path}", flush=True)


setup(
    version=cmake_version(),
    # setuptools' own staging stays out of build/, the CMake build the scripts use.
    options={"build": {"build_base": os.path.join(ROOT, "build-setuptools")}},
    ext_modules=[Extension("batchcast._batchcast", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
)
