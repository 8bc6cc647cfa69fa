"""New audit: point at checkpoints and a dataset (upload or local path), set λ and friends, start.

The audit runs as a background job (gnq_core.jobs) given validated settings: the page
never freezes, the job survives a reload, shows progress per checkpoint and can be cancelled.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import streamlit as st

from gnq_core import jobs, one_line
from gnq_core.access import OutsideRootsError, local_path
from gnq_core.dashboard import state
from gnq_core.dashboard.jobs_view import job_panel
from gnq_core.engine import LAM_ABSOLUTE, LAM_RELATIVE, TOKEN_MEAN, TOKEN_SUM
from gnq_core.pipelines import (
    COMPANION_CHOICES,
    DEFAULT_PREFIX,
    DEFAULT_SECRET_CANDIDATES,
    DEFAULT_SUFFIX,
    DEFAULT_THRESHOLD,
    MAX_SECRET_CANDIDATES,
    MIN_SECRET_CANDIDATES,
    AuditSettings,
    audit_inputs,
    audit_job,
    companion_choice,
    companions_option,
    default_threads,
    duration,
    estimate_audit,
    estimate_lines,
    extract_options,
    measure_estimate,
    tokens_per_text,
    total_seconds,
)
from gnq_core.results import MIN_BATCH_SIZE, uploads_root
from gnq_core.sources import (
    DATA_FORMATS,
    DEFAULT_BATCH_CAP,
    SUFFIXES,
    TRAIN_ON,
    CheckpointError,
    DatasetError,
    LinkError,
    check_adapter,
    check_checkpoint,
    check_link,
    check_plan,
    dataset_columns,
    detect_format,
    find_adapter_checkpoints,
    find_checkpoints,
    load_texts,
    max_positions,
    parameter_count,
    secret_labels,
    trained_default,
)

LOSS_LABELS = {TOKEN_MEAN: "token mean (default)", TOKEN_SUM: "token sum"}
DEFAULT = AuditSettings  # the form starts at the settings type's defaults (its fields' class attributes)
LAM_MODE_LABELS = {LAM_ABSOLUTE: "absolute (default)", LAM_RELATIVE: "relative to the batch's mean K_jj"}
# The companion set (the CLI's --companions N|all), one label for each of options.COMPANION_CHOICES.
COMPANION_LABELS = dict(zip(COMPANION_CHOICES, ("the other texts of its batch (exact; default)",
                                                "N other texts of the data (sketched)",
                                                "every other text of the data (sketched)"), strict=True))
COMPANIONS_N = 1024  # the N offered first: --companions has no default N (without it: the batch)
COMPANIONS_NOTE = (
    "**Companion set**: the texts each text's GNQ is measured against (the others whose gradients may "
    "explain its gradient). Default: the other texts of its batch, exactly. *N* or *all*: the data's texts "
    "in seeded sets of N + 1 (or one set of all of them) — the paper's definition with this dataset "
    "standing in for the training set — and Batch size is then only the texts per pass. Those numbers are "
    "**sketched**: each text's gradient is reduced to a seeded random projection (up to *k* dimensions per "
    "weight matrix, folded into one vector of 65,536 per text), so GNQ is approximate, with a measured error "
    "(its relative error and Spearman correlation with exact GNQ: benchmarks/results/sketch_error-shared-cpu"
    ".json and sketch_error-smollm2-cpu.json; at the defaults a "
    "test holds it to Spearman ≥ 0.99 and median relative error ≤ 5%). The Runs page and the report say "
    "which companion set a run used.")


def start_blocked(upload_ckpt: bool, checkpoints: Path | None, refs: list, upload_data: bool,
                  dataset: object | None) -> str | None:
    """Why Start audit is off, in one line (None: it is on).  An upload still in progress reads
    as no value yet (the browser sends the folder when every file has arrived), so the line
    names that case instead of leaving a greyed-out button."""
    missing = []
    if checkpoints is None:
        missing.append("the checkpoint folder has finished uploading (a spinner on a file: still arriving)"
                       if upload_ckpt else "a checkpoint folder is given in 1.")
    elif not refs:
        missing.append("the checkpoint folder in 1. holds a checkpoint that can be audited (see above)")
    if dataset is None:
        missing.append("the dataset has finished uploading and reads (see 2.)" if upload_data
                       else "a dataset file is given in 2.")
    return ("Start audit is off until " + " and ".join(missing) + ".") if missing else None


st.title("New audit")
state.sidebar(creates=True)
db = state.db_path()

if "staging" not in st.session_state:
    st.session_state["staging"] = jobs.new_job_id()
staging_id = st.session_state["staging"]
jobs.touch_staging(uploads_root(db) / staging_id)  # in use: another session's clean-up keeps it


def _local(typed: str) -> Path | None:
    """A typed local path; refused (shown, None) outside the data roots when they apply."""
    if not typed.strip():
        return None
    try:
        return local_path(typed)
    except OutsideRootsError as exc:
        st.error(state.plain(exc))
        return None


def staging() -> Path:
    path = uploads_root(db) / staging_id
    if not path.exists():
        jobs.uploads_dir(db, staging_id)
    return path


def uploaded_folder(files: list, name: str) -> Path | None:
    """The uploaded folder, saved as ``name`` in the staging folder; refused: shown, None."""
    try:
        target = staging() / name
        jobs.save_uploads(files, target)
        jobs.check_upload_tree(staging())
        # The browser names files by their path under the picked folder's parent
        # ("run/epoch-1/config.json"): step into that single top folder.
        entries = list(target.iterdir())
        while not (target / "config.json").exists() and len(entries) == 1 and entries[0].is_dir():
            target = entries[0]
            entries = list(target.iterdir())
        return target
    except (ValueError, OSError) as exc:
        st.error(state.plain(one_line(exc)))
        return None


@st.cache_data(ttl=30, show_spinner=False, max_entries=256)
def checkpoint_problem(path: str, mtime: float, tokenizer: str | None = None,  # noqa: ARG001 (cache key)
                       base: str | None = None) -> str | None:
    """Why a checkpoint cannot be audited, or a PEFT adapter checkpoint does not fit the ``base``
    model (one line naming the file), or None: shown before the audit starts, instead of as a
    failed job."""
    try:
        if base is not None:
            check_adapter(path, base)
        else:
            check_checkpoint(path, tokenizer=tokenizer)
    except CheckpointError as exc:
        return str(exc)
    return None


@st.cache_data(ttl=300, show_spinner=False, max_entries=16)
def secret_values_in(path: str, mtime: float, text_column: str | None, secret_column: str | None,  # noqa: ARG001
                     public_column: str | None) -> tuple[int, int]:
    """(secret-like values, texts holding them) the secret attack will probe in a dataset file."""
    import json

    data = load_texts(path, text_column=text_column, secret_column=secret_column, public_column=public_column)
    stored = secret_labels(data.texts, declared=data.secret_values, public=data.public)["secret_values"]
    counts = [len(json.loads(v)) for v in stored if isinstance(v, str)]
    return sum(counts), len(counts)


@st.cache_data(ttl=30, show_spinner=False, max_entries=256)
def positions_of(path: str, mtime: float) -> int | None:  # noqa: ARG001 (cache key)
    return max_positions(path)


@st.cache_data(ttl=300, show_spinner=False, max_entries=64)
def parameters_of(path: str, mtime: float) -> int | None:  # noqa: ARG001 (cache key)
    return parameter_count(path)


@st.cache_data(ttl=60, show_spinner=False, max_entries=64)
def memory_plan_of(path: str, mtime: float, batch_size: int | None, max_length: int,  # noqa: ARG001 (key)
                   checkpoints: int, adapter: str | None = None) -> tuple[int | None, str]:
    """The audit's memory plan for these settings (sources.memory_plan, nothing loaded): the
    batch it takes (None: none fits) and its one line; ``adapter``: the checkpoints are PEFT
    adapters like this one of the base ``path``, audited unmerged."""
    try:
        plan, _ = check_plan(path, batch_size=batch_size, max_length=max_length, dtype=None,
                             checkpoints=checkpoints, device="cpu", adapter=adapter)
    except (ValueError, OSError) as exc:
        return None, one_line(exc)
    return plan.batch_size, plan.describe()


@st.cache_data(ttl=3600, show_spinner=False, max_entries=16)
def measured(model: str, mtime: float, data: str, data_mtime: float,  # noqa: ARG001 (cache key)
             columns: tuple[str | None, str | None, str | None], patterns: tuple[str, ...],
             batch_size: int, max_length: int, seed: int, threads: int, attack: bool, calibrated: bool,
             prefix: int, suffix: int, candidates: int, checkpoints: int, tokenizer: str | None):
    """The job's counted work and its unit costs measured on its first checkpoint (a probe of a few
    seconds to a minute: the model loaded and run once per kind of work)."""
    import dataclasses

    text_column, secret_column, public_column = columns
    texts = dataclasses.replace(load_texts(data, text_column=text_column, secret_column=secret_column,
                                           public_column=public_column), secret_patterns=patterns)
    return measure_estimate(model, texts, batch_size=batch_size, max_length=max_length, seed=seed,
                            threads=threads, attack=attack, reference=calibrated, prefix=prefix,
                            suffix=suffix, secret_candidates=candidates, checkpoints=checkpoints,
                            tokenizer=tokenizer)


st.subheader("1. Checkpoints")
ckpt_mode = st.radio("Checkpoints", ["Upload a folder", "Local path"], horizontal=True,
                     label_visibility="collapsed", key="ckpt_mode")
checkpoints: Path | None = None
if ckpt_mode == "Upload a folder":
    files = st.file_uploader("A Hugging Face checkpoint folder, or a folder of them "
                             "(epoch-\\*, checkpoint-\\*…)",  # \\*: Markdown would eat a '*' pair
                             accept_multiple_files="directory", key="ckpt_upload")
    if files:
        checkpoints = uploaded_folder(files, "checkpoints")
else:
    typed = st.text_input("Checkpoint folder on this machine", key="ckpt_path",
                          placeholder="/path/to/run (with epoch-1/, epoch-2/… or a config.json)")
    checkpoints = _local(typed)

typed_tokenizer = st.text_input(
    "Tokenizer folder (optional)", key="tokenizer_path",
    placeholder="only for checkpoints saved without tokenizer files, e.g. the base model's folder",
    help="Checkpoints saved by the Trainer without processing_class=tokenizer have no tokenizer files; "
         "give a folder that has them (the CLI's --tokenizer).")
tokenizer_dir = _local(typed_tokenizer)
base_mode = st.radio("Base model (PEFT adapter checkpoints only)", ["None", "Local path", "Upload a folder"],
                     horizontal=True, key="base_mode",
                     help="A LoRA / PEFT run saves adapter checkpoints (adapter_config.json) without the "
                          "model: name the model they were trained from (the CLI's --base-model).")
base_dir: Path | None = None
if base_mode == "Local path":
    base_dir = _local(st.text_input("Base model folder on this machine", key="base_path"))
elif base_mode == "Upload a folder":
    files = st.file_uploader("The base model's Hugging Face folder", accept_multiple_files="directory",
                             key="base_upload")
    if files:
        base_dir = uploaded_folder(files, "base")
merge_adapter = base_dir is not None and st.checkbox(
    "GNQ over all parameters of the merged model", key="merge_adapter",
    help="Default: GNQ over the adapter's parameters, the quantity measured in-run (comparable with it). "
         "Merged: every base weight's gradient counts too (a much larger quantity).")
refs = []
if checkpoints is not None:
    try:
        find = find_adapter_checkpoints if base_dir is not None else find_checkpoints
        refs = find(checkpoints)
        st.caption(f"{len(refs)} {'adapter ' if base_dir is not None else ''}checkpoint(s): "
                   + ", ".join(state.plain(r.label) for r in refs[:12]) + (" …" if len(refs) > 12 else ""))
    except CheckpointError as exc:
        st.error(state.plain(exc))
    tok = str(tokenizer_dir) if tokenizer_dir else None
    base = str(base_dir) if base_dir is not None else None
    base_problem = None if base_dir is None else (
        checkpoint_problem(base, base_dir.stat().st_mtime, tok) if base_dir.exists()
        else f"{base_dir}: no such folder")
    problems = [base_problem] if base_problem else [
        p for r in refs if (p := checkpoint_problem(str(r.path), r.path.stat().st_mtime, tok, base))]
    if problems:
        st.error(state.plain(problems[0]) + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
        refs = []

st.subheader("2. Dataset")
data_mode = st.radio("Dataset", ["Upload a file", "Local path"], horizontal=True,
                     label_visibility="collapsed", key="data_mode")
data_path: Path | None = None
if data_mode == "Upload a file":
    upload = st.file_uploader("Texts: .txt (one per line), .jsonl, .csv or .parquet",
                              type=[s.lstrip(".") for s in SUFFIXES], key="data_upload")
    if upload is not None:
        try:
            folder = staging() / "data"
            jobs.save_uploads([upload], folder)
            data_path = folder / jobs.safe_relative_path(upload.name)
        except (ValueError, OSError) as exc:
            st.error(state.plain(one_line(exc)))
else:
    typed = st.text_input("Dataset file on this machine", key="data_path_input")
    data_path = _local(typed)

text_column = group_column = secret_column = public_column = None
dataset = None
data_format, train_on = "auto", None
if data_path is not None:
    try:
        check_link(data_path)  # a typed path that is a link out of its folder (to /etc/passwd, say)
        columns = dataset_columns(data_path)
        chat_format = detect_format(columns)
        if chat_format != "text":  # conversations: rendered with the checkpoint's template at the audit
            c1, c2 = st.columns(2)
            chat_formats = list(DATA_FORMATS[2:])
            data_format = c1.selectbox("Data format", chat_formats, index=chat_formats.index(chat_format),
                                       help="Chat records are rendered with the checkpoint's chat template "
                                            "(the base model's for adapters) as TRL's SFTTrainer does "
                                            "(--data-format).")
            train_on = c2.selectbox("Trained tokens", [None, *TRAIN_ON],
                                    format_func=lambda t: f"TRL's default ({trained_default(data_format)})"
                                    if t is None else t,
                                    help="The tokens the fine-tune was trained on; loss and GNQ are over "
                                         "them (--train-on).")
            st.caption(f"read as {data_format}: columns {', '.join(columns)}")
            columns = []  # no text column to pick
        if columns:
            c1, c2 = st.columns(2)
            text_column = c1.selectbox("Text column", columns,
                                       index=columns.index("text") if "text" in columns else 0)
            options = [None] + [c for c in columns if c != text_column]  # None: shown as "(none)"
            optional = {"format_func": lambda c: "(none)" if c is None else c}
            group_column = c2.selectbox("Group column (optional)", options, **optional,
                                        index=options.index("group") if "group" in options else 0)
            c1, c2 = st.columns(2)
            secret_column = c1.selectbox("Secret column (optional)", options, key="secret_column", **optional,
                                         help="Each row's private value(s), ';'-separated: found in its text "
                                              "and attacked like any secret-like value (--secret-column).")
            public_column = c2.selectbox("Public column (optional)", options, key="public_column", **optional,
                                         help="true/false, yes/no, 1/0: a public text is not searched for "
                                              "secrets and never 'at risk' (--public-column).")
        dataset = None if data_format != "auto" else load_texts(
            data_path, text_column=text_column, group_column=group_column, secret_column=secret_column,
            public_column=public_column)
        if dataset is not None:  # chat data are counted when rendered, at the audit
            groups = sorted({g for g in dataset.groups if g is not None})
            st.caption(f"{len(dataset):,} texts"
                       + (f", groups: {', '.join(state.plain(g) for g in groups[:8])}" if groups else "")
                       + (f" ({dataset.dropped} rows with a missing or empty text skipped)" if dataset.dropped
                          else ""))
            n_values, n_holding = secret_values_in(str(data_path), data_path.stat().st_mtime, text_column,
                                                   secret_column, public_column)
            st.caption(f"{n_values:,} secret-like values in {n_holding:,} texts (patterns below add more): "
                       "with the attack, each is probed — the model prompted with its text up to the value, "
                       "then scored against the secret candidates' likelihoods for its exposure — and its "
                       "progress shown value by value.")
    except (DatasetError, LinkError) as exc:
        st.error(state.plain(exc))

st.subheader("3. Settings")
# The model reads at most this many tokens: the form offers no more (the job would fail at once).
model_dirs = [base_dir] if base_dir is not None and refs else [r.path for r in refs]
# the memory plan of unmerged adapters counts their layers beside the base's (sources.memory_plan)
planned_adapter = str(refs[0].path) if base_dir is not None and refs and not merge_adapter else None
limits = [n for path in model_dirs if (n := positions_of(str(path), path.stat().st_mtime))]
token_limit = min(limits) if limits else None
default_name = (refs[0].path.parent.name if len(refs) > 1 else (refs[0].label if refs else "")) or "my-audit"
# Every form field has a key: its identity is then the key alone, so a rerun (an upload, a path typed
# above) that changes a default, a limit or a placeholder keeps what was typed instead of making a
# new field at its default. The run name's default is a placeholder, so it can follow the checkpoints.
# Enter in a field only commits its value: an audit can run for hours, so only the button starts one
# (a user confirming "4" in Batch size with Enter must not start the audit at the old 16).
with st.form("settings", enter_to_submit=False):
    name = st.text_input("Run name", key="form_name", placeholder=f"{default_name} (left empty: this name)",
                         help="Empty: named after the checkpoint folder.").strip() or default_name
    c1, c2, c3, c4 = st.columns(4)
    lam = c1.number_input("λ", min_value=1e-12, value=DEFAULT.lam, format="%g", key="form_lam",
                          help="Regulariser of the GNQ solve; see the 2D regression page.")
    # the default batch: the largest up to 16 the memory plan fits (sources.memory_plan)
    planned_batch = (memory_plan_of(str(model_dirs[0]), model_dirs[0].stat().st_mtime, None,
                                    DEFAULT.max_length, max(1, len(refs)), planned_adapter)[0]
                     if model_dirs else None)
    batch_size = c2.number_input("Batch size", min_value=MIN_BATCH_SIZE, step=1, key="form_batch",
                                 value=planned_batch or DEFAULT_BATCH_CAP,
                                 help="GNQ measures each text against the others of its batch. Its default "
                                      "is the largest up to 16 whose memory plan fits this machine.")
    max_length = c3.number_input(
        "Max length (tokens)", min_value=2, max_value=token_limit,
        value=min(DEFAULT.max_length, token_limit or DEFAULT.max_length), step=8, key="form_max_length",
        help="Tokens of each text that GNQ reads; longer texts are cut."
             + (f" This model reads at most {token_limit} tokens." if token_limit else ""))
    seed = c4.number_input("Seed", min_value=0, value=DEFAULT.seed, step=1, key="form_seed",
                        help="Seeds the fixed batch partition.")
    c1, c2 = st.columns(2)
    loss = c1.selectbox("Loss per text (ℓ_j)", list(LOSS_LABELS), format_func=LOSS_LABELS.get,
                        key="form_loss",
                        help="The mean weighs every text alike; the sum weighs a text by its length, as a "
                             "training step on summed tokens does (GNQ then grows with length).")
    lam_mode = c2.selectbox("λ scale", list(LAM_MODE_LABELS), format_func=LAM_MODE_LABELS.get,
                            key="form_lam_mode",
                            help="Relative: λ × the batch's mean ‖g_j‖², so GNQ does not change with the "
                                 "gradients' overall scale (compare checkpoints whose gradients shrink).")
    c1, c2, c3 = st.columns([2, 1, 1])
    companion_set = c1.selectbox("Companions (what GNQ measures each text against)", COMPANION_CHOICES,
                                 index=COMPANION_CHOICES.index(companion_choice(DEFAULT.companions)),
                                 format_func=COMPANION_LABELS.get, key="form_companions",
                                 help="The CLI's --companions N|all (default: its batch).")
    companions_n = c2.number_input(
        "Companion texts N", min_value=1, step=64, key="form_companions_n",
        value=DEFAULT.companions if isinstance(DEFAULT.companions, int) else COMPANIONS_N,
        help="With 'N other texts of the data': each text against N others (the CLI's --companions N).")
    sketch_k = c3.number_input("Sketch k", min_value=1, value=DEFAULT.sketch_k, step=512, key="form_sketch_k",
                               help="With companions from the data: sketch dimensions per weight matrix (the "
                                    "CLI's --sketch-k); larger is closer to exact, slower and bigger.")
    st.caption(COMPANIONS_NOTE)
    c1, c2, c3, c4 = st.columns(4)
    attack = c1.checkbox("Run the extraction attack on the last checkpoint", value=True, key="form_attack",
                         help="Calibrated: a text counts as extracted when the last checkpoint writes its "
                              "next tokens exactly and the first checkpoint (the reference) does not.")
    prefix = c2.number_input("Prefix tokens", min_value=1, value=DEFAULT_PREFIX, step=1, key="form_prefix",
                             help="p: tokens of each text given to the model.")
    suffix = c3.number_input("Suffix tokens", min_value=1, value=DEFAULT_SUFFIX, step=1, key="form_suffix",
                             help="s: tokens that must follow; texts shorter than p + s are not attackable.")
    threshold = c4.slider("Success threshold (match fraction)", 0.0, 1.0, DEFAULT_THRESHOLD, 0.01,
                          key="form_threshold")
    c1, c2 = st.columns([3, 1])
    reference = c1.text_input(
        "Reference model (optional)", key="reference_path",
        placeholder="a model folder on this machine; empty: the first checkpoint",
        help="The attack counts a text as leaked only when the audited model writes it and this model does "
             "not. For a fine-tune, give its base model; empty: the run's first checkpoint.")
    c3, c4 = st.columns([3, 1])
    patterns = c3.text_area("Secret patterns (optional)", key="secret_patterns", height=68,
                            placeholder="one regular expression a line, e.g. REF-(\\d{5})",
                            help="Values to treat as secret (--secret-pattern): the group named 'value',"
                                 " else the first group, else the whole match, is the value; a group named "
                                 "'free' marks the characters that vary (ACCT-7731-(?P<free>\\d{4})).")
    candidates = c4.number_input("Secret candidates", min_value=1, max_value=MAX_SECRET_CANDIDATES,
                                 value=DEFAULT_SECRET_CANDIDATES, step=16, key="secret_candidates",
                                 help="Random values of a digit secret's space scored beside it when its "
                                      "exact rank is out of reach; its exposure is then estimated from their "
                                      f"likelihoods (--secret-candidates; 1: no exposure, else at least "
                                      f"{MIN_SECRET_CANDIDATES}).")
    threads = c2.number_input("CPU threads", min_value=1, value=default_threads(), step=1, key="threads",
                              help="torch CPU threads of the job (the CLI's --threads). The default is the "
                                   "cores idle when the page opened; 1 is best when other jobs share the "
                                   "cores (docs/performance.md: competing threads can slow a step 10×).")
    c1, c2 = st.columns([1, 4], vertical_alignment="center")
    blocked = start_blocked(ckpt_mode == "Upload a folder", checkpoints, refs, data_mode == "Upload a file",
                            dataset)
    submitted = c1.form_submit_button("Start audit", type="primary", disabled=blocked is not None)
    if blocked:
        c2.caption(f"**{blocked}**")
    size = parameters_of(str(model_dirs[0]), model_dirs[0].stat().st_mtime) if model_dirs else None
    probe_key = None
    if refs and dataset is not None and len(dataset) and base_dir is None:
        probe_key = (str(refs[0].path), refs[0].path.stat().st_mtime, str(data_path),
                     data_path.stat().st_mtime, (text_column, secret_column, public_column),
                     tuple(p.strip() for p in patterns.splitlines() if p.strip()), batch_size,
                     int(max_length), int(seed), int(threads), bool(attack),
                     bool(attack) and (bool(reference.strip()) or len(refs) > 1), int(prefix), int(suffix),
                     int(candidates), len(refs), str(tokenizer_dir) if tokenizer_dir else None)
    probed = st.session_state.get("probed", {}).get(probe_key) if probe_key else None
    if probed is not None:
        lines = estimate_lines(*probed)
        c2.caption(f"**Estimated time: about {duration(total_seconds(lines))}**, measured on this machine "
                   f"({state.plain(probed[1].model)}); each stage below.")
    elif size and dataset is not None and len(dataset):
        mean_chars = sum(len(t) for t in dataset.texts) / len(dataset)
        guess = estimate_audit(parameters=size, texts=len(dataset), checkpoints=len(refs),
                               tokens=tokens_per_text(mean_chars, int(max_length)), attack=bool(attack),
                               prefix=int(prefix), suffix=int(suffix), threads=int(threads))
        c2.caption(f"**Estimated time: about {duration(guess.total_s)}** (a rough estimate: "
                   f"{guess.basis}). Measure it on this model below for every stage.")
    elif refs and dataset is not None:
        c2.caption("No time estimate: the model's size could not be read from its weight files.")
    if model_dirs:  # the memory beside the time, for the settings as they stand
        _, memory_line = memory_plan_of(str(model_dirs[0]), model_dirs[0].stat().st_mtime, int(batch_size),
                                        int(max_length), max(1, len(refs)), planned_adapter)
        c2.caption(f"**Memory:** {state.plain(memory_line)}")


def form_jobs(reference_path: Path | None) -> list:
    """The audit (and attack) the form's values ask for, checked by the one preflight every door
    uses (pipelines/preflight.py: the CLI's bounds and messages, the inputs found and read);
    ValueError (one line) when something is refused."""
    audit = audit_job(checkpoints=checkpoints, data=data_path, name=name, lam=lam, lam_mode=lam_mode,
                      loss=loss, batch_size=batch_size, max_length=int(max_length), seed=int(seed),
                      companions=companions_option(companion_set, int(companions_n)),
                      sketch_k=int(sketch_k), text_column=text_column, group_column=group_column,
                      secret_column=secret_column, public_column=public_column,
                      secret_patterns=[p.strip() for p in patterns.splitlines() if p.strip()],
                      threads=int(threads), tokenizer=tokenizer_dir, base_model=base_dir,
                      merge_adapter=bool(merge_adapter), data_format=data_format, train_on=train_on)
    extract = extract_options(run=name, prefix_tokens=int(prefix), suffix_tokens=int(suffix),
                              threshold=threshold, threads=int(threads), secret_candidates=int(candidates),
                              reference=str(reference_path) if reference_path else "first")
    audit_inputs(audit, texts=dataset)  # the checkpoints, the texts, their patterns, lengths, memory
    return [audit] + ([extract] if attack else [])


if probe_key is not None:
    if probed is not None:
        with st.expander("The estimate, stage by stage", key="estimate_lines"):
            st.markdown("\n".join(f"- **{state.plain(x.what)}**: {duration(x.seconds)} for {x.count:,} "
                                   f"{x.noun} ({state.plain(x.assumed)})" for x in estimate_lines(*probed)))
    elif st.button("Measure the time this audit will take", key="measure_estimate",
                   help="Loads the first checkpoint and runs each kind of work once with these settings "
                        "(an audit batch, a decoding batch, a secret value's exposure): seconds on a small "
                        "model, about a minute on a 135M one."):
        with st.spinner("Measuring on this model…"):
            try:
                form_jobs(None)  # what the audit would refuse is refused here too, before a measurement
                st.session_state.setdefault("probed", {})[probe_key] = measured(*probe_key)
            except (ValueError, OSError, RuntimeError) as exc:
                st.error(f"Could not measure: {state.plain(one_line(exc))}")
            else:
                st.rerun()
if token_limit:
    st.caption(f"The model has {token_limit} positions: Max length can be at most {token_limit} tokens.")

if submitted:
    if name in set(state.runs()["name"]):
        st.warning(f"A run named {state.plain(repr(name))} exists: starting will resume it if the settings "
                   "match.")
    steps = []
    reference_path = _local(reference) if reference.strip() else None  # refused: shown, None
    problem = None
    if reference_path is not None:
        problem = (checkpoint_problem(str(reference_path), reference_path.stat().st_mtime)
                   if reference_path.exists() else f"{reference_path}: no such folder")
        if problem:
            st.error(state.plain(problem))
    if reference.strip() and (reference_path is None or problem):
        submitted = False  # the attack's reference is refused on the page, not as a failed job
    try:  # validated here, so a bad value is refused on the page rather than as a failed job
        steps = form_jobs(reference_path)
    except (ValueError, OSError) as exc:
        steps = []
        st.error(state.plain(one_line(exc)))
if submitted and steps:
    runs = state.runs()
    writing = runs[(runs["name"] == name) & (runs["status"] == "running")] if not runs.empty else runs
    uploaded = uploads_root(db) / staging_id
    try:
        if not writing.empty and jobs.live_job(db, name) is None:  # a `gnq audit` in a terminal, say
            pid = writing.iloc[0].get("pid")
            raise jobs.JobConflict(f"run {name!r} is being written by a process outside the dashboard"
                                   + (f" (pid {int(pid)})" if pd.notna(pid) else "")
                                   + ": stop it where it runs (Ctrl-C), or give this audit another name")
        jobs.start_job(name, db, steps, cleanup=[uploaded] if uploaded.exists() else [], job_id=staging_id)
    except jobs.JobConflict as exc:  # one run, one job at a time: a second start would race the first
        st.error(f"Not started: {state.plain(exc)}.")
    else:
        st.session_state.pop("staging")  # the next audit gets a fresh upload folder
        st.session_state[state.RUN_KEY] = name
        st.success(f"Started {state.plain(repr(name))}. Progress below; the other pages fill in as "
                   "checkpoints finish.")

job_panel(db)

with st.expander("Clean up abandoned uploads", key="cleanup_uploads"):  # one element across reruns
    busy = {j.job_id for j in jobs.list_jobs(db) if j.alive()} | {staging_id}
    leftovers = jobs.abandoned_uploads(db, busy)
    st.caption(f"{len(leftovers)} upload folder(s) not used by a running job nor touched by a session for "
               "a day.")
    if leftovers and st.button("Delete them"):
        for p in leftovers:
            shutil.rmtree(p, ignore_errors=True)
        st.rerun()
