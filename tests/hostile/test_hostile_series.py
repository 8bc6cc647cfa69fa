"""One tokenizer and one architecture per series: a series mixing two vocabularies
(362 and 400 tokens) or two architectures is refused in one line before anything is written."""

from __future__ import annotations

import pytest
from hostile_helpers import write_texts_csv
from lm_fixtures import texts
from typer.testing import CliRunner

from gnq_core.cli import app
from gnq_core.sources.checkpoints.save import save_checkpoint
from gnq_core.sources.checkpoints.series import SeriesError, check_one_series
from gnq_core.sources.models import build_model, train_tokenizer


def _checkpoint(folder, vocab_size: int, preset: str = "tiny", seed: int = 0, tokenizer=None):
    tok = tokenizer or train_tokenizer(texts(200), vocab_size=vocab_size)
    save_checkpoint(build_model(preset, len(tok), 16, seed=seed), tok, folder)
    return tok


def test_two_tokenizers_in_one_series_are_refused(tmp_path):
    _checkpoint(tmp_path / "s" / "epoch-1", 300)
    _checkpoint(tmp_path / "s" / "epoch-2", 400)
    with pytest.raises(SeriesError, match="another (tokenizer|architecture)"):
        check_one_series([tmp_path / "s" / "epoch-1", tmp_path / "s" / "epoch-2"])


def test_two_architectures_in_one_series_are_refused(tmp_path):
    tok = _checkpoint(tmp_path / "s" / "epoch-1", 300)
    _checkpoint(tmp_path / "s" / "epoch-2", 300, preset="small", tokenizer=tok)
    with pytest.raises(SeriesError, match="another architecture"):
        check_one_series([tmp_path / "s" / "epoch-1", tmp_path / "s" / "epoch-2"])


def test_one_model_s_checkpoints_pass(tmp_path):
    tok = _checkpoint(tmp_path / "s" / "epoch-1", 300)
    _checkpoint(tmp_path / "s" / "epoch-2", 300, seed=1, tokenizer=tok)
    check_one_series([tmp_path / "s" / "epoch-1", tmp_path / "s" / "epoch-2"])


@pytest.mark.slow
def test_gnq_audit_refuses_a_mixed_series_before_writing(tmp_path):
    _checkpoint(tmp_path / "s" / "epoch-1", 300)
    other = train_tokenizer([t.upper() for t in texts(200)], vocab_size=300)  # other ids
    _checkpoint(tmp_path / "s" / "epoch-2", 300, seed=2, tokenizer=other)
    data = write_texts_csv(tmp_path / "texts.csv", 8)
    result = CliRunner().invoke(app, ["audit", "--checkpoints", str(tmp_path / "s"), "--data", str(data),
                                      "--db", str(tmp_path / "gnq.duckdb"), "--batch-size", "4",
                                      "--max-length", "16"])
    assert result.exit_code == 1 and result.output.strip().startswith("error: "), result.output
    assert "epoch-2" in result.output and "another" in result.output
    assert not (tmp_path / "gnq.duckdb").exists()
