"""Sources: checkpoints, datasets, tokenisation and tiny models built from config."""
