"""Pipelines: in-run training, post-hoc audits, the extraction attack, distributed and Trainer runs, jobs."""
