"""The input end of the autograd graph, for ``GNQAuditor.backward`` (the post-hoc backward).

A covered module's output belongs to the frontier when it does not depend on any tensor that
needs a gradient other than the module's own parameters (embeddings, positional tables).
Differentiating the loss w.r.t. the frontier forms every output gradient the kernels need
without the weight-gradient matmuls of a full backward.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch


def depends_on(outputs: Sequence[torch.Tensor], inputs: Iterable[torch.Tensor]) -> bool:
    """Whether autograd would carry a gradient from ``outputs`` back into any of ``inputs``.

    Not the shapes or the call signature: Bart's positional embedding is called with the
    (differentiable) token embeddings but only reads their shape.  Walks the outputs' graph up
    to the inputs' nodes; a leaf input (no node of its own) counts as a dependency.
    """
    nodes = set()
    for t in inputs:
        if not t.requires_grad:
            continue
        if t.grad_fn is None:
            return True
        nodes.add(t.grad_fn)
    if not nodes:
        return False
    stack = [o.grad_fn for o in outputs if o.grad_fn is not None]
    seen = set(stack)
    while stack:
        node = stack.pop()
        if node in nodes:
            return True
        for parent, _ in node.next_functions:
            if parent is not None and parent not in seen:
                seen.add(parent)
                stack.append(parent)
    return False


def used_inside(outputs: list, diff: list[int]) -> list[int]:
    """Indices (of ``diff``) of outputs from which another output of the same call was computed.

    LongT5's local attention returns its position bias and the attention output computed from
    it; a hook on the bias would receive both the gradient from later layers and the one through
    the attention output, and the kernel's vjp would count the second twice.  Such an output
    is handed on as an alias, so its hook sees the uses outside the module only.
    """
    if len(diff) < 2:
        return []
    return [i for i in diff if outputs[i].grad_fn is not None
            and depends_on([outputs[k] for k in diff if k != i], [outputs[i]])]


Frontier = Iterable[tuple[torch.Tensor, int, Sequence[torch.Tensor]]]


def backward_targets(frontier: Frontier) -> list[torch.Tensor]:
    """The tensors to differentiate: each frontier output (tensor, version when its hook saw
    it, its module's parameters), except those changed in place after the hook (CTRL scales its
    embeddings with ``*=``).  The old value's gradient flows only through that in-place op, so
    there the module's parameters are the targets (their gradients are formed, never stored)."""
    targets: dict[int, torch.Tensor] = {}
    for tensor, version, params in frontier:
        if tensor._version == version:
            targets[id(tensor)] = tensor
        else:
            targets.update((id(p), p) for p in params)
    return list(targets.values())
