"""``batchcast sweep --optuna STUDY --storage URL --n-trials N``: trials asked of an Optuna study.

What it is: :func:`search_space` reads the command's dimensions (``{lr:1e-4..1e-1:log}``,
``{epochs:1..5}``: integers where both ends are, ``{bs:32,64}``: a choice, of numbers where
every value is one); :class:`OptunaTrials`
is the runner's source of trials: each time a slot is free it asks the study (ask-and-tell) for
a trial while the study holds fewer than N, writes the suggested values into the command, and
when the trial ends tells the study its objective: the last ``batchcast-objective: VALUE`` line
of its log, or what it wrote to ``$BATCHCAST_OBJECTIVE_FILE`` (which wins). A trial that failed,
was stopped, or reported no objective is told FAIL. Several sweep processes (one per node) run
the same command against one storage: trial numbers are the storage's, so none runs twice; one
that asks when the study already holds N gets a trial number >= N, tells it FAIL at once and
asks no more (so the study may show one such FAIL per process beyond the N run).

Thread-safety: none; the sweep's one thread uses it. Optuna is imported here only.
"""

from __future__ import annotations

import math
import os
import re
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ._sweep_trials import SPACE, SweepInputError, grid_groups

__all__ = ["Dimension", "OptunaTrials", "search_space", "OBJECTIVE_ENV"]

OBJECTIVE_ENV = "BATCHCAST_OBJECTIVE_FILE"
_OPEN_ATTEMPTS = 5
_OBJECTIVE = re.compile(r"^batchcast-objective:\s*(\S+)\s*$", re.M)


@dataclass
class Dimension:
    """One dimension of the search space: ``kind`` float, int or choice."""

    name: str
    kind: str
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    choices: Tuple[Any, ...] = ()

    def suggest(self, trial: Any) -> Any:
        if self.kind == "choice":
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.kind == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high), log=self.log)
        return trial.suggest_float(self.name, self.low, self.high, log=self.log)


def _choices(body: str) -> Tuple[Any, ...]:
    """A choice's values: numbers where every one is a number (Optuna records their type)."""
    texts = body.split(",")
    for kind in (int, float):
        try:
            return tuple(kind(t) for t in texts)
        except ValueError:
            continue
    return tuple(texts)


def _dimension(name: str, body: str) -> Dimension:
    if ".." not in body:
        return Dimension(name, "choice", choices=_choices(body))
    bounds, _, scale = body.partition(":")
    low_text, _, high_text = bounds.partition("..")
    if scale not in ("", "log"):
        raise SweepInputError(f"{{{name}:{body}}}: the scale after the range is log or nothing")
    try:
        low, high = float(low_text), float(high_text)
    except ValueError:
        raise SweepInputError(f"{{{name}:{body}}}: write a range as LOW..HIGH (numbers), or "
                              "choices as a,b,c") from None
    if not low < high or (scale == "log" and low <= 0) or not math.isfinite(high - low):
        raise SweepInputError(f"{{{name}:{body}}}: LOW must be below HIGH (and above 0 on a "
                              "log scale)")
    whole = all(re.fullmatch(r"-?\d+", t) for t in (low_text, high_text))
    return Dimension(name, "int" if whole else "float", low, high, scale == "log")


def search_space(command: Sequence[str]) -> Dict[str, Dimension]:
    """The dimensions the command declares, by name; SweepInputError where it declares none,
    declares a name twice, or also holds an unnamed grid."""
    space: Dict[str, Dimension] = {}
    for arg in command:
        for m in SPACE.finditer(arg):
            if m.group(1) in space:
                raise SweepInputError(f"{m.group(0)}: {m.group(1)} is declared twice")
            space[m.group(1)] = _dimension(m.group(1), m.group(2))
        rest = SPACE.sub("", arg)
        if grid_groups(rest):
            raise SweepInputError(f"{arg!r}: with --optuna every value set is named: write "
                                  "{name:a,b} (a choice) or {name:LOW..HIGH[:log]}")
    if not space:
        raise SweepInputError("--optuna: the command declares no search space: write e.g. "
                              "--lr {lr:1e-4..1e-1:log} --batch-size {bs:32,64}")
    return space


def _objective(record: Dict[str, Any]) -> Optional[float]:
    text = None
    try:
        with open(record["env"][OBJECTIVE_ENV]) as f:
            text = f.read().strip()
    except OSError:
        try:
            with open(record["log"], errors="replace") as f:
                found = _OBJECTIVE.findall(f.read())
            text = found[-1] if found else None
        except OSError:
            pass
    try:
        return None if text is None else float(text)
    except ValueError:
        return None


class OptunaTrials:
    """The runner's source of trials (see the module doc)."""

    def __init__(self, study: str, storage: str, n_trials: int, direction: str,
                 command: Sequence[str], out: str) -> None:
        try:
            import optuna
        except ImportError:
            raise SweepInputError("--optuna needs Optuna: apt-get install python3-optuna "
                                  "(scripts/setup.sh does), or pip install optuna") from None
        if n_trials < 1:
            raise SweepInputError(f"--n-trials {n_trials}: give 1 or more")
        self._space = search_space(command)
        self._command = list(command)
        self._n = n_trials
        self._out = out
        self._optuna = optuna
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.study = self._open(study, storage, direction)
        self._asked: Dict[str, Any] = {}
        self.exhausted = False

    def _open(self, study: str, storage: str, direction: str) -> Any:
        """The study, made where it does not exist yet. Sweeps of several nodes starting at
        once race to create the storage's tables and the study: the loser's error is retried
        (the winner's tables and study are then there), a few times before giving up."""
        for attempt in range(_OPEN_ATTEMPTS):
            try:
                return self._optuna.create_study(study_name=study, storage=storage,
                                                 load_if_exists=True, direction=direction)
            except Exception as e:  # noqa: BLE001 - a storage Optuna refuses, in its words
                if attempt + 1 == _OPEN_ATTEMPTS:
                    raise SweepInputError(f"--storage {storage}: Optuna cannot open study "
                                          f"{study} there ({e})") from e
                time.sleep(0.5 * (attempt + 1))
        raise AssertionError("not reached")

    def next(self) -> Optional[Dict[str, Any]]:
        """A new trial's record, or None once the study holds N trials."""
        if self.exhausted:
            return None
        if len(self.study.get_trials(deepcopy=False)) >= self._n:
            self.exhausted = True
            return None
        trial = self.study.ask()
        if trial.number >= self._n:  # another process asked meanwhile
            self.study.tell(trial, state=self._optuna.trial.TrialState.FAIL)
            self.exhausted = True
            return None
        values = {name: d.suggest(trial) for name, d in self._space.items()}
        command = [SPACE.sub(lambda m: str(values[m.group(1)]), arg) for arg in self._command]
        tid = f"o{trial.number:03d}"
        self._asked[tid] = trial
        return {"id": tid, "command": command, "params": {k: str(v) for k, v in values.items()},
                "state": "queued", "gpu": None, "exit_code": None, "start": None, "end": None,
                "samples": None, "samples_per_s": None, "optuna_trial": trial.number,
                "log": os.path.join(self._out, "trials", f"{tid}.log"),
                "env": {OBJECTIVE_ENV: os.path.join(self._out, "trials", f"{tid}.objective")}}

    def ended(self, record: Dict[str, Any]) -> None:
        """Tells the study how the record's trial ended."""
        trial = self._asked.pop(record["id"], None)
        if trial is None:
            return
        value = _objective(record) if record.get("exit_code") == 0 else None
        record["objective"] = value
        if value is None:
            self.study.tell(trial, state=self._optuna.trial.TrialState.FAIL)
        else:
            self.study.tell(trial, value)

    def pending(self) -> List[str]:
        """Trials asked and not told yet."""
        return list(self._asked)
