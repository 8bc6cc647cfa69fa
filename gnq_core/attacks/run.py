"""``run_extraction``: the attacks' entrance for a stored run.  It loads the attacked checkpoint
and the reference model once (refusing a reference that reads the texts as other tokens before
anything is written), runs the stored attacks (``stored``) through ``run_attacks`` and records
the rule and its counts in the run's settings.  The calibration rule itself is in
attacks/extraction.py's docstring."""

from __future__ import annotations

from pathlib import Path

from gnq_core.attacks import defaults as attack
from gnq_core.attacks.contract import Target, run_attacks
from gnq_core.attacks.extraction import AttackRule
from gnq_core.attacks.stored import stored_attacks

__all__ = ["run_extraction"]


def run_extraction(store, run, *, checkpoint: str | None = None, prefix_tokens: int = attack.DEFAULT_PREFIX,
                   threshold: float = attack.DEFAULT_THRESHOLD, batch_size: int = attack.DEFAULT_ATTACK_BATCH,
                   device: str = "auto", suffix_tokens: int | None = attack.DEFAULT_SUFFIX,
                   reference: str | None = attack.DEFAULT_REFERENCE,
                   reporter=None, secret_candidates: int = attack.DEFAULT_SECRET_CANDIDATES,
                   exposure_nodes: int = attack.DEFAULT_EXPOSURE_NODES) -> dict:
    """Attack every example of a stored run with one of its checkpoints; store the results.

    ``checkpoint`` is a point label (e.g. 'epoch-3'); default: the run's last finished point.
    ``suffix_tokens`` / ``reference``: the calibrated rule (see the module docstring; ``gnq
    extract`` defaults to s = 8 and the first checkpoint); ``reference`` is ``"first"`` or a
    checkpoint folder.  With a reference, the membership scores (attacks/membership.py) are
    stored per text, and the rule with both models' match rates in the run's settings.  A
    reference that tokenizes the texts differently is refused before anything is written.
    Each batch's rows are committed as soon as they are decoded, so an interrupted attack resumes
    where it stopped when rerun with the same prefix length and threshold (and, to decode each
    text with the same companions, the same batch size); rerunning a finished attack, or one with
    another threshold, replaces it.  Never duplicates rows.
    """
    from gnq_core.progress import Reporter
    from gnq_core.results.text_labels import ensure_text_labels
    from gnq_core.runtime import code_version, resolve_device
    from gnq_core.sources.adapters import load_model_at
    from gnq_core.sources.checkpoints.files import TOKENIZER_FILES
    from gnq_core.sources.tokens import encode_texts

    reporter = reporter or Reporter()
    rule = AttackRule(prefix_tokens, suffix_tokens, threshold, reference)
    row = _attacked_point(store, run, checkpoint)
    ref_path = _reference_path(store, run, row, reference)
    if reference is not None and ref_path is None:
        reporter.log(f"run {run.name!r}: the checkpoint attacked ({row['label']}) is its first, so the "
                     "attack is not calibrated; name a reference with --reference (a fine-tune: its base)")
    first_of_scratch = not_a_non_member_reference(run, reference, ref_path)
    if first_of_scratch:
        reporter.log(f"run {run.name!r}: {FIRST_OF_SCRATCH}")
    point, dev = int(row["point"]), resolve_device(device)
    tokenizer_dir = run.settings.get("tokenizer")  # checkpoints saved without one (gnq audit --tokenizer)
    base = run.settings.get("base_model")  # an audit of PEFT adapter checkpoints: merged into it here
    model, tokenizer = load_model_at(row["path"], base, device=dev, tokenizer=tokenizer_dir)
    examples = ensure_text_labels(store, run)
    texts = examples["text"].tolist()
    ids = encode_texts(tokenizer, texts, run.max_length)
    ref_model = None
    if ref_path is not None:
        own = any((Path(ref_path) / name).is_file() for name in TOKENIZER_FILES)
        ref_model, ref_tokenizer = load_model_at(ref_path, base, device=dev,
                                                 tokenizer=None if own else tokenizer_dir)
        _check_same_tokens(ref_path, ref_tokenizer, tokenizer, texts, run.max_length, ids)
    version = code_version()
    from gnq_core.attacks.windows import content_windows

    layouts = examples["turns"].tolist() if "turns" in examples else None
    windows = content_windows(tokenizer, texts, layouts, ids, prefix_tokens, suffix_tokens or 1)
    target = Target(store, run, point, row["label"], model, tokenizer, examples, ids, dev, batch_size,
                    version, reporter, ref_model, ref_path, windows)
    summary = run_attacks(stored_attacks(prefix_tokens, threshold, suffix_tokens, ref_model is not None,
                                         secret_candidates, exposure_nodes), target)
    summary["label"] = row["label"]
    store.update_settings(run.run_id, {"attack": {
        "rule": rule.describe(Path(ref_path).name + (f" — {FIRST_OF_SCRATCH}" if first_of_scratch else "")
                              if ref_path else None),
        "reference_is_non_member": None if ref_path is None else not first_of_scratch,
        "prefix_tokens": prefix_tokens, "suffix_tokens": suffix_tokens, "threshold": threshold,
        "checkpoint": row["label"], "reference": str(ref_path) if ref_path else None,
        "code_version": version} | {k: v for k, v in summary.items() if k != "label"}})
    return summary


def _attacked_point(store, run, checkpoint: str | None):
    from gnq_core.results.protected_paths import verify_checkpoint
    from gnq_core.results.store_schema import StoreError

    points = store.points(run.run_id)
    done = points[points["status"] == "done"]
    if done.empty:
        raise StoreError(f"{store.path}: run {run.name!r} has no finished checkpoint to attack yet")
    if checkpoint is None:
        row = done.iloc[-1]
    else:
        match = points[points["label"] == checkpoint]
        if match.empty:
            raise StoreError(f"{store.path}: run {run.name!r} has no checkpoint {checkpoint!r} "
                             f"(has: {', '.join(points['label'])})")
        row = match.iloc[0]
    if not isinstance(row["path"], str) or not row["path"]:  # NULL reads as None or NaN
        raise StoreError(f"{store.path}: checkpoint {row['label']!r} of run {run.name!r} has no folder "
                         "recorded (uploaded checkpoints are deleted after the audit, all but the last); "
                         "audit from a local path to attack it")
    if not Path(row["path"]).exists():
        raise StoreError(f"{row['path']}: checkpoint {row['label']!r} of run {run.name!r} is no longer "
                         "there (moved or deleted since the audit)")
    verify_checkpoint(row["path"], row.get("model_hash"), f"checkpoint {row['label']!r} of run {run.name!r}")
    return row


FIRST_OF_SCRATCH = ("the reference is this from-scratch run's first checkpoint, already trained on these "
                    "same texts: not a non-member reference ('the reference does not' means 'not yet by "
                    "the first checkpoint'); name a model that never saw them with --reference for one")


def not_a_non_member_reference(run, reference: str | None, ref_path: str | None) -> bool:
    """Whether the reference is the first checkpoint of a run trained from scratch (``gnq train``
    without ``--init``): a model already trained on the run's texts, not one that never saw them."""
    return (reference == attack.FIRST_CHECKPOINT and ref_path is not None
            and bool((run.settings or {}).get("from_scratch")))


def _reference_path(store, run, target, reference: str | None) -> str | None:
    """The reference model's folder: the run's first finished checkpoint, or the one named; None
    without one, or when the first checkpoint is the one attacked."""
    if reference is None:
        return None
    if reference != attack.FIRST_CHECKPOINT:
        return str(Path(reference).resolve())  # recorded absolute: outputs elsewhere must not replace it
    from gnq_core.results.protected_paths import verify_checkpoint

    points = store.points(run.run_id)
    first = points[(points["status"] == "done") & points["path"].notna()]
    if first.empty or int(first.iloc[0]["point"]) == int(target["point"]):
        return None  # the first checkpoint is the one attacked: nothing to calibrate against
    row = first.iloc[0]
    verify_checkpoint(row["path"], row.get("model_hash"), f"checkpoint {row['label']!r} of run {run.name!r}")
    return str(row["path"])


def _check_same_tokens(ref_path: str, ref_tokenizer, tokenizer, texts, max_length: int, ids) -> None:
    """The reference must read the texts as the same token ids, or "the same continuation" means
    nothing: refused in one line before anything is written."""
    from gnq_core.sources.checkpoints.errors import CheckpointError
    from gnq_core.sources.tokens import encode_texts

    if ref_tokenizer.get_vocab() != tokenizer.get_vocab() or encode_texts(ref_tokenizer, texts,
                                                                          max_length) != ids:
        raise CheckpointError(f"{ref_path}: the reference model's tokenizer differs from the audited "
                              "model's; a calibrated attack needs both to read the texts as the same tokens")
