-- Schema version 8: reference-free membership signals per text and point, from the forward pass
-- that also gives the loss (attacks/membership.py `token_signals`):
--   min_k       Min-K% (Shi et al. 2024): mean log p of the 20% least likely tokens (nats).
--   min_k_plus  Min-K%++ (Zhang et al. 2024): the same over (log p(x_t) − μ_t)/σ_t, μ_t and σ_t the
--               mean and standard deviation of log p under the model's own next-token distribution.
-- Higher = more likely a training member.  NULL: a run written before this version (or a text
-- with no predicted token).  zlib ratio and the gradient norm derive from stored columns
-- (loss, n_tokens, text; sqrt(self_influence)), so they get none.
ALTER TABLE scores ADD COLUMN min_k DOUBLE;
ALTER TABLE scores ADD COLUMN min_k_plus DOUBLE;
