"""batchcast.server.launch: the one way Python starts a server, from a ServeConfig.

A real ``batchcast serve`` started through it answers a Loader, runs with the environment and
CPUs it was given, stops cleanly and leaves nothing in /dev/shm; a detached one is no child of
this process and outlives nothing it should not; a server that cannot start is reported with
its log. And nothing else in the package builds a ``serve`` command line.
"""

from __future__ import annotations

import ast
import os
import pathlib

import pytest

import batchcast
from batchcast import _batchcast
from batchcast.server import launch
from conftest import segment_of

PACKAGE = pathlib.Path(batchcast.__file__).parent


def _config(endpoint: str, **fields) -> _batchcast.ServeConfig:
    return _batchcast.ServeConfig(synthetic=64, sample_bytes=16, batch_size=8, epochs=0,
                                  endpoint=endpoint, **fields)


def _first_batch_rows(endpoint: str) -> int:
    with batchcast.Loader(endpoint, framework="numpy", timeout=30) as loader:
        return len(next(iter(loader))[0])


def _environ(pid: int) -> dict:
    with open(f"/proc/{pid}/environ", "rb") as f:
        pairs = [item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item]
    return {k.decode(): v.decode() for k, v in pairs}


def test_a_launched_server_answers_with_its_environment_and_cpus_and_stops_clean(
        endpoint, tmp_path):
    cpu = min(os.sched_getaffinity(0))
    log = tmp_path / "server.log"
    server = launch(_config(endpoint), log=str(log), cpus=[cpu],
                    env=dict(os.environ, BATCHCAST_LAUNCH_TEST="yes"))
    try:
        assert server.process is not None and server.running()
        assert server.endpoint == endpoint
        assert os.sched_getaffinity(server.pid) == {cpu}
        assert _environ(server.pid)["BATCHCAST_LAUNCH_TEST"] == "yes"
        assert _first_batch_rows(endpoint) == 8
    finally:
        code = server.stop()
    assert code == 0, server.log_tail()
    assert not os.path.exists(segment_of(endpoint))
    assert not os.path.exists(endpoint[len("ipc://"):])
    assert "serving on" in log.read_text()  # a log the caller named is kept


def test_a_detached_server_is_no_child_and_stops_by_pid(endpoint, tmp_path):
    log = tmp_path / "detached.log"
    server = launch(_config(endpoint), log=str(log), detach=True)
    try:
        assert server.process is None
        with pytest.raises(ChildProcessError):
            os.waitpid(server.pid, os.WNOHANG)  # reparented: not this process's child
        assert os.getsid(server.pid) != os.getsid(0)  # its own session: no terminal's Ctrl-C
        assert _first_batch_rows(endpoint) == 8
    finally:
        server.stop()
    assert not server.running()
    assert not os.path.exists(segment_of(endpoint))


def test_a_server_that_cannot_start_is_reported_with_its_log(endpoint):
    config = _batchcast.ServeConfig(endpoint=endpoint)  # no data, no synthetic
    with pytest.raises(batchcast.BatchcastError, match="exactly one of --data"):
        launch(config)


def test_serve_is_launch_for_settings_by_name(endpoint):
    with batchcast.serve(endpoint=endpoint, synthetic=64, sample_bytes=16, batch_size=8,
                         epochs=None) as server:
        assert server.config == _config(endpoint)
        assert _first_batch_rows(endpoint) == 8
    assert not os.path.exists(server.log_path)  # serve()'s own temporary log


def _calls_and_serve_words(path: pathlib.Path):
    """(function, line) of every command_line() call and every "serve" string that is not a
    docstring, by enclosing function ('' at module level)."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                    ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr)
                  and isinstance(n.body[0].value, ast.Constant)}
    exported = {id(c) for n in ast.walk(tree) if isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)
                for c in ast.walk(n.value)}  # __all__ names the function serve()
    found = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef,
                                                     ast.AsyncFunctionDef)) else function
            if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute)
                    and child.func.attr == "command_line"):
                found.append(("command_line()", inner, child.lineno))
            if (isinstance(child, ast.Constant) and child.value == "serve"
                    and id(child) not in docstrings and id(child) not in exported):
                found.append(('"serve"', inner, child.lineno))
            visit(child, inner)

    visit(tree, "")
    return found


def test_nothing_outside_the_launcher_builds_a_serve_command_line():
    allowed = {("server.py", '"serve"', "launch"), ("server.py", "command_line()",
                                                     "_serve_arguments")}
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE))
        for what, function, line in _calls_and_serve_words(path):
            if (rel, what, function) not in allowed:
                found.append(f"{rel}:{line} {what} in {function or 'module'}")
    assert not found, ("serve command lines are built by batchcast.server.launch alone:\n"
                       + "\n".join(found))
    # The check sees what it looks for: the launcher's own are found.
    own = _calls_and_serve_words(PACKAGE / "server.py")
    assert {(w, f) for w, f, _ in own} == {('"serve"', "launch"),
                                          ("command_line()", "_serve_arguments")}
