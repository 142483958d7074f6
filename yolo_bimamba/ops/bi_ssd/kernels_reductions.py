"""The backward's reductions of the bidirectional SSD: pass C and the sums over the batch.

Pass C (_bi_ssd_bwd_dt_kernel, one program per (batch * head)) reverse-sums the scratch the segment and pairs kernels
wrote: per direction da_j = sum_{k >= j} dcs_k + da_direct_j, then ddt_raw = (ddt_direct + A da) * d dt / d raw, and
per-(batch, head) partials of dA = sum_j dt_j da_j and d dt_bias = sum_j ddt_raw_j. _bi_ssd_grad_sums_kernel (one
program per head) sums those partials and the segment kernel's dD partials over the batch (and the segments) in a
fixed order: dA, d dt_bias, dD in the dtypes of A, dt_bias, D.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .kernels_common import LOG_DECAY_FLOOR, _head_coords, _head_params, _load_dt


@triton.jit
def _bi_ssd_bwd_dt_kernel(
    dt_ptr, A_ptr, bias_ptr, dtb_ptr, ddt_ptr, ddtb_ptr, scr_ptr, part_ptr,
    L, H, dt_lo, dt_hi,
    DO_F: tl.constexpr, DO_B: tl.constexpr, SEPARATE: tl.constexpr, HAS_BIAS: tl.constexpr,
    SOFTPLUS: tl.constexpr, COMPUTE: tl.constexpr, BLOCK_Q: tl.constexpr,
):
    """Pass C, one program per (batch * head), reverse walk over per-position scalars only:
    da[j] = sum_{k>=j} dcs[k] + da_direct[j] per direction;  ddt_raw = (ddt_direct + A da) * d dt/d raw
    (the two directions' terms summed when they share dt); per-(batch, head) partials [dA, d dt_bias]."""
    pid = tl.program_id(0)
    hidx, _gidx, b64 = _head_coords(pid, H, 1)
    offs_q = tl.arange(0, BLOCK_Q)
    dto = b64 * L * H + hidx
    so = pid.to(tl.int64) * 6 * L
    A_raw, A_h, bias = _head_params(A_ptr, bias_ptr, hidx, HAS_BIAS, COMPUTE)
    nchunks = tl.cdiv(L, BLOCK_Q)
    carry_f = tl.zeros((BLOCK_Q,), dtype=COMPUTE)
    carry_b = tl.zeros((BLOCK_Q,), dtype=COMPUTE)
    dA_vec = tl.zeros((BLOCK_Q,), dtype=COMPUTE)
    dbias_vec = tl.zeros((BLOCK_Q,), dtype=COMPUTE)
    for ci in range(0, nchunks):
        c = nchunks - 1 - ci
        rows = c * BLOCK_Q + offs_q
        mrow = rows < L
        dtf, dgf = _load_dt(dt_ptr + dto, bias, rows, mrow, H, dt_lo, dt_hi, SOFTPLUS, COMPUTE)
        zero = tl.zeros((BLOCK_Q,), dtype=COMPUTE)
        if DO_F:
            s_dcs = tl.load(scr_ptr + so + rows, mask=mrow, other=0.0).to(COMPUTE)
            s_ddt = tl.load(scr_ptr + so + L + rows, mask=mrow, other=0.0).to(COMPUTE)
            s_dadirf = tl.load(scr_ptr + so + 5 * L + rows, mask=mrow, other=0.0).to(COMPUTE)
        else:
            s_dcs = zero
            s_ddt = zero
            s_dadirf = zero
        if DO_B:
            s_dadir = tl.load(scr_ptr + so + 2 * L + rows, mask=mrow, other=0.0).to(COMPUTE)
            s_dcsb = tl.load(scr_ptr + so + 3 * L + rows, mask=mrow, other=0.0).to(COMPUTE)
            s_ddtb = tl.load(scr_ptr + so + 4 * L + rows, mask=mrow, other=0.0).to(COMPUTE)
        else:
            s_dadir = zero
            s_dcsb = zero
            s_ddtb = zero
        da = carry_f + tl.cumsum(s_dcs, 0, reverse=True) + s_dadirf
        carry_f += tl.sum(s_dcs, 0)
        dab = carry_b + tl.cumsum(s_dcsb, 0, reverse=True) + s_dadir
        carry_b += tl.sum(s_dcsb, 0)
        # a step at the log-decay floor passes no gradient to dt or A through its decay
        live_f = dtf * A_h > LOG_DECAY_FLOOR
        if SEPARATE:
            g = (s_ddt + tl.where(live_f, A_h * da, 0.0)) * dgf
            dtb, dgb = _load_dt(dtb_ptr + dto, bias, rows, mrow, H, dt_lo, dt_hi, SOFTPLUS, COMPUTE)
            live_b = dtb * A_h > LOG_DECAY_FLOOR
            gb = (s_ddtb + tl.where(live_b, A_h * dab, 0.0)) * dgb
            tl.store(ddtb_ptr + dto + rows * H, gb.to(ddtb_ptr.dtype.element_ty), mask=mrow)
            dA_vec += tl.where(live_f, dtf * da, 0.0) + tl.where(live_b, dtb * dab, 0.0)
            dbias_vec += g + gb
        else:
            g = (s_ddt + s_ddtb + tl.where(live_f, A_h * (da + dab), 0.0)) * dgf
            dA_vec += tl.where(live_f, dtf * (da + dab), 0.0)
            dbias_vec += g
        tl.store(ddt_ptr + dto + rows * H, g.to(ddt_ptr.dtype.element_ty), mask=mrow)
    dA_tot = tl.where(A_raw < 0.0, tl.sum(dA_vec, 0), 0.0)  # as reference.clamp_A
    tl.store(part_ptr + pid.to(tl.int64) * 2, dA_tot)
    tl.store(part_ptr + pid.to(tl.int64) * 2 + 1, tl.sum(dbias_vec, 0))


@triton.jit
def _bi_ssd_grad_sums_kernel(
    part_ptr, part_d_ptr, dA_ptr, dbias_ptr, dD_ptr, NB, H, NSEG,
    P: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_R: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_D: tl.constexpr, D_PER_P: tl.constexpr, COMPUTE: tl.constexpr,
):
    """The backward's sums over the batch, one program per head: dA and d(dt_bias) from pass C's per-(batch, head)
    partials part (b, h, 2), dD from the segment kernel's per-(batch, head, segment) partials part_d (b, h, nseg, p),
    summed over the headdim too for a D per head. Each sum runs in a fixed order (blocks of BLOCK_R rows, then one
    reduction of the block), the same in every run; the results are stored in the dtypes of the outputs (one launch in
    place of several torch reductions)."""
    hidx = tl.program_id(0)
    offs_r = tl.arange(0, BLOCK_R)
    acc_a = tl.zeros((BLOCK_R,), dtype=COMPUTE)
    acc_b = tl.zeros((BLOCK_R,), dtype=COMPUTE)
    for r0 in range(0, NB, BLOCK_R):
        rb = r0 + offs_r
        mb = rb < NB
        off = (rb.to(tl.int64) * H + hidx) * 2
        acc_a += tl.load(part_ptr + off, mask=mb, other=0.0).to(COMPUTE)
        acc_b += tl.load(part_ptr + off + 1, mask=mb, other=0.0).to(COMPUTE)
    tl.store(dA_ptr + hidx, tl.sum(acc_a, 0).to(dA_ptr.dtype.element_ty))
    if HAS_BIAS:
        tl.store(dbias_ptr + hidx, tl.sum(acc_b, 0).to(dbias_ptr.dtype.element_ty))
    if HAS_D:
        offs_p = tl.arange(0, BLOCK_P)
        mask_p = offs_p < P
        acc_d = tl.zeros((BLOCK_R, BLOCK_P), dtype=COMPUTE)
        # rows r = batch * nseg + segment of this head
        for r0 in range(0, NB * NSEG, BLOCK_R):
            r = r0 + offs_r
            mr = r < NB * NSEG
            row = ((r // NSEG).to(tl.int64) * H + hidx) * NSEG + r % NSEG
            acc_d += tl.load(part_d_ptr + row[:, None] * P + offs_p[None, :], mask=mr[:, None] & mask_p[None, :],
                             other=0.0).to(COMPUTE)
        dD = tl.sum(acc_d, 0)
        if D_PER_P:
            tl.store(dD_ptr + hidx * P + offs_p, dD.to(dD_ptr.dtype.element_ty), mask=mask_p)
        else:
            tl.store(dD_ptr + hidx, tl.sum(dD, 0).to(dD_ptr.dtype.element_ty))
