"""Exposure over a secret's own randomness (attacks/exposure.py, attacks/secret_exposure.py).

A tiny GPT-2 is trained on records holding 4-digit PINs in one template at 1, 4 and 16 copies;
the audited texts add PINs in the same template it never saw.  The exact search's rank is checked
against scoring all 10^4 values, the 16-copy values must stand above the run's null, the
never-trained ones must look like the null, and copies share one number.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import spearmanr

from gnq_core.analysis.exposures import exposure_summary, false_alarm
from gnq_core.attacks import exposure as exposure_module
from gnq_core.attacks.exposure import (
    ESTIMATED,
    EXACT,
    PROBE_NODES,
    PromptScorer,
    ValueSpace,
    enumerate_rank,
    estimate_bits,
    expected_nodes,
    exposure,
    search_rank,
    value_space,
)
from gnq_core.attacks.secret_attack import attack_secrets, format_places
from gnq_core.attacks.secret_exposure import NULL_VALUES, null_threshold
from gnq_core.sources.models import build_model, train_tokenizer

TEMPLATE = "Account of {}: the door PIN is {}, keep it safe."
FIRST = ["Anna", "Tom", "Lena", "Ravi", "Ines", "Omar", "Julia", "Felix", "Nora", "Sam", "Clara", "Milan"]
NAMES = [f"{a} {b}" for a in FIRST for b in ("Berg", "Okafor")]
FILLER = [f"The {w} of {t} opened on a {d} morning."
          for w in ("market", "bridge", "school", "garden", "harbour")
          for t in ("Harwick", "Lindale", "Calder") for d in ("foggy", "quiet")]


def _tokenizer(seed: int = 1):
    """Byte-level BPE trained on the template with PINs other than the run's: digit pairs and
    triples merge (the search must handle tokens of several digits), no run PIN is one token."""
    rng = random.Random(seed)
    return train_tokenizer(FILLER + [TEMPLATE.format(rng.choice(NAMES), f"{rng.randrange(10_000):04d}")
                                     for _ in range(400)], 420)


def _prompt(tok, name: str) -> list[int]:
    return tok(f"Account of {name}: the door PIN is", add_special_tokens=False)["input_ids"]


def test_value_space_keeps_the_template_and_states_its_size():
    others = ["+44 20 7946 9240", "+44 20 7946 3931", "+44 20 7946 0012"]
    phone = value_space("+44 20 7946 7554", "phone", format_places("+44 20 7946 7554", others))
    assert phone.template == "+44 20 7946 ####" and phone.size == 10 ** 4
    rng = random.Random(0)
    drawn = [phone.random(rng) for _ in range(50)]
    assert all(v.startswith("+44 20 7946 ") and phone.allows(v) for v in drawn)
    card = value_space("4111 1111 1111 1111", "card number", set())
    assert card.bits == pytest.approx(math.log2(10 ** 15)) and card.template.endswith("###")
    assert card.size == 10 ** 15  # the check digit follows from the other 15
    assert all(card.allows(v) for v in (card.random(rng) for _ in range(50)))
    assert value_space("4929 1830 5527 6614", "card number", set()).size == 10 ** 16  # fails Luhn: free
    assert value_space("4821", "pin", set()).bits == pytest.approx(math.log2(10 ** 4))
    assert value_space("4821", "pin", {0, 1}) is None  # 2 free digits: too few values to rank among
    assert value_space("Tinsel42x", "password", set()) is None  # not digits only


def test_exact_search_rank_equals_scoring_every_value():
    """The pruned search over tokens of one or several digits gives the rank that scoring all
    10^4 PINs gives, on an untrained model (nearly flat: the search must visit most values)."""
    torch.manual_seed(0)
    tok = _tokenizer()
    assert any(len(t.strip("Ġ")) > 1 and t.strip("Ġ").isdigit() for t in tok.get_vocab())  # merged digits
    model = build_model("tiny", len(tok), 64, seed=3).double().eval()
    for name, pin in (("Anna Berg", "4821"), ("Tom Okafor", "0000"), ("Nora Berg", "1907")):
        scorer = PromptScorer(model, _prompt(tok, name), batch_size=64)
        space = value_space(pin, "pin", set())
        searched = search_rank(scorer, tok, space, " ", budget=10 ** 6)
        brute = enumerate_rank(scorer, tok, space, " ")
        assert brute.nodes == 10 ** 4
        assert searched.rank == brute.rank, (pin, searched, brute)
        assert searched.score == pytest.approx(brute.score, abs=1e-9)


def test_budget_exhausted_gives_an_estimate_labelled_so():
    torch.manual_seed(0)
    tok = _tokenizer()
    model = build_model("tiny", len(tok), 64, seed=3).eval()
    space = value_space("123456", "pin", set())
    got = exposure(model, tok, _prompt(tok, "Anna Berg"), " ", space, budget=50, n_candidates=64, seed=1)
    assert got.method == ESTIMATED and got.rank is None and got.candidates == 64
    assert 0.0 <= got.bits <= space.bits and "importance sampling: 64 values drawn" in got.fit
    assert 2.0 ** -got.bits <= got.p_value <= 1.0  # the p-value at the estimate's upper bound
    assert got.nodes >= 64 and "ran out of its 50 nodes" in got.fit
    # with a larger budget the sample shows its rank is still far beyond reach: no search past the probe
    far = exposure(model, tok, _prompt(tok, "Anna Berg"), " ", space, budget=2048, n_candidates=64, seed=1)
    # (nodes: the probe's, the 64 uniform values' and the 64 draws from the model)
    assert far.method == ESTIMATED and "stopped after" in far.fit and far.nodes <= 64 + 2 * 64
    exact = exposure(model, tok, _prompt(tok, "Anna Berg"), " ", value_space("1234", "pin", set()),
                     budget=10 ** 6)
    assert exact.method == EXACT and exact.rank >= 1 and exact.candidates is None


def test_the_search_runs_only_where_the_samples_prefixes_forecast_it_fits_its_budget():
    """The forecast counts the canonical prefixes at least as likely as the value (the search
    expands every one of them, and other spellings too where tokens hold several digits, as
    here): it must track the nodes the unbounded search expands and stay below them."""
    tok = _tokenizer()
    model = build_model("tiny", len(tok), 64, seed=3).eval()
    prompt = _prompt(tok, "Anna Berg")
    scorer = PromptScorer(model, prompt, 64)
    rng = random.Random(4)
    values = [f"{rng.randrange(10 ** 4):04d}" for _ in range(8)]
    forecast, expanded = [], []
    with torch.inference_mode():
        for value in values:
            space = value_space(value, "pin", set())
            true, _, sample = exposure_module._sample(scorer, tok, space, " ", 128, 0)
            forecast.append(expected_nodes(true, sample, space, 1))
            expanded.append(search_rank(scorer, tok, space, " ", 10 ** 6).nodes)
    assert spearmanr(forecast, expanded).statistic >= 0.7
    assert all(f <= 1.5 * e for f, e in zip(forecast, expanded, strict=True))
    # the gate: a budget under the forecast is not searched past the probe, one over the nodes is
    i = int(np.argmax(forecast))
    space = value_space(values[i], "pin", set())
    under = exposure(model, tok, prompt, " ", space, budget=int(forecast[i]) - 1, n_candidates=128,
                     scorer=scorer)
    assert under.method == ESTIMATED and "forecast more nodes than its" in under.fit
    assert under.nodes <= PROBE_NODES + 2 * 128 + 8  # the probe, the uniform sample, the model's draws
    over = exposure(model, tok, prompt, " ", space, budget=expanded[i] + 64, n_candidates=128, scorer=scorer)
    assert over.method == EXACT and over.nodes == expanded[i]


class _NaN(torch.nn.Module):
    """A model whose every logit is NaN."""

    def __init__(self, model):
        super().__init__()
        self.inner = model

    def forward(self, cache=None, **kwargs):  # named as the inner model's forward names its cache
        out = self.inner(cache=cache, **kwargs)
        out.logits = torch.full_like(out.logits, float("nan"))
        return out


def test_non_finite_scores_give_no_exposure_not_the_ceiling():
    tok = _tokenizer()
    model = _NaN(build_model("tiny", len(tok), 64, seed=3).eval())
    for budget in (10 ** 6, 5):  # the exact search and the estimate
        got = exposure(model, tok, _prompt(tok, "Anna Berg"), " ", value_space("4821", "pin", set()),
                       budget=budget, n_candidates=32)
        assert got.bits is None and got.method is None


def test_estimate_ranks_past_the_sample_and_stays_below_its_ceiling():
    """Carlini et al.'s analytic exposure: with standard-normal candidate scores, a true score z
    has exposure ≈ −log2 P(Z ≥ z); the sampled bound would say log2 128 = 7 bits for all of them."""
    from scipy import stats

    cands = np.random.default_rng(0).standard_normal(127)
    got = [estimate_bits(z, cands, 53.0)[0] for z in (-3.0, 0.0, 3.0, 4.0, 5.0)]
    assert got == sorted(got) and got[0] < 0.1 and got[1] == pytest.approx(1.0, abs=0.5)
    assert got[2] == pytest.approx(-math.log2(stats.norm.sf(3.0)), abs=1.5) and got[2] > 7
    assert got[4] > got[3] > got[2]
    assert estimate_bits(50.0, cands, math.log2(10 ** 4))[0] == pytest.approx(math.log2(10 ** 4))
    assert "skew-normal" in estimate_bits(50.0, cands, 20.0)[1]
    assert "sampled share" in estimate_bits(0.0, cands, 20.0)[1]
    # random values without spread: the sampled bound log2 128, not an extrapolation to the ceiling
    bits, how = estimate_bits(5.0, np.zeros(127), 20.0)
    assert bits == pytest.approx(7.0) and how.startswith("sampled share: 1 of 128")


def test_null_threshold_and_false_alarm():
    assert null_threshold([0.1, 0.5, 1.0]) == pytest.approx(math.log2(100))  # never below a uniform rank's
    assert null_threshold([1.0] * 19 + [12.0]) == pytest.approx(np.quantile([1.0] * 19 + [12.0], 0.99))
    assert null_threshold([]) is None
    fa = false_alarm([0.1, 0.5, 7.0, 1.0], 6.65)
    assert fa["false_alarm_null"] == 0.25 and fa["false_alarm_uniform"] == pytest.approx(2 ** -6.65)


def _train(texts, tok, epochs: int = 40, model=None):
    """A tiny GPT-2 trained on ``texts`` (or ``model`` trained further)."""
    ids = [tok(t)["input_ids"] for t in texts]
    model = model if model is not None else build_model("tiny", len(tok), 64, seed=0)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    for ep in range(epochs):
        order = list(range(len(ids)))
        random.Random(ep).shuffle(order)
        for s in range(0, len(order), 16):
            batch = [ids[i] for i in order[s: s + 16]]
            width = max(map(len, batch))
            x = torch.tensor([t + [0] * (width - len(t)) for t in batch])
            mask = torch.tensor([[1] * len(t) + [0] * (width - len(t)) for t in batch])
            loss = model(input_ids=x, attention_mask=mask, labels=x.masked_fill(mask == 0, -100)).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model.eval()


@pytest.mark.slow
def test_trained_pins_stand_above_the_null_and_unseen_ones_do_not():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        torch.manual_seed(0)
        rng = random.Random(5)
        pins = [f"{p:04d}" for p in rng.sample(range(10_000), 15)]
        copies = [16] * 3 + [4] * 3 + [1] * 3
        trained = [(NAMES[i], p, c) for i, (p, c) in enumerate(zip(pins[:9], copies, strict=True))]
        unseen = [(NAMES[9 + i], p) for i, p in enumerate(pins[9:])]
        tok = _tokenizer()
        model = _train(FILLER + [TEMPLATE.format(n, p) for n, p, c in trained for _ in range(c)], tok)
        reference = build_model("tiny", len(tok), 64, seed=0).eval()  # the untrained base
        # the audited texts: every copy of the trained records, then the never-trained ones
        audited = FILLER + [TEMPLATE.format(n, p) for n, p, c in trained for _ in range(c)] + \
            [TEMPLATE.format(n, p) for n, p in unseen]
        ids = [tok(t, add_special_tokens=False)["input_ids"] for t in audited]
        got = attack_secrets(model, tok, audited, list(range(len(audited))), ids, reference=reference,
                             seed=7, max_length=64, search_nodes=4096)
    finally:
        torch.set_default_dtype(previous)
    rows, null = got.rows, got.null
    assert len(null) == NULL_VALUES and set(null["exposure_method"]) == {EXACT}
    assert not set(null["value"]) & set(pins)
    by_value = rows.groupby("value")
    # copies of one value: one number (one computation), the copy count beside it
    for value, group in by_value:
        assert group["exposure"].nunique() == 1 and group["exposure_rank"].nunique() == 1, value
        assert (group["value_copies"] == len(group)).all()
    first = by_value.first()
    assert (first["exposure_method"] == EXACT).all()
    p99 = float(first["exposure_null_p99"].iloc[0])
    assert p99 >= math.log2(100) - 1e-9 and p99 >= float(np.quantile(null["exposure"].astype(float), 0.99))
    sixteen = [p for _, p, c in trained if c == 16]
    assert (first.loc[sixteen, "exposure"] > p99).all()
    assert first.loc[sixteen, "exposed"].all()  # and above the untrained reference
    never = [p for _, p in unseen]
    assert float(first.loc[never, "exposure"].median()) <= 2.0
    assert not first.loc[never, "exposed"].any()
    # the stored rank is the rank that scoring all 10^4 PINs gives (a 16-copy and an unseen value)
    for name, pin in ((trained[0][0], trained[0][1]), unseen[0]):
        scorer = PromptScorer(model, _prompt(tok, name), batch_size=64)
        brute = enumerate_rank(scorer, tok, ValueSpace(pin, (0, 1, 2, 3)), " ")
        assert brute.rank == first.loc[pin, "exposure_rank"]


@pytest.mark.parametrize("count, said", [(2_000_000_000, "from 1 to 65,536"), (2, "at least 20"),
                                         (0, "from 1 to 65,536")])
def test_candidate_counts_exposure_cannot_use_are_refused_in_one_line(tmp_path, count, said):
    """Too few random values cannot rank a value (one candidate beaten gave the ceiling); two
    billion never finish: both refused before the store is opened."""
    from typer.testing import CliRunner

    from gnq_core.cli import app

    db = tmp_path / "gnq.duckdb"
    result = CliRunner().invoke(app, ["extract", "--run", "r", "--db", str(db),
                                      "--secret-candidates", str(count)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "--secret-candidates" in lines[0] and said in lines[0]
    assert not db.exists()


def _stored_exposures(tmp_path, estimated: bool = False):
    """A store whose run has two PINs' exposures (one value in two texts) and their format's null;
    ``estimated``: a third text's PIN ranked by the estimate, under both models."""
    from test_store import _point, _run

    from gnq_core.results.store import Store
    from gnq_core.results.store_writes import SECRET_ATTACK_COLUMNS

    store = Store(tmp_path / "gnq.duckdb")
    run = _run(store)
    _point(store, run.run_id, 0, [1.0, 2.0, 3.0, 4.0])
    base = {c: None for c in SECRET_ATTACK_COLUMNS} | {
        "secret_end": 4, "kind": "pin", "prompt_tokens": 3, "value_tokens": 1, "generated": "x", "chars": 4,
        "chars_reproduced": 0, "reproduced": False, "extracted": False, "rule": "r",
        "exposure_method": "exact",
        "exposure_template": "####", "exposure_space_bits": math.log2(1e4), "exposure_null_p99": 6.64,
        "value_copies": 2}
    rows = pd.DataFrame([base | {"example_id": 0, "secret_start": 0, "value": "4821", "exposure": 13.29,
                                 "exposure_rank": 1, "exposed": True, "reference_exposure": 1.0},
                         base | {"example_id": 1, "secret_start": 0, "value": "4821", "exposure": 13.29,
                                 "exposure_rank": 1, "exposed": True, "reference_exposure": 1.0},
                         base | {"example_id": 2, "secret_start": 0, "value": "0007", "exposure": 0.5,
                                 "exposure_rank": 7000, "exposed": False, "value_copies": 1}])
    if estimated:  # rank 8 by the estimate: 13.29 − 3 bits; the reference's rank 1024
        rows = pd.concat([rows, pd.DataFrame([base | {
            "example_id": 3, "secret_start": 0, "value": "5150", "exposure": math.log2(1e4) - 3,
            "exposure_method": "estimated", "exposure_fit": "skew-normal (shape 1)", "value_copies": 1,
            "exposed": True, "reference_exposure": math.log2(1e4) - 10,
            "reference_exposure_method": "estimated"}])], ignore_index=True)
    null = pd.DataFrame({"kind": "pin", "template": "####", "value": ["1111", "2222"],
                         "prompt_example_id": 0,
                         "exposure": [0.3, 2.0], "exposure_method": "exact", "exposure_rank": [8000, 2500],
                         "exposure_nodes": 100, "exposure_fit": None})
    store.write_secret_attacks(run.run_id, 0, rows, "test", null, "the rule")
    return store, run, rows


def test_the_store_keeps_the_null_beside_the_values(tmp_path):
    store, run, rows = _stored_exposures(tmp_path)
    values = store.secret_values(run.run_id)
    assert values["value"].tolist() == ["4821", "0007"] and values["copies"].tolist() == [2, 1]
    stored = store.secret_exposure_null(run.run_id)
    assert stored["value"].tolist() == ["1111", "2222"] and (stored["rule"] == "the rule").all()
    summary = exposure_summary(store, run.run_id)
    assert summary["exact_share"] == 1.0 and summary["exposed"] == 1
    (fmt,) = summary["formats"]
    assert fmt["null_values"] == 2 and fmt["false_alarm_null"] == 0.0 and fmt["threshold"] == 6.64
    totals = store.example_totals(run.run_id).set_index("example_id")
    assert bool(totals.loc[0, "secret_exposed"]) and not bool(totals.loc[2, "secret_exposed"])
    store.write_secret_attacks(run.run_id, 0, rows.iloc[2:], "test")  # a new attack replaces both
    assert store.secret_exposure_null(run.run_id).empty
    store.delete_run(run.run_id)
    assert store.secret_values(run.run_id).empty


def test_a_user_patterns_free_group_is_the_space_exposure_ranks_in():
    """A pattern naming its ``free`` group says which characters vary: the rest of the value is
    its format, kept in every candidate (here the account's branch, 7731, which no run-wide
    format check could find from one value), and stored so that a later attack sees it too."""
    from gnq_core.attacks.secret_attack import secret_targets
    from gnq_core.sources.secrets import compile_patterns, find_secrets, values_from_json, values_json

    people = (("Anna Berg", "4821"), ("Tom Okafor", "0377"))
    texts = [f"Account of {n}: ACCT-7731-{p}, keep it safe." for n, p in people]
    pattern = compile_patterns([r"ACCT-(\d{4}-(?P<free>\d{4}))"])
    found = [find_secrets(t, pattern) for t in texts]
    assert [f[0].value for f in found] == ["7731-4821", "7731-0377"]
    stored = [values_json(f) for f in found]
    again = values_from_json(texts[0], stored[0])[0]
    assert (again.free_start, again.free_end) == (found[0][0].free_start, found[0][0].free_end)
    assert texts[0][again.free_start: again.free_end] == "4821"
    # a pattern without the named group keeps the rule it had: its first group is the value
    plain = find_secrets(texts[0], compile_patterns([r"ACCT-(\d{4}-\d{4})"]))[0]
    assert plain.value == "7731-4821" and plain.free_start == -1

    tok = _tokenizer()
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    targets = secret_targets(tok, texts, [0, 1], ids, stored)
    assert [t.fixed_by_pattern() for t in targets] == [{0, 1, 2, 3}] * 2
    space = value_space(targets[0].value, targets[0].kind, targets[0].fixed_by_pattern())
    assert space.template == "7731-####" and space.size == 10 ** 4

    torch.manual_seed(0)
    model = build_model("tiny", len(tok), 64, seed=0).eval()
    # one text: the run has no other value to find a format from, so only the pattern can fix 7731
    rows = attack_secrets(model, tok, texts[:1], [0], ids[:1], seed=3, max_length=64,
                          stored_values=stored[:1]).rows
    assert rows["exposure_template"].tolist() == ["7731-####"]
    assert rows["exposure_space_bits"].astype(float).tolist() == pytest.approx([4 * math.log2(10)])
    unnamed = [values_json(find_secrets(texts[0], compile_patterns([r"ACCT-(\d{4}-\d{4})"])))]
    rows = attack_secrets(model, tok, texts[:1], [0], ids[:1], seed=3, max_length=64,
                          stored_values=unnamed).rows
    assert rows["exposure_template"].tolist() == ["####-####"]


def test_the_json_report_gives_each_value_its_rank_both_exposures_and_the_null(tmp_path):
    from gnq_core.analysis import run_report

    store, run, _ = _stored_exposures(tmp_path, estimated=True)
    said = run_report.build(store, run, resamples=10, cv=False).to_json()["secret_exposure"]
    by_value = {v["value"]: v for v in said["values"]}
    assert sorted(by_value) == ["0007", "4821", "5150"]  # one row per distinct value, copies counted
    assert by_value["4821"]["copies"] == 2
    exact, estimated = by_value["4821"], by_value["5150"]
    assert exact["method"] == "exact" and exact["rank"] == 1 and exact["rank_estimate"] is None
    assert estimated["method"] == "estimated" and estimated["rank"] is None
    assert estimated["rank_estimate"] == pytest.approx(8.0)  # 2^(space − exposure), said as an estimate
    for v in said["values"]:
        assert {"exposure", "reference_exposure", "reference_method", "null_p99", "exposed"} <= set(v)
        assert v["null_p99"] == pytest.approx(6.64)
    assert exact["reference_exposure"] == pytest.approx(1.0)
    assert estimated["reference_method"] == "estimated"
    assert said["estimated"] == 1 and said["exact"] == 2
    (fmt,) = said["formats"]
    assert fmt["threshold"] == pytest.approx(6.64) and fmt["false_alarm_null"] == 0.0


def test_the_values_table_says_which_rank_is_estimated_and_explains_each_number(tmp_path):
    from gnq_core.analysis.exposures import VALUES_HELP, null_sentence, values_table
    from gnq_core.analysis.html_report import _exposure

    store, run, _ = _stored_exposures(tmp_path, estimated=True)
    summary = exposure_summary(store, run.run_id)
    table = values_table(summary).set_index("value")
    assert table.at["4821", "rank"] == "1 of 2^13.3 (exact)"
    assert table.at["5150", "rank"] == "≈ 8 of 2^13.3 (estimated)"
    assert table.at["5150", "reference rank"] == "≈ 1,024 of 2^13.3 (estimated)"  # the reference's too
    assert table.at["4821", "exposed"] == "yes" and table.at["0007", "exposed"] == "no"
    assert set(values_table(summary).columns) - {"kind", "value"} <= set(VALUES_HELP)  # each: its help
    assert "fit" not in values_table(summary, fit=False)
    (fmt,) = summary["formats"]
    said = null_sentence(fmt)
    assert "99th percentile, 6.6 bits" in said and "0 of these 2 (0%)" in said
    report = " ".join(_exposure(summary))
    assert "(estimated)" in report and "never-trained 99th pct (bits)</b>: 99th percentile" in report
    assert "reference (bits)</b>: The same exposure under the reference model" in report


def test_a_texts_exposure_columns_come_from_one_value_and_name_it(tmp_path):
    """A text with two values: its exposure, 'estimated', threshold and reference are all the most
    exposed value's (exposed first, then bits), never the largest bits of one and the flag of another."""
    from test_store import _point, _run

    from gnq_core.results.store import Store
    from gnq_core.results.store_writes import SECRET_ATTACK_COLUMNS

    store = Store(tmp_path / "gnq.duckdb")
    run = _run(store)
    _point(store, run.run_id, 0, [1.0, 2.0, 3.0, 4.0])
    base = {c: None for c in SECRET_ATTACK_COLUMNS} | {
        "example_id": 0, "prompt_tokens": 3, "value_tokens": 1, "generated": "x", "chars_reproduced": 0,
        "reproduced": False, "extracted": False, "rule": "r", "value_copies": 1}
    rows = pd.DataFrame([
        base | {"secret_start": 0, "secret_end": 4, "kind": "pin", "value": "4821", "chars": 4,
                "exposure": 9.0, "exposure_method": "exact", "exposure_rank": 16, "exposure_template": "####",
                "exposure_space_bits": math.log2(1e4), "exposure_null_p99": 6.64, "reference_exposure": 1.0,
                "exposed": True},
        base | {"secret_start": 10, "secret_end": 29, "kind": "card number", "value": "4177 8486 4887 6630",
                "chars": 16, "exposure": 30.0, "exposure_method": "estimated",
                "exposure_template": "4### #### #### ####", "exposure_space_bits": 46.5,
                "exposure_null_p99": 6.7, "reference_exposure": 31.0, "exposed": False}])
    store.write_secret_attacks(run.run_id, 0, rows, "test")
    row = store.example_totals(run.run_id).set_index("example_id").loc[0]
    assert row["secret_exposure_value"] == "4821" and row["secret_exposure_kind"] == "pin"
    assert row["secret_exposure"] == 9.0 and bool(row["secret_exposed"])
    assert not bool(row["secret_exposure_estimated"])  # the card's estimate is not this value's
    assert row["secret_exposure_null_p99"] == 6.64 and row["secret_reference_exposure"] == 1.0


def test_each_attacked_value_says_its_exposure_against_the_reference_and_the_null(tmp_path):
    from gnq_core.analysis.exposures import value_exposure_sentence

    store, run, _ = _stored_exposures(tmp_path, estimated=True)
    rows = store.secret_attacks(run.run_id).to_dict("records")
    said = {r["value"]: value_exposure_sentence(r) for r in rows}
    assert said["4821"].startswith("4821: exposure 13.3 bits, rank 1 of 2^13.3 (exact); under the reference "
                                   "model 1.0 bits")
    assert said["4821"].endswith("never saw: 99th percentile 6.6 bits → exposed.")
    assert "rank ≈ 8 of 2^13.3 (estimated)" in said["5150"]
    assert "rank ≈ 1,024 of 2^13.3 (estimated)" in said["5150"]  # the reference's rank, estimated too
    assert said["0007"].endswith("→ not exposed.")
    assert "not measured" in value_exposure_sentence({"value": "hunter2", "exposure": None})


def test_the_drilldown_explains_each_values_exposure(tmp_path, monkeypatch):
    """The drill-down's secret attack: every exposure column has its help, and each value's exposure
    is said in words against the reference and the never-trained values (the table is wider than
    the page)."""
    import json
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    store, run, _ = _stored_exposures(tmp_path, estimated=True)
    monkeypatch.setenv("GNQ_DB", str(store.path))
    app = Path(__file__).resolve().parents[2] / "gnq_core" / "dashboard" / "views" / "drilldown.py"
    at = AppTest.from_file(str(app), default_timeout=60)
    at.session_state["run_name"], at.session_state["example_id"] = run.name, 3
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    captions = [c.value.replace("\\", "") for c in at.caption]  # Markdown escapes dropped
    assert any(c.startswith("5150: exposure 10.3 bits, rank ≈ 8 of 2^13.3 (estimated); under the reference "
                            "model 3.3 bits") and "99th percentile 6.6 bits → exposed." in c
               for c in captions)
    (table,) = [d for d in at.dataframe if "exposure" in d.value.columns]
    helps = {c: v.get("help", "") for c, v in json.loads(table.proto.columns).items()}
    for column in ("exposure", "reference_exposure", "exposure_null_p99", "exposed", "exposure_method"):
        assert helps[column], column
    assert "never saw" in helps["exposure_null_p99"] and "Benjamini" in helps["exposed"]


def test_the_reports_counts_the_tile_and_the_exposure_section_count_the_same_exposed_values(
        tmp_path, monkeypatch):
    """Exposed values are counted by one rule (exposures.exposed): the JSON's
    ``verdict.counts.values_exposed``, its ``secret_exposure.exposed`` and the Runs page's
    "Exposed values" tile agree on a run whose exposed values sit in texts that are not of status
    'secret' (the count of those texts, ``secret_texts_exposed``, is 0 here: the two numbers once
    shared one name)."""
    from hostile.hostile_helpers import app_page

    from gnq_core.analysis import run_report
    from gnq_core.analysis.counts import RunCounts

    store, run, _ = _stored_exposures(tmp_path, estimated=True)  # 4821 (2 texts) and 5150 exposed, 0007 not
    store.write_extractions(run.run_id, 0, 4, pd.DataFrame({
        "example_id": range(4), "threshold": 1.0, "n_continuation": 4, "match_fraction": 0.0,
        "success": False, "prefix_text": "p", "generated_text": "g", "target_text": "t",
        "target_tokens": None, "generated_tokens": None}), code_version="test")
    doc = run_report.build(store, run, resamples=20, cv=False).to_json()
    counts = doc["verdict"]["counts"]
    assert counts["values_exposed"] == doc["secret_exposure"]["exposed"] == 2
    assert counts["values_distinct"] == doc["secret_exposure"]["distinct_values"] == 3
    assert counts["secret_texts_exposed"] == 0 and "secret_exposed" not in counts
    with pytest.warns(DeprecationWarning, match="secret_texts_exposed"):
        assert RunCounts(secret_texts_exposed=4).secret_exposed == 4  # the old name still reads

    monkeypatch.setenv("GNQ_DB", str(store.path))
    at = app_page("runs")
    assert not at.exception, [e.message for e in at.exception]
    tile = next(m for m in at.metric if m.label == "Exposed values")
    assert tile.value == "2 / 3"
