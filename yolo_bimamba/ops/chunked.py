"""Chunked PyTorch implementation of the bidirectional SSD.

Cost O(L * chunk) per head; autograd by PyTorch; runs on CPU and CUDA and is traceable for
ONNX / TorchScript export (plain tensor ops, no data-dependent Python control flow).
The reverse direction is the causal scan of the flipped sequence: this backend is the
reference and the export path, the fused Triton kernels avoid the flips.
Every exponent passed to ``exp`` is a masked segment sum of non-positive log-decays, so it is
<= 0 and no ``inf * 0`` can appear.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .reference import clamp_A, process_dt


def _pad_seq(t: torch.Tensor, pad: int) -> torch.Tensor:
    if pad == 0:
        return t
    # pad dim 1 (sequence) at the end; F.pad counts dims from the last one
    spec = [0, 0] * (t.dim() - 2) + [0, pad]
    return F.pad(t, spec)


def _masked_decay(seg: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """exp(seg) where mask, else 0. Where mask holds, seg is a sum of non-positive log-decays (<= 0); elsewhere it
    is >= 0 and is clamped to 0 before exp, so nothing overflows, and the float mask zeroes it (and its gradient).
    Min / Exp / Mul export to ONNX ops that run fast on CPU (a boolean Where over these tensors does not)."""
    return torch.exp(seg.clamp(max=0.0)) * mask


def causal_scan(x, dt, A, B, C, chunk: int):
    """z[t] = sum_{s<=t} (C_t . B_s) dt_s prod_{k=s+1..t} exp(dt_k A) x_s.

    x (b, l, h, p), dt (b, l, h) already processed (>= 0), A (h,) <= 0, B/C (b, l, g, n).
    All tensors share one floating dtype (fp32 or fp64). Returns z (b, l, h, p).
    Internally (batch, group, head in group, chunk, row, ...), so every contraction is a batched matmul.
    """
    b, l, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    r = h // g
    pad = (-l) % chunk
    nc = (l + pad) // chunk
    # padded steps have dt = 0: they add nothing and decay by exp(0) = 1
    xs = _pad_seq(x, pad).reshape(b, nc, chunk, g, r, p).permute(0, 3, 4, 1, 2, 5)  # (b, g, r, c, t, p)
    dts = _pad_seq(dt, pad).reshape(b, nc, chunk, g, r).permute(0, 3, 4, 1, 2)  # (b, g, r, c, t)
    Bs = _pad_seq(B, pad).reshape(b, nc, chunk, g, 1, n).permute(0, 3, 4, 1, 2, 5)  # (b, g, 1, c, t, n)
    Cs = _pad_seq(C, pad).reshape(b, nc, chunk, g, 1, n).permute(0, 3, 4, 1, 2, 5)

    a = dts * A.reshape(g, r)[None, :, :, None, None]  # log-decays, <= 0
    cs = torch.cumsum(a, dim=-1)  # within-chunk inclusive sums

    # intra-chunk: (C_t . B_s) exp(cs[t] - cs[s]) dt_s for s <= t
    idx = torch.arange(chunk, device=x.device)
    tri = (idx[None, :] <= idx[:, None]).to(x.dtype)  # (t, s)
    decay = _masked_decay(cs[..., :, None] - cs[..., None, :], tri)  # (b, g, r, c, t, s)
    W = torch.matmul(Cs, Bs.transpose(-1, -2)) * decay * dts[..., None, :]
    y = torch.matmul(W, xs)  # (b, g, r, c, t, p)

    # state contributed by each chunk, taken to its end: (n, p) per chunk
    to_end = torch.exp(cs[..., -1:] - cs) * dts  # (b, g, r, c, s)
    states = torch.matmul((Bs * to_end[..., None]).transpose(-1, -2), xs)  # (b, g, r, c, n, p)
    # state entering chunk c: sum_{c'<c} exp(sum of the log-decays of chunks c'+1..c-1) states[c']
    chunk_a = cs[..., -1]  # (b, g, r, c)
    acum = torch.cumsum(chunk_a, dim=-1)
    cidx = torch.arange(nc, device=x.device)
    lower = (cidx[None, :] < cidx[:, None]).to(x.dtype)  # (c, c')
    T = _masked_decay((acum - chunk_a)[..., :, None] - acum[..., None, :], lower)  # (b, g, r, c, c')
    s_in = torch.matmul(T, states.reshape(b, g, r, nc, n * p)).reshape(b, g, r, nc, n, p)
    y = y + torch.matmul(Cs, s_in) * torch.exp(cs)[..., None]
    return y.permute(0, 3, 4, 1, 2, 5).reshape(b, nc * chunk, h, p)[:, :l]


def _flip(t):
    return torch.flip(t, dims=(1,))


def bi_ssd_torch(
    x, dt, A, B, C, *, chunk_size=64, D=None, dt_bias=None, dt_softplus=False,
    dt_limit=(0.0, float("inf")), direction="both", shift=False, dt_bwd=None, B_bwd=None, C_bwd=None,
):
    """Chunked PyTorch bi-SSD. Internals in fp32 (fp64 for fp64 input); output in x's dtype."""
    out_dtype = x.dtype
    cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    with torch.autocast(device_type=x.device.type, enabled=False):
        f = lambda t: None if t is None else t.to(cdt)  # noqa: E731
        xf, Af, Bf, Cf = f(x), clamp_A(f(A)), f(B), f(C)
        dtf = process_dt(f(dt), f(dt_bias), dt_softplus, dt_limit)
        y = None
        if direction in ("both", "forward"):
            z = causal_scan(xf, dtf, Af, Bf, Cf, chunk_size)
            if shift:  # y[t] = z[t-1]
                z = F.pad(z[:, :-1], (0, 0, 0, 0, 1, 0))
            y = z
        if direction in ("both", "backward"):
            if dt_bwd is None:
                dtb, Bb, Cb = dtf, Bf, Cf
            else:
                dtb, Bb, Cb = process_dt(f(dt_bwd), f(dt_bias), dt_softplus, dt_limit), f(B_bwd), f(C_bwd)
            z = _flip(causal_scan(_flip(xf), _flip(dtb), Af, _flip(Bb), _flip(Cb), chunk_size))
            if shift:  # y[t] = z[t+1]
                z = F.pad(z[:, 1:], (0, 0, 0, 0, 0, 1))
            y = z if y is None else y + z
        if D is not None:
            Df = f(D)
            y = y + xf * (Df[:, None] if Df.dim() == 1 else Df)
    return y.to(out_dtype)
