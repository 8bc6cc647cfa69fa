-- Schema version 12: how each GNQ batch's kernel was formed.  'exact': K over the
-- batch's texts exactly (a micro-batch, a post-hoc batch, or every micro-batch of an optimizer
-- step's accumulation window); 'sketch': the Gram of seeded random projections of the
-- per-example gradients (engine/sketch.py), with the sketch dimension per matrix and the seed.
-- Rows written before this version read 'exact': every producer then formed K exactly.
ALTER TABLE batches ADD COLUMN gnq_mode VARCHAR DEFAULT 'exact';
ALTER TABLE batches ADD COLUMN sketch_k INTEGER;
ALTER TABLE batches ADD COLUMN sketch_seed BIGINT;
