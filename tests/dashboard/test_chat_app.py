"""The dashboard on a chat run: Runs, Flagged texts and the drill-down read a conversation as its
turns (role: content), the chat template's tokens only behind "as tokenised"; a plain run's pages
look as they did."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from chat_fixtures import chat_tokenizer, records
from streamlit.testing.v1 import AppTest

from gnq_core.analysis.conversation import conversation_line, conversation_upto, leaked_marks, turns_html
from gnq_core.common.progress import JobProgress
from gnq_core.pipelines.run import run_job
from gnq_core.pipelines.settings import AuditJob, AuditSettings, ExtractJob
from gnq_core.results.store import Store
from gnq_core.sources.chat import example_of, render_example
from gnq_core.sources.models import build_model

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = "<|im_start|>"  # SmolLM2's template: its tokens open every rendered conversation
SYSTEM_DEFAULT = "You are a helpful AI assistant named SmolLM"


@pytest.fixture(scope="module")
def store_path(tmp_path_factory) -> Path:
    """A store with a chat run (SmolLM2's template, its default system prompt in every text) and a
    plain run, each audited on one tiny checkpoint and attacked."""
    root = tmp_path_factory.mktemp("chat_app")
    tok = chat_tokenizer("smollm2")
    build_model("tiny", len(tok), 256, seed=0).save_pretrained(root / "ckpt")
    tok.save_pretrained(root / "ckpt")
    store = Store(root / "gnq.duckdb")
    progress = JobProgress(store)
    chats = records("messages", 6)
    plain = [{"text": r["messages"][1]["content"]} for r in chats]
    for name, rows in (("chat", chats), ("plain", plain)):
        data = root / f"{name}.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        run_job(AuditJob(checkpoints=str(root / "ckpt"), data=str(data), name=name, threads=1,
                         settings=AuditSettings(batch_size=6, max_length=256, device="cpu")), store, progress)
        run_job(ExtractJob(run=name, prefix_tokens=4, suffix_tokens=4, reference=None, secret_candidates=1,
                           device="cpu", threads=1), store, progress)
    return root / "gnq.duckdb"


def page(name: str, db: Path, monkeypatch, **state) -> AppTest:
    monkeypatch.setenv("GNQ_DB", str(db))
    at = AppTest.from_file(str(ROOT / "gnq_core" / "dashboard" / "views" / f"{name}.py"), default_timeout=60)
    for key, value in state.items():
        at.session_state[key] = value
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def tables(at: AppTest) -> list[pd.DataFrame]:
    return [d.value for d in at.dataframe]


def shown_texts(at: AppTest) -> str:
    """Every text a table, code block or picker label of the page shows (the HTML blocks aside)."""
    cells = [str(v) for t in tables(at) for c in ("text", "conversation") if c in t for v in t[c]]
    labels = [str(o) for s in at.selectbox for o in s.options]
    return "\n".join(cells + labels + [c.value for c in at.code])


def html_blocks(at: AppTest) -> str:
    return "\n".join(e.proto.body for e in at.get("html"))


def test_runs_page_reads_a_conversation_as_turns(store_path, monkeypatch):
    at = page("runs", store_path, monkeypatch, run_name="chat")
    top = next(t for t in tables(at) if "conversation" in t)
    assert "text" not in top and "turns" not in top  # the raw text and the layout's JSON: not shown
    assert all(c.startswith("user: Question") and " │ assistant: " in c for c in top["conversation"])
    seen = shown_texts(at)
    assert "assistant: " in seen and TEMPLATE not in seen and SYSTEM_DEFAULT not in seen
    assert "<b>assistant:</b>" in html_blocks(at)  # the text-first table: turns, template behind a fold
    at.toggle(key="runs_top_tokenised").set_value(True).run()
    top = next(t for t in tables(at) if "text" in t and "rank" in t)
    assert top["text"].str.startswith(TEMPLATE + "system").all()  # as tokenised: the rendered text


def test_flagged_page_reads_a_conversation_as_turns(store_path, monkeypatch):
    at = page("flagged", store_path, monkeypatch, run_name="chat")
    out = next(t for t in tables(at) if "conversation" in t)
    assert "text" not in out and out["conversation"].str.contains("assistant: ").all()
    assert TEMPLATE not in shown_texts(at)
    at.toggle(key="flagged_tokenised").set_value(True).run()
    out = next(t for t in tables(at) if "text" in t)
    assert out["text"].str.startswith(TEMPLATE).all()
    assert out["conversation"].str.contains("\nassistant: ").all()  # as downloaded: one turn a line


def test_drilldown_shows_each_turn_and_the_template_only_as_tokenised(store_path, monkeypatch):
    store = Store(store_path)
    run = store.find_run("chat")
    text = store.examples(run.run_id).set_index("example_id").at[0, "text"]
    at = page("drilldown", store_path, monkeypatch, run_name="chat", example_id=0)
    turns = html_blocks(at)
    answer = records("messages", 6)[0]["messages"][1]["content"]
    assert "<b>user</b> · trained" in turns and "<b>assistant</b> · trained" in turns and answer in turns
    # the template's tokens and its default system prompt (no turn of the data) only behind the toggle
    assert "&lt;|im_start|&gt;" not in turns and SYSTEM_DEFAULT not in turns
    assert TEMPLATE not in shown_texts(at)
    prefix = store.extractions(run.run_id).set_index("example_id").at[0, "prefix_text"]
    assert at.code[0].value == "user: " + prefix.split("<|im_start|>user\n")[1]  # the attack's prompt: turns
    at.toggle(key="drill_tokenised").set_value(True).run()
    assert at.code[0].value == text.rstrip("\n")  # as tokenised (st.code drops the end newline)
    assert at.code[1].value == prefix


def test_plain_run_pages_look_as_before(store_path, monkeypatch):
    store = Store(store_path)
    run = store.find_run("plain")
    first = store.examples(run.run_id).set_index("example_id").at[0, "text"]
    for name in ("runs", "flagged"):
        at = page(name, store_path, monkeypatch, run_name="plain")
        assert not any(t.key in ("runs_top_tokenised", "runs_leaked_tokenised", "flagged_tokenised")
                       for t in at.toggle)
        assert not any("conversation" in t for t in tables(at))
        assert any("text" in t and first in set(t["text"]) for t in tables(at))
    at = page("drilldown", store_path, monkeypatch, run_name="plain", example_id=0)
    assert at.code[0].value == first and not at.toggle and "gnq-turn" not in html_blocks(at)


def test_leaked_characters_are_marked_inside_their_turn():
    tok = chat_tokenizer("chatml")  # its {% generation %} marks the assistant's tokens: the user's untrained
    r = render_example(tok, example_of(records("messages", 1)[0], "messages", "x", 0), "assistant")
    text, layout = r.text, r.layout.to_json()
    answer = records("messages", 1)[0]["messages"][1]["content"]
    at = text.index(answer)
    window = answer[3:15]
    secrets = pd.DataFrame({"secret_start": [at + 20, at + 30], "secret_end": [at + 24, at + 34],
                            "extracted": [True, False]})
    marks = leaked_marks(text, {"extracted": True, "extraction_target": window}, secrets)
    assert marks == [(at + 3, at + 15), (at + 20, at + 24)]  # the value not written whole: unmarked
    assert leaked_marks(text, {"extracted": pd.NA, "extraction_target": window}) == []
    page_html = turns_html(text, layout, marks)
    assistant = page_html[page_html.index("<b>assistant</b>"):]
    assert f"<mark>{window}</mark>" in assistant and f"<mark>{answer[20:24]}</mark>" in assistant
    assert "<b>user</b> · not trained" in page_html and "<b>assistant</b> · trained" in page_html
    assert "im_start" not in page_html
    assert conversation_line(text, layout).endswith(f"assistant: {answer}")
    assert conversation_line("a\nplain  text", None) == "a plain text"
    cut = text.index(answer) + 5  # an attack's prompt ending inside the answer: its turns, the last cut
    assert conversation_upto(text, layout, text[:cut]).endswith(f"\nassistant: {answer[:5]}")
    assert conversation_upto("plain text", None, "plain") == "plain"
    assert conversation_line(text, layout, 12) == conversation_line(text, layout)[:11] + "…"
