"""The forward kernels of the bidirectional SSD: y = M_f x + M_b x + D x (kernels_common has the mixing matrices).

Within a chunk of rows, with cs the inclusive cumsum of the chunk's log-decays a and tail[s] = sum_{k >= s} a_k:
    pairs across chunks (the state terms), causal:   y_t += exp(cs_t) C_t S,   S <- exp(cs_last) S + (B . w)^T x,
        w_s = exp(tail_s - a_s) dt_s (the decay from row s to the chunk's end); the anti-causal pass walks the chunks
        backward with its own state, mirrored;
    pairs inside a chunk: y_t += sum_s (C_t . B_s) decay(t, s) dt_s x_s, a (BLOCK_Q x BLOCK_Q) tile times x.

Two kernels: _bi_ssd_fwd_kernel, one program per (batch * head, block of headdim, segment), does the state terms and
D x: it walks its chunks forward (causal pass) with the state S (d_state x headdim, fp32) on chip, entered with the
boundary state of kernels_states, and writes y, then walks them backward (anti-causal pass) with its own state, reads
y back and adds. _bi_ssd_fwd_pairs_kernel, one program per (batch * head block, block of headdim, chunk), then adds
the pairs inside each chunk (no state: all chunks in parallel, in the chunks and headdim blocks of the forward
kernel's config); from d_state 128 a program walks a block of a group's heads with the chunk's C B^T computed once
(GROUPED).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .kernels_common import (
    _chunk_rows, _decay_of_raw, _entry_state, _head_coords, _head_params, _pair_decay, _shifted_rows, _tile_offsets,
)


@triton.jit
def _bi_ssd_fwd_kernel(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, bias_ptr, dtb_ptr, Bb_ptr, Cb_ptr, y_ptr, st_ptr, dtp_ptr, dtbp_ptr,
    L, H, G, SEG, dt_lo, dt_hi,
    P: tl.constexpr, N: tl.constexpr, BLOCK_N: tl.constexpr,
    DO_F: tl.constexpr, DO_B: tl.constexpr, SHIFT: tl.constexpr,
    HAS_D: tl.constexpr, D_PER_P: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
    COMPUTE: tl.constexpr, AHEAD: tl.constexpr, STORE_DT: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_P: tl.constexpr,
):
    """The forward's state terms (pairs across chunks) and D x, one program per (batch * head, block of headdim,
    segment); _bi_ssd_fwd_pairs_kernel adds the pairs inside each chunk afterwards. AHEAD (bits): 1, each chunk's dt,
    x and C are loaded one chunk ahead of their use (B is loaded at its use, after the read-out); 2, with both
    directions, the anti-causal pass reads the causal pass's y of a chunk before the chunk's products, not after them.
    The result is the same (the same arithmetic). STORE_DT (bits): the programs of the first headdim block store the
    processed dt (softplus, bias, limits) of the causal pass into dtp (1) and of the anti-causal pass into dtbp (2), in
    the compute dtype, for the kernels after this one, which then read it as it is instead of computing it again."""
    pid_bh = tl.program_id(0)
    pid_p = tl.program_id(1)
    seg = tl.program_id(2)
    hidx, gidx, b64 = _head_coords(pid_bh, H, G)

    offs_q, offs_p, offs_n, mask_p, mask_n = _tile_offsets(pid_p, P, N, BLOCK_Q, BLOCK_P, BLOCK_N)

    x_base = x_ptr + b64 * L * H * P + hidx * P
    y_base = y_ptr + b64 * L * H * P + hidx * P
    dt_base = dt_ptr + b64 * L * H + hidx
    dtb_base = dtb_ptr + b64 * L * H + hidx
    dtp_base = dtp_ptr + b64 * L * H + hidx
    dtbp_base = dtbp_ptr + b64 * L * H + hidx
    bc_off = b64 * L * G * N + gidx * N
    _A_raw, A_h, bias = _head_params(A_ptr, bias_ptr, hidx, HAS_BIAS, COMPUTE)
    if HAS_D:
        if D_PER_P:
            Dv = tl.load(D_ptr + hidx * P + offs_p, mask=mask_p, other=0.0).to(COMPUTE)
        else:
            Dv = tl.load(D_ptr + hidx).to(COMPUTE)

    # this program's rows: chunks [c0, c1) = segment seg, entered with the states of the state kernel
    nseg = tl.cdiv(L, SEG)
    c0 = seg * (SEG // BLOCK_Q)
    c1 = tl.minimum(tl.cdiv(L, BLOCK_Q), c0 + SEG // BLOCK_Q)
    tile = offs_n[:, None] * P + offs_p[None, :]
    m_st = mask_n[:, None] & mask_p[None, :]

    IN_AHEAD: tl.constexpr = AHEAD % 2 == 1
    Y_EARLY: tl.constexpr = AHEAD >= 2
    if DO_F:
        S = _entry_state(st_ptr, pid_bh, seg, nseg, tile, m_st, 0, N, P).to(COMPUTE)
        if IN_AHEAD:  # the first chunk's dt, x, C
            n_dt, n_x, n_C = _fwd_chunk_in(dt_base, x_base, C_ptr + bc_off, c0 * BLOCK_Q + offs_q, offs_p, mask_p,
                                           offs_n, mask_n, L, H, H * P, G * N, -1 if SHIFT else 0)
        for c in range(c0, c1):
            rows, mrow, m_xp, m_bn, xy_off, bn_off = _chunk_rows(c, offs_q, offs_p, offs_n, mask_p, mask_n, L, H * P, G * N, BLOCK_Q)
            if IN_AHEAD:
                r_dt = n_dt
                r_x = n_x
                r_C = n_C
                n_dt, n_x, n_C = _fwd_chunk_in(dt_base, x_base, C_ptr + bc_off, rows + BLOCK_Q, offs_p, mask_p,
                                               offs_n, mask_n, L, H, H * P, G * N, -1 if SHIFT else 0)
            else:
                r_dt, r_x, r_C = _fwd_chunk_in(dt_base, x_base, C_ptr + bc_off, rows, offs_p, mask_p, offs_n, mask_n, L,
                                               H, H * P, G * N, -1 if SHIFT else 0)
            dtv, a, cs, cs_last, tail = _decay_of_raw(r_dt.to(COMPUTE), bias, A_h, mrow, offs_q, dt_lo, dt_hi,
                                                      SOFTPLUS, BLOCK_Q)
            if STORE_DT % 2 == 1:
                tl.store(dtp_base + rows * H, dtv.to(dtp_ptr.dtype.element_ty), mask=mrow & (pid_p == 0))
            xv = r_x.to(COMPUTE)
            Cv = r_C.to(COMPUTE)
            # from the chunk's start to row t: steps ..t (rowd = cs), with the shift ..t-1 (C_{t-1} reads the state
            # of row t-1)
            rowd = cs - a if SHIFT else cs
            yv = tl.exp(rowd)[:, None] * tl.dot(Cv, S)
            Bv = tl.load(B_ptr + bc_off + bn_off, mask=m_bn, other=0.0).to(COMPUTE)
            wS = tl.exp(tail - a) * dtv
            S = tl.dot(tl.trans(Bv * wS[:, None]), xv, tl.exp(cs_last) * S)
            if not DO_B:
                if HAS_D:
                    if D_PER_P:
                        yv += Dv[None, :] * xv
                    else:
                        yv += Dv * xv
            tl.store(y_base + xy_off, yv.to(y_ptr.dtype.element_ty), mask=m_xp)

    if DO_B:
        if DO_F:
            tl.debug_barrier()
        Sb = _entry_state(st_ptr, pid_bh, seg, nseg, tile, m_st, 1, N, P).to(COMPUTE)
        if IN_AHEAD:  # the last chunk's dt, x, C
            n_dt, n_x, n_C = _fwd_chunk_in(dtb_base, x_base, Cb_ptr + bc_off, (c1 - 1) * BLOCK_Q + offs_q, offs_p,
                                           mask_p, offs_n, mask_n, L, H, H * P, G * N, 1 if SHIFT else 0)
        for ci in range(0, c1 - c0):
            c = c1 - 1 - ci
            rows, mrow, m_xp, m_bn, xy_off, bn_off = _chunk_rows(c, offs_q, offs_p, offs_n, mask_p, mask_n, L, H * P, G * N, BLOCK_Q)
            y_ptrs = y_base + xy_off
            if DO_F and Y_EARLY:  # the causal pass's y of these rows, read before the chunk's products
                y_old = tl.load(y_ptrs, mask=m_xp, other=0.0)
            if IN_AHEAD:
                r_dt = n_dt
                r_x = n_x
                r_C = n_C
                n_dt, n_x, n_C = _fwd_chunk_in(dtb_base, x_base, Cb_ptr + bc_off, rows - BLOCK_Q, offs_p, mask_p,
                                               offs_n, mask_n, L, H, H * P, G * N, 1 if SHIFT else 0)
            else:
                r_dt, r_x, r_C = _fwd_chunk_in(dtb_base, x_base, Cb_ptr + bc_off, rows, offs_p, mask_p, offs_n, mask_n,
                                               L, H, H * P, G * N, 1 if SHIFT else 0)
            dtv, a, cs, cs_last, tail = _decay_of_raw(r_dt.to(COMPUTE), bias, A_h, mrow, offs_q, dt_lo, dt_hi,
                                                      SOFTPLUS, BLOCK_Q)
            if STORE_DT >= 2:
                tl.store(dtbp_base + rows * H, dtv.to(dtbp_ptr.dtype.element_ty), mask=mrow & (pid_p == 0))
            csx = cs - a
            xv = r_x.to(COMPUTE)
            Cv = r_C.to(COMPUTE)
            # from row t to the chunk's end: steps t.. (tail), with the shift t+1.. (C_{t+1} reads the state of row t+1)
            yv = tl.exp(tail - a if SHIFT else tail)[:, None] * tl.dot(Cv, Sb)
            Bv = tl.load(Bb_ptr + bc_off + bn_off, mask=m_bn, other=0.0).to(COMPUTE)
            wS = tl.exp(csx) * dtv
            Sb = tl.dot(tl.trans(Bv * wS[:, None]), xv, tl.exp(cs_last) * Sb)
            if HAS_D:
                if D_PER_P:
                    yv += Dv[None, :] * xv
                else:
                    yv += Dv * xv
            if DO_F:
                if Y_EARLY:
                    yv += y_old.to(COMPUTE)
                else:
                    yv += tl.load(y_ptrs, mask=m_xp, other=0.0).to(COMPUTE)
            tl.store(y_ptrs, yv.to(y_ptr.dtype.element_ty), mask=m_xp)


@triton.jit
def _fwd_chunk_in(dt_base, x_base, C_base, rows, offs_p, mask_p, offs_n, mask_n, L, H, xstride, bstride,
                  C_SHIFT: tl.constexpr):
    """A chunk's dt, x and the C rows its outputs read (C[t + C_SHIFT], _load_c) as stored, 0 outside [0, L)."""
    ok = (rows >= 0) & (rows < L)
    dtr = tl.load(dt_base + rows * H, mask=ok, other=0.0)
    xr = tl.load(x_base + rows[:, None] * xstride + offs_p[None, :], mask=ok[:, None] & mask_p[None, :], other=0.0)
    return dtr, xr, _shifted_rows(C_base, rows, ok, offs_n, mask_n, L, bstride, C_SHIFT)


@triton.jit
def _load_c(C_ptr, rows, mrow, offs_n, mask_n, L, bstride, C_SHIFT: tl.constexpr, COMPUTE: tl.constexpr):
    """The C rows a chunk's outputs read: C[t + C_SHIFT] (Hydra's shift: C[t-1] for the causal direction, C_bwd[t+1]
    for the anti-causal one), zero outside the sequence."""
    return _shifted_rows(C_ptr, rows, mrow, offs_n, mask_n, L, bstride, C_SHIFT).to(COMPUTE)


@triton.jit
def _fwd_pairs_head_in(x_ptr, y_ptr, dt_ptr, dtb_ptr, A_ptr, bias_ptr, b64, hidx, live, L, H, rows, mrow, xy_off, m_xp,
                       P: tl.constexpr, DO_F: tl.constexpr, DO_B: tl.constexpr, SHARE: tl.constexpr,
                       HAS_BIAS: tl.constexpr, COMPUTE: tl.constexpr, LOAD_Y: tl.constexpr):
    """What the forward pairs kernel reads of head hidx, as loaded (nothing where not live, a scalar: past the
    program's last head, whose index is then clamped for the scalars): x, y (LOAD_Y; else x again), the dt of its first
    direction and that of its second (dt_bwd; the same tensor unless it runs both directions apart), A clamped to
    <= 0 and dt_bias."""
    xo = b64 * L * H * P + hidx * P
    dto = b64 * L * H + hidx
    m = m_xp & live
    xr = tl.load(x_ptr + xo + xy_off, mask=m, other=0.0)
    if LOAD_Y:
        yr = tl.load(y_ptr + xo + xy_off, mask=m, other=0.0)
    else:
        yr = xr  # (a stand-in: not read)
    m_dt = mrow & live
    if DO_F:
        dt1 = tl.load(dt_ptr + dto + rows * H, mask=m_dt, other=0.0)
    else:
        dt1 = tl.load(dtb_ptr + dto + rows * H, mask=m_dt, other=0.0)
    if DO_F and DO_B and not SHARE:
        dt2 = tl.load(dtb_ptr + dto + rows * H, mask=m_dt, other=0.0)
    else:
        dt2 = dt1
    _A_raw, A_h, bias = _head_params(A_ptr, bias_ptr, hidx, HAS_BIAS, COMPUTE)
    return xr, yr, dt1, dt2, A_h, bias


@triton.jit
def _chunk_cb(B_ptr, C_ptr, bc_off, bn_off, rows, mrow, offs_n, mask_n, m_bn, L, bstride, C_SHIFT: tl.constexpr,
              COMPUTE: tl.constexpr):
    """C B^T of a chunk, the C rows at offset C_SHIFT (_load_c)."""
    Bv = tl.load(B_ptr + bc_off + bn_off, mask=m_bn, other=0.0).to(COMPUTE)
    Cv = _load_c(C_ptr + bc_off, rows, mrow, offs_n, mask_n, L, bstride, C_SHIFT, COMPUTE)
    return tl.dot(Cv, tl.trans(Bv))


@triton.jit
def _fwd_pairs_cb(B_ptr, C_ptr, Bb_ptr, Cb_ptr, bc_off, bn_off, rows, mrow, offs_n, mask_n, m_bn, L, G, N: tl.constexpr,
                  DO_F: tl.constexpr, DO_B: tl.constexpr, SHIFT: tl.constexpr, SHARE: tl.constexpr,
                  COMPUTE: tl.constexpr):
    """C B^T of the chunk for the forward pairs kernel's first direction and for its second (C_bwd B_bwd^T; the same
    tile unless it runs both directions apart), with Hydra's shift of the C rows."""
    if DO_F:
        cb1 = _chunk_cb(B_ptr, C_ptr, bc_off, bn_off, rows, mrow, offs_n, mask_n, m_bn, L, G * N, -1 if SHIFT else 0,
                        COMPUTE)
    else:
        cb1 = _chunk_cb(Bb_ptr, Cb_ptr, bc_off, bn_off, rows, mrow, offs_n, mask_n, m_bn, L, G * N, 1 if SHIFT else 0,
                        COMPUTE)
    if DO_F and DO_B and not SHARE:
        cb2 = _chunk_cb(Bb_ptr, Cb_ptr, bc_off, bn_off, rows, mrow, offs_n, mask_n, m_bn, L, G * N, 1 if SHIFT else 0,
                        COMPUTE)
    else:
        cb2 = cb1
    return cb1, cb2


@triton.jit
def _fwd_pairs_head(xv, dt1, dt2, A_h, bias, cb1, cb2, mrow, offs_q, tt, ss, dt_lo, dt_hi, DO_F: tl.constexpr,
                    DO_B: tl.constexpr, SHIFT: tl.constexpr, SHARE: tl.constexpr, SOFTPLUS: tl.constexpr,
                    BLOCK_Q: tl.constexpr):
    """One head's in-chunk pairs of the forward: (C B^T . decay . dt) x summed over the directions (with SHARE both
    in one tile); cb1 / dt1 are its first direction's, cb2 / dt2 its second's (the anti-causal direction of both)."""
    if DO_F:
        dtv, a, cs, _last_f, _tail_f = _decay_of_raw(dt1, bias, A_h, mrow, offs_q, dt_lo, dt_hi, SOFTPLUS, BLOCK_Q)
        if SHARE:  # both directions' in-chunk pairs (see _pair_decay)
            decay = _pair_decay(cs, a, tt, ss)
        elif SHIFT:  # y_f[t] reads C[t-1] and the steps s+1..t-1
            decay = tl.exp(tl.where(tt > ss, (cs - a)[:, None] - cs[None, :], float("-inf")))
        else:
            decay = tl.exp(tl.where(tt >= ss, cs[:, None] - cs[None, :], float("-inf")))
        yv = tl.dot(cb1 * decay * dtv[None, :], xv)
        if DO_B and not SHARE:
            yv += _fwd_pairs_anti(xv, dt2, A_h, bias, cb2, mrow, offs_q, tt, ss, dt_lo, dt_hi, SHIFT, SOFTPLUS, BLOCK_Q)
    else:
        yv = _fwd_pairs_anti(xv, dt1, A_h, bias, cb1, mrow, offs_q, tt, ss, dt_lo, dt_hi, SHIFT, SOFTPLUS, BLOCK_Q)
    return yv


@triton.jit
def _fwd_pairs_anti(xv, dtr, A_h, bias, cb, mrow, offs_q, tt, ss, dt_lo, dt_hi, SHIFT: tl.constexpr,
                    SOFTPLUS: tl.constexpr, BLOCK_Q: tl.constexpr):
    """The anti-causal direction's in-chunk pairs of one head in the forward (alone: not shared with the causal one)."""
    dtv, a, cs, _last_b, _tail_b = _decay_of_raw(dtr, bias, A_h, mrow, offs_q, dt_lo, dt_hi, SOFTPLUS, BLOCK_Q)
    csx = cs - a
    if SHIFT:  # y_b[t] reads C_bwd[t+1] and the steps t+1..s-1
        decay = tl.exp(tl.where(ss > tt, csx[None, :] - cs[:, None], float("-inf")))
    else:
        decay = tl.exp(tl.where(ss >= tt, csx[None, :] - csx[:, None], float("-inf")))
    return tl.dot(cb * decay * dtv[None, :], xv)


@triton.jit
def _bi_ssd_fwd_pairs_kernel(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, bias_ptr, dtb_ptr, Bb_ptr, Cb_ptr, y_ptr,
    L, H, G, HEADS, dt_lo, dt_hi,
    P: tl.constexpr, N: tl.constexpr, BLOCK_N: tl.constexpr,
    DO_F: tl.constexpr, DO_B: tl.constexpr, SHIFT: tl.constexpr, SHARE: tl.constexpr,
    HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, GROUPED: tl.constexpr, COMPUTE: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_P: tl.constexpr,
):
    """The forward's in-chunk pairs: no state, so all chunks run in parallel. Adds (C B^T . decay . dt) x of each
    direction's pairs inside the chunk (with SHARE both in one tile) to the y that _bi_ssd_fwd_kernel (same BLOCK_Q:
    the same chunks) wrote with the pairs across chunks and D x. One program per (batch * group * block of HEADS heads
    of the group, block of headdim, chunk):
      GROUPED=False (HEADS = 1): the head's x, dt, B, C loaded together, then the products (y after them);
      GROUPED=True: C B^T, the same for every head of a group, computed once; the program walks its heads, loading
        each head's x, y and dt one head ahead of their use (the first head's with B and C), so that no load waits on
        the product before it. Its registers (255 on sm_90 at 64 x 64 tiles, against 168) cost more than the products
        it saves at d_state 64 and below (tuning.fwd_pairs_heads says where it runs).
    The result does not depend on GROUPED or HEADS (each head's arithmetic is the same)."""
    pid = tl.program_id(0)
    pid_p = tl.program_id(1)
    c = tl.program_id(2)
    R = H // G
    nhb = tl.cdiv(R, HEADS)
    hb = pid % nhb
    gidx = (pid // nhb) % G
    b64 = (pid // (nhb * G)).to(tl.int64)
    h0 = gidx * R + hb * HEADS
    offs_q, offs_p, offs_n, mask_p, mask_n = _tile_offsets(pid_p, P, N, BLOCK_Q, BLOCK_P, BLOCK_N)
    tt = offs_q[:, None]
    ss = offs_q[None, :]
    bc_off = b64 * L * G * N + gidx * N
    rows, mrow, m_xp, m_bn, xy_off, bn_off = _chunk_rows(c, offs_q, offs_p, offs_n, mask_p, mask_n, L, H * P, G * N, BLOCK_Q)
    xr, yr, dt1, dt2, A_h, bias = _fwd_pairs_head_in(x_ptr, y_ptr, dt_ptr, dtb_ptr, A_ptr, bias_ptr, b64, h0, True, L, H,
                                                     rows, mrow, xy_off, m_xp, P, DO_F, DO_B, SHARE, HAS_BIAS, COMPUTE,
                                                     GROUPED)
    cb1, cb2 = _fwd_pairs_cb(B_ptr, C_ptr, Bb_ptr, Cb_ptr, bc_off, bn_off, rows, mrow, offs_n, mask_n, m_bn, L, G, N,
                             DO_F, DO_B, SHIFT, SHARE, COMPUTE)
    if GROUPED:
        h_last = h0 + tl.minimum(HEADS, R - hb * HEADS) - 1
        for hidx in range(h0, h_last + 1):
            xv = xr.to(COMPUTE)
            y_old = yr
            d1 = dt1.to(COMPUTE)
            d2 = dt2.to(COMPUTE)
            A_j = A_h
            bias_j = bias
            # the next head's inputs (none after the last)
            xr, yr, dt1, dt2, A_h, bias = _fwd_pairs_head_in(x_ptr, y_ptr, dt_ptr, dtb_ptr, A_ptr, bias_ptr, b64,
                                                             tl.minimum(hidx + 1, h_last), hidx < h_last, L, H, rows,
                                                             mrow, xy_off, m_xp, P, DO_F, DO_B, SHARE, HAS_BIAS,
                                                             COMPUTE, True)
            yv = _fwd_pairs_head(xv, d1, d2, A_j, bias_j, cb1, cb2, mrow, offs_q, tt, ss, dt_lo, dt_hi, DO_F, DO_B,
                                 SHIFT, SHARE, SOFTPLUS, BLOCK_Q)
            tl.store(y_ptr + b64 * L * H * P + hidx * P + xy_off, (y_old.to(COMPUTE) + yv).to(y_ptr.dtype.element_ty),
                     mask=m_xp)
    else:
        yv = _fwd_pairs_head(xr.to(COMPUTE), dt1.to(COMPUTE), dt2.to(COMPUTE), A_h, bias, cb1, cb2, mrow, offs_q, tt, ss,
                             dt_lo, dt_hi, DO_F, DO_B, SHIFT, SHARE, SOFTPLUS, BLOCK_Q)
        y_ptrs = y_ptr + b64 * L * H * P + h0 * P + xy_off
        tl.store(y_ptrs, (tl.load(y_ptrs, mask=m_xp, other=0.0).to(COMPUTE) + yv).to(y_ptr.dtype.element_ty), mask=m_xp)
