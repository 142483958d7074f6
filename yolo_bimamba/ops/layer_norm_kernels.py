"""Triton kernels of the blocks' token LayerNorm, read straight from the (N, C, L) feature map:

    out[n, l, :] = (x[n, :, l] - mean) * rstd * w + b,   mean, rstd over the C channels of token l (fp32)

x (N, C, L) contiguous (channels-first: a token's channels are L apart, so a tile of BLOCK_L tokens x BLOCK_C
channels is read along l, coalesced); out (N, L, C) contiguous, the token-major layout the mixer takes. One program
per block of BLOCK_L tokens of one image (BLOCK_C >= C: whole tokens). The forward keeps mean and rstd per token for
the backward:
    xhat = (x - mean) rstd,  g = dout w,  dx = rstd (g - mean_c(g) - xhat mean_c(g xhat))   (written channels-first),
and per-program partial sums of dout xhat and dout (-> dw, db, summed by the op in a fixed order: no atomics).
"""
from __future__ import annotations

import triton
import triton.language as tl

# (BLOCK_L tokens per program, num_warps); every config gives the same result, the tests force each one
CONFIGS = [(32, 4), (8, 2), (128, 8)]


@triton.jit
def _tile(pid_l, pid_n, C, L, BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr):
    """Token indices, channel indices, mask, and the offsets of the tile in the (N, C, L) and (N, L, C) layouts."""
    toks = pid_l * BLOCK_L + tl.arange(0, BLOCK_L)
    chans = tl.arange(0, BLOCK_C)
    mtok = toks < L
    m = mtok[:, None] & (chans < C)[None, :]
    base = pid_n.to(tl.int64) * C * L
    cf = base + chans[None, :].to(tl.int64) * L + toks[:, None]
    tm = base + toks[:, None].to(tl.int64) * C + chans[None, :]
    return toks, chans, mtok, m, cf, tm


@triton.jit
def _layer_norm_cf_fwd(x_ptr, w_ptr, b_ptr, out_ptr, mean_ptr, rstd_ptr, C, L, eps,
                       COMPUTE: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr):
    pid_l, pid_n = tl.program_id(0), tl.program_id(1)
    toks, chans, mtok, m, cf, tm = _tile(pid_l, pid_n, C, L, BLOCK_L, BLOCK_C)
    x = tl.load(x_ptr + cf, mask=m, other=0.0).to(COMPUTE)
    mean = tl.sum(x, 1) / C
    xc = tl.where(m, x - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, 1) / C + eps)
    w = tl.load(w_ptr + chans, mask=chans < C, other=0.0).to(COMPUTE)
    b = tl.load(b_ptr + chans, mask=chans < C, other=0.0).to(COMPUTE)
    out = xc * rstd[:, None] * w[None, :] + b[None, :]
    tl.store(out_ptr + tm, out.to(out_ptr.dtype.element_ty), mask=m)
    row = pid_n.to(tl.int64) * L + toks
    tl.store(mean_ptr + row, mean, mask=mtok)
    tl.store(rstd_ptr + row, rstd, mask=mtok)


@triton.jit
def _layer_norm_cf_bwd(x_ptr, w_ptr, mean_ptr, rstd_ptr, dout_ptr, dx_ptr, dw_part_ptr, db_part_ptr, C, L,
                       COMPUTE: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr):
    pid_l, pid_n = tl.program_id(0), tl.program_id(1)
    toks, chans, mtok, m, cf, tm = _tile(pid_l, pid_n, C, L, BLOCK_L, BLOCK_C)
    row = pid_n.to(tl.int64) * L + toks
    mean = tl.load(mean_ptr + row, mask=mtok, other=0.0).to(COMPUTE)
    rstd = tl.load(rstd_ptr + row, mask=mtok, other=0.0).to(COMPUTE)
    x = tl.load(x_ptr + cf, mask=m, other=0.0).to(COMPUTE)
    xhat = tl.where(m, (x - mean[:, None]) * rstd[:, None], 0.0)
    dout = tl.load(dout_ptr + tm, mask=m, other=0.0).to(COMPUTE)
    w = tl.load(w_ptr + chans, mask=chans < C, other=0.0).to(COMPUTE)
    part = (pid_n.to(tl.int64) * tl.num_programs(0) + pid_l) * C + chans
    tl.store(dw_part_ptr + part, tl.sum(dout * xhat, 0), mask=chans < C)
    tl.store(db_part_ptr + part, tl.sum(dout, 0), mask=chans < C)
    g = dout * w[None, :]
    dx = rstd[:, None] * (g - (tl.sum(g, 1) / C)[:, None] - xhat * (tl.sum(g * xhat, 1) / C)[:, None])
    tl.store(dx_ptr + cf, dx.to(dx_ptr.dtype.element_ty), mask=m)


def block_c(c: int) -> int:
    return triton.next_power_of_2(c)
