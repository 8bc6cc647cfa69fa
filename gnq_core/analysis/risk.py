"""Memorisation risk: one number per text in [0, 1] that orders the texts no attack has decided,
from components whose direction holds on evidence.

Each component is a percentile within the run (so 0.9 = stronger than for 90% of this run's
texts), oriented the way it is read:

* **membership** (calibrated) — the mean percentile of the loss ratio to the reference model and
  the zlib ratio (lower = stronger) and Min-K%++ (higher = stronger; Zhang et al. 2024).  On every
  run measured, these separate what the model learned from what it did not, in this direction.
* **repetition** — 1 − 1/copies (0.75 for 4 copies): repetition drives memorisation (Kandpal et
  al. 2022).  Used only in a run with copies.
* **loss** — low loss; alone it mostly says a text is easy, so it enters only when the run's own
  ground truth validates it, or as the last resort when no membership score was measured.
* **GNQ** and **K_jj** (the gradient norm squared) — shown on every page, but they enter ``risk``
  only where the run's own ground truth validates them, *in the direction it measures*: on every
  run measured so far, texts the model learned had *smaller* GNQ (membership within exact length
  0.03 on SmolLM2; extraction 0.14 pooled over three seeds), so "higher GNQ = more at risk" is
  not a default.  GNQ measured with a copy of the text in the same batch says nothing about the
  text and is not used.

**Default** (no ground truth): membership, or for a repeated text repetition where that is larger
(as a unique text cannot have copies, it is not marked down for lacking them).  Without a reference model
the membership scores are the model's own (Min-K%++; the loss when even that is missing): the
ranking is then *loss-only and uncalibrated*, and the basis says so.

**Validated** (the run has ground truth: an extraction outcome, or ``--non-members``, with at
least ``MIN_PER_OUTCOME`` independent records on each side, copies counted once): each text's
risk is the mean of the components that validate on the *other* folds (``FOLDS`` folds grouped
by copy cluster, so neither a text's own outcome nor a copy's chooses its components): AUC above
``VALID_AUC`` in the component's own direction, and for GNQ and K_jj also below 1 − ``VALID_AUC``,
then reversed.  The extraction outcome is used when it has enough records (it is the event the
risk predicts); else the members against the never-trained texts.  ``risk`` never reads the
outcome of its own text, so it can be scored against it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from gnq_core.analysis.clusters import MIN_RECORDS, groups_of, numeric_column, records
from gnq_core.analysis.predictive import rank_auc

FOLDS = 5
MIN_PER_OUTCOME = MIN_RECORDS  # independent records on each side for the run's own ground truth to choose
VALID_AUC = 0.55               # a component validates when it beats chance by this margin on the other folds
EVIDENCE = ("membership", "repetition", "loss")  # enter only in their stated direction
FREE = ("gnq", "kjj")                             # enter in the direction the ground truth measures
# the calibrated membership scores: (column, higher is stronger, name)
MEMBERSHIP_SCORES = (("loss_ratio", False, "loss ratio to the reference"),
                     ("zlib_ratio", False, "zlib ratio"), ("min_k_plus", True, "Min-K%++"))
WORDS = {"repetition": "repetition (1 − 1/copies)", "loss": "low loss",
         "gnq": "GNQ percentile", "kjj": "gradient norm² K_jj"}
GROUND_TRUTH = (f"extraction with at least {MIN_PER_OUTCOME} extracted and {MIN_PER_OUTCOME} kept records, "
                "or never-trained texts (--non-members)")


@dataclass(frozen=True)
class RiskBasis:
    """What ``risk`` is on a run: ``label`` in a few words (shown next to the number), ``words``
    in a sentence or two (the report, the Runs page)."""

    label: str
    words: str
    components: tuple[str, ...] = ()   # e.g. ("membership", "repetition", "gnq reversed")
    ground_truth: str | None = None    # "extraction", "membership" or None
    calibrated: bool = False           # a reference model's loss ratio is among the scores

    @property
    def sentence(self) -> str:
        """``words`` as a sentence of its own (after the label)."""
        return self.words[:1].upper() + self.words[1:]

    @property
    def loss_only(self) -> bool:
        return self.ground_truth is None and not self.calibrated

    def to_dict(self) -> dict:
        """JSON-safe (a frame's ``attrs`` travel to Arrow and Parquet as JSON)."""
        return {"label": self.label, "words": self.words, "components": list(self.components),
                "ground_truth": self.ground_truth, "calibrated": self.calibrated}

    @classmethod
    def from_dict(cls, d: dict) -> RiskBasis:
        return cls(d["label"], d["words"], tuple(d["components"]), d["ground_truth"], d["calibrated"])


def _pct(values: pd.Series, higher_is_stronger: bool = True) -> pd.Series:
    """Percentile in (0, 1] within the non-missing values (ties share their mean rank); NaN stays."""
    v = pd.to_numeric(values, errors="coerce").astype(float)
    r = (v if higher_is_stronger else -v).rank(method="average")
    return r / max(1, int(v.notna().sum()))


def gnq_valid(frame: pd.DataFrame) -> pd.Series:
    """GNQ_total where at most half of the text's GNQ values were measured with a copy in its batch."""
    with_copy = numeric_column(frame, "gnq_with_copy").fillna(0.0)
    points = numeric_column(frame, "n_points").fillna(0.0)
    return numeric_column(frame, "gnq_total").where(with_copy < np.maximum(points, 1.0) / 2)


def components(frame: pd.DataFrame) -> dict[str, pd.Series]:
    """Every component's percentile per row of ``frame`` (its stated direction: see the module
    docstring), NaN where it has no value."""
    scores = [_pct(numeric_column(frame, c), higher) for c, higher, _ in MEMBERSHIP_SCORES]
    copies = numeric_column(frame, "copies").fillna(1.0).clip(lower=1.0)
    return {"membership": pd.concat(scores, axis=1).mean(axis=1),
            "repetition": 1.0 - 1.0 / copies,
            "loss": _pct(numeric_column(frame, "loss_last"), higher_is_stronger=False),
            "gnq": _pct(gnq_valid(frame)),
            "kjj": _pct(numeric_column(frame, "self_influence_last"))}


def _membership_words(frame: pd.DataFrame) -> str:
    have = [name for c, _, name in MEMBERSHIP_SCORES if numeric_column(frame, c).notna().any()]
    calibrated = numeric_column(frame, "loss_ratio").notna().any()
    return ("calibrated membership (" if calibrated else "membership from the model's own token "
            "probabilities (") + ", ".join(have) + ")"


def _default(frame: pd.DataFrame, parts: dict[str, pd.Series]) -> tuple[pd.Series, RiskBasis]:
    """The risk without ground truth, and what that makes the ranking: membership (the loss when
    no membership score was measured), or for a repeated text repetition when that is larger
    (copies are evidence a unique text cannot have; a unique text is not penalised for lacking it)."""
    base = next((n for n in ("membership", "loss") if parts[n].notna().any()), "")
    names = [base] if base else []
    risk = parts[base] if base else pd.Series(np.nan, index=frame.index)
    if (parts["repetition"] > 0).any():
        names.append("repetition")
        risk = pd.concat([risk, parts["repetition"]], axis=1).max(axis=1)
    calibrated = bool(numeric_column(frame, "loss_ratio").notna().any())
    said = " or ".join(_membership_words(frame) if n == "membership" else WORDS[n] for n in names)
    said = f"the larger of {said}" if len(names) > 1 else said
    unused = ("GNQ and K_jj are shown, not used: on every run measured, the texts a model learned had "
              f"smaller GNQ, so they enter risk only where this run's ground truth ({GROUND_TRUTH}) "
              "validates them, in the direction it measures")
    if not names:
        return risk, RiskBasis("no evidence", "no evidence: no membership score, loss or copies measured, so "
                               "every text's risk is 0. " + unused + ".")
    if calibrated:
        return risk, RiskBasis("calibrated, not validated",
                               "default, calibrated by the reference model, not validated on this run: "
                               f"{said}. " + unused + ".", tuple(names), calibrated=True)
    return risk, RiskBasis("loss-only, uncalibrated",
                           "default, loss-only and uncalibrated: no reference model to compare the loss with "
                           f"and no ground truth of this run; risk is {said}. gnq extract with a reference "
                           "model (the run's first checkpoint, or a fine-tune's base) calibrates it; "
                           "never-trained texts (--non-members) validate it. " + unused + ".", tuple(names))


def _oriented(parts: dict[str, pd.Series], chosen: list[tuple[str, int]], rows: pd.Index) -> pd.Series:
    values = [parts[n][rows] if sign > 0 else 1.0 - parts[n][rows] for n, sign in chosen]
    return pd.concat(values, axis=1).mean(axis=1)


def _choose(parts: dict[str, pd.Series], y: pd.Series, rows: pd.Index) -> list[tuple[str, int]]:
    """The components (and their sign) that validate on ``rows``."""
    chosen = []
    for name, v in parts.items():
        auc = rank_auc(v[rows][y[rows]], v[rows][~y[rows]])
        if auc > VALID_AUC:
            chosen.append((name, 1))
        elif name in FREE and auc < 1 - VALID_AUC:
            chosen.append((name, -1))
    return chosen


def grouped_folds(y: pd.Series, groups: pd.Series, seed: int = 0) -> pd.Series:
    """A fold 0..FOLDS−1 per text (index of ``y``): whole copy clusters are dealt to the folds in a
    seeded random order, the positive clusters (any copy positive) first and then the rest, so
    the copies of a record share a fold and every fold gets its share of both outcomes."""
    rng = np.random.default_rng(seed)
    positive = y.groupby(groups).any()
    fold_of: dict = {}
    for side in (positive[positive].index, positive[~positive].index):
        order = rng.permutation(len(side))
        fold_of |= {side[i]: (len(fold_of) + j) % FOLDS for j, i in enumerate(order)}
    return groups.map(fold_of).astype(int)


@dataclass(frozen=True)
class _Truth:
    name: str              # "extraction" or "membership"
    words: str             # "this run's extraction outcome"
    y: pd.Series           # the outcome per row of the validation frame
    groups: pd.Series      # copy cluster per row of the validation frame
    parts: dict            # the components per row of the validation frame
    fold_key: pd.Series    # per row of the run: the key of its row in the validation frame (NaN: none)


def _extraction_truth(totals: pd.DataFrame, parts: dict[str, pd.Series]) -> _Truth | None:
    if "extracted" not in totals.columns:
        return None
    outcome = totals["extracted"].astype("boolean")
    known = outcome.notna().to_numpy()
    y = outcome[known].astype(bool)
    groups = pd.Series(groups_of(totals), index=totals.index)[y.index]
    key = pd.Series(totals.index, index=totals.index).where(known)
    return _Truth("extraction", "this run's extraction outcome", y, groups,
                  {k: v[y.index] for k, v in parts.items()}, key)


def _membership_truth(totals: pd.DataFrame, membership: pd.DataFrame | None) -> _Truth | None:
    """Members against never-trained texts (``attacks.non_members.membership_frame``): each
    member gets its copies, copy cluster and GNQ's copy count from the run's own rows."""
    if membership is None or membership.empty or "member" not in membership.columns:
        return None
    own = [c for c in ("copies", "cluster_id", "gnq_with_copy", "n_points") if c in totals.columns]
    frame = membership.drop(columns=[c for c in own if c in membership.columns]).reset_index(drop=True)
    member = frame["member"].astype("boolean").fillna(False).astype(bool)
    if own:
        by_id = totals.drop_duplicates("example_id").set_index("example_id")[own]
        joined = by_id.reindex(frame["example_id"].to_numpy()).reset_index(drop=True).astype(float)
        joined.loc[~member.to_numpy()] = np.nan  # a never-trained text is none of the run's texts
        frame = pd.concat([frame, joined], axis=1)
    y = member
    groups = pd.Series(groups_of(frame), index=frame.index)
    position = pd.Series(frame.index[member], index=frame.loc[member, "example_id"].to_numpy())
    key = totals["example_id"].map(position[~position.index.duplicated()])
    return _Truth("membership", "this run's texts against never-trained texts (--non-members)", y, groups,
                  components(frame), key)


def _validated(totals: pd.DataFrame, parts: dict[str, pd.Series], truth: _Truth,
               seed: int = 0) -> tuple[pd.Series, list[tuple[str, int]]]:
    """Each run text's risk from the components chosen on the folds its own row is not in."""
    candidates = [k for k, v in truth.parts.items() if v.notna().any() and v.nunique() > 1]
    vparts = {k: truth.parts[k] for k in candidates}
    folds = grouped_folds(truth.y, truth.groups, seed)
    fold_of_run = truth.fold_key.map(folds).fillna(-1).astype(int)  # -1: no row of its own
    risk = pd.Series(np.nan, index=totals.index)
    used: list[tuple[str, int]] = []
    for f in [*range(FOLDS), -1]:
        rows = fold_of_run.index[fold_of_run == f]
        if f >= 0 and not len(rows):
            continue
        chosen = _choose(vparts, truth.y, folds.index[folds != f])
        used += [c for c in chosen if c not in used]
        if chosen:
            risk[rows] = _oriented(parts, chosen, rows)
    return risk, used


def _words(name: str, sign: int, frame: pd.DataFrame) -> str:
    said = _membership_words(frame) if name == "membership" else WORDS[name]
    if name in FREE:
        said += (" (higher = more at risk)" if sign > 0 else
                 ", reversed (lower = more at risk, as this run's ground truth measures)")
    return said


def risk_components(totals: pd.DataFrame, membership: pd.DataFrame | None = None,
                    seed: int = 0) -> pd.DataFrame:
    """Per text (index of ``totals``): every component, ``risk``, ``gnq_percentile_valid``,
    ``gnq_sign`` (+1 / −1: GNQ entered risk in that direction, 0: not used) and ``risk_basis`` /
    ``risk_label`` (``RiskBasis``: words, label); ``attrs["risk"]`` holds ``RiskBasis.to_dict()``.
    ``membership``: members and never-trained texts (``attacks.non_members.membership_frame``),
    ground truth when the extraction outcome has too few records."""
    parts = components(totals)
    default, basis = _default(totals, parts)
    risk, gnq_sign = default, 0
    few = []
    for truth in (_extraction_truth(totals, parts), _membership_truth(totals, membership)):
        if truth is None:
            continue
        pos, neg = records(truth.y.to_numpy(), truth.groups.to_numpy())
        if min(pos, neg) < MIN_PER_OUTCOME:
            few.append(f"{truth.name}: {pos} positive and {neg} negative records, copies counted once")
            continue
        chosen_risk, used = _validated(totals, parts, truth, seed)
        if not used:
            few.append(f"{truth.name}: no component beat AUC {VALID_AUC} on the cross-validation folds")
            continue
        risk = chosen_risk.fillna(default)  # a fold where nothing validated: the default components
        gnq_sign = next((s for n, s in used if n == "gnq"), 0)
        said = ", ".join(_words(n, s, totals) for n, s in used)
        basis = RiskBasis(
            f"validated on {'extraction' if truth.name == 'extraction' else 'non-members'}",
            f"validated on {truth.words} (cross-validated, {FOLDS} folds grouped by copy cluster, so copies "
            f"of a text never choose each other's components): the mean of {said} — the components with "
            f"AUC > {VALID_AUC} on the other folds (GNQ and K_jj also below {1 - VALID_AUC:.2f}, then "
            "reversed)", tuple(n if s > 0 else f"{n} reversed" for n, s in used), truth.name,
            bool(numeric_column(totals, "loss_ratio").notna().any()))
        break
    else:
        if few:
            basis = RiskBasis(basis.label, basis.words.rstrip(".") + " (ground truth too weak to choose: "
                              + "; ".join(few) + ").", basis.components, None, basis.calibrated)
    out = pd.DataFrame({**parts, "risk": risk.fillna(0.0), "gnq_percentile_valid": parts["gnq"],
                        "gnq_sign": gnq_sign, "risk_basis": basis.words, "risk_label": basis.label},
                       index=totals.index)
    out.attrs["risk"] = basis.to_dict()
    return out
