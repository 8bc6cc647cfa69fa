-- Schema version 6: what a user needs to act on a flagged text.
-- Per text, properties of the text within its dataset (sources/copies.py, sources/secrets.py):
-- its number of copies (1 = unique; exact or near duplicates) and their cluster, and the first
-- secret-like match (kinds found, character span, matched string). NULL: not computed yet.
ALTER TABLE examples ADD COLUMN copies INTEGER;
ALTER TABLE examples ADD COLUMN cluster_id INTEGER;
ALTER TABLE examples ADD COLUMN secret VARCHAR;
ALTER TABLE examples ADD COLUMN secret_start INTEGER;
ALTER TABLE examples ADD COLUMN secret_end INTEGER;
ALTER TABLE examples ADD COLUMN secret_match VARCHAR;
-- The calibrated attack (attacks/extraction.py): exactly suffix_tokens tokens compared after
-- the prefix (NULL: the rest of the text, as attacks before this version did), and the
-- reference model's match fraction on the same prefix and suffix (NULL: no reference).
ALTER TABLE extractions ADD COLUMN suffix_tokens INTEGER;
ALTER TABLE extractions ADD COLUMN reference_match DOUBLE;
ALTER TABLE extractions ADD COLUMN reference_generated VARCHAR;
