"""Text drill-down: one example's record — its verdict and reason, copies and secret-like content,
trajectory, loss and calibrated scores, the attack aligned token by token, and its nearest
neighbours by GNQ trajectory."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from gnq_core.analysis import (
    COLUMN_HELP,
    EXPOSURE_SHOWN,
    action,
    conversation_line,
    conversation_upto,
    leaked_marks,
    nearest_by_trajectory,
    token_alignment,
    turns_html,
    value_exposure_sentence,
    value_outcome,
)
from gnq_core.catalog import SIGNAL_BY_COLUMN
from gnq_core.dashboard import charts, show, state
from gnq_core.dashboard.columns import column_config, secret_attack_config


def _signal(column: str) -> tuple[str, str, str]:
    """A signal's (label, column, format), as its catalog entry gives them."""
    entry = SIGNAL_BY_COLUMN[column]
    return entry.label[:1].upper() + entry.label[1:], column, entry.python_format  # a tile's title


# The record's numbers after its rank: (label, column, format); help from COLUMN_HELP where it has one.
METRICS = (("Risk", "risk", ".2f"), _signal("gnq_total"), ("GNQ percentile", "gnq_percentile", ".1f"),
           _signal("copies"), ("GNQ with a copy in the batch", "gnq_with_copy", ".0f"), _signal("loss_last"),
           _signal("self_influence_last"), _signal("loss_ratio"), _signal("zlib_ratio"),
           _signal("min_k_prob"),
           ("Reference match", "reference_match", ".0%"))


def _tokens(value) -> list[str]:
    # None / NA for attacks stored before tokens were recorded (schema < 3)
    return [str(t) for t in value] if isinstance(value, list | tuple | np.ndarray) else []


st.title("Text drill-down")
run = state.require_run()
db, version = str(state.db_path()), state.version(run.run_id)
totals = state.totals(db, run.run_id, version)
if totals.empty:
    st.info("This run has no examples.")
    st.stop()

ids = totals.sort_values(["rank", "example_id"])["example_id"].tolist()
current = st.session_state.get(state.EXAMPLE_KEY)
linked = st.query_params.get("text")  # a shared address names the text
if (linked and linked.isascii() and linked.isdigit()  # "²" is a digit to str.isdigit, not to int()
        and int(linked) in ids and linked != st.session_state.get("_linked_text")):
    st.session_state["_linked_text"] = linked
    current = int(linked)
index = ids.index(current) if current in ids else 0
by_id = totals.set_index("example_id")
layouts = by_id["turns"].to_dict() if "turns" in by_id else {}  # a chat text's turns, for its label
example_id = st.selectbox("Example", ids, index=index,
                          format_func=lambda i: f"#{i} · rank {by_id.at[i, 'rank']} · " + conversation_line(
                              str(by_id.at[i, 'text']), layouts.get(i), 70))
st.session_state[state.EXAMPLE_KEY] = example_id
st.query_params["text"] = st.session_state["_linked_text"] = str(example_id)  # the address shows it
record = state.store().example_record(run.run_id, example_id)
row = by_id.loc[example_id].to_dict()  # the verdict's row (rank, status, reason) of the store's totals


def _num(value, fmt: str) -> str:
    return format(value, fmt) if value is not None and value == value else "–"


secrets = state.store().secret_attacks(run.run_id)
secrets = secrets[secrets["example_id"] == example_id]
tokenised = not isinstance(row.get("turns"), str)  # a plain text: as it always was
if tokenised:
    st.code(row["text"], language=None, wrap_lines=True)  # shown as text, never as Markdown; readable
else:  # a conversation: each turn on its own, what came out marked in its turn
    marks = leaked_marks(str(row["text"]), row, secrets)
    st.html(turns_html(str(row["text"]), row["turns"], marks))
    st.caption("Each turn as the conversation reads; marked: the characters the model gave back (the text "
               "attack's window when it came out, a secret value written whole). A turn not trained had no "
               "loss on it.")
    if tokenised := st.toggle("as tokenised", key="drill_tokenised", help=show.TOKENISED_HELP):
        st.code(row["text"], language=None, wrap_lines=True)
reason = str(row["reason"]).removeprefix(f"{row['status']}: ")  # not "leaked: leaked: ..."
verdict_line = f"**{state.plain(row['status'])}**: {state.plain(reason)}  \n**What to do:** " \
               f"{state.plain(action(pd.Series(row)))}"
alert = {"leaked": st.error, "partly leaked": st.error, "text reproduced": st.warning,
         "secret": st.warning}.get(row["status"], st.info)
alert(verdict_line)
cells = st.columns(6) + st.columns(6)  # two rows of six
cells[0].metric("Rank", f"{row['rank']} / {len(totals)}", help=COLUMN_HELP["rank"])
basis = totals.attrs.get("risk") or {}  # what risk is on this run, beside its number
helps = {"risk": f"{COLUMN_HELP['risk']} On this run: {basis['label']}: {basis['words']}"} if basis else {}
for cell, (label, column, fmt) in zip(cells[1:], METRICS, strict=True):
    cell.metric(label, _num(row[column], fmt), help=helps.get(column, COLUMN_HELP.get(column)))
group = state.plain(row["group"]) if pd.notna(row["group"]) else "—"
secret = (f" · secret-like: {state.plain(row['secret'])} at characters {int(row['secret_start'])}–"
          f"{int(row['secret_end'])}" if isinstance(row.get("secret"), str) else "")
st.caption(f"Group: {group} · {row['n_tokens']} tokens{secret}")

show.chart(charts.example_trajectory(record["trajectory"]), width="stretch")

st.subheader("Extraction attempt")
attempts = record["extractions"]
if attempts.empty:
    st.caption("No attack stored for this run.")
else:
    a = attempts.iloc[0]
    if a["match_fraction"] is None or a["match_fraction"] != a["match_fraction"]:
        st.caption(f"Too short for a {a['prefix_tokens']}-token prefix.")
    else:
        verdict = ("window reproduced" if row["extracted"] is True else "window not reproduced") + (
            " — for a text with a secret-like value the secret attack below decides"
            if isinstance(row.get("secret"), str) else "")
        ref = a.get("reference_match")
        ref_note = (f"; the reference model matches **{ref:.0%}**" if ref is not None and ref == ref else
                    " (no reference model)")
        st.markdown(f"Prefix of **{a['prefix_tokens']}** tokens, match **{a['match_fraction']:.0%}** of "
                    f"{a['n_continuation']} continuation tokens{ref_note} → **{verdict}** "
                    f"(threshold {a['threshold']:g}).")
        c1, c2, c3 = st.columns(3)
        prefix = a["prefix_text"] if tokenised else conversation_upto(str(row["text"]), row["turns"],
                                                                       str(a["prefix_text"]))
        for col, label, value in ((c1, "Prefix given to the model", prefix),
                                  (c2, "Model's continuation", a["generated_text"]),
                                  (c3, "Original continuation", a["target_text"])):
            col.caption(label)
            col.code(value, language=None, wrap_lines=True)
        tokens = token_alignment(_tokens(a["target_tokens"]), _tokens(a["generated_tokens"]))
        if not tokens.empty:
            styled = tokens.style.apply(
                lambda r: [f"background-color: {'#DCFCE7' if r['match'] else '#FEE2E2'}"] * len(r),
                axis=1)
            st.dataframe(styled, hide_index=True, width="stretch")

if not secrets.empty:
    st.subheader("Secret attack")
    st.caption("Rule: " + state.plain(secrets["rule"].iloc[0]))  # it asks whether the model writes the value
    secrets = secrets.assign(outcome=[value_outcome(r.extracted, r.chars, r.chars_reproduced,
                                                    r.reference_chars_reproduced, r.novel_chars_reproduced,
                                                    r.free_null_p)
                                      for r in secrets.itertuples()])
    secrets = secrets.reindex(columns=[*secrets.columns, *[c for c in EXPOSURE_SHOWN if c not in secrets]])
    st.dataframe(secrets[["kind", "value", "outcome", "generated", "chars", "chars_reproduced",
                          "reference_generated", "reference_chars_reproduced", *EXPOSURE_SHOWN]],
                 hide_index=True, width="stretch", column_config=secret_attack_config())
    for r in secrets.to_dict(orient="records"):  # each value's exposure against what it must pass
        st.caption(state.plain(value_exposure_sentence(r)))

st.subheader("Nearest neighbours by GNQ trajectory")
traj = state.trajectories(db, run.run_id, version, None)
near = nearest_by_trajectory(traj, example_id, k=5)
if near.empty:
    st.caption("Not enough checkpoints to compare trajectories.")
else:
    near = near.merge(totals[["example_id", "rank", "gnq_total", "copies", "group", "text",
                              *show.layout_column(totals)]], on="example_id")
    near = show.readable(near, tokenised)
    # log10 units: 4e-13 is float rounding of an identical trajectory, shown as 0
    near["distance"] = near["distance"].round(4)
    show.table(near, "near", {**column_config(near), "distance": st.column_config.NumberColumn(
        "distance", format="%.3f", help="Euclidean, in decades of GNQ (log10)")})
