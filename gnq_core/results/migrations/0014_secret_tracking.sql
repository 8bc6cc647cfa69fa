-- Schema version 14: secret values probed while training (integrations/tracking.py).  One row per
-- secret-like value of a training text probed at one optimizer step under the weights of that
-- step: how many of its letters and digits greedy decoding wrote, whether all of them (leaked),
-- in part (partly), its exposure and the null's 99th percentile (no reference model while
-- training: exposed = above the null alone).  Loaded by gnq ingest from the shards folder's
-- secret_tracking.parquet.
CREATE TABLE secret_tracking (
    run_id            INTEGER NOT NULL,
    step              INTEGER NOT NULL,
    example_id        INTEGER NOT NULL,
    kind              VARCHAR NOT NULL,
    value             VARCHAR NOT NULL,
    chars             INTEGER NOT NULL,
    chars_reproduced  INTEGER NOT NULL,
    leaked            BOOLEAN NOT NULL,
    partly            BOOLEAN NOT NULL,
    exposure          DOUBLE,
    exposure_method   VARCHAR,
    null_p99          DOUBLE,
    exposed           BOOLEAN,
    seconds           DOUBLE            -- the whole probe's seconds at this step
);
