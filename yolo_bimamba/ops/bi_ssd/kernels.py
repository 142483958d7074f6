"""Fused Triton kernels of the bidirectional SSD (Bi-Mamba2 / Hydra), forward and backward.

Layout: x, y, dy, dx (b, l, h, p) contiguous; dt (b, l, h); B, C (b, l, g, n); A, dt_bias (h,);
D (h,) or (h, p). The sequence is walked in tiles of BLOCK_Q rows ("chunks"); BLOCK_Q is a
tuning parameter only: the result does not depend on it (up to rounding).

Segments: the sequence is cut into segments of SEG rows (a whole number of chunks of every config; chosen by
triton_op.segment_rows for about 2 programs per SM) that run in parallel. The state kernel
(_bi_ssd_state_kernel, one program per (batch * head, headdim block, state kind)) walks the chunks once and
stores the states at the segment boundaries: S_f, S_b in the forward, which the backward reuses (when a gradient
is wanted, the forward computes them at the backward's precision, DOT_ST), and the state gradients dS_b, dS_f in the
backward. With one segment no state kernel runs and the segment kernels start from zeros.

Forward, two kernels: _bi_ssd_fwd_kernel, one program per (batch * head, block of headdim, segment), does the
state terms (pairs across chunks) and D x. It walks its chunks forward (causal pass) with the state S (d_state x
headdim, fp32) on chip, entered with the boundary state, and writes y, then walks them backward (anti-causal pass)
with its own state, reads y back and adds (up to d_state 64 it loads each chunk's dt, x and C one chunk ahead, and
reads y back before the chunk's products: AHEAD). _bi_ssd_fwd_pairs_kernel, one program per (batch * head, block of
headdim, chunk), then adds the pairs inside each chunk (no state: all chunks in parallel; in the chunks and headdim
blocks of the forward kernel's config); from d_state 128 a program walks a block of a group's heads with the chunk's
C B^T computed once (GROUPED). The reverse direction is index arithmetic; there is no flip or copy of any
tensor. Hydra's shift (shift=True) is an offset of the C rows that are loaded (C[t-1] for the causal, C_bwd[t+1] for
the anti-causal direction) and a strict mask.

Backward, three kernels (and the state kernel):
  _bi_ssd_bwd_kernel, the state terms (pairs across chunks), one program per (batch * head, segment) with the
    whole headdim, two passes over its chunks:
    A (reverse walk): causal state gradient dS_f, anti-causal state S_b -> their dx, dB_f, dC_b terms;
    B (forward walk): causal state S_f, anti-causal state gradient dS_b -> their dC_f, dx, dB_b terms;
    and their per-position log-decay gradient terms into a small fp32 scratch (b*h, 6, L) in which each direction
    owns its slots (terms that pass C telescopes over the sequence). Global-load latency was most of its stalls on an
    H200, so each pass loads a chunk's inputs one chunk ahead of their use (dt always; the others as
    triton_op.bwd_ahead_bits says: all of them up to headdim x d_state = 32 x 32, B, C and dz up to 64 x 64, dz alone
    above, where more tiles held ahead spill on sm_90), and pass B loads the rows it
    adds to at the start of the chunk, before its dots (except the dB rows of a launch of the anti-causal direction
    alone above 32 x 32 tiles, LATE_DB; a first launch without anti-causal dC terms writes its dC in pass B alone,
    FRESH_C). "both" runs as two launches of this kernel,
    one per direction (DO_F / DO_B), the second adding to the first's dx (and dB, dC when the directions share
    them, ACC=True), or as one (triton_op._split_directions); the sum stays ordered, so results are bitwise
    reproducible. dD comes from per-(batch, head, segment) partials of the first launch.
  _bi_ssd_bwd_pairs_kernel, the pairs inside a chunk, one program per (batch * group, chunk), walking the group's
    heads: no state, so all chunks run in parallel. It loads the rows a head adds to before the head's products
    (AHEAD bit 2; bit 1, each head's inputs one head ahead, is there but not the default). The in-chunk pair tiles
    were most of the registers of the one backward kernel there was before (255 and spills on sm_90 at headdim =
    d_state = 32; apart, neither kernel spills). It adds its terms to dx and the scratch, writes the in-chunk pairs'
    share of the log-decay gradients as finished per-position values (a local telescoping of one pair tile's row and
    column sums), and stores dB, dC:
    with ngroups < nheads the segment kernel writes them per head (in the dtype of dx: bf16 for bf16 inputs) and
    this kernel sums them over each group's heads, in head order, in fp32, with C B^T computed once per group. The
    in-chunk pairs' own dB, dC terms are products of a pair tile with the group's C and B, so the heads' pair tiles
    are summed and multiplied once per group, not once per head. It must cut the sequence into the chunks of the
    segment kernel (its BLOCK_Q).
  _bi_ssd_bwd_dt_kernel (pass C, per (batch * head)) reverse-sums the scratch -> ddt, and per-(batch, head) partial
    sums of dA, d(dt_bias).
  _bi_ssd_grad_sums_kernel (per head) sums those partials and the segment kernel's dD partials over the batch (and
    the segments) in a fixed order: dA, d(dt_bias), dD in the dtypes of A, dt_bias, D.
With shift=True the backward works in the unshifted frame: y_f[t] = z_f[t-1] and y_b[t] = z_b[t+1], so the output
gradient of each direction is dy loaded at offset +1 / -1.

Both directions for the price of about one (SHARE, BiMamba2 mode: the same dt, B, C in both directions, no shift):
the in-chunk pairs of the two directions use the same C B^T and dz x^T tiles and differ only in their decays, which
sit on opposite sides of the diagonal. One tile holds both (_pair_decay), so every in-chunk product (C B^T . decay)
x in the forward, and (C B^T . decay)^T dz, (dz x^T . decay)^T C, (dz x^T . decay . dt) B in the backward, does both
directions at the cost of one. The causal direction's code does them; the anti-causal direction's code keeps only
its state terms (pairs across chunks), and in one backward launch it reuses the causal direction's loads.

Dot precision: the backward's per-position log-decay gradients (-> ddt, dA, d dt_bias) are differences of
large, nearly equal sums, so the dots that update or read a state need about fp32 accuracy; the others need only
the accuracy of the outputs they feed. Each dot takes its precision from a constexpr (DOT_ST, DOT_RD, DOT_MID, DOT_IN,
DOT_LO: see triton_op._dot_precisions for what each class feeds and the policy per input dtype) through :func:`_dot`,
which adds bf16 and split-bf16 modes to tl.dot's input precisions; a state update S <- decay S + V^T R passes
decay S as the MMA's accumulator (:func:`_dot_acc`), so the product and the state are not two tiles in registers at
once (at headdim 64 x d_state 128 that was most of the backward segment kernel's spills on sm_90). The forward keeps Triton's default (tf32; "ieee"
for fp64): bf16 dots there gave a wrong y and an illegal memory access on an H200 (Triton 3.6) with the
(BLOCK_Q 64, BLOCK_P 32, 4 warps) config, and they saved only 0.03 ms at b16 L1600 h8.

Every exponent is a masked (masked before exp) difference of non-positive log-decay sums, so it
is <= 0 (up to rounding) and no inf * 0 can appear. Rows >= L load dt = x = B = C = 0.
No atomics: every output element is written by exactly one program per launch, so results are bitwise
reproducible.
"""
from __future__ import annotations

import os

import triton
import triton.language as tl

from .reference import LOG_DECAY_FLOOR as _LOG_DECAY_FLOOR

# ---------------------------------------------------------------------------------------------
# Configurations. Every config must give the same result; tests force each one in turn.
# ---------------------------------------------------------------------------------------------
# (BLOCK_Q, BLOCK_P, num_warps) of the forward and of the state kernel. BLOCK_Q 128 forward tiles were dropped:
# slower than (64, 64, 4) on an H200 at the detection shapes, and they would force segments of 128 rows.
_QP_TILES = [(32, 32, 2), (64, 32, 4), (64, 64, 4)]


def _qp_configs(tiles, stages=1):
    return [triton.Config({"BLOCK_Q": bq, "BLOCK_P": bp}, num_warps=nw, num_stages=stages) for bq, bp, nw in tiles]


FWD_CONFIGS = _qp_configs(_QP_TILES)
BWD_CONFIGS = [
    triton.Config({"BLOCK_Q": bq}, num_warps=nw, num_stages=ns)
    # BLOCK_Q = 128 needs > 227 KB of shared memory at headdim = d_state = 64 on sm_90; (64, 8 warps) was the
    # slowest on an H200 at every benchmarked shape and is not offered. Two pipeline stages (loads of the next chunk
    # issued during this one): 12 % faster than one at headdim = d_state = 32 on an H200, 26 % slower at 64; three
    # stages and BLOCK_Q 16 (still 255 registers, sm_90 compile) were slower (benchmarks/results, eighth session)
    for bq, nw, ns in [
        (32, 4, 1),
        (32, 8, 1),
        (64, 4, 1),
        (32, 4, 2),
    ]
]


# the in-chunk pairs kernels (one chunk per program): warps only, BLOCK_Q is the segment kernel's (the same chunks).
# The backward's in chunks of 32 rows: 2 warps were the fastest on an H200 at every profiled shape (b32 L1600 h8 p32
# n32: 0.188 ms, 4 warps 0.310, 8 warps 0.826; b16 L1600 h8 p64 n64: 0.159 / 0.176 / 0.238:
# benchmarks/results/session10); in chunks of 64, and the forward's, see triton_op.DEFAULT_PAIRS_Q64 and DEFAULT_CONFIGS
PAIRS_CONFIGS = [triton.Config({}, num_warps=nw) for nw in (2, 4, 8)]


# the chunk-boundary state walk (one state kind per program, one block of headdim): the forward's tiles, and the
# largest with two pipeline stages (0.121 vs 0.146 ms at b16 L1600 h8 p64 n64 on an H200; two stages made the
# forward kernel slower, up to 1.8x at the LM shape, so it keeps one)
STATE_CONFIGS = _qp_configs(_QP_TILES) + _qp_configs(_QP_TILES[2:], 2)
# segments are a whole number of chunks of every kernel and config (the BLOCK_Qs are powers of two)
SEG_MULTIPLE = max(c.kwargs["BLOCK_Q"] for c in FWD_CONFIGS + BWD_CONFIGS + STATE_CONFIGS)
assert all(SEG_MULTIPLE % c.kwargs["BLOCK_Q"] == 0 for c in FWD_CONFIGS + BWD_CONFIGS + STATE_CONFIGS)
# rows per program of the last backward pass (per-position scalars only)
PASS_C_ROWS = 128


def bwd_config_fits(cfg, P, N) -> bool:
    """Shared-memory rule measured with triton.compile for sm_90 (limit 227 KB): the backward at
    BLOCK_Q = 64 needs 132 KB at headdim = d_state = 64 but 328 KB at 128; BLOCK_Q = 32 needs
    115 KB at 128."""
    return cfg.kwargs["BLOCK_Q"] <= 32 or max(P, N) <= 64


def prune_bwd_configs(configs, named_args, **kwargs):
    P = kwargs.get("P", named_args.get("P"))
    N = kwargs.get("N", named_args.get("N"))
    kept = [c for c in configs if bwd_config_fits(c, P, N)]
    return kept or configs[:1]


# the Triton interpreter miscomputes bf16 (numpy has no bf16): there, a "bf16" dot rounds its fp32 operands to bf16
# values (round to nearest even, on the bits) and multiplies them in fp32, which is what a bf16 tensor-core dot with
# fp32 accumulation computes
_EMULATE_BF16 = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"))


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
    inside = (sp > dt_lo) & (sp < dt_hi)  # gradient 0 at the bounds, as ops.reference.clamp_ste
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


# Floor of one step's log-decay dt * A (see ops.reference.LOG_DECAY_FLOOR; the chunked PyTorch op has it too).
# Without it, steps of dt A ~ -1e4 make the in-chunk cumsums ~ -6e5, whose fp32 spacing (0.06) shows up as 6 %
# errors in the decays of nearby small steps, and pass C multiplies by A the rounding noise of the telescoped
# log-decay gradient at such a step (whose true value is 0 in fp32).
LOG_DECAY_FLOOR = tl.constexpr(_LOG_DECAY_FLOOR)
# headdim x d_state up to which the backward's segment kernel loads every input of a chunk one chunk ahead
# (triton_op.bwd_ahead_bits); above it, a launch of the segment kernel's anti-causal direction alone loads its dB rows
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
      GROUPED=False (HEADS = 1): the head's x, dt, B, C loaded together, then the products (y loaded with them was
        slower on an H200: 0.060 against 0.054 ms at b16 L1600 h8 p64 n64, one direction; benchmarks/results/session26);
      GROUPED=True: C B^T, the same for every head of a group, computed once; the program walks its heads, loading
        each head's x, y and dt one head ahead of their use (the first head's with B and C), so that no load waits on
        the product before it. Its registers (255 on sm_90 at 64 x 64 tiles, against 168) cost more than the products
        it saves at d_state 64 and below (triton_op.fwd_pairs_heads says where it runs).
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


@triton.jit
def _store_sum(ptrs, old, v, mask):
    """ptrs[...] = old + v, where old was loaded from ptrs (rows that no other program of the launch touches)."""
    tl.store(ptrs, (old.to(v.dtype) + v).to(ptrs.dtype.element_ty), mask=mask)


@triton.jit
def _add_rows(ptrs, v, mask):
    """ptrs[...] += v (a read-add-write of rows that no other program of the launch touches)."""
    _store_sum(ptrs, tl.load(ptrs, mask=mask, other=0.0), v, mask)


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
def _shifted_rows(ptr, rows, mrow, offs, mask, L, stride, SHIFT: tl.constexpr):
    """A tile of rows + SHIFT (columns offs of a row-major tensor with ``stride`` elements per row) as stored: zero
    where mrow is false, outside [0, L) and outside the column mask. The C rows of Hydra's shift (_load_c), the
    gradient dz of a direction's unshifted output (_dz_tile) and the state walk's read-out rows."""
    r = rows + SHIFT
    m = (mrow & (r >= 0) & (r < L))[:, None] & mask[None, :]
    return tl.load(ptr + r[:, None] * stride + offs[None, :], mask=m, other=0.0)


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
    # a chunk's dt is loaded one chunk ahead of its use in both passes, and its other inputs as AHEAD says (where they
    # were used, their loads were a third of the kernel's stalls on an H200: dt first, which every other input waits on
    # through the decays)
    OWN_B: tl.constexpr = DO_B and not (SHARE and DO_F)  # the anti-causal direction loads its own dt, B, C, dz
    X_AHEAD: tl.constexpr = AHEAD >= 4
    # pass A has no dC terms of its own when the anti-causal direction does not run here or keeps its dC apart
    # (SEPARATE): then, in a first launch, pass B writes the causal dC rows alone (pass A stored zeros, pass B read them
    # back and added: at the LM shape's per-head rows, 2 x 0.5 GB of memory traffic for nothing)
    FRESH_C: tl.constexpr = DO_F and (SEPARATE or not DO_B) and (not ACC) and (not ORDERED)
    # a launch of the anti-causal direction alone, above the tiles loaded ahead, loads the dB rows it adds to in pass B
    # where it adds them: held through the chunk's dots they were most of its spills at headdim 64 x d_state 128 on
    # sm_90 (74 spill loads and stores per chunk, 18 after); with both directions in one launch there was nothing to
    # spill and the early load stays (loaded late, the H200 took 3 % longer at b16 L1600 h8 p64 n64)
    LATE_DB: tl.constexpr = (not DO_F) and (BLOCK_P * BLOCK_N > AHEAD_MAX_TILE)
    rows_n = (c1 - 1) * BLOCK_Q + offs_q
    x_n = _x_ahead(x_ptr + xo, rows_n, offs_p, mask_p, L, xstride, X_AHEAD)
    if DO_F:
        f_dt, f_B, f_C, f_dz = _ahead_in(dt_ptr + dto, B_ptr + bco, C_ptr + bco, dy_ptr + xo, rows_n, offs_p, mask_p,
                                         offs_n, mask_n, L, H, xstride, bstride, SH_F, AHEAD)
    if OWN_B:
        b_dt, b_B, b_C, b_dz = _ahead_in(dtb_ptr + dto, Bb_ptr + bco, Cb_ptr + bco, dy_ptr + xo, rows_n, offs_p, mask_p,
                                         offs_n, mask_n, L, H, xstride, bstride, SH_B, AHEAD)
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
            dtf, af, csf, lastf, tailf, Bf, Cf, dzf = _dir_in(
                f_dt, f_B, f_C, f_dz, B_ptr + bco, C_ptr + bco, dy_ptr + xo, bias, A_h, rows, mrow, offs_q, offs_p,
                mask_p, m_bn, bn_off, L, xstride, dt_lo, dt_hi, SH_F, SOFTPLUS, COMPUTE, BLOCK_Q, AHEAD)
            f_dt, f_B, f_C, f_dz = _ahead_in(dt_ptr + dto, B_ptr + bco, C_ptr + bco, dy_ptr + xo, rows_n, offs_p,
                                             mask_p, offs_n, mask_n, L, H, xstride, bstride, SH_F, AHEAD)
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
        if DO_B:
            if OWN_B:
                dtb, ab, csb, lastb, tailb, Bbv, Cbv, dzb = _dir_in(
                    b_dt, b_B, b_C, b_dz, Bb_ptr + bco, Cb_ptr + bco, dy_ptr + xo, bias, A_h, rows, mrow, offs_q,
                    offs_p, mask_p, m_bn, bn_off, L, xstride, dt_lo, dt_hi, SH_B, SOFTPLUS, COMPUTE, BLOCK_Q, AHEAD)
                b_dt, b_B, b_C, b_dz = _ahead_in(dtb_ptr + dto, Bb_ptr + bco, Cb_ptr + bco, dy_ptr + xo, rows_n,
                                                 offs_p, mask_p, offs_n, mask_n, L, H, xstride, bstride, SH_B, AHEAD)
            else:  # the causal direction's dt, decays, B, C and dz above are this direction's too (SHARE)
                dtb, ab, csb, lastb, tailb, Bbv, Cbv, dzb = dtf, af, csf, lastf, tailf, Bf, Cf, dzf
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
    x_n = _x_ahead(x_ptr + xo, rows_n, offs_p, mask_p, L, xstride, X_AHEAD)
    if DO_F:
        f_dt, f_B, f_C, f_dz = _ahead_in(dt_ptr + dto, B_ptr + bco, C_ptr + bco, dy_ptr + xo, rows_n, offs_p, mask_p,
                                         offs_n, mask_n, L, H, xstride, bstride, SH_F, AHEAD)
    if OWN_B:
        b_dt, b_B, b_C, b_dz = _ahead_in(dtb_ptr + dto, Bb_ptr + bco, Cb_ptr + bco, dy_ptr + xo, rows_n, offs_p, mask_p,
                                         offs_n, mask_n, L, H, xstride, bstride, SH_B, AHEAD)
    for c in range(c0, c1):
        rows, mrow, m_xp, m_bn, xy_off, bn_off = _chunk_rows(c, offs_q, offs_p, offs_n, mask_p, mask_n, L, xstride, bstride, BLOCK_Q)
        rows_n = rows + BLOCK_Q
        xv = _x_in(x_n, x_ptr + xo, xy_off, m_xp, COMPUTE, X_AHEAD)
        x_n = _x_ahead(x_ptr + xo, rows_n, offs_p, mask_p, L, xstride, X_AHEAD)
        g_off = go + rows[:, None] * gstride + offs_n[None, :]
        # the rows this pass adds to (written by pass A or by an earlier launch) are loaded before the chunk's dots,
        # which hide the loads' latency (loaded where they are added, they were a fifth of the kernel's stalls on an
        # H200); a scratch slot 3 row is always minus the slot 2 row, so only slot 2 is read
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
            dtf, af, csf, lastf, tailf, Bf, Cf, dzf = _dir_in(
                f_dt, f_B, f_C, f_dz, B_ptr + bco, C_ptr + bco, dy_ptr + xo, bias, A_h, rows, mrow, offs_q, offs_p,
                mask_p, m_bn, bn_off, L, xstride, dt_lo, dt_hi, SH_F, SOFTPLUS, COMPUTE, BLOCK_Q, AHEAD)
            f_dt, f_B, f_C, f_dz = _ahead_in(dt_ptr + dto, B_ptr + bco, C_ptr + bco, dy_ptr + xo, rows_n, offs_p,
                                             mask_p, offs_n, mask_n, L, H, xstride, bstride, SH_F, AHEAD)
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
        if DO_B:
            if OWN_B:
                dtb, ab, csb, lastb, tailb, Bbv, Cbv, dzb = _dir_in(
                    b_dt, b_B, b_C, b_dz, Bb_ptr + bco, Cb_ptr + bco, dy_ptr + xo, bias, A_h, rows, mrow, offs_q,
                    offs_p, mask_p, m_bn, bn_off, L, xstride, dt_lo, dt_hi, SH_B, SOFTPLUS, COMPUTE, BLOCK_Q, AHEAD)
                b_dt, b_B, b_C, b_dz = _ahead_in(dtb_ptr + dto, Bb_ptr + bco, Cb_ptr + bco, dy_ptr + xo, rows_n,
                                                 offs_p, mask_p, offs_n, mask_n, L, H, xstride, bstride, SH_B, AHEAD)
            else:  # as in pass A
                dtb, ab, csb, lastb, tailb, Bbv, Cbv, dzb = dtf, af, csf, lastf, tailf, Bf, Cf, dzf
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
    added to the product of another layout, each part cost a trip through shared memory, one after the other (a
    fifth of the pairs kernel's stall samples on an H200, benchmarks/results/session27); two parts' loads are issued
    together."""
    acc = tl.load(ptrs, mask=mask, other=0.0).to(COMPUTE)
    for j in range(1, n_parts, 2):
        two = j + 1 < n_parts
        a = tl.load(ptrs + j * stride, mask=mask, other=0.0)
        b = tl.load(ptrs + (j + 1) * stride, mask=mask & two, other=0.0)
        acc += a.to(COMPUTE)
        acc = tl.where(two, acc + b.to(COMPUTE), acc)
    return acc


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
    dA_tot = tl.where(A_raw < 0.0, tl.sum(dA_vec, 0), 0.0)  # as ops.reference.clamp_A
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
    reduction of the block), the same in every run; the results are stored in the dtypes of the outputs. One launch
    instead of the torch reductions it replaces (a strided one of them took 0.011 ms of an H100's time at b16 L1600 h8)."""
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
