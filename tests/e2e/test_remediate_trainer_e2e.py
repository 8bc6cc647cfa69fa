"""A run of the HF Trainer integration acted on, the way a user does it: a tiny GPT-2 trained with
``GNQTrainer`` on the texts of a file with planted secret values (8 copies each), ingested into the
store; ``gnq extract`` attacks its last epoch checkpoint; ``gnq remediate --data`` writes the
cleaned file from the training file (the run records none: its texts are checked against the
run's), and a file that is not the run's is refused in one line with nothing written."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from cli_helpers import gnq
from test_remediate_e2e import planted_file
from transformers import TrainingArguments
from typer.testing import CliRunner

from gnq_core.cli import app
from gnq_core.integrations.hf import GNQConfig, GNQTrainer, lm_collator
from gnq_core.results.store import Store
from gnq_core.sources.models import build_model, train_tokenizer

EPOCHS = 16


def _train(tmp_path, texts: list[str], db) -> None:
    tok = train_tokenizer(texts, vocab_size=400)
    rows = [{"input_ids": tok(t, add_special_tokens=False)["input_ids"][:40], "example_id": i}
            for i, t in enumerate(texts)]
    model = build_model("tiny", vocab_size=len(tok), max_length=40, seed=0, eos_token_id=tok.eos_token_id)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), num_train_epochs=EPOCHS, learning_rate=5e-3,
                             per_device_train_batch_size=8, report_to=[], save_strategy="epoch",
                             use_cpu=True, seed=0, disable_tqdm=True, logging_strategy="no")
    trainer = GNQTrainer(model=model, args=args, train_dataset=rows, processing_class=tok,
                         data_collator=lm_collator(tok.pad_token_id),
                         gnq=GNQConfig(out=tmp_path / "shards", name="ft", texts=texts, max_length=40, db=db))
    trainer.train()


def _remediate(*args) -> object:
    return CliRunner().invoke(app, ["remediate", *[str(a) for a in args]])


@pytest.mark.slow
def test_a_trainer_run_is_attacked_and_remediated_from_its_training_file(tmp_path):
    data = planted_file(tmp_path)
    texts = pd.read_csv(data)["text"].tolist()  # what the user trains on: the file's texts, in order
    db = tmp_path / "gnq.duckdb"
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        _train(tmp_path, texts, db)
        store = Store(db)
        run = store.run("ft")
        assert run.dataset_path == "(in memory)" and run.settings["trainer"].endswith("(GNQTrainer)")
        points = store.points(run.run_id)
        assert len(points) == EPOCHS and points["path"].notna().all()  # each epoch's checkpoint, recorded
        gnq("extract", "--run", "ft", "--db", db, "--threads", 1, "--quiet")
    finally:
        torch.set_default_dtype(previous)
    outcomes = store.value_outcomes(run.run_id)
    leaked = outcomes[outcomes["leaked"]]
    assert len(leaked) >= 1, "8 copies should make the model write a planted value whole"
    out = tmp_path / "clean.csv"

    wrong = tmp_path / "wrong.csv"  # the same texts but one
    frame = pd.read_csv(data)
    frame.loc[17, "text"] += " (edited)"
    frame.to_csv(wrong, index=False)
    shorter = tmp_path / "shorter.csv"
    pd.read_csv(data).iloc[:-2].to_csv(shorter, index=False)
    before = sorted(p.name for p in tmp_path.iterdir())
    n = len(texts)
    for args, said in (([], "trained in memory"), (["--data", wrong], f"{wrong}: text 17 differs"),
                       (["--data", shorter], f"{shorter}: holds {n - 2} texts, the run {n}")):
        result = _remediate("--run", "ft", "--out", out, *args, "--db", db)
        assert result.exit_code == 1, (args, result.output)
        assert said in result.output and len(result.output.strip().splitlines()) == 1, result.output
        assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written

    said = gnq("remediate", "--run", "ft", "--out", out, "--data", data, "--keep-copies", "--db", db)
    assert all(v not in said for v in outcomes["value"])  # counts only: no value in the output
    manifest = json.loads((tmp_path / "clean.csv.manifest.json").read_text())
    assert not any(v in json.dumps(manifest) for v in leaked["value"])
    edited = {c["record"] for c in manifest["changes"] if c["action"] == "replace"}
    source_lines = data.read_bytes().splitlines(keepends=True)
    clean_lines = out.read_bytes().splitlines(keepends=True)
    assert len(clean_lines) == len(source_lines)  # --keep-copies: every record kept
    for record, (a, b) in enumerate(zip(source_lines[1:], clean_lines[1:], strict=True)):
        if record in edited:
            assert a != b and not any(v in b.decode() for v in leaked["value"])
        else:
            assert a == b  # untouched records byte for byte
            assert not any(v in texts[record] for v in leaked["value"])
    assert edited, "the leaked values' records are edited"
