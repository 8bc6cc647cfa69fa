"""Sources: what an audit reads — text files, checkpoints and models, tokens, copies and
secret-like content — each checked, a bad one refused in one line naming the file."""

from gnq_core._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    ".adapters": ("Adapters", "check_adapter", "find_adapter_checkpoints"),
    ".checkpoints.checks": ("check_checkpoint",),
    ".checkpoints.config": ("max_positions",),
    ".checkpoints.errors": ("CheckpointError",),
    ".checkpoints.files": ("CheckpointRef", "checkpoint_hash", "parameter_count"),
    ".checkpoints.load": ("load_checkpoint",),
    ".checkpoints.save": ("save_checkpoint",),
    ".checkpoints.series": ("find_checkpoints",),
    ".chat": ("DATA_FORMATS", "TRAIN_ON", "ChatDataset", "ChatLayout", "detect_format", "load_chat",
              "load_data", "trained_default"),
    ".copies": ("find_copies",),
    ".datasets": ("SUFFIXES", "DatasetError", "TextDataset", "dataset_columns", "load_texts"),
    ".limits": ("LimitError",),
    ".links": ("LinkError", "check_link"),
    ".memory_plan": ("DEFAULT_BATCH_CAP", "MemoryPlan", "check_plan", "default_batch_size"),
    ".models": ("PRESETS", "build_model", "train_tokenizer"),
    ".secrets": ("find_secrets", "secret_labels"),
})
