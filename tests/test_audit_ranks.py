"""`torchrun --nproc-per-node 2 gnq audit ...` (gloo on CPU) writes the rows one process writes;
the audit tokenises once per tokenizer and loads the next checkpoint while one is audited."""

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
from gnq_core.sources.checkpoints import save_checkpoint
from gnq_core.sources.models import build_model, train_tokenizer

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
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


def test_an_audit_tokenises_once_and_loads_each_checkpoint_once(series, tmp_path, monkeypatch):
    from gnq_core.pipelines import audit
    from gnq_core.sources.datasets import load_texts

    checkpoints, data = series
    calls = {"encode": 0, "load": 0}

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(audit, "encode_texts", counted("encode", audit.encode_texts))
    monkeypatch.setattr(audit, "load_checkpoint", counted("load", audit.load_checkpoint))
    store = Store(tmp_path / "gnq.duckdb")
    settings = audit.AuditSettings(lam=0.05, batch_size=4, max_length=24, seed=5, dtype="float64")
    run = audit.run_audit(store, checkpoints, load_texts(data), name="once", settings=settings)
    assert run.status == "done" and len(store.scores(run.run_id)) == 2 * 26
    assert calls == {"encode": 1, "load": 2}
