"""Pipelines: the jobs (train with in-run GNQ, audit checkpoints, the attacks of
``gnq_core.attacks``, the demo), one way in (``run_job``), the dashboard's background jobs and
uploads, and the Hugging Face Trainer integration."""

from gnq_core._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "gnq_core.attacks.defaults": ("DEFAULT_ATTACK_BATCH", "DEFAULT_PREFIX", "DEFAULT_REFERENCE",
                                  "DEFAULT_SUFFIX", "DEFAULT_SECRET_CANDIDATES", "DEFAULT_THRESHOLD",
                                  "FIRST_CHECKPOINT", "MAX_SECRET_CANDIDATES", "MIN_SECRET_CANDIDATES"),
    ".audit": ("run_audit",),
    ".companion_plan": ("check_companion_memory",),
    ".estimate": ("Estimate", "duration", "estimate_audit", "tokens_per_text"),
    ".estimate_probe": ("estimate_lines", "measure_estimate", "total_seconds"),
    "gnq_core.attacks.run": ("run_extraction",),
    "gnq_core.attacks.extraction": ("AttackRule",),
    ".hf_callback": ("GNQConfig", "GNQTrainer", "lm_collator"),
    ".jobs": ("Job", "cancel_job", "list_jobs", "new_job_id", "start_job"),
    "gnq_core.attacks.non_members": ("ground_truth_of", "membership_frame", "membership_of"),
    ".run": ("run_job",),
    ".settings": ("AuditJob", "AuditSettings", "DemoJob", "ExtractJob", "JobSettings", "TrainJob",
                  "TrainSettings", "job_dict", "job_from_dict"),
    ".train": ("run_training",),
    ".uploads": ("abandoned_uploads", "check_upload_tree", "safe_relative_path", "save_uploads",
                 "touch_staging", "uploads_dir"),
    "gnq_core.progress": ("JobProgress", "Reporter", "job_seconds_left", "seconds_left"),
    "gnq_core.runtime": ("default_threads",),
})
