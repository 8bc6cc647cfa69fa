"""Hugging Face causal-LM checkpoint folders, one module a concept (docs/DESIGN.md §5 lists them):
``errors``, ``files``, ``formats``, ``config``, ``values``, ``tokenizer``, ``checks``, ``load``,
``save``, ``series``; ``gnq_core.sources`` exports the public names.

Checkpoint folders are UNTRUSTED input: nothing here runs code from them. Remote code is never
trusted, nothing is fetched from the hub, safetensors weights are preferred and pickled weights
(`*.bin`, `*.pt`) are only read by `torch.load(weights_only=True)`, which refuses arbitrary
objects. Every problem surfaces as a `CheckpointError` with a one-line message that names the
file or folder.
"""
