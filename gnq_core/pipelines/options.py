"""A user's options as job settings, for ``gnq audit`` and the dashboard's New audit form alike.

What a user types or picks is read here once: ``--companions N|all`` (the form's three choices
become the same text) and ``--batch-size``; ``audit_job`` is the one mapping from an audit's
options to its ``AuditJob``.  settings.py then checks every value, as for a job file read back."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

from gnq_core.pipelines.settings import COMPANIONS_ALL, AuditJob, AuditSettings

__all__ = ["COMPANION_CHOICES", "audit_job", "companion_choice", "companion_set_size", "companions_option",
           "parse_batch_size", "parse_companions"]

COMPANION_CHOICES = ("batch", "n", COMPANIONS_ALL)  # the form's: no --companions, --companions N or all


def companions_option(choice: str, n: int) -> str | None:
    """The form's choice (N from its own field) as the text --companions would be given."""
    return None if choice == "batch" else str(n) if choice == "n" else choice


def companion_choice(companions: int | str | None) -> str:
    """The form's choice for an ``AuditSettings.companions`` value (its default, say)."""
    return "batch" if companions is None else COMPANIONS_ALL if companions == COMPANIONS_ALL else "n"


def parse_companions(value: str | int | None) -> int | str | None:
    """--companions: None (against the others of its batch), N other texts or "all" of them;
    a value that is neither stays as given, for the settings to refuse in one line."""
    text = value.strip().lower() if isinstance(value, str) else None
    if text is None:
        return value
    return COMPANIONS_ALL if text == COMPANIONS_ALL else int(text) if text.isdecimal() else value


def parse_batch_size(value: Any) -> Any:
    """--batch-size as a whole number (the form's number field may give 16.0); anything else stays
    as given, for the settings' one rule (``check_gnq_settings``) to refuse."""
    text = isinstance(value, str) and value.strip().isdecimal()
    return int(value) if text or (isinstance(value, float) and value.is_integer()) else value


def companion_set_size(settings: AuditSettings, n_texts: int) -> int | None:
    """Texts in a companion set (a text and its N companions; all of them with "all"; never more
    than there are), None without companions: the GNQ batches are then the batch size's."""
    if settings.companions is None:
        return None
    return n_texts if settings.companions == COMPANIONS_ALL else min(int(settings.companions) + 1, n_texts)


def audit_job(*, companions: str | int | None = None, batch_size: Any = AuditSettings.batch_size,
              **options: Any) -> AuditJob:
    """The ``AuditJob`` an audit's options ask for (``gnq audit``'s or the form's; an option named
    as its ``AuditSettings`` or ``AuditJob`` field, a path as a ``Path`` too), validated;
    ValueError with one line when they are not."""
    if options.get("reference") is not None and options.get("non_members") is None:
        raise ValueError("--reference calibrates the membership signals: give --non-members FILE with it")
    given = {k: str(v) if isinstance(v, Path) else v for k, v in options.items()}
    ours = {f.name for f in fields(AuditSettings)}
    settings = AuditSettings(companions=parse_companions(companions), batch_size=parse_batch_size(batch_size),
                             **{k: v for k, v in given.items() if k in ours})
    return AuditJob(settings=settings, **{k: v for k, v in given.items() if k not in ours})
