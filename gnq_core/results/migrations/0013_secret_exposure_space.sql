-- Schema version 13: exposure over each secret value's own randomness (attacks/exposure.py,
-- attacks/secret_exposure.py).  exposure_rank is now the value's rank among ALL values of its
-- space (its free digits redrawn, the run's template kept; NULL when estimated), and
-- exposure_candidates the random values behind an estimate (NULL when exact).  Rows attacked
-- before this version have exposure_method NULL: their exposure ranked the value among N random
-- values of its whole format (template digits redrawn too).
ALTER TABLE secret_attacks ADD COLUMN exposure_method VARCHAR;        -- 'exact' | 'estimated'
ALTER TABLE secret_attacks ADD COLUMN exposure_template VARCHAR;      -- the value, its free digits as '#'
ALTER TABLE secret_attacks ADD COLUMN exposure_space_bits DOUBLE;     -- log2 of the space's size: the ceiling
ALTER TABLE secret_attacks ADD COLUMN exposure_nodes INTEGER;         -- prefixes / values the model scored
ALTER TABLE secret_attacks ADD COLUMN exposure_fit VARCHAR;           -- how an estimate was made
ALTER TABLE secret_attacks ADD COLUMN value_copies INTEGER;           -- occurrences of the value in the run
ALTER TABLE secret_attacks ADD COLUMN reference_exposure DOUBLE;      -- the same, under the reference model
ALTER TABLE secret_attacks ADD COLUMN reference_exposure_method VARCHAR;
ALTER TABLE secret_attacks ADD COLUMN reference_exposure_rank INTEGER;
ALTER TABLE secret_attacks ADD COLUMN exposure_null_p99 DOUBLE;       -- 99th percentile of its format's null
ALTER TABLE secret_attacks ADD COLUMN exposed BOOLEAN;                -- above it and above the reference
-- The run's null: per format (kind and template), values no text of the run holds, drawn in the
-- same template and scored the same way after the prompt of one of the format's values.
CREATE TABLE secret_exposure_null (
    run_id             INTEGER NOT NULL,
    point              INTEGER NOT NULL,
    kind               VARCHAR NOT NULL,
    template           VARCHAR NOT NULL,
    value              VARCHAR NOT NULL,
    prompt_example_id  INTEGER,
    exposure           DOUBLE,              -- NULL: not measurable (non-finite scores)
    exposure_method    VARCHAR,
    exposure_rank      INTEGER,
    exposure_nodes     INTEGER,
    exposure_fit       VARCHAR,
    rule               VARCHAR NOT NULL,
    code_version       VARCHAR,
    created_at         TIMESTAMP NOT NULL,
    PRIMARY KEY (run_id, point, kind, template, value)
);
