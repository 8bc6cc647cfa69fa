"""The memory an audit will take, planned from the checkpoint's files before anything loads.

An audit holds, at its peak: the process itself (Python, torch, transformers, DuckDB), the model's
weights in the compute dtype, while they load the file pages they are read from (safetensors maps
the files; a dtype conversion reads every page), the next checkpoint's weights when it is
prefetched while this one is audited, the per-example working set of one batch (the activations
autograd keeps for the backward and the output gradients the kernels read, both per token and
layer), and the head's logits (batch × tokens × vocabulary, with their gradient, the
log-softmax of the loss and the membership signals).  Each term is computed from config.json and
the safetensors headers alone; its per-token constants are calibrated against the measured peak
RSS of real audits (``python -m benchmarks.model_memory``, docs/performance.md "Memory").

A PEFT adapter audited on its base (``gnq audit --base-model``, GNQ over the adapter's
parameters) holds the base's terms and, beside them, the adapter's weights and the copies its
layers add to the first batch's probe (``engine.plan.planning``), which keeps every module
call's inputs and outputs of B+1 examples and is the peak of such an audit: PEFT wraps each
adapted Linear, so the call the base makes once is made by the wrapper, its base layer, the
dropout and LoRA's A and B, and the wrappers return the logits again (``AdapterShape``, read
from the adapter's and the base's safetensors headers; ``python -m benchmarks.adapter_memory``).

The plan is compared with the memory the device has: free device memory
(``torch.cuda.mem_get_info``) for a GPU, else the least of available RAM, the container's limit,
the room under ``ulimit -v`` and ``GNQ_MAX_MEMORY`` (``limits.available_memory``).  When two
checkpoints do not fit the next one is not prefetched; when the batch does not fit the default
batch is the largest that does (``default_batch_size``), and a batch the user asked for is
refused naming the largest that fits (``check_plan``).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gnq_core.sources import limits

__all__ = ["DEFAULT_BATCH_CAP", "MIN_BATCH", "AdapterShape", "MemoryError_", "MemoryPlan", "Shape", "Term",
           "adapter_shape", "check_plan", "default_batch_size", "model_shape", "oom_message", "plan_audit",
           "plan_for_batch", "is_out_of_memory"]

MIN_BATCH = 2  # GNQ of a text against at least one other
# The default batch is the largest that fits, up to this: GNQ is relative to its batch (a text's
# companions), the estimate's and the studies' rates were measured at 16, and a larger batch only
# makes each (B·T)² ghost Gram bigger.
DEFAULT_BATCH_CAP = 16

# Counted from the layers, then calibrated on the CPU against the measured peak RSS of `gnq audit`
# (benchmarks/results/model_memory-cpu.json: a 0.13B Llama saved in bf16, 2 checkpoints, T 128,
# B 4 and 16, audited in float32 and in bf16: 1.01-1.12x of all four; B 8 in bf16, measured after
# the fit: 1.06x): bytes of the process
# before any model loads (Python, torch, transformers, DuckDB, the tokenizer), activations and
# output gradients kept per token and layer in units of the compute dtype's size times the
# layer's widths, copies of the B × T × vocabulary logits alive at once, and the float32
# (B·T)² factor Grams of the ghost path kept per layer (the term that grows as B²).
RUNTIME_BYTES = 900 * 2**20
HIDDEN_COPIES = 32.0      # per token and layer: × hidden size (norms, q/o, residuals, their gradients)
INTERMEDIATE_COPIES = 6.0  # per token and layer: × MLP width (gate, up, activation, their gradients)
KV_COPIES = 6.0           # per token and layer: × key/value width (k, v, rotary copies, gradients)
LOGIT_COPIES = 5.0        # logits, their gradient, the loss's log-softmax, the signals' softmax, one more
GRAM_COPIES = 5.0         # per layer: (B·T)² float32 factor Grams alive at the peak
GRAM_BUDGET = 256 * 2**20  # engine.math.representations.DEFAULT_MEMORY_BUDGET: the largest Gram block at once

# A PEFT adapter on its base (unmerged), beyond the base's terms: what the first batch's probe
# copies of B+1 examples for each adapted Linear (in → out, LoRA rank r) besides the base's own
# call, per token in units of the compute dtype's size.  Counted from PEFT's modules (the probe
# copies each module call's inputs and outputs: engine.plan.planning._Recorder): the wrapper's
# base layer makes the call again (in + out); a LoRA's dropout (in + in, the identity at eval but
# a call of its own), A (in + r) and B (r + out); every wrapper of the model (PeftModelForCausalLM,
# LoraModel) returns the logits again.  Measured on SmolLM2-135M with LoRA r 16 on every
# projection, the probe's copies beyond the base's were these counted bytes to 0.001% (1.559 GB
# at B 2, T 128: `python -m benchmarks.adapter_memory --where`), but the audit's peak grew by
# 1.22-1.25x them over the base's plan (`gnq audit` at B 2 and 4, T 128,
# benchmarks/results/adapter_memory-cpu.json; 1.17-1.20x in one process against the base audited
# as a full model): the wrappers' temporaries between the kept copies in the forward, the
# allocator's slack.  ADAPTER_OVERHEAD is that fit's upper end.
ADAPTER_WRAPPED_COPIES = 1.0   # × (in + out) of each adapted module: its base layer's call again
ADAPTER_LORA_INPUT_COPIES = 3.0  # × in of each LoRA pair: dropout in and out, A's input
ADAPTER_LORA_OUTPUT_COPIES = 1.0  # × out: B's output
ADAPTER_LORA_RANK_COPIES = 2.0   # × r: A's output, B's input
ADAPTER_LOGIT_COPIES = 2.0       # × vocabulary: the logits the two PEFT wrappers return
ADAPTER_OVERHEAD = 1.25


class MemoryError_(limits.LimitError):  # noqa: N801 (not the builtin MemoryError: a user's error, one line)
    """The audit does not fit the device's memory; the message names what to change."""


@dataclass(frozen=True)
class Term:
    name: str
    bytes: int
    why: str


@dataclass(frozen=True)
class Shape:
    """What the plan needs of a model, from config.json and the weight files."""

    parameters: int
    file_bytes: int  # the weight files (floating tensors at their stored size)
    stored_dtype: str | None  # the floating dtype the weights are saved in (None: unknown / mixed)
    hidden: int
    layers: int
    intermediate: int
    kv_width: int
    heads: int
    vocab: int


@dataclass(frozen=True)
class AdapterShape:
    """What the plan needs of a PEFT adapter checkpoint audited on its base with GNQ over the
    adapter's parameters: its tensors' size and, for each base module it wraps, that module's
    (input width, output width, LoRA rank; 0 for an adapter without a LoRA pair, such as IA3)."""

    parameters: int  # the adapter's own tensors (elements)
    modules: tuple[tuple[int, int, int], ...]

    def probe_widths(self, vocab: int) -> float:
        """Elements per token the probe copies for this adapter beyond the base's own calls."""
        total = ADAPTER_LOGIT_COPIES * vocab
        for width_in, width_out, rank in self.modules:
            total += ADAPTER_WRAPPED_COPIES * (width_in + width_out)
            if rank:
                total += (ADAPTER_LORA_INPUT_COPIES * width_in + ADAPTER_LORA_OUTPUT_COPIES * width_out
                          + ADAPTER_LORA_RANK_COPIES * rank)
        return total


@dataclass(frozen=True)
class MemoryPlan:
    """The planned peak of one audit on one device, term by term, and the room it has there."""

    terms: tuple[Term, ...]
    room: int
    room_source: str
    device: str
    batch_size: int
    max_length: int
    dtype: str
    prefetch: bool
    already: int = 0  # bytes this process holds already (counted in the runtime term, not again in the room)

    @property
    def peak(self) -> int:
        return sum(t.bytes for t in self.terms)

    @property
    def fits(self) -> bool:
        return self.peak - self.already <= self.room

    def parts(self) -> str:
        """The terms, largest first: "weights 0.5 GB, working set 0.3 GB, ..."."""
        terms = sorted((t for t in self.terms if t.bytes), key=lambda t: -t.bytes)
        return ", ".join(f"{t.name} {limits.format_bytes(t.bytes)}" for t in terms)

    def describe(self) -> str:
        """One line: the peak, its terms, and the room it is compared with."""
        parts = self.parts()
        verdict = "fits" if self.fits else "does not fit"
        return (f"peak memory ≈ {limits.format_bytes(self.peak)} on {self.device} ({parts}) at batch "
                f"{self.batch_size} × {self.max_length} tokens in {self.dtype}; {self.room_source} is "
                f"{limits.format_bytes(self.room + self.already)}: {verdict}")


def _first(config: Any, *names: str, default: int | None = None) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return default


def model_shape(folder: str | Path) -> Shape:
    """The model's parameters, files and layer widths, from config.json and the weight files' headers
    (nothing loaded; a pickled checkpoint's parameters are its files' size at 4 bytes each)."""
    from gnq_core.sources.checkpoints.config import load_config
    from gnq_core.sources.checkpoints.files import checkpoint_dir, weight_files

    folder = checkpoint_dir(folder)
    config = load_config(folder).get_text_config()
    kind, files = weight_files(folder)
    if kind == "safetensors":
        try:
            parameters = limits.weights_elements(files)
            file_bytes = limits.weights_bytes(kind, files)
            stored = limits.stored_float_dtype(files)
        except (OSError, ValueError, struct.error) as exc:  # a cut or altered header (json's error is one)
            # the checkpoint's own checks name the file and its problem as the audit's would
            from gnq_core.sources.checkpoints.checks import check_checkpoint
            from gnq_core.sources.checkpoints.errors import folder_error, reason

            check_checkpoint(folder)
            raise folder_error(folder, f"cannot read its weight files' headers ({reason(exc)})") from exc
    else:
        file_bytes = sum(f.stat().st_size for f in files)
        parameters, stored = file_bytes // 4, None
    hidden = _first(config, "hidden_size", "n_embd", "d_model", default=1) or 1
    heads = _first(config, "num_attention_heads", "n_head", "num_heads", default=1) or 1
    head_dim = _first(config, "head_dim", default=max(1, hidden // heads)) or 1
    kv_heads = _first(config, "num_key_value_heads", "n_kv_heads", default=heads) or heads
    return Shape(parameters=parameters, file_bytes=file_bytes, stored_dtype=stored, hidden=hidden,
                 layers=_first(config, "num_hidden_layers", "n_layer", "num_layers", default=1) or 1,
                 intermediate=_first(config, "intermediate_size", "n_inner", "ffn_dim", "d_ff",
                                     default=4 * hidden) or 4 * hidden,
                 kv_width=kv_heads * head_dim, heads=heads,
                 vocab=_first(config, "vocab_size", default=1) or 1)


_ADAPTER_PREFIX = "base_model.model."  # PEFT's names of the base's tensors in a saved adapter


def adapter_shape(folder: str | Path, base: str | Path) -> AdapterShape:
    """The adapter of ``folder`` against its ``base``, from both safetensors headers (nothing
    loaded): each adapter tensor belongs to the base module whose weight its name extends
    (``base_model.model.<module>.lora_A.weight`` to ``<module>.weight``), the module's widths
    from LoRA's A ([r, in]) and B ([out, r]), else from that weight ([out, in])."""
    from gnq_core.sources.checkpoints.files import ADAPTER_WEIGHTS, checkpoint_dir, weight_files

    folder, base = checkpoint_dir(folder), checkpoint_dir(base)
    try:
        stored = limits.tensor_shapes([folder / ADAPTER_WEIGHTS])
        kind, files = weight_files(base)
        weights = limits.tensor_shapes(files) if kind == "safetensors" else {}
    except (OSError, ValueError, struct.error) as exc:  # a cut or altered header (json's error is one)
        # the adapter's own checks name the file and its problem as the audit's would
        from gnq_core.sources.adapters import check_adapter
        from gnq_core.sources.checkpoints.errors import folder_error, reason

        check_adapter(folder, base)
        raise folder_error(folder, f"cannot read the adapter's or its base's weight headers ({reason(exc)})"
                           ) from exc
    modules: dict[str, list[int]] = {}  # module -> [in, out, rank]
    for name, shape in stored.items():
        parts = name.removeprefix(_ADAPTER_PREFIX).split(".")
        pair = parts[-2] if len(parts) >= 2 and len(shape) == 2 else None  # "lora_A" of "....lora_A.weight"
        module = next((".".join(parts[:n]) for n in range(len(parts) - 1, 0, -1)
                       if len(weights.get(".".join(parts[:n]) + ".weight", ())) == 2), None)
        if module is None and pair in ("lora_A", "lora_B"):  # a base saved under other names
            module = ".".join(parts[:-2])
        if module is None:
            continue  # a tensor of no base Linear (a saved module copy): counted in the weights only
        if module not in modules:  # [out, in] as nn.Linear stores it
            out_width, in_width = weights.get(module + ".weight", (0, 0))
            modules[module] = [in_width, out_width, 0]
        # LoRA's own shapes where there are some: A is [r, in], B [out, r] (a Conv1D too)
        if pair == "lora_A":
            modules[module][2], modules[module][0] = shape
        elif pair == "lora_B":
            modules[module][1] = shape[0]
    return AdapterShape(parameters=sum(math.prod(s) for s in stored.values()),
                        modules=tuple((m[0], m[1], m[2]) for m in modules.values()))


_ITEMSIZE = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}


def _room(device: str) -> tuple[int, str, int]:
    """(bytes free, where that number comes from, bytes this process already holds there)."""
    if device.startswith("cuda"):
        import torch

        free, _total = torch.cuda.mem_get_info(torch.device(device))
        return int(free), f"free memory of {device}", 0
    import psutil

    room, source = limits.available_memory()
    return room, source, int(psutil.Process().memory_info().rss)


def plan_for_batch(shape: Shape, *, batch_size: int, max_length: int, dtype: str, checkpoints: int,
                   device: str, room: int, room_source: str, already: int = 0,
                   reference: bool = False, prefetch: bool | None = None, shards: int = 1,
                   adapter: AdapterShape | None = None) -> MemoryPlan:
    """The plan for ``shape`` at ``batch_size`` × ``max_length`` tokens in ``dtype``; ``prefetch``
    None: the next checkpoint is prefetched when there is one and two fit, else not.
    ``reference``: a second model held besides (the attacks' reference model).  ``shards`` > 1 on
    a GPU: the model sharded over that many ranks (``gnq audit --shard-model``): each device holds
    its share of the weights and two units gathered in full (the one running and the next,
    all-gathered ahead), bounded by a block or the embeddings and head; the checkpoints are read
    into host memory, the next one too.  ``adapter``: the checkpoints are this PEFT adapter of
    ``shape``'s model, audited unmerged (the adapter's weights, and its layers' copies in the
    first batch's probe, beside the base's terms; each checkpoint loads the base again)."""
    size = _ITEMSIZE.get(dtype, 4)
    weights = shape.parameters * size
    on_gpu = device.startswith("cuda")
    sharded = shards > 1 and on_gpu
    held = -(-weights // shards) if sharded else weights
    # a conversion reads every page of the files (counted in RSS while mapped); on a GPU they
    # are host memory, not the device's
    loading = 0 if on_gpu else (shape.file_bytes if shape.stored_dtype != dtype else 0)
    tokens = batch_size * max_length
    per_token = size * shape.layers * (HIDDEN_COPIES * shape.hidden + INTERMEDIATE_COPIES * shape.intermediate
                                       + KV_COPIES * shape.kv_width)
    # the ghost path's (B·T)² factor Grams, float32 (float64 models: float64), each at most the budget
    grams = int(GRAM_COPIES * shape.layers * min(GRAM_BUDGET, tokens * tokens * max(size, 4)))
    logits = int(LOGIT_COPIES * tokens * shape.vocab * size)
    terms = [Term("runtime", 0 if on_gpu else RUNTIME_BYTES, "Python, torch, transformers, DuckDB"),
             Term("weights", held, f"{shape.parameters:,} parameters × {size} bytes ({dtype})"
                  + (f", 1/{shards} of them on each rank" if sharded else "")),
             Term("loading", loading, "the weight files' pages while they are converted")]
    if sharded:
        ends = 2 * shape.vocab * shape.hidden  # the embeddings and an untied head: the root unit
        block = max(shape.parameters - ends, 0) // max(shape.layers, 1)
        terms.append(Term("gathered units", min(2 * max(ends, block), shape.parameters) * size,
                          "two units' full weights while one runs (FSDP2 gathers the next ahead)"))
    own = adapter.parameters * size if adapter is not None else 0
    if adapter is not None:
        terms.append(Term("adapter", own, f"{adapter.parameters:,} adapter parameters × {size} bytes"))
    if reference:
        terms.append(Term("reference model", weights, "the attacks' reference model, held besides"))
    working = [Term("working set", int(tokens * per_token),
                    f"activations and output gradients of {batch_size} × {max_length} tokens"),
               Term("Grams", grams, f"the (B·T)² factor Grams of {shape.layers} layers (B·T = {tokens})"),
               Term("logits", logits, f"{batch_size} × {max_length} × {shape.vocab:,} vocabulary, "
                                      f"×{LOGIT_COPIES:g} copies (gradient, log-softmax, signals)")]
    if adapter is not None:
        probed = (batch_size + 1) * max_length  # the probe's second batch: B+1 examples
        copies = int(ADAPTER_OVERHEAD * probed * adapter.probe_widths(shape.vocab) * size)
        working.append(Term("adapter layers", copies,
                            f"the first batch's probe of {len(adapter.modules)} PEFT-wrapped modules "
                            f"(wrapper, dropout, LoRA A and B) and the wrappers' logits, {batch_size + 1} × "
                            f"{max_length} tokens"))
    base = MemoryPlan(tuple(terms + working), room, room_source, device, batch_size, max_length, dtype,
                      prefetch=False, already=already)
    want = checkpoints > 1 if prefetch is None else prefetch and checkpoints > 1
    if not want:
        return base
    ahead = 0 if sharded else weights + loading + own  # sharded: read into host memory, not the device's
    with_next = replace(base, terms=base.terms + (Term("next checkpoint", ahead,
                                                       "prefetched while this one is audited"),),
                        prefetch=True)
    return with_next if with_next.fits or prefetch else base


def plan_audit(folder: str | Path, *, batch_size: int, max_length: int, dtype: str | None, checkpoints: int,
               device: str = "cpu", reference: bool = False, adapter: str | Path | None = None) -> MemoryPlan:
    """The plan of an audit of ``checkpoints`` checkpoints shaped like ``folder`` on ``device``
    (``dtype`` None: as the weights are stored); ``adapter``: they are PEFT adapters like this one
    of the base model ``folder``, audited unmerged."""
    shape = model_shape(folder)
    dtype = dtype or shape.stored_dtype or "float32"
    room, source, already = _room(device)
    return plan_for_batch(shape, batch_size=batch_size, max_length=max_length, dtype=dtype,
                          checkpoints=checkpoints, device=device, room=room, room_source=source,
                          already=already, reference=reference,
                          adapter=adapter_shape(adapter, folder) if adapter is not None else None)


def largest_batch(plan_at: Any, upto: int) -> int | None:
    """The largest batch from ``upto`` down to MIN_BATCH whose plan fits (``plan_at(b)``), or None."""
    lo, hi = MIN_BATCH, upto
    if not plan_at(lo).fits:
        return None
    while lo < hi:  # the peak grows with the batch: bisect
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if plan_at(mid).fits else (lo, mid - 1)
    return lo


def _changes(shape: Shape, plan: MemoryPlan) -> str:
    """What would make a plan that does not fit at batch MIN_BATCH fit."""
    ideas = []
    if plan.max_length > 16:
        ideas.append(f"a smaller --max-length (now {plan.max_length})")
    if plan.dtype in ("float32", "float64") and shape.stored_dtype in ("bfloat16", "float16"):
        ideas.append(f"--dtype {shape.stored_dtype} (the weights as stored)")
    elif plan.dtype == "float64":
        ideas.append("--dtype float32")
    ideas.append("a device with more memory (--device)" if not plan.device.startswith("cuda")
                 else "a GPU with more free memory, or --device cpu")
    return ", ".join(ideas)


def check_plan(folder: str | Path, *, batch_size: int | None, max_length: int, dtype: str | None,
               checkpoints: int, device: str = "cpu", where: str | Path | None = None, shards: int = 1,
               adapter: str | Path | None = None) -> tuple[MemoryPlan, str | None]:
    """The plan an audit runs under, and the one line to say about it (None: nothing to say).

    ``batch_size`` None: the largest batch up to DEFAULT_BATCH_CAP that fits (said when below
    it).  A given batch that does not fit is refused naming the largest that does; no batch
    that fits is refused naming what to change (``MemoryError_``, one line, before loading).
    ``adapter``: the checkpoints are PEFT adapters like this one of the base model ``folder``,
    audited unmerged (a merged adapter is planned as its base: the merged model is one)."""
    shape = model_shape(folder)
    dtype = dtype or shape.stored_dtype or "float32"
    room, source, already = _room(device)
    peft = adapter_shape(adapter, folder) if adapter is not None else None

    def at(b: int) -> MemoryPlan:
        return plan_for_batch(shape, batch_size=b, max_length=max_length, dtype=dtype,
                              checkpoints=checkpoints, device=device, room=room, room_source=source,
                              already=already, shards=shards, adapter=peft)

    name = where or folder
    best = largest_batch(at, max(MIN_BATCH, batch_size or DEFAULT_BATCH_CAP))
    if best is None:
        smallest = at(MIN_BATCH)
        raise MemoryError_(f"{name}: the audit needs {limits.format_bytes(smallest.peak)} of memory even at "
                           f"--batch-size {MIN_BATCH} ({smallest.parts()}) but {source} is "
                           f"{limits.format_bytes(room + already)}; refused before loading: try "
                           f"{_changes(shape, smallest)}")
    if batch_size is not None and best < batch_size:
        wanted = at(batch_size)
        raise MemoryError_(f"{name}: --batch-size {batch_size} needs {limits.format_bytes(wanted.peak)} of "
                           f"memory but {source} is {limits.format_bytes(room + already)}; "
                           f"--batch-size {best} fits (or a smaller --max-length); refused before loading")
    plan = at(batch_size or best)
    notes = []
    if batch_size is None and best < DEFAULT_BATCH_CAP:
        notes.append(f"batch size {best}: the largest up to {DEFAULT_BATCH_CAP} that fits "
                     f"{limits.format_bytes(room + already)} ({source})")
    if checkpoints > 1 and not plan.prefetch:
        notes.append("the next checkpoint is not loaded ahead: two do not fit")
    return plan, "; ".join(notes) or None


def default_batch_size(folder: str | Path, *, max_length: int, dtype: str | None = None,
                       checkpoints: int = 1, device: str = "cpu") -> int:
    """The batch an audit takes when none is given: the largest up to DEFAULT_BATCH_CAP whose plan
    fits (MIN_BATCH when none does: the audit is then refused with what to change)."""
    plan, _ = _safe_check(folder, max_length=max_length, dtype=dtype, checkpoints=checkpoints, device=device)
    return plan.batch_size if plan is not None else MIN_BATCH


def _safe_check(folder: str | Path, **kwargs: Any) -> tuple[MemoryPlan | None, str | None]:
    try:
        return check_plan(folder, batch_size=None, **kwargs)
    except MemoryError_:
        return None, None


# ------------------------------------------------------------------------------------ out of memory

_OOM_TEXT = ("out of memory", "can't allocate memory", "cannot allocate memory", "not enough memory",
             "failed to allocate")


def is_out_of_memory(exc: BaseException) -> bool:
    """An allocation failure of torch (CUDA's OutOfMemoryError, the CPU allocator's RuntimeError)."""
    import torch

    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(text in str(exc).lower() for text in _OOM_TEXT)


def oom_message(where: str, batch_size: int, plan: MemoryPlan | None) -> str:
    """The one line an out-of-memory error in an audit becomes: where, and the fix."""
    smaller = max(MIN_BATCH, batch_size // 2)
    said = f" (planned peak {limits.format_bytes(plan.peak)})" if plan is not None else ""
    return (f"{where}: out of memory at --batch-size {batch_size}{said}; rerun the same command with "
            f"--batch-size {smaller} (or a smaller --max-length) under a new --name, or free memory and "
            "rerun it as it is to resume: finished checkpoints are kept")
