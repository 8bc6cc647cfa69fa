-- Schema version 3: the attack's tokens, one string per token, so the dashboard can align the
-- model's continuation with the original token by token without loading a tokenizer.
ALTER TABLE extractions ADD COLUMN target_tokens VARCHAR[];
ALTER TABLE extractions ADD COLUMN generated_tokens VARCHAR[];
