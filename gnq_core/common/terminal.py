"""Strings from untrusted files or users made safe for a terminal: one helper used by the one-line
errors, the progress bar, `gnq runs` and every message that names a file, run or text.

A folder name or CSV header can hold ``ESC]0;…`` (set the window title), ``ESC[2J`` (clear the
screen), ``ESC]52;c;…`` (write the clipboard), BEL, or right-to-left overrides that make a name
read as another.  Every control (C0, DEL, C1), format (bidi overrides and isolates, zero-width)
and line/paragraph separator character is written as a visible escape (``\\x1b``, ``\\u202e``),
and rich markup (``[red]``) is escaped, so the terminal shows the name and acts on nothing.
"""

from __future__ import annotations

import contextlib
import re
import sys
import unicodedata

from rich.markup import escape as _escape_markup

_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
_ASCII_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _escaped(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def terminal_safe(text: object, *, keep_newlines: bool = False) -> str:
    """``text`` with every character a terminal could act on written as a visible escape
    (``keep_newlines``: ``\\n`` stays, for multi-line messages we wrote ourselves)."""
    s = str(text)
    if s.isascii() and not _ASCII_CONTROL.search(s):
        return s  # the common case, fast
    return "".join(_escaped(c) if (unicodedata.category(c) in _UNSAFE_CATEGORIES
                                   and not (keep_newlines and c == "\n")) else c for c in s)


def markup_safe(text: object) -> str:
    """``terminal_safe`` and with rich markup escaped: for strings printed with markup on."""
    return _escape_markup(terminal_safe(text))


def encodable_streams() -> None:
    """stdout and stderr write what their encoding cannot hold as escapes (``\\xd7``) instead of
    raising: under the C locale (ASCII) a message with "×" or a Greek text would otherwise end the
    command with "'ascii' codec can't encode"."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError):  # replaced by a test runner, or closed
            stream.reconfigure(errors="backslashreplace")
