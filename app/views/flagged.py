"""Flagged texts: the verdict order (leaked first, then secret-like content, then memorisation
risk) with a reason per text, or GNQ alone; filter, and download exactly the filtered view."""

from __future__ import annotations

import streamlit as st

from app import state
from app.columns import column_config
from gnq_core.results.export import export_frame, to_bytes

VERDICT, BY_GNQ = "Verdict (leaked, secret-like, risk)", "GNQ_total alone"

st.title("Flagged texts")
run = state.require_run()
scored = state.require_scores(run)[3]
attack = run.settings.get("attack") or {}

order = st.radio("Order by", [VERDICT, BY_GNQ], horizontal=True, key="flagged_order",
                 help="Verdict: texts the calibrated attack extracted first (secret-like ones first), then "
                      "texts with secret-like content, then the rest by memorisation risk. GNQ_total alone: "
                      "the gradient-uniqueness ranking, blind to copies and to the attack.")
rank_col, pct_col = ("rank", "percentile") if order == VERDICT else ("gnq_rank", "gnq_percentile")
c1, c2, c3 = st.columns(3)
mode = c1.radio("Flag by", ["top-k", "percentile", "GNQ threshold"], horizontal=True)
if mode == "top-k":
    k = c2.number_input("k", min_value=1, max_value=len(scored), value=min(50, len(scored)))
    view = scored.sort_values(rank_col).head(int(k))
elif mode == "percentile":
    p = c2.slider("At or above percentile", 0.0, 100.0, 90.0, 0.5)
    view = scored[scored[pct_col] >= p]
else:
    x = c2.number_input("GNQ_total at least", value=float(scored["gnq_total"].quantile(0.9)), format="%g")
    view = scored[scored["gnq_total"] >= x]
search = c3.text_input("Text contains", placeholder="search…")
c1, c2, c3 = st.columns(3)
groups = sorted(scored["group"].dropna().unique())
picked = c1.multiselect("Groups", groups, default=[])
has_attack = scored["extraction_match"].notna().any()
extracted = c2.radio("Extraction", ["all", "extracted", "not extracted"], horizontal=True,
                     disabled=not has_attack)
only_secrets = c3.toggle("Only secret-like content", value=False,
                         help="Texts holding a card-number-like string, PIN, password, key, e-mail, phone...")
if picked:
    view = view[view["group"].isin(picked)]
if search:
    view = view[view["text"].str.contains(search, case=False, regex=False)]
if has_attack and extracted != "all":
    view = view[view["extracted"].fillna(False).astype(bool) == (extracted == "extracted")]
if only_secrets:
    view = view[view["secret"].notna()]

out = export_frame(view.sort_values([rank_col, "example_id"]), has_attack)
st.caption(f"{len(out):,} of {len(scored):,} texts. "
           + (f"Attack rule: {state.plain(attack['rule'])}." if attack.get("rule") else
              "No calibrated attack stored yet: the verdict uses copies, secret-like content and GNQ."))
event = st.dataframe(out, hide_index=True, width="stretch", on_select="rerun",
                     selection_mode="single-row", key="flagged_table", column_config=column_config(out))
if sel := state.selected_rows(event, out):
    state.open_example(sel[0])
c = st.columns(3)
for col, fmt, mime in zip(c, ("csv", "jsonl", "parquet"),
                          ("text/csv", "application/jsonl", "application/vnd.apache.parquet"), strict=True):
    col.download_button(f"Download {fmt.upper()}", to_bytes(out, fmt), file_name=f"{run.name}-flagged.{fmt}",
                        mime=mime, width="stretch")
