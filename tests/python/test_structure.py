"""The source tree's structure, read from the files themselves (no build, no installed package):
no source file over 450 lines; the core package (python/batchcast/*.py, but the command line
__main__.py, which dispatches to the tools) never imports batchcast.tools; no import cycle among
the package's modules; no C++ folder includes a folder of its own layer or above.

The C++ layers (README.md, "Layout") are written once, in LAYERS below; they follow the CMake
targets' target_link_libraries, which this test checks against them as well.

Run: .venv/bin/python -m pytest tests/python/test_structure.py (any python3 with pytest will do:
nothing is imported from batchcast).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "python", "batchcast")

MAX_LINES = 450
SOURCE_SUFFIXES = (".cpp", ".h", ".cu", ".cuh", ".c", ".py", ".sh", ".cmake")

# Lowest first. A folder's files may include files of its own folder and of folders of lower
# layers; a file belongs to the longest folder that prefixes its path (server/main.cpp: server).
LAYERS: List[List[str]] = [
    ["common"],
    ["protocol", "decoders", "metrics"],
    ["shm", "server/stream"],
    ["server/host", "client"],
    ["server/produce"],
    ["server/serve"],
    ["server", "python/src"],
]
RANK: Dict[str, int] = {folder: k for k, layer in enumerate(LAYERS) for folder in layer}
# Folders above every layer: nothing in a layer includes them.
TOP = ["tests", "bench", "examples"]


def tracked_files() -> List[str]:
    """The tracked files (git ls-files), relative to ROOT; outside a git checkout, every file
    under ROOT but build outputs, virtual environments and hidden folders."""
    try:
        out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z"], capture_output=True,
                             check=True).stdout
        listed = out.decode().split("\0")
        return [p for p in listed if p and os.path.isfile(os.path.join(ROOT, p))]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for top, dirs, names in os.walk(ROOT):
            dirs[:] = [d for d in dirs if not d.startswith((".", "build", "__pycache__"))]
            files += [os.path.relpath(os.path.join(top, n), ROOT) for n in names]
        return files


def line_count(path: str) -> int:
    with open(os.path.join(ROOT, path), "rb") as f:
        return sum(1 for _ in f)


def test_no_source_file_is_over_450_lines():
    sources = [p for p in tracked_files() if p.endswith(SOURCE_SUFFIXES)]
    assert len(sources) > 100, f"found only {len(sources)} source files under {ROOT}"
    long = {p: n for p in sources if (n := line_count(p)) > MAX_LINES}
    assert not long, (f"source files over {MAX_LINES} lines (split each by concept, one concept "
                      f"per file): {long}")


# --- the Python package ---------------------------------------------------------------------

def package_modules() -> Dict[str, str]:
    """Every Python module of the batchcast package: dotted name -> path."""
    modules = {}
    for top, dirs, names in os.walk(PACKAGE):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in names:
            if not name.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(top, name), os.path.dirname(PACKAGE))
            dotted = rel[:-3].replace(os.sep, ".")
            if dotted.endswith(".__init__"):
                dotted = dotted[:-len(".__init__")]
            modules[dotted] = os.path.join(top, name)
    return modules


def extension_modules() -> Set[str]:
    """The package's compiled modules, known here by their stubs (batchcast._batchcast)."""
    return {"batchcast." + n[:-4] for n in os.listdir(PACKAGE) if n.endswith(".pyi")}


def imports(path: str, module: str, module_level_only: bool) -> Iterator[Tuple[int, str, str]]:
    """(line, imported module, name or "") for each import of the file: `import a.b` gives
    ("a.b", ""), `from a import b` gives ("a", "b"), relative imports resolved against
    `module`. Module level only: the statements run on import (top-level ones, also inside a
    top-level if or try), not those of functions, classes or `if TYPE_CHECKING:`."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    is_package = os.path.basename(path) == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]

    def statements(body) -> Iterator[ast.stmt]:
        for node in body:
            yield node
            if isinstance(node, ast.If):
                test = node.test
                if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"):
                    continue
                yield from statements(node.body)
                yield from statements(node.orelse)
            elif isinstance(node, ast.Try):
                for block in (node.body, node.orelse, node.finalbody,
                              *(h.body for h in node.handlers)):
                    yield from statements(block)

    nodes = statements(tree.body) if module_level_only else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, ""
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                yield node.lineno, base, alias.name


def imported_modules(path: str, module: str, modules: Dict[str, str],
                     module_level_only: bool) -> Iterator[Tuple[int, str]]:
    """The package's Python modules a file imports: `from p import n` imports p.n where that is
    a module (an extension module included, then left out), else p (its __init__ for a package:
    a real edge). The implicit import of a module's parent packages is not counted."""
    known = set(modules) | extension_modules()
    for line, base, name in imports(path, module, module_level_only):
        target = f"{base}.{name}" if name and f"{base}.{name}" in known else base
        if target in modules:
            yield line, target


CORE_EXEMPT = {
    # The command line: `batchcast track|report|bench` dispatch to the tools by design.
    "batchcast.__main__",
}


def is_tools(name: str) -> bool:
    return name == "batchcast.tools" or name.startswith("batchcast.tools.")


def tools_imports(path: str, module: str, modules: Dict[str, str]) -> List[str]:
    """Where the file imports batchcast.tools or one of its modules, at any level, by an import
    statement or importlib.import_module("batchcast.tools...")."""
    where = os.path.relpath(path, ROOT)
    found = [f"{where}:{line} imports {target}"
             for line, target in imported_modules(path, module, modules, module_level_only=False)
             if is_tools(target)]
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
                and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
                and is_tools(node.args[0].value)):
            found.append(f"{where}:{node.lineno} imports {node.args[0].value}")
    return found


def test_the_core_package_never_imports_its_tools():
    modules = package_modules()
    assert "batchcast.tools.metrics" in modules and "batchcast.loader" in modules, sorted(modules)
    core = {m: p for m, p in modules.items()
            if m.count(".") <= 1 and m != "batchcast.tools" and m not in CORE_EXEMPT}
    found = [where for module, path in sorted(core.items())
             for where in tools_imports(path, module, modules)]
    assert not found, ("the core package imports batchcast.tools (the tools build on the core, "
                       "never the reverse: move what both need into the core): " + "; ".join(found))


@pytest.mark.parametrize("source", [
    "from .tools import metrics",
    "from . import tools",
    "from .tools.metrics import track",
    "import batchcast.tools.metrics",
    "from batchcast.tools import metrics",
    "def f():\n    if True:\n        from .tools import metrics",
    "import importlib\nm = importlib.import_module('batchcast.tools.metrics')",
])
def test_an_import_of_the_tools_is_found_in_every_spelling(source, tmp_path):
    path = tmp_path / "_core.py"
    path.write_text(source + "\n")
    modules = package_modules()
    modules["batchcast._core"] = str(path)
    assert tools_imports(str(path), "batchcast._core", modules), source


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one node, or of one with a self-edge
    (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_cycles_finds_a_cycle_and_only_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set(), "c": {"c"}}) == [["c"]]


def test_module_level_imports_are_those_run_on_import(tmp_path):
    path = tmp_path / "_a.py"
    path.write_text("from typing import TYPE_CHECKING\n"
                    "import batchcast.loader\n"
                    "try:\n    from . import producer\nexcept ImportError:\n    pass\n"
                    "if TYPE_CHECKING:\n    from . import server\n"
                    "def f():\n    from . import dataloader\n")
    modules = package_modules()
    modules["batchcast._a"] = str(path)
    found = {t for _, t in imported_modules(str(path), "batchcast._a", modules, True)}
    assert found == {"batchcast.loader", "batchcast.producer"}
    found = {t for _, t in imported_modules(str(path), "batchcast._a", modules, False)}
    assert found == {"batchcast.loader", "batchcast.producer", "batchcast.server",
                     "batchcast.dataloader"}


def test_no_import_cycle_among_the_package_modules():
    modules = package_modules()
    graph = {m: {t for _, t in imported_modules(p, m, modules, module_level_only=True)}
             for m, p in modules.items()}
    assert not cycles(graph), ("import cycles among the batchcast modules (module-level "
                               f"imports; break each by moving what both need): {cycles(graph)}")


# --- the C++ layers -------------------------------------------------------------------------

def folder_of(path: str) -> Optional[str]:
    """The layered folder `path` (relative to ROOT) belongs to, or None."""
    best = None
    for folder in RANK:
        if path.startswith(folder + "/") and (best is None or len(folder) > len(best)):
            best = folder
    return best


INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def include_violations(path: str, text: str) -> List[str]:
    """The includes of the file at `path` (relative to ROOT) that reach a folder of its layer
    or above, or the tests, benchmarks or examples."""
    src = folder_of(path)
    if src is None:
        return []
    wrong = []
    for n, line in enumerate(text.splitlines(), 1):
        m = INCLUDE.match(line)
        if not m:
            continue
        included = m.group(1)
        dst = folder_of(included)
        if dst is None:
            if included.split("/")[0] in TOP:
                wrong.append(f"{path}:{n}: {included} ({src} includes {included.split('/')[0]})")
        elif dst != src and RANK[dst] >= RANK[src]:
            wrong.append(f"{path}:{n}: {included} ({src}, layer {RANK[src]}, includes {dst}, "
                         f"layer {RANK[dst]})")
    return wrong


def test_no_cpp_folder_includes_a_folder_of_its_layer_or_above():
    sources = [p for p in tracked_files() if p.endswith((".cpp", ".h", ".cu", ".c", ".cuh"))
               and folder_of(p) is not None]
    assert len(sources) > 50, f"found only {len(sources)} C++ files in the layered folders"
    wrong = []
    for path in sources:
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            wrong += include_violations(path, f.read())
    assert not wrong, ("includes against the layers (lowest first: " +
                       " < ".join(", ".join(layer) for layer in LAYERS) + "): " + "; ".join(wrong))


@pytest.mark.parametrize("path, include, allowed", [
    ("server/serve/serve.cpp", "server/produce/sample_producer.h", True),
    ("server/serve/serve.cpp", "server/serve/serve.h", True),
    ("server/main.cpp", "server/serve/serve.h", True),
    ("client/consumer.cpp", "shm/slot_memory.h", True),
    ("server/produce/x.cpp", "server/serve/serve.h", False),
    ("client/x.cpp", "server/host/stream_host.h", False),
    ("decoders/x.cpp", "metrics/collector.h", False),
    ("common/x.h", "protocol/messages.h", False),
    ("shm/x.h", "tests/cpp/support/processes.h", False),
])
def test_the_include_rule(path, include, allowed):
    assert (not include_violations(path, f'#include "{include}"\n')) == allowed


# CMake files outside the folder their targets' sources are in.
CMAKE_FOLDERS = {"python": "python/src"}


def cmake_targets() -> Tuple[Dict[str, str], Dict[str, Set[str]]]:
    """The project's targets in the layered folders: target -> folder, and target -> the
    project targets it links (target_link_libraries)."""
    folder: Dict[str, str] = {}
    links: Dict[str, Set[str]] = {}
    for path in tracked_files():
        if os.path.basename(path) != "CMakeLists.txt":
            continue
        where = CMAKE_FOLDERS.get(os.path.dirname(path)) or folder_of(path)
        if where is None:
            continue
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            text = re.sub(r"#[^\n]*", "", f.read())
        for m in re.finditer(r"\b(?:add_library|add_executable|pybind11_add_module)\(\s*(\S+)",
                             text):
            folder[m.group(1)] = where
        for m in re.finditer(r"\btarget_link_libraries\(\s*(\S+)([^)]*)\)", text):
            links.setdefault(m.group(1), set()).update(
                t for t in m.group(2).split() if t.startswith("batchcast_"))
    return folder, links


def test_the_layers_follow_the_cmake_targets_links():
    folder, links = cmake_targets()
    assert {"batchcast_common", "batchcast_serve", "batchcast_client"} <= set(folder), folder
    wrong = [f"{t} ({folder[t]}) links {d} ({folder[d]})"
             for t, deps in sorted(links.items()) if t in folder
             for d in sorted(deps) if d in folder and folder[d] != folder[t]
             and RANK[folder[d]] >= RANK[folder[t]]]
    unknown = sorted(d for deps in links.values() for d in deps if d not in folder)
    assert not unknown, f"targets linked but not found in a layered folder: {unknown}"
    assert not wrong, ("LAYERS disagrees with target_link_libraries (a target links only "
                       "targets of its folder or of lower layers): " + "; ".join(wrong))


@pytest.mark.parametrize("path, folder", [("server/main.cpp", "server"),
                                          ("server/serve/serve.h", "server/serve"),
                                          ("python/src/module.cpp", "python/src"),
                                          ("tests/cpp/x.cpp", None), ("serverx/a.h", None)])
def test_folder_of_takes_the_longest_layered_folder(path, folder):
    assert folder_of(path) == folder
