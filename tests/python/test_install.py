"""The installed package has what a user of `pip install` relies on: the `batchcast` program on
the environment's PATH (the console script, which answers --version and execs the native
program for the rest), __version__, the type information (py.typed, the native module's .pyi),
and, in a relocatable wheel (batchcast/_libs present), native binaries that load none of
libzmq, TurboJPEG, OpenCV or the image libraries (libpng, libtiff, libwebp) from the system."""

import os
import re
import subprocess
import sys

import pytest

import batchcast
from batchcast.server import find_binary

PACKAGE = os.path.dirname(os.path.abspath(batchcast.__file__))


def test_installed_outside_the_source_tree():
    assert "site-packages" in PACKAGE, f"tests must import the installed package, not {PACKAGE}"


def test_program_on_path_reports_the_package_version(batchcast_cli):
    assert re.fullmatch(r"\d+\.\d+\.\d+", batchcast.__version__)
    out = subprocess.run([batchcast_cli, "--version"], capture_output=True, text=True, timeout=60,
                         cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"batchcast {batchcast.__version__}"


def test_program_execs_the_native_one(batchcast_cli):
    out = subprocess.run([batchcast_cli, "--help"], capture_output=True, text=True, timeout=60,
                         cwd="/")
    assert out.returncode == 0, out.stderr
    assert "serve" in out.stdout and "make-dataset" in out.stdout


def test_exec_path_does_not_import_torch():
    code = ("import sys, batchcast.__main__ as m, batchcast.server as s; s.find_binary(); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_type_information_is_installed():
    assert os.path.isfile(os.path.join(PACKAGE, "py.typed"))
    assert os.path.isfile(os.path.join(PACKAGE, "_batchcast.pyi"))


def test_the_sweeps_start_up_hook_is_installed():
    # batchcast sweep --share-dataloaders puts this folder on its trials' PYTHONPATH.
    assert os.path.isfile(os.path.join(PACKAGE, "_sweep_site", "sitecustomize.py"))


def test_native_program_is_in_the_package():
    packaged = os.path.join(PACKAGE, "_bin", "batchcast")
    assert os.access(packaged, os.X_OK)
    if "BATCHCAST_BIN" not in os.environ:
        assert find_binary() == packaged


def test_relocatable_wheel_loads_no_system_zmq_turbojpeg_opencv_or_image_libraries():
    libs = os.path.realpath(os.path.join(PACKAGE, "_libs"))
    if not os.path.isdir(libs):
        # A development install (BATCHCAST_BUILD_DIR) links the system's libraries by design.
        pytest.skip("development install from a reused CMake build: no bundled libraries")
    binaries = [os.path.join(PACKAGE, "_bin", "batchcast")] + [
        os.path.join(PACKAGE, f) for f in os.listdir(PACKAGE) if f.startswith("_batchcast.")
        and f.endswith(".so")]
    for binary in binaries:
        ldd = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
        assert "not found" not in ldd, ldd
        for line in ldd.splitlines():
            bundled = re.search(r"lib(zmq|turbojpeg|jpeg|png|tiff|webp|opencv|tbb|spdlog|fmt)",
                                line)
            if bundled and "=>" in line:
                path = os.path.realpath(line.split("=>")[1].split("(")[0].strip())
                assert path.startswith(libs + os.sep), f"{binary} loads {path}, not the wheel's"
