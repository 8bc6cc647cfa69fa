"""The dashboard's background jobs: a job file of validated settings run by ``run_job`` in a
process of its own (``jobs``), the uploads it audits (``uploads``), the checkpoint it keeps
(``kept``) and the demo as a job (``demo_job``).  Above the pipelines and below the CLI and the
dashboard, which both start jobs: nothing here imports streamlit."""

from gnq_core._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    ".demo_job": ("start_demo_job",),
    ".jobs": ("Job", "cancel_job", "list_jobs", "new_job_id", "run_steps", "start_job"),
    ".uploads": ("abandoned_uploads", "check_upload_tree", "safe_relative_path", "save_uploads",
                 "touch_staging", "uploads_dir"),
})
