"""Triton kernels of the gated RMSNorm of Mamba2 / Hydra blocks (norm after the gate):

    g = x * silu(z);   r = 1 / sqrt(mean(g^2) + eps);   out = g * r * w      (per row of d channels, fp32)

x (rows, d) contiguous, z (rows, d) with unit channel stride and any row stride (a slice of the in-projection's
output), w (d,). One program per block of rows holding whole rows (BLOCK_D >= d). The forward keeps r per row for
the backward:
    n = g r,  dn = dout w,  dg = r (dn - n mean(dn n)),  dx = dg silu(z),  dz = dg x silu'(z),
and per-program partial sums of dout n (-> dw, summed by the op in a fixed order: no atomics).
"""
from __future__ import annotations

import triton
import triton.language as tl

# (BLOCK_R rows per program, num_warps); every config gives the same result, the tests force each one
CONFIGS = [(16, 4), (4, 2), (64, 8)]


@triton.jit
def _load_rows(x_ptr, z_ptr, rows, cols, m, D, sz, COMPUTE: tl.constexpr):
    r64 = rows[:, None].to(tl.int64)
    x = tl.load(x_ptr + r64 * D + cols[None, :], mask=m, other=0.0).to(COMPUTE)
    z = tl.load(z_ptr + r64 * sz + cols[None, :], mask=m, other=0.0).to(COMPUTE)
    s = 1.0 / (1.0 + tl.exp(-z))
    return x, z, s


@triton.jit
def _gated_rmsnorm_fwd(x_ptr, z_ptr, w_ptr, out_ptr, rstd_ptr, R, D, sz, eps,
                       COMPUTE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_D)
    mrow = rows < R
    mcol = cols < D
    m = mrow[:, None] & mcol[None, :]
    x, z, s = _load_rows(x_ptr, z_ptr, rows, cols, m, D, sz, COMPUTE)
    g = x * z * s
    r = 1.0 / tl.sqrt(tl.sum(g * g, 1) / D + eps)
    w = tl.load(w_ptr + cols, mask=mcol, other=0.0).to(COMPUTE)
    out = g * r[:, None] * w[None, :]
    tl.store(out_ptr + rows[:, None].to(tl.int64) * D + cols[None, :], out.to(out_ptr.dtype.element_ty), mask=m)
    tl.store(rstd_ptr + rows, r, mask=mrow)


@triton.jit
def _gated_rmsnorm_bwd(x_ptr, z_ptr, w_ptr, rstd_ptr, dout_ptr, dx_ptr, dz_ptr, dw_part_ptr, R, D, sz,
                       COMPUTE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_D)
    mrow = rows < R
    mcol = cols < D
    m = mrow[:, None] & mcol[None, :]
    x, z, s = _load_rows(x_ptr, z_ptr, rows, cols, m, D, sz, COMPUTE)
    r = tl.load(rstd_ptr + rows, mask=mrow, other=0.0).to(COMPUTE)
    w = tl.load(w_ptr + cols, mask=mcol, other=0.0).to(COMPUTE)
    off = rows[:, None].to(tl.int64) * D + cols[None, :]
    dout = tl.load(dout_ptr + off, mask=m, other=0.0).to(COMPUTE)
    silu = z * s
    n = x * silu * r[:, None]
    tl.store(dw_part_ptr + pid.to(tl.int64) * D + cols, tl.sum(dout * n, 0), mask=mcol)
    dn = dout * w[None, :]
    dg = r[:, None] * (dn - n * (tl.sum(dn * n, 1) / D)[:, None])
    tl.store(dx_ptr + off, (dg * silu).to(dx_ptr.dtype.element_ty), mask=m)
    dz = dg * x * (s * (1.0 + z * (1.0 - s)))
    tl.store(dz_ptr + off, dz.to(dz_ptr.dtype.element_ty), mask=m)


def block_d(d: int) -> int:
    return triton.next_power_of_2(d)
