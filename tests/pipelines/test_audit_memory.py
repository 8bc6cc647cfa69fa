"""Bounded memory of `gnq audit`: what an audit holds beyond the texts themselves
grows by a small per-text index (numpy columns), never by Python objects or token lists per text.

The full-size number (2,000,000 texts under 2 GB max RSS) is benchmarks/audit_memory.py; here
the pipeline runs in-process on two dataset sizes and tracemalloc's peak (Python objects and
numpy arrays; the texts are loaded before tracing starts) must grow by at most ``PER_TEXT`` bytes
a text.  Before the streaming audit the slope was about 7 KB a text (every text's MinHash
signature, token ids, result objects and rows held at once).
"""

from __future__ import annotations

import random
import tracemalloc
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gnq_core.pipelines.audit import run_audit
from gnq_core.pipelines.settings import AuditSettings
from gnq_core.results import records
from gnq_core.results.records import ScoreColumns, batch_results
from gnq_core.results.store import Store
from gnq_core.sources import copies, tokens
from gnq_core.sources.checkpoints.save import save_checkpoint
from gnq_core.sources.datasets import load_texts
from gnq_core.sources.models import build_model, train_tokenizer

PER_TEXT = 1500  # bytes of traced peak per extra text (streaming: < 100; main before it: 6.7 KB)
WORDS = [f"{a}{b}" for a in "bdfgklmnprstv" for b in ("a", "e", "i", "o", "u", "an", "el", "or")]


def short_texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = [" ".join(rng.choices(WORDS, k=rng.randint(4, 8))) + f" {rng.randint(0, 99999)}" for _ in range(n)]
    return [out[i - 7] if i % 50 == 49 else t for i, t in enumerate(out)]  # some exact copies


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("memory")
    tok = train_tokenizer(short_texts(300, seed=9), vocab_size=300)
    save_checkpoint(build_model("tiny", len(tok), 16, seed=0), tok, root / "tiny")
    return root / "tiny"


def traced_peak(checkpoint: Path, folder: Path, n: int) -> int:
    """tracemalloc's peak while auditing n short texts (dataset loaded before tracing)."""
    data = folder / f"texts-{n}.txt"
    data.write_text("\n".join(short_texts(n, seed=n)) + "\n", encoding="utf-8")
    dataset = load_texts(data)
    settings = AuditSettings(lam=0.05, batch_size=16, max_length=16, device="cpu")
    tracemalloc.start()
    try:
        run = run_audit(Store(folder / f"gnq-{n}.duckdb"), checkpoint, dataset, name="m", settings=settings)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert run.status == "done"
    return peak


@pytest.mark.slow
def test_audit_memory_grows_by_a_small_per_text_index(checkpoint, tmp_path, monkeypatch):
    # What is held a chunk at a time stays the same from one size to the other with small chunks.
    monkeypatch.setattr(tokens, "TOKEN_CHUNK", 50)
    monkeypatch.setattr(copies, "LSH_CHUNK", 50)
    monkeypatch.setattr(records, "WRITE_CHUNK", 50)
    traced_peak(checkpoint, tmp_path, 64)  # imports and caches of a first audit, outside the slope
    small, large = 200, 1000
    grown = traced_peak(checkpoint, tmp_path, large) - traced_peak(checkpoint, tmp_path, small)
    slope = grown / (large - small)
    assert slope < PER_TEXT, f"{slope:.0f} bytes of traced peak per text"


Row = tuple  # example_id, batch_index, step, gnq, loss, self_influence, {extra column: value}


def _expected(texts: list[Row], point: int) -> pd.DataFrame:
    """The typed ``scores`` rows, one dict per text (the old per-text path, as the oracle)."""
    rows = [{"point": point, **dict(zip(records.SCORE_COLUMNS, t[:6], strict=True)), **t[6]} for t in texts]
    frame = pd.DataFrame(rows) if rows else pd.DataFrame(columns=["point", *records.SCORE_COLUMNS])
    return frame.astype({"point": "int64", "example_id": "int64", "batch_index": "int64", "step": "Int64",
                         "gnq": "float64", "loss": "float64", "self_influence": "float64"})


def _batch(texts: list[Row]) -> ScoreColumns:
    """One batch's rows (its texts share batch_index and step) through the one builder."""
    def values(j):
        return [np.nan if t[j] is None else t[j] for t in texts]
    columns, _ = batch_results([t[0] for t in texts], values(4), values(3), values(5),
                               batch_index=texts[0][1], step=texts[0][2], condition=1.0, finite=True,
                               seconds=0.0, extra={"min_k": [t[6]["min_k"] for t in texts]})
    return columns


def test_score_columns_write_the_rows_their_texts_are():
    rng = np.random.default_rng(0)
    texts = [(int(e), k // 3, None if k // 3 % 4 else k // 3, None if k % 5 == 0 else float(rng.random()),
              float(rng.random()), None if k % 5 == 0 else float(rng.random()),
              {"min_k": float(rng.random())})
             for k, e in enumerate(rng.permutation(40))]
    columns = ScoreColumns(4, ["min_k"])  # grows past its first capacity
    for start in range(0, 40, 3):
        columns.add(_batch(texts[start: start + 3]))
    frames = list(columns.frames(point=2, chunk=7))
    assert len(frames) == 6
    pd.testing.assert_frame_equal(pd.concat(frames, ignore_index=True), _expected(texts, 2))
    pd.testing.assert_frame_equal(next(ScoreColumns().frames(point=2)), _expected([], 2))
    parts = [_batch(texts[start: start + 3]) for start in range(0, 40, 3)]
    shuffled = ScoreColumns.joined(parts[7:] + parts[:7])  # ranks' parts: back in batch order
    pd.testing.assert_frame_equal(shuffled.frame(point=2), _expected(texts, 2))


def test_one_batch_of_engine_tensors_becomes_its_rows():
    """``batch_results`` takes the engine's tensors as they come: a text without targets has NULL
    scores (its forward signal kept), a non-finite batch NULL GNQ and K_jj."""
    torch = pytest.importorskip("torch")
    gnq, kjj = torch.rand(4, dtype=torch.float64), torch.rand(4, dtype=torch.float64)
    losses, signal = torch.rand(4, dtype=torch.float32), np.array([0.5, np.nan, 0.25, 1.0])
    scored = torch.tensor([True, True, False, True])
    columns, batch = batch_results(torch.tensor([7, 3, 9, 1]), losses, gnq, kjj, batch_index=5, step=11,
                                   condition=2.0, finite=True, seconds=0.1, extra={"min_k": signal},
                                   scored=scored)
    texts = [(e, 5, 11, *((None,) * 3 if not ok else (float(g), float(l), float(k))), {"min_k": float(s)})
             for e, g, l, k, s, ok in zip([7, 3, 9, 1], gnq, losses.double(), kjj, signal, scored.tolist(),
                                          strict=True)]
    pd.testing.assert_frame_equal(columns.frame(0), _expected(texts, 0))
    assert (batch.size, batch.step, batch.finite) == (4, 11, True)
    columns, _ = batch_results([1, 2], [1.0, 2.0], None, None, batch_index=0, step=None, condition=None,
                               finite=False, seconds=0.0)
    pd.testing.assert_frame_equal(columns.frame(1), _expected([(1, 0, None, None, 1.0, None, {}),
                                                               (2, 0, None, None, 2.0, None, {})], 1))
