"""gnq audit on chat data: the file read as chat (one line says what was found), each text's loss
over the tokens the fine-tune trained (TRL's labels), its turns stored with it, the reading
recorded with the run; copies found in the texts' own content, not in their shared system prompt."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from chat_fixtures import chat_tokenizer, records

from gnq_core import per_example_lm_loss
from gnq_core.pipelines.run import run_job
from gnq_core.pipelines.settings import AuditJob, AuditSettings
from gnq_core.results.store import Store
from gnq_core.sources.chat import ChatLayout
from gnq_core.sources.datasets import DatasetError
from gnq_core.sources.models import build_model

SYSTEM = "You are the support assistant of Acme Bank. Answer politely, briefly and never share account data."


@pytest.fixture
def chat_checkpoint(tmp_path):
    tok = chat_tokenizer("chatml")
    model = build_model("tiny", len(tok), 256, seed=0)
    path = tmp_path / "ckpt"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path, tok, model


def audit(tmp_path, ckpt, rows, **options):
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    said = []
    from gnq_core.common.progress import JobProgress

    store = Store(tmp_path / "gnq.duckdb")
    job = AuditJob(checkpoints=str(ckpt), data=str(data), name="chat",
                   settings=AuditSettings(batch_size=4, max_length=256, device="cpu"), threads=1, **options)
    run_job(job, store, JobProgress(store, warn=said.append))
    return store, store.find_run("chat"), said


@pytest.mark.parametrize("train_on", [None, "assistant"])
def test_chat_audit_losses_are_over_the_trained_tokens(tmp_path, chat_checkpoint, train_on):
    path, tok, model = chat_checkpoint
    rows = records("messages", 8, system=SYSTEM)
    store, run, said = audit(tmp_path, path, rows, train_on=train_on)
    expected_on = train_on or "all"
    assert any("read as messages (8 conversations" in s and f"trained on {expected_on} tokens" in s
               for s in said), said
    assert run.settings["data_format"] == "messages" and run.settings["train_on"] == expected_on
    examples = store.examples(run.run_id)
    scores = store.scores(run.run_id).set_index("example_id")
    model.eval()
    for _, ex in examples.iterrows():
        layout = ChatLayout.from_json(ex["turns"])
        ids = tok(ex["text"], add_special_tokens=False)["input_ids"][:256]  # --max-length
        mask = layout.trained_mask(len(ids))
        labels = torch.tensor([[t if m else -100 for t, m in zip(ids, mask, strict=True)]])
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits
        want = per_example_lm_loss(logits, labels).item()
        assert scores.loc[ex["example_id"], "loss"] == pytest.approx(want, rel=1e-5)
        assert [t.kind for t in layout.turns] == ["system", "user", "assistant"]
        assert [t.trained for t in layout.turns] == ([True] * 3 if train_on is None else [False, False, True])
    # one system prompt shared by every conversation is no copy cluster
    assert (examples["copies"] == 1).all()


def test_chat_data_mistakes_are_one_line_before_any_write(tmp_path, chat_checkpoint):
    path, _, _ = chat_checkpoint
    with pytest.raises(DatasetError, match="needs a prompt and a completion"):
        audit(tmp_path, path, records("messages", 4), train_on="completion")
    assert Store(tmp_path / "gnq.duckdb").find_run("chat") is None
    with pytest.raises(ValueError, match="--train-on applies to chat data"):
        AuditJob(checkpoints=str(path), data="x.csv", data_format="text", train_on="all")


def test_plain_texts_in_jsonl_stay_plain(tmp_path, chat_checkpoint):
    path, _, _ = chat_checkpoint
    rows = [{"text": r["messages"][1]["content"]} for r in records("messages", 4)]
    store, run, said = audit(tmp_path, path, rows)
    assert "data_format" not in run.settings and not any("read as" in s for s in said)
    assert store.examples(run.run_id)["turns"].isna().all()
    assert isinstance(store.examples(run.run_id), pd.DataFrame)
