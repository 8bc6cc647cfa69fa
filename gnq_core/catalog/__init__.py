"""The catalog: one entry per secret kind (kinds.py) and per per-text signal (signals.py), the
facts every layer reads about them.  The bottom floor: it imports no other gnq_core package and
no torch, so the store, the attacks, the analysis and the dashboard all read the same entries."""

from gnq_core.catalog.checksums import iban_ok, luhn_ok
from gnq_core.catalog.kinds import (
    BASE62,
    DIGITS,
    KIND_BY_NAME,
    KINDS,
    RELATIVE,
    RELATIVE_TEMPLATE,
    SPACE,
    UNKNOWN,
    Check,
    SecretKind,
    count_words,
    kind,
)
from gnq_core.catalog.signals import SIGNAL_BY_COLUMN, SIGNALS, Signal, signal

__all__ = ["BASE62", "DIGITS", "KINDS", "KIND_BY_NAME", "RELATIVE", "RELATIVE_TEMPLATE", "SIGNALS",
           "SIGNAL_BY_COLUMN", "SPACE", "UNKNOWN", "Check", "SecretKind", "Signal", "count_words", "iban_ok",
           "kind", "luhn_ok", "signal"]
