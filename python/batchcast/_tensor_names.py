"""The wire's tensor names (docs/protocol.md), the one definition on the Python side.

"#0", "#1", ... are tuple positions, "#" alone is a bare tensor, and any other name is a dict key
(so a dict key may not start with "#"). The Producer names what it sends with them; the Loader
rebuilds the batch's structure from them.
"""

from __future__ import annotations

from typing import Optional

BARE = "#"  # a batch that is one tensor
PREFIX = "#"  # reserved: no dict key starts with it


def tuple_name(i: int) -> str:
    """The name of tuple position ``i``."""
    return f"{PREFIX}{i}"


def tuple_position(name: str) -> Optional[int]:
    """``i`` for the name of tuple position i, else None."""
    digits = name[len(PREFIX):]
    return int(digits) if name.startswith(PREFIX) and digits.isdigit() else None
