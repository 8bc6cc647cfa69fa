"""The checks every settings object runs on its values when it is built (the CLI's job settings,
``GNQConfig``, the auditors): one ``ValueError`` line naming the setting and the allowed range,
before anything is written or trained, never a failure at the first step."""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Iterable

# The store keeps seeds, sizes and counts in INTEGER columns (32-bit): a value must fit before the
# run is created, or the insert fails half-way (a run with no points blocking its name).
INT32_MAX = 2**31 - 1


def require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def whole(value: object, option: str, low: int, high: int = INT32_MAX) -> None:
    """``value`` is a whole number in [low, high]: ints and numpy integers; not bools, floats or strings."""
    try:
        ok = not isinstance(value, bool) and low <= operator.index(value) <= high  # type: ignore[arg-type]
    except TypeError:
        ok = False
    require(ok, f"{option} must be a whole number from {low:,} to {high:,}, got {value!r}")


def finite(value: object, option: str, low: float = 0.0, *, above: bool = False) -> None:
    """``value`` is a finite real (numpy's too) ≥ ``low`` (> ``low`` with ``above``)."""
    ok = (isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
          and (value > low if above else value >= low))
    bound = "" if low == -math.inf else f" {'>' if above else '≥'} {low:g}"
    require(ok, f"{option} must be a finite number{bound}, got {value!r}")


def one_of(value: object, option: str, choices: Iterable[object]) -> None:
    choices = tuple(choices)
    require(value in choices, f"{option} must be one of {', '.join(map(repr, choices))}, got {value!r}")


def flag(value: object, option: str) -> None:
    require(isinstance(value, bool), f"{option} must be True or False, got {value!r}")
