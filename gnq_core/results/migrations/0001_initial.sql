-- GNQ Audit store, schema version 1.
-- A run is one audit (post-hoc, over checkpoints) or one audited training (in-run, over epochs).
-- A "point" is one position along the run's trajectory: a checkpoint, or an epoch of training.

CREATE SEQUENCE run_ids START 1;

CREATE TABLE runs (
    run_id          INTEGER PRIMARY KEY DEFAULT nextval('run_ids'),
    name            VARCHAR NOT NULL UNIQUE,
    kind            VARCHAR NOT NULL,            -- 'audit' | 'train'
    status          VARCHAR NOT NULL,            -- 'running' | 'done' | 'failed' | 'cancelled'
    message         VARCHAR,                     -- last error or note
    created_at      TIMESTAMP NOT NULL,
    updated_at      TIMESTAMP NOT NULL,
    -- what produced the results (recorded with every run)
    lam             DOUBLE NOT NULL,
    loss_convention VARCHAR NOT NULL,
    batch_size      INTEGER NOT NULL,
    seed            INTEGER NOT NULL,
    max_length      INTEGER NOT NULL,
    model_path      VARCHAR NOT NULL,            -- checkpoint folder (audit) or run folder (train)
    model_hash      VARCHAR,                     -- init checkpoint hash (train --init) or NULL
    dataset_path    VARCHAR NOT NULL,
    dataset_hash    VARCHAR NOT NULL,
    n_examples      INTEGER NOT NULL,
    code_version    VARCHAR NOT NULL,
    device          VARCHAR,
    dtype           VARCHAR,
    settings        JSON                         -- everything else (lr, epochs, preset, columns...)
);

CREATE TABLE examples (
    run_id     INTEGER NOT NULL,
    example_id INTEGER NOT NULL,                 -- row number in the dataset (after dropping empty rows)
    text       VARCHAR NOT NULL,
    grp        VARCHAR,
    n_tokens   INTEGER NOT NULL,                 -- after truncation to max_length
    PRIMARY KEY (run_id, example_id)
);

CREATE TABLE points (
    run_id      INTEGER NOT NULL,
    point       INTEGER NOT NULL,                -- 0, 1, 2... in trajectory order
    label       VARCHAR NOT NULL,                -- e.g. 'epoch-3', 'checkpoint-500'
    kind        VARCHAR NOT NULL,                -- 'checkpoint' | 'epoch'
    path        VARCHAR,                         -- checkpoint folder (for extraction)
    model_hash  VARCHAR,
    status      VARCHAR NOT NULL,                -- 'pending' | 'done'
    seconds     DOUBLE,
    finished_at TIMESTAMP,
    PRIMARY KEY (run_id, point)
);

CREATE TABLE batches (
    run_id      INTEGER NOT NULL,
    point       INTEGER NOT NULL,
    batch_index INTEGER NOT NULL,
    step        INTEGER,                         -- optimizer step (train runs)
    size        INTEGER NOT NULL,
    condition   DOUBLE,                          -- condition number of K + λI
    finite      BOOLEAN NOT NULL,                -- false: non-finite loss/gradient, no GNQ stored
    seconds     DOUBLE,
    PRIMARY KEY (run_id, point, batch_index)
);

CREATE TABLE scores (
    run_id         INTEGER NOT NULL,
    point          INTEGER NOT NULL,
    example_id     INTEGER NOT NULL,
    batch_index    INTEGER NOT NULL,
    step           INTEGER,
    gnq            DOUBLE,                       -- NULL when the batch was not finite
    loss           DOUBLE,
    self_influence DOUBLE,                       -- K_jj = ‖g_j‖²
    PRIMARY KEY (run_id, point, example_id)
);

CREATE TABLE extractions (
    run_id         INTEGER NOT NULL,
    point          INTEGER NOT NULL,             -- the checkpoint attacked
    example_id     INTEGER NOT NULL,
    prefix_tokens  INTEGER NOT NULL,
    threshold      DOUBLE NOT NULL,
    n_continuation INTEGER NOT NULL,
    match_fraction DOUBLE,                       -- NULL: text too short for the prefix
    success        BOOLEAN,
    prefix_text    VARCHAR,
    generated_text VARCHAR,
    target_text    VARCHAR,
    code_version   VARCHAR NOT NULL,
    created_at     TIMESTAMP NOT NULL,
    PRIMARY KEY (run_id, point, example_id, prefix_tokens)
);
