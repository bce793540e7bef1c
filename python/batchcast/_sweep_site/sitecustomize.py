"""Put first on a trial's PYTHONPATH by ``batchcast sweep --share-dataloaders``: Python runs the
first ``sitecustomize`` it finds at start-up, so this one installs the DataLoader swap
(``batchcast._sweep_swap``), then runs the ``sitecustomize`` it shadows (the next one on
sys.path, e.g. Debian's), as if this one were not there.
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
    print(f"batchcast sweep --share-dataloaders: not installed in {sys.executable} ({e})",
          file=sys.stderr)
else:
    install()
_run_shadowed()
