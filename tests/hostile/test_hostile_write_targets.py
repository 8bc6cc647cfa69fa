"""Every writer checks its target: a report (HTML or JSON), an export, an
upload, a checkpoint folder and any atomic write refuse a FIFO or a device node instead of
replacing it; no output replaces an input of its own command (``--non-members``) or a file a
recorded run depends on: its tokenizer folder, starting checkpoint, reference model, non-member
texts (recorded absolute, so a command run from another folder still finds them)."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from gnq_core.cli import app
from gnq_core.common.atomic import TargetError, atomic_path, write_text_atomic
from gnq_core.jobs.uploads import safe_relative_path, save_uploads
from gnq_core.results.records import RunSpec
from gnq_core.results.store import Store


def fails(*args: object) -> str:
    """`gnq ARGS` in this process: exit 1 with one `error:` line and no traceback."""
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 1, (result.exit_code, result.output)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert "Traceback" not in result.output and len(lines) == 1 and lines[0].startswith("error: "), \
        result.output
    return lines[0]


@pytest.fixture
def store(tmp_path) -> tuple[Path, Path]:
    """A store with one audit run whose settings name a tokenizer folder, a reference model and
    non-member texts (as `gnq audit --tokenizer`, `gnq extract --reference` and `--non-members`
    record them), all real files."""
    data = tmp_path / "texts.csv"
    pd.DataFrame({"text": ["one text", "another text"]}).to_csv(data, index=False)
    files = (("tok", "tokenizer.json"), ("ref", "model.safetensors"), ("ckpt", "model.safetensors"))
    for folder, name in files:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / name).write_text("keep me")
    (tmp_path / "nm.csv").write_text("text\nnever seen\n")
    db = tmp_path / "gnq.duckdb"
    st = Store(db)
    run = st.create_run(RunSpec(name="r", kind="audit", lam=1.0, batch_size=2, seed=0, max_length=8,
                                model_path=str(tmp_path / "ckpt"), dataset_path=str(data), dataset_hash="x",
                                n_examples=2, code_version="t"),
                        pd.DataFrame({"example_id": [0, 1], "text": ["one text", "another text"],
                                      "grp": [None, None], "n_tokens": [2, 2]}))
    st.update_settings(run.run_id, {"tokenizer": str(tmp_path / "tok"),
                                    "non_members_path": str(tmp_path / "nm.csv"),
                                    "attack": {"reference": str(tmp_path / "ref")}})
    return tmp_path, db


@pytest.mark.parametrize("option", ["--out", "--json"])
def test_a_report_onto_a_fifo_or_a_device_is_refused_and_left(store, option):
    root, db = store
    fifo = root / "pipe.out"
    os.mkfifo(fifo)
    for target in (fifo, Path("/dev/null")):
        line = fails("report", "--run", "r", option, target, "--db", db)
        assert f"{target}: exists and is not a regular file" in line
    assert fifo.is_fifo() and Path("/dev/null").is_char_device()


def test_a_report_never_overwrites_its_own_non_members_input(store):
    root, db = store
    nm = root / "other-nm.csv"
    nm.write_text("text\nnever seen either\n")
    before = nm.read_bytes()
    for option in ("--json", "--out"):
        line = fails("report", "--run", "r", "--non-members", nm, option, nm, "--db", db)
        assert f"{option} would overwrite an input of this command" in line
    assert nm.read_bytes() == before


@pytest.mark.parametrize(("target", "what"), [("tok/tokenizer.json", "tokenizer folder"),
                                              ("ref/model.safetensors", "reference model"),
                                              ("ref/new.json", "reference model"),
                                              ("nm.csv", "non-member texts")])
def test_exports_and_reports_never_replace_what_a_run_recorded(store, target, what, monkeypatch):
    root, db = store
    monkeypatch.chdir(root / "ckpt")  # another working folder: the recorded paths are absolute
    out = root / target
    line = fails("export", "--run", "r", "--out", out, "--format", "csv", "--db", db)
    assert f"run 'r''s {what}" in line
    assert f"run 'r''s {what}" in fails("report", "--run", "r", "--json", out, "--db", db)
    assert (root / "tok" / "tokenizer.json").read_text() == "keep me"
    assert (root / "ref" / "model.safetensors").read_text() == "keep me"


def test_a_reference_is_recorded_absolute(store, monkeypatch):
    from gnq_core.attacks.run import _reference_path

    root, db = store
    monkeypatch.chdir(root)
    recorded = _reference_path(Store(db), Store(db).run("r"), {"point": 0}, "ref")
    assert recorded == str(root / "ref") and Path(recorded).is_absolute()


def test_every_atomic_write_refuses_a_fifo_a_device_and_a_folder(tmp_path):
    fifo = tmp_path / "state.json"
    os.mkfifo(fifo)
    for target in (fifo, Path("/dev/null"), tmp_path):
        with pytest.raises(TargetError, match="not a regular file|is a folder"):
            write_text_atomic(target, "x")
    assert fifo.is_fifo() and not list(tmp_path.glob(".*tmp-*"))


def test_a_target_made_a_fifo_while_writing_is_not_replaced(tmp_path):
    target = tmp_path / "out.json"
    with pytest.raises(TargetError), atomic_path(target) as tmp:
        tmp.write_text("x")
        os.mkfifo(target)
    assert target.is_fifo() and not list(tmp_path.glob(".*tmp-*"))


class _Upload:
    def __init__(self, name: str, data: bytes) -> None:
        self.name, self.size, self._data = name, len(data), data

    def getbuffer(self) -> memoryview:
        return memoryview(self._data)


def test_an_upload_onto_a_fifo_is_refused_not_written_into(tmp_path):
    into = tmp_path / "uploads" / "job"
    into.mkdir(parents=True)
    os.mkfifo(into / "texts.csv")
    with pytest.raises(ValueError, match="not a regular file"):  # used to block, or write into it
        save_uploads([_Upload("texts.csv", b"text\nx\n")], into)
    assert (into / "texts.csv").is_fifo()


def test_an_upload_name_with_a_nul_is_one_line_naming_it(tmp_path):
    with pytest.raises(ValueError, match=r"^bad\\x00name\.csv: a NUL character"):
        safe_relative_path("bad\0name.csv")
    with pytest.raises(ValueError, match="NUL character") as info:
        save_uploads([_Upload("a/b\0.csv", b"x")], tmp_path / "u")
    assert "embedded null byte" not in str(info.value) and "\n" not in str(info.value)


def test_a_checkpoint_is_never_saved_over_a_file_or_a_fifo(tmp_path):
    from gnq_core.sources.checkpoints.save import save_checkpoint

    fifo = tmp_path / "epoch-1"
    os.mkfifo(fifo)
    with pytest.raises(TargetError, match="epoch-1: exists and is not a folder"):
        save_checkpoint(None, None, fifo)  # refused before the model is looked at
    assert fifo.is_fifo()


def test_train_out_onto_a_fifo_is_refused(tmp_path):
    data = tmp_path / "texts.csv"
    pd.DataFrame({"text": [f"text number {i}" for i in range(8)]}).to_csv(data, index=False)
    (tmp_path / "out").mkdir()
    os.mkfifo(tmp_path / "out" / "epoch-1")
    line = fails("train", "--from-scratch", "--data", data, "--out", tmp_path / "out",
                 "--db", tmp_path / "g.duckdb", "--epochs", 1, "--quiet")
    assert "epoch-1: exists and is not a folder" in line and (tmp_path / "out" / "epoch-1").is_fifo()
