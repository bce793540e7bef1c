"""ExitGuard: makes a process that owns a batchcast pool (or a ``batchcast serve`` child)
release it however the process ends, short of SIGKILL.

A process killed by a signal it does not handle dies without unwinding: its ``finally`` blocks
and ``with`` exits never run, so a Producer's shared segment and ipc socket file, or a
``batchcast.serve()`` child, would outlive it. Batch schedulers end jobs with SIGTERM and a
lost terminal sends SIGHUP, so while any guard is held these become ``SystemExit(128 + signum)``
raised in the main thread, which unwinds through ``run()`` / the ``with`` block to the owner's
close. SIGINT already raises KeyboardInterrupt and is left alone. Blocking native calls check
for signals every 50 ms (python/src/blocking_call.h), so the exception comes promptly. An
owner still open when the interpreter exits normally is closed by an atexit hook.

Only handlers still at SIG_DFL are replaced (an application's own handler wins), only from the
main thread (Python allows no other), and they are restored when the last guard is released.
Thread-safety: create and release guards from one thread at a time; from a thread other than
the main one a guard installs no handler (it still closes its owner at exit).
Lifetime: the guard holds its owner weakly; release() (idempotent) undoes what it did.
"""

from __future__ import annotations

import atexit
import signal
import threading
import weakref
from typing import Any, Callable, Dict

_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_previous: Dict[int, Any] = {}  # signal -> the handler to restore
_holders = 0  # guards holding the handlers


def _raise_exit(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


class ExitGuard:
    """Held by an owner from the moment it owns a pool until its ``close`` ran."""

    def __init__(self, close: Callable[[], Any]) -> None:
        global _holders
        self._holds_signals = threading.current_thread() is threading.main_thread()
        if self._holds_signals:
            if _holders == 0:
                for signum in _SIGNALS:
                    if signal.getsignal(signum) is signal.SIG_DFL:
                        _previous[signum] = signal.signal(signum, _raise_exit)
            _holders += 1
        method = weakref.WeakMethod(close)  # type: ignore[arg-type]

        def close_at_exit() -> None:
            bound = method()
            if bound is not None:
                bound()

        self._at_exit: Any = close_at_exit
        atexit.register(close_at_exit)

    def release(self) -> None:
        global _holders
        if self._at_exit is None:
            return
        atexit.unregister(self._at_exit)
        self._at_exit = None
        if self._holds_signals:
            _holders -= 1
            if _holders == 0:
                for signum, previous in _previous.items():
                    if signal.getsignal(signum) is _raise_exit:
                        signal.signal(signum, previous)
                _previous.clear()
