"""A sweep's trials: the grid of a command line, or the lines of a trials file.

What it is: :func:`expand_grid` turns ``COMMAND ARGS...`` whose arguments hold ``{a,b,c}``
groups into one :class:`Trial` per combination (the cartesian product, the first group varying
slowest: in the order the values are written); :func:`read_trials_file` makes one trial per line
of a file (the line's arguments after the command). A group is a ``{...}`` holding a comma and
no whitespace nor quote (``{}`` lists no value, which makes a grid with no trial: refused);
other braces are left as written (``{x}``, JSON, Python code such as ``{k: v for ...}``). A
trial's ``params`` name each varied value: the option it follows (``--lr {..}`` or ``--lr={..}``
-> ``lr``), else ``arg<position>``.
Pure functions and a plain record; no state.
"""

from __future__ import annotations

import itertools
import re
import shlex
from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Tuple

__all__ = ["SPACE", "Trial", "expand_grid", "grid_groups", "read_trials_file", "SweepInputError"]

_GROUP = re.compile(r"\{([^{}\s'\"]*)\}")
# An Optuna search space's dimension: {name:LOW..HIGH}, {name:LOW..HIGH:log}, {name:a,b,c}.
SPACE = re.compile(r"\{([A-Za-z_][\w.-]*):([^{}\s'\"]+)\}")


class SweepInputError(ValueError):
    """Bad input to a sweep, found before anything starts; the message names it and the fix."""


@dataclass
class Trial:
    """One run of the sweep: ``id`` (t000, t001, ... in grid order), the ``command`` it runs and
    the ``params`` that set it apart."""

    id: str
    command: List[str]
    params: Dict[str, str] = field(default_factory=dict)


def grid_groups(arg: str) -> List[re.Match]:
    return [m for m in _GROUP.finditer(arg) if "," in m.group(1) or m.group(1) == ""]


def _param_name(args: Sequence[str], i: int, prefix: str) -> str:
    """What a varied value of argument ``i`` is called: its option's name, else its place."""
    option = prefix.rstrip("=") if prefix.startswith("-") and prefix.endswith("=") else ""
    if not option and i > 0 and args[i - 1].startswith("-") and not prefix:
        option = args[i - 1]
    name = option.lstrip("-")
    return name or f"arg{i}"


def expand_grid(command: Sequence[str]) -> List[Trial]:
    """The trials of ``command`` (see the module doc); SweepInputError for a grid with no
    trial."""
    if not command:
        raise SweepInputError("no command: batchcast sweep [options] -- COMMAND ARGS...")
    spaces = [m.group(0) for arg in command for m in SPACE.finditer(arg)]
    if spaces:
        raise SweepInputError(f"{spaces[0]} declares an Optuna search space: give --optuna "
                              "STUDY --storage URL --n-trials N, or write a grid as {a,b}")
    slots: List[Tuple[int, re.Match, str]] = []  # (argument, group, parameter name)
    for i, arg in enumerate(command):
        for m in grid_groups(arg):
            if m.group(1) == "":
                raise SweepInputError(
                    f"argument {i} ({arg!r}) lists no value, so the grid has no trial: write "
                    "its values as {a,b,c}")
            name = _param_name(command, i, arg[: m.start()])
            taken = {n for _, _, n in slots}
            slots.append((i, m, name if name not in taken else f"{name}{len(slots)}"))
    choices = [m.group(1).split(",") for _, m, _ in slots]
    trials = []
    for n, values in enumerate(itertools.product(*choices)):
        args = list(command)
        by_arg: Dict[int, List[Tuple[re.Match, str]]] = {}
        for (i, m, _), value in zip(slots, values):
            by_arg.setdefault(i, []).append((m, value))
        for i, picks in by_arg.items():
            text = command[i]
            for m, value in reversed(picks):  # right to left: earlier offsets stay valid
                text = text[: m.start()] + value + text[m.end():]
            args[i] = text
        trials.append(Trial(f"t{n:03d}", args, {name: v for (_, _, name), v in
                                                 zip(slots, values)}))
    return trials


def _line_params(args: Sequence[str]) -> Dict[str, str]:
    """``--name value`` and ``--name=value`` pairs of a trials-file line; else the line."""
    params: Dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("-") and "=" in arg:
            name, _, value = arg.partition("=")
            params[name.lstrip("-")] = value
        elif arg.startswith("-") and i + 1 < len(args) and not args[i + 1].startswith("--"):
            params[arg.lstrip("-")] = args[i + 1]
            i += 1
        elif arg.startswith("-"):
            params[arg.lstrip("-")] = "true"
        else:
            params[f"arg{i}"] = arg
        i += 1
    return params


def read_trials_file(path: str, command: Sequence[str]) -> List[Trial]:
    """One trial per line of ``path`` (shell words; blank lines and ``#`` comments skipped):
    ``command`` followed by the line's arguments. SweepInputError where the file cannot be read
    or holds no trial."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise SweepInputError(f"--trials {path}: cannot read it ({e.strerror})") from e
    if grid_groups(" ".join(command)):
        raise SweepInputError("--trials gives each trial's arguments: write no {a,b} grid in "
                              "the command as well")
    trials = []
    for number, line in enumerate(lines, 1):
        try:
            args = shlex.split(line, comments=True)
        except ValueError as e:
            raise SweepInputError(f"--trials {path}, line {number}: {e}") from e
        if args:
            trials.append(Trial(f"t{len(trials):03d}", [*command, *args], _line_params(args)))
    if not trials:
        raise SweepInputError(f"--trials {path} holds no trial: write one trial's arguments per "
                              "line")
    return trials
