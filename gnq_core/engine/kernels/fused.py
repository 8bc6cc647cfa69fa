"""Fused path (DESIGN.md §3): per-example weight gradients that also serve as the batch gradient.

When a Linear-like layer materialises its per-example gradients G_j = Δ_jᵀ X_j anyway, their
sum *is* the batch weight gradient.  ``FusedLinearFunction`` computes the layer's forward like
the module does and, in backward, forms G (in row chunks within a memory budget), returns
Σ_j G_j as the weight gradient — so autograd's own weight-gradient matmul never runs — and
adds the B×B Gram in place to the pass's accumulator (or, for a parameter used twice, hands G
itself to the auditor).  ``FusedLayerNormFunction``'s backward is a plain LayerNorm's; it
hands its factors to the auditor for one batched computation per shape at ``compute()``
(``gnq_core.engine.kernels.deferred``).  ``param.grad`` equals the unfused one up to float rounding
(a sum of B matmuls instead of one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from gnq_core.engine.kernels.deferred import NormRecord
from gnq_core.engine.math.cpu_gram import applies as cpu_gram_applies
from gnq_core.engine.math.cpu_gram import chunk_kernel, upper_gram_
from gnq_core.engine.math.representations import DenseRep, as_sequence, compute_dtype

# On CPU, G is formed in chunks of about this size in one reused buffer: a fresh 100+ MB tensor
# per step costs more in page faults than the Gram itself, and small chunks stay in cache
# (measured on the GPT-2 head, 8192×256, B=16, one thread: 126 ms vs 193 ms for one fresh tensor).
# 2 MiB rather than 8: a whole SmolLM2-135M step (B8 T64, one thread, 4 interleaved rounds on the
# shared, loaded machine) took 1.265× a plain one with 2 MiB chunks, 1.288× with 1 MiB, 1.324× with 8.
CPU_CHUNK_BYTES = 2 * 2**20
# ... but at least this many parameter rows (within the memory budget): a layer with a wide input
# (GPT-2's MLP c_proj, 768×3072) gets 21-row chunks at 2 MiB, and its per-example products ran
# slowly at that height (a layer's forward + backward, one thread, B8 T64: 1.23× a plain one with
# 21-row chunks, 1.13–1.16× with 42; `python -m benchmarks.fused_cost`).
CPU_CHUNK_MIN_ROWS = 48

# On CPU a chunk's Gram [B, N]·[N, B] is formed as its upper triangle, into an accumulator that
# is mirrored once at ``compute()``: by ``cpu_gram.upper_gram_`` (numba, one pass over the chunk:
# B=8, a 2 MiB chunk, one thread, 88 µs from memory) or, where that is not available, as two
# products (the first half of the examples against all, the second half against itself; 3/4 of
# the FLOPs: 179 → 142 µs; a product with 8 output rows runs far below the matmul peak whatever
# N is).  `python -m benchmarks.fused_cost`.  On a GPU the extra launch would cost more than the
# FLOPs, so it stays one product there.
UPPER_GRAM_MIN_BATCH = 4


# On a CUDA device the backward never waits for the device (no nonzero/unique/item), at the
# price of fixed-shape work; on CPU nothing waits anyway and the data-dependent gather is
# cheaper.  Tests set this True to run the device code path on CPU (tests/engine/test_host_sync.py).
DEVICE_PATHS_ON_CPU = False


def sync_free(t: torch.Tensor) -> bool:
    """Whether work on ``t`` must avoid data-dependent shapes (device-to-host syncs)."""
    return t.device.type != "cpu" or DEVICE_PATHS_ON_CPU


class GradientSink(Protocol):
    def plan(self) -> tuple[str, torch.Tensor | None]:
        """("off", None): nothing to report (the auditor is paused, or this call belongs to a
        pass that is no longer current): form the plain gradients only; ("gram", None): only the
        Gram is needed; ("gram", rows): also the gradients' parameter rows ``rows`` (a tied
        weight's cross terms with an embedding); ("gradients", None): the per-example gradients
        themselves (a weight used twice)."""

    def accumulator(self, dtype: torch.dtype, device: torch.device, upper: bool = False) -> torch.Tensor:
        """The pass's B×B Gram accumulator in ``dtype`` (one per dtype and device): a layer adds
        its Gram in place (``addmm_``), one op, no per-layer conversion or add.  ``upper``: a
        second one that holds only the upper triangle (j ≤ k), mirrored once at ``compute()``."""

    def accept_gram(self, narrow: torch.Tensor | None, rows_grad: DenseRep | None) -> None:
        """The weight's Gram is in the accumulator; ``narrow``: per-example gradients [B, n] of
        the call's other parameters (a bias), for the pass's one joint Gram of narrow ones."""

    def accept_gradients(self, weight: DenseRep | None, bias: DenseRep | None) -> None: ...

    def defer_norm(self, record: NormRecord) -> bool:
        """Keep a normalisation layer's factors for one batched computation per shape at
        ``compute()`` (False: over the memory bound or a shared parameter; form them now)."""

    def workspace(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A scratch buffer of ``numel`` elements (may be reused across calls)."""


@dataclass(frozen=True)
class FuseRequest:
    """What a kernel's ``fused_forward`` may know about one call of its module.

    ``open_sink()`` registers the call with the auditor and returns the sink its backward must
    report to; call it only when the fused function is really applied.
    """

    batch_size: int
    params: tuple[str, ...]  # local names of the trainable parameters the module covers
    path: str | None  # "ghost" / "materialize" when forced, None: the cost model decides
    memory_budget: int
    shared_beyond_lookups: bool  # a parameter of this call was used earlier by a non-lookup call
    open_sink: Callable[[], GradientSink]


class FusedLinearFunction(torch.autograd.Function):
    """y = x Wᵀ + b (nn.Linear) or y = x W + b (HF Conv1D, ``in_out=True``)."""

    @staticmethod
    def forward(ctx, x, weight, bias, in_out: bool, sink: GradientSink, budget: int):
        ctx.save_for_backward(x, weight)
        ctx.in_out, ctx.sink, ctx.budget, ctx.has_bias = in_out, sink, budget, bias is not None
        ctx.param_dtype = weight.dtype
        if not in_out:
            return F.linear(x, weight, bias)
        size_out = x.shape[:-1] + (weight.shape[-1],)  # exactly HF Conv1D's forward
        return torch.addmm(bias, x.view(-1, x.shape[-1]), weight).view(size_out)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        in_out, sink = ctx.in_out, ctx.sink
        if dy.dtype != weight.dtype:  # autocast: the forward multiplied x and W in dy's dtype
            x, weight = x.to(dy.dtype), weight.to(dy.dtype)
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = dy.matmul(weight.t()) if in_out else dy.matmul(weight)
        mode, keep_rows = sink.plan()
        if mode == "off":  # paused, or not the auditor's current pass: a plain layer's backward
            return grad_x, *_plain_parameter_grads(ctx, x, dy), None, None, None
        B = x.shape[0]
        dtype = compute_dtype(dy)
        # bf16/fp16 factors stay as they are on CUDA (tensor cores, fp32 accumulation and output)
        factor_dtype = dy.dtype if _tensor_core_products(dy) else dtype
        X = _as(as_sequence(x, B), factor_dtype)
        D = _as(as_sequence(dy, B), factor_dtype)
        # parameter layout [rows, cols]: Linear [out, in] = Δᵀ X; Conv1D [in, out] = Xᵀ Δ
        left, right = (X, D) if in_out else (D, X)
        grad_b = D.sum(dim=1, dtype=dtype) if ctx.has_bias else None  # per-example bias gradients [B, out]
        want_weight = ctx.needs_input_grad[1]
        grad_w = None
        if mode == "gradients":
            G = _products(left.transpose(1, 2), right, dtype)
            grad_w = G.sum(0) if want_weight else None
            sink.accept_gradients(DenseRep(G.view(B, -1)) if want_weight else None,
                                  DenseRep(grad_b) if ctx.needs_input_grad[2] else None)
        else:
            kept = None
            if want_weight:
                grad_w, kept = _weight_gram(left, right, keep_rows, dtype, ctx.budget, sink)
            kept_rep = DenseRep(kept.view(B, -1)) if kept is not None else None
            sink.accept_gram(grad_b if ctx.needs_input_grad[2] else None, kept_rep)
        param_dtype = ctx.param_dtype
        if grad_w is not None:
            grad_w = _as(grad_w, param_dtype)
        bias_grad = _as(grad_b.sum(0), param_dtype) if ctx.needs_input_grad[2] else None
        return grad_x, grad_w, bias_grad, None, None, None


def _plain_parameter_grads(ctx, x: torch.Tensor, dy: torch.Tensor
                           ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The weight and bias gradients autograd would form, in the parameters' dtype."""
    x2, d2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
    grad_w = grad_b = None
    if ctx.needs_input_grad[1]:
        grad_w = _as(x2.t().mm(d2) if ctx.in_out else d2.t().mm(x2), ctx.param_dtype)
    if ctx.needs_input_grad[2]:
        grad_b = _as(d2.sum(0), ctx.param_dtype)
    return grad_w, grad_b


def _weight_gram(left: torch.Tensor, right: torch.Tensor, keep_rows: torch.Tensor | None, dtype: torch.dtype,
                 budget: int, sink: GradientSink) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Σ_j G_j (the weight gradient) and, when asked, G's rows ``keep_rows``, with
    G_j = left_jᵀ right_j formed in chunks of parameter rows within ``budget`` bytes (on CPU in
    one reused buffer of ``CPU_CHUNK_BYTES`` at most); the Gram G Gᵀ goes into the sink's
    accumulator in ``dtype``."""
    B, rows, cols = left.shape[0], left.shape[-1], right.shape[-1]
    device = right.device
    kept = None
    if keep_rows is not None:  # G's rows keep_rows straight from the factors: one product of
        # B·T rows at most, where gathering them from each chunk took ops in every chunk
        kept = _products(left.index_select(-1, keep_rows.to(device)).transpose(1, 2), right, dtype)
    cpu = device.type == "cpu"
    row_bytes = B * cols * dtype.itemsize
    step = max(1, min(rows, (min(budget, CPU_CHUNK_BYTES) if cpu else budget) // max(row_bytes, 1)))
    if cpu:  # short chunks make the per-example products slow (a wide input: few rows per chunk)
        step = min(rows, max(step, min(CPU_CHUNK_MIN_ROWS, budget // max(row_bytes, 1))))
    upper = cpu and B >= UPPER_GRAM_MIN_BATCH
    if step >= rows:  # one chunk (most layers): no buffer, no slicing
        G = _products(left.transpose(1, 2), right, dtype)
        flat = G.view(B, -1)
        if upper and cpu_gram_applies(flat):  # Σ_j G_j in the kernel's one pass over G
            grad_w = torch.zeros(rows, cols, dtype=dtype, device=device)
            if upper_gram_(sink.accumulator(dtype, device, upper=True), flat, grad_w.view(-1)):
                return grad_w, kept
        sink.accumulator(dtype, device).addmm_(flat, flat.t())
        return G.sum(0), kept
    chunks = -(-rows // step)
    step = -(-rows // chunks)  # chunks of equal size: no small last one
    buffer = sink.workspace(B * step * cols, dtype, device)
    kernel = upper and cpu_gram_applies(buffer)  # decided once: the same for every chunk
    # Σ_j G_j: added by the kernel in its pass over each chunk (into zeros), else as a ones-row
    # product into grad_w's rows (sum(out=) zero-fills its output first)
    grad_w = (torch.zeros if kernel else torch.empty)(rows, cols, dtype=dtype, device=device)
    ones = torch.ones(1, B, dtype=dtype, device=device)
    acc, half = sink.accumulator(dtype, device, upper=upper), B // 2
    top, bottom = acc[:half], acc[half:, half:]
    # the views of one chunk, made once per chunk size (this loop runs ~50 times per layer on
    # a large head, so each Python-level call in it counts)
    n = G = flat = flat_t = flat_top = flat_bottom = flat_bottom_t = run = None
    start = 0
    for lhs, sums in zip(left.transpose(1, 2).split(step, dim=1), grad_w.split(step), strict=True):
        if lhs.shape[1] != n:
            n = lhs.shape[1]
            G = buffer[:B * n * cols].view(B, n, cols)
            flat = G.view(B, -1)
            flat_t, flat_top, flat_bottom = flat.t(), flat[:half], flat[half:]
            flat_bottom_t = flat_bottom.t()
            run = chunk_kernel(acc, flat, grad_w) if kernel else None
        _products(lhs, right, dtype, out=G)
        start += n
        if run is not None:  # numba's one pass over the chunk: its Gram and Σ_j into its rows
            run(start - n, start)
            continue
        torch.mm(ones, flat, out=sums.view(1, -1))
        if upper:  # two products: rows [0, half) against all, rows [half, B) against themselves
            top.addmm_(flat_top, flat_t)
            bottom.addmm_(flat_bottom, flat_bottom_t)
        else:
            acc.addmm_(flat, flat_t)
    return grad_w, kept


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t in ``dtype`` (no dispatch at all when it already is: this runs per layer per step)."""
    return t if t.dtype == dtype else t.to(dtype)


_LOW_PRECISION = (torch.bfloat16, torch.float16)
_out_dtype_bmm = True  # torch.bmm(..., out_dtype=float32) works here (set False at its first failure)


def _tensor_core_products(dy: torch.Tensor) -> bool:
    return dy.is_cuda and dy.dtype in _LOW_PRECISION and _out_dtype_bmm


def _products(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype, out: torch.Tensor | None = None
              ) -> torch.Tensor:
    """Per-example a_j @ b_j in ``dtype``.  Low-precision CUDA inputs are multiplied on tensor
    cores with fp32 accumulation and output — the same numbers as upcasting first, since a
    product of two bf16/fp16 numbers is exact in fp32; everything else is upcast."""
    global _out_dtype_bmm
    if a.dtype in _LOW_PRECISION and a.is_cuda and _out_dtype_bmm:
        try:
            return torch.bmm(a, b, out_dtype=dtype)
        except (RuntimeError, TypeError, NotImplementedError):  # an older torch: upcast from now on
            _out_dtype_bmm = False
    return torch.bmm(_as(a, dtype), _as(b, dtype), out=out)


class FusedLayerNormFunction(torch.autograd.Function):
    """nn.LayerNorm whose backward hands its per-example weight and bias gradients to the sink.

    ∇w_j = Σ_t Δ_jt ⊙ x̂_jt and ∇b_j = Σ_t Δ_jt reuse the forward's saved mean and 1/σ.  The
    sink normally keeps (x, Δ, μ, 1/σ) for ``compute()`` and the backward is exactly a plain
    LayerNorm's; past the memory budget (or for shared parameters) they are formed here.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, normalized_shape, eps: float, sink: GradientSink):
        out, mean, rstd = torch.native_layer_norm(x, normalized_shape, weight, bias, eps)
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        ctx.normalized_shape, ctx.sink = normalized_shape, sink
        return out

    @staticmethod
    def backward(ctx, dy):
        x, weight, bias, mean, rstd = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        width = weight.numel() if weight is not None else bias.numel()
        record = NormRecord.layer_norm(x, dy, mean, rstd, width, need_w, need_b)
        if ctx.sink.defer_norm(record):  # the backward of a plain LayerNorm, nothing more
            return (*torch.ops.aten.native_layer_norm_backward(
                dy, x, ctx.normalized_shape, mean, rstd, weight, bias, [need_x, need_w, need_b]),
                None, None, None)
        grad_x = None
        if need_x:
            grad_x = torch.ops.aten.native_layer_norm_backward(
                dy, x, ctx.normalized_shape, mean, rstd, weight, bias, [True, False, False])[0]
        per_w, per_b = record.per_example()
        ctx.sink.accept_gradients(DenseRep(per_w) if need_w else None, DenseRep(per_b) if need_b else None)
        grad_w = _as(per_w.sum(0).view_as(weight), weight.dtype) if need_w else None
        grad_b = _as(per_b.sum(0).view_as(bias), bias.dtype) if need_b else None
        return grad_x, grad_w, grad_b, None, None, None
