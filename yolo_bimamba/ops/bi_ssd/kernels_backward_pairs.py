"""The backward in-chunk pairs kernel of the bidirectional SSD: the gradients through the pairs inside each chunk, one
program per (batch * group, chunk), no state, so all chunks run in parallel.

For one direction's chunk, with decay(t, s) the pair's decay and CB = C B^T:
    dx_s += dt_s sum_t (CB[t, s] decay(t, s)) dz_t,
    Mdt[t, s] = (dz_t . x_s) decay(t, s) dt_s,   dB = Mdt^T C,   dC = Mdt B,
    ddt_s (direct) = sum_t (CB[t, s] decay(t, s)) dz_t . x_s,
and the per-position log-decay gradient of those pairs, a local telescoping of the row and column sums of
Mdt * CB. The heads of a group share B and C, so their Mdt tiles are summed and multiplied once per group; the
segment kernel's per-head dB, dC rows (ngroups < nheads) are summed over the group's heads here, in head order, in
fp32. It must cut the sequence into the chunks of the segment kernel (its BLOCK_Q).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .kernels_common import (
    _add_rows, _chunk_rows, _decay_of_raw, _dot, _head_params, _pair_decay, _shifted_rows, _store_sum, _tile_offsets,
)


@triton.jit
def _chunk_pairs(xv, dtv, a, cs, CB, cb_diag, dz, tt, ss, MODE: tl.constexpr, DOT_MID: tl.constexpr,
                 DOT_IN: tl.constexpr):
    """Gradients through the pairs (t, s) inside one chunk of one direction: MODE 0 causal (s <= t), 1 anti-causal
    (s >= t), 2 both in one tile (SHARE, _pair_decay). Returns the dx term, the pair tile Mdt[t, s] = (dz_t . x_s)
    decay(t, s) dt_s whose products give dB = Mdt^T C and dC = Mdt B (the caller sums the tiles of a group's heads
    and multiplies once: B and C are the group's), the direct ddt term and the per-position log-decay gradient of
    those pairs (da_j: a local telescoping of one pair tile's row and column sums).
    The diagonal (s == t) term does not depend on the decays and is kept out of da (where it would cancel only up to
    rounding). CB = C B^T (DOT_IN) and cb_diag = its diagonal (sum(C * B, 1)) come from the caller: they are the same
    for every head of a group."""
    if MODE == 2:
        dec = _pair_decay(cs, a, tt, ss)
        offd = tt != ss
        ndiag = 2.0
    elif MODE == 0:
        dec = tl.exp(tl.where(tt >= ss, cs[:, None] - cs[None, :], float("-inf")))
        offd = tt > ss
        ndiag = 1.0
    else:
        csx = cs - a
        dec = tl.exp(tl.where(ss >= tt, csx[None, :] - csx[:, None], float("-inf")))
        offd = ss > tt
        ndiag = 1.0
    diag = cb_diag * ndiag
    u = _dot(tl.trans(tl.where(offd, CB * dec, 0.0)), dz, DOT_MID) + diag[:, None] * dz
    # (dz_t . x_s) decay(t, s): two loaded inputs (DOT_IN); it also gives the pair terms of da below
    Mdt = _dot(dz, tl.trans(xv), DOT_IN) * dec * dtv[None, :]
    Pm = tl.where(offd, Mdt * CB, 0.0)
    # a causal pair P[t, s] (t > s) spans the steps s+1..t: da[j] = sum_{t >= j > s} P[t, s], the reverse cumsum of
    # (row sums - column sums); an anti-causal one (s > t) the steps t..s-1: the forward cumsum. With SHARE both
    # directions have the same dt, so pass C uses only the sum of their da, which may sit in one slot.
    if MODE == 0:
        dad = tl.cumsum(tl.sum(Pm, 1) - tl.sum(Pm, 0), 0, reverse=True)
    elif MODE == 1:
        dad = tl.cumsum(tl.sum(Pm, 1) - tl.sum(Pm, 0), 0)
    else:
        Pb = tl.where(ss > tt, Pm, 0.0)
        Pf = Pm - Pb
        dad = tl.cumsum(tl.sum(Pf, 1) - tl.sum(Pf, 0), 0, reverse=True) + tl.cumsum(tl.sum(Pb, 1) - tl.sum(Pb, 0), 0)
    return dtv[:, None] * u, Mdt, tl.sum(u * xv, 1), dad


@triton.jit
def _bwd_pairs_head_in(x_ptr, dt_ptr, dtb_ptr, dy_ptr, A_ptr, bias_ptr, b64, hidx, live, L, H, rows, mrow, offs_p,
                       mask_p, P: tl.constexpr, DO_F: tl.constexpr, DO_B: tl.constexpr, SH_F: tl.constexpr,
                       SH_B: tl.constexpr, SHARE: tl.constexpr, HAS_BIAS: tl.constexpr, COMPUTE: tl.constexpr):
    """What the backward pairs kernel reads of head hidx, as stored (zeros where not live: past the program's last
    head, whose index is then clamped for the scalars): x; the causal direction's dt and dz (dy at offset SH_F) and the
    anti-causal direction's own (dt_bwd, dy at SH_B; without SHARE), scalar stand-ins for a direction that does not
    run here; A clamped to <= 0 and dt_bias."""
    xo = b64 * L * H * P + hidx * P
    dto = b64 * L * H + hidx
    mlive = mrow & live
    m_xp = mlive[:, None] & mask_p[None, :]
    xr = tl.load(x_ptr + xo + rows[:, None] * (H * P) + offs_p[None, :], mask=m_xp, other=0.0)
    if DO_F:
        f_dt = tl.load(dt_ptr + dto + rows * H, mask=mlive, other=0.0)
        f_dz = _shifted_rows(dy_ptr + xo, rows, mlive, offs_p, mask_p, L, H * P, SH_F)
    else:
        f_dt = 0.0
        f_dz = 0.0
    if DO_B and not SHARE:
        b_dt = tl.load(dtb_ptr + dto + rows * H, mask=mlive, other=0.0)
        b_dz = _shifted_rows(dy_ptr + xo, rows, mlive, offs_p, mask_p, L, H * P, SH_B)
    else:
        b_dt = 0.0
        b_dz = 0.0
    _A_raw, A_h, bias = _head_params(A_ptr, bias_ptr, hidx, HAS_BIAS, COMPUTE)
    return xr, f_dt, f_dz, b_dt, b_dz, A_h, bias


@triton.jit
def _bi_ssd_bwd_pairs_kernel(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, bias_ptr, dtb_ptr, Bb_ptr, Cb_ptr, dy_ptr,
    dx_ptr, dB_ptr, dC_ptr, dBb_ptr, dCb_ptr, oB_ptr, oC_ptr, oBb_ptr, oCb_ptr, scr_ptr,
    L, H, G, dt_lo, dt_hi,
    P: tl.constexpr, N: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
    DO_F: tl.constexpr, DO_B: tl.constexpr, SHIFT: tl.constexpr, SEPARATE: tl.constexpr, SHARE: tl.constexpr,
    HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, GRAD_PER_HEAD: tl.constexpr, COMPUTE: tl.constexpr,
    DOT_MID: tl.constexpr, DOT_IN: tl.constexpr, DOT_LO: tl.constexpr, AHEAD: tl.constexpr, BLOCK_Q: tl.constexpr,
):
    """The backward's in-chunk pairs, one program per (batch * group, chunk): no state, so every chunk runs in
    parallel. It walks the group's heads in order; for each it adds to dx and the scratch's ddt slots what
    _bi_ssd_bwd_kernel (same BLOCK_Q: the same chunks) wrote, writes the in-chunk log-decay gradients (slot 5; slot 2
    added to), and sums the heads' in-chunk pair tiles; after the heads it sums the segment kernel's dB, dC rows
    (dB_ptr / dC_ptr) of the group's heads in head order, adds the in-chunk terms of them all (one product with the
    group's B and C of the heads' summed pair tiles) and stores the sums into oB, oC (oBb, oCb) in their dtype
    (_store_group_sums): the per-head buffers (GRAD_PER_HEAD) are summed over each group's heads here, without a
    kernel of their own; rows of the group (ngroups == nheads, or the segment kernel's ORDERED sums) are one part.
    With ngroups == nheads a group is one head, and the partial and the output may be one tensor (each row is read
    before it is written).
    AHEAD (bits): 1, each head's x, dt and dz are loaded one head ahead of their use (the first head's before the
    loop); 2, the dx and scratch rows a head adds to are loaded at its start, before its products, not after them. The
    result is the same (the same arithmetic in the same order)."""
    pid = tl.program_id(0)
    c = tl.program_id(1)
    gidx = pid % G
    b64 = (pid // G).to(tl.int64)
    R = H // G

    offs_q, offs_p, offs_n, mask_p, mask_n = _tile_offsets(0, P, N, BLOCK_Q, BLOCK_P, BLOCK_N)
    tt = offs_q[:, None]
    ss = offs_q[None, :]
    bco = b64 * L * G * N + gidx * N
    xstride = H * P
    rows, mrow, m_xp, m_bn, _xy_off, bn_off = _chunk_rows(c, offs_q, offs_p, offs_n, mask_p, mask_n, L, xstride, G * N,
                                                          BLOCK_Q)
    o_off = bco + bn_off  # the group's rows of the outputs
    # the group's dB, dC from its heads' in-chunk pairs: Mdt^T C and Mdt B with the group's B and C, so the heads' pair
    # tiles Mdt are summed (msum; msum_b: the anti-causal direction's own B_bwd, C_bwd) and multiplied once, after the
    # heads (_store_group_sums), where the segment kernel's rows are added too
    msum = tl.zeros((BLOCK_Q, BLOCK_Q), dtype=COMPUTE)
    msum_b = tl.zeros((BLOCK_Q, BLOCK_Q), dtype=COMPUTE)
    # C B^T of the group's chunk and its diagonal: the same for each of its heads (B and C are loaded again after the
    # heads, not kept in registers through them)
    if DO_F:
        CBf, cbf = _cb_tiles(B_ptr + bco + bn_off, C_ptr + bco + bn_off, m_bn, COMPUTE, DOT_IN)
    if DO_B and not SHARE:
        CBb, cbb = _cb_tiles(Bb_ptr + bco + bn_off, Cb_ptr + bco + bn_off, m_bn, COMPUTE, DOT_IN)
    SH_F: tl.constexpr = 1 if SHIFT else 0
    SH_B: tl.constexpr = -1 if SHIFT else 0
    h_first = gidx * R
    IN_AHEAD: tl.constexpr = AHEAD % 2 == 1
    ROWS_EARLY: tl.constexpr = AHEAD >= 2
    if IN_AHEAD:  # the first head's inputs
        xr, f_dt, f_dz, b_dt, b_dz, A_n, bias_n = _bwd_pairs_head_in(
            x_ptr, dt_ptr, dtb_ptr, dy_ptr, A_ptr, bias_ptr, b64, h_first, True, L, H, rows, mrow, offs_p, mask_p,
            P, DO_F, DO_B, SH_F, SH_B, SHARE, HAS_BIAS, COMPUTE)
    for j in range(0, R):
        hidx = h_first + j
        xo = b64 * L * H * P + hidx * P
        xy_off = xo + rows[:, None] * xstride + offs_p[None, :]
        so = (b64 * H + hidx) * 6 * L
        if IN_AHEAD:
            xv = xr.to(COMPUTE)
            dtf_raw = f_dt
            dzf_raw = f_dz
            dtb_raw = b_dt
            dzb_raw = b_dz
            A_h = A_n
            bias = bias_n
        else:
            xr_j, dtf_raw, dzf_raw, dtb_raw, dzb_raw, A_h, bias = _bwd_pairs_head_in(
                x_ptr, dt_ptr, dtb_ptr, dy_ptr, A_ptr, bias_ptr, b64, hidx, True, L, H, rows, mrow, offs_p, mask_p,
                P, DO_F, DO_B, SH_F, SH_B, SHARE, HAS_BIAS, COMPUTE)
            xv = xr_j.to(COMPUTE)
        if ROWS_EARLY:  # the rows this head adds to, before its products
            dx_old = tl.load(dx_ptr + xy_off, mask=m_xp, other=0.0)
            if DO_F:
                s1_old = tl.load(scr_ptr + so + L + rows, mask=mrow, other=0.0)
            if DO_B and not SHARE:
                s4_old = tl.load(scr_ptr + so + 4 * L + rows, mask=mrow, other=0.0)
                s2_old = tl.load(scr_ptr + so + 2 * L + rows, mask=mrow, other=0.0)
        if IN_AHEAD:  # the next head's inputs (none after the last)
            xr, f_dt, f_dz, b_dt, b_dz, A_n, bias_n = _bwd_pairs_head_in(
                x_ptr, dt_ptr, dtb_ptr, dy_ptr, A_ptr, bias_ptr, b64, tl.minimum(hidx + 1, h_first + R - 1),
                j + 1 < R, L, H, rows, mrow, offs_p, mask_p, P, DO_F, DO_B, SH_F, SH_B, SHARE, HAS_BIAS, COMPUTE)
        dxv = tl.zeros((BLOCK_Q, BLOCK_P), dtype=COMPUTE)
        if DO_F:
            dtf, af, csf, _lf, _tf = _decay_of_raw(dtf_raw.to(COMPUTE), bias, A_h, mrow, offs_q, dt_lo, dt_hi, SOFTPLUS,
                                                   BLOCK_Q)
            dxv, mf, ddt_f, da_f = _chunk_pairs(xv, dtf, af, csf, CBf, cbf, dzf_raw.to(COMPUTE), tt, ss,
                                                2 if SHARE else 0, DOT_MID, DOT_IN)
            msum += mf
            if ROWS_EARLY:
                _store_sum(scr_ptr + so + L + rows, s1_old, ddt_f, mrow)
            else:
                _add_rows(scr_ptr + so + L + rows, ddt_f, mrow)
            tl.store(scr_ptr + so + 5 * L + rows, da_f, mask=mrow)
        if DO_B and not SHARE:  # (with SHARE the causal direction's tile held both)
            dtb, ab, csb, _lb, _tb = _decay_of_raw(dtb_raw.to(COMPUTE), bias, A_h, mrow, offs_q, dt_lo, dt_hi, SOFTPLUS,
                                                   BLOCK_Q)
            dxb, mb, ddt_b, da_b = _chunk_pairs(xv, dtb, ab, csb, CBb, cbb, dzb_raw.to(COMPUTE), tt, ss, 1, DOT_MID,
                                                DOT_IN)
            dxv += dxb
            if ROWS_EARLY:
                _store_sum(scr_ptr + so + 4 * L + rows, s4_old, ddt_b, mrow)
                _store_sum(scr_ptr + so + 2 * L + rows, s2_old, da_b, mrow)
            else:
                _add_rows(scr_ptr + so + 4 * L + rows, ddt_b, mrow)
                _add_rows(scr_ptr + so + 2 * L + rows, da_b, mrow)
            if SEPARATE:
                msum_b += mb
            else:  # B_bwd, C_bwd are B, C
                msum += mb
        if ROWS_EARLY:
            _store_sum(dx_ptr + xy_off, dx_old, dxv, m_xp)
        else:
            _add_rows(dx_ptr + xy_off, dxv, m_xp)
    # the segment kernel's rows: per head (GRAD_PER_HEAD: the group's first head's, then one head after another), or
    # the group's own
    if GRAD_PER_HEAD:
        p_off = b64 * L * H * N + gidx * R * N + rows[:, None] * (H * N) + offs_n[None, :]
        n_parts = R
    else:
        p_off = o_off
        n_parts = 1
    if DO_F or not SEPARATE:  # (without SEPARATE, B_bwd and C_bwd are B and C)
        _store_group_sums(oB_ptr + o_off, oC_ptr + o_off, B_ptr + bco + bn_off, C_ptr + bco + bn_off, dB_ptr + p_off,
                          dC_ptr + p_off, n_parts, N, m_bn, msum, COMPUTE, DOT_LO)
    if DO_B and SEPARATE:
        _store_group_sums(oBb_ptr + o_off, oCb_ptr + o_off, Bb_ptr + bco + bn_off, Cb_ptr + bco + bn_off,
                          dBb_ptr + p_off, dCb_ptr + p_off, n_parts, N, m_bn, msum_b, COMPUTE, DOT_LO)


@triton.jit
def _cb_tiles(B_ptrs, C_ptrs, mask, COMPUTE: tl.constexpr, DOT_IN: tl.constexpr):
    """C B^T of a chunk (DOT_IN) and its diagonal sum(C * B, 1)."""
    Bv = tl.load(B_ptrs, mask=mask, other=0.0).to(COMPUTE)
    Cv = tl.load(C_ptrs, mask=mask, other=0.0).to(COMPUTE)
    return _dot(Cv, tl.trans(Bv), DOT_IN), tl.sum(Cv * Bv, 1)


@triton.jit
def _store_group_sums(oB_ptrs, oC_ptrs, B_ptrs, C_ptrs, pB_ptrs, pC_ptrs, n_parts, part_stride, mask, msum,
                      COMPUTE: tl.constexpr, DOT_LO: tl.constexpr):
    """Store a group's dB = its parts + msum^T C and dC = its parts + msum B, in the outputs' dtype: msum is the sum of
    its heads' in-chunk pair tiles, the parts the segment kernel's rows (pB_ptrs / pC_ptrs, then n_parts - 1 more sets
    part_stride elements apart), summed in order in fp32 (_parts_sum). Apart from the heads' loop, so that only msum
    stays in registers through it; dB is stored before dC's parts are read (one sum in registers at a time)."""
    Cv = tl.load(C_ptrs, mask=mask, other=0.0).to(COMPUTE)
    sumB = _parts_sum(pB_ptrs, n_parts, part_stride, mask, COMPUTE) + _dot(tl.trans(msum), Cv, DOT_LO)
    tl.store(oB_ptrs, sumB.to(oB_ptrs.dtype.element_ty), mask=mask)
    Bv = tl.load(B_ptrs, mask=mask, other=0.0).to(COMPUTE)
    sumC = _parts_sum(pC_ptrs, n_parts, part_stride, mask, COMPUTE) + _dot(msum, Bv, DOT_LO)
    tl.store(oC_ptrs, sumC.to(oC_ptrs.dtype.element_ty), mask=mask)


@triton.jit
def _parts_sum(ptrs, n_parts, stride, mask, COMPUTE: tl.constexpr):
    """sum_j ptrs[j * stride] (j < n_parts, at least 1) in fp32, added in order, in the layout the rows are loaded in:
    added to the product of another layout, each part would cost a trip through shared memory, one after the other;
    two parts' loads are issued together."""
    acc = tl.load(ptrs, mask=mask, other=0.0).to(COMPUTE)
    for j in range(1, n_parts, 2):
        two = j + 1 < n_parts
        a = tl.load(ptrs + j * stride, mask=mask, other=0.0)
        b = tl.load(ptrs + (j + 1) * stride, mask=mask & two, other=0.0)
        acc += a.to(COMPUTE)
        acc = tl.where(two, acc + b.to(COMPUTE), acc)
    return acc
