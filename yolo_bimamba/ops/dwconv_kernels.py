"""Triton kernels of the depthwise "same" convolution over the sequence followed by SiLU (Mamba2's / Hydra's conv1d).

Layout: u (b, l, c) with unit channel stride (any batch and row strides: a slice of the in-projection's output is
read in place, no transpose or copy); weight (c, k) with k odd; y (b, l, c) contiguous.
    pre[b, t, c] = bias[c] + sum_j w[c, j] u[b, t + j - k // 2, c]   (rows outside [0, l) are zero)
    y = pre * sigmoid(pre)
Backward, two kernels, one program per (batch, block of rows, block of channels), no atomics (bitwise repeatable):
  _dwconv_silu_bwd_pre: gp = dy * silu'(pre) (pre recomputed), fp32, and per-program partial sums of gp (-> d bias);
  _dwconv_silu_bwd_in:  du[t] = sum_j w[j] gp[t - j + k // 2], and per-program partials sum_t gp[t] u[t + j - k // 2]
                        (-> d weight); the op sums the partials in a fixed order.
All arithmetic in fp32 (fp64 for fp64 inputs).
"""
from __future__ import annotations

import triton
import triton.language as tl

# (BLOCK_L, BLOCK_C, num_warps); every config must give the same result, the tests force each one
CONFIGS = [(64, 64, 4), (128, 32, 4), (32, 128, 4)]


@triton.jit
def _pre_tile(u_ptr, w_ptr, bias_ptr, u_off, rows, cols, mcol, L, su_l, K: tl.constexpr, HAS_BIAS: tl.constexpr,
              COMPUTE: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr):
    acc = tl.zeros((BLOCK_L, BLOCK_C), dtype=COMPUTE)
    for j in tl.static_range(K):
        r = rows + (j - K // 2)
        m = ((r >= 0) & (r < L))[:, None] & mcol[None, :]
        v = tl.load(u_ptr + u_off + r[:, None].to(tl.int64) * su_l + cols[None, :], mask=m, other=0.0).to(COMPUTE)
        wj = tl.load(w_ptr + cols * K + j, mask=mcol, other=0.0).to(COMPUTE)
        acc += v * wj[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=mcol, other=0.0).to(COMPUTE)[None, :]
    return acc


@triton.jit
def _tile(L, Cn, BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr):
    """This program's batch index, partial-sum slot, rows, channels and their masks."""
    pid_b = tl.program_id(0).to(tl.int64)
    pid_l = tl.program_id(1)
    rows = pid_l * BLOCK_L + tl.arange(0, BLOCK_L)
    cols = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    return pid_b, pid_b * tl.num_programs(1) + pid_l, rows, cols, rows < L, cols < Cn


@triton.jit
def _dwconv_silu_fwd(u_ptr, w_ptr, bias_ptr, y_ptr, L, Cn, su_b, su_l,
                     K: tl.constexpr, HAS_BIAS: tl.constexpr, COMPUTE: tl.constexpr,
                     BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr):
    pid_b, _part, rows, cols, mrow, mcol = _tile(L, Cn, BLOCK_L, BLOCK_C)
    pre = _pre_tile(u_ptr, w_ptr, bias_ptr, pid_b * su_b, rows, cols, mcol, L, su_l, K, HAS_BIAS, COMPUTE,
                    BLOCK_L, BLOCK_C)
    y = pre / (1.0 + tl.exp(-pre))
    m = mrow[:, None] & mcol[None, :]
    tl.store(y_ptr + pid_b * L * Cn + rows[:, None].to(tl.int64) * Cn + cols[None, :], y.to(y_ptr.dtype.element_ty),
             mask=m)


@triton.jit
def _dwconv_silu_bwd_pre(u_ptr, w_ptr, bias_ptr, dy_ptr, gp_ptr, dbias_part_ptr, L, Cn, su_b, su_l,
                         K: tl.constexpr, HAS_BIAS: tl.constexpr, COMPUTE: tl.constexpr,
                         BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr):
    pid_b, part, rows, cols, mrow, mcol = _tile(L, Cn, BLOCK_L, BLOCK_C)
    m = mrow[:, None] & mcol[None, :]
    pre = _pre_tile(u_ptr, w_ptr, bias_ptr, pid_b * su_b, rows, cols, mcol, L, su_l, K, HAS_BIAS, COMPUTE,
                    BLOCK_L, BLOCK_C)
    off = pid_b * L * Cn + rows[:, None].to(tl.int64) * Cn + cols[None, :]
    dy = tl.load(dy_ptr + off, mask=m, other=0.0).to(COMPUTE)
    s = 1.0 / (1.0 + tl.exp(-pre))
    gp = tl.where(m, dy * s * (1.0 + pre * (1.0 - s)), 0.0)
    tl.store(gp_ptr + off, gp, mask=m)
    if HAS_BIAS:
        tl.store(dbias_part_ptr + part * Cn + cols, tl.sum(gp, 0), mask=mcol)


@triton.jit
def _dwconv_silu_bwd_in(u_ptr, w_ptr, gp_ptr, du_ptr, dw_part_ptr, L, Cn, su_b, su_l,
                        K: tl.constexpr, COMPUTE: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr):
    pid_b, part, rows, cols, mrow, mcol = _tile(L, Cn, BLOCK_L, BLOCK_C)
    g_base = gp_ptr + pid_b * L * Cn
    u_base = u_ptr + pid_b * su_b
    gp = tl.load(g_base + rows[:, None].to(tl.int64) * Cn + cols[None, :], mask=mrow[:, None] & mcol[None, :],
                 other=0.0).to(COMPUTE)
    du = tl.zeros((BLOCK_L, BLOCK_C), dtype=COMPUTE)
    for j in tl.static_range(K):
        wj = tl.load(w_ptr + cols * K + j, mask=mcol, other=0.0).to(COMPUTE)
        # input row t feeds output rows t - j + K // 2
        r = rows - (j - K // 2)
        m = ((r >= 0) & (r < L))[:, None] & mcol[None, :]
        du += wj[None, :] * tl.load(g_base + r[:, None].to(tl.int64) * Cn + cols[None, :], mask=m, other=0.0).to(COMPUTE)
        # weight j pairs output row t with input row t + j - K // 2
        ru = rows + (j - K // 2)
        mu = ((ru >= 0) & (ru < L))[:, None] & mcol[None, :]
        uv = tl.load(u_base + ru[:, None].to(tl.int64) * su_l + cols[None, :], mask=mu, other=0.0).to(COMPUTE)
        tl.store(dw_part_ptr + (part * K + j) * Cn + cols, tl.sum(gp * uv, 0), mask=mcol)
    tl.store(du_ptr + pid_b * L * Cn + rows[:, None].to(tl.int64) * Cn + cols[None, :], du.to(du_ptr.dtype.element_ty),
             mask=mrow[:, None] & mcol[None, :])
