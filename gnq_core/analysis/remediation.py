"""Act on the verdict: the training data written again with what leaked taken out, and a manifest
of every change (``gnq remediate``, the Runs page's button).

What is acted on is chosen by status (``ACT_ON``, ``--act-on``):

* per secret-like value (every occurrence of it in the data, wherever it sits): ``leaked`` (the
  model writes it whole, calibrated), ``partly-leaked`` (part of it), ``exposed`` (the model ranks
  it above never-trained values of its format and above the reference), ``secret`` (any value the
  detector found, none of it out);
* per text: ``text-reproduced`` (the window came out, the value did not: its values are scrubbed),
  ``leaked`` also covers a text without a secret-like value whose window comes out (its copies
  are deduplicated; a unique one is kept and counted: only the user knows whether it is private,
  ``remove`` drops it), ``at-risk`` (a repeated text in the run's top 20% of memorisation risk:
  deduplicated).

A value is replaced by a kind-tagged placeholder (``[REDACTED_CARD]``), or with ``surrogate`` by a
random value of its kind and format (sources.surrogates: checksum-valid, never a value of the
data), the same replacement at each of its occurrences.  A copy cluster of which a text is acted
on is reduced to its first text (copies are the cause: each copy is one more chance to memorise
it), unless ``keep_copies``; texts named in ``remove`` are dropped.  Public texts
(``--public-column``) are never edited or dropped, except where a value acted on occurs in them.

The manifest lists each change: the text's id, its record in the file and field, the span (in
the text, as the run stored it), the kind, the SHA-256 of the old value (never the value), the new
value and the reason in words.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from gnq_core.analysis.verdict import AT_RISK, LEAKED, REPRODUCED
from gnq_core.errors import GNQError
from gnq_core.sources.rewrite import FieldEdit, FieldPath, field_values
from gnq_core.sources.secrets import values_from_json
from gnq_core.sources.surrogates import placeholder, surrogate

ACT_ON = ("leaked", "partly-leaked", "exposed", "secret", "text-reproduced", "at-risk")
DEFAULT_ACT_ON = ("leaked", "partly-leaked", "exposed")
MANIFEST_SCHEMA = "gnq-remediation/1"


class RemediationError(GNQError, ValueError):
    """Input the cleaning cannot act on; the message is one line naming what."""


@dataclass(frozen=True)
class RemediationOptions:
    act_on: tuple[str, ...] = DEFAULT_ACT_ON
    surrogate: bool = False
    seed: int = 0
    keep_copies: bool = False
    remove: tuple[int, ...] = ()  # example ids the user marked to drop

    def __post_init__(self) -> None:
        unknown = [s for s in self.act_on if s not in ACT_ON]
        if unknown:
            raise RemediationError(f"--act-on {unknown[0]!r} is not a status it acts on "
                                   f"({', '.join(ACT_ON)})")
        if not self.act_on:
            raise RemediationError(f"--act-on names no status ({', '.join(ACT_ON)})")


@dataclass(frozen=True)
class Segment:
    """Where characters ``start``..``end`` of an example's text are in the file: record ``record``,
    the string at ``path``, from its character ``offset`` (a text format: one segment, the whole
    field; a structured example, e.g. a chat, one per field it is made of)."""

    start: int
    end: int
    record: int
    path: FieldPath
    offset: int = 0


@dataclass
class Plan:
    """The changes to make: field edits, records to drop, and the manifest's entries."""

    edits: list[FieldEdit] = field(default_factory=list)
    drop: set[int] = field(default_factory=set)
    changes: list[dict[str, Any]] = field(default_factory=list)
    values: dict[str, int] = field(default_factory=dict)  # per reason word, how many distinct values
    leaked_kept: int = 0  # unique leaked texts without a secret-like value, left as they are

    def counts(self) -> dict[str, int]:
        edited = {c["text_id"] for c in self.changes if c["action"] == "replace"}
        dropped = [c for c in self.changes if c["action"] == "drop"]
        return {"values_replaced": sum(self.values.values()),
                "occurrences_replaced": sum(1 for c in self.changes if c["action"] == "replace"),
                "texts_edited": len(edited), "texts_dropped": len(dropped),
                "leaked_texts_kept": self.leaked_kept}


# ------------------------------------------------------------------------------------- the plan
def text_segments(path: str | Path, text_field: FieldPath, texts: Sequence[str]) -> list[list[Segment]]:
    """Each example's place in a text-per-record file: the record whose field at ``text_field``
    holds it (records whose text is missing or blank were never examples, as the loader drops
    them); refused when the file's texts are not the run's, in order."""
    values = field_values(path, text_field)
    records = [i for i, v in enumerate(values) if _as_text(v) is not None and _as_text(v).strip()]
    shown = str(path)
    if not records and text_field:
        raise RemediationError(f"{shown}: no record has a text in {text_field[0]!r} (the run has "
                               f"{len(texts)}); name the text column with --text-column")
    if len(records) != len(texts):
        raise RemediationError(f"{shown}: holds {len(records)} texts, the run {len(texts)}; give the run's "
                               "own training data (--data)")
    out = []
    for example_id, (record, text) in enumerate(zip(records, texts, strict=True)):
        if _as_text(values[record]) != text:
            raise RemediationError(f"{shown}: text {example_id} differs from the run's (record "
                                   f"{record + 1}); give the run's own training data (--data)")
        out.append([Segment(0, len(text), record, text_field)])
    return out


def chat_segments(path: str | Path, data_format: str | None, texts: Sequence[str],
                  layouts: Sequence[str | None]) -> list[list[Segment]]:
    """Each rendered conversation's place in a chat file: per turn the record's fields its content
    came from (sources.chat.turn_fields: ``("messages", 2, "content")``, Alpaca's instruction and
    input), so a value found in the rendered text is replaced in its message; the template's own
    text maps to no field (it is not the data).  ``data_format`` as the run recorded it (None: read
    from the file's columns, as ``--data-format auto`` does).  Refused when the file's conversations
    are not the run's, in order."""
    from gnq_core.sources.chat import (
        CHAT_FORMATS,
        RECORD_FIELDS,
        ChatLayout,
        detect_format,
        turn_fields,
    )

    shown = str(path)
    if path is not None and Path(path).suffix.lower() not in (".jsonl", ".parquet"):
        raise RemediationError(f"{shown}: the run trained on conversations; give its .jsonl or .parquet "
                               "chat file (--data)")
    keys = sorted({k for fields in RECORD_FIELDS.values() for k in fields})
    columns = {k: field_values(path, (k,)) for k in keys}
    fmt = data_format or detect_format([k for k in keys if any(v is not None for v in columns[k])])
    if fmt not in CHAT_FORMATS:
        raise RemediationError(f"{shown}: holds no conversations (no messages, conversations, "
                               "prompt/completion or instruction/output column); give the run's chat file")
    primary = RECORD_FIELDS[fmt][0]
    records = [i for i, v in enumerate(columns[primary]) if v is not None]
    if len(records) != len(texts):
        raise RemediationError(f"{shown}: holds {len(records)} conversations, the run {len(texts)}; give the "
                               "run's own training data (--data)")
    out = []
    for eid, (record, text, layout) in enumerate(zip(records, texts, layouts, strict=True)):
        turns = ChatLayout.from_json(layout).turns if layout else ()
        fields = turn_fields({k: columns[k][record] for k in RECORD_FIELDS[fmt]}, fmt)
        differs = RemediationError(f"{shown}: conversation {eid} differs from the run's (record "
                                   f"{record + 1}); give the run's own training data (--data)")
        if len(fields) != len(turns):
            raise differs
        segments = []
        for turn, (content, pieces) in zip(turns, fields, strict=True):
            if turn.start < 0:  # the template rewrote this message: no span of the text is its field's
                continue
            shown_part = text[turn.start:turn.end]
            at = content.find(shown_part)  # a template that trims the content shows part of it
            if at < 0:
                raise differs
            for piece in pieces:
                lo, hi = max(piece.offset, at), min(piece.offset + len(piece.value), at + len(shown_part))
                if lo < hi:
                    segments.append(Segment(turn.start + lo - at, turn.start + hi - at, record, piece.path,
                                            lo - piece.offset))
        out.append(segments)
    return out


def trained_in_memory(run: Any) -> bool:
    """A run the HF Trainer integration recorded (GNQTrainer, GNQSFTTrainer): its texts came from
    memory, its ``dataset_hash`` is of the texts themselves, not of a file's bytes; a training
    file is accepted for it when its texts are the run's (``text_segments``)."""
    return bool((run.settings or {}).get("trainer"))


def needs_data(run: Any) -> bool:
    """Whether remediating ``run`` needs the training file named (``--data``): a Trainer run
    records no file by default (``dataset_path`` is ``(in memory)``)."""
    return trained_in_memory(run) and not Path(run.dataset_path).is_file()


def _check_ids(run: Any, examples: pd.DataFrame, source: Path) -> None:
    """The file's i-th text is the run's text i: a Trainer run whose example ids are not 0..n-1
    has no such order to check the file against."""
    ids = examples["example_id"].astype(int).tolist()
    if ids != list(range(len(ids))):
        raise RemediationError(f"{source}: run {run.name!r} has example ids that are not 0..{len(ids) - 1} "
                               "in order, so its texts cannot be matched to the file's records")


def _as_text(value: Any) -> str | None:
    if value is None or (isinstance(value, float) and value != value):
        return None
    return value if isinstance(value, str) else str(value)


def plan(examples: pd.DataFrame, ranked: pd.DataFrame, outcomes: pd.DataFrame,
         segments: Sequence[Sequence[Segment]], options: RemediationOptions) -> Plan:
    """The changes for one run: ``examples`` (Store.examples: text, labels), ``ranked``
    (verdict.rank_texts: status per text), ``outcomes`` (Store.value_outcomes: per attacked value),
    ``segments`` per example (``text_segments``)."""
    act = set(options.act_on)
    texts = examples.set_index("example_id")["text"].astype(str)
    status = ranked.set_index("example_id")["status"] if "status" in ranked else pd.Series(dtype=object)
    public = (examples.set_index("example_id")["public"].astype("boolean").fillna(False)
              if "public" in examples else pd.Series(False, index=texts.index))
    stored_values = examples["secret_values"] if "secret_values" in examples else [None] * len(examples)
    found = {int(e): values_from_json(texts[int(e)], stored)
             for e, stored in zip(examples["example_id"], stored_values, strict=True)}
    reasons = _value_reasons(outcomes, act)
    if "text-reproduced" in act or "secret" in act:
        for eid, matches in found.items():
            if public.get(eid, False):
                continue
            for m in matches:
                if m.value in reasons:
                    continue
                if "secret" in act:
                    reasons[m.value] = (m.kind, "secret", "a secret-like value in the data (none of it out: "
                                                          "scrubbed before the next training)")
                elif status.get(eid) == REPRODUCED:
                    reasons[m.value] = (m.kind, "text reproduced", f"text {eid}'s window comes out word for "
                                                                    "word around this value")
    result = Plan()
    rng = random.Random(options.seed)
    every_value = {m.value for matches in found.values() for m in matches}
    replacement: dict[str, str] = {}
    for value, (kind, word, _) in sorted(reasons.items(), key=lambda kv: (kv[1][0], kv[0])):
        replacement[value] = (surrogate(kind, value, rng, avoid=every_value | set(replacement.values()))
                              if options.surrogate else placeholder(kind))
        result.values[word] = result.values.get(word, 0) + 1
    acted_texts: set[int] = set()
    anywhere = _anywhere(reasons)
    for eid in texts.index:
        spans = _occurrences(texts[eid], found.get(int(eid), []), reasons, anywhere)
        for start, end, value, kind, detected in spans:
            _, word, why = reasons[value]
            where = "" if detected else " (found again here as the same string)"
            result.changes.append(_replace(int(eid), segments[int(eid)], start, end, kind, value,
                                           replacement[value], f"{word}: {why}{where}", result.edits))
            acted_texts.add(int(eid))
    # a text without a secret-like value whose window comes out: its copies are deduplicated; a
    # unique one is kept (only the user knows whether it is private: --remove drops it)
    leaked_plain = {int(e) for e, s in status.items() if s == LEAKED and not found.get(int(e))
                    and not public.get(int(e), False)}
    if "leaked" in act:
        acted_texts |= leaked_plain
    if "at-risk" in act:
        acted_texts |= {int(e) for e, s in status.items() if s == AT_RISK}
    _drops(result, examples, segments, acted_texts, options)
    dropped = {c["text_id"] for c in result.changes if c["action"] == "drop"}
    result.leaked_kept = len(leaked_plain - dropped) if "leaked" in act else 0
    return result


def _value_reasons(outcomes: pd.DataFrame, act: Collection[str]) -> dict[str, tuple[str, str, str]]:
    """value -> (kind, status word, reason) for the attacked values the chosen statuses cover,
    the most severe status first."""
    out: dict[str, tuple[str, str, str]] = {}
    for row in outcomes.itertuples(index=False):
        leaked, partly, exposed = bool(row.leaked), _true(row.partly), _true(row.exposed)
        if leaked and "leaked" in act:
            why = ("leaked", "the model writes it whole when prompted with the text up to it "
                             "(the reference model does not)")
        elif (leaked or partly) and "partly-leaked" in act:
            why = ("partly leaked", f"the model writes {int(row.chars_reproduced)} of its {int(row.chars)} "
                                    "characters when prompted with the text up to it")
        elif exposed and "exposed" in act:
            bound = f", never-trained 99th percentile {row.null_p99:.1f}" if pd.notna(row.null_p99) else ""
            why = ("exposed", f"exposure {row.exposure:.1f} bits, above never-trained values of its format "
                              f"and the reference model{bound}")
        else:
            continue
        out.setdefault(str(row.value), (str(row.kind), *why))
    return out


def _true(value: object) -> bool:
    return bool(pd.notna(value) and value)


def _anywhere(reasons: dict[str, tuple[str, str, str]]) -> re.Pattern[str] | None:
    """One pattern for every value acted on standing alone (not inside a longer run of letters or
    digits), longest first: one scan of each text, however many values."""
    if not reasons:
        return None
    values = sorted(reasons, key=len, reverse=True)
    return re.compile(r"(?<![A-Za-z0-9])(?:" + "|".join(re.escape(v) for v in values) + r")(?![A-Za-z0-9])")


def _occurrences(text: str, matches: Sequence, reasons: dict[str, tuple[str, str, str]],
                 anywhere: re.Pattern[str] | None) -> list[tuple[int, int, str, str, bool]]:
    """(start, end, value, kind, detected) of every occurrence of a value acted on in ``text``:
    where the detector found it, and anywhere else the same string stands alone (not inside a
    longer run of letters or digits); overlaps resolved for the earlier, then the longer."""
    spans = [(m.value_start, m.value_end, m.value, reasons[m.value][0], True)
             for m in matches if m.value in reasons]
    if anywhere is not None:
        spans += [(m.start(), m.end(), m.group(), reasons[m.group()][0], False)
                  for m in anywhere.finditer(text)]
    kept: list[tuple[int, int, str, str, bool]] = []
    for s in sorted(spans, key=lambda s: (s[0], -(s[1] - s[0]), not s[4])):
        if not kept or s[0] >= kept[-1][1]:
            kept.append(s)
    return kept


def _replace(eid: int, segments: Sequence[Segment], start: int, end: int, kind: str, old: str, new: str,
             reason: str, edits: list[FieldEdit]) -> dict[str, Any]:
    seg = next((s for s in segments if s.start <= start and end <= s.end), None)
    if seg is None:
        raise RemediationError(f"text {eid}: the value at {start}..{end} spans two fields of its record; "
                               "it cannot be replaced in place")
    edits.append(FieldEdit(seg.record, seg.path, start - seg.start + seg.offset, end - seg.start + seg.offset,
                           new))
    return {"action": "replace", "text_id": eid, "record": seg.record, "field": list(seg.path),
            "span": [start, end], "kind": kind, "old_sha256": hashlib.sha256(old.encode("utf-8")).hexdigest(),
            "new": new, "reason": reason}


def _drops(result: Plan, examples: pd.DataFrame, segments: Sequence[Sequence[Segment]], acted: set[int],
           options: RemediationOptions) -> None:
    """Copies of acted-on texts (all but the cluster's first) and the texts the user named."""
    why: dict[int, str] = {}
    frame = examples.set_index("example_id")
    for eid in options.remove:
        if eid not in frame.index:
            raise RemediationError(f"--remove {eid}: the run has no text {eid} (ids 0..{len(frame) - 1})")
        why[eid] = "marked to remove (--remove)"
    copies = frame["copies"] if "copies" in frame else pd.Series(1, index=frame.index)
    clusters = frame["cluster_id"] if "cluster_id" in frame else pd.Series(frame.index, index=frame.index)
    if not options.keep_copies:
        hit = {int(clusters[e]) for e in acted if pd.notna(copies.get(e)) and int(copies[e]) > 1}
        for eid in frame.index:
            cluster = int(clusters[eid])
            if cluster in hit and int(eid) != cluster and int(eid) not in why:
                why[int(eid)] = (f"copy of text {cluster}, repeated {int(copies[eid])}×: copies are the "
                                 "cause (each one more chance to memorise it), one kept")
    for eid in sorted(why):
        records = {s.record for s in segments[eid]}
        result.drop |= records
        result.changes.append({"action": "drop", "text_id": eid, "record": min(records), "reason": why[eid]})
    # an edit of a dropped record is moot: its value is gone with the record
    result.edits[:] = [e for e in result.edits if e.record not in result.drop]
    result.changes[:] = [c for c in result.changes
                         if c["action"] == "drop" or c["record"] not in result.drop]
    result.changes.sort(key=lambda c: (c["text_id"], c["action"] != "drop", c.get("span", [0])[0]))


# ------------------------------------------------------------------------------------- the files
def manifest(plan_: Plan, *, run: Any, source: Path, source_sha256: str, out: Path, out_sha256: str,
             options: RemediationOptions, code_version: str) -> dict[str, Any]:
    """The manifest's JSON: what was written from what, how, and every change."""
    return {"schema": MANIFEST_SCHEMA, "run": run.name, "run_id": int(run.run_id),
            "source": str(source), "source_sha256": source_sha256, "out": str(out), "out_sha256": out_sha256,
            "act_on": list(options.act_on),
            "replacement": "surrogate" if options.surrogate else "placeholder",
            "seed": options.seed, "keep_copies": options.keep_copies, "code_version": code_version,
            "counts": plan_.counts(), "values_by_status": plan_.values, "changes": plan_.changes}


def manifest_path(out: Path) -> Path:
    """The manifest beside the cleaned file: clean.csv -> clean.csv.manifest.json."""
    return out.with_name(out.name + ".manifest.json")


def write_json(data: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


@dataclass(frozen=True)
class Remediation:
    """What ``remediate_run`` wrote: the cleaned file, its manifest, and the counts."""

    out: Path
    manifest: Path
    counts: dict[str, int]
    values_by_status: dict[str, int]

    def summary(self) -> str:
        """One line for the user, with counts only (never a value)."""
        c = self.counts
        by = ", ".join(f"{n} {word}" for word, n in self.values_by_status.items())
        return (f"{c['values_replaced']} value(s) replaced ({by or 'none'}) at {c['occurrences_replaced']} "
                f"place(s) in {c['texts_edited']} text(s), {c['texts_dropped']} text(s) dropped; written to "
                f"{self.out}, every change listed in {self.manifest}"
                + (f". {c['leaked_texts_kept']} leaked text(s) without a secret-like value are kept as they "
                   "were: drop those that are private with --remove IDS" if c["leaked_texts_kept"] else ""))


def remediate_run(store: Any, run: Any, ranked: pd.DataFrame, out: str | Path, options: RemediationOptions, *,
                  data: str | Path | None = None, manifest_out: str | Path | None = None,
                  text_column: str | None = None) -> Remediation:
    """Write ``run``'s training data (its recorded dataset, or ``data`` with the same SHA-256) to
    ``out`` in its own format, cleaned as ``options`` says, and the manifest beside it; both are
    written to temporary files and renamed at the end (nothing half-written).

    A run trained in memory (``trained_in_memory``: the HF Trainer integration) records no file's
    SHA-256: ``data`` is its training file, accepted when its texts (``text_column``, default
    ``text``; a ``.txt`` file's non-blank lines) are the run's, same count, same order, equal
    character for character."""
    import contextlib

    from gnq_core.common.atomic import atomic_path
    from gnq_core.common.runtime import code_version
    from gnq_core.results.protected_paths import refuse_overwrite
    from gnq_core.results.text_labels import ensure_text_labels
    from gnq_core.sources.datasets import file_sha256
    from gnq_core.sources.rewrite import rewrite_dataset

    in_memory = trained_in_memory(run)
    if data is None and needs_data(run):
        raise RemediationError(f"run {run.name!r} was trained in memory ({run.settings['trainer']}): no "
                               "training file is recorded; give it with --data (its texts must be the "
                               "run's, in order)")
    source = Path(data) if data is not None else Path(run.dataset_path)
    out = Path(out)
    man = Path(manifest_out) if manifest_out is not None else manifest_path(out)
    if source.is_dir():
        raise RemediationError(f"{source}: a datasets.save_to_disk folder is not rewritten in place; save "
                               "it as .jsonl or .parquet (Dataset.to_json / to_parquet), audit that and "
                               "remediate it")
    if not source.is_file():
        raise RemediationError(f"{source}: the run's training data is not there; give it with --data")
    if out.suffix.lower() != source.suffix.lower():
        raise RemediationError(f"--out {out}: the cleaned file keeps the data's format ({source.suffix}); "
                               f"give a {source.suffix} name")
    if out.resolve() == man.resolve():
        raise RemediationError(f"--manifest {man}: the same file as --out")
    refuse_overwrite([out, man], store, inputs=[source])
    digest = file_sha256(source)
    if not in_memory and digest != run.dataset_hash:
        raise RemediationError(f"{source}: not the data run {run.name!r} was trained or audited on (its "
                               "SHA-256 differs from the one the run recorded)")
    if text_column is not None and source.suffix.lower() == ".txt":
        raise RemediationError(f"{source}: a .txt file has no columns; --text-column applies to .csv, "
                               ".jsonl and .parquet")
    examples = ensure_text_labels(store, run)
    if in_memory:
        _check_ids(run, examples, source)
    texts = examples["text"].astype(str).tolist()
    if "turns" in examples and examples["turns"].notna().any():  # rendered conversations
        segments = chat_segments(source, run.settings.get("data_format"), texts, examples["turns"].tolist())
    else:
        column = text_column or run.settings.get("text_column")
        text_field: FieldPath = () if source.suffix.lower() == ".txt" else (column or "text",)
        segments = text_segments(source, text_field, texts)
    changes = plan(examples, ranked, store.value_outcomes(run.run_id), segments, options)
    with contextlib.ExitStack() as stack:
        tmp_out = stack.enter_context(atomic_path(out))
        tmp_man = stack.enter_context(atomic_path(man))
        rewrite_dataset(source, tmp_out, changes.edits, changes.drop)
        write_json(manifest(changes, run=run, source=source.resolve(), source_sha256=digest,
                            out=out.resolve(), out_sha256=file_sha256(tmp_out), options=options,
                            code_version=code_version()), tmp_man)
    return Remediation(out, man, changes.counts(), dict(changes.values))
