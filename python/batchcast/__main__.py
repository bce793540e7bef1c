"""The `batchcast` program on PATH (the package's console script; also `python -m batchcast`).

`report`, `track`, `bench` and `sweep` are Python and run here; everything else (`serve`, `make-dataset`,
`--help`, `--version`, ...) replaces this process with the native program shipped in the package
(batchcast/_bin/batchcast), so that signals such as Ctrl-C or a supervisor's SIGTERM reach the
native server directly and nothing of Python stays in memory beside it. Importing torch would
slow every `serve` start: nothing on that path imports it.
"""

from __future__ import annotations

import os
import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    command = args[0] if args else None
    if command == "report":
        from .tools.report import main as report

        return report(args[1:])
    if command == "track":
        from .tools.track import main as track

        return track(args[1:])
    if command == "sweep":
        from ._sweep import main as sweep

        return sweep(args[1:])
    if command == "bench":
        if "--views" in args:  # docs/views.md: a sweep of views against its DataLoaders
            from .tools.bench.views import main as bench
        else:
            from .tools.bench.collocated import main as bench

        bench(args[1:])
        return 0
    from .server import find_binary

    program = find_binary()
    os.execv(program, [program, *args])
    return 127  # not reached: execv returns only by raising


if __name__ == "__main__":
    sys.exit(main())
