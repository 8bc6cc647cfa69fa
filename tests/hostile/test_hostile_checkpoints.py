"""Untrusted checkpoints through the CLI and the app: each malformed folder (made here) gives one
line naming the file and the problem, exit code 1, an error box on New audit, and leaves the
store exactly as it was (file bytes and rows).  A malicious pickle never runs."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
import torch
from hostile_helpers import (
    app_page,
    assert_store_unchanged,
    gnq,
    gnq_fails,
    make_series,
    rendered,
    store_fingerprint,
)
from lm_fixtures import texts
from safetensors.torch import load_file, save_file
from transformers import BertConfig
from typer.testing import CliRunner

from gnq_core.cli import app
from gnq_core.jobs.jobs import list_jobs, start_job
from gnq_core.pipelines.settings import AuditJob, AuditSettings
from gnq_core.results.store import Store
from gnq_core.sources.checkpoints.checks import check_checkpoint
from gnq_core.sources.checkpoints.save import save_checkpoint
from gnq_core.sources.models import build_model, train_tokenizer

pytestmark = pytest.mark.slow


class Payload:
    """Unpickling this runs `touch MARKER`: it must never happen."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _tokenizer_bigger_than_the_model(ckpt: Path) -> str:
    tok = train_tokenizer(texts(200), vocab_size=300)
    save_checkpoint(build_model("tiny", 280, 32, seed=0), tok, ckpt)
    return "the tokenizer has 300 tokens but config.json has vocab_size 280"


def _config_does_not_match_weights(ckpt: Path) -> str:
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps(config | {"n_embd": 32}))
    return "weights do not match config.json (shape mismatch"


def _no_weights(ckpt: Path) -> str:
    (ckpt / "model.safetensors").unlink()
    return "no weight files"


def _not_a_causal_lm(ckpt: Path) -> str:
    (ckpt / "config.json").unlink()
    BertConfig(vocab_size=300, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
               intermediate_size=32, architectures=["BertForMaskedLM"]).save_pretrained(ckpt)
    return "model type 'bert' is not a causal language model"


def _truncated_weights(ckpt: Path) -> str:
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    return "model.safetensors: corrupt or truncated safetensors file"


def _missing_tensor(ckpt: Path) -> str:
    weights = load_file(ckpt / "model.safetensors")
    del weights["transformer.h.1.mlp.c_fc.weight"]
    save_file(weights, ckpt / "model.safetensors", metadata={"format": "pt"})
    return "missing transformer.h.1.mlp.c_fc.weight"


def _corrupt_config(ckpt: Path) -> str:
    (ckpt / "config.json").write_text('{"model_type": "gpt2", ')
    return "config.json: not valid JSON"


def _remote_code(ckpt: Path) -> str:
    (ckpt / "config.json").write_text(json.dumps({"model_type": "evil-arch", "auto_map": {
        "AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}}))
    (ckpt / "modeling_evil.py").write_text(f"open({str(ckpt.parent / 'PWNED')!r}, 'w')\n")
    return "unknown model type 'evil-arch' in config.json (not built into this transformers version; " \
           "remote code is never run)"


def _malicious_pickle(ckpt: Path) -> str:
    (ckpt / "model.safetensors").unlink()
    torch.save({"transformer.wte.weight": torch.zeros(2), "x": Payload(ckpt.parent / "PWNED")},
               ckpt / "pytorch_model.bin")
    return "pytorch_model.bin: refusing to unpickle"


BREAKAGES = {f.__name__.strip("_"): f for f in (
    _tokenizer_bigger_than_the_model, _config_does_not_match_weights, _no_weights, _not_a_causal_lm,
    _truncated_weights, _missing_tensor, _corrupt_config, _remote_code, _malicious_pickle)}


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    return make_series(tmp_path_factory.mktemp("good"), 2)


@pytest.fixture(scope="module")
def broken(tmp_path_factory, good) -> dict[str, tuple[Path, str]]:
    """name -> (a series of a good checkpoint and a broken one, what the error must say)."""
    root = tmp_path_factory.mktemp("broken")
    cases = {}
    for name, breakage in BREAKAGES.items():
        series = root / name
        shutil.copytree(good / "epoch-1", series / "epoch-1")
        shutil.copytree(good / "epoch-2", series / "epoch-2")
        if name == "tokenizer_bigger_than_the_model":
            shutil.rmtree(series / "epoch-2")
        cases[name] = (series, breakage(series / "epoch-2"))
    return cases


@pytest.fixture
def store(tmp_path, good) -> Path:
    """A store with one finished audit in it, to compare before and after."""
    db = tmp_path / "gnq.duckdb"
    data = tmp_path / "texts.txt"
    data.write_text("\n".join(texts(12)) + "\n")
    gnq("audit", "--checkpoints", good, "--data", data, "--db", db, "--name", "before", "--batch-size", 4,
        "--max-length", 16, "--quiet")
    return db


def test_each_broken_checkpoint_is_one_line_exit_1_and_the_store_is_unchanged(store, broken, good, tmp_path):
    data = tmp_path / "texts.txt"
    before = store_fingerprint(store)
    for name, (series, problem) in broken.items():
        for target in (series, series / "epoch-2"):  # the series (broken one second), and it alone
            result = CliRunner().invoke(app, ["audit", "--checkpoints", str(target), "--data", str(data),
                                              "--db", str(store), "--name", f"x-{name}", "--max-length", "16",
                                              "--quiet"])
            lines = result.output.strip().splitlines()
            assert result.exit_code == 1 and len(lines) == 1, (name, result.output)
            assert lines[0].startswith(f"error: {series / 'epoch-2'}") and problem in lines[0], (name, lines)
        with pytest.raises(Exception, match="epoch-2"):
            check_checkpoint(series / "epoch-2")
    # Resuming a run with other checkpoints than it was started with would mix them up.
    result = CliRunner().invoke(app, ["audit", "--checkpoints", str(good / "epoch-2"), "--data", str(data),
                                      "--db", str(store), "--name", "before", "--batch-size", "4",
                                      "--max-length", "16"])
    assert result.exit_code == 1 and "different checkpoint series (epoch-1, epoch-2 stored, epoch-2 given)" \
        in " ".join(result.output.split())
    # A good series, but more tokens per text than the model has positions.
    result = CliRunner().invoke(app, ["audit", "--checkpoints", str(broken["no_weights"][0] / "epoch-1"),
                                      "--data", str(data), "--db", str(store), "--max-length", "64"])
    assert result.exit_code == 1 and "--max-length 64 is more than the 32 positions" in result.output
    assert_store_unchanged(store, before)
    assert not list(tmp_path.parent.rglob("PWNED")), "a checkpoint file ran code"


def test_train_from_and_extract_with_a_broken_checkpoint_leave_the_store_unchanged(store, broken, good,
                                                                                tmp_path):
    data = tmp_path / "texts.txt"
    before = store_fingerprint(store)
    series, problem = broken["malicious_pickle"]
    # A real process: its stderr is one line, its exit code 1.
    line = gnq_fails("train", "--init", series / "epoch-2", "--data", data, "--out", tmp_path / "out",
                     "--db", store, "--max-length", 16, "--quiet")
    assert str(series / "epoch-2") in line and problem in line
    # The checkpoint an audit was run on gets corrupted afterwards: the attack refuses it.
    copy = tmp_path / "copy"
    shutil.copytree(good, copy)
    gnq("audit", "--checkpoints", copy, "--data", data, "--db", store, "--name", "later", "--batch-size", 4,
        "--max-length", 16, "--quiet")
    before = store_fingerprint(store)
    _truncated_weights(copy / "epoch-2")
    result = CliRunner().invoke(app, ["extract", "--run", "later", "--db", str(store), "--quiet"])
    assert result.exit_code == 1 and "epoch-2/model.safetensors: corrupt or truncated" in result.output
    assert_store_unchanged(store, before)
    assert not list(tmp_path.parent.rglob("PWNED"))


def test_the_app_shows_an_error_box_before_and_after_a_job(tmp_path, monkeypatch, broken):
    db = tmp_path / "gnq.duckdb"
    monkeypatch.setenv("GNQ_DB", str(db))
    series, problem = broken["not_a_causal_lm"]
    at = app_page("new_audit")
    at.radio(key="ckpt_mode").set_value("Local path").run()
    at.text_input(key="ckpt_path").set_value(str(series)).run()
    assert not at.exception
    shown = rendered(at.error[0].value) if at.error else ""
    assert shown.startswith(f"{series / 'epoch-2'}: model type 'bert' is not a causal language model"), shown
    assert at.button[0].disabled  # Start audit

    # A job that fails anyway (started from elsewhere): the job panel shows its one-line error.
    data = tmp_path / "texts.txt"
    data.write_text("a text\nanother\n")
    job = start_job("bad", db, [AuditJob(checkpoints=str(series / "epoch-2"), data=str(data), name="bad",
                                         settings=AuditSettings(max_length=16))])
    deadline = time.monotonic() + 120
    while list_jobs(db)[0].status == "running":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    job = list_jobs(db)[0]
    assert job.status == "failed" and job.returncode == 1
    at = app_page("new_audit")
    boxes = [rendered(e.value) for e in at.error]
    assert any(b.startswith("Job failed") and "not a causal language model" in b for b in boxes), boxes
    assert not db.exists() or Store(db).runs().empty
