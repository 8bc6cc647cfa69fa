"""Memory known in advance is checked in advance: a companion set larger than memory holds is
refused in one line before the audit writes anything, naming the need and the largest N that
fits; the values kept per text are bounded (a declared secret of one character matched every
character of a 1.5 MB text)."""

from __future__ import annotations

import re
import time
import tracemalloc

import pytest
from hostile_helpers import assert_store_unchanged, gnq, gnq_fails, make_series, store_fingerprint

from gnq_core.pipelines.companion_plan import companion_memory
from gnq_core.sources import secrets
from gnq_core.sources.limits import format_bytes
from gnq_core.sources.secrets import MAX_VALUES_PER_TEXT, find_secrets, secret_labels


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("memory")
    series = make_series(root / "series", 1, max_length=16)
    data = root / "texts.txt"
    data.write_text("".join(f"text number {i} of the memory check\n" for i in range(40)), encoding="utf-8")
    db = root / "gnq.duckdb"
    gnq("audit", "--checkpoints", series, "--data", data, "--db", db, "--name", "kept", "--batch-size", 4,
        "--max-length", 16, "--quiet")
    return root, series, data, db


def test_companions_beyond_memory_are_refused_before_the_audit(store, tmp_path):
    """100,000 texts as one companion set with a 65,536-wide sketch: 26 GB of sketches and an n × n
    solve, or a streamed 65,536 × 65,536 system (34 GB), that no machine here has; it was started
    and ended in an out-of-memory kill or a traceback and a 'failed' run."""
    _, series, _, db = store
    data = tmp_path / "many.txt"
    data.write_text("".join(f"text {i}\n" for i in range(100_000)), encoding="utf-8")
    before = store_fingerprint(db)
    start = time.monotonic()
    line = gnq_fails("audit", "--checkpoints", series, "--data", data, "--db", db, "--name", "huge",
                     "--companions", "all", "--sketch-total", 65536, "--max-length", 16, "--quiet")
    assert time.monotonic() - start < 120
    need = format_bytes(companion_memory(100_000, 65536, 4))
    assert f"--companions all: a companion set of 100,000 texts needs about {need} of memory" in line
    assert "refused before the audit: use --companions N with N at most" in line and "fewer texts" in line
    assert "--sketch-total" in line
    assert_store_unchanged(db, before)


def test_the_largest_set_that_fits_is_named(store, monkeypatch):
    """Under a stated limit (GNQ_MAX_MEMORY) the refusal names the largest N whose sets fit in it,
    and that N is accepted."""
    from gnq_core.pipelines.companion_plan import check_companion_memory, sketch_spec
    from gnq_core.pipelines.settings import AuditSettings

    m = sketch_spec(AuditSettings(companions="all")).shared
    limit = companion_memory(30, m, 4)
    monkeypatch.setenv("GNQ_MAX_MEMORY", str(limit))
    need = re.escape(format_bytes(companion_memory(40, m, 4)))
    room = re.escape(format_bytes(limit))
    refusal = rf"set of 40 texts needs about {need} .* GNQ_MAX_MEMORY is {room}; .* N at most 29,"
    with pytest.raises(ValueError, match=refusal):
        check_companion_memory(40, AuditSettings(companions="all", sketch_total=m))
    check_companion_memory(40, AuditSettings(companions=29, sketch_total=m))  # sets of 30: they fit


def test_a_one_character_declared_secret_keeps_a_bounded_number_of_matches():
    text = "a" * 1_500_000
    tracemalloc.start()
    try:
        start = time.perf_counter()
        labels = secret_labels([text], declared=[["a"]])
        took = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    import json

    assert len(json.loads(labels["secret_values"][0])) == MAX_VALUES_PER_TEXT
    assert peak < 100e6, f"{peak / 1e6:.0f} MB"  # 1.5 million matches took 2.2 GB
    assert took < 20


def test_the_values_kept_are_the_first_ones_found_without_the_bound(monkeypatch):
    pieces = ["x ", "4111 1111 1111 1111 ", "jo@ex.org ", "pin: 4821 ", "x=12345 "]
    text = "".join(pieces[(i * 7) % 5] for i in range(3000))
    bounded = find_secrets(text, declared=["x"])
    monkeypatch.setattr(secrets, "MAX_VALUES_PER_TEXT", 10**9)
    whole = find_secrets(text, declared=["x"])
    assert len(bounded) == MAX_VALUES_PER_TEXT < len(whole)
    assert bounded == whole[:MAX_VALUES_PER_TEXT]
    assert {s.kind for s in bounded} >= {"declared", "email", "pin"}
