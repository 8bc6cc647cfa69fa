"""One entry per per-text signal: its column, the label every page and report shows, its
direction (fixed by what the score is meant to measure, never by the data), its number format,
its help and where it is stored.

The predictive table (analysis/predictive.py), the column help (analysis/verdict.py's
``COLUMN_HELP``), the dashboard's tables and the drill-down's numbers read these entries; adding a
signal is one ``Signal`` in ``SIGNALS`` plus its tests.
"""

from __future__ import annotations

from dataclasses import dataclass

# Where a signal's values live in the store (results/migrations/): a column of ``scores``, per text
# and point; one of the attack's tables; or derived when the run's totals are read.
SCORES, ATTACK, DERIVED, VERDICT = ("scores (per text and point)", "attack_results (per text and attack)",
                                    "derived from stored columns when the run is read", "the verdict")


@dataclass(frozen=True)
class Signal:
    column: str
    label: str
    higher_means_extracted: bool  # the direction: a higher value = more likely leaked / a member
    meaning: str                  # one line, for the predictive table
    help: str                     # what the value and its scale mean, for tooltips and the export's docs
    fmt: str = "%.3g"             # printf format of a table cell
    stored: str = DERIVED
    predictive: bool = True       # a row of the predictive-power table

    @property
    def python_format(self) -> str:
        """``fmt`` for ``format()``: "%.3g" → ".3g"."""
        return self.fmt.removeprefix("%")


_GNQ = ("GNQ = g_jᵀ(Σ_{k≠j} g_k g_kᵀ + λI)⁻¹ g_j: how much of the text's gradient its batch companions "
        "cannot explain. About 1 or less: explained (a copy in the batch gives ≈ 1); large (up to ‖g‖²/λ): "
        "its batch does not explain its gradient, which on the runs measured did not mark what a model "
        "memorised beyond length, loss, copies and K_jj.")
SIGNALS: tuple[Signal, ...] = (
    Signal("risk", "combined verdict (risk)", True,
           "the verdict's memorisation risk before any attack (calibrated membership and copies; GNQ or K_jj "
           "where this run's ground truth validates them)",
           "Memorisation risk, 0-1, before any attack, from what points the right way on evidence: the "
           "calibrated membership percentile (loss ratio to the reference, zlib ratio, Min-K%++), or for a "
           "repeated text 1 − 1/copies where larger. Where this run's ground truth (extraction, or "
           "--non-members) validates components, the mean of those, GNQ and K_jj included in the "
           "direction it measures. 0.9 = stronger evidence than for 90% of this run's texts. Without a "
           "reference model or ground truth: loss-only and uncalibrated (the page says which).",
           fmt="%.2f", stored=VERDICT),
    Signal("gnq_total", "GNQ_total", True, "GNQ summed over the run's checkpoints or epochs",
           f"GNQ summed over the run's checkpoints. {_GNQ} Compare within a run: see gnq_percentile.",
           stored=DERIVED + " (sum of scores.gnq)"),
    Signal("gnq_max", "GNQ_max", True, "the largest GNQ over the run's points",
           "The largest GNQ of the text over the checkpoints (≈ 1 or less: explained by its batch).",
           stored=DERIVED + " (max of scores.gnq)"),
    Signal("gnq_last", "GNQ_last", True, "GNQ at the last point",
           "GNQ at the last checkpoint (≈ 1 or less: explained by its batch).", stored=SCORES),
    Signal("gnq_mean", "GNQ_mean", True, "mean GNQ over the run's points",
           "Mean GNQ over the checkpoints (≈ 1 or less: explained by its batch).",
           stored=DERIVED + " (mean of scores.gnq)", predictive=False),
    Signal("gnq_inrun_total", "GNQ in-run (accumulated)", True,
           "GNQ summed over every epoch of the training run that produced these checkpoints",
           "GNQ summed over every epoch of the training run that produced these checkpoints (in-run "
           "GNQ, recorded while it trained).", stored=SCORES),
    Signal("loss_last", "loss", False, "mean next-token loss at the attacked point; low = fits the text",
           "Mean next-token loss at the last checkpoint (nats per token); low alone often just means "
           "an easy text.", fmt="%.3f", stored=SCORES),
    Signal("loss_ratio", "loss ratio", False, "loss / the reference model's loss; low = learned beyond it",
           "Loss under the audited model / loss under the reference: 1 = learned no more than the "
           "reference; 0.25 = loss 4× below it. Lower = more memorised.", stored=ATTACK),
    Signal("zlib_ratio", "zlib ratio", False, "model bits / zlib bits; low = predicted beyond redundancy",
           "Bits the model needs for the text / bits zlib needs. Lower = the model predicts it far "
           "better than its surface redundancy explains.", stored=ATTACK),
    Signal("min_k_plus", "Min-K%++", True, "Min-K% of each token's log-prob standardised by the mean and std "
           "of log-prob under the model's own next-token distribution (Zhang et al. 2024); high = member",
           "Min-K%++ (Zhang et al. 2024): Min-K% of each token's log-probability standardised by the "
           "mean and spread of the model's own prediction there. Higher = more likely a training "
           "member; needs no reference model.", fmt="%.2f", stored=SCORES),
    Signal("min_k_prob", "Min-20% log p", True, "mean log-prob of the 20% least likely tokens; high = member",
           "Min-K% prob (Shi et al. 2024) at K = 20%: the mean log-probability of the 20% least likely "
           "tokens (nats). Closer to 0 = more likely a training member.", fmt="%.2f", stored=ATTACK),
    Signal("self_influence_last", "gradient norm² (K_jj)", True,
           "the gradient norm squared ‖g‖² (self-influence K_jj) at the attacked point",
           "K_jj = ‖g_j‖², the text's gradient norm squared at the last checkpoint: how hard "
           "the text pulls on the weights. Shown, not used in risk unless this run's ground "
           "truth validates it; compare within a run.", stored=SCORES),
    Signal("counterfactual_memorization", "counterfactual memorization", True,
           "accuracy with the text in training minus without it (subset models)",
           "Accuracy on the text of models trained with it minus models trained without it (subset "
           "models of a counterfactual study).", stored="a study's results"),
    Signal("copies", "copies", True, "how many texts are this text or a near copy of it",
           "How many texts of the dataset are this text or a near copy of it (1 = unique; word "
           "3-shingle Jaccard ≥ 0.8).", fmt="%.0f", stored="text_labels"),
    Signal("n_tokens", "text length (tokens)", False, "a short text has a short continuation to reproduce",
           "The text's length in tokens.", fmt="%.0f", stored="examples"),
)
SIGNAL_BY_COLUMN: dict[str, Signal] = {s.column: s for s in SIGNALS}


def signal(column: str) -> Signal:
    """The catalog's entry for a signal column (KeyError naming it when there is none)."""
    try:
        return SIGNAL_BY_COLUMN[column]
    except KeyError:
        raise KeyError(f"no signal {column!r} in the catalog (gnq_core/catalog/signals.py)") from None
