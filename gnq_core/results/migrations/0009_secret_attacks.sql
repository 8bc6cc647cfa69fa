-- Schema version 9: the secret-targeted attack (attacks/secret_attack.py).  One row per
-- secret-like value of a text attacked at one checkpoint: the value's character span, how many
-- of its letters and digits the audited model (and the reference) wrote when prompted with the
-- text up to it, and its exposure among random values of its format (NULL: not digits only).
CREATE TABLE secret_attacks (
    run_id                     INTEGER NOT NULL,
    point                      INTEGER NOT NULL,
    example_id                 INTEGER NOT NULL,
    secret_start               INTEGER NOT NULL,  -- characters of the value in the text
    secret_end                 INTEGER NOT NULL,
    kind                       VARCHAR NOT NULL,
    value                      VARCHAR NOT NULL,
    prompt_tokens              INTEGER NOT NULL,
    value_tokens               INTEGER NOT NULL,
    generated                  VARCHAR,           -- what the audited model wrote at the value's tokens
    chars                      INTEGER NOT NULL,  -- letters and digits of the value
    chars_reproduced           INTEGER NOT NULL,
    reproduced                 BOOLEAN NOT NULL,  -- all of them
    reference_generated        VARCHAR,           -- NULL: no reference
    reference_chars_reproduced INTEGER,
    extracted                  BOOLEAN NOT NULL,  -- reproduced, and the reference does not
    exposure                   DOUBLE,            -- bits: log2 N - log2 rank
    exposure_rank              INTEGER,
    exposure_candidates        INTEGER,           -- N
    rule                       VARCHAR NOT NULL,
    code_version               VARCHAR,
    created_at                 TIMESTAMP NOT NULL,
    PRIMARY KEY (run_id, point, example_id, secret_start)
);
