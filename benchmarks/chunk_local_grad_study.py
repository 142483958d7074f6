"""How accurate are the log-decay gradients (dA, and the A * G part of ddt) when the state dots run in plain bf16?

A design study for the backward kernels, on the CPU, in float64 with the kernels' roundings emulated. One direction
(causal) of one head at a time, chunks of Q = 64, the GPU suite's stress inputs (bf16-valued x, B, C, dy; dt =
softplus(dt_raw + dt_bias) with dt_raw up to +10; L = 65536).

With a_t = exp(l_t), l_t = max(dt_t A, -104), the state h_t = a_t h_(t-1) + dt_t B_t x_t^T and its adjoint
lam_t = C_t dy_t^T + a_(t+1) lam_(t+1), the gradient of the loss with respect to l_t is

    G_t = <lam_t, a_t h_(t-1)>  =  sum over the pairs s < t <= u of w(s, u),
    w(s, u) = exp(cs_u - cs_s) dt_s (C_u . B_s) (dy_u . x_s),      dA = sum_t [l_t > -104] dt_t G_t.

Two ways to sum the pairs that cross a chunk boundary (the pairs inside a chunk, T1, are summed inside the chunk in
both, from dots of inputs only):

* telescoped (the current kernels): for every position k, in_k = the pairs from earlier chunks that end at k
  (exp(cs_k) dy_k . H_in^T C_k) and out_k = the pairs that start at k and end in a later chunk
  (exp(cs_end - cs_k) dt_k x_k . Lam_in^T B_k); G_t = T1 + sum_(u >= t) in_u - sum_(s >= t) out_s over the whole
  sequence. Each position's terms are large next to G_t, and the rounding of the state read-outs in them
  accumulates over the sequence: the kernels need fp32-accurate state dots (three bf16 parts).
* chunk-local: with H_in the state entering chunk c and Lam_in the adjoint entering it from the right,
  G_t = T1(t) + sum_(u >= t in c) exp(cs_u) dy_u . H_in^T C_u + sum_(s < t in c) exp(cs_end - cs_s) dt_s x_s .
  Lam_in^T B_s + exp(cs_end) <Lam_in, H_in>: every term is a chunk's own, nothing is summed across chunks but the
  states themselves.

* segment-local (``--seg``): telescoped as above, but only inside segments of that many rows, each restarted from
  the exact value at the next segment's first row (the kernels' segment-boundary states give it): no per-chunk
  states, and the rounding accumulates over a segment instead of the sequence.

Emulated roundings (k = number of bf16 parts of the fp32 operand of a state dot: 1 = plain bf16 tensor-core dot,
3 = the kernels' bf16x3; "exact" = float64 throughout): the operands (w x) of the state update and (exp(cs) dy) of
the adjoint update, and H_in, Lam_in in the read-outs; states carried in fp32; the per-position terms and every sum
in fp32. The boundary term <Lam_in, H_in> needs the state and its adjoint at the same chunk boundary, i.e. one of
them kept per chunk; the variant "local_k1_bf16_chunk_states" keeps H_in in bf16 for it. The reference is the
float64 chunk-local sum, checked against autograd through the package's PyTorch op in float64
(tests/test_chunk_local_grad.py). Not emulated: the fp32 rounding inside a dot's accumulation (2^-24 per add).

    python benchmarks/chunk_local_grad_study.py [--case softplus-input-10|normal|dt-1e2-A-1e2] [--L 65536] [--heads 8]
        [--seg 256,1024] [--out benchmarks/results/....json]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

Q = 64
FLOOR = -104.0
F64, F32 = torch.float64, torch.float32


def bf16_parts(v: torch.Tensor, k) -> torch.Tensor:
    """v (an fp32 operand, given in float64) as the sum of k bf16 parts (k = "exact": v itself in float64)."""
    if k == "exact":
        return v
    r = v.to(F32)
    out = torch.zeros_like(r, dtype=F64)
    for _ in range(k):
        part = r.to(torch.bfloat16).to(F32)
        out += part.to(F64)
        r = r - part  # exact in fp32 (Sterbenz)
    return out


CASES = ("softplus-input-10", "normal", "dt-1e2-A-1e2")


def inputs(L, heads, case="softplus-input-10", seed=7, p=64, n=64):
    """The GPU suite's long-sequence cases (tests/gpu/test_gpu_kernels.py: make_inputs; tests/stress_recipes.py):
    "normal" (dt_raw ~ N(-0.5, 0.5)), "softplus-input-10" (dt_raw ~ U[-10, 10]), both through softplus(dt_raw +
    dt_bias) and A = -exp(U[0, log 16]); "dt-1e2-A-1e2" (dt ~ U[1e-3, 100] without softplus, A = -logspace(-2, 2))."""
    gen = torch.Generator().manual_seed(seed)

    def bf(*shape):
        return torch.randn(*shape, generator=gen).to(torch.bfloat16).to(F64)

    dt0 = torch.exp(torch.rand(heads, generator=gen, dtype=F64) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
    dt_bias = dt0 + torch.log(-torch.expm1(-dt0))
    A = -torch.exp(torch.rand(heads, generator=gen, dtype=F64) * math.log(16.0))
    if case == "normal":
        dt_raw = (torch.randn(L, heads, generator=gen) * 0.5 - 0.5).to(torch.bfloat16).to(F64)
    else:
        lo, hi = (-10.0, 10.0) if case == "softplus-input-10" else (1e-3, 100.0)
        dt_raw = (torch.rand(L, heads, generator=gen) * (hi - lo) + lo).to(torch.bfloat16).to(F64)
    if case == "dt-1e2-A-1e2":
        dt, A = dt_raw, -torch.logspace(-2, 2, heads, dtype=F64)
    else:
        dt = torch.nn.functional.softplus(dt_raw + dt_bias).to(F32).to(F64)  # the kernels compute dt in fp32
    return dict(x=bf(L, heads, p), dt=dt, A=A, B=bf(L, n), C=bf(L, n), dy=bf(L, heads, p))


def grads(x, dt, A, B, C, dy, k, form, stored_parts="exact", seg_rows=None):
    """G (L,) and dA of one head: x, dy (L, p); dt (L,); A scalar; B, C (L, n). ``k``: bf16 parts of the state dots'
    fp32 operands ("exact": float64 throughout); ``form``: "local", "telescoped" or "segment" (telescoped inside
    segments of ``seg_rows`` rows). ``stored_parts``: bf16 parts of the chunk states H_in in the boundary term
    <Lam_in, H_in> (1: states kept per chunk in bf16, to save memory)."""
    exact = k == "exact"
    acc = F64 if exact else F32  # per-position terms and sums: fp32 as in the kernels
    L, p = x.shape
    nc = L // Q
    l = (dt * A).clamp(min=FLOOR)
    live = (dt * A) > FLOOR
    xs, dts, Bs, Cs, dys, ls = (t.reshape(nc, Q, *t.shape[1:]) for t in (x, dt, B, C, dy, l))
    cs = torch.cumsum(ls, 1)  # (nc, Q) inclusive, within the chunk
    cs_end = cs[:, -1:]
    # in-chunk pairs T1(t) = sum_{u >= t, s < t} M[u, s] (dots of inputs only: no rounding emulated)
    seg = cs[:, :, None] - cs[:, None, :]  # (nc, u, s)
    low = torch.tril(torch.ones(Q, Q, dtype=torch.bool), -1)
    M = torch.where(low, torch.exp(seg.clamp(max=0.0)), torch.zeros((), dtype=F64)) * dts[:, None, :] \
        * (Cs @ Bs.transpose(1, 2)) * (dys @ xs.transpose(1, 2))
    Mc = M.to(acc)
    below = torch.flip(torch.cumsum(torch.flip(Mc, [1]), 1), [1])  # [t, s] = sum_{u >= t} M[u, s]
    T1 = (below * low[None].to(acc)).sum(-1)  # sum over s < t  -> (nc, Q)
    # the state entering each chunk (forward scan) and the adjoint entering it from the right (backward scan)
    n = B.shape[1]
    w_up = torch.exp(cs_end - cs) * dts  # (nc, Q): weight of row s in the chunk's state update
    U = Bs.transpose(1, 2) @ bf16_parts((w_up[..., None] * xs), k)  # (nc, n, p)
    W = Cs.transpose(1, 2) @ bf16_parts((torch.exp(cs)[..., None] * dys), k)  # (nc, n, p)
    H_in = torch.zeros(nc, n, p, dtype=F64)
    Lam_in = torch.zeros(nc, n, p, dtype=F64)
    h = torch.zeros(n, p, dtype=F64)
    for c in range(nc):
        H_in[c] = h
        h = torch.exp(cs_end[c, 0]) * h + U[c]
        if not exact:
            h = h.to(F32).to(F64)
    lam = torch.zeros(n, p, dtype=F64)
    for c in range(nc - 1, -1, -1):
        Lam_in[c] = lam
        lam = torch.exp(cs_end[c, 0]) * lam + W[c]
        if not exact:
            lam = lam.to(F32).to(F64)
    r = Cs @ bf16_parts(H_in, k)  # (nc, Q, p): read-out of the state entering the chunk
    qv = Bs @ bf16_parts(Lam_in, k)  # (nc, Q, p): read-out of the adjoint entering from the right
    e_in = (torch.exp(cs) * (dys * r).sum(-1)).to(acc)  # pairs from earlier chunks ending at u
    f_out = (torch.exp(cs_end - cs) * dts * (xs * qv).sum(-1)).to(acc)  # pairs starting at s, ending later
    if form == "local":
        T2 = torch.flip(torch.cumsum(torch.flip(e_in, [1]), 1), [1])  # sum_{u >= t}
        T3 = torch.cumsum(f_out, 1) - f_out  # sum_{s < t}
        T4 = (torch.exp(cs_end[:, 0]) * (Lam_in * bf16_parts(H_in, stored_parts)).sum((1, 2))).to(acc)[:, None]
        G = T1 + T2 + T3 + T4
    elif form == "segment":
        # telescoped inside segments of ``seg_rows`` rows only, each restarted from the exact boundary value at the next
        # segment's first row: G there = sum_(u in its chunk) in_u + T4 of that chunk (the kernels' boundary
        # states give it as exp(l_b) <h_(b-1), lam_b> in fp32)
        T4 = (torch.exp(cs_end[:, 0]) * (Lam_in * H_in).sum((1, 2))).to(acc)
        Z = e_in.sum(1) + T4  # (nc,) G at each chunk's first row
        cpc = seg_rows // Q
        ns = nc // cpc
        e2 = e_in.reshape(ns, cpc * Q)
        o2 = f_out.reshape(ns, cpc * Q)
        rin = torch.flip(torch.cumsum(torch.flip(e2, [1]), 1), [1])
        rout = torch.flip(torch.cumsum(torch.flip(o2, [1]), 1), [1])
        Znext = torch.zeros(ns, dtype=acc)
        Znext[:-1] = Z.reshape(ns, cpc)[1:, 0]
        G = T1 + (rin - rout + Znext[:, None]).reshape(nc, Q)
    else:
        rev_in = torch.flip(torch.cumsum(torch.flip(e_in.reshape(-1), [0]), 0), [0])
        rev_out = torch.flip(torch.cumsum(torch.flip(f_out.reshape(-1), [0]), 0), [0])
        G = T1 + (rev_in - rev_out).reshape(nc, Q)
    G = G.reshape(-1)
    dA = (dt.to(acc) * G * live.to(acc)).sum()
    return G.to(F64), dA.to(F64)


def autograd_dA(inp, h):
    """dA of head h by autograd through the package's chunked PyTorch op in float64 (the GPU suite's reference)."""
    from yolo_bimamba.ops.chunked import bi_ssd_torch

    x = inp["x"][:, h][None, :, None]
    dt = inp["dt"][:, h][None, :, None]
    A = inp["A"][h:h + 1].clone().requires_grad_(True)
    B, C = inp["B"][None, :, None], inp["C"][None, :, None]
    y = bi_ssd_torch(x, dt, A, B, C, chunk_size=Q, direction="forward")
    (gA,) = torch.autograd.grad(y, A, inp["dy"][:, h][None, :, None])
    return gA[0].item()


def rel(a, b):
    return (float((a - b).norm() / b.norm())) if b.norm() > 0 else float((a - b).norm())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--L", type=int, default=65536)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--case", default="softplus-input-10", choices=CASES)
    ap.add_argument("--out", default=None)
    ap.add_argument("--seg", default="", help="comma-separated segment lengths (multiples of 64) for the segment form")
    a = ap.parse_args(argv)
    if a.L % Q:
        sys.exit(f"--L must be a multiple of {Q}")
    segs = [int(v) for v in a.seg.split(",") if v]
    if any(v % Q or a.L % v for v in segs):
        sys.exit(f"--seg values must be multiples of {Q} dividing --L")
    t0 = time.time()
    inp = inputs(a.L, a.heads, a.case)
    rows = []
    for h in range(a.heads):
        args = (inp["x"][:, h], inp["dt"][:, h], inp["A"][h].item(), inp["B"], inp["C"], inp["dy"][:, h])
        G_ref, dA_ref = grads(*args, "exact", "local")
        G_tel, dA_tel = grads(*args, "exact", "telescoped")
        row = dict(head=h, A=round(inp["A"][h].item(), 4), dA=dA_ref.item(), dA_autograd=autograd_dA(inp, h),
                   exact_telescoped_vs_local=rel(G_tel, G_ref))
        for form in ("telescoped", "local"):
            for k in (1, 2, 3):
                G, dA = grads(*args, k, form)
                row[f"{form}_k{k}"] = dict(G=rel(G, G_ref), dA=dA.item())
        G, dA = grads(*args, 1, "local", stored_parts=1)
        row["local_k1_bf16_chunk_states"] = dict(G=rel(G, G_ref), dA=dA.item())
        for sg in segs:
            for k in (1, 2):
                G, dA = grads(*args, k, "segment", seg_rows=sg)
                row[f"segment{sg}_k{k}"] = dict(G=rel(G, G_ref), dA=dA.item())
        rows.append(row)
        print(json.dumps(row), flush=True)
    # as the GPU suite measures dA: the relative error of the vector over heads
    dA_ref = torch.tensor([r["dA"] for r in rows], dtype=F64)
    summary = {"autograd_vs_chunk_local_dA": rel(torch.tensor([r["dA_autograd"] for r in rows], dtype=F64), dA_ref),
               "exact_telescoped_vs_local_G_max": max(r["exact_telescoped_vs_local"] for r in rows)}
    keys = [f"{form}_k{k}" for form in ("telescoped", "local") for k in (1, 2, 3)] + ["local_k1_bf16_chunk_states"]
    for key in keys + [f"segment{sg}_k{k}" for sg in segs for k in (1, 2)]:
        summary[key] = dict(dA_rel=rel(torch.tensor([r[key]["dA"] for r in rows], dtype=F64), dA_ref),
                            G_max_rel=max(r[key]["G"] for r in rows))
    res = dict(case=a.case, L=a.L, heads=a.heads, chunk=Q, torch=torch.__version__, seconds=round(time.time() - t0, 1),
               summary=summary, rows=rows)
    print(json.dumps(summary, indent=1))
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(res, indent=1))
        print("wrote", a.out)


if __name__ == "__main__":
    main()
