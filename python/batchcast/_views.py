"""Views in Python: what ``Loader(view=...)``, ``serve(views=...)`` and ``DataLoader(share=)``
send as a view text (decoders/view.h; docs/views.md)."""

from typing import Any, Mapping, Optional, Union

from . import _batchcast

ViewLike = Union[None, str, Mapping[str, Any], _batchcast.View]

# The fields of a view, as the server reads them (the native list: decoders/view.h).
FIELDS = tuple(_batchcast.View.fields)


def _value(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return ":".join(_value(v) for v in value)
    if isinstance(value, float):
        return repr(value)
    return str(value)


def view_text(view: ViewLike) -> str:
    """A view as its text: a str as given, a :class:`_batchcast.View` as its canonical text, a
    mapping as ``FIELD=VALUE,...`` (sequences as ``A:B``), None as "" (the server's own
    transform). Unknown fields raise ValueError naming
    them; values are checked by the server, whose error names the field."""
    if view is None:
        return ""
    if isinstance(view, str):
        return view
    if isinstance(view, _batchcast.View):
        return view.text()
    unknown = [k for k in view if k not in FIELDS]
    if unknown:
        raise ValueError(f"view field(s) {', '.join(map(repr, unknown))} unknown; "
                         f"fields: {', '.join(FIELDS)}")
    return ",".join(f"{k}={_value(v)}" for k, v in view.items() if v is not None)


def optional_view_text(view: ViewLike) -> Optional[str]:
    text = view_text(view)
    return text or None
