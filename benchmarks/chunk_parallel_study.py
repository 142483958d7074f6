"""Design study: the forward of the bidirectional SSD with every chunk in parallel, against the op's segment walk.

The op's kernels walk the chunks of a segment one after another with the state on chip (2 programs of 4 warps per
SM, latency-bound: benchmarks/results/README.md). Mamba2's own kernels cut the same work the other way: every chunk's
state contribution in parallel, a short sequential pass over the chunk states (element-wise, no dots), then every
chunk's outputs in parallel. This script builds that structure for the forward (BiMamba2 mode: the same dt, B, C in
both directions, no shift; D per head, dt_bias, softplus), from the op's own jit helpers, in three launches:

  _cp_state_kernel   program (batch * head, chunk): the chunk's own state terms, (w B)^T x for each direction, and
                     the chunk's total log-decay, summed over sub-blocks of 64 rows (Mamba2's chunks of 256 too);
  _cp_pass_kernel    program (batch * head * direction, block of the state): walks the chunks and replaces each
                     chunk's own terms by the state entering it (from the left for the causal direction, from the
                     right for the anti-causal one): S <- exp(last) S + own;
  _cp_out_kernel     program (batch * head, chunk, sub-block of 64 rows): y of those rows = the entering states read
                     out by C, the in-chunk pairs of both directions in one tile per source sub-block (as
                     triton_kernels._pair_decay) and D x.

The per-chunk states (batch * head, directions, chunks, d_state, headdim) in fp32 are the intermediate the op avoids.
The study measures what the structure would buy before the op's kernels are rebuilt on it:

    python benchmarks/chunk_parallel_study.py [--shapes b16_L1600_h8,lm_b8_L8192_h32] [--out FILE.json]   # GPU

times the forward of both directions and of one (CUDA-graph replay, median) and its peak memory, for this structure
(chunks of 64, 128 and 256 rows) and for the op (``bi_ssd(..., backend="triton")``, forward under no_grad), side by
side in one run; ``--kernels`` adds each kernel's CUDA time. tests/test_chunk_parallel_study.py checks the study's
kernels against the PyTorch op under the interpreter.

Result on an H200 (benchmarks/results/README.md, session 22): 1.3-3.4x the op's forward time and up to 9x its memory
at every benchmark shape and chunk size; small chunks pay for moving the chunk states, large ones for the in-chunk
products.
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_kernels import SHAPES, _enter_package_without_glue, make_inputs, peak_memory, time_graph  # noqa: E402

_enter_package_without_glue()
from yolo_bimamba.ops import bi_ssd  # noqa: E402
from yolo_bimamba.ops.triton_kernels import (  # noqa: E402
    _chunk_decay, _head_coords, _head_params,
)
from yolo_bimamba.ops.validate import kernel_tile  # noqa: E402

BLOCK_Q = 64


@triton.jit
def _cp_block(dt_ptr, x_ptr, B_ptr, bias, A_h, c, k, L, H, G, hidx, gidx, b64,
              P: tl.constexpr, N: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
              SOFTPLUS: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr):
    """Sub-block k (BLOCK_K rows) of chunk c: processed dt, log-decays, their cumsum inside the sub-block, x and B,
    and the offsets and masks of its (row, headdim) and (row, d_state) tiles."""
    offs = tl.arange(0, BLOCK_K)
    rows = c * BLOCK_Q + k * BLOCK_K + offs
    mrow = rows < L
    dtv, a, cs, _last, _tail = _chunk_decay(dt_ptr + b64 * L * H + hidx, bias, A_h, rows, mrow, offs, H, 0.0,
                                            float("inf"), SOFTPLUS, tl.float32, BLOCK_K)
    offs_p = tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    xy = b64 * L * H * P + hidx * P + rows[:, None] * (H * P) + offs_p[None, :]
    bn = b64 * L * G * N + gidx * N + rows[:, None] * (G * N) + offs_n[None, :]
    m_xp = mrow[:, None] & (offs_p < P)[None, :]
    m_bn = mrow[:, None] & (offs_n < N)[None, :]
    xv = tl.load(x_ptr + xy, mask=m_xp, other=0.0).to(tl.float32)
    Bv = tl.load(B_ptr + bn, mask=m_bn, other=0.0).to(tl.float32)
    return dtv, a, cs, xv, Bv, xy, m_xp, bn, m_bn


@triton.jit
def _cp_chunk_sums(dt_ptr, bias, A_h, c, m, L, H, hidx, b64, SOFTPLUS: tl.constexpr, BLOCK_Q: tl.constexpr,
                   BLOCK_K: tl.constexpr):
    """(sum of the log-decays of chunk c's sub-blocks before sub-block m, sum over the whole chunk)."""
    offs = tl.arange(0, BLOCK_K)
    before = 0.0
    total = 0.0
    for k in range(0, BLOCK_Q // BLOCK_K):
        rows = c * BLOCK_Q + k * BLOCK_K + offs
        mrow = rows < L
        _dt, a, _cs, last, _tail = _chunk_decay(dt_ptr + b64 * L * H + hidx, bias, A_h, rows, mrow, offs, H, 0.0,
                                                float("inf"), SOFTPLUS, tl.float32, BLOCK_K)
        before += tl.where(k < m, last, 0.0)
        total += last
    return before, total


@triton.jit
def _cp_state_kernel(x_ptr, dt_ptr, A_ptr, B_ptr, bias_ptr, st_ptr, dec_ptr, L, H, G, NCH,
                     P: tl.constexpr, N: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
                     DIRS: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, BLOCK_Q: tl.constexpr,
                     BLOCK_K: tl.constexpr):
    pid_bh = tl.program_id(0)
    c = tl.program_id(1)
    hidx, gidx, b64 = _head_coords(pid_bh, H, G)
    _A_raw, A_h, bias = _head_params(A_ptr, bias_ptr, hidx, HAS_BIAS, tl.float32)
    _before, total = _cp_chunk_sums(dt_ptr, bias, A_h, c, 0, L, H, hidx, b64, SOFTPLUS, BLOCK_Q, BLOCK_K)
    own_f = tl.zeros((BLOCK_N, BLOCK_P), dtype=tl.float32)
    own_b = tl.zeros((BLOCK_N, BLOCK_P), dtype=tl.float32)
    offset = 0.0
    for k in range(0, BLOCK_Q // BLOCK_K):
        dtv, a, cs, xv, Bv, _xy, _mxp, _bn, _mbn = _cp_block(dt_ptr, x_ptr, B_ptr, bias, A_h, c, k, L, H, G, hidx,
                                                             gidx, b64, P, N, BLOCK_P, BLOCK_N, SOFTPLUS, BLOCK_Q,
                                                             BLOCK_K)
        cs = cs + offset
        # causal: from row s to the chunk's end (steps s+1..); anti-causal: from the chunk's start to s (steps ..s-1)
        own_f += tl.dot(tl.trans(Bv * (tl.exp(total - cs) * dtv)[:, None]), xv)
        if DIRS == 2:
            own_b += tl.dot(tl.trans(Bv * (tl.exp(cs - a) * dtv)[:, None]), xv)
        offset += tl.sum(a, 0)
    offs_p = tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    tile = offs_n[:, None] * P + offs_p[None, :]
    m_st = (offs_n < N)[:, None] & (offs_p < P)[None, :]
    base = (pid_bh.to(tl.int64) * DIRS * NCH + c) * (N * P)
    tl.store(st_ptr + base + tile, own_f, mask=m_st)
    if DIRS == 2:
        tl.store(st_ptr + base + NCH * (N * P) + tile, own_b, mask=m_st)
    tl.store(dec_ptr + pid_bh.to(tl.int64) * NCH + c, total)


@triton.jit
def _cp_pass_kernel(st_ptr, dec_ptr, NCH, NP: tl.constexpr, DIRS: tl.constexpr, BLOCK_E: tl.constexpr):
    pid = tl.program_id(0)
    blk = tl.program_id(1)
    bh = pid // DIRS
    d = pid % DIRS
    offs = blk * BLOCK_E + tl.arange(0, BLOCK_E)
    m = offs < NP
    base = st_ptr + (bh.to(tl.int64) * DIRS + d) * NCH * NP + offs
    S = tl.zeros((BLOCK_E,), dtype=tl.float32)
    for i in range(0, NCH):
        c = tl.where(d == 0, i, NCH - 1 - i)
        own = tl.load(base + c * NP, mask=m, other=0.0)
        tl.store(base + c * NP, S, mask=m)
        S = tl.exp(tl.load(dec_ptr + bh.to(tl.int64) * NCH + c)) * S + own


@triton.jit
def _cp_out_kernel(x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, bias_ptr, st_ptr, y_ptr, L, H, G, NCH,
                   P: tl.constexpr, N: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
                   DIRS: tl.constexpr, HAS_D: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
                   BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr):
    """Program (batch * head, chunk, sub-block m of BLOCK_K rows): y of those rows."""
    pid_bh = tl.program_id(0)
    c = tl.program_id(1)
    m = tl.program_id(2)
    hidx, gidx, b64 = _head_coords(pid_bh, H, G)
    _A_raw, A_h, bias = _head_params(A_ptr, bias_ptr, hidx, HAS_BIAS, tl.float32)
    before, total = _cp_chunk_sums(dt_ptr, bias, A_h, c, m, L, H, hidx, b64, SOFTPLUS, BLOCK_Q, BLOCK_K)
    dtv, a, cs, xv, _Bv, xy, m_xp, bn, m_bn = _cp_block(dt_ptr, x_ptr, B_ptr, bias, A_h, c, m, L, H, G, hidx, gidx,
                                                        b64, P, N, BLOCK_P, BLOCK_N, SOFTPLUS, BLOCK_Q, BLOCK_K)
    Cv = tl.load(C_ptr + bn, mask=m_bn, other=0.0).to(tl.float32)
    cs_t = cs + before
    csx_t = cs_t - a
    offs_p = tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    tile = offs_n[:, None] * P + offs_p[None, :]
    m_st = (offs_n < N)[:, None] & (offs_p < P)[None, :]
    base = (pid_bh.to(tl.int64) * DIRS * NCH + c) * (N * P)
    S_f = tl.load(st_ptr + base + tile, mask=m_st, other=0.0)
    yv = tl.exp(cs_t)[:, None] * tl.dot(Cv, S_f)
    if DIRS == 2:
        S_b = tl.load(st_ptr + base + NCH * (N * P) + tile, mask=m_st, other=0.0)
        yv += tl.exp(total - csx_t)[:, None] * tl.dot(Cv, S_b)  # steps t.. to the chunk's end
        k_end = BLOCK_Q // BLOCK_K
    else:
        k_end = m + 1
    if HAS_D:
        yv += tl.load(D_ptr + hidx).to(tl.float32) * xv
    tt = m * BLOCK_K + tl.arange(0, BLOCK_K)[:, None]
    offset = 0.0
    for k in range(0, k_end):  # the in-chunk pairs, one source sub-block at a time
        dts, a_s, cs_s, xs, Bs, _xys, _mxp, _bn, _mbn = _cp_block(dt_ptr, x_ptr, B_ptr, bias, A_h, c, k, L, H, G,
                                                                  hidx, gidx, b64, P, N, BLOCK_P, BLOCK_N, SOFTPLUS,
                                                                  BLOCK_Q, BLOCK_K)
        cs_s = cs_s + offset
        ss = k * BLOCK_K + tl.arange(0, BLOCK_K)[None, :]
        if DIRS == 2:  # both directions in one tile, 2 on the diagonal (as triton_kernels._pair_decay)
            expo = tl.where(tt >= ss, cs_t[:, None] - cs_s[None, :], (cs_s - a_s)[None, :] - csx_t[:, None])
            decay = tl.exp(expo) + tl.where(tt == ss, 1.0, 0.0)
        else:
            decay = tl.exp(tl.where(tt >= ss, cs_t[:, None] - cs_s[None, :], float("-inf")))
        yv += tl.dot(tl.dot(Cv, tl.trans(Bs)) * decay * dts[None, :], xs)
        offset += tl.sum(a_s, 0)
    tl.store(y_ptr + xy, yv.to(y_ptr.dtype.element_ty), mask=m_xp)


def chunk_parallel_forward(x, dt, A, B, C, D=None, dt_bias=None, dt_softplus=False, direction="both",
                           block_q=BLOCK_Q, block_k=64, block_e=1024, num_warps=None):
    """y of ``bi_ssd(x, dt, A, B, C, D=D, dt_bias=dt_bias, dt_softplus=dt_softplus, direction=direction)`` for
    direction "both" or "forward" (BiMamba2 mode), computed chunk-parallel in three launches."""
    if direction not in ("both", "forward"):
        raise ValueError(f"direction must be 'both' or 'forward', got {direction!r}")
    for name, v in (("block_q", block_q), ("block_k", block_k)):
        if v < 16 or v & (v - 1):
            raise ValueError(f"{name} must be a power of two >= 16 (a tile of tl.dot), got {v}")
    b, L, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    dirs = 2 if direction == "both" else 1
    num_warps = num_warps or 4
    nch = -(-L // block_q)
    st = torch.empty((b * h, dirs, nch, n, p), dtype=torch.float32, device=x.device)
    dec = torch.empty((b * h, nch), dtype=torch.float32, device=x.device)
    y = torch.empty_like(x)
    bias = dt_bias if dt_bias is not None else A
    tiles = dict(P=p, N=n, BLOCK_P=kernel_tile(p), BLOCK_N=kernel_tile(n), DIRS=dirs, HAS_BIAS=dt_bias is not None,
                 SOFTPLUS=bool(dt_softplus), BLOCK_Q=block_q, BLOCK_K=min(block_q, block_k), num_warps=num_warps)
    _cp_state_kernel[(b * h, nch)](x, dt, A, B, bias, st, dec, L, h, g, nch, **tiles)
    _cp_pass_kernel[(b * h * dirs, -(-(n * p) // block_e))](st, dec, nch, NP=n * p, DIRS=dirs, BLOCK_E=block_e,
                                                              num_warps=4)
    _cp_out_kernel[(b * h, nch, block_q // tiles["BLOCK_K"])](x, dt, A, B, C, D if D is not None else A, bias, st, y,
                                                              L, h, g, nch, HAS_D=D is not None, **tiles)
    return y


def inputs(shape, dtype, device):
    """The kernel benchmark's inputs (bench_kernels.make_inputs, BiMamba2 mode), detached: only forwards run here."""
    return {k: t.detach() for k, t in make_inputs(shape, dtype, device, hydra=False).items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="b16_L1600_h8,b16_L400_h8,b16_L6400_h8,lm_b8_L8192_h32")
    ap.add_argument("--budget", type=float, default=0.3, help="seconds of timing per measurement")
    ap.add_argument("--block-q", default="64,128,256",
                    help="chunk sizes of the chunk-parallel kernels, comma separated")
    ap.add_argument("--kernels", action="store_true", help="also each kernel's CUDA time (torch.profiler)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.kernels:
        from profile_gpu import _kernel_times
    block_qs = [int(v) for v in a.block_q.split(",")]
    dev = "cuda"
    rows = []
    for name in a.shapes.split(","):
        inp = inputs(SHAPES[name], torch.bfloat16, dev)
        kw = dict(D=inp["D"], dt_bias=inp["dt_bias"], dt_softplus=True)
        args = [inp[k] for k in ("x", "dt", "A", "B", "C")]
        for direction in ("both", "forward"):
            def ours(q):
                with torch.no_grad():
                    return chunk_parallel_forward(*args, direction=direction, block_q=q, **kw)

            def op():
                with torch.no_grad():
                    return bi_ssd(*args, direction=direction, backend="triton", **kw)

            rec = dict(shape=name, direction=direction)
            runs = [("op", op)] + [(f"chunk_parallel_q{q}", functools.partial(ours, q)) for q in block_qs]
            want = op().float()
            for label, fn in runs:
                try:
                    got = fn().float()
                    rec[f"{label}_rel_err_vs_op"] = ((got - want).norm() / want.norm()).item()
                    rec[f"{label}_ms"] = round(time_graph(fn, a.budget), 4)
                    rec[f"{label}_peak_mb"] = round(peak_memory(fn, dev)[0] / 2**20, 1)
                    if a.kernels:  # CUDA time of each kernel (torch.profiler, median of 5 calls)
                        rec[f"{label}_kernels_ms"] = _kernel_times(fn)[0]
                except Exception as exc:  # noqa: BLE001 - a config that does not compile or fit is a result too
                    rec[f"{label}_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            rows.append(rec)
            print(json.dumps(rec), flush=True)
        del inp, args
        torch.cuda.empty_cache()
    out = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
               rows=rows)
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))
        print("wrote", a.out)
    return out


if __name__ == "__main__":
    main()
