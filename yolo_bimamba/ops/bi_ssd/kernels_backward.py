"""The backward segment kernel of the bidirectional SSD: the gradients through the pairs across chunks (the state
terms), one program per (batch * head, segment) with the whole headdim, two passes over its chunks.

With dz the gradient of a direction's unshifted output (dy, at offset +1 / -1 under Hydra's shift), per chunk:
    pass A (reverse walk): the causal state gradient dS_f <- exp(last) dS_f + (C exp(cs))^T dz and the anti-causal
        state S_b give dx_t += dt_t exp(tail_t - a_t) B_t dS_f, dB_f, and dC_b = exp(tail) dz S_b^T;
    pass B (forward walk): the causal state S_f and the anti-causal state gradient dS_b give dC_f = exp(cs) dz S_f^T,
        dx, dB_b;
and each position's log-decay gradient terms into a small fp32 scratch (b*h, 6, L), in which each direction owns its
slots (terms that kernels_reductions' pass C telescopes over the sequence). dD comes from per-(batch, head, segment)
partials of the first launch. "both" runs as two launches of this kernel, one per direction (DO_F / DO_B), the second
adding to the first's dx (and dB, dC when the directions share them, ACC=True), or as one; the sum stays ordered, so
results are bitwise reproducible. Each pass loads a chunk's inputs one chunk ahead of their use (dt always; the others
as the AHEAD bits say: tuning.bwd_ahead_bits).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .kernels_common import (
    AHEAD_MAX_TILE, _add_rows, _chunk_rows, _decay_of_raw, _dot, _dot_acc, _entry_state, _head_coords, _head_params,
    _shifted_rows, _store_sum, _tile_offsets,
)


@triton.jit
def _wait_for(cnt_ptr, target):
    """Spin until the counter reads at least ``target`` (an acquire: what was stored before its release is seen)."""
    seen = tl.atomic_add(cnt_ptr, 0, sem="acquire")
    while seen < target:
        seen = tl.atomic_add(cnt_ptr, 0, sem="acquire")


@triton.jit
def _add_turn(ptrs, mask, v, cnt_ptr, turn):
    """Rows shared by a group's heads (ORDERED): ptrs[...] += v once the chunk's counter reads ``turn`` (every
    earlier turn's addition is done; turn 0 stores v, so the rows need no zeroing), then count this one. The load
    bypasses L1 (other SMs wrote the rows); the barrier orders every thread's store before the release."""
    _wait_for(cnt_ptr, turn)
    old = tl.load(ptrs, mask=mask & (turn > 0), other=0.0, cache_modifier=".cg")
    tl.store(ptrs, (old.to(v.dtype) + v).to(ptrs.dtype.element_ty), mask=mask)
    tl.debug_barrier()
    tl.atomic_add(cnt_ptr, 1, sem="release")


@triton.jit
def _dt_rows(dt_ptr, rows, L, H):
    return tl.load(dt_ptr + rows * H, mask=(rows >= 0) & (rows < L), other=0.0)


@triton.jit
def _dz_tile(dy_ptr, rows, mrow, offs_p, mask_p, L, xstride, DZ_SHIFT: tl.constexpr, COMPUTE: tl.constexpr):
    """The gradient dz of a direction's unshifted output at rows: dy at rows + DZ_SHIFT (see _ahead_in), 0 outside."""
    return _shifted_rows(dy_ptr, rows, mrow, offs_p, mask_p, L, xstride, DZ_SHIFT).to(COMPUTE)


@triton.jit
def _ahead_in(dt_ptr, B_ptr, C_ptr, dy_ptr, rows, offs_p, mask_p, offs_n, mask_n, L, H, xstride, bstride,
              DZ_SHIFT: tl.constexpr, AHEAD: tl.constexpr):
    """What the segment kernel loads of a direction's next chunk (rows) ahead of its use, as stored (0 outside
    [0, L)): always its dt; with AHEAD bit 1 its B and C, with bit 2 the gradient dz of the direction's unshifted
    output z, which is dy at rows + DZ_SHIFT (Hydra's shift: y_f[t] = z_f[t-1] -> dz_f[t] = dy[t+1], shift +1;
    y_b[t] = z_b[t+1] -> dz_b[t] = dy[t-1], shift -1). Zeros stand in for the tiles left out, which _dir_in loads at
    their use."""
    ok = (rows >= 0) & (rows < L)
    if AHEAD % 2 == 1:
        m_bn = ok[:, None] & mask_n[None, :]
        bn_off = rows[:, None] * bstride + offs_n[None, :]
        Bv = tl.load(B_ptr + bn_off, mask=m_bn, other=0.0)
        Cv = tl.load(C_ptr + bn_off, mask=m_bn, other=0.0)
    else:
        Bv = 0.0
        Cv = 0.0
    if (AHEAD // 2) % 2 == 1:
        dz = _shifted_rows(dy_ptr, rows, ok, offs_p, mask_p, L, xstride, DZ_SHIFT)
    else:
        dz = 0.0
    return _dt_rows(dt_ptr, rows, L, H), Bv, Cv, dz


@triton.jit
def _dir_in(i_dt, i_B, i_C, i_dz, B_ptr, C_ptr, dy_ptr, bias, A_h, rows, mrow, offs_q, offs_p, mask_p, m_bn, bn_off, L,
            xstride, dt_lo, dt_hi, DZ_SHIFT: tl.constexpr, SOFTPLUS: tl.constexpr, COMPUTE: tl.constexpr,
            BLOCK_Q: tl.constexpr, AHEAD: tl.constexpr):
    """One direction's chunk in the segment kernel, in the compute dtype: its processed dt, log-decays, their cumsums
    (_decay_of_raw) from its dt as _ahead_in loaded it, and its B, C and dz as _ahead_in loaded them (AHEAD bits 1, 2)
    or loaded here."""
    dtv, a, cs, last, tail = _decay_of_raw(i_dt.to(COMPUTE), bias, A_h, mrow, offs_q, dt_lo, dt_hi, SOFTPLUS, BLOCK_Q)
    if AHEAD % 2 == 1:
        Bv = i_B.to(COMPUTE)
        Cv = i_C.to(COMPUTE)
    else:
        Bv = tl.load(B_ptr + bn_off, mask=m_bn, other=0.0).to(COMPUTE)
        Cv = tl.load(C_ptr + bn_off, mask=m_bn, other=0.0).to(COMPUTE)
    if (AHEAD // 2) % 2 == 1:
        dz = i_dz.to(COMPUTE)
    else:
        dz = _dz_tile(dy_ptr, rows, mrow, offs_p, mask_p, L, xstride, DZ_SHIFT, COMPUTE)
    return dtv, a, cs, last, tail, Bv, Cv, dz


@triton.jit
def _dir_step(i_dt, i_B, i_C, i_dz, dt_ptr, B_ptr, C_ptr, dy_ptr, bias, A_h, rows, rows_n, mrow, offs_q, offs_p, mask_p,
              offs_n, mask_n, m_bn, bn_off, L, H, xstride, bstride, dt_lo, dt_hi, DZ_SHIFT: tl.constexpr,
              SOFTPLUS: tl.constexpr, COMPUTE: tl.constexpr, BLOCK_Q: tl.constexpr, AHEAD: tl.constexpr):
    """One direction's step of a pass: its chunk (rows) as :func:`_dir_in` makes it of what was loaded ahead (i_*),
    then the loads of its next chunk (rows_n, :func:`_ahead_in`). Returns the chunk's dt, a, cs, last, tail, B, C, dz,
    then the next chunk's loads."""
    dtv, a, cs, last, tail, Bv, Cv, dz = _dir_in(i_dt, i_B, i_C, i_dz, B_ptr, C_ptr, dy_ptr, bias, A_h, rows, mrow,
                                                 offs_q, offs_p, mask_p, m_bn, bn_off, L, xstride, dt_lo, dt_hi,
                                                 DZ_SHIFT, SOFTPLUS, COMPUTE, BLOCK_Q, AHEAD)
    n_dt, n_B, n_C, n_dz = _ahead_in(dt_ptr, B_ptr, C_ptr, dy_ptr, rows_n, offs_p, mask_p, offs_n, mask_n, L, H,
                                     xstride, bstride, DZ_SHIFT, AHEAD)
    return dtv, a, cs, last, tail, Bv, Cv, dz, n_dt, n_B, n_C, n_dz


@triton.jit
def _pass_start(x_ptr, dt_ptr, B_ptr, C_ptr, dtb_ptr, Bb_ptr, Cb_ptr, dy_ptr, rows_n, offs_p, mask_p, offs_n, mask_n,
                L, H, xstride, bstride, SH_F: tl.constexpr, SH_B: tl.constexpr, DO_F: tl.constexpr,
                OWN_B: tl.constexpr, X_AHEAD: tl.constexpr, AHEAD: tl.constexpr):
    """What a pass loads before its first chunk (rows_n): x (with X_AHEAD), the causal direction's inputs (DO_F) and
    the anti-causal direction's own (OWN_B), as :func:`_ahead_in` loads them; zeros stand in for a direction that does
    not load here."""
    x_n = _x_ahead(x_ptr, rows_n, offs_p, mask_p, L, xstride, X_AHEAD)
    if DO_F:
        f_dt, f_B, f_C, f_dz = _ahead_in(dt_ptr, B_ptr, C_ptr, dy_ptr, rows_n, offs_p, mask_p, offs_n, mask_n, L, H,
                                         xstride, bstride, SH_F, AHEAD)
    else:
        f_dt, f_B, f_C, f_dz = _no_loads()
    if OWN_B:
        b_dt, b_B, b_C, b_dz = _ahead_in(dtb_ptr, Bb_ptr, Cb_ptr, dy_ptr, rows_n, offs_p, mask_p, offs_n, mask_n, L, H,
                                         xstride, bstride, SH_B, AHEAD)
    else:
        b_dt, b_B, b_C, b_dz = _no_loads()
    return x_n, f_dt, f_B, f_C, f_dz, b_dt, b_B, b_C, b_dz


@triton.jit
def _no_loads():
    """Stand-ins for the loads of a direction that does not run in a launch (never read)."""
    return 0.0, 0.0, 0.0, 0.0


@triton.jit
def _x_ahead(x_ptr, rows, offs_p, mask_p, L, xstride, AHEAD: tl.constexpr):
    """x of the next chunk (rows in [0, L); 0 elsewhere), loaded ahead with AHEAD (else a stand-in: _x_in loads it)."""
    if AHEAD:
        m = ((rows >= 0) & (rows < L))[:, None] & mask_p[None, :]
        return tl.load(x_ptr + rows[:, None] * xstride + offs_p[None, :], mask=m, other=0.0)
    else:
        return 0.0


@triton.jit
def _x_in(x_n, x_ptr, xy_off, m_xp, COMPUTE: tl.constexpr, AHEAD: tl.constexpr):
    if AHEAD:
        return x_n.to(COMPUTE)
    else:
        return tl.load(x_ptr + xy_off, mask=m_xp, other=0.0).to(COMPUTE)


@triton.jit
def _bi_ssd_bwd_kernel(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, bias_ptr, dtb_ptr, Bb_ptr, Cb_ptr, dy_ptr,
    dx_ptr, dB_ptr, dC_ptr, ddt_ptr, dBb_ptr, dCb_ptr, ddtb_ptr, scr_ptr, part_ptr, st_ptr, gst_ptr, cnt_ptr,
    L, H, G, SEG, dt_lo, dt_hi,
    P: tl.constexpr, N: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
    DO_F: tl.constexpr, DO_B: tl.constexpr, SHIFT: tl.constexpr, SEPARATE: tl.constexpr, SHARE: tl.constexpr,
    HAS_D: tl.constexpr, D_PER_P: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
    GRAD_PER_HEAD: tl.constexpr, ORDERED: tl.constexpr, ACC: tl.constexpr, COMPUTE: tl.constexpr,
    DOT_ST: tl.constexpr, DOT_RD: tl.constexpr, DOT_LO: tl.constexpr, AHEAD: tl.constexpr, BLOCK_Q: tl.constexpr,
):
    """The backward's state terms (pairs across chunks), one program per (batch * head, segment); the in-chunk
    pairs are _bi_ssd_bwd_pairs_kernel's, which adds to what this kernel wrote. ACC: a launch before this one (the
    other direction's) wrote dx, dB, dC and dD's partials already. AHEAD (bits): which of a chunk's inputs besides
    dt both passes load one chunk ahead of their use: 1 B and C, 2 dz, 4 x (each direction's own); the others are
    loaded at their use. The result is the same for every value (the same arithmetic).

    ORDERED (ngroups < nheads, one direction per launch): dB, dC are the group's fp32 rows, which the programs of a
    group's heads add to in head order, chunk by chunk (_add_turn), so the sum is the same in every run. cnt (int32,
    zeroed): slots 0 and 1 hand out tickets (first launch, ACC launch), then a counter per (batch * group, dB / dC,
    chunk). A program's (batch * head, segment) comes from its ticket, heads fastest, so a program only ever waits
    for a lower head of its batch and segment, which took its ticket earlier and is running or done: no deadlock,
    whatever order the GPU starts programs in. In one launch each row gets one pass's terms (dB pass A and dC pass B
    in the causal direction, the reverse in the anti-causal one), so a turn is the head's index in its group, after
    the first launch's turns in the ACC launch."""
    if ORDERED:
        if ACC:
            ticket = tl.atomic_add(cnt_ptr + 1, 1)
        else:
            ticket = tl.atomic_add(cnt_ptr, 1)
        pid = ticket % tl.num_programs(0)
        seg = ticket // tl.num_programs(0)
    else:
        pid = tl.program_id(0)
        seg = tl.program_id(1)
    hidx, gidx, b64 = _head_coords(pid, H, G)
    R = H // G
    turn = hidx % R
    if ACC:
        turn += R
    NCH = tl.cdiv(L, BLOCK_Q)
    cnt_B = cnt_ptr + 2 + (b64 * G + gidx) * 2 * NCH  # + chunk; dC's counters follow dB's
    cnt_C = cnt_B + NCH

    offs_q, offs_p, offs_n, mask_p, mask_n = _tile_offsets(0, P, N, BLOCK_Q, BLOCK_P, BLOCK_N)

    xo = b64 * L * H * P + hidx * P  # x, dy, dx
    dto = b64 * L * H + hidx  # dt, ddt
    bco = b64 * L * G * N + gidx * N  # inputs B, C
    if GRAD_PER_HEAD:  # per-head buffers, summed over the group by the pairs kernel
        GS = H
        go = b64 * L * H * N + hidx * N
    else:
        GS = G
        go = bco
    so = pid.to(tl.int64) * 6 * L  # scratch (b*h, 6, L): dcs_f, ddt_f, dadir_b, dcs_b, ddt_b, dadir_f

    _A_raw, A_h, bias = _head_params(A_ptr, bias_ptr, hidx, HAS_BIAS, COMPUTE)
    if HAS_D:
        if D_PER_P:
            Dv = tl.load(D_ptr + hidx * P + offs_p, mask=mask_p, other=0.0).to(COMPUTE)[None, :]
        else:
            Dv = tl.load(D_ptr + hidx).to(COMPUTE)
    xstride = H * P
    bstride = G * N
    gstride = GS * N
    SH_F: tl.constexpr = 1 if SHIFT else 0
    SH_B: tl.constexpr = -1 if SHIFT else 0
    # this program's rows: chunks [c0, c1) = segment seg; the states at its ends: st holds the forward's S_f, S_b,
    # gst the backward state kernel's dS_b, dS_f, both (b*h, 2, nseg - 1, N, P) (_entry_state)
    nseg = tl.cdiv(L, SEG)
    c0 = seg * (SEG // BLOCK_Q)
    c1 = tl.minimum(tl.cdiv(L, BLOCK_Q), c0 + SEG // BLOCK_Q)
    tile = offs_n[:, None] * P + offs_p[None, :]
    m_st = mask_n[:, None] & mask_p[None, :]

    # ------------------------------------------------------------------ pass A (reverse walk)
    if DO_F:  # grad of the causal state leaving a chunk
        dS = _entry_state(gst_ptr, pid, seg, nseg, tile, m_st, 1, N, P).to(COMPUTE)
    else:
        dS = tl.zeros((BLOCK_N, BLOCK_P), dtype=COMPUTE)
    if DO_B:  # anti-causal state entering a chunk (from the right)
        Sb = _entry_state(st_ptr, pid, seg, nseg, tile, m_st, 1, N, P).to(COMPUTE)
    else:
        Sb = tl.zeros((BLOCK_N, BLOCK_P), dtype=COMPUTE)
    dD_acc = tl.zeros((BLOCK_P,), dtype=COMPUTE)
    # a chunk's dt is loaded one chunk ahead of its use in both passes, and its other inputs as AHEAD says (loaded at
    # their use, the loads stall the kernel: dt first, which every other input waits on through the decays)
    OWN_B: tl.constexpr = DO_B and not (SHARE and DO_F)  # the anti-causal direction loads its own dt, B, C, dz
    X_AHEAD: tl.constexpr = AHEAD >= 4
    # pass A has no dC terms of its own when the anti-causal direction does not run here or keeps its dC apart
    # (SEPARATE): then, in a first launch, pass B writes the causal dC rows alone (pass A stored zeros, pass B read them
    # back and added: at the LM shape's per-head rows, 2 x 0.5 GB of memory traffic for nothing)
    FRESH_C: tl.constexpr = DO_F and (SEPARATE or not DO_B) and (not ACC) and (not ORDERED)
    # a launch of the anti-causal direction alone, above the tiles loaded ahead, loads the dB rows it adds to in pass B
    # where it adds them: held through the chunk's dots they were most of its spills at headdim 64 x d_state 128 on
    # sm_90; with both directions in one launch there is nothing to spill and the early load stays (faster there)
    LATE_DB: tl.constexpr = (not DO_F) and (BLOCK_P * BLOCK_N > AHEAD_MAX_TILE)
    rows_n = (c1 - 1) * BLOCK_Q + offs_q
    x_n, f_dt, f_B, f_C, f_dz, b_dt, b_B, b_C, b_dz = _pass_start(
        x_ptr + xo, dt_ptr + dto, B_ptr + bco, C_ptr + bco, dtb_ptr + dto, Bb_ptr + bco, Cb_ptr + bco, dy_ptr + xo,
        rows_n, offs_p, mask_p, offs_n, mask_n, L, H, xstride, bstride, SH_F, SH_B, DO_F, OWN_B, X_AHEAD, AHEAD)
    for ci in range(0, c1 - c0):
        c = c1 - 1 - ci
        rows, mrow, m_xp, m_bn, xy_off, bn_off = _chunk_rows(c, offs_q, offs_p, offs_n, mask_p, mask_n, L, xstride, bstride, BLOCK_Q)
        rows_n = rows - BLOCK_Q
        xv = _x_in(x_n, x_ptr + xo, xy_off, m_xp, COMPUTE, X_AHEAD)
        x_n = _x_ahead(x_ptr + xo, rows_n, offs_p, mask_p, L, xstride, X_AHEAD)
        g_off = go + rows[:, None] * gstride + offs_n[None, :]
        if ACC and DO_F:  # the other direction's launch wrote dx (with D dy) already
            dxv = tl.load(dx_ptr + xo + xy_off, mask=m_xp, other=0.0).to(COMPUTE)
        else:
            dxv = tl.zeros((BLOCK_Q, BLOCK_P), dtype=COMPUTE)
        dCv = tl.zeros((BLOCK_Q, BLOCK_N), dtype=COMPUTE)
        if DO_F:
            dtf, af, csf, lastf, tailf, Bf, Cf, dzf, f_dt, f_B, f_C, f_dz = _dir_step(
                f_dt, f_B, f_C, f_dz, dt_ptr + dto, B_ptr + bco, C_ptr + bco, dy_ptr + xo, bias, A_h, rows, rows_n, mrow,
                offs_q, offs_p, mask_p, offs_n, mask_n, m_bn, bn_off, L, H, xstride, bstride, dt_lo, dt_hi, SH_F,
                SOFTPLUS, COMPUTE, BLOCK_Q, AHEAD)
            # pairs with t in later chunks: through the gradient dS of the state leaving this chunk
            ef_end = tl.exp(tailf - af)
            uf_in = ef_end[:, None] * _dot(Bf, dS, DOT_RD)
            dBf = (dtf * ef_end)[:, None] * _dot(xv, tl.trans(dS), DOT_LO)
            dS = _dot_acc(tl.trans(Cf * tl.exp(csf)[:, None]), dzf, tl.exp(lastf) * dS, DOT_ST)
            xin = tl.sum(uf_in * xv, 1)
            dxv += dtf[:, None] * uf_in
            if ORDERED:
                _add_turn(dB_ptr + g_off, m_bn, dBf, cnt_B + c, turn)
            else:
                tl.store(dB_ptr + g_off, dBf.to(dB_ptr.dtype.element_ty), mask=m_bn)
            tl.store(scr_ptr + so + rows, -dtf * xin, mask=mrow)
            tl.store(scr_ptr + so + L + rows, xin, mask=mrow)
        if OWN_B:
            dtb, ab, csb, lastb, tailb, Bbv, Cbv, dzb, b_dt, b_B, b_C, b_dz = _dir_step(
                b_dt, b_B, b_C, b_dz, dtb_ptr + dto, Bb_ptr + bco, Cb_ptr + bco, dy_ptr + xo, bias, A_h, rows,
                rows_n, mrow, offs_q, offs_p, mask_p, offs_n, mask_n, m_bn, bn_off, L, H, xstride, bstride, dt_lo,
                dt_hi, SH_B, SOFTPLUS, COMPUTE, BLOCK_Q, AHEAD)
        elif DO_B:  # the causal direction's dt, decays, B, C and dz above are this direction's too (SHARE)
            dtb, ab, csb, lastb, tailb, Bbv, Cbv, dzb = dtf, af, csf, lastf, tailf, Bf, Cf, dzf
        if DO_B:
            # pairs with s in later chunks (the state): dC_t = e_t dz_t Sb^T, and their output terms
            # Yb_t = dz_t . (e_t C_t Sb) = C_t . dC_t from the same product (at the state read-outs' precision, DOT_RD)
            dCb = tl.exp(tailb)[:, None] * _dot(dzb, tl.trans(Sb), DOT_RD)
            Yb = tl.sum(Cbv * dCb, 1)
            Sb = _dot_acc(tl.trans(Bbv * (tl.exp(csb - ab) * dtb)[:, None]), xv, tl.exp(lastb) * Sb, DOT_ST)
            if SEPARATE:
                tl.store(dCb_ptr + g_off, dCb.to(dCb_ptr.dtype.element_ty), mask=m_bn)
            else:
                dCv += dCb
            tl.store(scr_ptr + so + 2 * L + rows, Yb, mask=mrow)  # (slot 3, its negative, is written in pass B)
        if not ACC:  # D dy and dD (from the first launch only); without the shift, dy is a direction's dz loaded above
            if DO_F and not SHIFT:
                dyv = dzf
            elif DO_B and not SHIFT:
                dyv = dzb
            else:
                dyv = tl.load(dy_ptr + xo + xy_off, mask=m_xp, other=0.0).to(COMPUTE)
            dD_acc += tl.sum(dyv * xv, 0)
            if HAS_D:
                dxv += Dv * dyv
        if DO_F or (not ACC):  # (an anti-causal launch adding to an earlier launch's dx does so in pass B)
            tl.store(dx_ptr + xo + xy_off, dxv.to(dx_ptr.dtype.element_ty), mask=m_xp)
        if ORDERED:  # (a causal launch writes its dC in pass B)
            if DO_B:
                _add_turn(dC_ptr + g_off, m_bn, dCv, cnt_C + c, turn)
        elif (DO_F or (not SEPARATE)) and (not FRESH_C):
            if ACC and (not SEPARATE):  # add to the other direction's dC
                _add_rows(dC_ptr + g_off, dCv, m_bn)
            else:
                tl.store(dC_ptr + g_off, dCv.to(dC_ptr.dtype.element_ty), mask=m_bn)

    tl.debug_barrier()
    # ------------------------------------------------------------------ pass B (forward walk)
    if DO_F:  # causal state entering a chunk
        S = _entry_state(st_ptr, pid, seg, nseg, tile, m_st, 0, N, P).to(COMPUTE)
    else:
        S = tl.zeros((BLOCK_N, BLOCK_P), dtype=COMPUTE)
    if DO_B:  # grad of the anti-causal state of earlier chunks
        dSb = _entry_state(gst_ptr, pid, seg, nseg, tile, m_st, 0, N, P).to(COMPUTE)
    else:
        dSb = tl.zeros((BLOCK_N, BLOCK_P), dtype=COMPUTE)
    rows_n = c0 * BLOCK_Q + offs_q
    x_n, f_dt, f_B, f_C, f_dz, b_dt, b_B, b_C, b_dz = _pass_start(
        x_ptr + xo, dt_ptr + dto, B_ptr + bco, C_ptr + bco, dtb_ptr + dto, Bb_ptr + bco, Cb_ptr + bco, dy_ptr + xo,
        rows_n, offs_p, mask_p, offs_n, mask_n, L, H, xstride, bstride, SH_F, SH_B, DO_F, OWN_B, X_AHEAD, AHEAD)
    for c in range(c0, c1):
        rows, mrow, m_xp, m_bn, xy_off, bn_off = _chunk_rows(c, offs_q, offs_p, offs_n, mask_p, mask_n, L, xstride, bstride, BLOCK_Q)
        rows_n = rows + BLOCK_Q
        xv = _x_in(x_n, x_ptr + xo, xy_off, m_xp, COMPUTE, X_AHEAD)
        x_n = _x_ahead(x_ptr + xo, rows_n, offs_p, mask_p, L, xstride, X_AHEAD)
        g_off = go + rows[:, None] * gstride + offs_n[None, :]
        # the rows this pass adds to (written by pass A or by an earlier launch) are loaded before the chunk's dots,
        # which hide the loads' latency; a scratch slot 3 row is always minus the slot 2 row, so only slot 2 is read
        if DO_F:
            if (not ORDERED) and (not FRESH_C):  # (ORDERED: loaded in its turn)
                dC_old = tl.load(dC_ptr + g_off, mask=m_bn, other=0.0)
            s0_old = tl.load(scr_ptr + so + rows, mask=mrow, other=0.0)
        if DO_B:
            dx_old = tl.load(dx_ptr + xo + xy_off, mask=m_xp, other=0.0)
            if (not SEPARATE) and (DO_F or ACC) and (not ORDERED) and (not LATE_DB):
                dB_old = tl.load(dB_ptr + g_off, mask=m_bn, other=0.0)
            s2_old = tl.load(scr_ptr + so + 2 * L + rows, mask=mrow, other=0.0)
        if DO_F:
            dtf, af, csf, lastf, tailf, Bf, Cf, dzf, f_dt, f_B, f_C, f_dz = _dir_step(
                f_dt, f_B, f_C, f_dz, dt_ptr + dto, B_ptr + bco, C_ptr + bco, dy_ptr + xo, bias, A_h, rows, rows_n, mrow,
                offs_q, offs_p, mask_p, offs_n, mask_n, m_bn, bn_off, L, H, xstride, bstride, dt_lo, dt_hi, SH_F,
                SOFTPLUS, COMPUTE, BLOCK_Q, AHEAD)
            # pairs with s in earlier chunks: dC_t = e_t dz_t S^T, and their output terms Yf_t = dz_t . (e_t C_t S)
            # = C_t . dC_t from the same product (DOT_RD, as for Yb)
            dC_inter = tl.exp(csf)[:, None] * _dot(dzf, tl.trans(S), DOT_RD)
            Yf = tl.sum(Cf * dC_inter, 1)
            if ORDERED:
                _add_turn(dC_ptr + g_off, m_bn, dC_inter, cnt_C + c, turn)
            elif FRESH_C:
                tl.store(dC_ptr + g_off, dC_inter.to(dC_ptr.dtype.element_ty), mask=m_bn)
            else:
                _store_sum(dC_ptr + g_off, dC_old, dC_inter, m_bn)
            S = _dot_acc(tl.trans(Bf * (tl.exp(tailf - af) * dtf)[:, None]), xv, tl.exp(lastf) * S, DOT_ST)
            _store_sum(scr_ptr + so + rows, s0_old, Yf, mrow)
        if OWN_B:
            dtb, ab, csb, lastb, tailb, Bbv, Cbv, dzb, b_dt, b_B, b_C, b_dz = _dir_step(
                b_dt, b_B, b_C, b_dz, dtb_ptr + dto, Bb_ptr + bco, Cb_ptr + bco, dy_ptr + xo, bias, A_h, rows,
                rows_n, mrow, offs_q, offs_p, mask_p, offs_n, mask_n, m_bn, bn_off, L, H, xstride, bstride, dt_lo,
                dt_hi, SH_B, SOFTPLUS, COMPUTE, BLOCK_Q, AHEAD)
        elif DO_B:  # as in pass A
            dtb, ab, csb, lastb, tailb, Bbv, Cbv, dzb = dtf, af, csf, lastf, tailf, Bf, Cf, dzf
        if DO_B:
            # pairs with t in earlier chunks: through the gradient dSb of the anti-causal state of earlier rows
            ebx = tl.exp(csb - ab)
            ub_in = ebx[:, None] * _dot(Bbv, dSb, DOT_RD)
            dBb = (dtb * ebx)[:, None] * _dot(xv, tl.trans(dSb), DOT_LO)
            xub_in = tl.sum(ub_in * xv, 1)
            Xb = dtb * xub_in
            dSb = _dot_acc(tl.trans(Cbv * tl.exp(tailb)[:, None]), dzb, tl.exp(lastb) * dSb, DOT_ST)
            _store_sum(dx_ptr + xo + xy_off, dx_old, dtb[:, None] * ub_in, m_xp)
            if ORDERED:
                _add_turn(dB_ptr + g_off, m_bn, dBb, cnt_B + c, turn)
            elif SEPARATE:
                tl.store(dBb_ptr + g_off, dBb.to(dBb_ptr.dtype.element_ty), mask=m_bn)
            elif DO_F or ACC:  # add to this chunk's dB of pass A or of the other direction's launch
                if LATE_DB:
                    _add_rows(dB_ptr + g_off, dBb, m_bn)
                else:
                    _store_sum(dB_ptr + g_off, dB_old, dBb, m_bn)
            else:
                tl.store(dB_ptr + g_off, dBb.to(dB_ptr.dtype.element_ty), mask=m_bn)
            # slot 2 += -Xb (rows written in pass A), and slot 3 = -(slot 2): pass A wrote Yb and -Yb, so this is
            # -Yb + Xb, bitwise
            s2 = s2_old - Xb
            tl.store(scr_ptr + so + 2 * L + rows, s2, mask=mrow)
            tl.store(scr_ptr + so + 3 * L + rows, -s2, mask=mrow)
            tl.store(scr_ptr + so + 4 * L + rows, xub_in, mask=mrow)

    # per-(batch * head, segment) partial of dD (from the first launch only)
    if not ACC:
        tl.store(part_ptr + (pid.to(tl.int64) * nseg + seg) * P + offs_p, dD_acc, mask=mask_p)
