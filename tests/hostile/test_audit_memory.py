"""Bounded memory (issue 20 item 5): the stages of an audit whose memory used to grow with the
number of texts (tokenisation, the batch partition, the score rows) must stay within a small
per-text index.  Measured as peak traced Python allocations (tracemalloc: lists, tuples, numpy
arrays, DataFrames) at two dataset sizes; benchmarks/audit_memory.py measures a whole `gnq audit`
process's max RSS at large sizes."""

from __future__ import annotations

import tracemalloc

from lm_fixtures import tokenizer as make_tokenizer
from transformers import PreTrainedTokenizerFast

from gnq_core.pipelines.audit import _ScoreColumns
from gnq_core.sources.tokens import partition_order, stream_batches, token_counts

PER_TEXT_LIMIT = 400  # bytes (253 measured: order, token count, score columns and the frame built from
# them); keeping every text's token ids and batch tensors, as before, cost ~6 KB per text


def stages_peak(tokenizer, texts: list[str]) -> int:
    """Peak traced bytes of the audit's per-text stages over ``texts`` (which are not counted)."""
    tracemalloc.start()
    try:
        counts = token_counts(tokenizer, texts, 16)
        scores = _ScoreColumns(len(texts))
        order = partition_order(len(texts), 0)
        for index, batch in enumerate(stream_batches(tokenizer, texts, order, 16, 16)):
            k = len(batch.example_ids)
            scores.add(batch.example_ids, index, [0.5] * k, [1.0] * k, [2.0] * k)
        frame = scores.frame()
        assert len(frame) == len(texts) and int(counts.sum()) > 0
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_audit_stages_memory_per_text_stays_small():
    tok = PreTrainedTokenizerFast(tokenizer_object=make_tokenizer(), pad_token="<pad>")
    sizes = (2_000, 20_000)
    peaks = [stages_peak(tok, [f"note {i}: the river near the market {i % 97}" for i in range(n)])
             for n in sizes]
    per_text = (peaks[1] - peaks[0]) / (sizes[1] - sizes[0])
    assert per_text < PER_TEXT_LIMIT, f"{per_text:.0f} bytes per text (peaks {peaks})"
