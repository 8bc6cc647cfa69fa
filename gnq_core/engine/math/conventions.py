"""The names of GNQ's settings that every layer reads: the per-example loss convention
(``losses.py`` computes it, DESIGN.md §1) and the λ mode (``solve.py``).  Plain strings without
torch: the store, the settings types and the read-only commands check and record them without
importing the engine's tensor code."""

from __future__ import annotations

__all__ = ["IGNORE_INDEX", "LAM_ABSOLUTE", "LAM_MODES", "LAM_RELATIVE", "LOSS_CONVENTIONS", "TOKEN_MEAN",
           "TOKEN_SUM", "check_lam_mode", "check_loss_convention"]

IGNORE_INDEX = -100  # a label the loss skips (padding), as Hugging Face's
TOKEN_MEAN, TOKEN_SUM = "token_mean", "token_sum"
LOSS_CONVENTIONS = (TOKEN_MEAN, TOKEN_SUM)
LAM_ABSOLUTE, LAM_RELATIVE = "absolute", "relative"
LAM_MODES = (LAM_ABSOLUTE, LAM_RELATIVE)


def check_loss_convention(convention: str) -> str:
    if convention not in LOSS_CONVENTIONS:
        raise ValueError(f"unknown loss convention {convention!r} ({', '.join(LOSS_CONVENTIONS)})")
    return convention


def check_lam_mode(mode: str) -> str:
    if mode not in LAM_MODES:
        raise ValueError(f"unknown λ mode {mode!r} ({', '.join(LAM_MODES)})")
    return mode
