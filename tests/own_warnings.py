"""Deprecation warnings from our own call sites fail the test that triggers them.

A library's FutureWarning or DeprecationWarning (``past_key_values`` is deprecated...) names the
library's file, not ours: transformers warns from its own wrapper, so a ``filterwarnings`` entry
scoped to gnq_core's modules never sees it.  This hook sits where every warning that passes the
filters is shown (``warnings._showwarnmsg``, called while the warning's stack is still live) and
walks that stack to the first frame outside site-packages and the standard library: when it is
gnq_core's (or the app's), the call that warned is ours to fix, and the test fails naming it.  A
warning that our code silences at the call site (``warnings.catch_warnings``) is never shown, so
it passes; one a test triggers by calling the library itself is the test's, not ours.
"""

from __future__ import annotations

import sys
import sysconfig
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OURS = tuple(str(ROOT / package) + "/" for package in ("gnq_core", "app"))
LIBRARIES = tuple({sysconfig.get_paths()[k] + "/" for k in ("stdlib", "platstdlib", "purelib", "platlib")})
CATEGORIES = (DeprecationWarning, FutureWarning)

found: list[str] = []  # this phase's warnings from our call sites


def call_site(frame, named: str | None = None) -> str | None:
    """``file:line`` of the first frame from ``frame`` down that is neither a library's nor the
    standard library's, when it is our code's; None when it is a test's (or none is).  ``named``:
    the file the warning names (its ``stacklevel``): the walk starts at that frame, so our own
    deprecation shim (a renamed name that still reads, warning with stacklevel=2) is its caller's
    warning: a test's when a test calls the old name, ours when our code does."""
    start = frame
    while named is not None and frame is not None and frame.f_code.co_filename != named:
        frame = frame.f_back
    frame = frame if frame is not None else start
    while frame is not None:
        name = frame.f_code.co_filename
        if not (name.startswith(LIBRARIES) or name.startswith("<")):
            if name.startswith(OURS):
                return f"{Path(name).relative_to(ROOT)}:{frame.f_lineno}"
            return None
        frame = frame.f_back
    return None


def install() -> None:
    """Wrap ``warnings._showwarnmsg`` once (catch_warnings keeps it: it swaps ``_showwarnmsg_impl``)."""
    shown = warnings._showwarnmsg
    if getattr(shown, "_own_warnings", False):
        return

    def showing(msg: warnings.WarningMessage) -> None:
        if issubclass(msg.category, CATEGORIES):
            site = call_site(sys._getframe(1), msg.filename)
            if site is not None:
                found.append(f"{msg.category.__name__} from our call at {site}: {msg.message}")
        shown(msg)

    showing._own_warnings = True  # type: ignore[attr-defined]
    warnings._showwarnmsg = showing


def take() -> list[str]:
    out = list(dict.fromkeys(found))
    found.clear()
    return out
