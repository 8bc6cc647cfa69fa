-- Schema version 4: per-example scores that are not GNQ and not tied to one checkpoint, e.g.
-- counterfactual memorization from models trained on random subsets (gnq study common-knowledge).
-- One row per (run, example, metric); `settings` records what produced the value.
CREATE TABLE example_metrics (
    run_id     INTEGER NOT NULL,
    example_id INTEGER NOT NULL,
    metric     VARCHAR NOT NULL,
    value      DOUBLE,                           -- NULL when it could not be computed
    settings   JSON,
    created_at TIMESTAMP NOT NULL,
    PRIMARY KEY (run_id, example_id, metric)
);
