"""The DuckDB store: schema and migrations, atomic writes, queries, waiting for a busy file."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import duckdb
import pandas as pd
import pytest

from gnq_core.analysis.verdict import flag, rank_texts
from gnq_core.results.records import RunSpec, ScoreColumns, batch_results
from gnq_core.results.store import Store, default_db_path
from gnq_core.results.store_schema import SCHEMA_VERSION, StoreError, apply_migrations

EXAMPLES = pd.DataFrame({"example_id": [0, 1, 2, 3], "text": ["a b", "c d e", "f", "g h"],
                         "grp": ["common", "surprising", None, "common"], "n_tokens": [2, 3, 1, 2]})


def _run(store: Store, name: str = "r"):
    return store.create_run(RunSpec(name=name, kind="audit", lam=0.01, batch_size=2, seed=0, max_length=8,
                                    model_path="m", dataset_path="d.csv", dataset_hash="abc", n_examples=4,
                                    code_version="test", device="cpu", dtype="float64"), EXAMPLES)


def _point(store: Store, run_id: int, point: int, gnq: list[float]) -> None:
    parts = [batch_results([e, e + 1], [1.0 + e, 2.0 + e], gnq[e: e + 2], [0.5, 0.5], batch_index=e // 2,
                           step=None, condition=3.0 + e // 2, finite=True, seconds=0.1)
             for e in range(0, len(gnq), 2)]
    store.write_point(run_id, point, ScoreColumns.joined([p[0] for p in parts]), [p[1] for p in parts], 0.2)


@pytest.fixture
def store(tmp_path):
    return Store(tmp_path / "gnq.duckdb")


def test_fresh_store_is_at_latest_schema_and_reads_empty_without_creating(tmp_path):
    s = Store(tmp_path / "new.duckdb")
    assert s.runs().empty and s.schema_version() == 0
    assert not s.path.exists()  # reading does not create the file
    _run(s)
    assert s.schema_version() == SCHEMA_VERSION


def test_migration_from_version_1_keeps_data(tmp_path):
    path = tmp_path / "old.duckdb"
    con = duckdb.connect(str(path))
    apply_migrations(con, 0, target=1)
    con.execute("""INSERT INTO runs (name, kind, status, created_at, updated_at, lam, loss_convention,
                   batch_size, seed, max_length, model_path, dataset_path, dataset_hash, n_examples,
                   code_version) VALUES ('old', 'audit', 'done', now(), now(), 0.1, 'x', 4, 1, 32, 'm', 'd',
                   'h', 0, 'v0')""")
    assert "progress_done" not in [r[0] for r in con.execute("DESCRIBE runs").fetchall()]
    con.close()
    s = Store(path)
    s.set_progress(s.run("old").run_id, 3, 10, "migrated")  # the first use migrates
    assert s.schema_version() == SCHEMA_VERSION
    row = s.runs().iloc[0]
    assert (row["name"], row["lam"], row["progress_done"], row["progress_total"]) == ("old", 0.1, 3, 10)


def test_newer_or_foreign_files_are_refused(tmp_path):
    newer = tmp_path / "newer.duckdb"
    _run(Store(newer))
    con = duckdb.connect(str(newer))
    con.execute("INSERT INTO schema_version VALUES (?, now())", [SCHEMA_VERSION + 1])
    con.close()
    with pytest.raises(StoreError, match="newer"):
        Store(newer).runs()
    foreign = tmp_path / "other.duckdb"
    con = duckdb.connect(str(foreign))
    con.execute("CREATE TABLE t (x INT)")
    con.close()
    with pytest.raises(StoreError, match="not a GNQ store"):
        _run(Store(foreign))
    junk = tmp_path / "junk.duckdb"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="junk.duckdb"):
        _run(Store(junk))


def test_totals_rank_percentile_and_trajectories(store):
    run = _run(store)
    store.add_points(run.run_id, [dict(point=p, label=f"epoch-{p + 1}", kind="epoch") for p in range(3)])
    _point(store, run.run_id, 0, [1.0, 5.0, 0.1, 2.0])
    _point(store, run.run_id, 1, [2.0, 1.0, 0.2, 2.0])
    totals = store.example_totals(run.run_id).set_index("example_id")
    assert totals.loc[1, "gnq_total"] == pytest.approx(6.0) and totals.loc[1, "gnq_rank"] == 1
    assert totals.loc[1, "gnq_max"] == 5.0 and totals.loc[1, "gnq_last"] == 1.0
    assert totals.loc[2, "gnq_rank"] == 4 and totals.loc[1, "gnq_percentile"] == pytest.approx(100.0)
    assert totals.loc[2, "gnq_percentile"] == pytest.approx(25.0)
    # no copies, secrets, attack or Min-K%++: the verdict orders by the loss alone (losses 1, 2, 3, 4),
    # never by GNQ, and says so
    ranked = rank_texts(store.example_totals(run.run_id))
    assert ranked.attrs["risk_label"] == "loss-only, uncalibrated"
    assert list(flag(ranked, top=2)["example_id"]) == [0, 1]
    assert list(flag(ranked, group="common")["example_id"]) == [0, 3]
    assert list(flag(ranked, min_gnq=3.5)["example_id"]) == [1, 3]
    traj = store.trajectories(run.run_id, [1])
    assert list(traj["gnq"]) == [5.0, 1.0] and list(traj["label"]) == ["epoch-1", "epoch-2"]
    record = store.example_record(run.run_id, 1)
    assert record["totals"]["text"] == "c d e" and len(record["trajectory"]) == 2


def test_rewriting_a_point_replaces_and_a_failed_write_leaves_it_intact(store):
    run = _run(store)
    store.add_points(run.run_id, [dict(point=0, label="c", kind="checkpoint")])
    _point(store, run.run_id, 0, [1.0, 2.0, 3.0, 4.0])
    _point(store, run.run_id, 0, [1.0, 2.0, 3.0, 5.0])
    assert len(store.scores(run.run_id)) == 4
    bad = batch_results([0, 0], [1.0, 1.0], [9.0, 9.0], [1.0, 1.0], batch_index=0, step=None, condition=1.0,
                        finite=True, seconds=0.0)  # duplicate key
    with pytest.raises(duckdb.Error):
        store.write_point(run.run_id, 0, *bad, 0.0)
    assert list(store.scores(run.run_id)["gnq"]) == [1.0, 2.0, 3.0, 5.0]


def test_runs_by_name_or_id_and_unknown_run(store):
    run = _run(store, "first")
    assert store.run("first").run_id == run.run_id == store.run(str(run.run_id)).run_id
    with pytest.raises(StoreError, match="no run 'nope'.*first"):
        store.run("nope")
    with pytest.raises(StoreError, match="already exists"):
        _run(store, "first")
    store.delete_run("first")
    assert store.runs().empty


def test_gnq_db_environment_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("GNQ_DB", str(tmp_path / "env.duckdb"))
    assert default_db_path() == tmp_path / "env.duckdb"
    assert Store().path == tmp_path / "env.duckdb"


def test_a_second_writer_waits_for_the_first(store):
    _run(store)
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import duckdb, time, sys
        con = duckdb.connect({str(store.path)!r})
        print("locked", flush=True)
        time.sleep(1.5)
        con.close()
    """)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    messages = []
    waiting = Store(store.path, on_wait=messages.append)
    t0 = time.monotonic()
    waiting.set_status("r", "done")
    holder.wait(timeout=30)
    assert time.monotonic() - t0 > 0.5 and messages and "busy" in messages[0]
    assert waiting.run("r").status == "done"
    impatient = Store(store.path, busy_timeout=0.3)
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import duckdb, time
        con = duckdb.connect({str(store.path)!r}); print("locked", flush=True); time.sleep(3)
    """)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(StoreError, match="another process"):
        impatient.runs()
    holder.kill()
    holder.wait()


def test_reading_an_older_store_migrates_it_first(tmp_path):
    path = tmp_path / "old.duckdb"
    con = duckdb.connect(str(path))
    apply_migrations(con, 0, target=1)
    con.close()
    frame = Store(path).extractions(1)  # a query that needs the newest columns
    assert "target_tokens" in frame.columns
    assert Store(path).schema_version() == SCHEMA_VERSION


def test_an_extra_per_text_column_lands_by_name_once_the_table_has_it(store, tmp_path):
    run = _run(store)
    store.add_points(run.run_id, [dict(point=0, label="c", kind="checkpoint")])
    texts, batch = batch_results(range(4), [1.0] * 4, [1.0] * 4, [0.5] * 4, batch_index=0, step=None,
                                 condition=2.0, finite=True, seconds=0.1, extra={"copies": [3, 2, 1, 0]})
    batch = [batch]
    with pytest.raises(duckdb.Error, match="copies"):  # no such column yet: refused, nothing written
        store.write_point(run.run_id, 0, texts, batch, 0.1)
    assert store.scores(run.run_id).empty
    with store.transaction() as con:  # what a migration adding the column does
        con.execute("ALTER TABLE scores ADD COLUMN copies INTEGER")
    store.write_point(run.run_id, 0, texts, batch, 0.1)
    assert store.scores(run.run_id)["copies"].tolist() == [3, 2, 1, 0]
    # the same records through Parquet shards (the Trainer's path) keep the column on ingest
    from gnq_core.results.shards import ShardWriter, ingest, new_shard_folder

    spec = RunSpec(name="sharded", kind="train", lam=0.01, batch_size=4, seed=0, max_length=8, model_path="m",
                   dataset_path="d", dataset_hash="h", n_examples=4, code_version="t")
    new_shard_folder(tmp_path / "s", spec, EXAMPLES, world_size=1)
    writer = ShardWriter(tmp_path / "s")
    writer.add(1, 0, texts, batch)
    writer.flush()
    sharded, _ = ingest(store, tmp_path / "s")
    assert store.scores(sharded.run_id)["copies"].tolist() == [3, 2, 1, 0]


def test_a_text_with_several_values_is_counted_by_its_most_exposed_one(store):
    """A text's counts are its most exposed value's ("4 of 4"), not sums over its values
    ("9 of 19" beside "leaked"); how many of its values leaked whole or in part is kept."""
    run = _run(store)
    _point(store, run.run_id, 0, [1.0, 2.0, 3.0, 4.0])

    def value(eid, start, chars, hits, ref, extracted):
        return {"example_id": eid, "secret_start": start, "secret_end": start + chars, "kind": "pin",
                "value": "9" * chars, "prompt_tokens": 3, "value_tokens": 2, "generated": "x", "chars": chars,
                "chars_reproduced": hits, "reproduced": hits == chars, "reference_generated": "y",
                "reference_chars_reproduced": ref, "extracted": extracted, "exposure": 3.0,
                "exposure_rank": 1, "exposure_candidates": 16, "rule": "r"}

    rows = pd.DataFrame([value(0, 0, 4, 4, 0, True), value(0, 10, 15, 2, 0, False),  # one whole, one not
                         value(1, 0, 16, 8, 2, False), value(1, 20, 4, 1, 0, False),  # one in part
                         value(2, 0, 16, 2, 0, False),                              # 2 of 16: not partly
                         value(3, 0, 8, 6, 6, False)])                              # the reference too
    store.write_secret_attacks(run.run_id, 0, rows, "test")
    totals = store.example_totals(run.run_id).set_index("example_id")
    got = totals[["secret_values_attacked", "secret_values_leaked", "secret_values_partly", "secret_chars",
                  "secret_chars_reproduced"]].astype(int).to_numpy().tolist()
    assert got == [[2, 1, 0, 4, 4], [2, 0, 1, 16, 8], [1, 0, 0, 16, 2], [1, 0, 0, 8, 6]]
    ranked = rank_texts(totals.reset_index().assign(secret="pin")).set_index("example_id")
    assert ranked["status"].to_dict() == {0: "leaked", 1: "partly leaked", 2: "secret", 3: "secret"}
    assert "(4 of 4 characters) (the reference model does not); 1 of its 2 values come out whole" in \
        ranked.loc[0, "reason"]
    assert ranked.loc[1, "reason"].startswith("partly leaked: prompted with the text up to it, the model "
                                              "writes 8 of 16 characters of the PIN")


def test_labels_from_before_every_value_was_kept_are_made_again(store):
    """A run labelled before schema 11 (no secret_values, no public flag) is labelled again with
    today's detector the first time its labels are needed: "Card number: ..." failing Luhn counts."""
    from gnq_core.results.text_labels import ensure_text_labels

    old = EXAMPLES.assign(text=["Card number: 4929 1830 5527 6614", "c d e", "f", "g h"], copies=1,
                          cluster_id=[0, 1, 2, 3], secret=None)
    run = store.create_run(RunSpec(name="old", kind="audit", lam=0.01, batch_size=2, seed=0, max_length=8,
                                   model_path="m", dataset_path="d.csv", dataset_hash="abc", n_examples=4,
                                   code_version="test", device="cpu", dtype="float64"), old)
    assert store.text_labels_missing(run.run_id)
    labels = ensure_text_labels(store, run).set_index("example_id")
    assert labels.loc[0, "secret"] == "card number" and not labels["public"].any()
    assert not store.text_labels_missing(run.run_id)
