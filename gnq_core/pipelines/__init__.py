"""Pipelines: the jobs (train with in-run GNQ, audit checkpoints, the extraction attack, the
demo), one way in (``run_job``), the dashboard's background jobs and uploads.  The Hugging Face
and TRL trainers are ``gnq_core.integrations``."""

from gnq_core._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    ".attack_defaults": ("DEFAULT_ATTACK_BATCH", "DEFAULT_PREFIX", "DEFAULT_REFERENCE", "DEFAULT_SUFFIX",
                         "DEFAULT_SECRET_CANDIDATES", "DEFAULT_THRESHOLD", "FIRST_CHECKPOINT",
                         "MAX_SECRET_CANDIDATES", "MIN_SECRET_CANDIDATES"),
    ".audit": ("run_audit",),
    ".companion_plan": ("check_companion_memory",),
    ".estimate": ("Estimate", "duration", "estimate_audit", "tokens_per_text"),
    ".estimate_probe": ("estimate_lines", "measure_estimate", "total_seconds"),
    ".attacks.run": ("run_extraction",),
    ".extraction": ("AttackRule",),
    ".jobs": ("Job", "cancel_job", "list_jobs", "new_job_id", "start_job"),
    ".non_members": ("ground_truth_of", "membership_frame", "membership_of"),
    ".run": ("run_job",),
    ".settings": ("AuditJob", "AuditSettings", "DemoJob", "ExtractJob", "JobSettings", "TrainJob",
                  "TrainSettings", "job_dict", "job_from_dict"),
    ".train": ("run_training",),
    ".uploads": ("abandoned_uploads", "check_upload_tree", "safe_relative_path", "save_uploads",
                 "touch_staging", "uploads_dir"),
    "gnq_core.progress": ("JobProgress", "Reporter", "job_seconds_left", "seconds_left"),
    "gnq_core.runtime": ("default_threads",),
})
