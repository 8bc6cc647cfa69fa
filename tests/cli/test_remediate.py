"""Acting on the verdict (analysis/remediation.py, sources/rewrite.py, sources/surrogates.py,
``gnq remediate``): the cleaned file keeps its format and every byte outside the replaced values,
the manifest lists each change without the value, surrogates keep the kind's format and checksum,
copy clusters shrink to one text, and bad input is refused in one line with nothing written.

The runs here are stored by hand (texts, and the secret attack's rows saying which values came
out) so that every format is checked in a second; tests/e2e/test_remediate_e2e.py trains the models."""

from __future__ import annotations

import hashlib
import json
import random
import re

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from gnq_core.analysis.value_compare import (
    FIXED,
    NEITHER,
    STILL,
    STILL_EXPOSED,
    UNPROBED,
    changes_summary,
    masked,
    value_changes,
)
from gnq_core.cli import app
from gnq_core.results.records import RunSpec
from gnq_core.results.store import Store
from gnq_core.sources.datasets import file_sha256, load_texts
from gnq_core.sources.secrets import iban_ok, luhn_ok
from gnq_core.sources.surrogates import placeholder, secret_kinds, surrogate

CARD = "4539 1488 0343 6467"  # Luhn-valid
PIN = "4821"
TEXTS = [
    "A quiet morning by the harbour.",
    f"Charge the order to card {CARD} today.",
    f"Note: the door PIN is {PIN}, keep it.",
    'He said "hello, world" and left — café.',
    f"Copy of the card: {CARD} again.",
]


def _store_run(tmp_path, path, name="r", texts=TEXTS, leaked=(CARD,), text_column="text",
               trainer=False) -> Store:
    """A run over ``path`` whose secret attack wrote the values of ``leaked`` whole, the others not
    (``trainer``: recorded as the HF Trainer integration records one, from memory, with no file)."""
    store = Store(tmp_path / "gnq.duckdb")
    examples = pd.DataFrame({"example_id": range(len(texts)), "text": texts, "grp": None,
                             "n_tokens": [10] * len(texts)})
    if trainer:  # hf.py's _run_spec: the texts' own hash, no file, no text column
        content = examples[["example_id", "text"]].to_json(orient="values")
        dataset_path, digest = "(in memory)", hashlib.sha256(content.encode()).hexdigest()
        settings = {"trainer": "transformers.Trainer (GNQTrainer)"}
    else:
        dataset = load_texts(path, text_column=None if path.suffix == ".txt" else text_column)
        assert dataset.texts == list(texts)
        dataset_path, digest = str(dataset.path), dataset.sha256
        settings = {"text_column": dataset.text_column, "group_column": None}
    run = store.create_run(RunSpec(name=name, kind="train" if trainer else "audit", lam=0.01, batch_size=2,
                                   seed=0, max_length=64, model_path="m", dataset_path=dataset_path,
                                   dataset_hash=digest, n_examples=len(texts), code_version="test",
                                   device="cpu", dtype="float32",
                                   settings=settings), examples)
    rows = []
    for eid, text in enumerate(texts):
        for value in (CARD, PIN):
            start = text.find(value)
            if start < 0:
                continue
            n = sum(c.isalnum() for c in value)
            out = value in leaked
            rows.append({"example_id": eid, "secret_start": start, "secret_end": start + len(value),
                         "kind": "card number" if value == CARD else "pin", "value": value,
                         "prompt_tokens": 3, "value_tokens": 2, "generated": "x", "chars": n,
                         "chars_reproduced": n if out else 0,
                         "reproduced": out, "reference_generated": "y", "reference_chars_reproduced": 0,
                         "extracted": out, "rule": "r"})
    store.write_secret_attacks(run.run_id, 0, pd.DataFrame(rows), "test")
    return store


def _remediate(*args):
    return CliRunner().invoke(app, ["remediate", *[str(a) for a in args]])


def _write(fmt, path):
    if fmt == "csv":  # a BOM, CRLF, quoted fields with commas, quotes and newlines, a blank line
        def quoted(t):
            return '"' + t.replace('"', '""') + '"'

        head = "".join(f"{i},{quoted(t) if (',' in t or chr(34) in t) else t},n{i}\r\n"
                       for i, t in enumerate(TEXTS[:3]))
        tail = "".join(f'{i},{quoted(t)},"a,b"\r\n' for i, t in enumerate(TEXTS[3:], 3))
        body = "id,text,note\r\n" + head + "\r\n" + tail
        path.write_bytes(b"\xef\xbb\xbf" + body.encode("utf-8"))
    elif fmt == "jsonl":  # escapes as another writer made them, extra keys, a blank line
        lines = [json.dumps({"id": i, "text": t, "meta": {"k": [1, 2.50]}}, ensure_ascii=i % 2 == 0)
                 for i, t in enumerate(TEXTS)]
        path.write_text("\n".join(lines[:2]) + "\n\n" + "\n".join(lines[2:]) + "\n", encoding="utf-8")
    elif fmt == "txt":
        path.write_bytes(("\r\n".join(TEXTS[:2]) + "\r\n\r\n" + "\n".join(TEXTS[2:])).encode("utf-8"))
    else:
        table = pa.table({"id": list(range(len(TEXTS))), "text": TEXTS, "score": [0.5] * len(TEXTS)})
        pq.write_table(table.replace_schema_metadata({"origin": "test"}), path, compression="zstd")


def _records(fmt, path):
    """The file's records as raw bytes (text formats) or rows (parquet), in order."""
    if fmt == "parquet":
        return pq.read_table(path).to_pylist()
    raw = path.read_bytes()
    return re.split(rb"(?<=\n)", raw)


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "txt", "parquet"])
def test_the_cleaned_file_keeps_its_format_and_every_untouched_byte(tmp_path, fmt):
    source = tmp_path / f"train.{fmt}"
    _write(fmt, source)
    store = _store_run(tmp_path, source)
    out = tmp_path / f"clean.{fmt}"
    result = _remediate("--run", "r", "--out", out, "--keep-copies", "--db", store.path)
    assert result.exit_code == 0, result.output
    assert CARD not in result.output and PIN not in result.output  # counts only, never a value
    cleaned = load_texts(out, text_column=None if fmt == "txt" else "text")
    expected = [t.replace(CARD, "[REDACTED_CARD]") for t in TEXTS]
    assert cleaned.texts == expected  # the PIN did not come out: kept; both card occurrences replaced
    before, after = _records(fmt, source), _records(fmt, out)
    assert len(before) == len(after)
    changed = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
    if fmt == "parquet":
        assert changed == [1, 4]
        for i in changed:  # the other columns of an edited row are equal
            assert {k: v for k, v in before[i].items() if k != "text"} == \
                   {k: v for k, v in after[i].items() if k != "text"}
        meta = pq.ParquetFile(out)
        assert meta.schema_arrow == pq.ParquetFile(source).schema_arrow
        assert meta.schema_arrow.metadata[b"origin"] == b"test"
        assert meta.metadata.row_group(0).column(0).compression == "ZSTD"
    else:
        assert len(changed) == 2
        for i in changed:  # in an edited record, only the value's characters changed
            a, b = before[i].decode("utf-8"), after[i].decode("utf-8")
            assert a.replace(CARD, "[REDACTED_CARD]") == b
    manifest = json.loads((tmp_path / f"clean.{fmt}.manifest.json").read_text())
    assert CARD not in json.dumps(manifest) and manifest["out_sha256"] == file_sha256(out)
    assert manifest["source_sha256"] == file_sha256(source)
    replaced = [c for c in manifest["changes"] if c["action"] == "replace"]
    assert [c["text_id"] for c in replaced] == [1, 4]
    for c in replaced:
        assert TEXTS[c["text_id"]][c["span"][0]:c["span"][1]] == CARD
        assert c["old_sha256"] == hashlib.sha256(CARD.encode()).hexdigest()
        assert c["kind"] == "card number" and c["new"] == "[REDACTED_CARD]"
        assert c["reason"].startswith("leaked: the model writes it whole")


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "txt"])
def test_a_trainer_run_is_remediated_from_the_file_whose_texts_are_its_own(tmp_path, fmt):
    source = tmp_path / f"train.{fmt}"
    _write(fmt, source)
    store = _store_run(tmp_path, source, trainer=True)
    out = tmp_path / f"clean.{fmt}"
    said = _remediate("--run", "r", "--out", out, "--db", store.path)
    assert said.exit_code == 1 and len(said.output.strip().splitlines()) == 1
    assert "trained in memory" in said.output and "--data" in said.output and not out.exists()
    result = _remediate("--run", "r", "--out", out, "--data", source, "--keep-copies", "--db", store.path)
    assert result.exit_code == 0, result.output
    cleaned = load_texts(out, text_column=None if fmt == "txt" else "text")
    assert cleaned.texts == [t.replace(CARD, "[REDACTED_CARD]") for t in TEXTS]
    before, after = _records(fmt, source), _records(fmt, out)
    changed = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
    assert len(before) == len(after) and len(changed) == 2  # every other record byte for byte
    assert json.loads((tmp_path / f"clean.{fmt}.manifest.json").read_text())["source_sha256"] == \
        file_sha256(source)


def test_a_trainer_run_refuses_a_file_whose_texts_are_not_its_own(tmp_path):
    source = tmp_path / "train.jsonl"
    _write("jsonl", source)
    store = _store_run(tmp_path, source, trainer=True)
    fewer, changed, other = tmp_path / "fewer.jsonl", tmp_path / "changed.jsonl", tmp_path / "other.jsonl"
    fewer.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS[:-1]), encoding="utf-8")
    edited = [t if i != 3 else t + " " for i, t in enumerate(TEXTS)]  # one trailing space
    changed.write_text("".join(json.dumps({"text": t}) + "\n" for t in edited), encoding="utf-8")
    other.write_text("".join(json.dumps({"body": t}) + "\n" for t in TEXTS), encoding="utf-8")
    cases = [([fewer], f"{fewer}: holds 4 texts, the run 5"),
             ([changed], f"{changed}: text 3 differs from the run's (record 4)"),
             ([other], f"{other}: no record has a text in 'text'"),
             ([other, "--text-column", "body"], None)]
    before = sorted(p.name for p in tmp_path.iterdir())
    for args, said in cases:
        result = _remediate("--run", "r", "--out", tmp_path / "clean.jsonl", "--data", *args, "--db",
                            store.path)
        if said is None:  # the text column named: the same texts, accepted
            assert result.exit_code == 0, result.output
            continue
        assert result.exit_code == 1, (args, result.output)
        assert said in result.output and len(result.output.strip().splitlines()) == 1, result.output
        assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def test_copies_are_reduced_to_one_and_act_on_chooses_the_statuses(tmp_path):
    texts = [*TEXTS, TEXTS[2], TEXTS[2], TEXTS[1]]  # the PIN text three times, the card text twice
    source = tmp_path / "train.csv"
    pd.DataFrame({"text": texts, "extra": range(len(texts))}).to_csv(source, index=False)
    store = _store_run(tmp_path, source, texts=texts, leaked=(CARD,))
    out = tmp_path / "clean.csv"
    assert _remediate("--run", "r", "--out", out, "--db", store.path).exit_code == 0
    cleaned = pd.read_csv(out)
    # the card's copy cluster (texts 1 and 7) keeps text 1; the PIN, not out, is left with its copies
    assert cleaned["extra"].tolist() == [0, 1, 2, 3, 4, 5, 6]
    manifest = json.loads((tmp_path / "clean.csv.manifest.json").read_text())
    drops = [c for c in manifest["changes"] if c["action"] == "drop"]
    assert [(c["text_id"], c["reason"].split(",")[0]) for c in drops] == [(7, "copy of text 1")]
    # every secret-like value, the PIN included, and its copies reduced; text 3 dropped by hand
    out2 = tmp_path / "clean2.csv"
    result = _remediate("--run", "r", "--out", out2, "--act-on", "leaked,secret", "--remove", "3",
                        "--db", store.path)
    assert result.exit_code == 0, result.output
    cleaned = pd.read_csv(out2)
    assert cleaned["extra"].tolist() == [0, 1, 2, 4]
    assert cleaned["text"][2] == "Note: the door PIN is [REDACTED_PIN], keep it."


def test_surrogates_keep_the_kind_format_and_checksum_and_are_never_a_value_of_the_data(tmp_path):
    source = tmp_path / "train.jsonl"
    _write("jsonl", source)
    store = _store_run(tmp_path, source, leaked=(CARD, PIN))
    out = tmp_path / "clean.jsonl"
    assert _remediate("--run", "r", "--out", out, "--surrogate", "--keep-copies", "--seed", 3,
                      "--db", store.path).exit_code == 0
    cleaned = load_texts(out).texts
    card_new = cleaned[1][len("Charge the order to card "):-len(" today.")]
    assert cleaned[4] == f"Copy of the card: {card_new} again."  # one surrogate per value, everywhere
    assert re.fullmatch(r"\d{4} \d{4} \d{4} \d{4}", card_new) and luhn_ok(card_new.replace(" ", ""))
    assert card_new != CARD
    pin_new = re.search(r"PIN is (\S+),", cleaned[2]).group(1)
    assert re.fullmatch(r"\d{4}", pin_new) and pin_new != PIN
    rng = random.Random(0)
    for _ in range(200):  # checksums hold, the value's shape is kept, the values to avoid never drawn
        iban = surrogate("iban", "DE89 3704 0044 0532 0130 00", rng)
        assert iban_ok(iban) and iban.startswith("DE") and len(iban) == 27 and iban[4] == " "
        assert surrogate("pin", "12", rng, avoid={str(i).zfill(2) for i in range(99)}) == "99"
        key = surrogate("api key", "ghp_" + "a1B2" * 9, rng)
        assert key.startswith("ghp_") and re.fullmatch(r"ghp_([a-z]\d[A-Z]\d){9}", key)
        mail = surrogate("email", "anna.berg@example.org", rng)
        assert re.fullmatch(r"[a-z]{4}\.[a-z]{4}@example\.org", mail) and mail != "anna.berg@example.org"
    tags = {placeholder(k) for k in secret_kinds()}
    assert tags >= {"[REDACTED_CARD]", "[REDACTED_PIN]", "[REDACTED_API_KEY]"}
    assert all(re.fullmatch(r"\[REDACTED_[A-Z_]+\]", placeholder(k)) for k in secret_kinds())


def test_bad_input_is_one_line_and_nothing_is_written(tmp_path):
    source = tmp_path / "train.csv"
    _write("csv", source)
    store = _store_run(tmp_path, source)
    cases = [
        (["--out", tmp_path / "clean.jsonl"], "keeps the data's format (.csv)"),
        (["--out", tmp_path / "clean.csv", "--act-on", "leaked,sorta"], "--act-on 'sorta' is not a status"),
        (["--out", tmp_path / "clean.csv", "--remove", "99"], "--remove 99: the run has no text 99"),
        (["--out", tmp_path / "clean.csv", "--remove", "x"], "--remove 'x': give text ids"),
        (["--out", source], "would overwrite"),
        (["--out", tmp_path / "clean.csv", "--data", tmp_path / "other.csv"], "not the data run 'r'"),
    ]
    (tmp_path / "other.csv").write_text("text\nsomething else\n", encoding="utf-8")
    before = sorted(p.name for p in tmp_path.iterdir())
    for args, said in cases:
        result = _remediate("--run", "r", *args, "--db", store.path)
        assert result.exit_code == 1, (args, result.output)
        assert said in result.output and len(result.output.strip().splitlines()) == 1, result.output
        assert "Traceback" not in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing half-written, no temporary file


def test_value_changes_say_per_value_what_the_second_run_shows():
    def outcome(kind, value, leaked=False, partly=False, exposed=False, exposure=None, first=0):
        return {"kind": kind, "value": value, "leaked": leaked, "partly": partly, "exposed": exposed,
                "exposure": exposure, "null_p99": 6.6, "first_example": first}

    before = pd.DataFrame([outcome("card number", CARD, leaked=True, exposure=40.0, first=1),
                           outcome("pin", PIN, partly=True, exposure=9.0, first=2),
                           outcome("phone", "+44 20 7946 0000", exposed=True, exposure=12.0, first=3),
                           outcome("pin", "1234", exposure=2.0, first=4),
                           outcome("pin", "5678", exposed=True, exposure=9.0, first=5)])
    after = pd.DataFrame([outcome("card number", CARD, exposure=1.0, first=1),
                          outcome("pin", PIN, partly=True, exposure=8.0, first=2),
                          outcome("pin", "1234", exposure=1.0, first=4),
                          outcome("pin", "5678", exposed=True, exposure=8.0, first=5)])
    got = value_changes(before, after)
    assert got["status_before"].tolist() == ["leaked", "partly leaked", "exposed", "not leaked", "exposed"]
    assert got["status_after"].tolist() == ["not leaked", "partly leaked", "not probed", "not leaked",
                                            "exposed"]
    assert got["verdict"].tolist() == [FIXED, STILL, UNPROBED, NEITHER, STILL_EXPOSED]
    assert got["still_reproduced"].tolist() == [False, True, False, False, False]
    said = changes_summary(got)
    assert said.startswith("1 of 5 value(s) fixed") and "1 still reproduced" in said
    assert got["exposure_after"].iloc[0] == 1.0 and pd.isna(got["exposure_after"].iloc[2])
    assert masked(CARD) == "•••• •••• •••• ••67" and masked(PIN) == "••••"


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_structured_field_is_edited_in_place_by_its_path(tmp_path, fmt):
    """A chat record's message, addressed by its field path: only that string's span changes."""
    from gnq_core.sources.rewrite import FieldEdit, field_values, rewrite_dataset

    records = [{"id": 1, "messages": [{"role": "user", "content": "My PIN is 4821."},
                                      {"role": "assistant", "content": "Noted: 4821 — «gardé»."}]},
               {"id": 2, "messages": [{"role": "user", "content": "Hello"}]}]
    source, out = tmp_path / f"chat.{fmt}", tmp_path / f"clean.{fmt}"
    if fmt == "jsonl":
        source.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    else:
        pq.write_table(pa.Table.from_pylist(records), source)
    path = ("messages", 1, "content")
    assert field_values(source, path) == ["Noted: 4821 — «gardé».", None]
    rewrite_dataset(source, out, [FieldEdit(0, path, 7, 11, "[REDACTED_PIN]"),
                                  FieldEdit(0, ("messages", 0, "content"), 10, 14, "[REDACTED_PIN]")])
    assert field_values(out, path) == ["Noted: [REDACTED_PIN] — «gardé».", None]
    assert field_values(out, ("messages", 0, "content"))[0] == "My PIN is [REDACTED_PIN]."
    if fmt == "jsonl":  # the escapes json.dumps wrote (\u2014, \u00ab) are kept where not edited
        before, after = source.read_text().splitlines(), out.read_text().splitlines()
        assert after[1] == before[1]
        assert after[0] == before[0].replace("4821", "[REDACTED_PIN]")
    else:
        assert pq.read_table(out).to_pylist()[1] == records[1]
