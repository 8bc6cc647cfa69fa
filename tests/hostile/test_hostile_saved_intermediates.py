"""A first pass saved for resumption is used only by the audit it was formed for.

The streamed ``--companions all`` pass saves A = SᵀS beside the store.  It was named by the run id
and checkpoint index alone and recorded nothing about the texts: a store beside it (one folder, one
store per experiment) or a store made again under the same name took it up for other texts, GNQ
off without a word.  Now it is named by its store and keyed by the store, run, checkpoint digest,
texts' digest and settings, with a digest of A itself: anything else is formed again and the log
says why; a truncated, altered or code-carrying file is never used; a full disk loses only the
resumption."""

from __future__ import annotations

import errno
import pickle
import shutil
import struct
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import rel_err
from lm_fixtures import texts, tiny_gpt2, tokenizer
from transformers import PreTrainedTokenizerFast

from gnq_core.common.progress import Reporter
from gnq_core.engine.sketch.companions import SketchFactor
from gnq_core.pipelines.audit import run_audit
from gnq_core.pipelines.settings import AuditSettings
from gnq_core.results.store import Store
from gnq_core.sources.checkpoints.series import find_checkpoints
from gnq_core.sources.datasets import load_texts

SETTINGS = AuditSettings(lam=0.05, batch_size=6, max_length=16, dtype="float64", seed=2, sketch_k=128,
                         companions="all", sketch_total=128, companions_solve="sketch")


class Logged(Reporter):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def log(self, message: str) -> None:
        self.lines.append(message)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("saved")
    ours = [f"{text} (note {i})" for i, text in enumerate(texts(24))]
    theirs = [" ".join(reversed(text.split())) for text in ours]  # as many texts, other words
    first, second = root / "first.csv", root / "second.csv"
    pd.DataFrame({"text": ours}).to_csv(first, index=False)
    pd.DataFrame({"text": theirs}).to_csv(second, index=False)
    out = root / "tiny"  # a tiny GPT-2 built from its config, saved with a tokenizer trained here
    torch.manual_seed(0)
    tiny_gpt2().save_pretrained(out)
    tok = PreTrainedTokenizerFast(tokenizer_object=tokenizer(), pad_token="<pad>", unk_token="<unk>")
    tok.save_pretrained(out)
    return out, first, second


def audit(checkpoint: Path, data: Path, db: Path, reporter: Reporter | None = None) -> pd.Series:
    store = Store(db)
    run = run_audit(store, find_checkpoints(checkpoint), load_texts(data), name="r", settings=SETTINGS,
                    reporter=reporter)
    return store.scores(run.run_id).sort_values("example_id")["gnq"].reset_index(drop=True)


def interrupted(checkpoint: Path, data: Path, db: Path, monkeypatch) -> Path:
    """An audit stopped in its second pass: its first pass saved beside the store."""
    with monkeypatch.context() as m:
        m.setattr(SketchFactor, "gnq", lambda self, rows: (_ for _ in ()).throw(KeyboardInterrupt))
        with pytest.raises(KeyboardInterrupt):
            audit(checkpoint, data, db)
    kept = list((db.parent / "companions").iterdir())
    assert len(kept) == 1
    return kept[0]


@pytest.fixture(scope="module")
def clean(tiny, tmp_path_factory):
    """Each dataset's GNQ from an audit in a folder of its own."""
    checkpoint, first, second = tiny
    root = tmp_path_factory.mktemp("clean")
    return (audit(checkpoint, first, root / "a" / "gnq.duckdb"),
            audit(checkpoint, second, root / "b" / "gnq.duckdb"))


@pytest.mark.slow
def test_another_store_in_the_folder_does_not_take_up_the_saved_pass(tiny, clean, tmp_path, monkeypatch):
    checkpoint, first, second = tiny
    interrupted(checkpoint, first, tmp_path / "first.duckdb", monkeypatch)
    other = audit(checkpoint, second, tmp_path / "second.duckdb")
    assert rel_err(torch.tensor(other.values), torch.tensor(clean[1].values)) < 1e-12


def test_a_store_made_again_with_other_texts_forms_the_pass_again_and_says_so(tiny, clean, tmp_path,
                                                                             monkeypatch):
    checkpoint, first, second = tiny
    db = tmp_path / "gnq.duckdb"
    kept = interrupted(checkpoint, first, db, monkeypatch)
    db.unlink()  # the store deleted and started over; the saved first pass stays beside it
    log = Logged()
    again = audit(checkpoint, second, db, log)
    assert rel_err(torch.tensor(again.values), torch.tensor(clean[1].values)) < 1e-12
    said = [line for line in log.lines if "not used" in line]
    assert len(said) == 1 and "(its texts differ" in said[0] and str(kept) in said[0]


def _resumed(checkpoint: Path, data: Path, db: Path) -> tuple[pd.Series, list[str], list[bool]]:
    from gnq_core.pipelines import companions

    first_passes, run = [], companions._Passes.run

    def counted(self, members, signals=True):
        first_passes.append(not signals)
        return run(self, members, signals)

    log = Logged()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(companions._Passes, "run", counted)
        gnq = audit(checkpoint, data, db, log)
    return gnq, log.lines, first_passes


@pytest.mark.slow
def test_the_same_audit_still_resumes_from_its_pass(tiny, clean, tmp_path, monkeypatch):
    checkpoint, first, _ = tiny
    db = tmp_path / "gnq.duckdb"
    interrupted(checkpoint, first, db, monkeypatch)
    gnq, lines, first_passes = _resumed(checkpoint, first, db)
    assert first_passes == [False] and not [line for line in lines if "not used" in line]
    assert rel_err(torch.tensor(gnq.values), torch.tensor(clean[0].values)) < 1e-12


def _cut_short(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _altered(path: Path) -> None:
    kept = torch.load(path, weights_only=True)
    kept["A"][0, 0] += 1.0  # the same provenance, the same recorded digest, another matrix
    torch.save(kept, path)


def _code_inside(path: Path) -> None:
    class Payload:
        def __reduce__(self):
            return (print, ("unpickled",))

    path.write_bytes(pickle.dumps({"provenance": {}, "A": Payload()}, protocol=2))


def _empty(path: Path) -> None:
    path.write_bytes(b"")


@pytest.mark.slow
@pytest.mark.parametrize("damage,why", [(_cut_short, "cannot be read"), (_altered, "altered"),
                                        (_code_inside, "cannot be read"), (_empty, "cannot be read")])
def test_a_damaged_saved_pass_is_never_used(tiny, clean, tmp_path, monkeypatch, damage, why):
    checkpoint, first, _ = tiny
    db = tmp_path / "gnq.duckdb"
    damage(interrupted(checkpoint, first, db, monkeypatch))
    gnq, lines, first_passes = _resumed(checkpoint, first, db)
    assert first_passes == [True, False]  # formed again
    said = [line for line in lines if "not used" in line]
    assert len(said) == 1 and why in said[0], lines
    assert rel_err(torch.tensor(gnq.values), torch.tensor(clean[0].values)) < 1e-12


@pytest.mark.slow
def test_a_full_disk_while_saving_the_pass_loses_only_the_resumption(tiny, clean, tmp_path, monkeypatch):
    checkpoint, first, _ = tiny

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    log = Logged()
    gnq = audit(checkpoint, first, tmp_path / "gnq.duckdb", log)
    assert rel_err(torch.tensor(gnq.values), torch.tensor(clean[0].values)) < 1e-12
    assert any("No space left on device" in line and "could not be kept" in line for line in log.lines)
    folder = tmp_path / "companions"
    assert not folder.exists() or not any(folder.iterdir())  # no half-written file left
    shutil.rmtree(folder, ignore_errors=True)


def _shards(tmp_path: Path) -> Path:
    from gnq_core.results.records import RunSpec, batch_results
    from gnq_core.results.shards import ShardWriter, new_shard_folder

    examples = pd.DataFrame({"example_id": [0, 1], "text": ["a b", "c d"], "grp": [None, None],
                             "n_tokens": [2, 2]})
    spec = RunSpec(name="sharded", kind="train", lam=0.01, batch_size=2, seed=0, max_length=8, model_path="m",
                   dataset_path="d", dataset_hash="h", n_examples=2, code_version="t")
    new_shard_folder(tmp_path / "s", spec, examples, world_size=1)
    texts, batch = batch_results(range(2), [1.0, 2.0], [0.5, 0.25], [1.0, 1.0], batch_index=0, step=1,
                                 condition=2.0, finite=True, seconds=0.1)
    writer = ShardWriter(tmp_path / "s")
    writer.add(1, 0, texts, [batch])
    writer.flush()
    return tmp_path / "s"


@pytest.mark.parametrize("damage", ["cut", "altered"])
def test_a_shard_altered_or_cut_short_after_it_was_written_is_refused(tmp_path, damage):
    from gnq_core.results.shards import ShardError, read_shards

    root = _shards(tmp_path)
    read_shards(root)  # as written: read
    shard = next((root / "scores").glob("*.parquet"))
    data = bytearray(shard.read_bytes())
    if damage == "cut":
        del data[len(data) // 2:]
    else:  # one GNQ value changed in its data page: Parquet itself reads that without a word
        at = bytes(data).find(struct.pack("<d", 0.25))
        assert at > 0
        data[at + 6] ^= 0x01
    shard.write_bytes(bytes(data))
    said = "not a readable Parquet file" if damage == "cut" else "altered or cut short since it was written"
    with pytest.raises(ShardError, match=said):
        read_shards(root)
