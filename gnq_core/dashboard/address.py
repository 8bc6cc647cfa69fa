"""The address bar as a copy of what a page shows: a widget's value goes into the URL
(st.query_params) and a URL opened elsewhere sets the widget back, so copying the address shares
exactly the view. A parameter left at its default is left out of the URL (short links).

Before drawing a widget, ``restore`` gives its key the address's value (when the address carries
one this session did not write itself) or its current or default value; the widget is then drawn
with that key and no ``value``/``index`` of its own; after it, ``record`` writes the value back.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import streamlit as st

_WRITTEN = "_address_written"  # param -> the values this session last wrote to the address


def _written() -> dict[str, list[str]]:
    return st.session_state.setdefault(_WRITTEN, {})


def restore(key: str, param: str, default: Any, parse: Callable[[list[str]], Any]) -> None:
    """Set widget ``key`` from ``?param=`` when the address brings a value this session did not
    write, or the widget has no value (a page opened anew, e.g. by the browser's Back); else keep
    the widget's value (``default`` at first). A value ``parse`` refuses (ValueError) is named in
    one line and ignored, never half-applied."""
    raw = st.query_params.get_all(param)
    if raw and (raw != _written().get(param) or key not in st.session_state):
        _written()[param] = raw
        try:
            st.session_state[key] = parse(raw)
            return
        except (ValueError, TypeError, IndexError):
            st.warning(f"The address's `{param}` value is not one this page offers; ignored.")
    try:  # the value kept from before must still fit (e.g. k on a smaller run)
        st.session_state[key] = parse(_raw(st.session_state.get(key, default)))
    except (ValueError, TypeError, IndexError):
        st.session_state[key] = default


def _fmt(value: Any) -> str:
    """Booleans as 1/0; floats exactly (repr), whole ones without ".0"."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    return str(value)


def _raw(value: Any, fmt: Callable[[Any], str] = _fmt) -> list[str]:
    return [fmt(v) for v in value] if isinstance(value, list | tuple) else [fmt(value)]


def record(param: str, value: Any, default: Any, fmt: Callable[[Any], str] = _fmt) -> None:
    """Write ``value`` to ``?param=`` (one entry per item of a list), or leave it out at ``default``."""
    if value == default:
        forget(param)
        return
    raw = _raw(value, fmt)
    st.query_params[param] = raw if isinstance(value, list | tuple) else raw[0]
    _written()[param] = raw


def forget(*params: str) -> None:
    """Leave ``params`` out of the address (e.g. the threshold while flagging by top-k)."""
    for param in params:
        if param in st.query_params:
            del st.query_params[param]
        _written()[param] = []


# ----------------------------------------------------------------------------- parsers
def one_of(choices: Sequence[str]) -> Callable[[list[str]], str]:
    def parse(raw: list[str]) -> str:
        if raw[0] not in choices:
            raise ValueError(raw[0])
        return raw[0]
    return parse


def number(low: float, high: float, kind: type = float) -> Callable[[list[str]], float]:
    """A number clipped to the widget's range (a link made on a larger run still opens)."""
    def parse(raw: list[str]) -> float:
        value = float(raw[0])
        if not math.isfinite(value):
            raise ValueError(raw[0])
        return kind(min(max(kind(value), low), high))
    return parse


def flag(raw: list[str]) -> bool:
    if raw[0] not in ("0", "1"):
        raise ValueError(raw[0])
    return raw[0] == "1"


def text(raw: list[str]) -> str:
    return raw[0]


def subset(choices: Sequence[str]) -> Callable[[list[str]], list[str]]:
    def parse(raw: list[str]) -> list[str]:
        if any(v not in choices for v in raw):
            raise ValueError(raw)
        return list(raw)
    return parse
