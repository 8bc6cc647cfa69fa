"""Membership ground truth: the same signals on texts the model never saw.

``gnq audit --non-members FILE`` audits the FILE's texts over the same checkpoints, with the same
λ, batch size, loss convention and partition seed, into a linked run ``NAME.non-members``
(``Run.settings["non_members_run"]`` names it; the linked run's ``non_members_of`` names back;
pipelines/non_member_audit.py runs that audit).

What each signal means for a non-member (DESIGN.md "Membership ground truth"): loss, Min-K%,
Min-K%++, zlib ratio and the reference loss ratio are forward quantities and mean the same for
any text.  A non-member has no training step, so its GNQ and K_jj are measured post hoc at each
checkpoint, in batches of non-members only (the same batch size), exactly as a post-hoc audit
measures members: GNQ is then "how unique this text's gradient would be among texts like it",
not a statement about a step that happened.  Comparing members with non-members is like with
like only when the members' numbers come from the same post-hoc audit, which is why the flag
lives on ``gnq audit`` (a training run's in-run GNQ is measured before each update and mid-epoch:
not comparable with a checkpoint's).

``membership_frame(store, run)`` joins both runs at one checkpoint into the frame the
evidence tables read (docs/DESIGN.md §8, "the evidence frame"): one row per text, ``member``
True for a member and False for a non-member.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from gnq_core.attacks.compression import zlib_bits
from gnq_core.engine.math.conventions import TOKEN_SUM
from gnq_core.results.store import Store
from gnq_core.results.store_queries import Run
from gnq_core.results.store_schema import StoreError
from gnq_core.sources.datasets import DatasetError, TextDataset

SUFFIX = ".non-members"
REFERENCE_METRIC = "reference_loss"  # the same metric the calibrated attack writes
# The frame's signal columns, named as analysis.predictive.SIGNALS names them (beside example_id,
# text, n_tokens, member, point, label, run_id, run_example_id).  The gradient norm is √K_jj:
# the same ranking as self_influence_last, so it gets no column of its own.
FRAME_SIGNALS = ["loss_last", "gnq_last", "gnq_total", "self_influence_last", "min_k_prob", "min_k_plus",
                 "zlib_ratio", "loss_ratio"]


def check_disjoint(members: list[str], non_members: TextDataset) -> None:
    """A text in both sets would be scored as a non-member although the model saw it: refused."""
    shared = set(members) & set(non_members.texts)
    if shared:
        raise DatasetError(non_members.path, f"{len(shared)} of its texts are also member texts of the run "
                                             f"(e.g. {next(iter(shared))[:60]!r}); non-members must be "
                                             "texts the model never saw")


def check_run_takes_non_members(store: Store, run: Run, dataset: TextDataset) -> None:
    """The checks before a stored run gets non-members, before anything is written: an audit
    run (a training run's in-run numbers are measured mid-epoch, before each update: not
    comparable with a checkpoint's) and no text in both sets."""
    if run.kind != "audit":
        raise StoreError(f"--non-members: run {run.name!r} is a training run, whose in-run numbers are not "
                         "comparable with a checkpoint's; audit its checkpoints with gnq audit --checkpoints "
                         f"{run.model_path} --data ... --non-members FILE")
    check_disjoint(list(store.examples(run.run_id)["text"]), dataset)


def store_reference_loss(store: Store, run: Run, reference: str, *, max_length: int, batch_size: int) -> None:
    """Each text's mean next-token loss under the reference model (``reference_loss`` metric)."""
    from gnq_core.attacks.membership import token_logprobs
    from gnq_core.sources.checkpoints.load import load_checkpoint
    from gnq_core.sources.tokens import encode_texts, pad_id

    model, tokenizer = load_checkpoint(reference)
    texts = list(store.examples(run.run_id)["text"])
    ids = encode_texts(tokenizer, texts, max_length)
    logprobs = token_logprobs(model, ids, pad_id(tokenizer), batch_size=batch_size)
    values = [float(-lp.mean()) if len(lp) else math.nan for lp in logprobs]
    store.write_metric(run.run_id, REFERENCE_METRIC,
                       pd.DataFrame({"example_id": np.arange(len(texts)), "value": values}),
                       settings={"reference": str(reference), "definition": "mean next-token NLL (nats)"})


def non_member_run(store: Store, run: Run) -> Run:
    name = run.settings.get("non_members_run")
    if not name or store.find_run(name) is None:
        raise StoreError(f"run {run.name!r} has no non-member texts: audit its checkpoints with "
                         "gnq audit ... --non-members FILE")
    return store.find_run(name)


def membership_of(store: Store, run: Run) -> pd.DataFrame | None:
    """``membership_frame`` of a run that has non-members (``gnq audit/extract/report
    --non-members``), else None: what the report and the dashboard pass to ``run_report.build``."""
    return membership_frame(store, run) if run.settings.get("non_members_run") else None


def ground_truth_of(store: Store, run: Run) -> pd.DataFrame | None:
    """``membership_of`` for ranking the run's texts (analysis.verdict.rank_texts chooses its risk's
    components on it): None, not an error, while the never-trained texts cannot be read yet (their
    audit shares no finished checkpoint with the run, or its run is gone)."""
    try:
        return membership_of(store, run)
    except StoreError:
        return None


def membership_frame(store: Store, run: Run, point: int | None = None) -> pd.DataFrame:
    """Members (``member`` True) and non-members (False) at one checkpoint, one row per text.

    Columns: ``example_id`` (members keep theirs; non-members are numbered after them),
    ``run_id``/``run_example_id`` (where each row comes from), text, n_tokens, member, point,
    label and the signals ``FRAME_SIGNALS``: the loss and GNQ at the point, GNQ summed up to it,
    K_jj = ‖g‖², Min-K% / Min-K%++, zlib ratio (model bits / zlib bits) and the loss ratio to the
    reference (NaN without one).  ``point``: default the last checkpoint both runs finished."""
    other = non_member_run(store, run)
    done = [set(store.points(r.run_id).query("status == 'done'")["point"]) for r in (run, other)]
    common = sorted(done[0] & done[1])
    if not common:
        raise StoreError(f"runs {run.name!r} and {other.name!r} share no finished checkpoint")
    point = common[-1] if point is None else int(point)
    if point not in common:
        raise StoreError(f"checkpoint {point} is not finished in both {run.name!r} and {other.name!r}")
    members, outside = (_signals(store, r, point).assign(member=m, run_id=r.run_id)
                        for r, m in ((run, True), (other, False)))
    outside["example_id"] += run.n_examples
    frame = pd.concat([members, outside], ignore_index=True)
    frame["member"] = frame["member"].astype("boolean")
    return frame


def _signals(store: Store, run: Run, point: int) -> pd.DataFrame:
    scores = store.scores(run.run_id)
    scores = scores[scores["point"] <= point]
    totals = scores.groupby("example_id")["gnq"].sum(min_count=1).rename("gnq_total")
    at = scores[scores["point"] == point].set_index("example_id")
    frame = store.examples(run.run_id)[["example_id", "text", "n_tokens"]].set_index("example_id")
    for column in ("min_k", "min_k_plus"):
        if column not in at.columns:  # a store written before these columns
            at[column] = math.nan
    frame = frame.join(at[["loss", "gnq", "self_influence", "min_k", "min_k_plus"]].rename(columns={
        "loss": "loss_last", "gnq": "gnq_last", "self_influence": "self_influence_last",
        "min_k": "min_k_prob"})).join(totals)
    predicted = (frame["n_tokens"] - 1).clip(lower=1)
    loss = frame["loss_last"]
    nats = loss if run.settings.get("loss") == TOKEN_SUM else loss * predicted
    frame["zlib_ratio"] = nats / math.log(2) / frame["text"].map(zlib_bits)
    metrics = store.metrics(run.run_id).set_index("example_id")
    reference = metrics[REFERENCE_METRIC] if REFERENCE_METRIC in metrics.columns else math.nan
    frame["loss_ratio"] = loss / reference
    labels = store.points(run.run_id).set_index("point")["label"]
    frame = frame.reset_index().assign(point=point, label=labels.get(point))
    frame["run_example_id"] = frame["example_id"]
    return frame[["example_id", "run_example_id", "text", "n_tokens", "point", "label", *FRAME_SIGNALS]]
