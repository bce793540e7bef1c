"""Other processes as Linux's /proc shows them: the fields of ``/proc/PID/stat`` after the
command name (which may hold spaces and parentheses), read in one place for the launcher's,
the sweep's and ``batchcast track``'s questions about processes that are not their children.
Pure reads; no state."""

from __future__ import annotations

from typing import List, Optional

__all__ = ["pid_running", "stat_fields"]


def stat_fields(pid: int) -> Optional[List[bytes]]:
    """The fields of /proc/PID/stat from the state on (state, ppid, ... as proc(5) numbers them
    from 3), or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def pid_running(pid: int) -> bool:
    """A process that is no child of this one (a detached server): alive and not a zombie."""
    fields = stat_fields(pid)
    return fields is not None and fields[0] != b"Z"
