"""Study: summing per-head dB / dC rows over a group's heads inside the segment kernel, in a fixed head order.

Why: the backward's per-head dB, dC buffers (ngroups < nheads) are the whole excess of the Triton op's peak memory
over the 1.1x target (benchmarks/memory_account.py: 1.28-1.75x with them, 0.81-1.10x without). The segment kernel
writes its state terms into those rows in pass A (one walk over its chunks) and adds to them in pass B (the walk the
other way); the pairs kernel later sums each row over the group's heads. Without the per-head rows, the programs of a
group's heads must add into shared fp32 rows, and for bitwise-repeatable results in a fixed head order.

One order is NOT possible: all heads' pass A, then all heads' pass B, in one row. Head 0's pass B of a chunk would
wait for head H-1's pass A of it, and a program can then wait for one that has not started (a deadlock unless every
program of the grid is resident at once; under the Triton interpreter, which runs programs one after another, it
always hangs). So each pass has its own rows: pass A's contributions are summed in head order into rows A, pass B's
into rows B, and a later kernel (the pairs kernel, in the op) adds A + B. Every wait is then for a lower head of the
same (batch, segment), i.e. for a program that took its ticket earlier and so is running or done.

The kernel: one program per (batch, head, segment), as the segment kernel. Each walks its segment's chunks twice
(pass A last to first, pass B first to last); per chunk it computes a contribution v = x_chunk @ S (rows x N) and
updates its stand-in state S with ``WORK`` more dots, then
- ``ORDERED=False`` (today's scheme): stores v into its per-head rows (pass A) or adds v to them (pass B); a second
  kernel sums the heads into the fp32 group rows;
- ``ORDERED=True``: adds v to the pass's fp32 rows after waiting for its turn. A counter per (pass, batch, chunk)
  counts the additions done to those rows; the program of head h adds when it reads h, then increments it (release
  after a block barrier; the wait is an acquire). Programs take tickets in launch order and a ticket names the
  (segment, batch, head), heads fastest.
Memory per gradient (dB or dC) at ngroups = 1: per-head rows b*L*h*N in the inputs' dtype (bf16) against two fp32
group rows 2*b*L*N*4 bytes: half at h = 8, an eighth at h = 32, the same at h = 4.

    python benchmarks/ordered_head_sum_study.py [--out F.json]   # on a CUDA machine: checks, then GPU times

On the CPU (tests/test_ordered_head_sum_study.py, Triton interpreter) the two schemes are checked against a float64
reference and the ordered one for bitwise repeatability; the interpreter runs programs one after another, so the
waits there are never contended: only a GPU run tests the ordering under concurrency (the script checks the ordered
results against the unordered ones and itself on every repeat).

Outcome (H200, benchmarks/results/session20/): bitwise repeatable, 1.3-1.6x the per-head scheme's time. The op now
has the ordered sum as an option (YOLO_BIMAMBA_ORDERED_ROWS=1) with ONE fp32 row set: with one direction per launch,
each dB or dC row gets a single pass's terms in a launch, so the two-row-set form above is not needed there.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

# the op's package (bench_kernels enters it without Ultralytics where that is missing, as on the GPU machines) and its
# own ordered addition (the op's ORDERED mode, YOLO_BIMAMBA_ORDERED_ROWS=1, grew out of this study)
_spec = importlib.util.spec_from_file_location("bench_kernels", Path(__file__).parent / "bench_kernels.py")
_spec.loader.exec_module(importlib.util.module_from_spec(_spec))
from yolo_bimamba.ops.triton_kernels import _add_turn  # noqa: E402

# (name, batch, length, heads, headdim, d_state): the kernel benchmark's b16 L1600 h8 and LM shapes, and the detection
# models' p32 n32 layers; each cut into segments as the op cuts it on the GPU at hand (triton_op.segment_rows)
SHAPES = {
    "b16_L1600_h8_p64_n64": (16, 1600, 8, 64, 64),
    "b32_L1600_h8_p32_n32": (32, 1600, 8, 32, 32),
    "lm_b8_L8192_h32_p64_n128": (8, 8192, 32, 64, 128),
}


@triton.jit
def _chunk_step(x_ptr, S, b, h, rows, mrow, L, H, offs_p, P: tl.constexpr, WORK: tl.constexpr, DOT: tl.constexpr):
    xv = tl.load(x_ptr + ((b * L + rows[:, None]) * H + h) * P + offs_p[None, :], mask=mrow[:, None],
                 other=0.0).to(tl.float32)
    v = tl.dot(xv, S, input_precision=DOT)
    for _ in range(WORK):
        S = 0.5 * S + 1e-3 * tl.dot(tl.trans(xv), v, input_precision=DOT)
    return v, S


@triton.jit
def _study_kernel(x_ptr, s_ptr, ph_ptr, acc_ptr, cnt_ptr, ticket_ptr, L, B, H, SEG, NCH,
                  P: tl.constexpr, N: tl.constexpr, BLOCK_Q: tl.constexpr, WORK: tl.constexpr,
                  ORDERED: tl.constexpr, DOT: tl.constexpr):
    """acc: (2, B, L, N) fp32, pass A's and pass B's head sums (ORDERED); cnt: (2, B, NCH) int32 counters."""
    if ORDERED:
        t = tl.atomic_add(ticket_ptr, 1)
    else:
        t = tl.program_id(0)
    h = t % H
    b = (t // H) % B
    seg = t // (H * B)
    offs_q = tl.arange(0, BLOCK_Q)
    offs_p = tl.arange(0, P)
    offs_n = tl.arange(0, N)
    S = tl.load(s_ptr + ((b * H + h) * P + offs_p[:, None]) * N + offs_n[None, :]).to(tl.float32)
    r0 = seg * SEG
    nch = tl.cdiv(tl.minimum(L - r0, SEG), BLOCK_Q)
    for i in range(0, nch):  # pass A: the segment's chunks, last to first
        c = nch - 1 - i
        rows = r0 + c * BLOCK_Q + offs_q
        mrow = rows < tl.minimum(L, r0 + SEG)
        v, S = _chunk_step(x_ptr, S, b, h, rows, mrow, L, H, offs_p, P, WORK, DOT)
        m = mrow[:, None]
        if ORDERED:
            _add_turn(acc_ptr + (b * L + rows[:, None]) * N + offs_n[None, :], m, v,
                      cnt_ptr + b * NCH + r0 // BLOCK_Q + c, h)
        else:
            tl.store(ph_ptr + ((b * L + rows[:, None]) * H + h) * N + offs_n[None, :], v.to(ph_ptr.dtype.element_ty),
                     mask=m)
    for c in range(0, nch):  # pass B: first to last
        rows = r0 + c * BLOCK_Q + offs_q
        mrow = rows < tl.minimum(L, r0 + SEG)
        v, S = _chunk_step(x_ptr, S, b, h, rows, mrow, L, H, offs_p, P, WORK, DOT)
        m = mrow[:, None]
        if ORDERED:
            _add_turn(acc_ptr + ((B + b) * L + rows[:, None]) * N + offs_n[None, :], m, v,
                      cnt_ptr + (B + b) * NCH + r0 // BLOCK_Q + c, h)
        else:
            ptrs = ph_ptr + ((b * L + rows[:, None]) * H + h) * N + offs_n[None, :]
            old = tl.load(ptrs, mask=m, other=0.0).to(tl.float32)
            tl.store(ptrs, (old + v).to(ph_ptr.dtype.element_ty), mask=m)


@triton.jit
def _head_sum_kernel(ph_ptr, acc_ptr, L, H, N: tl.constexpr, BLOCK_Q: tl.constexpr):
    """Today's second step: the per-head rows of one (batch, chunk) summed over the heads in fp32, in head order."""
    b = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    offs_n = tl.arange(0, N)
    m = (rows < L)[:, None]
    tot = tl.zeros((BLOCK_Q, N), dtype=tl.float32)
    for h in range(0, H):
        ptrs = ph_ptr + ((b * L + rows[:, None]) * H + h) * N + offs_n[None, :]
        tot += tl.load(ptrs, mask=m, other=0.0).to(tl.float32)
    tl.store(acc_ptr + (b * L + rows[:, None]) * N + offs_n[None, :], tot, mask=m)


def make_inputs(b, l, h, p, n, dtype=torch.float32, device="cpu", seed=0):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(b, l, h, p, generator=gen).to(device=device, dtype=dtype)
    s = (torch.randn(b * h, p, n, generator=gen) / p ** 0.5).to(device=device, dtype=dtype)
    return x, s


def group_sum(x, s, seg, ordered, block_q=64, work=2, ph_dtype=None, dot="tf32", poison=True):
    """The (b, L, N) fp32 sums over the heads of both passes' contributions, by either scheme, and the counters
    (ordered). ``dot``: the dots' input precision ("ieee" for the CPU checks against float64); ``poison``: the
    buffers start as NaN (for the checks; timings leave them uninitialised, as the op does)."""
    b, l, h, p = x.shape
    n = s.shape[-1]
    dev = x.device
    nseg = -(-l // seg)
    nch = -(-l // block_q)
    cnt = torch.zeros(2, b, nch, dtype=torch.int32, device=dev)
    ticket = torch.zeros(1, dtype=torch.int32, device=dev)
    def buf(shape, dtype):  # every row must be written before it is read: NaN where one is not
        return torch.full(shape, float("nan"), dtype=dtype, device=dev) if poison else \
            torch.empty(shape, dtype=dtype, device=dev)

    if ordered:
        acc = buf((2, b, l, n), torch.float32)
        ph = acc
    else:
        acc = buf((b, l, n), torch.float32)
        ph = buf((b, l, h, n), ph_dtype or x.dtype)
    _study_kernel[(b * h * nseg,)](x, s, ph, acc, cnt, ticket, l, b, h, seg, nch, P=p, N=n, BLOCK_Q=block_q,
                                   WORK=work, ORDERED=ordered, DOT=dot)
    if not ordered:
        _head_sum_kernel[(b, nch)](ph, acc, l, h, N=n, BLOCK_Q=block_q)
        return acc, cnt
    return acc[0] + acc[1], cnt


def reference(x, s, seg, block_q=64, work=2):
    """float64: the same walks and contributions, summed over the heads."""
    x, s = x.double(), s.double()
    b, l, h, p = x.shape
    out = torch.zeros(b, l, s.shape[-1], dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            for r0 in range(0, l, seg):
                r1 = min(l, r0 + seg)
                S = s[bi * h + hi].clone()
                starts = list(range(r0, r1, block_q))
                for c0 in starts[::-1] + starts:
                    xv = x[bi, c0:min(r1, c0 + block_q), hi]
                    v = xv @ S
                    for _ in range(work):
                        S = 0.5 * S + 1e-3 * (xv.T @ v)
                    out[bi, c0:c0 + xv.shape[0]] += v
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--work", default="2,8",
                    help="extra dots per chunk, comma separated (the op's segment kernel does several per chunk)")
    ap.add_argument("--repeats", type=int, default=5, help="ordered runs compared bitwise with the first")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA device (the CPU checks are tests/test_ordered_head_sum_study.py)")
    from yolo_bimamba.ops.triton_op import segment_rows  # the op's segmentation

    rows = []
    for name in a.shapes.split(","):
        b, l, h, p, n = SHAPES[name]
        x, s = make_inputs(b, l, h, p, n, torch.bfloat16, "cuda")
        seg = segment_rows(b, h, l, x.device)
        nseg = -(-l // seg)
        for work in (int(w) for w in a.work.split(",")):
            first, cnt = group_sum(x, s, seg, True, work=work)
            plain, _ = group_sum(x, s, seg, False, work=work, ph_dtype=torch.float32)
            same = all(torch.equal(first, group_sum(x, s, seg, True, work=work)[0]) for _ in range(a.repeats))
            rel = float((first - plain).norm() / plain.norm())
            t_ord = triton.testing.do_bench(lambda: group_sum(x, s, seg, True, work=work, poison=False),
                                            return_mode="median")
            t_plain = triton.testing.do_bench(lambda: group_sum(x, s, seg, False, work=work, poison=False),
                                              return_mode="median")
            row = dict(shape=name, work=work, segments=nseg, ordered_ms=t_ord, per_head_ms=t_plain,
                       ordered_over_per_head=t_ord / t_plain, repeatable=same,
                       counters_done=bool((cnt == h).all()), rel_diff_vs_fp32_per_head=rel,
                       per_head_rows_mb=b * l * h * n * 2 / 2**20, ordered_rows_mb=2 * b * l * n * 4 / 2**20)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if a.out:
        meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                    command="python " + " ".join(sys.argv))
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(dict(meta, rows=rows), indent=1))


if __name__ == "__main__":
    main()
