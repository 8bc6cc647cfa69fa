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
least ``MIN_PER_OUTCOME`` independent records on each side, copies counted once): a component
enters only on evidence that survives the null.  Every direction tried is one hypothesis (the
membership scores, repetition and loss in their stated direction; GNQ and K_jj in both, so two
each), and on the rows of each fold's *other* folds (``FOLDS`` folds grouped by copy cluster) each
gets a one-sided p-value that its AUC exceeds 0.5: the cluster bootstrap's standard error over
records (copies drawn whole, ``RESAMPLES`` resamples), read on a t with the effective records'
degrees of freedom (the small-sample widening ``clusters.expanded_level`` uses); Holm's step-down
over all the hypotheses keeps the chance that any noise component enters at most ``ALPHA``.  A
component enters when *every* fold chose it, in one sign; then each text's risk is the mean of
those components.  The ranking's out-of-fold AUC (each fold's texts ranked by what the other folds
chose) with its cluster-bootstrap interval stands beside "validated".  Nothing passes: the default
stands, and the basis says why.  The extraction outcome is used when it has enough records (it is
the event the risk predicts); else the members against the never-trained texts.

On null data (no component informative, 10 or 50 positive records) GNQ or K_jj enters, and a run
is called validated, in under 5% of runs (tests/analysis/test_risk_null.py); the rule it replaced (AUC >
0.55 on the training folds, any fold) did so in 86-100%.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from gnq_core.analysis.clusters import (
    MIN_RECORDS,
    cluster_weights,
    effective_records,
    groups_of,
    numeric_column,
    records,
)
from gnq_core.analysis.predictive import interval, metrics_matrix

FOLDS = 5
MIN_PER_OUTCOME = MIN_RECORDS  # independent records on each side for the run's own ground truth to choose
ALPHA = 0.05      # chance that any component without signal enters risk (Holm over the directions tried)
RESAMPLES = 400   # cluster-bootstrap resamples behind each standard error (a p of a few % needs no more)
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
    auc: float | None = None           # validated: the ranking's out-of-fold AUC on the ground truth
    auc_interval: tuple[float, float] | None = None  # its 95% cluster-bootstrap interval

    @property
    def shown(self) -> str:
        """The label with the out-of-fold AUC beside "validated" (what the pages and reports show)."""
        if self.auc is None:
            return self.label
        lo, hi = self.auc_interval or (float("nan"), float("nan"))
        return f"{self.label} (out-of-fold AUC {self.auc:.2f} [{lo:.2f}, {hi:.2f}])"

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
                "ground_truth": self.ground_truth, "calibrated": self.calibrated, "auc": self.auc,
                "auc_interval": list(self.auc_interval) if self.auc_interval else None}

    @classmethod
    def from_dict(cls, d: dict) -> RiskBasis:
        """Also a basis written before the AUC was kept (no ``auc``: none shown)."""
        band = d.get("auc_interval")
        return cls(d["label"], d["words"], tuple(d["components"]), d["ground_truth"], d["calibrated"],
                   d.get("auc"), tuple(band) if band else None)


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
    unused = ("this default orders what the model was trained on (membership evidence), not what could "
              "leak: against counterfactual memorisation on SmolLM2 it ranked the records the model "
              "memorised below the others (top-decile AUC 0.37, docs/evidence.md). GNQ and K_jj are shown, "
              "not used by default: on the membership runs measured a learned text had smaller GNQ and K_jj, "
              "on the counterfactual and extraction studies a memorised one larger (docs/verdict.md: for "
              "could-it-leak the studies favour K_jj), so they enter risk only "
              f"where this run's ground truth ({GROUND_TRUTH}) validates them, in the direction it measures")
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


def hypotheses(names: list[str]) -> list[tuple[str, int]]:
    """Every (component, sign) tried: a stated direction once, GNQ and K_jj both ways."""
    return [(n, sign) for n in names for sign in ((1, -1) if n in FREE else (1,))]


def direction_tests(parts: dict[str, pd.Series], y: pd.Series, groups: pd.Series, rows: pd.Index,
                    tried: list[tuple[str, int]], seed: int = 0,
                    ) -> dict[tuple[str, int], tuple[float, float]]:
    """(AUC in that direction, one-sided p-value that it exceeds 0.5) per hypothesis on ``rows``
    (module docstring): one cluster bootstrap shared by every component, vectorised."""
    from scipy import stats

    labels, g = y[rows].to_numpy(dtype=bool), groups[rows].to_numpy()
    weights = cluster_weights(labels, g, RESAMPLES, seed)
    out: dict[tuple[str, int], tuple[float, float]] = {}
    for name in dict.fromkeys(n for n, _ in tried):
        v = parts[name][rows].to_numpy(dtype=float)
        ok = np.isfinite(v)
        lab = labels[ok]
        k = effective_records(lab, g[ok]) if lab.any() and (~lab).any() else 0.0
        if k < 2:
            out |= {(name, s): (float("nan"), 1.0) for n, s in tried if n == name}
            continue
        auc = float(metrics_matrix(v[ok], lab, None, (), ())["auc"][0])
        boot = metrics_matrix(v[ok], lab, weights[:, ok], (), ())["auc"]
        se = float(np.nanstd(boot, ddof=1))
        for n, sign in tried:
            if n != name:
                continue
            directed = auc if sign > 0 else 1.0 - auc
            z = (directed - 0.5) / se if se > 0 else (np.inf if directed > 0.5 else -np.inf)
            out[(name, sign)] = (directed, float(stats.t.sf(z * np.sqrt((k - 1) / k), k - 1)))
    return out


def holm(p_values: dict[tuple[str, int], float], alpha: float = ALPHA) -> list[tuple[str, int]]:
    """The hypotheses Holm's step-down rejects at family-wise level ``alpha``, smallest p first."""
    order = sorted(p_values, key=lambda h: p_values[h])
    m = len(order)
    chosen = []
    for i, h in enumerate(order):
        if p_values[h] > alpha / (m - i):
            break
        chosen.append(h)
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


def _extraction_truth(totals: pd.DataFrame, parts: dict[str, pd.Series]) -> _Truth | None:
    if "extracted" not in totals.columns:
        return None
    outcome = totals["extracted"].astype("boolean")
    known = outcome.notna().to_numpy()
    y = outcome[known].astype(bool)
    groups = pd.Series(groups_of(totals), index=totals.index)[y.index]
    return _Truth("extraction", "this run's extraction outcome", y, groups,
                  {k: v[y.index] for k, v in parts.items()})


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
    return _Truth("membership", "this run's texts against never-trained texts (--non-members)", y, groups,
                  components(frame))


@dataclass(frozen=True)
class _Validation:
    used: list[tuple[str, int]]        # the components every fold chose, in one sign
    per_fold: list[list[tuple[str, int]]]
    tried: list[tuple[str, int]]
    auc: float                         # the out-of-fold ranking's AUC on the ground truth
    auc_interval: tuple[float, float]


def _validated(truth: _Truth, seed: int = 0) -> _Validation:
    """Holm-tested components on each fold's other folds (module docstring); a component is used
    when every fold chose it.  The out-of-fold AUC ranks each fold's rows by its own fold's choice
    (½ where that fold chose nothing)."""
    candidates = [k for k, v in truth.parts.items() if v.notna().any() and v.nunique() > 1]
    tried = hypotheses(candidates)
    folds = grouped_folds(truth.y, truth.groups, seed)
    per_fold: list[list[tuple[str, int]]] = []
    for f in range(FOLDS):
        rows = folds.index[folds != f]
        tests = direction_tests(truth.parts, truth.y, truth.groups, rows, tried, seed + f)
        per_fold.append(holm({h: p for h, (_, p) in tests.items()}))
        if not per_fold[-1]:  # no fold without it can use it: the rest need not be tested
            break
    used = [h for h in per_fold[0] if all(h in chosen for chosen in per_fold)] if per_fold else []
    oof = pd.Series(0.5, index=truth.y.index)
    for f, chosen in enumerate(per_fold):
        rows = folds.index[folds == f]
        if chosen and len(rows):
            oof[rows] = _oriented(truth.parts, chosen, rows).fillna(0.5)
    labels, groups = truth.y.to_numpy(dtype=bool), truth.groups.to_numpy()
    score = oof.to_numpy(dtype=float)
    auc = float(metrics_matrix(score, labels, None, (), ())["auc"][0])
    boot = metrics_matrix(score, labels, cluster_weights(labels, groups, 1000, seed), (), ())["auc"]
    return _Validation(used, per_fold, tried, auc, interval(boot, records=effective_records(labels, groups)))


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
        v = _validated(truth, seed)
        if not v.used:
            few.append(f"{truth.name}: no component's AUC was above 0.5 on every fold's other folds with "
                       f"{1 - ALPHA:.0%} confidence after Holm's correction for the {len(v.tried)} "
                       "directions tried")
            continue
        used = v.used
        risk = _oriented(parts, used, totals.index).fillna(default)
        gnq_sign = next((s for n, s in used if n == "gnq"), 0)
        said = ", ".join(_words(n, s, totals) for n, s in used)
        lo, hi = v.auc_interval
        basis = RiskBasis(
            f"validated on {'extraction' if truth.name == 'extraction' else 'non-members'}",
            f"validated on {truth.words}: the mean of {said} — the components whose AUC beat 0.5 on the "
            f"other folds of every one of {FOLDS} folds (grouped by copy cluster, so copies of a text never "
            f"choose each other's components), each with a one-sided cluster-bootstrap p-value under "
            f"Holm's correction for the {len(v.tried)} directions tried (family-wise {ALPHA:.0%}; GNQ and "
            f"K_jj tried both ways). Out-of-fold AUC of this ranking: {v.auc:.2f} [{lo:.2f}, {hi:.2f}] "
            "(95%, records resampled, copies together)",
            tuple(n if s > 0 else f"{n} reversed" for n, s in used), truth.name,
            bool(numeric_column(totals, "loss_ratio").notna().any()), v.auc, v.auc_interval)
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
