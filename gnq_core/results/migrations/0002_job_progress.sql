-- Schema version 2: live progress of a running job, so a reader (the dashboard) can show
-- how far a job is without waiting for a checkpoint to finish; and the process that owns it.
ALTER TABLE runs ADD COLUMN progress_done INTEGER DEFAULT 0;
ALTER TABLE runs ADD COLUMN progress_total INTEGER DEFAULT 0;
ALTER TABLE runs ADD COLUMN progress_note VARCHAR;
ALTER TABLE runs ADD COLUMN pid INTEGER;
