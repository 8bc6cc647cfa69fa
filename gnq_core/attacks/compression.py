"""The bits a generic compressor needs for a text: the denominator of the zlib ratio (a
membership signal, ``membership.py``).  Without torch: the read-only membership frame uses it."""

from __future__ import annotations

import zlib

__all__ = ["zlib_bits"]


def zlib_bits(text: str) -> int:
    return 8 * len(zlib.compress(text.encode("utf-8")))
