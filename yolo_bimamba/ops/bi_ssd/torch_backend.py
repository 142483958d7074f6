"""Chunked PyTorch implementation of the bidirectional SSD.

Cost O(L * chunk) per head; autograd by PyTorch; runs on CPU and CUDA and is traceable for
ONNX / TorchScript export (plain tensor ops, no data-dependent Python control flow).
The anti-causal direction is scanned as such (no flips), and both directions share the head-major
copies of their inputs. This backend is the export path, and in float64 the GPU suite's reference.
Every exponent passed to ``exp`` is a segment sum of non-positive log-decays clamped to <= 0 (the masked-out
entries are zeroed after exp), so nothing overflows and no ``inf * 0`` can appear.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .reference import LOG_DECAY_FLOOR, clamp_A, clamp_ste, process_dt


def _pad_seq(t: torch.Tensor, pad: int) -> torch.Tensor:
    if pad == 0 and not torch.jit.is_tracing():  # traced: the pad stays in the graph (0 here, not at other lengths)
        return t
    # pad dim 1 (sequence) at the end; F.pad counts dims from the last one
    spec = [0, 0] * (t.dim() - 2) + [0, pad]
    return F.pad(t, spec)


def _masked_decay(seg: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """exp(seg) where mask, else 0. Where mask holds, seg is a sum of non-positive log-decays (<= 0); elsewhere it
    is >= 0 and is clamped to 0 before exp, so nothing overflows, and the float mask zeroes it (and its gradient).
    Min / Exp / Mul export to ONNX ops that run fast on CPU (a boolean Where over these tensors does not)."""
    return torch.exp(seg.clamp(max=0.0)) * mask


def _head_major(t: torch.Tensor, pad: int, nc: int, chunk: int, g: int, r: int) -> torch.Tensor:
    """(b, l, h) -> (b, g, r, c, t) and (b, l, h, p) -> (b, g, r, c, t, p), h = g * r, padded to whole chunks."""
    b = t.shape[0]
    t = _pad_seq(t, pad)
    tail = tuple(t.shape[3:])
    if g * r == 1:
        # one group and head (B and C of the BiMamba2 blocks): the permute only moves size-1 dims; a reshape says so
        # (an exported graph then holds no Transpose: onnxruntime copied (1, 6400, 1, 32) for 1.2 ms on the CPU)
        return t.reshape(b, 1, 1, nc, chunk, *tail)
    if t.dim() == 3:
        return t.reshape(b, nc, chunk, g, r).permute(0, 3, 4, 1, 2)
    return t.reshape(b, nc, chunk, g, r, *tail).permute(0, 3, 4, 1, 2, 5)


def _head_major_channels_first(t: torch.Tensor, pad: int, nc: int, chunk: int, g: int, r: int,
                               transposed: bool = False) -> torch.Tensor:
    """(b, h * p, l) channels-first (h = g * r) -> (b, g, r, c, t, p), padded to whole chunks: one transpose.
    ``transposed``: each chunk's matrix transposed, (b, g, r, c, p, t), in that one transpose."""
    b, cp, _ = t.shape
    t = F.pad(t, (0, pad)) if pad or torch.jit.is_tracing() else t  # traced: as in _pad_seq
    order = (0, 1, 2, 4, 3, 5) if transposed else (0, 1, 2, 4, 5, 3)
    return t.reshape(b, g, r, cp // (g * r), nc, chunk).permute(order)


def _seq_major(y: torch.Tensor, l: int) -> torch.Tensor:
    """(b, g, r, c, t, p) -> (b, l, h, p)."""
    b, g, r, nc, chunk, p = y.shape
    return y.permute(0, 3, 4, 1, 2, 5).reshape(b, nc * chunk, g * r, p)[:, :l]


def chunk_scan(xs, dts, A, Bs, Cs, reverse: bool, b_transposed: bool = False):
    """One direction of the SSD on head-major chunks (see :func:`_head_major`).

    reverse=False (causal): z[t] = sum_{s<=t} (C_t . B_s) dt_s prod_{k=s+1..t} exp(dt_k A) x_s.
    reverse=True (anti-causal): z[t] = sum_{s>=t} (C_t . B_s) dt_s prod_{k=t..s-1} exp(dt_k A) x_s.
    xs (b, g, r, c, t, p), dts (b, g, r, c, t) processed (>= 0, 0 on padding), A (h,) <= 0, Bs/Cs (b, g, 1, c, t, n).
    Returns z (b, g, r, c, t, p). Every contraction is a batched matmul; no flips. ``b_transposed``: Bs is given as
    (b, g, 1, c, n, t), each chunk's B transposed (what the channels-first export path builds in one transpose).
    """
    b, g, r, nc, chunk, p = xs.shape
    n = Bs.shape[-2 if b_transposed else -1]
    a = clamp_ste(dts * A.reshape(g, r)[None, :, :, None, None], lo=LOG_DECAY_FLOOR)  # log-decays, <= 0
    cs = torch.cumsum(a, dim=-1)  # within-chunk inclusive sums
    idx = torch.arange(chunk, device=xs.device)
    cidx = torch.arange(nc, device=xs.device)
    if not reverse:
        tri = (idx[None, :] <= idx[:, None]).to(xs.dtype)  # (t, s): s <= t
        seg = cs[..., :, None] - cs[..., None, :]  # sum of a over s+1..t
        w_state = torch.exp(cs[..., -1:] - cs) * dts  # from s to the chunk's end
        w_out = torch.exp(cs)  # from the chunk's start to t
    else:
        csx = cs - a  # exclusive sums
        tri = (idx[None, :] >= idx[:, None]).to(xs.dtype)  # (t, s): s >= t
        seg = csx[..., None, :] - csx[..., :, None]  # sum of a over t..s-1
        w_state = torch.exp(csx) * dts  # from the chunk's start to s (exclusive)
        w_out = torch.exp(cs[..., -1:] - csx)  # from t to the chunk's end
    CB = torch.matmul(Cs, Bs) if b_transposed else torch.matmul(Cs, Bs.transpose(-1, -2))
    W = CB * _masked_decay(seg, tri) * dts[..., None, :]
    y = torch.matmul(W, xs)  # intra-chunk

    # state of each chunk as seen from the chunk boundary the scan leaves it by: (n, p) per chunk
    if b_transposed:
        states = torch.matmul(Bs * w_state[..., None, :], xs)  # (b, g, r, c, n, p)
    else:
        states = torch.matmul((Bs * w_state[..., None]).transpose(-1, -2), xs)
    chunk_a = cs[..., -1]  # (b, g, r, c)
    acum = torch.cumsum(chunk_a, dim=-1)
    if not reverse:  # state entering chunk c: chunks c' < c, decayed over chunks c'+1..c-1
        mask = (cidx[None, :] < cidx[:, None]).to(xs.dtype)
        cseg = (acum - chunk_a)[..., :, None] - acum[..., None, :]
    else:  # chunks c' > c, decayed over chunks c+1..c'-1
        mask = (cidx[None, :] > cidx[:, None]).to(xs.dtype)
        cseg = (acum - chunk_a)[..., None, :] - acum[..., :, None]
    T = _masked_decay(cseg, mask)  # (b, g, r, c, c')
    s_in = torch.matmul(T, states.reshape(b, g, r, nc, n * p)).reshape(b, g, r, nc, n, p)
    return y + torch.matmul(Cs, s_in) * w_out[..., None]


def bi_ssd_torch(
    x, dt, A, B, C, *, chunk_size=64, D=None, dt_bias=None, dt_softplus=False,
    dt_limit=(0.0, float("inf")), direction="both", shift=False, dt_bwd=None, B_bwd=None, C_bwd=None,
):
    """Chunked PyTorch bi-SSD. Internals in fp32 (fp64 for fp64 input); output in x's dtype.

    Both directions share the head-major copies of x (and of dt, B, C unless the backward direction has its own);
    the anti-causal direction is computed as such (no flips)."""
    out_dtype = x.dtype
    cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    with torch.autocast(device_type=x.device.type, enabled=False):
        f = lambda t: None if t is None else t.to(cdt)  # noqa: E731
        xf, Af, Bf, Cf = f(x), clamp_A(f(A)), f(B), f(C)
        dtf = process_dt(f(dt), f(dt_bias), dt_softplus, dt_limit)
        b, l, h, p = x.shape
        g = B.shape[2]
        r = h // g
        chunk = chunk_size
        pad = (-l) % chunk
        nc = (l + pad) // chunk
        hm = lambda t, rr: _head_major(t, pad, nc, chunk, g, rr)  # noqa: E731
        xs = hm(xf, r)
        main_in = (hm(dtf, r), hm(Bf, 1), hm(Cf, 1))  # dt_bwd/B_bwd/C_bwd come only with direction="both"
        parts = []  # (z head-major, output shift)
        if direction in ("both", "forward"):
            parts.append((chunk_scan(xs, main_in[0], Af, main_in[1], main_in[2], reverse=False), 1))
        if direction in ("both", "backward"):
            bwd_in = main_in
            if dt_bwd is not None:
                dtb = process_dt(f(dt_bwd), f(dt_bias), dt_softplus, dt_limit)
                bwd_in = (hm(dtb, r), hm(f(B_bwd), 1), hm(f(C_bwd), 1))
            parts.append((chunk_scan(xs, bwd_in[0], Af, bwd_in[1], bwd_in[2], reverse=True), -1))
        if not shift:
            y = _seq_major(parts[0][0] if len(parts) == 1 else parts[0][0] + parts[1][0], l)
        else:  # Hydra: y_f[t] = z_f[t-1], y_b[t] = z_b[t+1]
            y = None
            for z, step in parts:
                z = _seq_major(z, l)
                z = F.pad(z[:, :-1], (0, 0, 0, 0, 1, 0)) if step == 1 else F.pad(z[:, 1:], (0, 0, 0, 0, 0, 1))
                y = z if y is None else y + z
        if D is not None:
            Df = f(D)
            y = y + xf * (Df[:, None] if Df.dim() == 1 else Df)
    return y.to(out_dtype)


def bi_ssd_torch_channels_first(x, dt, A, B, C, *, ngroups, chunk_size=64, D=None, dt_bias=None, dt_softplus=False,
                                dt_limit=(0.0, float("inf"))):
    """:func:`bi_ssd_torch` (both directions, no shift, one dt, B, C) from channels-first x (b, h * p, l) and
    B, C (b, ngroups * n, l), dt (b, l, h) as usual; returns y (b, l, h, p). The export path of nn.BiMamba2: its
    in-projection and conv produce these layouts without a transpose, and each goes head-major in one transpose
    (the sequence-major form would need one more per tensor in an exported graph). Same sums as bi_ssd_torch; D x is
    added head-major, before the one transpose back."""
    out_dtype = x.dtype
    cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    with torch.autocast(device_type=x.device.type, enabled=False):
        f = lambda t: None if t is None else t.to(cdt)  # noqa: E731
        xf, Af = f(x), clamp_A(f(A))
        dtf = process_dt(f(dt), f(dt_bias), dt_softplus, dt_limit)
        b, l, h = dt.shape
        g, p = ngroups, x.shape[1] // h
        r = h // g
        chunk = chunk_size
        pad = (-l) % chunk
        nc = (l + pad) // chunk
        xs = _head_major_channels_first(xf, pad, nc, chunk, g, r)
        dts = _head_major(dtf, pad, nc, chunk, g, r)
        Cs = _head_major_channels_first(f(C), pad, nc, chunk, g, 1)
        # B as each chunk's transpose (b, g, 1, c, n, t): one transpose of the layout, none at its two products
        BsT = _head_major_channels_first(f(B), pad, nc, chunk, g, 1, transposed=True)
        y = chunk_scan(xs, dts, Af, BsT, Cs, False, True) + chunk_scan(xs, dts, Af, BsT, Cs, True, True)
        if D is not None:
            Df = f(D)
            y = y + xs * (Df.reshape(1, g, r, 1, 1, 1) if Df.dim() == 1 else Df.reshape(1, g, r, 1, 1, p))
        y = _seq_major(y, l)
    return y.to(out_dtype)
