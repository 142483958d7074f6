"""The jit helpers every kernel of the bidirectional SSD shares: dots at a chosen precision, the processed dt and
its log-decays, tile coordinates, the boundary states, shifted row loads and read-add-writes.

Layout: x, y, dy, dx (b, l, h, p) contiguous; dt (b, l, h); B, C (b, l, g, n); A, dt_bias (h,); D (h,) or (h, p).
The sequence is walked in tiles of BLOCK_Q rows ("chunks"); BLOCK_Q is a tuning parameter only: the result does not
depend on it (up to rounding). Segments: the sequence is cut into segments of SEG rows (a whole number of chunks of
every config; tuning.segment_rows) that run in parallel, each entered with the states at its ends
(kernels_states).

With a_k = max(dt_k A, LOG_DECAY_FLOOR) the log-decay of step k, the mixing matrix of each direction is
    causal:       M_f[t, s] = (C_t . B_s) dt_s exp(sum_{k=s+1..t} a_k),  s <= t
    anti-causal:  M_b[t, s] = (C_t . B_s) dt_s exp(sum_{k=t..s-1} a_k),  s >= t
and y = M_f x + M_b x + D x. Hydra's shift (shift=True) moves each direction one step off the diagonal: an offset of
the C rows that are loaded (C[t-1] for the causal, C_bwd[t+1] for the anti-causal direction) and a strict mask. The
reverse direction is index arithmetic; no tensor is flipped or copied.

Both directions for the price of about one (SHARE, BiMamba2 mode: the same dt, B, C in both directions, no shift):
the in-chunk pairs of the two directions use the same C B^T and dz x^T tiles and differ only in their decays, which
sit on opposite sides of the diagonal; one tile holds both (_pair_decay).

Dot precision: the backward's per-position log-decay gradients (-> ddt, dA, d dt_bias) are differences of large,
nearly equal sums, so the dots that update or read a state need about fp32 accuracy; the others need only the
accuracy of the outputs they feed. Each dot takes its precision from a constexpr (DOT_ST, DOT_RD, DOT_MID, DOT_IN,
DOT_LO: autograd.dot_precisions says what each class feeds) through :func:`_dot`, which adds bf16 and split-bf16
modes to tl.dot's input precisions; a state update S <- decay S + V^T R passes decay S as the MMA's accumulator
(:func:`_dot_acc`), so the product and the state are not two tiles in registers at once. The forward keeps Triton's
default (tf32; "ieee" for fp64).

Every exponent is a masked (masked before exp) difference of non-positive log-decay sums, so it is <= 0 (up to
rounding) and no inf * 0 can appear. Rows >= L load dt = x = B = C = 0. No atomics outside the ORDERED mode's
counters: every output element is written by exactly one program per launch, so results are bitwise reproducible.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ... import config
from .reference import LOG_DECAY_FLOOR as _LOG_DECAY_FLOOR

# the Triton interpreter miscomputes bf16 (numpy has no bf16): there, a "bf16" dot rounds its fp32 operands to bf16
# values (round to nearest even, on the bits) and multiplies them in fp32, which is what a bf16 tensor-core dot with
# fp32 accumulation computes
_EMULATE_BF16 = tl.constexpr(config.triton_interpret())


@triton.jit
def _round_bf16(v):
    """v rounded to bf16 (round to nearest even), as a bf16 tensor on the GPU and as fp32 values in the interpreter."""
    if _EMULATE_BF16:
        u = v.to(tl.uint32, bitcast=True)
        u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
        return u.to(tl.float32, bitcast=True)
    else:
        return v.to(tl.bfloat16)


@triton.jit
def _bf16_of_bits(u):
    """The bf16 value of the fp32 bits u whose low 16 bits are zero (exact: bf16 is the top half of fp32): bit
    operations on the GPU, no conversion instruction; in the interpreter the same value as fp32."""
    if _EMULATE_BF16:
        return u.to(tl.float32, bitcast=True)
    else:
        return (u >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _split_bf16(v):
    """v = hi + mid + lo exactly, three bf16 values: hi is v truncated to bf16 (its top 16 bits), mid the same of
    the rest v - hi (exact: it holds v's next 16 significant bits), lo = v - hi - mid (exact, and at most 8
    significant bits are left, so it is a bf16 value). Truncation instead of rounding: masks and subtractions
    only, where a rounding split needs a conversion instruction per element and part."""
    hu = v.to(tl.uint32, bitcast=True) & 0xFFFF0000
    r = v - hu.to(tl.float32, bitcast=True)
    mu = r.to(tl.uint32, bitcast=True) & 0xFFFF0000
    lo = r - mu.to(tl.float32, bitcast=True)
    return _bf16_of_bits(hu), _bf16_of_bits(mu), _bf16_of_bits(lo.to(tl.uint32, bitcast=True))


@triton.jit
def _dot(a, b, PREC: tl.constexpr):
    """fp32 dot at a chosen precision, always with fp32 accumulation:
    "ieee", "tf32", "tf32x3"   the tensor-core input precisions of tl.dot;
    "bf16"                     both operands rounded to bf16 (twice tf32's rate, six times tf32x3's);
    "bf16x3a" / "bf16x3b"      operand a (b) split into three bf16 parts, the other one a bf16 value (a loaded bf16
                               input: exact): three bf16 dots, half the cost of tf32x3 at about fp32 accuracy."""
    return _dot_acc(a, b, None, PREC)


@triton.jit
def _dot_acc(a, b, acc, PREC: tl.constexpr):
    """acc + a b at a chosen precision (the modes of _dot; acc None: a b alone), with acc as the MMA's accumulator: a
    state update S <- decay S + V^T R then holds one tile of the state's size in registers, not two (the product and
    S) until they are added."""
    if PREC == "bf16":
        return tl.dot(_round_bf16(a), _round_bf16(b), acc)
    elif PREC == "bf16x3a":
        hi, mid, lo = _split_bf16(a)
        bb = _round_bf16(b)
        return tl.dot(hi, bb, tl.dot(mid, bb, tl.dot(lo, bb, acc)))  # smallest part first, accumulated in the MMA
    elif PREC == "bf16x3b":
        hi, mid, lo = _split_bf16(b)
        aa = _round_bf16(a)
        return tl.dot(aa, hi, tl.dot(aa, mid, tl.dot(aa, lo, acc)))
    else:
        return tl.dot(a, b, acc, input_precision=PREC)


@triton.jit
def _log1p_small(z):
    # accurate log(1 + z) for 0 <= z <= 1 (Goldberg's trick; no libdevice needed)
    u = 1.0 + z
    d = u - 1.0
    return tl.where(d == 0.0, z, tl.log(u) * (z / tl.where(d == 0.0, 1.0, d)))


@triton.jit
def _process_dt(raw, bias, dt_lo, dt_hi, SOFTPLUS: tl.constexpr):
    """dt = clamp(softplus(raw + bias), lo, hi); also returns d dt / d raw."""
    v = raw + bias
    if SOFTPLUS:
        e = tl.exp(tl.minimum(v, 20.0))
        e_neg = tl.exp(-tl.abs(v))
        sp = tl.where(v > 20.0, v, tl.maximum(v, 0.0) + _log1p_small(e_neg))
        dsp = tl.where(v > 20.0, 1.0, e / (e + 1.0))
    else:
        sp = v
        dsp = tl.full(v.shape, 1.0, v.dtype)
    inside = (sp > dt_lo) & (sp < dt_hi)  # gradient 0 at the bounds, as reference.clamp_ste
    dtv = tl.minimum(tl.maximum(sp, dt_lo), dt_hi)
    return dtv, tl.where(inside, dsp, 0.0)


@triton.jit
def _dt_of_raw(raw, bias, mrow, dt_lo, dt_hi, SOFTPLUS: tl.constexpr):
    dtv, dgrad = _process_dt(raw, bias, dt_lo, dt_hi, SOFTPLUS)
    # padding rows contribute nothing, whatever bias/softplus would make of them
    return tl.where(mrow, dtv, 0.0), tl.where(mrow, dgrad, 0.0)


@triton.jit
def _load_dt(dt_ptr, bias, rows, mrow, H, dt_lo, dt_hi, SOFTPLUS: tl.constexpr, COMPUTE: tl.constexpr):
    return _dt_of_raw(tl.load(dt_ptr + rows * H, mask=mrow, other=0.0).to(COMPUTE), bias, mrow, dt_lo, dt_hi, SOFTPLUS)


@triton.jit
def _head_coords(pid_bh, H, G):
    """(head, group, batch as int64) of a program over batch * head (heads of a group are consecutive)."""
    hidx = pid_bh % H
    return hidx, hidx // (H // G), (pid_bh // H).to(tl.int64)


@triton.jit
def _tile_offsets(pid_p, P, N, BLOCK_Q: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    """Offsets of a chunk's rows, of the program's headdim block pid_p and of d_state, and the masks of the last two."""
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    return tl.arange(0, BLOCK_Q), offs_p, offs_n, offs_p < P, offs_n < N


@triton.jit
def _head_params(A_ptr, bias_ptr, hidx, HAS_BIAS: tl.constexpr, COMPUTE: tl.constexpr):
    """A of the head as loaded, A clamped to <= 0, and dt_bias of the head (0 without one)."""
    A_raw = tl.load(A_ptr + hidx).to(COMPUTE)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + hidx).to(COMPUTE)
    else:
        bias = 0.0
    return A_raw, tl.minimum(A_raw, 0.0), bias


@triton.jit
def _chunk_rows(c, offs_q, offs_p, offs_n, mask_p, mask_n, L, xstride, bstride, BLOCK_Q: tl.constexpr):
    """Rows of chunk c, their mask, and the masks and offsets of its (row, headdim) and (row, d_state) tiles."""
    rows = c * BLOCK_Q + offs_q
    mrow = rows < L
    m_xp = mrow[:, None] & mask_p[None, :]
    m_bn = mrow[:, None] & mask_n[None, :]
    return rows, mrow, m_xp, m_bn, rows[:, None] * xstride + offs_p[None, :], rows[:, None] * bstride + offs_n[None, :]


@triton.jit
def _last(v, offs_q, BLOCK_Q: tl.constexpr):
    return tl.sum(tl.where(offs_q == BLOCK_Q - 1, v, 0.0), 0)


# Floor of one step's log-decay dt * A (see reference.LOG_DECAY_FLOOR; the chunked PyTorch op has it too).
# Without it, steps of dt A ~ -1e4 make the in-chunk cumsums ~ -6e5, whose fp32 spacing (0.06) shows up as 6 %
# errors in the decays of nearby small steps, and pass C multiplies by A the rounding noise of the telescoped
# log-decay gradient at such a step (whose true value is 0 in fp32).
LOG_DECAY_FLOOR = tl.constexpr(_LOG_DECAY_FLOOR)
# headdim x d_state up to which the backward's segment kernel loads every input of a chunk one chunk ahead
# (tuning.bwd_ahead_bits); above it, a launch of the segment kernel's anti-causal direction alone loads its dB rows
# late (LATE_DB)
AHEAD_MAX_TILE = tl.constexpr(32 * 32)


@triton.jit
def _chunk_decay(dt_ptr, bias, A_h, rows, mrow, offs_q, H, dt_lo, dt_hi, SOFTPLUS: tl.constexpr,
                 COMPUTE: tl.constexpr, BLOCK_Q: tl.constexpr):
    return _decay_of_raw(tl.load(dt_ptr + rows * H, mask=mrow, other=0.0).to(COMPUTE), bias, A_h, mrow, offs_q, dt_lo,
                         dt_hi, SOFTPLUS, BLOCK_Q)


@triton.jit
def _decay_of_raw(raw, bias, A_h, mrow, offs_q, dt_lo, dt_hi, SOFTPLUS: tl.constexpr, BLOCK_Q: tl.constexpr):
    """One chunk's processed dt (from dt as stored), log-decays a = max(dt A, LOG_DECAY_FLOOR), their inclusive cumsum cs, its last
    value, and the inclusive reverse cumsum tail (tail[s] = sum_{k >= s} a_k). Decays to the chunk's end are taken
    from tail, not from last - cs: that difference of two large sums loses the small ones (its rounding is the spacing
    of |cs|), and the two sides of a pair across chunks would then disagree by more than the pair's own rounding."""
    dtv, _unused = _dt_of_raw(raw, bias, mrow, dt_lo, dt_hi, SOFTPLUS)
    a = tl.maximum(dtv * A_h, LOG_DECAY_FLOOR)
    cs = tl.cumsum(a, 0)
    return dtv, a, cs, _last(cs, offs_q, BLOCK_Q), tl.cumsum(a, 0, reverse=True)


@triton.jit
def _pair_decay(cs, a, tt, ss):
    """Decays of the in-chunk pairs of both directions in one tile, for SHARE (both directions with the same dt, B,
    C and no shift): below the diagonal the causal pair (t > s: steps s+1..t, cs_t - cs_s), above it the anti-causal
    pair (t < s: steps t..s-1, csx_s - csx_t with csx = cs - a), and 2 on the diagonal (each direction's s = t term).
    One exp of a tile whose entries are all <= 0 (up to rounding). Then CB * decay holds the in-chunk part of both
    directions' mixing matrices, and every product with it does both directions at the cost of one."""
    csx = cs - a
    expo = tl.where(tt >= ss, cs[:, None] - cs[None, :], csx[None, :] - csx[:, None])
    return tl.exp(expo) + tl.where(tt == ss, 1.0, 0.0)


@triton.jit
def _entry_state(st_ptr, pid_bh, seg, nseg, tile, m_st, SIDE: tl.constexpr, N: tl.constexpr, P: tl.constexpr):
    """The state segment seg enters with, from st (b * h, 2, nseg - 1, N, P): the states at the nseg - 1 boundaries
    between segments (boundary k between segments k and k + 1), slot 0 those of forward walks (what comes from the
    left), slot 1 those of reverse walks (what comes from the right). SIDE 0: from the left, boundary seg - 1, zero
    for the first segment; SIDE 1: from the right, boundary seg, zero for the last. A one-segment call reads nothing
    (st is then a stand-in)."""
    nb = nseg - 1
    if SIDE == 0:
        k = seg - 1
        inside = seg > 0
    else:
        k = seg
        inside = seg < nb
    k = tl.maximum(tl.minimum(k, nb - 1), 0)  # an address inside st (or at its start) even where nothing is read
    off = ((pid_bh.to(tl.int64) * 2 + SIDE) * nb + k) * (N * P)
    return tl.load(st_ptr + off + tile, mask=m_st & inside, other=0.0)


@triton.jit
def _store_sum(ptrs, old, v, mask):
    """ptrs[...] = old + v, where old was loaded from ptrs (rows that no other program of the launch touches)."""
    tl.store(ptrs, (old.to(v.dtype) + v).to(ptrs.dtype.element_ty), mask=mask)


@triton.jit
def _add_rows(ptrs, v, mask):
    """ptrs[...] += v (a read-add-write of rows that no other program of the launch touches)."""
    _store_sum(ptrs, tl.load(ptrs, mask=mask, other=0.0), v, mask)


@triton.jit
def _shifted_rows(ptr, rows, mrow, offs, mask, L, stride, SHIFT: tl.constexpr):
    """A tile of rows + SHIFT (columns offs of a row-major tensor with ``stride`` elements per row) as stored: zero
    where mrow is false, outside [0, L) and outside the column mask. The C rows of Hydra's shift (_load_c), the
    gradient dz of a direction's unshifted output (_dz_tile) and the state walk's read-out rows."""
    r = rows + SHIFT
    m = (mrow & (r >= 0) & (r < L))[:, None] & mask[None, :]
    return tl.load(ptr + r[:, None] * stride + offs[None, :], mask=m, other=0.0)
