"""The live table of a sweep: one row per trial (trial, GPU, state, epoch, samples/s, waiting on
data %), redrawn in place on a terminal, else printed as plain lines when a trial changes state.

Thread-safety: none; the sweep's one thread draws it. It writes to the stream it was given.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Dict, List, Optional, TextIO

__all__ = ["LiveTable"]

_HEAD = ("trial", "gpu", "state", "epoch", "samples/s", "wait %", "params")


def _row(t: Dict[str, Any], now: float) -> tuple:
    gpu = "-" if t.get("gpu") is None else str(t["gpu"])
    state = t["state"] if t.get("exit_code") in (None, 0) else f"{t['state']} ({t['exit_code']})"
    rate = t.get("samples_per_s")
    wait = t.get("wait_percent")
    epoch = t.get("epochs")
    params = " ".join(f"{k}={v}" for k, v in t.get("params", {}).items())
    return (t["id"], gpu, state, "-" if epoch is None else str(epoch),
            "-" if rate is None else f"{rate:.0f}", "-" if wait is None else f"{wait:.0f}",
            params)


class LiveTable:
    """Draws the trials' rows; ``tty`` None: whether ``out`` is a terminal."""

    def __init__(self, out: Optional[TextIO] = None, tty: Optional[bool] = None) -> None:
        self._out = out or sys.stdout
        self._tty = self._out.isatty() if tty is None else tty
        self._drawn = 0  # lines of the last drawing (a terminal's)
        self._states: Dict[str, str] = {}

    def say(self, line: str) -> None:
        """A line above the table (kept on a terminal: the table is drawn below it again)."""
        self._clear()
        print(line, file=self._out, flush=True)

    def draw(self, trials: List[Dict[str, Any]]) -> None:
        now = time.time()
        rows = [_HEAD] + [_row(t, now) for t in trials]
        widths = [max(len(r[i]) for r in rows) for i in range(len(_HEAD))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        if self._tty:
            self._clear()
            self._out.write("\n".join(lines) + "\n")
            self._out.flush()
            self._drawn = len(lines)
            return
        if not self._states:
            print(lines[0], file=self._out, flush=True)
        for t, line in zip(trials, lines[1:]):
            if self._states.get(t["id"]) != t["state"]:
                self._states[t["id"]] = t["state"]
                print(line, file=self._out, flush=True)

    def _clear(self) -> None:
        if self._tty and self._drawn:
            self._out.write(f"\x1b[{self._drawn}F\x1b[J")  # up to the table's top, clear below
            self._drawn = 0
