"""Naive float64 quadratic reference of the bidirectional SSD (tests and benchmarks only).

It builds the full (L x L) mixing matrix of each head from the definition and multiplies.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


# Floor of one step's log-decay dt * A in the fast backends (chunked PyTorch op, Triton kernels); this quadratic
# reference keeps the plain definition. exp(-104) is below fp32's smallest subnormal: no decay that fp32 can hold
# changes, and the gradient through a floored step (whose true value carries a factor exp(dt A) < 1e-45) is 0. It
# keeps the in-chunk cumsums of log-decays small, so their differences (the decays between nearby steps) stay
# accurate in fp32 when single steps are huge (dt A ~ -1e4 would make the cumsums ~ -6e5, spaced 0.06 apart).
LOG_DECAY_FLOOR = -104.0


def clamp_ste(v, lo=float("-inf"), hi=float("inf")):
    """clamp(v, lo, hi) whose gradient is 1 strictly inside (lo, hi) and 0 at and beyond the bounds.

    Every backend (PyTorch and Triton) uses this convention, spelled out here so that it does not
    depend on how a given torch version differentiates ``clamp`` at the boundary."""
    return torch.where((v > lo) & (v < hi), v, v.detach().clamp(min=lo, max=hi))


def clamp_A(A):
    """A -> min(A, 0) with the gradient convention of :func:`clamp_ste`."""
    return clamp_ste(A, hi=0.0)


def process_dt(dt, dt_bias=None, dt_softplus=False, dt_limit=(0.0, float("inf"))):
    """dt -> clamp(softplus(dt + dt_bias)) in the dtype of ``dt`` (shared by the PyTorch backends)."""
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = F.softplus(dt)
    return clamp_ste(dt, float(dt_limit[0]), float(dt_limit[1]))


def _direction_matrix(dt, A, B, C, causal: bool, shift: bool):
    """M[b, h, t, s] for one direction, float64."""
    b, l, h = dt.shape
    g = B.shape[2]
    Bh = B.repeat_interleave(h // g, dim=2)  # (b, l, h, n)
    Ch = C.repeat_interleave(h // g, dim=2)
    a = dt * A  # (b, l, h), <= 0
    cs = torch.cumsum(a, dim=1)  # inclusive: sum_{k<=t} a_k
    csx = cs - a  # exclusive: sum_{k<t} a_k
    t = torch.arange(l, device=dt.device)
    tt, ss = t[:, None], t[None, :]
    if causal:
        # no shift: prod_{k=s+1..t} a_k = exp(cs[t]-cs[s]), s <= t, C at t
        # shift:    prod_{k=s+1..t-1} a_k = exp(csx[t]-cs[s]), s <= t-1, C at t-1
        row = csx if shift else cs
        mask = ss <= tt - 1 if shift else ss <= tt
        crow = torch.roll(Ch, 1, dims=1) if shift else Ch  # C[t-1] at row t (row 0 masked anyway)
        seg = row.transpose(1, 2)[:, :, :, None] - cs.transpose(1, 2)[:, :, None, :]
    else:
        # no shift: prod_{k=t..s-1} a_k = exp(csx[s]-csx[t]), s >= t, C at t
        # shift:    prod_{k=t+1..s-1} a_k = exp(csx[s]-cs[t]), s >= t+1, C at t+1
        row = cs if shift else csx
        mask = ss >= tt + 1 if shift else ss >= tt
        crow = torch.roll(Ch, -1, dims=1) if shift else Ch
        seg = csx.transpose(1, 2)[:, :, None, :] - row.transpose(1, 2)[:, :, :, None]
    decay = torch.exp(torch.where(mask, seg, torch.full_like(seg, -float("inf"))))
    G = torch.einsum("bthn,bshn->bhts", crow, Bh)
    return G * decay * dt.transpose(1, 2)[:, :, None, :]


def bi_ssd_reference(
    x, dt, A, B, C, *, D=None, dt_bias=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
    direction="both", shift=False, dt_bwd=None, B_bwd=None, C_bwd=None, **_ignored,
):
    """Quadratic float64 reference; returns y in float64. Same semantics as ``bi_ssd``."""
    f64 = lambda t: None if t is None else t.to(torch.float64)  # noqa: E731
    x, dt, A, B, C, D, dt_bias = map(f64, (x, dt, A, B, C, D, dt_bias))
    A = clamp_A(A)
    dtf = process_dt(dt, dt_bias, dt_softplus, dt_limit)
    if dt_bwd is None:
        dtb, Bb, Cb = dtf, B, C
    else:
        dtb, Bb, Cb = process_dt(f64(dt_bwd), dt_bias, dt_softplus, dt_limit), f64(B_bwd), f64(C_bwd)
    M = torch.zeros(x.shape[0], x.shape[2], x.shape[1], x.shape[1], dtype=torch.float64, device=x.device)
    if direction in ("both", "forward"):
        M = M + _direction_matrix(dtf, A, B, C, causal=True, shift=shift)
    if direction in ("both", "backward"):
        M = M + _direction_matrix(dtb, A, Bb, Cb, causal=False, shift=shift)
    y = torch.einsum("bhts,bshp->bthp", M, x)
    if D is not None:
        y = y + x * (D[:, None] if D.dim() == 1 else D)
    return y
