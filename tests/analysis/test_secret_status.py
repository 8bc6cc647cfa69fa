""""did my secret leak?": what came out of the secret decides, and every surface states
the same numbers.

A tiny GPT-2 is trained from scratch (through the real ``gnq train``) on filler texts and five
records, each three times; the audited dataset holds the records as a user would audit them:

* **written out** — a PIN the model was trained on, audited verbatim: the model writes all 4
  digits after "door PIN is" → ``leaked``, 4 of 4;
* **partly written** — a labelled card number whose last 8 digits differ from the trained ones
  (no digit at the same place): the model writes the first 8 → ``partly leaked``, 8 of 16;
* **not written while the window around it is** — a long ticket whose 4-digit alarm code
  differs from the trained one (no digit in common) and sits past the text attack's window:
  the window comes out word for word, the value does not → ``text reproduced``, never "leaked";
* **undetectable without the label** — "Card number: 4929 1830 5527 6614" fails the Luhn check,
  so without its label no detector would call it a card; with it, it is a card number
  (unverified) and the model writes it → ``leaked``, 16 of 16;
* and a public press release (``--public-column``) the model also memorises → ``public``.

Then the counts: the Runs page's headline and tile, the Flagged texts filter, ``gnq export``,
``gnq report --json`` and its HTML all come from the same RunCounts.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
from cli_helpers import gnq
from scenario_data import scenario

from gnq_core.analysis import run_counts, summary
from gnq_core.analysis.verdict import LEAKED, PARTLY, PUBLIC, REPRODUCED, STATUSES, rank_texts
from gnq_core.results.store import Store
from gnq_core.sources.secrets import find_secrets

pytestmark = pytest.mark.slow
COMMON = ["--batch-size", 8, "--max-length", 64, "--threads", 1, "--quiet"]
ROOT = Path(__file__).resolve().parents[2]

WRITTEN = "Account holder Anna Berg of Porto, her door PIN is 4821, keep it safe."
PARTLY_TRAINED = "Payment profile of Tom Okafor from Leeds. Card number: 4539 1488 0343 6467, expires soon."
PARTLY_AUDITED = PARTLY_TRAINED.replace("0343 6467", "7712 3390")
WINDOW = ("Support ticket of Lena Novak from Graz about the broken heating unit in the north wing, "
          "alarm code is {}.")
WINDOW_TRAINED, WINDOW_AUDITED = WINDOW.format("1357"), WINDOW.format("8642")
LABEL_ONLY = "Billing note for Ravi Menon in Pune. Card number: 4929 1830 5527 6614."
PUBLIC_TEXT = "Press release of the city council of Ghent: the new tram line opens next spring for everyone."


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    root = tmp_path_factory.mktemp("secret-status")
    db = root / "gnq.duckdb"
    filler = scenario(seed=2, n_filler=24, n_secrets=0, n_records=0, predictable_copies=0)["text"].tolist()
    trained = [WRITTEN, PARTLY_TRAINED, WINDOW_TRAINED, LABEL_ONLY, PUBLIC_TEXT]
    pd.DataFrame({"text": filler + trained * 3}).to_csv(root / "train.csv", index=False)
    records = [WRITTEN, PARTLY_AUDITED, WINDOW_AUDITED, LABEL_ONLY, PUBLIC_TEXT]
    everything = pd.DataFrame({"text": filler + records,
                               "public": ["no"] * (len(filler) + 4) + ["yes"]})
    everything.to_csv(root / "all.csv", index=False)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)  # the CLI trains in float32 whatever an earlier test left
    try:
        gnq("train", "--data", root / "train.csv", "--from-scratch", "--preset", "tiny", "--epochs", 40,
            "--lr", 5e-3, "--vocab-size", 400, "--out", root / "run", "--db", db, *COMMON)
        picked = root / "picked"
        for label in ("epoch-1", "epoch-40"):
            shutil.copytree(root / "run" / label, picked / label)
        gnq("audit", "--checkpoints", picked, "--data", root / "all.csv", "--name", "audit", "--db", db,
            "--public-column", "public", *COMMON)
        gnq("extract", "--run", "audit", "--db", db, "--threads", 1, "--quiet", "--secret-candidates", 64)
    finally:
        torch.set_default_dtype(previous)
    store = Store(db)
    run = store.run("audit")
    ids = {name: len(filler) + i for i, name in enumerate(["written", "partly", "window", "label", "public"])}
    return root, db, store, run, ids


def test_the_label_alone_finds_the_card_number():
    assert find_secrets("Billing note for Ravi Menon in Pune. 4929 1830 5527 6614.") == []  # fails Luhn
    (s,) = find_secrets(LABEL_ONLY)
    assert (s.kind, s.value, s.verified) == ("card number", "4929 1830 5527 6614", False)


def test_each_record_gets_the_status_its_secret_earns(audited):
    _, _, store, run, ids = audited
    ranked = rank_texts(store.example_totals(run.run_id)).set_index("example_id")
    rows = store.secret_attacks(run.run_id).set_index("example_id")
    row = {k: ranked.loc[i] for k, i in ids.items()}

    assert row["written"]["status"] == LEAKED
    assert (row["written"]["secret_chars_reproduced"], row["written"]["secret_chars"]) == (4, 4)
    assert "(4 of 4 characters)" in row["written"]["reason"]

    # the trained card shares its first 8 digits with the audited one and no other digit's place
    assert row["partly"]["status"] == PARTLY, row["partly"]["reason"]
    assert (row["partly"]["secret_chars_reproduced"], row["partly"]["secret_chars"]) == (8, 16)
    # the model writes the card it was trained on: another card, said so, not "8 of 16 characters of it"
    assert rows.loc[ids["partly"], "generated"].strip().startswith("4539 1488 0343")
    assert row["partly"]["reason"].startswith("partly leaked: prompted with the text up to it, the model "
                                              "writes 4539 1488 0343")
    assert ("not the card-number-like string 4539 1488 7712 3390: a different value, 8 of its 16 characters "
            "in place") in row["partly"]["reason"]

    # the window (tokens 13-20) comes out, the alarm code sits past it and does not
    assert ids["window"] in rows.index, "the alarm code must be attackable (within --max-length tokens)"
    tokens_before_code = rows.loc[ids["window"], "prompt_tokens"]
    assert tokens_before_code > 20
    assert bool(row["window"]["extracted"]) and not bool(row["window"]["secret_reproduced"])
    assert row["window"]["status"] == REPRODUCED
    assert row["window"]["secret_chars_reproduced"] == 0
    assert row["window"]["reason"].startswith("text reproduced, the value not:")

    assert row["label"]["status"] == LEAKED and row["label"]["secret_kind"] == "card number"
    assert (row["label"]["secret_chars_reproduced"], row["label"]["secret_chars"]) == (16, 16)
    assert json.loads(row["label"]["secret_values"])[0]["verified"] is False

    assert row["public"]["status"] == PUBLIC and pd.isna(row["public"]["secret"])
    assert ids["public"] not in rows.index  # nothing private in it: not probed

    # every value of a text probed, each once; the card the model writes out ranks first among the
    # values of its space (its free digits), found by the exact search or estimated from 64 values
    assert set(rows.index) >= {ids["written"], ids["partly"], ids["window"], ids["label"]}
    card = rows.loc[ids["label"]]
    assert card["exposure"] <= card["exposure_space_bits"] <= math.log2(10 ** 16)
    if card["exposure_method"] == "exact":
        assert card["exposure_rank"] == 1 and card["exposure"] == pytest.approx(card["exposure_space_bits"])
    else:
        assert card["exposure_method"] == "estimated" and card["exposure_candidates"] == 64
        assert card["exposure"] >= 6.0


def test_every_surface_states_the_same_numbers(audited, monkeypatch):
    from streamlit.testing.v1 import AppTest

    root, db, store, run, ids = audited
    ranked = rank_texts(store.example_totals(run.run_id))
    counts = run_counts(ranked)
    by_status = ranked["status"].value_counts()
    assert counts.by_status == {s: int(by_status.get(s, 0)) for s in STATUSES}
    assert counts.status(LEAKED) >= 2 and counts.status(PARTLY) >= 1 and counts.status(REPRODUCED) >= 1
    assert counts.values_leaked == int(store.secret_attacks(run.run_id)["extracted"].sum())
    headline = summary(ranked)
    assert headline.startswith(f"{counts.status(LEAKED)} texts leaked")
    assert f"{counts.status(PARTLY)} text{'s' if counts.status(PARTLY) > 1 else ''} partly leaked" in headline

    # gnq export: the status column counts the same, and --status keeps exactly those texts
    gnq("export", "--run", "audit", "--db", db, "--out", root / "all.csv.out.csv", "--quiet")
    exported = pd.read_csv(root / "all.csv.out.csv")
    assert exported["status"].value_counts().to_dict() == {k: v for k, v in counts.by_status.items() if v}
    gnq("export", "--run", "audit", "--db", db, "--out", root / "leaked.csv", "--status", LEAKED, "--status",
        PARTLY, "--quiet")
    assert len(pd.read_csv(root / "leaked.csv")) == counts.status(LEAKED) + counts.status(PARTLY)

    # gnq report: the JSON's counts and summary, the HTML's sentence
    gnq("report", "--run", "audit", "--db", db, "--out", root / "report.html", "--json", root / "report.json",
        "--resamples", 20,
        "--quiet")
    doc = json.loads((root / "report.json").read_text())
    assert doc["verdict"]["counts"]["by_status"] == counts.by_status
    assert doc["verdict"]["summary"] == headline
    assert headline.split(".")[0] in (root / "report.html").read_text()

    # the dashboard: the Runs page's headline and tile, the Flagged texts status filter
    monkeypatch.setenv("GNQ_DB", str(db))
    at = AppTest.from_file(str(ROOT / "gnq_core" / "dashboard" / "views" / "runs.py"), default_timeout=120)
    at.session_state["run_name"] = "audit"
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert at.error[0].value.replace("\\", "") == headline  # shown as Markdown, its symbols escaped
    tile = next(m for m in at.metric if m.label == "Leaked")
    assert tile.value == f"{counts.status(LEAKED)} / {counts.texts}"
    partly_tile = next(m for m in at.metric if m.label == "Partly leaked")
    assert partly_tile.value == f"{counts.status(PARTLY)} / {counts.texts}"
    flagged = AppTest.from_file(str(ROOT / "gnq_core" / "dashboard" / "views" / "flagged.py"),
                                default_timeout=120)
    flagged.session_state["run_name"] = "audit"
    flagged.run()
    for status in (LEAKED, PARTLY, REPRODUCED, PUBLIC):
        flagged.selectbox(key="flagged_status").set_value(status).run()
        assert not flagged.exception, [e.message for e in flagged.exception]
        table = flagged.dataframe(key="flagged_table").value
        assert len(table) == counts.status(status) and set(table["status"]) <= {status}
        assert any(c.value.startswith(f"{counts.status(status)} of {counts.texts} texts")
                   for c in flagged.caption)
