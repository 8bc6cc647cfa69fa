"""No device-to-host synchronisation in the in-run backward and the solve.

On CPU the ops that would make the host wait for a CUDA device are caught by name
(tests/sync_guard.py); on CUDA ``set_sync_debug_mode("error")`` catches the rest.  The one
read per step is ``Solution.check()`` in ``compute()``, outside the guarded blocks.  Where CPU
code takes a cheaper data-dependent route (nothing waits on CPU), the tests force the device
route (``fused.DEVICE_PATHS_ON_CPU``).
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import TOL, rel_err
from sync_guard import HostSyncError, no_host_sync
from test_fused import CASES

from gnq_core import GNQAuditor, GNQNumericalError, exact_gnq
from gnq_core.engine import gnq_from_kernel
from gnq_core.engine.kernels import fused as fused_module

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("sync", [
    lambda t: t.sum().item(),
    lambda t: bool(t.sum() > 0),
    lambda t: t.nonzero(),
    lambda t: torch.unique(t),
    lambda t: t[t > 0],
    lambda t: torch.linalg.eigvalsh(t.reshape(2, 2) @ t.reshape(2, 2).T),
    lambda t: torch.repeat_interleave(t.long().abs() + 1),
], ids=["item", "bool", "nonzero", "unique", "mask-index", "eigvalsh", "repeat_interleave"])
def test_the_guard_catches_a_deliberate_sync(sync):
    t = torch.tensor([1.0, -2.0, 3.0, 0.5], device=DEVICES[-1])
    with pytest.raises(HostSyncError), no_host_sync():
        sync(t)


def test_the_guard_lets_device_only_work_pass():
    t = torch.randn(4, 4)
    with no_host_sync():
        L, info = torch.linalg.cholesky_ex(t @ t.T + torch.eye(4))
        torch.sort(t.reshape(-1)).values.index_select(0, torch.tensor([0, 3]))
        torch.isfinite(t).all() & (info == 0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("path", ["auto", "ghost", "materialize"])
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
def test_inrun_backward_and_solve_never_wait_for_the_device(case, fused, path, device, monkeypatch):
    monkeypatch.setattr(fused_module, "DEVICE_PATHS_ON_CPU", True)  # the CUDA code path, on CPU
    torch.manual_seed(31)
    make, loss_fn, make_batch = CASES[case]
    model, batch = make().eval(), make_batch()
    ref = exact_gnq(model, loss_fn, batch, 1e-3)
    model = copy.deepcopy(model).to(device)
    batch = {k: v.to(device) for k, v in batch.items()} if isinstance(batch, dict) else \
        tuple(t.to(device) for t in batch)
    with GNQAuditor(model, lam=1e-3, fused=fused, path=path) as auditor:
        for _ in range(2):  # the first forward also runs the coverage check
            losses = loss_fn(model, batch)
            with no_host_sync():
                losses.sum().backward()
            res = auditor.compute()
            model.zero_grad(set_to_none=True)
    with no_host_sync():
        solution = gnq_from_kernel(res.kernel, 1e-3, check=False)
    assert solution.check() == pytest.approx(res.condition, rel=1e-12)
    assert rel_err(res.gnq.cpu(), ref.gnq) <= TOL
    assert rel_err(solution.gnq.cpu(), ref.gnq) <= TOL


def test_deferred_checks_still_refuse_bad_kernels():
    bad = gnq_from_kernel(torch.tensor([[1.0, float("nan")], [0.0, 1.0]]), 1.0, check=False)
    with pytest.raises(GNQNumericalError, match="NaN"):
        bad.check()
    indefinite = gnq_from_kernel(torch.tensor([[1.0, 0.0], [0.0, -5.0]]), 1.0, check=False)
    with pytest.raises(GNQNumericalError, match="positive definite"):
        _ = indefinite.condition
