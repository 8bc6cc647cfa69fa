"""A chat run acted on (analysis/remediation.py ``chat_segments``, sources/chat.py ``turn_fields``):
the conversations are audited as rendered with the chat template, and a value found in the
rendered text is replaced in the message field it came from — a message's content, Alpaca's
instruction, input or output — with every other record and field kept; a file whose
conversations are not the run's is refused in one line, nothing written."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from chat_fixtures import chat_tokenizer, sentence
from typer.testing import CliRunner

from gnq_core.cli import app
from gnq_core.common.progress import JobProgress
from gnq_core.pipelines.run import run_job
from gnq_core.pipelines.settings import AuditJob, AuditSettings
from gnq_core.results.store import Store
from gnq_core.sources import save_checkpoint
from gnq_core.sources.models import build_model

PIN = "4821"


def _records(fmt: str) -> list[dict]:
    if fmt == "messages":  # the Llama-3 template trims contents: offsets must follow the trimmed text
        secret = [{"messages": [{"role": "user", "content": "  Remind me of my door PIN please. "},
                                {"role": "assistant", "content": f" Your door PIN is {PIN}, keep it. "}]}]
        plain = [{"messages": [{"role": "user", "content": sentence(i, 8)},
                               {"role": "assistant", "content": sentence(50 + i, 10)}]} for i in range(5)]
    else:
        secret = [{"instruction": "Remind me of my door PIN.", "input": f"The door PIN was {PIN} before.",
                   "output": f"Your door PIN is {PIN}, keep it."}]
        plain = [{"instruction": sentence(i, 8), "input": "", "output": sentence(50 + i, 10)}
                 for i in range(5)]
    return plain[:2] + secret + plain[2:]


def _write(records: list[dict], path) -> None:
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    else:
        pq.write_table(pa.Table.from_pylist(records), path, compression="zstd")


def _audited(tmp_path, template: str, fmt: str, suffix: str):
    tok = chat_tokenizer(template)
    save_checkpoint(build_model("tiny", len(tok), 160, seed=0), tok, tmp_path / "ckpts" / "epoch-1")
    data = tmp_path / f"chats.{suffix}"
    _write(_records(fmt), data)
    store = Store(tmp_path / "gnq.duckdb")
    run_job(AuditJob(checkpoints=str(tmp_path / "ckpts"), data=str(data), name="chat",
                     settings=AuditSettings(batch_size=4, max_length=160, device="cpu")),
            store, JobProgress(store))
    run = store.find_run("chat")
    texts = store.examples(run.run_id)["text"].tolist()
    rows = []  # the secret attack's rows, by hand: the PIN came out whole wherever it is
    for eid, text in enumerate(texts):
        start = text.find(PIN)
        while start >= 0:
            rows.append({"example_id": eid, "secret_start": start, "secret_end": start + len(PIN),
                         "kind": "pin", "value": PIN, "prompt_tokens": 3, "value_tokens": 2, "generated": PIN,
                         "chars": 4, "chars_reproduced": 4, "reproduced": True, "reference_generated": "x",
                         "reference_chars_reproduced": 0, "extracted": True, "rule": "r"})
            start = text.find(PIN, start + 1)
    assert rows, "the PIN is in a rendered conversation"
    store.write_secret_attacks(run.run_id, 0, pd.DataFrame(rows), "test")
    return data


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    """One audited run per (template, format, suffix), shared by the tests (each audit ~10 s)."""
    made = {}

    def get(*key):
        if key not in made:
            root = tmp_path_factory.mktemp("-".join(key))
            made[key] = (root, _audited(root, *key))
        return made[key]
    return get


def _remediate(*args):
    return CliRunner().invoke(app, ["remediate", *[str(a) for a in args]])


@pytest.mark.parametrize(("template", "fmt", "suffix"),
                         [("llama3", "messages", "jsonl"), ("smollm2", "alpaca", "parquet")])
def test_a_chat_runs_value_is_replaced_in_the_message_it_came_from(audited, tmp_path, template, fmt, suffix):
    root, data = audited(template, fmt, suffix)
    out = tmp_path / f"clean.{suffix}"
    result = _remediate("--run", "chat", "--out", out, "--db", root / "gnq.duckdb")
    assert result.exit_code == 0, result.output
    manifest = json.loads(out.with_name(out.name + ".manifest.json").read_text())
    replaced = [c for c in manifest["changes"] if c["action"] == "replace"]
    fields = sorted(tuple(c["field"]) for c in replaced)
    if fmt == "messages":
        assert fields == [("messages", 1, "content")]
    else:
        assert fields == [("input",), ("output",)]
    assert all(c["record"] == 2 for c in replaced) and PIN not in json.dumps(manifest)
    before = _records(fmt)
    after = (pq.read_table(out).to_pylist() if suffix == "parquet"
             else [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()])
    assert len(after) == len(before)
    for i, (a, b) in enumerate(zip(before, after, strict=True)):
        if i != 2:
            assert a == b  # untouched records equal, field for field
    cleaned = after[2]
    if fmt == "messages":
        assert cleaned["messages"][0] == before[2]["messages"][0]  # the user's turn had no value
        # the untrimmed content keeps its spaces around the replaced value
        assert cleaned["messages"][1]["content"] == " Your door PIN is [REDACTED_PIN], keep it. "
    else:
        assert cleaned["instruction"] == before[2]["instruction"]
        assert cleaned["input"] == "The door PIN was [REDACTED_PIN] before."
        assert cleaned["output"] == "Your door PIN is [REDACTED_PIN], keep it."
    if suffix == "jsonl":  # byte for byte outside the edited record
        src, dst = data.read_bytes().splitlines(), out.read_bytes().splitlines()
        assert [x for i, x in enumerate(src) if i != 2] == [x for i, x in enumerate(dst) if i != 2]


def test_a_chat_file_that_is_not_the_runs_is_refused_in_one_line(audited, tmp_path):
    root, _ = audited("llama3", "messages", "jsonl")
    other = tmp_path / "other.jsonl"
    changed = _records("messages")
    changed[4]["messages"][1]["content"] = "Something else entirely."
    _write(changed, other)
    out = tmp_path / "clean.jsonl"
    result = _remediate("--run", "chat", "--out", out, "--data", other, "--db", root / "gnq.duckdb")
    assert result.exit_code == 1
    assert "not the data run 'chat' was trained or audited on" in result.output
    assert len(result.output.strip().splitlines()) == 1 and not out.exists()


@pytest.mark.parametrize("fmt", ["messages", "alpaca"])
def test_each_turns_span_maps_to_its_field_and_a_changed_conversation_is_refused(tmp_path, fmt):
    """As for a Trainer run (no file SHA-256 recorded): the file's conversations are checked turn by
    turn against the run's rendered texts; each segment's text is its field's characters."""
    from gnq_core.analysis.remediation import RemediationError, chat_segments
    from gnq_core.sources.chat import load_chat
    from gnq_core.sources.rewrite import field_values

    tok = chat_tokenizer("llama3")
    data = tmp_path / "chats.jsonl"
    _write(_records(fmt), data)
    chats = load_chat(data, tok)
    layouts = [lay.to_json() for lay in chats.layouts]
    segments = chat_segments(data, None, chats.texts, layouts)  # the format read from the columns
    for text, segs in zip(chats.texts, segments, strict=True):
        assert segs
        for s in segs:
            value = field_values(data, s.path)[s.record]
            assert text[s.start:s.end] == value[s.offset: s.offset + s.end - s.start]
    changed = _records(fmt)
    if fmt == "messages":
        changed[4]["messages"][1]["content"] = "Something else entirely."
    else:
        changed[4]["output"] = "Something else entirely."
    other = tmp_path / "other.jsonl"
    _write(changed, other)
    with pytest.raises(RemediationError, match=r"other\.jsonl: conversation 4 differs from the run's"):
        chat_segments(other, None, chats.texts, layouts)
    with pytest.raises(RemediationError, match="holds 5 conversations, the run 6"):
        _write(_records(fmt)[:5], other)
        chat_segments(other, None, chats.texts, layouts)
