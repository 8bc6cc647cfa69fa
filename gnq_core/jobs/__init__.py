"""Background jobs (settings run by ``run_job`` in a process of their own), their uploads and kept
checkpoint, the demo as one: started by the dashboard and the CLI both, so no streamlit here."""

from gnq_core._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    ".demo_job": ("start_demo_job",),
    ".history": ("outcome",),
    ".jobs": ("Job", "JobConflict", "cancel_job", "list_jobs", "live_job", "new_job_id", "run_steps",
              "start_job"),
    ".uploads": ("abandoned_uploads", "check_upload_tree", "safe_relative_path", "save_uploads",
                 "touch_staging", "uploads_dir"),
})
