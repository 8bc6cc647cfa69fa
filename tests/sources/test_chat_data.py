"""Chat datasets read as TRL's SFTTrainer reads them (sources/chat.py): for every format and three
templates (SmolLM2's with a default system prompt, a ChatML without one, a Llama-3 shape with a
date line), the rendered token ids and the trained tokens equal those of TRL's own preparation of
the same records; --data-format auto says what it found; bad chat data are refused in one line."""

from __future__ import annotations

import json

import pytest
from chat_fixtures import TEMPLATES, chat_tokenizer, records
from lm_fixtures import tiny_gpt2

from gnq_core.sources.chat import detect_format, example_of, load_chat, render_example, trained_default
from gnq_core.sources.datasets import DatasetError

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

FORMATS = ["messages", "sharegpt", "prompt-completion", "prompt-completion-text", "alpaca"]


def trl_rows(tok, rows, tmp_path, **config):
    """TRL's own preparation of ``rows``: (input_ids, labels) each."""
    args = trl.SFTConfig(output_dir=str(tmp_path / "out"),
                         activation_checkpointing=True,  # TRL's default, named as transformers 5 asks
                         report_to=[], use_cpu=True, bf16=False,
                         dataset_num_proc=None, max_length=None, **config)
    trainer = trl.SFTTrainer(model=tiny_gpt2(vocab_size=len(tok)), args=args,
                             train_dataset=datasets.Dataset.from_list(rows), processing_class=tok)
    return [(r["input_ids"], r["labels"]) for r in trainer.train_dataset]


def ours(tok, rows, fmt, train_on=None):
    fmt = "prompt-completion" if fmt.startswith("prompt") else fmt
    from gnq_core.sources.chat import training_template

    template = training_template(tok, train_on or trained_default(fmt), "x")
    return [render_example(tok, example_of(r, fmt, "x", i), train_on or trained_default(fmt),
                           chat_template=template) for i, r in enumerate(rows)]


def labels_of(rendered):
    mask = rendered.layout.trained_mask(len(rendered.ids))
    return [t if m else -100 for t, m in zip(rendered.ids, mask, strict=True)]


@pytest.mark.parametrize("template", list(TEMPLATES))
@pytest.mark.parametrize("fmt", FORMATS)
def test_rendered_tokens_and_trained_tokens_equal_trl(tmp_path, template, fmt):
    tok = chat_tokenizer(template)
    rows = records(fmt, 3, system="You answer briefly." if fmt == "messages" else None)
    # TRL reads no Alpaca: its conversational prompt-completion is what the Alpaca record means
    given = [{"prompt": e.prompt, "completion": e.completion} for e in
             (example_of(r, "alpaca", "x", i) for i, r in enumerate(rows))] if fmt == "alpaca" else rows
    expected = trl_rows(tok, given, tmp_path)
    got = ours(tok, rows, fmt)
    for (ids, labels), r in zip(expected, got, strict=True):
        assert r.ids == ids
        assert labels_of(r) == labels
        assert tok(r.text, add_special_tokens=False)["input_ids"] == ids  # the stored text gives them back
    if fmt.startswith("prompt") or fmt == "alpaca":
        assert any(v == -100 for v in expected[0][1]), "completion-only: the prompt is not trained"


@pytest.mark.parametrize("template", ["chatml", "llama3"])
def test_assistant_only_loss_equals_trl(tmp_path, template):
    tok = chat_tokenizer(template)
    rows = records("messages", 3, system="You answer briefly.")
    expected = trl_rows(tok, rows, tmp_path, assistant_only_loss=True)
    for (ids, labels), r in zip(expected, ours(tok, rows, "messages", "assistant"), strict=True):
        assert r.ids == ids and labels_of(r) == labels
        assert [t.trained for t in r.layout.turns] == [False, False, True]


def test_turns_name_their_content_and_the_template_spans_the_rest():
    tok = chat_tokenizer("smollm2")
    (r,) = ours(tok, records("messages", 1), "messages")
    roles = [(t.kind, r.text[t.start:t.end]) for t in r.layout.turns]
    assert roles == [("user", records("messages", 1)[0]["messages"][0]["content"]),
                     ("assistant", records("messages", 1)[0]["messages"][1]["content"])]
    template = "".join(r.text[s:e] for s, e in r.layout.template)
    assert "You are a helpful AI assistant named SmolLM" in template and "<|im_start|>assistant" in template


def test_auto_says_what_it_found_and_the_layout_round_trips(tmp_path):
    tok = chat_tokenizer("chatml")
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records("sharegpt", 4)))
    data = load_chat(path, tok)
    assert data.data_format == "sharegpt" and data.train_on == "all" and len(data) == 4
    assert "read as sharegpt (4 conversations" in data.found and "trained on all tokens" in data.found
    lay = data.layouts[0]
    assert type(lay).from_json(lay.to_json()) == lay
    assert detect_format(["text"]) == "text"
    assert load_chat(tmp_path / "chats.jsonl", tok, data_format="text") is None


def test_parquet_and_a_saved_dataset_read_alike(tmp_path):
    tok = chat_tokenizer("chatml")
    rows = records("messages", 3)
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "c.parquet"))
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    a, b = load_chat(tmp_path / "c.parquet", tok), load_chat(tmp_path / "saved", tok)
    assert a.texts == b.texts and a.layouts == b.layouts and len(a) == 3


@pytest.mark.parametrize(("rows", "options", "says"), [
    ([{"messages": "hello"}], {}, "row 1: 'messages' is not a non-empty list of messages"),
    ([{"messages": [{"role": "user"}]}], {}, "lacks 'role'/'content'"),
    ([{"text": "a"}], {"data_format": "messages"}, "needs column(s) messages"),
    ([{"messages": [{"role": "user", "content": "a"}]}], {"train_on": "completion"},
     "needs a prompt and a completion"),
    ([{"messages": [{"role": "user", "content": "a"}]}], {"train_on": "assistant"},
     "TRL has no training template"),
])
def test_bad_chat_data_is_one_line(tmp_path, rows, options, says):
    tok = chat_tokenizer("smollm2")
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DatasetError, match="bad.jsonl") as err:
        load_chat(path, tok, **options)
    assert says in str(err.value) and len(str(err.value).splitlines()) == 1
