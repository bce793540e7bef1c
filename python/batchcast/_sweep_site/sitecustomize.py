"""Put first on a trial's PYTHONPATH by ``batchcast sweep``: Python runs the first
``sitecustomize`` it finds at start-up, so this one installs the sweep's DataLoader hook
(``batchcast._sweep_swap``: shared with --share-dataloaders, else counted), then runs the
``sitecustomize`` it shadows (the next one on sys.path, e.g. Debian's), as if this one were not
there.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _run_shadowed() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


try:
    from batchcast._sweep_swap import install
except ImportError as e:  # batchcast is not importable by this interpreter: say so, go on
    print(f"batchcast sweep: batchcast is not importable by {sys.executable} ({e}): this "
          "trial's DataLoaders are neither shared nor counted", file=sys.stderr)
else:
    install()
_run_shadowed()
