"""One preflight for every door: what ``gnq audit``, ``gnq estimate``, ``gnq extract`` and the
dashboard's New audit form check before any work, in one place, so no door accepts what another
refuses.

The options become the settings of settings.py (``options.audit_job`` for an audit's,
``extract_options`` for the attack's: the same bounds, the same one-line messages naming the
option), and ``audit_inputs`` then checks what the options point at, as the audit itself will
read it: the checkpoints (or PEFT adapters and their base) found, the texts read with their
columns, every secret pattern matched over them under the regex bound (sources/user_patterns.py),
``--max-length`` against the model's positions, and the companion sets' memory.  It validates;
it chooses nothing (defaults stay the settings types').  ``gnq estimate`` runs exactly these, so
an estimate is given only for a job the real commands would start.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gnq_core.pipelines.settings import AuditJob, ExtractJob

__all__ = ["AuditInputs", "audit_inputs", "extract_options"]

ESTIMATE_RUN = "(estimate)"  # the run an estimate's attack settings are checked for: none is written


@dataclass(frozen=True)
class AuditInputs:
    """What an audit's options point at, found and checked: its checkpoints, its texts (their
    secret patterns set), the adapters' base when they are adapters, and the model folder whose
    config and tokenizer every checkpoint shares (the base, for adapters)."""

    refs: list
    dataset: Any  # sources.datasets.TextDataset
    adapters: Any  # sources.adapters.Adapters | None
    model_path: Path


def extract_options(**options: Any) -> ExtractJob:
    """The attack's settings (``gnq extract``'s options, or ``gnq estimate``'s and the form's for
    the attack they would run), validated by ``ExtractJob``: ValueError with one line naming the
    option.  ``run`` defaults to a placeholder: an estimate checks the attack it would time."""
    options.setdefault("run", ESTIMATE_RUN)
    reference = options.get("reference")
    if reference == "none":
        options["reference"] = None
    return ExtractJob(**options)


def audit_inputs(job: AuditJob, *, texts: Any | None = None) -> AuditInputs:
    """Find and check what ``job`` points at, before anything is written or measured (the module
    docstring lists the checks); ``texts``: the job's dataset already read (the form reads it to
    show its columns), a function of the model folder (whose tokenizer renders chat data; called
    with a function returning it, so the checkpoints are found only when a chat template needs
    them, or after the texts are read), or None: read here.  Raises the one-line error of the first
    problem."""
    from gnq_core.pipelines.companion_plan import check_companion_memory
    from gnq_core.sources.chat import load_data
    from gnq_core.sources.checkpoints.config import max_positions
    from gnq_core.sources.checkpoints.series import find_checkpoints
    from gnq_core.sources.checkpoints.tokenizer import load_tokenizer
    from gnq_core.sources.library_logs import library_logs_held
    from gnq_core.sources.user_patterns import bounded_patterns

    found: dict[str, Any] = {}

    def locate() -> dict[str, Any]:  # once, when first needed: the texts are read first
        if not found:
            if job.base_model is not None:
                from gnq_core.sources.adapters import Adapters, find_adapter_checkpoints

                found.update(adapters=Adapters(Path(job.base_model), merged=job.merge_adapter),
                             refs=find_adapter_checkpoints(job.checkpoints), model_path=Path(job.base_model))
            else:
                refs = find_checkpoints(job.checkpoints)
                found.update(adapters=None, refs=refs, model_path=Path(refs[0].path))
        return found

    def model_path() -> Path:
        return locate()["model_path"]

    # transformers' log lines about a config it reads here are shown only when nothing is refused
    with library_logs_held():
        # The texts first, so a dataset's problem is named whatever the checkpoints are; chat records
        # are rendered with the template of the model they were trained on (found only then).
        if callable(texts):  # the caller reads them (the job's notices)
            dataset = texts(model_path)
        elif texts is not None:
            dataset = texts
        else:
            dataset = load_data(Path(job.data), lambda: load_tokenizer(model_path(), job.tokenizer),
                                data_format=job.data_format, train_on=job.train_on,
                                text_column=job.text_column, group_column=job.group_column,
                                secret_column=job.secret_column, public_column=job.public_column)
        dataset = replace(dataset, secret_patterns=tuple(job.secret_patterns))
        where = locate()
        refs, adapters, folder = where["refs"], where["adapters"], where["model_path"]
        positions = max_positions(folder)
        if positions is not None and job.settings.max_length > positions:
            raise ValueError(f"--max-length {job.settings.max_length} is more than the {positions} positions "
                             f"the model has (max_position_embeddings in {folder / 'config.json'}); use "
                             f"--max-length {positions} or less")
        check_companion_memory(len(dataset), job.settings)
        bounded_patterns(dataset.secret_patterns, dataset.texts, dataset.public, where=str(job.data))
    return AuditInputs(refs=refs, dataset=dataset, adapters=adapters, model_path=folder)
