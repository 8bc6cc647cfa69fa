"""PEFT adapter checkpoints are checked as checkpoints are, before anything is written: their type
(an adapter of learned prompt tokens is refused), their links (a weight file linking out of the
folder is refused), their size, and the regular expressions of their config (invalid: one line;
backtracking: stopped by a time limit in a worker process, so the dashboard keeps answering)."""

from __future__ import annotations

import shutil
import threading
import time

import pandas as pd
import pytest
from hostile_helpers import assert_store_unchanged, gnq, gnq_fails, store_fingerprint
from lm_fixtures import texts, tiny_llama
from typer.testing import CliRunner

from gnq_core.cli import app
from gnq_core.sources.checkpoints.errors import CheckpointError
from gnq_core.sources.checkpoints.save import save_checkpoint
from gnq_core.sources.models import train_tokenizer

peft = pytest.importorskip("peft")

BACKTRACKS = "(.*)" * 8 + "Z"  # fullmatch against a 30-character module name: ~20 s in Python's re


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """A tiny Llama base, a LoRA adapter of it, a texts file and a store holding one run."""
    root = tmp_path_factory.mktemp("adapters")
    tok = train_tokenizer(list(texts(60)), vocab_size=320)
    base = tiny_llama(vocab_size=len(tok))
    save_checkpoint(base, tok, root / "base")
    lora = peft.get_peft_model(base, peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    lora.save_pretrained(root / "lora")
    pd.DataFrame({"text": list(texts(8))}).to_csv(root / "texts.csv", index=False)
    db = root / "gnq.duckdb"
    gnq("audit", "--checkpoints", root / "lora", "--base-model", root / "base", "--data", root / "texts.csv",
        "--db", db, "--name", "kept", "--batch-size", 4, "--max-length", 16, "--quiet")
    return root, db


def _audit_refused(root, db, adapter, *, subprocess: bool = False) -> str:
    """`gnq audit` of ``adapter`` refused in one line, exit code 1, the store left byte for byte (no
    'failed' run); ``subprocess``: a real process (its stderr alone), else in this one (faster)."""
    args = ("audit", "--checkpoints", adapter, "--base-model", root / "base", "--data", root / "texts.csv",
            "--db", db, "--name", "refused", "--batch-size", 4, "--max-length", 16, "--quiet")
    before = store_fingerprint(db)
    if subprocess:
        line = gnq_fails(*args)
    else:
        result = CliRunner().invoke(app, [str(a) for a in args])
        lines = result.output.strip().splitlines()
        assert result.exit_code == 1 and len(lines) == 1, result.output
        line = lines[0]
    assert_store_unchanged(db, before)
    return line


def _lora_with(root, tmp_path, **config) -> object:
    """The LoRA adapter with its config's fields replaced."""
    import json

    folder = tmp_path / "adapter"
    shutil.copytree(root / "lora", folder)
    raw = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
    (folder / "adapter_config.json").write_text(json.dumps(raw | config), encoding="utf-8")
    return folder


def test_a_prompt_tuning_adapter_is_refused_before_the_store_is_touched(adapters, tmp_path):
    root, db = adapters
    from gnq_core.sources.checkpoints.load import load_checkpoint

    model, _ = load_checkpoint(root / "base")
    config = peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4)
    peft.get_peft_model(model, config).save_pretrained(tmp_path / "prompt")
    line = _audit_refused(root, db, tmp_path / "prompt", subprocess=True)
    assert "adapter_config.json: a PROMPT_TUNING adapter (learned prompt tokens)" in line


def test_adapter_weights_linking_out_of_the_folder_are_refused(adapters, tmp_path):
    root, db = adapters
    folder = tmp_path / "linked"
    shutil.copytree(root / "lora", folder)
    outside = tmp_path / "elsewhere.safetensors"  # readable weights: only the link is wrong
    (folder / "adapter_model.safetensors").rename(outside)
    (folder / "adapter_model.safetensors").symlink_to(outside)
    line = _audit_refused(root, db, folder)
    assert "adapter_model.safetensors: a link to" in line and "outside" in line


@pytest.mark.parametrize(("field", "value", "problem"), [
    ("target_modules", "(q_proj", "target_modules: '(q_proj' is not a valid regular expression (missing )"),
    ("modules_to_save", ["lm_head["], "modules_to_save: 'lm_head[' is not a valid regular expression"),
    ("rank_pattern", {"*q_proj": 4}, "rank_pattern key: '*q_proj' is not a valid regular expression"),
])
def test_an_invalid_pattern_is_one_line(adapters, tmp_path, field, value, problem):
    root, db = adapters
    assert problem in _audit_refused(root, db, _lora_with(root, tmp_path, **{field: value}))


def test_a_backtracking_pattern_is_stopped_by_the_time_limit(adapters, tmp_path):
    root, db = adapters
    start = time.monotonic()
    line = _audit_refused(root, db, _lora_with(root, tmp_path, target_modules=BACKTRACKS))
    assert "target_modules: matching the regular expression(s) against the base model's" in line
    assert "takes more than 1 s" in line
    assert time.monotonic() - start < 60  # a process start and the limit, not the pattern's ~20 s


def test_the_dashboards_other_sessions_keep_answering_while_an_adapter_is_checked(adapters, tmp_path):
    """New audit checks adapters in the server process: a pattern matched there in Python's re
    held the GIL for as long as it ran, and no other session's page could answer.  The check now
    waits on a worker: the process's other threads run throughout (none waits 2 s)."""
    from gnq_core.sources.adapters import check_adapter

    root, _ = adapters
    folder = _lora_with(root, tmp_path, target_modules=BACKTRACKS)
    outcome: list[BaseException | None] = []

    def check() -> None:
        try:
            check_adapter(folder, root / "base")
            outcome.append(None)
        except CheckpointError as exc:
            outcome.append(exc)

    checking = threading.Thread(target=check)
    last, longest = time.monotonic(), 0.0
    checking.start()
    while checking.is_alive():  # another session's page: it needs the interpreter every few ms
        time.sleep(0.005)
        now = time.monotonic()
        longest, last = max(longest, now - last), now
    checking.join()
    assert isinstance(outcome[0], CheckpointError) and "takes more than" in str(outcome[0])
    assert longest < 2, f"the other threads waited {longest:.1f} s"


def test_a_page_answers_within_2_s_while_another_session_checks_an_adapter(adapters, tmp_path, monkeypatch):
    """Two dashboard sessions in one server process: one types a hostile adapter into New audit,
    the other opens the Runs page meanwhile and gets it within 2 s, every time."""
    from hostile_helpers import ROOT, app_page
    from streamlit.testing.v1 import AppTest

    root, db = adapters
    monkeypatch.setenv("GNQ_DB", str(db))
    monkeypatch.setenv("GNQ_REGEX_SECONDS", "5")  # the check runs long enough to be measured beside
    folder = _lora_with(root, tmp_path, target_modules=BACKTRACKS)
    app_page("runs")  # the other session's page, once before: its imports are not what is measured
    checker = AppTest.from_file(str(ROOT / "gnq_core" / "dashboard" / "views" / "new_audit.py"),
                                default_timeout=120)
    checker.run()
    checker.radio(key="base_mode").set_value("Local path").run()
    checker.text_input(key="base_path").set_value(str(root / "base")).run()
    checker.radio(key="ckpt_mode").set_value("Local path").run()
    typed = threading.Thread(target=lambda: checker.text_input(key="ckpt_path").set_value(str(folder)).run())
    typed.start()
    took = []
    while typed.is_alive():
        start = time.monotonic()
        page = app_page("runs")
        took.append(time.monotonic() - start)
        assert not page.exception
    typed.join()
    assert took and max(took) < 2, took
    assert "takes more than 5 s" in "\n".join(e.value for e in checker.error)


def test_adapter_weights_beyond_memory_are_refused_before_they_are_read(adapters, monkeypatch):
    from gnq_core.sources.adapters import check_adapter

    root, _ = adapters
    monkeypatch.setenv("GNQ_MAX_MEMORY", "100")
    with pytest.raises(CheckpointError, match=r"lora: the weights need .* of memory to load \(from the "
                                              r"safetensors headers\) but GNQ_MAX_MEMORY is"):
        check_adapter(root / "lora", root / "base")
