"""Sizes given by users as bytes or as text ("512MiB", "2G"): ``DataLoader(share_memory=)`` and
``batchcast sweep --share-memory``, read as ``batchcast serve --ring-memory`` reads them (binary
units). Pure functions; no torch."""

from __future__ import annotations

import re
from typing import Union

__all__ = ["size_bytes"]

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def size_bytes(value: Union[None, int, str], name: str) -> int:
    """Bytes of a size given as an int or a text such as "512MiB", "2G", "64kb" (binary units,
    as ``batchcast serve --ring-memory``); None: 0 (the default). ValueError names `name`."""
    if value is None:
        return 0
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", str(value), re.I)
    if isinstance(value, str) and match and float(match.group(1)) > 0:
        return int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    raise ValueError(f"{name}={value!r}: a positive number of bytes, or a size such as "
                     "'512MiB' or '2G'")
