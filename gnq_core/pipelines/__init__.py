"""Pipelines: the jobs (train with in-run GNQ, audit checkpoints, the attacks of
``gnq_core.attacks``, the demo) and one way in (``run_job``); the background jobs that run them for the
dashboard are ``gnq_core.jobs``, the Hugging Face and TRL trainers ``gnq_core.integrations``."""

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
    "gnq_core.attacks.non_members": ("ground_truth_of", "membership_frame", "membership_of"),
    ".options": ("COMPANION_CHOICES", "audit_job", "companion_choice", "companions_option"),
    ".preflight": ("AuditInputs", "audit_inputs", "extract_options"),
    ".run": ("run_job",),
    ".settings": ("AuditJob", "AuditSettings", "DemoJob", "ExtractJob", "JobSettings", "TrainJob",
                  "TrainSettings", "job_dict", "job_from_dict"),
    ".train": ("run_training",),
    "gnq_core.common.progress": ("JobProgress", "Reporter", "job_seconds_left", "seconds_left"),
    "gnq_core.common.runtime": ("default_threads",),
})
