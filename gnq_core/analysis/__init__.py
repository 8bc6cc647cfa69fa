"""Analysis: pure functions from the store's frames to tables and figures (the verdict, predictive
power, summaries, the 2D regression, the HTML report); it trains nothing."""

from gnq_core._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "": ("evidence", "gnq_nature", "length_control", "predictive", "regression2d", "run_report"),
    ".compare": ("compare_runs",),
    ".conversation": ("conversation_line", "conversation_upto", "is_chat", "leaked_marks", "turns_html"),
    ".findings": ("action", "grouped", "summary", "texts_table_html"),
    ".counts": ("RunCounts", "run_counts"),
    ".exposures": ("EXPOSURE_SHOWN", "SHOWN_HELP", "VALUES_HELP", "exposed", "exposure_summary",
                   "fdr_sentence", "null_sentence", "value_exposure_sentence", "values_table"),
    ".flagging": ("GNQ_ORDER", "VERDICT_ORDER", "TextFilter", "flagged"),
    ".html_report": ("build_report", "check_writable", "write_report"),
    ".predictive_figures": ("roc_figure",),
    ".remediation": ("ACT_ON", "DEFAULT_ACT_ON", "Remediation", "RemediationError", "RemediationOptions",
                     "needs_data", "remediate_run"),
    ".risk": ("RiskBasis", "risk_components"),
    ".signals": ("gnq_provenance", "signal_frame"),
    ".summaries": ("group_auc", "group_separation", "nearest_by_trajectory", "quantile_bins",
                   "targeted_attack_table", "token_alignment", "top_bottom"),
    ".value_compare": ("VALUE_CHANGE_HELP", "changes_summary", "masked", "value_changes"),
    ".verdict": ("COLUMN_HELP", "LEAKED", "PARTLY", "STATUSES", "VERDICT_COLUMNS", "flag", "rank_texts",
                 "value_outcome"),
})
