"""`torchrun --nproc-per-node 2 gnq audit ...` (gloo on CPU) writes the rows one process writes;
the audit tokenises batch by batch and loads the next checkpoint while one is audited."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from lm_fixtures import texts
from test_distributed import free_port
from typer.testing import CliRunner

from gnq_core.cli import app
from gnq_core.results.store import Store
from gnq_core.sources.checkpoints.save import save_checkpoint
from gnq_core.sources.models import build_model, train_tokenizer

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
ARGS = ["--lam", "0.05", "--batch-size", "4", "--max-length", "24", "--seed", "5", "--dtype", "float64",
        "--quiet", "--threads", "1"]


@pytest.fixture(scope="module")
def series(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("ranks")
    tok = train_tokenizer(texts(200), vocab_size=300)
    for k in (1, 2):
        save_checkpoint(build_model("tiny", len(tok), 32, seed=k), tok, root / "series" / f"epoch-{k}")
    data = root / "texts.txt"
    data.write_text("\n".join(texts(26)) + "\n", encoding="utf-8")  # 7 batches: ranks get 4 and 3
    return root / "series", data


def rows(db: Path, name: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    store = Store(db)
    run = store.run(name)
    assert run.status == "done"
    scores = pd.concat([store.scores(run.run_id, point=p).assign(point=p) for p in (0, 1)])
    return scores.reset_index(drop=True), store.batches(run.run_id).drop(columns=["seconds"])


def test_two_ranks_write_exactly_the_rows_of_one_process(series, tmp_path):
    checkpoints, data = series
    one, two = tmp_path / "one.duckdb", tmp_path / "two.duckdb"
    result = CliRunner().invoke(app, ["audit", "--checkpoints", str(checkpoints), "--data", str(data),
                                      "--db", str(one), "--name", "a", *ARGS], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
           "127.0.0.1", "--master_port", str(free_port()), "-m", "gnq_core.cli", "audit",
           "--checkpoints", str(checkpoints), "--data", str(data), "--db", str(two), "--name", "a", *ARGS]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (single, single_batches), (ranked, ranked_batches) = rows(one, "a"), rows(two, "a")
    assert len(single) == 2 * 26 and single["gnq"].notna().all()
    pd.testing.assert_frame_equal(ranked, single, check_exact=False, rtol=1e-12)
    assert len(single_batches) == 2 * 7
    pd.testing.assert_frame_equal(ranked_batches, single_batches, check_exact=False, rtol=1e-12)


def test_two_ranks_stream_the_training_set_companions_of_one_process(series, tmp_path):
    """`--companions all` under torchrun: each rank adds its share of the texts into A, A is
    all-reduced (gloo), each rank scores its share; the rows equal one process's (which holds the
    26 sketches and solves n × n: the same quantity by the other path)."""
    checkpoints, data = series
    one, two = tmp_path / "one.duckdb", tmp_path / "two.duckdb"
    extra = ["--companions", "all", "--sketch-k", "256", "--sketch-total", "256"]
    result = CliRunner().invoke(app, ["audit", "--checkpoints", str(checkpoints), "--data", str(data),
                                      "--db", str(one), "--name", "a", *ARGS, *extra], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
           "127.0.0.1", "--master_port", str(free_port()), "-m", "gnq_core.cli", "audit",
           "--checkpoints", str(checkpoints), "--data", str(data), "--db", str(two), "--name", "a", *ARGS,
           *extra]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (single, single_batches), (ranked, ranked_batches) = rows(one, "a"), rows(two, "a")
    assert len(single) == 2 * 26 and single["gnq"].notna().all()
    pd.testing.assert_frame_equal(ranked, single, check_exact=False, rtol=1e-9)
    assert list(single_batches["size"]) == [26, 26] and set(single_batches["gnq_mode"]) == {"companions"}
    pd.testing.assert_frame_equal(ranked_batches, single_batches, check_exact=False, rtol=1e-9)
    assert not any((tmp_path / "companions").glob("*.pt"))  # each checkpoint's A let go once scored


def test_an_audit_tokenises_batch_by_batch_and_loads_each_checkpoint_once(series, tmp_path, monkeypatch):
    """Token ids are never held for the whole dataset (bounded memory): the token
    counts are taken in chunks, then each checkpoint tokenises one batch at a time."""
    from gnq_core.pipelines import audit
    from gnq_core.sources import tokens
    from gnq_core.sources.datasets import load_texts

    checkpoints, data = series
    sizes, loads = [], []
    encode = tokens.encode_texts

    def counted_encode(tokenizer, texts, max_length):
        sizes.append(len(texts))
        return encode(tokenizer, texts, max_length)

    def counted_load(*args, **kwargs):
        loads.append(args[0])
        return load(*args, **kwargs)

    load = audit.load_checkpoint
    monkeypatch.setattr(tokens, "encode_texts", counted_encode)
    monkeypatch.setattr(audit, "load_checkpoint", counted_load)
    monkeypatch.setattr(tokens, "TOKEN_CHUNK", 10)
    store = Store(tmp_path / "gnq.duckdb")
    settings = audit.AuditSettings(lam=0.05, batch_size=4, max_length=24, seed=5, dtype="float64")
    run = audit.run_audit(store, checkpoints, load_texts(data), name="once", settings=settings)
    assert run.status == "done" and len(store.scores(run.run_id)) == 2 * 26
    assert sizes[:3] == [10, 10, 6]  # token counts, in chunks
    assert sizes[3:] == [4] * 6 + [2] + [4] * 6 + [2]  # then one batch at a time, per checkpoint
    assert len(loads) == 2
