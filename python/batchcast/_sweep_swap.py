"""A sweep's hook into an unchanged script's torch DataLoaders: with ``batchcast sweep
--share-dataloaders`` a training loader joins the sweep's stream; in any sweep the training
loaders that stay torch's are counted, so that the trial's samples and wait are known.

What it is: :func:`install` (run by the ``sitecustomize`` the sweep puts first on a trial's
PYTHONPATH, ``_sweep_site/``) waits for ``torch`` to be imported, then replaces
``torch.utils.data.DataLoader`` with a subclass of it (``_swapping``). With
``--share-dataloaders`` (``SHARE_DATALOADERS_ENV``), a DataLoader made with ``shuffle=True`` (a
training loader) over a dataset whose pipeline ``_torchvision_plan`` recognises becomes a
``batchcast.DataLoader(..., share=KEY)`` (KEY scoped to the sweep: ``_share_scope.scoped_key``);
any other stays torch's own, and each DataLoader made logs one line (logger ``batchcast.sweep``,
WARNING: visible without logging set up) saying which it became and why. A shuffled loader that
stays torch's, with or without the flag, is torch's DataLoader counted (``_counting``): each
epoch's batches pass through untouched while their samples and the time spent waiting for them
go to the trial's progress file (``_sweep_progress.report_progress``), as a shared loader's do.
Nothing happens in a share producer process (it inherits the trial's environment) nor outside a
sweep. ``isinstance(x, torch.utils.data.DataLoader)`` stays true for every kind, as a subclass
made from the replaced name stays a torch DataLoader.

Thread-safety: install() runs once, at interpreter start-up; the swap itself is as thread-safe
as constructing a DataLoader; a counted loader is iterated as torch's is.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import itertools
import logging
import os
import sys
import time
from typing import Any, Iterator, Optional

from ._sweep_progress import SCOPE_ENV, SHARE_DATALOADERS_ENV, report_progress

__all__ = ["KEY", "install"]

KEY = "dataloader"  # the share key of swapped loaders (the scope's digest tells pipelines apart)
_log = logging.getLogger("batchcast.sweep")
_PARAMS = ("dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "num_workers",
           "collate_fn", "pin_memory", "drop_last")


def _describe(dataset: Any) -> str:
    root = getattr(dataset, "root", None)
    return f"{type(dataset).__name__}({root!r})" if root is not None else type(dataset).__name__


def _why_not(given: dict) -> Optional[str]:
    """None if the loader of these arguments (by name) joins the sweep's stream, else why not."""
    if "share" in given:
        return "it names its own share key"
    if given.get("shuffle") is not True:
        return "not shuffled (an evaluation or ordered loader stays torch's)"
    from . import _torchvision_plan

    # plan() logs a fallback on its own: this module's line says it, with the decision.
    planner = _torchvision_plan.log
    disabled, planner.disabled = planner.disabled, True
    try:
        found = _torchvision_plan.plan(given.get("dataset"), {
            k: given.get(k) for k in ("batch_size", "shuffle", "sampler", "batch_sampler",
                                      "collate_fn", "drop_last")})
    except Exception as e:  # noqa: BLE001 - a transform that surprises the recogniser
        return f"its pipeline could not be recognised ({type(e).__name__}: {e})"
    finally:
        planner.disabled = disabled
    return getattr(found, "reason", None)


class _Counts:
    """A counted loader's LoaderStats for the progress file: samples read, seconds waited."""

    def __init__(self) -> None:
        self.samples = 0
        self.wait_s = 0.0


def _samples_in(batch: Any) -> int:
    """A batch's sample count: the length of its first tensor ((images, labels), a dict of
    tensors, a tensor); 0 where there is none."""
    while isinstance(batch, (list, tuple)) and batch:
        batch = batch[0]
    if isinstance(batch, dict) and batch:
        batch = next(iter(batch.values()))
    try:
        return len(batch)
    except TypeError:
        return 0


def _timed(batches: Iterator[Any], counts: _Counts) -> Iterator[Any]:
    while True:
        start = time.monotonic()
        try:
            batch = next(batches)
        except StopIteration:
            return
        counts.wait_s += time.monotonic() - start
        counts.samples += _samples_in(batch)
        yield batch


def _counting(original: type) -> type:
    """A subclass of torch's ``original`` DataLoader whose epochs are counted (module doc)."""
    numbers = itertools.count()

    class DataLoader(original):  # type: ignore[misc, valid-type]
        __doc__ = original.__doc__

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._batchcast_counts = _Counts()
            self._batchcast_key = f"torch-dataloader-{next(numbers)}"

        def __iter__(self) -> Iterator[Any]:
            counts = self._batchcast_counts
            asked = time.time()  # before torch starts its workers: that is data's time too
            return report_progress(_timed(super().__iter__(), counts), self._batchcast_key,
                                   lambda: counts, asked)

    DataLoader.__module__ = original.__module__
    DataLoader.__qualname__ = original.__qualname__
    return DataLoader


def _swapping(original: type) -> type:
    """A subclass of torch's ``original`` DataLoader whose construction swaps or counts (module
    doc)."""
    counted = _counting(original)
    share = bool(os.environ.get(SHARE_DATALOADERS_ENV))

    def torchs(given: dict, *args: Any, **kwargs: Any) -> Any:
        """torch's own DataLoader: counted if it is a training loader."""
        return (counted if given.get("shuffle") is True else original)(*args, **kwargs)

    class _Meta(type(original)):  # type: ignore[misc]
        def __instancecheck__(cls, obj: Any) -> bool:
            return isinstance(obj, original)

        def __subclasscheck__(cls, sub: type) -> bool:
            return issubclass(sub, original)

    class DataLoader(original, metaclass=_Meta):  # type: ignore[misc, valid-type]
        __doc__ = original.__doc__

        def __new__(cls, *args: Any, **kwargs: Any) -> Any:
            if cls is not DataLoader:  # a script's own subclass: as torch's
                return original.__new__(cls)
            given = dict(zip(_PARAMS, args), **kwargs)
            if not share:
                return torchs(given, *args, **kwargs)
            dataset = given.get("dataset")
            why = _why_not(given)
            if why is not None:
                _log.warning("batchcast sweep: DataLoader over %s left as torch's: %s",
                             _describe(dataset), why)
                return torchs(given, *args, **kwargs)
            from .dataloader import DataLoader as Shared

            try:
                loader = Shared(*args, share=KEY, **kwargs)
            except (TypeError, ValueError) as e:
                _log.warning("batchcast sweep: DataLoader over %s left as torch's: the drop-in "
                             "refused its arguments (%s)", _describe(dataset), e)
                return torchs(given, *args, **kwargs)
            _log.warning("batchcast sweep: DataLoader over %s joins the sweep's stream "
                         "(batchcast.DataLoader(share=%r), %s)", _describe(dataset), KEY,
                         loader.decoding)
            return loader

    DataLoader.__module__ = original.__module__
    DataLoader.__qualname__ = original.__qualname__
    return DataLoader


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds ``torch`` as the other finders do, and swaps its DataLoader once torch is wholly
    imported (torch imports torch.utils.data half way through its own start-up, when
    batchcast.dataloader, which subclasses torch's DataLoader, cannot be imported yet)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            execute(module)
            data = sys.modules["torch.utils.data"]
            # batchcast.DataLoader subclasses torch's own: defined before the name changes.
            from . import dataloader  # noqa: F401

            data.DataLoader = _swapping(data.DataLoader)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Swaps torch's DataLoader once torch.utils.data is imported (see the module doc); does
    nothing outside a sweep or in a share producer."""
    if not os.environ.get(SCOPE_ENV):
        return
    if "batchcast._share_producer" in " ".join(sys.orig_argv if hasattr(sys, "orig_argv")
                                               else sys.argv):
        return
    sys.meta_path.insert(0, _AfterImport())
