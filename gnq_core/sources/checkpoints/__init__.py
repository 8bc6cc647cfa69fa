"""Hugging Face causal-LM checkpoint folders: found, checked, loaded and saved, one module a concept.

- ``errors``: ``CheckpointError``, the one error every checkpoint problem becomes, worded in one line.
- ``files``: a folder's layout: its weight files, ``CheckpointRef``, the hash, the parameter count.
- ``formats``: reading the weight formats (safetensors headers; pickles only weights-only).
- ``config``: config.json, read into a transformers config of a causal LM.
- ``values``: NaN/Inf in config.json and the weights, integer weights.
- ``tokenizer``: the checkpoint's tokenizer.
- ``checks``: ``check_checkpoint`` and the checks loading shares with it.
- ``load``: ``load_checkpoint``.  ``save``: ``save_checkpoint``, atomically.
- ``series``: ``find_checkpoints`` (a folder's checkpoints in training order) and one tokenizer and
  architecture per series.

Checkpoint folders are UNTRUSTED input: nothing here runs code from them. Remote code is never
trusted, nothing is fetched from the hub, safetensors weights are preferred and pickled weights
(`*.bin`, `*.pt`) are only read by `torch.load(weights_only=True)`, which refuses arbitrary
objects. Every problem surfaces as a `CheckpointError` with a one-line message that names the
file or folder.  ``gnq_core.sources`` exports the public names.
"""
