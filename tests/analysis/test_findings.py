"""What to do about a run's results (analysis/findings.py): copies collapse into one row, each
text gets an action, the summary counts texts once, and the table wraps and escapes."""

from __future__ import annotations

import pandas as pd

from gnq_core.analysis.findings import action, grouped, summary, texts_table_html


def _ranked() -> pd.DataFrame:
    rows = [  # a leaked card text, a record repeated 3x that leaked, a secret not leaked, a plain text
        (0, "Charge card 4111 1111 1111 1111", "leaked", 1, 0, "card number", "4111 1111 1111 1111", True),
        (1, "Record 7 of Anna, leaked", "leaked", 3, 1, None, None, True),
        (2, "Record 7 of Anna, leaked", "leaked", 3, 1, None, None, True),
        (3, "Record 7 of Anna, leaked", "leaked", 3, 1, None, None, True),
        (4, "Her PIN is 4821. <script>x</script>", "secret", 1, 4, "pin", "PIN is 4821", False),
        (5, "A plain sentence " + "word " * 80, "low", 1, 5, None, None, False),
    ]
    frame = pd.DataFrame(rows, columns=["example_id", "text", "status", "copies", "cluster_id", "secret",
                                        "secret_match", "extracted"])
    frame["rank"] = range(1, len(frame) + 1)
    frame["reason"] = ["leaked: the model writes it; contains a card", "leaked: word for word; repeated 3×",
                       "leaked: word for word; repeated 3×", "leaked: word for word; repeated 3×",
                       "contains a PIN", "no strong sign of memorisation: GNQ mid-range"]
    return frame


def test_copies_collapse_into_one_row_with_all_their_ids():
    rows = grouped(_ranked())
    assert list(rows["example_id"]) == [0, 1, 4, 5]
    record = rows.set_index("example_id").loc[1]
    assert record["copies_listed"] == 3 and record["example_ids"] == [1, 2, 3]
    assert record["reason_short"] == "leaked: word for word"


def test_each_status_gets_its_action():
    by_id = _ranked().set_index("example_id")
    assert action(by_id.loc[0]).startswith("Scrub the card-number-like string (4111 1111 1111 1111)")
    assert "Treat it as exposed: block the card and have a new one issued." in action(by_id.loc[0])
    assert action(by_id.loc[1]).startswith("Deduplicate: keep at most one of its 3 copies")
    assert "no retraining needed" in action(by_id.loc[4])
    ranked_high = by_id.loc[4].copy().rename(None).to_frame().T.assign(secret_exposure=9.0)
    # only a value above the run's null and the reference calls for retraining, whatever its bits
    assert "retrain soon" in action(ranked_high.assign(secret_exposed=True).iloc[0])
    estimated = ranked_high.assign(secret_exposed=True, secret_exposure_estimated=True).iloc[0]
    assert "bits, estimated)" in action(estimated)
    assert "retrain soon" not in action(ranked_high.assign(secret_exposed=False).iloc[0])
    assert action(by_id.loc[5]) == "Nothing to do."


def test_an_exposed_value_is_named_with_the_numbers_it_passed():
    """A text's exposure is about its most exposed value: when that is not the value its other
    columns show (another value of the text), the action and the reason name it, and say the
    never-trained 99th percentile and the reference's exposure it stands above."""
    from gnq_core.analysis.verdict import _exposure_clause

    row = _ranked().set_index("example_id").loc[4].copy()
    row["secret_value"], row["secret_kind"], row["secret_exposure"] = "972249", "account number", 34.9
    row["secret_exposed"], row["secret_exposure_estimated"] = True, True
    row["secret_exposure_kind"], row["secret_exposure_value"] = "card number", "4400 2978 7534 7783"
    row["secret_exposure_null_p99"], row["secret_reference_exposure"] = 6.67, 7.2
    said = action(row)
    assert said.startswith("Scrub the card-number-like string 4400 2978 7534 7783 and retrain soon")
    assert "(never-trained 99th percentile 6.7 bits, reference model 7.2)" in said and "972249" not in said
    clause = _exposure_clause(row, 34.9)
    assert clause.startswith("; exposure of the card-number-like string 4400 2978 7534 7783: 34.9 bits")
    assert "(estimated)" in clause and "never-trained 99th percentile 6.7 bits" in clause
    row["status"] = "partly leaked"  # the partly leaked value first, the other exposed one after it
    said = action(row)
    assert said.startswith("Scrub the account or record number (972249)")
    assert "Scrub the card-number-like string 4400 2978 7534 7783 too" in said and "estimated" in said
    row["secret_exposure_value"] = "972249"  # the same value: not named twice
    assert "too:" not in action(row) and "exposure of" not in _exposure_clause(row, 34.9)


def test_summary_counts_texts_once():
    said = summary(_ranked())
    # rows of the verdict, as every filter and table counts them; the distinct texts beside them
    assert said.startswith("4 texts leaked (2 distinct, with their copies): 1 card number, 3 texts without a "
                           "secret-like value, word for word.")
    assert "1 other text holds a secret-like value" in said and "deduplicate repeated texts" in said
    assert "exposed" not in said and "scrub the other secrets before the next training" in said


def test_the_headline_and_to_do_name_exposed_secrets_as_the_actions_do():
    """A secret the model does not write but ranks above never-trained values and the reference is
    'retrain soon' in its action: the headline counts it and its to-do says so."""
    ranked = _ranked().assign(secret_exposed=[None, None, None, None, True, None])
    said = summary(ranked)
    assert "1 other text holds a secret-like value the model does not write (1 of them ranked above " in said
    assert "scrub the exposed values and retrain soon" in said
    assert "scrub the other secrets before the next training" not in said
    assert "retrain soon" in action(ranked.assign(secret_exposure=9.0).set_index("example_id").loc[4])


def test_the_table_escapes_and_wraps():
    page = texts_table_html(_ranked())
    assert "<script>x</script>" not in page and "&lt;script&gt;x&lt;/script&gt;" in page
    assert "×3" in page and "3 copies: examples 1, 2, 3" in page
    assert "table-layout:fixed" in page and "overflow-wrap:anywhere" in page


def test_a_secret_never_attacked_is_not_said_to_stay_unwritten():
    """Before any attack (a training run, an audit without --attack) nothing is known about what
    the model writes: the action says so and how to learn it, never "the model does not write it"."""
    row = _ranked().set_index("example_id").loc[4].copy()
    row["extracted"] = None
    said = action(row)
    assert "No attack is stored for this run yet: run gnq extract" in said
    assert "does not write it" not in said and "no retraining needed" not in said
    row["secret_values_attacked"] = 1  # the secret attack probed its value
    assert "no retraining needed for it now: the model does not write it" in action(row)


def test_a_list_of_top_texts_counts_a_records_copies_in_the_whole_data():
    """The Runs page's top 20 may hold one of a record's 4 copies: its tag says ×4, as its action
    ("Deduplicate its 4 copies") does, and its detail says how many of them the list holds."""
    ranked = _ranked()
    ranked.loc[4, "copies"] = 4  # one copy listed here, 4 in the data
    html_ = texts_table_html(ranked)
    row = html_.split("Her PIN is 4821")[1].split("</tr>")[0]
    assert "×4" in row and "4 copies, 1 in this list: example 4" in row and "its 4 copies" in row
    record = html_.split("Record 7 of Anna")[1].split("</tr>")[0]
    assert "×3" in record and "3 copies: examples 1, 2, 3" in record
