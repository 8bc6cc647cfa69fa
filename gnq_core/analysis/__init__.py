"""Analysis: per-run summaries, the 2D regression view and the paper's studies."""
