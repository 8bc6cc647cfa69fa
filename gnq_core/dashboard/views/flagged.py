"""Flagged texts: the verdict order (leaked first, then secret-like content, then memorisation
risk) with a reason per text, or GNQ alone; filter, and download exactly the filtered view.
Every filter is in the address (dashboard/address.py): a copied link opens the same rows."""

from __future__ import annotations

import streamlit as st

from gnq_core.analysis import grouped
from gnq_core.dashboard import address, show, state
from gnq_core.dashboard.flagged_filters import EXTRACTION, MODES, ORDERS, STATUS_CHOICES, Filters, flagged
from gnq_core.results import FORMULA_GUARD_NOTE, export_frame, to_bytes

TEXT_ROWS = 50

st.title("Flagged texts")
run = state.require_run()
scored = state.require_scores(run)[3]
attack = run.settings.get("attack") or {}
n = len(scored)
default = Filters(k=min(50, n), min_gnq=float(scored["gnq_total"].quantile(0.9)))


address.restore("flagged_order", "order", default.order, address.one_of(ORDERS))
order = st.radio("Order by", ORDERS, horizontal=True, key="flagged_order",
                 help="Verdict: texts the calibrated attack extracted first (secret-like ones first), then "
                      "texts with secret-like content, then the rest by memorisation risk. GNQ_total alone: "
                      "the gradient-uniqueness ranking, blind to copies and to the attack.")
c1, c2, c3 = st.columns(3)
address.restore("flagged_mode", "flag", default.mode, address.one_of(MODES))
mode = c1.radio("Flag by", MODES, horizontal=True, key="flagged_mode")
k, pct, min_gnq = default.k, default.percentile, default.min_gnq
if mode == "top-k":
    address.restore("flagged_k", "k", default.k, address.number(1, n, int))
    k = int(c2.number_input("k", min_value=1, max_value=n, key="flagged_k"))
elif mode == "percentile":
    address.restore("flagged_pct", "pct", default.percentile, address.number(0.0, 100.0))
    pct = c2.slider("At or above percentile", 0.0, 100.0, step=0.5, key="flagged_pct")
else:
    address.restore("flagged_min", "min_gnq", default.min_gnq, address.number(float("-inf"), float("inf")))
    min_gnq = c2.number_input("GNQ_total at least", format="%g", key="flagged_min")
address.restore("flagged_search", "q", default.search, address.text)
search = c3.text_input("Text contains", placeholder="search…", key="flagged_search")
c1, c2, c3, c4 = st.columns(4)
groups = sorted(scored["group"].dropna().astype(str).unique())
address.restore("flagged_groups", "group", default.groups, address.subset(groups))
picked = c1.multiselect("Groups", groups, key="flagged_groups")
has_attack = scored["extraction_match"].notna().any()
address.restore("flagged_extraction", "extraction", default.extraction, address.one_of(EXTRACTION))
extracted = c2.radio("Text attack's window", EXTRACTION, horizontal=True, disabled=not has_attack,
                     key="flagged_extraction",
                     help="Whether the text attack's 8-token window came out (calibrated). For a text with a "
                          "secret-like value this is not the verdict: filter by Status for that.")
address.restore("flagged_status", "status", default.status, address.one_of(STATUS_CHOICES))
status = c4.selectbox("Status", STATUS_CHOICES, key="flagged_status",
                      help="The verdict's status: the same counts as the Runs page's headline.")
address.restore("flagged_secrets", "secret", default.only_secrets, address.flag)
only_secrets = c3.toggle("Only secret-like content", key="flagged_secrets",
                         help="Texts holding a card-number-like string, PIN, password, key, e-mail, phone...")

filters = Filters(order=order, mode=mode, k=k, percentile=pct, min_gnq=min_gnq, search=search,
                  groups=list(picked), extraction=extracted, only_secrets=only_secrets, status=status)
for param, value, base, active in (("order", order, default.order, True), ("flag", mode, default.mode, True),
                                   ("k", k, default.k, mode == "top-k"),
                                   ("pct", pct, default.percentile, mode == "percentile"),
                                   ("min_gnq", min_gnq, default.min_gnq, mode == "GNQ threshold"),
                                   ("q", search, default.search, True), ("group", filters.groups, [], True),
                                   ("extraction", extracted, default.extraction, True),
                                   ("secret", only_secrets, False, True),
                                   ("status", status, default.status, True)):
    if active:
        address.record(param, value, base)
    else:
        address.forget(param)

picked_rows = flagged(scored, filters)
out = export_frame(picked_rows, has_attack)
st.caption(f"{len(out):,} of {n:,} texts. "
           + (f"Attack rule: {state.plain(attack['rule'])}." if attack.get("rule") else
              "No calibrated attack stored yet: the verdict uses copies, secret-like content and GNQ."))
show.texts(picked_rows, limit=TEXT_ROWS, key="flagged_pick")
show.risk_basis(scored, warn=False)  # the Runs page warns; here it is said beside the list
if len(grouped(picked_rows)) > TEXT_ROWS:
    st.caption(f"The first {TEXT_ROWS} texts (copies share a row); all of them are in the table below"
               " and the downloads.")
with st.expander("All columns, as downloaded (select a row to open its drill-down)"):
    tokenised = show.tokenised_toggle(picked_rows, "flagged_tokenised")
    # a conversation reads as its turns on one line here; the downloads keep `text` and `conversation`
    shown = out.assign(turns=picked_rows["turns"].to_numpy()) if "turns" in picked_rows else out
    show.table(show.readable(shown, tokenised), "flagged_table")
if out.empty:
    st.caption("Nothing to export: no text matches these filters.")
st.caption(f"In the CSV, {FORMULA_GUARD_NOTE}. JSONL and Parquet are always exact.")
c = st.columns(3)
for col, fmt, mime in zip(c, ("csv", "jsonl", "parquet"),
                          ("text/csv", "application/jsonl", "application/vnd.apache.parquet"), strict=True):
    col.download_button(f"Download {fmt.upper()}", to_bytes(out, fmt), file_name=f"{run.name}-flagged.{fmt}",
                        mime=mime, width="stretch", disabled=out.empty)
