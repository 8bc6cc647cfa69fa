"""A user's options as job settings, for ``gnq audit`` and the dashboard's New audit form alike.

What a user types or picks is parsed here once: ``--companions N|all`` (the form's three choices
arrive as the same values: None, N or "all") and ``--batch-size``; ``audit_job`` is the one
mapping from an audit's options to its ``AuditJob``, so the command and the form's Start button
build the same settings from the same values.  settings.py then checks every value, as it does a
job file read back (``job_from_dict``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gnq_core.pipelines.settings import COMPANIONS_ALL, AuditJob, AuditSettings

__all__ = ["COMPANION_CHOICES", "audit_job", "companion_choice", "companion_set_size", "companions_option",
           "parse_batch_size", "parse_companions"]

# The form's three choices: no --companions (its batch), --companions N, --companions all.
COMPANION_CHOICES = ("batch", "n", COMPANIONS_ALL)


def companions_option(choice: str, n: int) -> str | None:
    """The form's choice (one of ``COMPANION_CHOICES``, N from its own field) as the text
    --companions would be given, parsed then as the CLI's is."""
    return None if choice == "batch" else str(n) if choice == "n" else choice


def companion_choice(companions: int | str | None) -> str:
    """The form's choice for an ``AuditSettings.companions`` value (its default, say)."""
    return "batch" if companions is None else COMPANIONS_ALL if companions == COMPANIONS_ALL else "n"


def parse_companions(value: str | int | None) -> int | str | None:
    """--companions: None (each text against the others of its batch), N other texts of the data,
    or "all" of them; a value that is neither stays as given, for the settings to refuse."""
    if not isinstance(value, str):
        return value
    text = value.strip().lower()
    if text == COMPANIONS_ALL:
        return COMPANIONS_ALL
    return int(text) if text.isdecimal() else value


def parse_batch_size(value: int | float | str) -> int | float | str:
    """--batch-size, the texts of a GNQ batch (with companions: of a pass): a whole number, also
    when the form's number field gives 16.0; anything else stays as given, for the settings'
    one rule (``check_gnq_settings``) to refuse."""
    if isinstance(value, str) and value.strip().isdecimal():
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def companion_set_size(settings: AuditSettings, n_texts: int) -> int | None:
    """Texts in a companion set (each text and its N companions; all ``n_texts`` with "all", or
    fewer texts than a set), None without companions: the GNQ batches are then the batch size's."""
    if settings.companions is None:
        return None
    if settings.companions == COMPANIONS_ALL:
        return n_texts
    return min(int(settings.companions) + 1, n_texts)


def _text(path: str | Path | None) -> str | None:
    return None if path is None else str(path)


def audit_job(*, checkpoints: str | Path, data: str | Path, name: str | None = None,
              lam: float = AuditSettings.lam, lam_mode: str = AuditSettings.lam_mode,
              loss: str = AuditSettings.loss, batch_size: int | float | str = AuditSettings.batch_size,
              max_length: int = AuditSettings.max_length, seed: int = AuditSettings.seed,
              device: str = AuditSettings.device, dtype: str = AuditSettings.dtype,
              companions: str | int | None = None, sketch_k: int = AuditSettings.sketch_k,
              sketch_total: int | None = AuditSettings.sketch_total,
              text_column: str | None = None, group_column: str | None = None,
              secret_column: str | None = None, secret_patterns: Sequence[str] | None = None,
              public_column: str | None = None, threads: int | None = None,
              tokenizer: str | Path | None = None, base_model: str | Path | None = None,
              merge_adapter: bool = False, non_members: str | Path | None = None,
              reference: str | None = None) -> AuditJob:
    """The ``AuditJob`` an audit's options ask for (``gnq audit``'s, or the form's), validated;
    ValueError with one line when they are not."""
    if reference is not None and non_members is None:
        raise ValueError("--reference calibrates the membership signals: give --non-members FILE with it")
    settings = AuditSettings(lam=lam, batch_size=parse_batch_size(batch_size), max_length=max_length,
                             seed=seed, device=device, dtype=dtype, loss=loss, lam_mode=lam_mode,
                             companions=parse_companions(companions), sketch_k=sketch_k,
                             sketch_total=sketch_total)
    return AuditJob(checkpoints=str(checkpoints), data=str(data), name=name, settings=settings,
                    text_column=text_column, group_column=group_column, secret_column=secret_column,
                    secret_patterns=tuple(secret_patterns or ()), public_column=public_column,
                    threads=threads, tokenizer=_text(tokenizer), base_model=_text(base_model),
                    merge_adapter=merge_adapter, non_members=_text(non_members), reference=reference)
