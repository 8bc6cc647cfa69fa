"""``gnq audit --companions N|all``: GNQ of each text against N others through sketches.

The m × m (push-through) solve equals the n × n leave-one-out solve and the definition in float64;
end to end, the rows say their companion set, and with an identity-sized sketch GNQ against
all the texts equals the exact GNQ of the same texts audited as one batch."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import rel_err
from lm_fixtures import texts
from typer.testing import CliRunner

from gnq_core import GNQAuditor, per_example_lm_loss
from gnq_core.cli import app
from gnq_core.engine.math.solve import GNQNumericalError, gnq_from_kernel
from gnq_core.engine.sketch.companions import SketchSystem, companion_gnq, sketch_gram, sketch_space_gnq
from gnq_core.pipelines.audit import run_audit
from gnq_core.pipelines.settings import AuditSettings, TrainSettings
from gnq_core.results.store import Store
from gnq_core.sources.checkpoints.load import load_checkpoint
from gnq_core.sources.checkpoints.series import find_checkpoints
from gnq_core.sources.datasets import load_texts
from gnq_core.sources.tokens import collate, encode_texts, pad_id

runner = CliRunner()


def definition(S: torch.Tensor, lam: float) -> torch.Tensor:
    """GNQ_j = s_jᵀ (Σ_{i≠j} s_i s_iᵀ + λI)⁻¹ s_j, one inverse per text."""
    out = []
    for j in range(S.shape[0]):
        others = torch.cat([S[:j], S[j + 1:]])
        A = others.T @ others + lam * torch.eye(S.shape[1], dtype=torch.float64)
        out.append(S[j] @ torch.linalg.solve(A, S[j]))
    return torch.stack(out)


@pytest.mark.parametrize("n,m", [(40, 7), (25, 24), (9, 30)])
def test_sketch_space_solve_equals_the_leave_one_out_solve(n, m):
    gen = torch.Generator().manual_seed(n * 100 + m)
    S = torch.randn(n, m, dtype=torch.float64, generator=gen) * torch.rand(n, 1, dtype=torch.float64,
                                                                           generator=gen)
    lam = 0.3
    exact = gnq_from_kernel(S @ S.T, lam)
    gnq, condition = sketch_space_gnq(S, lam)
    assert rel_err(gnq, exact.gnq) < 1e-9
    assert rel_err(gnq, definition(S, lam)) < 1e-9
    assert abs(condition - exact.condition) / exact.condition < 1e-9
    sol = companion_gnq(S, lam)
    assert sol.space == ("sketch" if n > m else "texts")
    assert rel_err(sol.gnq, exact.gnq) < 1e-9 and rel_err(sol.self_influence, (S * S).sum(1)) < 1e-12
    assert rel_err(sketch_gram(S, chunk=4), S @ S.T) < 1e-13
    relative = companion_gnq(S, 0.01, "relative")  # λ = 0.01 · mean ‖s_j‖², on either path
    assert rel_err(relative.gnq, gnq_from_kernel(S @ S.T, 0.01 * float((S * S).sum(1).mean())).gnq) < 1e-9
    with pytest.raises(ValueError, match="at least 2"):
        companion_gnq(S[:1], lam)


@pytest.mark.parametrize("n,m", [(40, 7), (9, 30)])
def test_the_streamed_system_equals_the_leave_one_out_solve(n, m):
    """A added a few rows at a time, factored in place, GNQ from each row: the n × n numbers, and
    the condition number of K + λI_n (n > m: λ_max(A) / λ; n ≤ m: A's n-th largest eigenvalue)."""
    gen = torch.Generator().manual_seed(n + m)
    S = torch.randn(n, m, dtype=torch.float64, generator=gen) * torch.rand(n, 1, dtype=torch.float64,
                                                                           generator=gen)
    for lam, mode in ((0.3, "absolute"), (0.01, "relative")):
        system = SketchSystem(m)
        for i in range(0, n, 4):
            system.add(S[i:i + 4])
        lam_eff = system.lam(lam, mode)
        expected_lam = lam * float((S * S).sum(1).mean()) if mode == "relative" else lam
        assert abs(lam_eff - expected_lam) / expected_lam < 1e-5
        exact = gnq_from_kernel(S @ S.T, lam_eff)
        factor = system.factor(lam_eff)
        assert system.A is None  # its memory is the factor's
        gnq = torch.cat([factor.gnq(S[i:i + 3]) for i in range(0, n, 3)])
        assert rel_err(gnq, exact.gnq) < 1e-9
        assert abs(factor.condition - exact.condition) / exact.condition < 1e-9


def test_the_streamed_systems_large_condition_is_a_power_estimate(monkeypatch):
    """Above ``EXACT_CONDITION`` rows, λ_max(A) by power iterations on A's lower triangle (syrk
    fills only that one) over λ."""
    from gnq_core.engine.sketch import companions

    monkeypatch.setattr(companions, "EXACT_CONDITION", 4)
    S = torch.randn(60, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    system = SketchSystem(12)
    system.add(S)
    assert float(system.A.triu(1).abs().max()) == 0  # the lower triangle only
    exact = gnq_from_kernel(S @ S.T, 0.2)
    factor = system.factor(0.2)
    assert abs(factor.condition - exact.condition) / exact.condition < 1e-6
    assert rel_err(factor.gnq(S), exact.gnq) < 1e-9


def test_the_streamed_system_refuses_what_it_cannot_solve():
    system = SketchSystem(3)
    system.add(torch.ones(1, 3))
    with pytest.raises(ValueError, match="at least 2"):
        system.factor(0.1)
    system.add(torch.full((1, 3), float("nan")))
    with pytest.raises(GNQNumericalError):
        system.factor(0.1)
    with pytest.raises(ValueError, match="width 4"):
        SketchSystem(3).add(torch.ones(2, 4))


def test_the_settings_refuse_bad_companions():
    from gnq_core.pipelines.options import companion_set_size, parse_companions

    assert companion_set_size(AuditSettings(companions=16), 100) == 17
    assert companion_set_size(AuditSettings(companions=16), 10) == 10  # fewer texts than a set
    assert companion_set_size(AuditSettings(companions="all"), 100) == 100
    assert companion_set_size(AuditSettings(), 100) is None
    for bad in (0, "some", 1.5, "-3", " 2x"):
        with pytest.raises(ValueError, match="--companions"):
            AuditSettings(companions=parse_companions(bad))
    with pytest.raises(ValueError, match="post hoc"):
        TrainSettings(companions=4)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("companions")
    data = root / "news.csv"
    pd.DataFrame({"text": list(texts(24))}).to_csv(data, index=False)
    db, out = root / "gnq.duckdb", root / "tiny"
    result = runner.invoke(app, [str(a) for a in (
        "train", "--data", data, "--from-scratch", "--preset", "tiny", "--epochs", 1, "--batch-size", 8,
        "--lr", 3e-3, "--max-length", 16, "--vocab-size", 300, "--out", out, "--db", db, "--dtype", "float64",
        "--quiet")], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return db, out, data


@pytest.mark.slow
def test_audit_companions_rows_say_their_companion_set(tiny):
    db, out, data = tiny
    args = ["audit", "--checkpoints", out / "epoch-1", "--data", data, "--db", db, "--name", "comp",
            "--companions", 16, "--batch-size", 5, "--max-length", 16, "--dtype", "float64",
            "--sketch-k", 256, "--seed", 2, "--quiet"]
    result = runner.invoke(app, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    store = Store(db)
    run = store.run("comp")
    assert run.settings["companions"] == 16 and "k=256" in run.settings["sketch"]
    batches = store.batches(run.run_id)
    assert sorted(batches["size"]) == [7, 17]  # 24 texts: a set of 16 + 1 and the remainder
    assert set(batches["gnq_mode"]) == {"companions"}
    assert set(batches["sketch_k"]) == {256} and set(batches["sketch_seed"]) == {2}
    scores = store.scores(run.run_id)
    assert len(scores) == 24 and scores["gnq"].notna().all() and (scores["gnq"] > 0).all()

    bad = runner.invoke(app, [str(a) for a in [*args[:8], "comp2", "--companions", "most", *args[11:]]])
    assert bad.exit_code == 1 and "--companions" in bad.output and "Traceback" not in bad.output



def test_the_sketches_are_let_go_before_the_n_by_n_solve(tiny, monkeypatch):
    """The n × n path needs the [n, m] sketches only for their Gram: an audit's sketches are freed
    before the solve's K, L and M exist (at 20,000 texts they are 5 GB of the peak)."""
    import weakref

    from gnq_core.engine.sketch import companions

    taken, alive_at_solve = [], []
    take, solve = companions.SketchRows.take, companions.kernel_gnq

    def tracked_take(self):
        S = take(self)
        taken.append(weakref.ref(S))
        return S

    def checked_solve(K, lam, *args):
        alive_at_solve.append(sum(ref() is not None for ref in taken))
        return solve(K, lam, *args)

    monkeypatch.setattr(companions.SketchRows, "take", tracked_take)
    monkeypatch.setattr(companions, "kernel_gnq", checked_solve)
    db, out, data = tiny
    args = ["audit", "--checkpoints", out / "epoch-1", "--data", data, "--db", db, "--name", "freed",
            "--companions", "all", "--batch-size", 8, "--max-length", 16, "--sketch-k", 256, "--quiet"]
    result = runner.invoke(app, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert taken and alive_at_solve == [0]

def _all_companions(tiny, db: Path, name: str, **settings) -> tuple[pd.DataFrame, pd.DataFrame]:
    _, out, data = tiny
    settings = AuditSettings(lam=0.05, batch_size=5, max_length=16, dtype="float64", seed=2, sketch_k=256,
                             companions="all", **settings)
    store = Store(db)
    run = run_audit(store, find_checkpoints(out / "epoch-1"), load_texts(data), name=name, settings=settings)
    return store.scores(run.run_id), store.batches(run.run_id)


def test_the_streamed_training_set_path_equals_the_n_by_n_path(tiny, tmp_path, monkeypatch):
    """The same sketches, solved both ways: the held n × n Gram and the m × m system streamed in two
    passes (A formed in the first, each text's sketch again in the second) give the same rows."""
    from gnq_core.engine.sketch.companions import SketchFactor

    scored, gnq = [], SketchFactor.gnq
    monkeypatch.setattr(SketchFactor, "gnq", lambda self, rows: scored.append(len(rows)) or gnq(self, rows))
    held, held_batches = _all_companions(tiny, tmp_path / "a.duckdb", "held", sketch_total=512,
                                         companions_solve="texts")
    assert not scored
    streamed, streamed_batches = _all_companions(tiny, tmp_path / "b.duckdb", "streamed", sketch_total=512,
                                                 companions_solve="sketch")
    assert len(held) == 24 and held["gnq"].notna().all() and sum(scored) == 24  # streamed, once each
    assert rel_err(torch.tensor(streamed["gnq"].values), torch.tensor(held["gnq"].values)) < 1e-9
    for column in ("loss", "self_influence", "min_k", "min_k_plus"):
        assert rel_err(torch.tensor(streamed[column].values), torch.tensor(held[column].values)) < 1e-12
    assert held_batches["size"].tolist() == streamed_batches["size"].tolist() == [24]
    assert abs(streamed_batches["condition"][0] / held_batches["condition"][0] - 1) < 1e-9
    assert not (tmp_path / "companions").exists() or not any((tmp_path / "companions").iterdir())


def test_the_cheaper_solve_is_chosen_and_says_why():
    from gnq_core.pipelines.companion_plan import sketch_spec
    from gnq_core.pipelines.companions import choose_solve
    from gnq_core.pipelines.ranks import Ranks

    settings = AuditSettings(companions="all")
    spec = sketch_spec(settings)
    assert spec.shared == 16384  # the training-set mode's m: one 2 GiB m × m matrix
    assert choose_solve(2_000, spec, settings, Ranks())[0] == "texts"
    solve, why = choose_solve(100_000, spec, settings, Ranks())
    assert solve == "sketch" and "2.00 GiB" in why and "100,000" in why
    assert choose_solve(2_000, spec, settings, Ranks(0, 2))[0] == "sketch"  # ranks share the texts
    assert choose_solve(100_000, spec, AuditSettings(companions="all", companions_solve="texts"),
                        Ranks())[0] == "texts"
    assert sketch_spec(AuditSettings(companions=16)).shared == 65536
    with pytest.raises(ValueError, match="solve"):
        AuditSettings(companions="all", companions_solve="fast")


def test_a_rerun_reuses_the_first_pass_of_an_interrupted_streamed_set(tiny, tmp_path, monkeypatch):
    """A is saved (whole or not at all) after the first pass with what it was formed from; a run
    stopped in the second pass resumes from it, and the set's rows equal an uninterrupted run's."""
    from gnq_core.engine.sketch.companions import SketchFactor
    from gnq_core.pipelines import companions

    db = tmp_path / "gnq.duckdb"
    reference, _ = _all_companions(tiny, tmp_path / "ref.duckdb", "r", sketch_total=256,
                                   companions_solve="sketch")
    first_passes = []
    run = companions._Passes.run

    def counted(self, members, signals=True):
        first_passes.append(not signals)
        return run(self, members, signals)

    monkeypatch.setattr(companions._Passes, "run", counted)
    gnq = SketchFactor.gnq
    monkeypatch.setattr(SketchFactor, "gnq", lambda self, rows: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        _all_companions(tiny, db, "r", sketch_total=256, companions_solve="sketch")
    kept = list((tmp_path / "companions").iterdir())
    assert len(kept) == 1 and kept[0].name == "gnq-run-1-point-0.pt"
    assert torch.load(kept[0], weights_only=True)["provenance"]["texts"] == 24
    monkeypatch.setattr(SketchFactor, "gnq", gnq)
    first_passes.clear()
    resumed, _ = _all_companions(tiny, db, "r", sketch_total=256, companions_solve="sketch")
    assert first_passes == [False]  # the second pass only
    assert rel_err(torch.tensor(resumed["gnq"].values), torch.tensor(reference["gnq"].values)) < 1e-12
    assert not any((tmp_path / "companions").iterdir())  # scored: A is let go


@pytest.mark.slow
def test_identity_sized_sketch_gives_the_exact_gnq_of_one_batch(tiny, tmp_path):
    _, out, data = tiny
    dataset = load_texts(data)
    settings = AuditSettings(lam=0.05, batch_size=5, max_length=16, dtype="float64", companions="all",
                             sketch_k=1 << 20, sketch_vocab_rows=1 << 12)  # every projection the identity
    store = Store(tmp_path / "c.duckdb")
    run = run_audit(store, find_checkpoints(out),
                    dataset, name="all", settings=settings)
    stored = store.scores(run.run_id).set_index("example_id").sort_index()
    assert list(store.batches(run.run_id)["size"]) == [24]

    model, tok = load_checkpoint(out / "epoch-1", dtype=torch.float64)
    ids = encode_texts(tok, dataset.texts, 16)
    batch = collate(ids, list(range(len(ids))), pad_id(tok))
    with GNQAuditor(model, lam=0.05) as auditor:
        losses = per_example_lm_loss(model(input_ids=batch.input_ids,
                                           attention_mask=batch.attention_mask).logits, batch.labels)
        losses.sum().backward()
        res = auditor.compute()
    assert rel_err(torch.tensor(stored["gnq"].to_numpy()), res.gnq) < 1e-9
    assert rel_err(torch.tensor(stored["self_influence"].to_numpy()), res.self_influence) < 1e-9
    assert rel_err(torch.tensor(stored["loss"].to_numpy()), losses.detach()) < 1e-12


def test_the_lean_kernel_solve_matches_gnq_from_kernel_and_estimates_large_conditions(monkeypatch):
    from gnq_core.engine.sketch import companions

    gen = torch.Generator().manual_seed(5)
    S = torch.randn(60, 20, dtype=torch.float64, generator=gen)
    exact = gnq_from_kernel(S @ S.T, 0.2)
    gnq, condition = companions.kernel_gnq(S @ S.T, 0.2)
    assert rel_err(gnq, exact.gnq) < 1e-9 and abs(condition / exact.condition - 1) < 1e-9
    monkeypatch.setattr(companions, "EXACT_CONDITION", 8)  # the power-iteration estimate
    _, estimate = companions.kernel_gnq(S @ S.T, 0.2)
    assert abs(estimate / exact.condition - 1) < 1e-3
    _, estimate = sketch_space_gnq(S, 0.2)
    assert abs(estimate / exact.condition - 1) < 1e-3


def test_sketch_widths_are_the_widths_of_the_sketches():
    """``Sketcher.widths()`` (used to zero-fill a key a batch never used) for blocked plans, side
    by side; folded into a shared vector, one width for every key."""
    from gnq_core.engine.math.representations import DenseFactor, OuterRep
    from gnq_core.engine.sketch.projection import SHARED, Sketcher, SketchSpec

    sketcher = Sketcher(SketchSpec(k=256, block=4, total=None))
    rep = OuterRep(DenseFactor(torch.randn(3, 5, 40)), DenseFactor(torch.randn(3, 5, 30)))
    assert sketcher.sketch("w", rep).shape[1] == sketcher.widths()["w"] == 256
    shared = Sketcher(SketchSpec(k=256, block=4, total=1024))
    assert shared.sketch_all({"w": [rep]}).shape[1] == shared.widths()[SHARED] == 1024


def test_the_companion_sentence_names_the_set():
    from gnq_core.analysis.gnq_nature import companion_sentence

    assert companion_sentence({"lam_mode": "absolute"}) is None
    assert "16 other texts" in companion_sentence({"companions": 16, "sketch": "k=256"})
    assert "every other text" in companion_sentence({"companions": "all"})


def test_sketch_rows_widen_for_a_parameter_first_used_later():
    from gnq_core.engine.sketch.companions import SketchRows

    rows = SketchRows(3)
    rows.put(torch.tensor([[1.0, 2.0, 3.0]]), {"a": 1, "c": 2})
    rows.put(torch.tensor([[4.0, 5.0, 6.0, 7.0], [8.0, 9.0, 10.0, 11.0]]), {"a": 1, "b": 1, "c": 2})
    assert rows.take().tolist() == [[1, 0, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    with pytest.raises(ValueError, match="0 of 3"):
        SketchRows(3).take()


@pytest.mark.slow
def test_the_runs_page_and_report_state_the_companion_set(tiny, monkeypatch, tmp_path):
    from streamlit.testing.v1 import AppTest

    db, out, data = tiny
    result = runner.invoke(app, [str(a) for a in (
        "audit", "--checkpoints", out / "epoch-1", "--data", data, "--db", db, "--name", "page",
        "--companions", "all", "--batch-size", 8, "--max-length", 16, "--sketch-k", 64, "--quiet")],
        catch_exceptions=False)
    assert result.exit_code == 0, result.output
    monkeypatch.setenv("GNQ_DB", str(db))
    root = Path(__file__).resolve().parents[2]
    at = AppTest.from_file(str(root / "gnq_core" / "dashboard" / "views" / "runs.py"), default_timeout=60)
    at.session_state["run_name"] = "page"
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    shown = "\n".join(m.value for m in at.markdown)
    assert "Companion set." in shown and "every other text" in shown and "64 per matrix" in shown

    report = tmp_path / "report.html"
    result = runner.invoke(app, ["report", "--run", "page", "--out", str(report), "--db", str(db),
                                 "--resamples", "20"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "against every other text of the data" in report.read_text(encoding="utf-8")
