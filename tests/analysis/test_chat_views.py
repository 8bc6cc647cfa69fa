"""A conversation reads as one: its turns (role: content), the leaked characters marked inside
their turn, the raw template tokens only behind "as tokenised" (analysis/conversation.py), in the
report's text table and as the export's `conversation` column."""

from __future__ import annotations

import pandas as pd
from chat_fixtures import chat_tokenizer, records

from gnq_core.analysis.conversation import conversation_html, conversation_text, leaked_span
from gnq_core.analysis.findings import texts_table_html
from gnq_core.results.export import export_frame
from gnq_core.sources.chat import example_of, render_example


def rendered():
    tok = chat_tokenizer("smollm2")
    return render_example(tok, example_of(records("messages", 1)[0], "messages", "x", 0), "all")


def test_turns_read_as_role_and_content_with_the_leak_marked_in_its_turn():
    r = rendered()
    answer = records("messages", 1)[0]["messages"][1]["content"]
    text, layout = r.text, r.layout.to_json()
    assert conversation_text(text, layout).splitlines()[1] == f"assistant: {answer}"
    leaked = answer[5:25]
    page = conversation_html(text, layout, [leaked_span(text, leaked)])
    seen, raw = page.split("<details>")
    assert f"<mark>{leaked}</mark>" in seen and "<b>assistant:</b>" in seen
    assert "im_start" not in seen and "You are a helpful AI assistant" not in seen  # the template: behind
    assert "as tokenised" in raw and "&lt;|im_start|&gt;system" in raw
    assert conversation_text("plain", None) == "plain"


def test_report_table_and_export_show_the_turns():
    r = rendered()
    answer = records("messages", 1)[0]["messages"][1]["content"]
    ranked = pd.DataFrame({"example_id": [0], "text": [r.text], "status": ["leaked"], "reason": ["why"],
                           "rank": [1], "turns": [r.layout.to_json()], "extracted": [True],
                           "extraction_target": [answer[:12]], "cluster_id": [0], "copies": [1],
                           "attack_turn": ["assistant"], "attack_turn_trained": [True]})
    table = texts_table_html(ranked)
    assert f"<mark>{answer[:12]}</mark>" in table and "as tokenised" in table
    out = export_frame(ranked, with_extraction=True)
    assert out.loc[0, "conversation"].endswith(f"assistant: {answer}")
    assert out.loc[0, "attack_turn"] == "assistant" and out.loc[0, "text"] == r.text
