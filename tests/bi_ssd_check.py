"""Shared by the CPU tests of the fused bi-SSD kernels (test_triton_kernels.py: every config and option;
test_triton_kernels_behaviour.py: determinism, stress, dispatch, autotuning, segments, size limits, rules):
NaN-guarded inputs, a run of the Triton op and of the float64 reference, and the error check of the output and every
gradient (CUDA tensors where a GPU is present, else CPU tensors under the Triton interpreter)."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any triton kernel module is imported

import torch  # noqa: E402

from yolo_bimamba.ops import bi_ssd_reference, kernel_buffers  # noqa: E402
from yolo_bimamba.ops.bi_ssd.autograd import bi_ssd_triton  # noqa: E402
from yolo_bimamba.ops.bi_ssd.tuning import BWD_CONFIGS, FWD_CONFIGS, force_config  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-5, torch.float64: 1e-10}


def make_inputs(b=1, l=9, h=2, p=16, n=16, g=1, dtype=torch.float32, seed=0, d_shape="hp", bias=True,
                softplus=True, sep=False, dt_limit=(0.0, float("inf")), guard=True):
    """Random inputs; every tensor is a contiguous view into a NaN-padded buffer (guard=True),
    so an out-of-bounds read shows up as NaN in the result."""
    gen = torch.Generator().manual_seed(seed)

    def t(*shape, scale=1.0, shift=0.0):
        v = torch.randn(*shape, generator=gen, dtype=torch.float64) * scale + shift
        if not guard:
            return v.to(dtype).to(DEV)
        buf = torch.full((v.numel() + 64,), float("nan"), dtype=dtype, device=DEV)
        view = buf[32:32 + v.numel()].view(shape)
        view.copy_(v)
        return view

    args = [t(b, l, h, p), t(b, l, h, scale=0.7, shift=-0.5 if softplus else 0.3), None,
            t(b, l, g, n, scale=n ** -0.5), t(b, l, g, n, scale=n ** -0.5)]
    A = -torch.rand(h, generator=gen, dtype=torch.float64) * 1.5 - 0.1
    if h > 1:
        A[-1] = 0.3  # positive A is clamped to 0 (its gradient is 0)
    args[2] = A.to(dtype).to(DEV)
    kw = dict(dt_softplus=softplus, dt_limit=dt_limit)
    if d_shape == "hp":
        kw["D"] = t(h, p)
    elif d_shape == "h":
        kw["D"] = t(h)
    if bias:
        kw["dt_bias"] = t(h, scale=0.3)
    if sep:
        kw["dt_bwd"] = t(b, l, h, scale=0.7, shift=-0.5 if softplus else 0.3)
        kw["B_bwd"] = t(b, l, g, n, scale=n ** -0.5)
        kw["C_bwd"] = t(b, l, g, n, scale=n ** -0.5)
    return args, kw


def _leaf(v, dtype=None):
    if not torch.is_tensor(v):
        return v
    # detach() keeps the view into the NaN-guarded buffer (a clone would drop the guard)
    v = v.detach() if dtype is None else v.detach().to(dtype)
    return v.requires_grad_()


def run_triton(args, kw, dy, fwd=None, bwd=None, poison=True):
    leaves = [_leaf(a) for a in args]
    kwl = {k: _leaf(v) for k, v in kw.items()}
    with force_config(fwd=fwd, bwd=bwd), kernel_buffers.poison_outputs(poison):
        y = bi_ssd_triton(*leaves, **kwl)
        y.backward(dy)
        guards_ok = kernel_buffers.check_guards()
    grads = {name: a.grad for name, a in zip("x dt A B C".split(), leaves)}
    grads.update({k: v.grad for k, v in kwl.items() if torch.is_tensor(v)})
    return y.detach(), grads, guards_ok


def run_reference(args, kw, dy):
    leaves = [_leaf(a, torch.float64) for a in args]
    kwl = {k: _leaf(v, torch.float64) for k, v in kw.items()}
    y = bi_ssd_reference(*leaves, **kwl)
    y.backward(dy.to(torch.float64))
    grads = {name: a.grad for name, a in zip("x dt A B C".split(), leaves)}
    grads.update({k: v.grad for k, v in kwl.items() if torch.is_tensor(v)})
    return y.detach(), grads


def _cancel_scales(args, kw, dy):
    """Per head: sum_j |dt_j da_j| (the terms summed into dA) and sum |d dt_raw| (into d dt_bias),
    from the float64 reference with A broadcast per position."""
    x, dt, A, B, C = [a.detach().to(torch.float64) for a in args]
    Af = A.expand(dt.shape).clone().requires_grad_()
    dtl = dt.clone().requires_grad_()
    kw64 = {k: (v.detach().to(torch.float64).requires_grad_() if torch.is_tensor(v) else v) for k, v in kw.items()}
    y = bi_ssd_reference(x, dtl, Af, B, C, **kw64)
    y.backward(dy.to(torch.float64))
    s_bias = dtl.grad.abs().sum((0, 1))
    if "dt_bwd" in kw64:
        s_bias = s_bias + kw64["dt_bwd"].grad.abs().sum((0, 1))
    return {"A": Af.grad.abs().sum((0, 1)).cpu(), "dt_bias": s_bias.cpu()}


def rel_err(a, ref):
    a, ref = a.detach().double().cpu(), ref.detach().double().cpu()
    assert a.shape == ref.shape
    assert torch.isfinite(a).all(), "non-finite values (unwritten or NaN)"
    den = ref.norm()
    if den == 0:
        return a.norm().item()
    return ((a - ref).norm() / den).item()


def check_case(args, kw, fwd=None, bwd=None, tol=None, seed=1):
    x = args[0]
    tol = tol or TOL[x.dtype]
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(x.dtype).to(DEV)
    y, grads, guards_ok = run_triton(args, kw, dy, fwd, bwd)
    assert guards_ok, "a kernel wrote outside an output buffer"
    assert y.dtype == x.dtype
    yr, gr = run_reference(args, kw, dy)
    errs = {"y": rel_err(y, yr)}
    assert set(grads) == set(gr)
    for k in gr:
        assert grads[k] is not None, k
        assert grads[k].dtype == (args["x dt A B C".split().index(k)] if k in "x dt A B C".split() else kw[k]).dtype
        errs[k] = rel_err(grads[k], gr[k])
    if x.dtype != torch.float64:
        # dA and d(dt_bias) are sums over the whole sequence of terms that cancel (the log-decay
        # gradients of one direction sum to ~0): their fp32 error scales with the summed
        # magnitudes, not with the result. Measure them against that scale (see _cancel_scales).
        scale = _cancel_scales(args, kw, dy)
        for k in ("A", "dt_bias"):
            if k in gr:
                err = (grads[k].double().cpu() - gr[k].cpu()).abs()
                den = gr[k].abs().cpu() + scale[k]
                errs[k] = torch.where(den > 0, err / den.clamp_min(1e-300), err).max().item()
    bad = {k: v for k, v in errs.items() if not v <= tol}
    assert not bad, f"relative errors above {tol}: {bad} (all: {errs})"
    return errs


def _qf(i):
    return FWD_CONFIGS[i].kwargs["BLOCK_Q"]


def _qb(i):
    return BWD_CONFIGS[i].kwargs["BLOCK_Q"]


def _first_with_q(configs, q):
    """The index of the first config with chunk length (BLOCK_Q) q."""
    return next(i for i, c in enumerate(configs) if c.kwargs["BLOCK_Q"] == q)
