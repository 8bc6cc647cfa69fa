-- Schema version 7: where a job's process runs and when it last reported, so a run whose process
-- died (kill -9, power loss, disk full) is shown as interrupted instead of 'running' for ever.
-- (Numbers 5 and 6 are left to migrations being written in parallel.)
ALTER TABLE runs ADD COLUMN host VARCHAR;
ALTER TABLE runs ADD COLUMN heartbeat_at TIMESTAMP;
