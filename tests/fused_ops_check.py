"""Shared checks of the fused block ops (ops.dwconv, ops.gated_norm), CPU interpreter and GPU tests alike."""
from __future__ import annotations

import torch

from yolo_bimamba.ops import kernel_buffers


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def poisoned_run(op, leaves, dy, force_config, cfg):
    """op(*leaves) and the gradients of every leaf, config ``cfg`` forced, every output and gradient buffer filled
    with NaN first, with NaN guard regions that must stay intact."""
    with force_config(cfg), kernel_buffers.poison_outputs(True):
        y = op(*leaves)
        grads = torch.autograd.grad(y, leaves, dy)
        if y.is_cuda:
            torch.cuda.synchronize()
        assert kernel_buffers.check_guards(), "a kernel wrote outside its buffer"
    return (y, *grads)


def check_against_float64(got, reference, leaves, dy, names, tol, dtypes):
    """got = (y, *grads) of ``leaves``; reference(*float64 leaves) -> y: every tensor finite, in the expected dtype,
    and within ``tol`` (relative norm) of the float64 result."""
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    yr = reference(*ref_leaves)
    want = (yr, *torch.autograd.grad(yr, ref_leaves, dy.double()))
    for name, a, r, dt in zip(names, got, want, dtypes):
        assert a.dtype == dt and a.shape == r.shape, f"{name}: {a.dtype} {tuple(a.shape)}"
        assert torch.isfinite(a).all() and rel(a, r) <= tol, f"{name}: {rel(a, r)}"
