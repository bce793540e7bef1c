"""The type stub python/batchcast/_batchcast.pyi says what the binding does.

Parsed with ``ast`` and compared with the installed module: every class and function of either
is in the other (and every member of a class: methods, properties, a settings class's fields);
every function, method and ``__init__`` has the binding's parameters, in order, with its
defaults (pybind11's signature line in ``__doc__``); a settings class (SettingsClass: a
``fields`` tuple, keyword construction) is written as its fields' attributes and
``__init__(self, *, FIELD: TYPE = DEFAULT, ...)`` over exactly its fields, each default what
``Cls()`` holds. A default that is an object (no literal spells it), or the machine's
(scripts/options_doc.py's list), is ``...`` in the stub; any other must be the same value.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import math
import os
import re
import types
from typing import Any, Dict, List, Optional, Tuple

import pytest

from batchcast import _batchcast

STUB = os.path.join(os.path.dirname(os.path.abspath(_batchcast.__file__)), "_batchcast.pyi")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Dunders the stub declares where the binding's matter to a user; the binding's others
# (__eq__, __repr__, pickling) come with every settings class and are not listed.
USER_DUNDERS = {"__init__", "__len__", "__getitem__", "__dlpack__", "__dlpack_device__"}
UNSPELLABLE = object()  # a binding default with no literal spelling (an object's repr)


def _machine_defaults() -> set:
    """Fields whose default is the machine's (ServeConfig.workers: its cores), written `...`:
    scripts/options_doc.py's list, which writes the ServeConfig and PipelineOptions sections."""
    path = os.path.join(ROOT, "scripts", "options_doc.py")
    spec = importlib.util.spec_from_file_location("options_doc", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return set(module.MACHINE_DEFAULTS)


def _stub() -> ast.Module:
    with open(STUB) as f:
        return ast.parse(f.read(), STUB)


def _stub_classes() -> Dict[str, ast.ClassDef]:
    return {n.name: n for n in _stub().body if isinstance(n, ast.ClassDef)}


def _stub_functions() -> Dict[str, ast.FunctionDef]:
    return {n.name: n for n in _stub().body if isinstance(n, ast.FunctionDef)}


def _is_property(fn: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "property" for d in fn.decorator_list)


def _literal(text: str) -> Any:
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return UNSPELLABLE
    return UNSPELLABLE if value is Ellipsis else value  # an object's repr, replaced by ...


def _same(ours: Any, theirs: Any) -> bool:
    """Equal defaults: a tuple and a list alike (a vector field reads back as a list), floats
    to float32's precision (fields such as mean are float32: 0.485 reads back 0.48500001...)."""
    if isinstance(ours, (list, tuple)) and isinstance(theirs, (list, tuple)):
        return len(ours) == len(theirs) and all(_same(a, b) for a, b in zip(ours, theirs))
    if isinstance(ours, float) or isinstance(theirs, float):
        return (isinstance(ours, (int, float)) and isinstance(theirs, (int, float))
                and not isinstance(ours, bool) and not isinstance(theirs, bool)
                and math.isclose(ours, theirs, rel_tol=1e-6))
    return type(ours) is type(theirs) and ours == theirs


def _params(args: ast.arguments) -> List[Tuple[str, Optional[str]]]:
    """(name, default's source or None) of every parameter but self, then *args, **kwargs. A
    positional-only parameter is named "/" (pybind11 writes a parameter without py::arg as
    argN, which only positions can pass: the stub writes it before a /)."""
    positional = args.posonlyargs + args.args
    defaults: List[Optional[ast.expr]] = [None] * (len(positional) - len(args.defaults))
    defaults += list(args.defaults)
    names = [a.arg if a.arg == "self" else "/" for a in args.posonlyargs]
    names += ["/" if re.fullmatch(r"arg\d+", a.arg) else a.arg for a in args.args]
    out = list(zip(names, defaults))
    out += list(zip([a.arg for a in args.kwonlyargs], args.kw_defaults))
    if args.vararg:
        out.append(("*" + args.vararg.arg, None))
    if args.kwarg:
        out.append(("**" + args.kwarg.arg, None))
    return [(name, None if d is None else ast.unparse(d)) for name, d in out if name != "self"]


def _signatures(obj: Any, name: str) -> List[List[Tuple[str, Optional[str]]]]:
    """The parameters of each signature pybind11 wrote for `obj` (one per overload)."""
    doc = obj.__doc__ or ""
    lines = [re.sub(r"^\d+\. ", "", line) for line in doc.splitlines()]
    found = []
    for line in lines:
        if not line.startswith(name + "(") or line.startswith(name + "(*args, **kwargs)"):
            continue
        # An object default is written as its repr, e.g. <... object at 0x7f...>: no literal.
        # A type bound after the function is written in C++ (batchcast::PipelineOptions).
        text = re.sub(r"<[^<>']* object at 0x[0-9a-fA-F]+>", "...", line).replace("::", ".")
        tree = ast.parse(f"def {text}: pass")
        found.append(_params(tree.body[0].args))  # type: ignore[attr-defined]
    assert found, f"{name}: no pybind11 signature in its __doc__: {doc[:200]!r}"
    return found


def _compare(where: str, stub: List[Tuple[str, Optional[str]]],
             bound: List[Tuple[str, Optional[str]]]) -> List[str]:
    problems = []
    if [n for n, _ in stub] != [n for n, _ in bound]:
        return [f"{where}: stub parameters {[n for n, _ in stub]}, binding {[n for n, _ in bound]}"]
    for (name, ours), (_, theirs) in zip(stub, bound):
        if (ours is None) != (theirs is None):
            problems.append(f"{where}({name}): default in the stub {ours}, binding {theirs}")
        elif ours is not None:
            value = _literal(theirs)  # type: ignore[arg-type]
            if value is UNSPELLABLE:
                if ours != "...":
                    problems.append(f"{where}({name}): the binding's default {theirs} is an "
                                    f"object: write ... in the stub, not {ours}")
            elif ours == "..." or not _same(_literal(ours), value):
                problems.append(f"{where}({name}): stub default {ours}, binding {theirs}")
    return problems


def _check_function(where: str, fn: ast.FunctionDef, bound: Any, name: str) -> List[str]:
    ours = _params(fn.args)
    overloads = _signatures(bound, name)
    results = [_compare(where, ours, theirs) for theirs in overloads]
    return [] if any(not r for r in results) else results[0]


def _members(cls: type) -> Dict[str, Any]:
    """Its own members a user sees; a class without a constructor has Python's slot __init__."""
    return {k: v for k, v in vars(cls).items()
            if (not k.startswith("_") or k in USER_DUNDERS)
            and not isinstance(v, types.WrapperDescriptorType)}


def _dunders(cls: type) -> set:
    """Its own dunders that are not Python's defaults, beyond those _members lists."""
    return {k for k, v in vars(cls).items() if k.startswith("__") and k not in USER_DUNDERS
            and not isinstance(v, types.WrapperDescriptorType)}


def _is_settings_class(cls: type) -> bool:
    """A SettingsClass (python/src/settings_class.h): `fields`, and construction by keyword."""
    init = vars(cls).get("__init__")
    return (isinstance(vars(cls).get("fields"), tuple) and init is not None
            and (init.__doc__ or "").startswith("__init__(self: ")
            and init.__doc__.split("\n", 1)[0].endswith(", **kwargs) -> None"))


def _check_settings_class(name: str, node: ast.ClassDef, cls: type) -> List[str]:
    """Its fields (in any order: keywords and attributes) and their defaults."""
    fields = sorted(cls.fields)
    defaults = cls()
    machine = _machine_defaults()
    problems = []
    attrs = sorted(n.target.id for n in node.body if isinstance(n, ast.AnnAssign)
                   and isinstance(n.target, ast.Name) and n.target.id != "fields")
    if attrs != fields:
        problems.append(f"{name}: stub attributes {attrs}, binding fields {fields}")
    init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"),
                None)
    if init is None:
        return problems + [f"{name}: no __init__(self, *, FIELD=DEFAULT, ...) in the stub"]
    a = init.args
    if a.args[1:] or a.vararg or a.kwarg or a.posonlyargs:
        problems.append(f"{name}.__init__: write (self, *, FIELD: TYPE = DEFAULT, ...)")
    keywords = sorted(k.arg for k in a.kwonlyargs)
    if keywords != fields:
        problems.append(f"{name}.__init__: stub keywords {keywords}, binding fields {fields}")
    for arg, default in zip(a.kwonlyargs, a.kw_defaults):
        if arg.arg not in fields:
            continue
        value = getattr(defaults, arg.arg)
        text = None if default is None else ast.unparse(default)
        if text == "..." and (arg.arg in machine or _literal(repr(value)) is UNSPELLABLE):
            continue  # the machine's, or an object (transform: PipelineOptions())
        if text is None:
            problems.append(f"{name}.__init__({arg.arg}): no default; {name}() holds {value!r}")
            continue
        try:
            ours = eval(text, dict(vars(_batchcast)))  # e.g. PipelineOptions()
        except Exception as e:  # noqa: BLE001 - reported as the stub's error
            problems.append(f"{name}.__init__({arg.arg}): default {text} does not evaluate: {e}")
            continue
        if not _same(ours, value):
            problems.append(f"{name}.__init__({arg.arg}): stub default {text}, {name}() holds "
                            f"{value!r}")
    return problems


def _binding_names() -> Tuple[List[str], List[str], List[str]]:
    """(classes, functions, other attributes) the module exports."""
    classes, functions, data = [], [], []
    for name, value in vars(_batchcast).items():
        if name.startswith("_"):
            continue
        if inspect.isclass(value):
            classes.append(name)
        elif callable(value):
            functions.append(name)
        else:
            data.append(name)
    return classes, functions, data


def test_every_class_and_function_is_in_both():
    classes, functions, data = _binding_names()
    tree = _stub()
    stub_classes = [n.name for n in tree.body if isinstance(n, ast.ClassDef)]
    stub_functions = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    stub_data = [n.target.id for n in tree.body
                 if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    assert sorted(stub_classes) == sorted(classes)
    assert sorted(stub_functions) == sorted(functions)
    assert sorted(stub_data) == sorted(data)


@pytest.mark.parametrize("name", sorted(_stub_functions()))
def test_function_parameters_and_defaults(name):
    bound = getattr(_batchcast, name, None)
    assert bound is not None, f"{name} is in the stub, not in the binding"
    assert not _check_function(name, _stub_functions()[name], bound, name)


@pytest.mark.parametrize("name", sorted(n for n, v in vars(_batchcast).items()
                                        if inspect.isclass(v) and not n.startswith("_")))
def test_class_members_parameters_and_defaults(name):
    cls = getattr(_batchcast, name)
    node = _stub_classes().get(name)
    assert node is not None, f"class {name} is bound but missing from the stub"
    if issubclass(cls, BaseException):
        return  # the error classes: names only (their bases are checked by test_errors)
    problems: List[str] = []
    settings = _is_settings_class(cls)
    if settings:
        problems += _check_settings_class(name, node, cls)
    stub_members = {n.name: n for n in node.body if isinstance(n, ast.FunctionDef)}
    attributes = {n.target.id for n in node.body
                  if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    bound = _members(cls)
    if settings:  # the fields and `fields` are compared above
        attributes = set()
        bound = {k: v for k, v in bound.items() if k not in set(cls.fields) | {"fields"}}
    stubbed = set(stub_members) | attributes
    # Every member a user sees is in the stub; the stub's other dunders (__eq__) are bound too.
    if sorted(stubbed - _dunders(cls)) != sorted(bound):
        problems.append(f"{name}: stub members {sorted(stubbed)}, binding {sorted(bound)}")
    for member in attributes & set(bound):
        if callable(inspect.getattr_static(cls, member)):
            problems.append(f"{name}.{member}: an attribute in the stub, a method in the binding")
    for member, fn in stub_members.items():
        if member not in bound:
            continue
        where = f"{name}.{member}"
        if _is_property(fn):
            if not isinstance(bound[member], property):
                problems.append(f"{where}: a property in the stub, not in the binding")
        elif settings and member == "__init__":
            continue  # the fields, checked above
        else:
            raw = inspect.getattr_static(cls, member)
            problems += _check_function(where, fn, getattr(cls, member), member)
            if isinstance(raw, property):
                problems.append(f"{where}: a property in the binding, a method in the stub")
    assert not problems, "\n".join(problems)


def test_errors():
    tree = _stub()
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        cls = getattr(_batchcast, node.name)
        if not issubclass(cls, BaseException):
            continue
        bases = [ast.unparse(b) for b in node.bases]
        expected = [b.__module__ + "." + b.__name__ if b.__module__ == "builtins" and
                    b.__name__ in {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
                    else b.__name__ for b in cls.__bases__]
        assert bases == expected, f"{node.name}: stub bases {bases}, binding {expected}"


def test_the_python_layer_takes_its_defaults_from_the_binding():
    # One declaration per default: Loader's and Producer's keywords are the options' defaults,
    # and the stall bound and policy are the same for serve, a Producer and the stream host.
    import batchcast

    consumer, host = _batchcast.ConsumerOptions(), _batchcast.StreamHostOptions()
    loader = inspect.signature(batchcast.Loader).parameters
    for name in ("max_held", "prefetch", "late_join"):
        assert loader[name].default == getattr(consumer, name), name
    producer = inspect.signature(batchcast.Producer).parameters
    for name, field in (("ring", "ring_slots"), ("min_consumers", "min_consumers"),
                        ("stall_policy", "stall_policy"), ("stall_timeout", "stall_timeout"),
                        ("allow_remote", "allow_remote")):
        assert producer[name].default == getattr(host, field), name
    serve = _batchcast.ServeConfig()
    assert (serve.stall_policy, serve.stall_timeout) == (host.stall_policy, host.stall_timeout)
