"""Catch device-to-host synchronisations in a block of PyTorch code, on CPU as on CUDA.

On CPU nothing synchronises, so the ops that *would* wait for a CUDA device are caught by
name: reading a scalar (``item`` / ``_local_scalar_dense``, ``bool(t)``), ops whose output
shape depends on the data (``nonzero``, ``unique``, ``masked_select``, boolean indexing,
``repeat_interleave`` without ``output_size``), and linear algebra that checks its LAPACK
info on the host (``linalg_eigh``, the non-``_ex`` factorisations).  On CUDA
``torch.cuda.set_sync_debug_mode("error")`` catches the rest (e.g. a ``.cpu()`` copy).
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SYNCING = {
    "_local_scalar_dense", "item", "is_nonzero", "equal", "nonzero", "masked_select",
    "_unique", "_unique2", "unique_dim", "unique_consecutive", "unique_dim_consecutive",
    "repeat_interleave", "_linalg_eigh", "linalg_eigh", "linalg_eigvalsh", "linalg_eig",
    "linalg_cholesky", "linalg_inv", "linalg_solve", "cholesky_inverse", "_assert_async",
}


class HostSyncError(AssertionError):
    """An op that makes the host wait for the device ran inside a guarded block."""


def _why(func, args, kwargs) -> str | None:
    name = func.overloadpacket.__name__
    if name == "repeat_interleave" and kwargs.get("output_size") is not None:
        return None
    if name in SYNCING:
        return name
    if name in ("index", "index_put", "index_put_", "_index_put_impl_"):  # boolean mask indices
        indices = args[1] if len(args) > 1 else kwargs.get("indices", [])
        if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices):
            return f"{name} with a boolean mask"
    return None


def _our_frames() -> str:
    """The stack without torch's own frames (where in the project the op was called)."""
    frames = [f for f in traceback.extract_stack()[:-2] if "/torch/" not in f.filename]
    return "".join(traceback.format_list(frames[-6:]))


class SyncCatcher(TorchDispatchMode):
    """Records (or raises at) every op that would synchronise the host with the device."""

    def __init__(self, raise_at_once: bool = False) -> None:
        super().__init__()
        self.raise_at_once = raise_at_once
        self.found: list[tuple[str, str]] = []  # (op, where in our code)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        why = _why(func, args, kwargs)
        if why is not None:
            where = _our_frames()
            self.found.append((why, where))
            if self.raise_at_once:
                raise HostSyncError(f"host synchronisation: {why}\n{where}")
        return func(*args, **kwargs)


@contextlib.contextmanager
def no_host_sync() -> Iterator[SyncCatcher]:
    """Fail if anything inside synchronises with the device (see the module doc)."""
    catcher = SyncCatcher()
    previous = torch.cuda.get_sync_debug_mode() if torch.cuda.is_available() else None
    if previous is not None:
        torch.cuda.set_sync_debug_mode("error")
    try:
        with catcher:
            yield catcher
    finally:
        if previous is not None:
            torch.cuda.set_sync_debug_mode(previous)
    if catcher.found:
        ops = sorted({op for op, _ in catcher.found})
        raise HostSyncError(f"{len(catcher.found)} host synchronisation(s): {', '.join(ops)}\n"
                            f"first at:\n{catcher.found[0][1]}")
