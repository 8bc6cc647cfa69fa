"""What every page shares: the store, the selected run and example, cached reads.

Reads are cached per (store file, run, last update), so a page redraw costs nothing while a
job that writes to the run invalidates exactly that run's entries.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pandas as pd
import streamlit as st

from gnq_core.access import OutsideRootsError, local_path
from gnq_core.analysis import rank_texts
from gnq_core.results import Run, Store, default_db_path, open_store

RUN_KEY, EXAMPLE_KEY = "run_name", "example_id"
PAGES = {}  # filled by main.py: title -> st.Page, so pages can link to each other


STORE_PARAM = "store"  # the address's name for a store typed in the sidebar


def db_path() -> Path:
    """The store typed in the sidebar (refused outside the data roots when they apply), else the
    one in the address (a reload, a new tab: the typed store and its running jobs stay in view),
    else the one the dashboard was started with ($GNQ_DB)."""
    typed = st.session_state.get("db_path") or st.query_params.get(STORE_PARAM)
    if typed and str(typed) != str(default_db_path()):
        try:
            return local_path(typed)
        except OutsideRootsError as exc:
            st.error(plain(exc))
    return default_db_path()


def store(db: str | Path | None = None) -> Store:
    """The store, waiting at most ``$GNQ_BUSY_TIMEOUT`` (else 20) seconds for a job's write; past
    that, main.py shows the StoreError as one line (never DuckDB's lock traceback)."""
    return open_store(db or db_path(), busy_timeout=float(os.environ.get("GNQ_BUSY_TIMEOUT") or 20))


@st.cache_data(ttl=2, show_spinner=False)
def runs_frame(db: str, mtime: float) -> pd.DataFrame:  # noqa: ARG001 (cache key)
    return store(db).runs()


def runs() -> pd.DataFrame:
    path = db_path()
    return runs_frame(str(path), path.stat().st_mtime if path.exists() else 0.0)


@st.cache_data(max_entries=32, show_spinner=False)
def totals(db: str, run_id: int, version: str) -> pd.DataFrame:  # noqa: ARG001
    """Per-text totals in the verdict order (rank 1 first), with status, reason and risk (its
    components chosen on the run's never-trained texts too, when it has them)."""
    from gnq_core.pipelines import ground_truth_of

    s = store(db)
    return rank_texts(s.example_totals(run_id), ground_truth_of(s, s.run(run_id)))


@st.cache_data(max_entries=64, show_spinner=False)
def trajectories(db: str, run_id: int, version: str, ids: tuple[int, ...] | None) -> pd.DataFrame:  # noqa: ARG001
    return store(db).trajectories(run_id, list(ids) if ids is not None else None)


@st.cache_data(max_entries=32, show_spinner=False)
def trajectory_band(db: str, run_id: int, version: str) -> pd.DataFrame:  # noqa: ARG001
    return store(db).trajectory_quantiles(run_id)


@st.cache_data(max_entries=16, show_spinner="Scoring every signal against the attack (bootstrap)...")
def predictive(db: str, run_name: str, version: str):  # noqa: ARG001
    """(analysis.predictive result, ROC points, where the GNQ columns come from) of a run."""
    from gnq_core.analysis import gnq_provenance, signal_frame
    from gnq_core.analysis import predictive as pr

    s = store(db)
    run = s.run(run_name)
    frame = signal_frame(s, run)
    return pr.evaluate(frame), pr.roc_points(frame), gnq_provenance(s, run)


@st.cache_data(max_entries=16, show_spinner=False)
def gnq_nature(db: str, run_id: int, version: str) -> dict:  # noqa: ARG001
    """analysis.gnq_nature.summary of a run's finished points (GNQ vs the gradient norm)."""
    from gnq_core.analysis import gnq_nature as gn

    s = store(db)
    run = s.run(run_id)
    done = s.points(run_id)
    scores = s.scores(run_id)
    scores = scores[scores["point"].isin(done.loc[done["status"] == "done", "point"])]
    return gn.summary(scores, run.lam, run.settings.get("lam_mode", "absolute"))


@st.cache_data(max_entries=16, show_spinner="Scoring every signal: all texts, exact length, gain over "
                                            "length + loss (bootstrap, cross-validation)...")
def evidence(db: str, run_name: str, version: str):  # noqa: ARG001
    """analysis.run_report's data of a run (the report's and --json's tables)."""
    from gnq_core.analysis import run_report
    from gnq_core.pipelines import membership_of

    s = store(db)
    run = s.run(run_name)
    return run_report.build(s, run, membership=membership_of(s, run))  # with non-members: membership rows


@st.cache_data(max_entries=4, show_spinner="Writing the report...")
def report_html(db: str, run_name: str, version: str) -> str:  # noqa: ARG001
    from gnq_core.analysis import build_report

    s = store(db)
    return build_report(s, s.run(run_name), command="dashboard download",
                        data=evidence(db, run_name, version))


def version(run_id: int) -> str:
    """Changes whenever the run is written to (cache key)."""
    frame = runs()
    row = frame[frame["run_id"] == run_id]
    return "" if row.empty else f"{row['updated_at'].iloc[0]}|{row['extraction_rows'].iloc[0]}"


def sidebar(creates: bool = False) -> Run | None:
    """Store path and run picker in the sidebar; returns the selected run (or None).

    A store path that was typed and does not exist stops the page with one line (a typo must not
    read as a new, empty store), except on a page that ``creates`` one (New audit)."""
    with st.sidebar:
        st.text_input("Store (DuckDB file)", value=str(db_path()), key="db_path",
                      help="Also set by the GNQ_DB environment variable. A shards folder of a "
                           "distributed run is read in place (read-only).")
        path = db_path()
        if path != default_db_path():  # kept in the address, so a reload opens the same store
            st.query_params[STORE_PARAM] = str(st.session_state["db_path"])
        elif STORE_PARAM in st.query_params:
            del st.query_params[STORE_PARAM]
        if not path.exists() and path != default_db_path():
            if creates:
                st.caption(f"No store at {plain(path)} yet: starting an audit creates it.")
                return None
            st.error(f"No store at {plain(path)}. Check the path; a new store is created only by "
                     "starting an audit (New audit) or the demo.")
            st.stop()
        frame = runs()
        if frame.empty:
            st.caption("No runs in this store yet.")
            return None
        names = frame["name"].tolist()
        current = st.session_state.get(RUN_KEY)
        linked = st.query_params.get("run")  # a link to a run (e.g. a finished job's) picks it
        if linked in names and linked != st.session_state.get("_linked_run"):
            st.session_state["_linked_run"] = current = linked
            st.session_state["run_picker"] = linked
        if st.session_state.get("run_picker") not in names:
            st.session_state["run_picker"] = current if current in names else names[0]
        # the value comes from the session state alone: a default as well makes Streamlit warn
        # ("created with a default value but also had its value set via the Session State API")
        kinds = dict(zip(frame["name"], frame["kind"] + ", " + frame["status"], strict=True))
        name = st.selectbox("Run", names, key="run_picker", format_func=lambda n: f"{n} ({kinds[n]})")
        if name != current:
            st.session_state[RUN_KEY] = name
            st.session_state.pop(EXAMPLE_KEY, None)
        st.query_params["run"] = st.session_state["_linked_run"] = name  # the address shows the run
        return store().run(name)


def require_run() -> Run:
    """The selected run, or stop the page with a pointer to where runs come from."""
    run = sidebar()
    if run is None:
        st.info("The store has no runs yet. Build the demo run on the **Runs** page, or start one on "
                "**New audit**.")
        st.stop()
    return run


def require_scores(run: Run) -> tuple[str, str, pd.DataFrame, pd.DataFrame]:
    """(store, version, all per-example totals, those with a GNQ), or stop the page when the run
    has no finished checkpoint yet."""
    db, ver = str(db_path()), version(run.run_id)
    frame = totals(db, run.run_id, ver)
    scored = frame[frame["gnq_total"].notna()]
    if scored.empty:
        st.info("No finished checkpoint in this run yet.")
        st.stop()
    return db, ver, frame, scored


def open_example(example_id: int) -> None:
    """Shared selection: remember the example and go to its drill-down page."""
    st.session_state[EXAMPLE_KEY] = int(example_id)
    if "Text drill-down" in PAGES:
        run = st.session_state.get(RUN_KEY)
        st.switch_page(PAGES["Text drill-down"],
                       query_params={"text": str(int(example_id))} | ({"run": run} if run else {}))


# Streamlit's chart events are dicts (with attribute access too).
def selected_points(event: dict | None) -> list[int]:
    """Example ids from a plotly selection/click event (customdata[0] carries the id)."""
    ids = []
    for p in ((event or {}).get("selection") or {}).get("points", []):
        data = p.get("customdata")
        try:
            ids.append(int(data[0] if isinstance(data, list | tuple) else data))
        except (TypeError, ValueError):  # a mark without an example id
            continue
    return ids


_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$:=&])")


def plain(value: object) -> str:
    """User data (a text, a group, run or folder name, a path) made safe for st.markdown, captions,
    alerts and progress labels: every Markdown, HTML and Streamlit-directive character is
    backslash-escaped and line breaks become spaces, so it shows exactly as typed, never as
    markup (Streamlit never renders raw HTML without unsafe_allow_html, which the app never uses)."""
    return _MARKDOWN.sub(r"\\\1", " ".join(str(value).splitlines()))


def short(text: str, n: int = 80) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"
