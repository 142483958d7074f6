"""The segment-boundary states of the bidirectional SSD: the state kernel walks the chunks once and stores the state
at each boundary between segments, so that the segment kernels of the forward and the backward run in parallel.

Over one chunk (cs, tail, last: the cumsums of kernels_forward), S <- exp(last) S + (w V)^T R with
    forward:  S_f (V = B, R = x, w = exp(tail - a) dt), S_b (V = B_bwd, R = x, w = exp(cs - a) dt);
    backward: the state gradients dS_f (V = C, R = dz_f, w = exp(cs)), dS_b (V = C_bwd, R = dz_b, w = exp(tail)).
The forward's S_f, S_b are kept for the backward (when a gradient is wanted the forward computes them at the
backward's precision, DOT_ST). With one segment no state kernel runs and the segment kernels start from zeros.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .kernels_common import _chunk_decay, _dot_acc, _head_coords, _head_params, _shifted_rows


@triton.jit
def _state_walk(v_ptr, r_ptr, dt_base, st_base, A_h, bias, L, H, SEG, v_stride, r_stride, R_SHIFT: tl.constexpr,
                dt_lo, dt_hi, P: tl.constexpr, N: tl.constexpr, MODE: tl.constexpr, SOFTPLUS: tl.constexpr,
                COMPUTE: tl.constexpr, DOT_ST: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_P: tl.constexpr, pid_p):
    """Walk the chunks and store the state at every boundary between segments: st[k] (N x P block) at boundary k,
    between segments k and k + 1 (see _entry_state).

    MODE 0: S_f  causal state entering segment seg (forward walk; V = B,  R = x,  w = exp(last - cs) dt, from the tail sums)
    MODE 1: dS_b grad of the anti-causal state of rows before seg (forward walk; V = C_b, R = dz_b, w = exp(last - csx))
    MODE 2: dS_f grad of the causal state leaving seg (reverse walk; V = C,  R = dz_f, w = exp(cs))
    MODE 3: S_b  anti-causal state of the rows after seg (reverse walk; V = B_b, R = x,  w = exp(csx) dt)
    Each update is S <- exp(last) S + (w V)^T R over one chunk, exactly as the segment kernel does it.
    """
    offs_q = tl.arange(0, BLOCK_Q)
    offs_n = tl.arange(0, BLOCK_N)
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    mask_n = offs_n < N
    mask_p = offs_p < P
    st_ptrs = st_base + offs_n[:, None] * P + offs_p[None, :]
    m_st = mask_n[:, None] & mask_p[None, :]
    nchunks = tl.cdiv(L, BLOCK_Q)
    nseg = tl.cdiv(L, SEG)
    # the chunks of every segment but the last (forward walk) or but the first (reverse walk); nseg >= 2 here
    if MODE < 2:
        n_iter = (nseg - 1) * (SEG // BLOCK_Q)
    else:
        n_iter = nchunks - SEG // BLOCK_Q
    S = tl.zeros((BLOCK_N, BLOCK_P), dtype=COMPUTE)
    for i in range(0, n_iter):
        if MODE < 2:
            c = i
        else:
            c = nchunks - 1 - i
        rows = c * BLOCK_Q + offs_q
        mrow = rows < L
        dtv, a, cs, last, tail = _chunk_decay(dt_base, bias, A_h, rows, mrow, offs_q, H, dt_lo, dt_hi, SOFTPLUS, COMPUTE, BLOCK_Q)
        if MODE == 0:
            w = tl.exp(tail - a) * dtv
        elif MODE == 1:
            w = tl.exp(tail)
        elif MODE == 2:
            w = tl.exp(cs)
        else:
            w = tl.exp(cs - a) * dtv
        Vv = tl.load(v_ptr + rows[:, None] * v_stride + offs_n[None, :], mask=mrow[:, None] & mask_n[None, :],
                     other=0.0).to(COMPUTE)
        Rv = _shifted_rows(r_ptr, rows, mrow, offs_p, mask_p, L, r_stride, R_SHIFT).to(COMPUTE)
        S = _dot_acc(tl.trans(Vv * w[:, None]), Rv, tl.exp(last) * S, DOT_ST)
        # the state after this chunk, where it ends a segment (forward walk: the boundary after its rows) or starts
        # one (reverse walk: the boundary before them)
        if MODE < 2:
            edge = (c + 1) * BLOCK_Q
        else:
            edge = c * BLOCK_Q
        tl.store(st_ptrs + (edge // SEG - 1).to(tl.int64) * (N * P), S, mask=m_st & (edge % SEG == 0))


@triton.jit
def _bi_ssd_state_kernel(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, bias_ptr, dtb_ptr, Bb_ptr, Cb_ptr, dy_ptr, st_ptr,
    L, H, G, SEG, dt_lo, dt_hi,
    P: tl.constexpr, N: tl.constexpr, BLOCK_N: tl.constexpr, GRAD: tl.constexpr,
    DO_F: tl.constexpr, DO_B: tl.constexpr, SHIFT: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
    COMPUTE: tl.constexpr, DOT_ST: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_P: tl.constexpr,
):
    """Segment-boundary states: program (batch * head, headdim block, slot); st has shape (b * h, 2, nseg - 1, N, P)
    (see _entry_state), and nseg >= 2.
    not GRAD (forward): S_f (MODE 0 of :func:`_state_walk`) and S_b (MODE 3), which the backward reads too;
    GRAD (backward): the state gradients dS_b (MODE 1) and dS_f (MODE 2)."""
    pid_bh = tl.program_id(0)
    pid_p = tl.program_id(1)
    slot = tl.program_id(2)
    NSLOT: tl.constexpr = 2
    if GRAD:
        kind = slot + 1
    else:
        kind = slot * 3
    hidx, gidx, b64 = _head_coords(pid_bh, H, G)
    xo = b64 * L * H * P + hidx * P
    dto = b64 * L * H + hidx
    bco = b64 * L * G * N + gidx * N
    nseg = tl.cdiv(L, SEG)
    st_base = st_ptr + (pid_bh.to(tl.int64) * NSLOT + slot) * (nseg - 1) * (N * P)
    _A_raw, A_h, bias = _head_params(A_ptr, bias_ptr, hidx, HAS_BIAS, COMPUTE)
    SH_F: tl.constexpr = 1 if SHIFT else 0  # dz_f[t] = dy[t + 1] with Hydra's shift
    SH_B: tl.constexpr = -1 if SHIFT else 0  # dz_b[t] = dy[t - 1]
    if kind == 0:
        if DO_F:
            _state_walk(B_ptr + bco, x_ptr + xo, dt_ptr + dto, st_base, A_h, bias, L, H, SEG, G * N, H * P, 0,
                        dt_lo, dt_hi, P, N, 0, SOFTPLUS, COMPUTE, DOT_ST, BLOCK_Q, BLOCK_N, BLOCK_P, pid_p)
    elif kind == 1:
        if GRAD and DO_B:
            _state_walk(Cb_ptr + bco, dy_ptr + xo, dtb_ptr + dto, st_base, A_h, bias, L, H, SEG, G * N, H * P, SH_B,
                        dt_lo, dt_hi, P, N, 1, SOFTPLUS, COMPUTE, DOT_ST, BLOCK_Q, BLOCK_N, BLOCK_P, pid_p)
    elif kind == 2:
        if GRAD and DO_F:
            _state_walk(C_ptr + bco, dy_ptr + xo, dt_ptr + dto, st_base, A_h, bias, L, H, SEG, G * N, H * P, SH_F,
                        dt_lo, dt_hi, P, N, 2, SOFTPLUS, COMPUTE, DOT_ST, BLOCK_Q, BLOCK_N, BLOCK_P, pid_p)
    else:
        if DO_B:
            _state_walk(Bb_ptr + bco, x_ptr + xo, dtb_ptr + dto, st_base, A_h, bias, L, H, SEG, G * N, H * P, 0,
                        dt_lo, dt_hi, P, N, 3, SOFTPLUS, COMPUTE, DOT_ST, BLOCK_Q, BLOCK_N, BLOCK_P, pid_p)
