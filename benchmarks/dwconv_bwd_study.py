"""Design study (GPU): the depthwise conv + SiLU backward (ops.dwconv) against one-kernel alternatives, and its configs.

    python benchmarks/dwconv_bwd_study.py            # candidates -> conv-study.json  (in $OUT or the current folder)
    python benchmarks/dwconv_bwd_study.py --sweep    # configs and an input-dtype gp buffer -> conv-sweep.json

The package's backward is two kernels: ``_dwconv_silu_bwd_pre`` writes gp = dy * silu'(pre) (fp32) and the bias
partial sums, ``_dwconv_silu_bwd_in`` reads gp at the K shifts for du and sums gp * u for the weight partials.
Candidates here:
- ``_bwd_fused``: one kernel that recomputes gp at each of the K shifts it needs (K^2 shifted loads of u per tile)
  instead of writing and reading gp;
- ``_bwd_fused_loop``: the same, each program walking ``iters`` row blocks and keeping its weight and bias partial
  sums in registers (fewer partial rows to sum).
Every candidate is checked against the package's kernels first (fp32, every config). GPU time = median of CUDA-graph
replays. Results of 2026-12-02 (H200): benchmarks/results/session18/.
"""
import argparse
import json
import os
import time

import torch
import triton
import triton.language as tl

from yolo_bimamba.ops import dwconv_kernels as dk
from yolo_bimamba.ops.dwconv import dwconv_silu
from yolo_bimamba.ops.fused_switch import compute_dtype

_pre_tile, _tile = dk._pre_tile, dk._tile


@triton.jit
def _du_and_gp(u_ptr, w_ptr, bias_ptr, dy_base, u_off, rows, cols, mcol, L, Cn, su_l, K: tl.constexpr,
               HAS_BIAS: tl.constexpr, COMPUTE: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr):
    """du of a row block, gp recomputed at each of the K shifts it needs, and gp of the block's own rows (0 past L)."""
    H: tl.constexpr = K // 2
    du = tl.zeros((BLOCK_L, BLOCK_C), dtype=COMPUTE)
    gp0 = tl.zeros((BLOCK_L, BLOCK_C), dtype=COMPUTE)
    for j in tl.static_range(K):
        rs = rows + (H - j)  # gp at row t + H - j meets w_j in du[t]
        ms = ((rs >= 0) & (rs < L))[:, None] & mcol[None, :]
        pre = _pre_tile(u_ptr, w_ptr, bias_ptr, u_off, rs, cols, mcol, L, su_l, K, HAS_BIAS, COMPUTE, BLOCK_L, BLOCK_C)
        dy = tl.load(dy_base + rs[:, None].to(tl.int64) * Cn + cols[None, :], mask=ms, other=0.0).to(COMPUTE)
        s = 1.0 / (1.0 + tl.exp(-pre))
        gp = tl.where(ms, dy * s * (1.0 + pre * (1.0 - s)), 0.0)
        wj = tl.load(w_ptr + cols * K + j, mask=mcol, other=0.0).to(COMPUTE)
        du += wj[None, :] * gp
        if j == H:
            gp0 = gp
    return du, tl.where((rows < L)[:, None], gp0, 0.0)


@triton.jit
def _gp_u(u_ptr, u_off, gp0, rows, cols, mcol, L, su_l, SHIFT: tl.constexpr, COMPUTE: tl.constexpr):
    """sum over the block's rows t of gp[t] u[t + SHIFT]: its part of the weight gradient at that tap."""
    ru = rows + SHIFT
    mu = ((ru >= 0) & (ru < L))[:, None] & mcol[None, :]
    uv = tl.load(u_ptr + u_off + ru[:, None].to(tl.int64) * su_l + cols[None, :], mask=mu, other=0.0).to(COMPUTE)
    return tl.sum(gp0 * uv, 0)


@triton.jit
def _bwd_fused(u_ptr, w_ptr, bias_ptr, dy_ptr, du_ptr, dw_part_ptr, dbias_part_ptr, L, Cn, su_b, su_l,
               K: tl.constexpr, HAS_BIAS: tl.constexpr, COMPUTE: tl.constexpr,
               BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr):
    pid_b, part, rows, cols, mrow, mcol = _tile(L, Cn, BLOCK_L, BLOCK_C)
    u_off = pid_b * su_b
    du, gp0 = _du_and_gp(u_ptr, w_ptr, bias_ptr, dy_ptr + pid_b * L * Cn, u_off, rows, cols, mcol, L, Cn, su_l, K,
                         HAS_BIAS, COMPUTE, BLOCK_L, BLOCK_C)
    if HAS_BIAS:
        tl.store(dbias_part_ptr + part * Cn + cols, tl.sum(gp0, 0), mask=mcol)
    for j in tl.static_range(K):
        tl.store(dw_part_ptr + (part * K + j) * Cn + cols,
                 _gp_u(u_ptr, u_off, gp0, rows, cols, mcol, L, su_l, j - K // 2, COMPUTE), mask=mcol)
    tl.store(du_ptr + pid_b * L * Cn + rows[:, None].to(tl.int64) * Cn + cols[None, :], du.to(du_ptr.dtype.element_ty),
             mask=mrow[:, None] & mcol[None, :])


@triton.jit
def _bwd_fused_loop(u_ptr, w_ptr, bias_ptr, dy_ptr, du_ptr, dw_part_ptr, dbias_part_ptr, L, Cn, su_b, su_l, iters,
                    K: tl.constexpr, KP2: tl.constexpr, HAS_BIAS: tl.constexpr, COMPUTE: tl.constexpr,
                    BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr):
    pid_b = tl.program_id(0).to(tl.int64)
    pid_s = tl.program_id(1)
    part = pid_b * tl.num_programs(1) + pid_s
    cols = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    mcol = cols < Cn
    u_off = pid_b * su_b
    kk = tl.arange(0, KP2)
    dwacc = tl.zeros((KP2, BLOCK_C), dtype=COMPUTE)
    dbacc = tl.zeros((BLOCK_C,), dtype=COMPUTE)
    for it in range(iters):
        rows = (pid_s * iters + it) * BLOCK_L + tl.arange(0, BLOCK_L)
        du, gp0 = _du_and_gp(u_ptr, w_ptr, bias_ptr, dy_ptr + pid_b * L * Cn, u_off, rows, cols, mcol, L, Cn, su_l,
                             K, HAS_BIAS, COMPUTE, BLOCK_L, BLOCK_C)
        dbacc += tl.sum(gp0, 0)
        for j in tl.static_range(K):
            part_j = _gp_u(u_ptr, u_off, gp0, rows, cols, mcol, L, su_l, j - K // 2, COMPUTE)
            dwacc += tl.where(kk[:, None] == j, part_j[None, :], 0.0)
        tl.store(du_ptr + pid_b * L * Cn + rows[:, None].to(tl.int64) * Cn + cols[None, :],
                 du.to(du_ptr.dtype.element_ty), mask=(rows < L)[:, None] & mcol[None, :])
    if HAS_BIAS:
        tl.store(dbias_part_ptr + part * Cn + cols, dbacc, mask=mcol)
    tl.store(dw_part_ptr + (part * K + kk[:, None]) * Cn + cols[None, :], dwacc, mask=(kk < K)[:, None] & mcol[None, :])


def _buffers(u, w, cfg, iters=1):
    """Grid, output and partial-sum buffers and launch options of one backward (programs over ``iters`` row blocks)."""
    b, L, C = u.shape
    K = w.shape[1]
    bl, bc, nw = cfg
    parts = -(-(-(-L // bl)) // iters)
    acc = torch.float64 if u.dtype == torch.float64 else torch.float32
    return dict(grid=(b, parts, -(-C // bc)), acc=acc, du=torch.empty_like(u),
                dbp=torch.empty((b * parts, C), dtype=acc, device=u.device),
                dwp=torch.empty((b * parts, K, C), dtype=acc, device=u.device),
                opts=dict(K=K, COMPUTE=compute_dtype(u.dtype), BLOCK_L=bl, BLOCK_C=bc, num_warps=nw))


def _grads(st):
    return st["du"], st["dwp"].sum(0).t().contiguous(), st["dbp"].sum(0)


def cur_bwd(u, w, bias, dy, cfg, gp_dtype=None):
    """The package's two kernels (gp in fp32, or in ``gp_dtype``)."""
    st = _buffers(u, w, cfg)
    gp = torch.empty(u.shape, dtype=gp_dtype or st["acc"], device=u.device)
    L, C = u.shape[1:]
    dk._dwconv_silu_bwd_pre[st["grid"]](u, w, bias, dy, gp, st["dbp"], L, C, u.stride(0), u.stride(1), HAS_BIAS=True,
                                        **st["opts"])
    dk._dwconv_silu_bwd_in[st["grid"]](u, w, gp, st["du"], st["dwp"], L, C, u.stride(0), u.stride(1), **st["opts"])
    return _grads(st)


def fused_bwd(u, w, bias, dy, cfg):
    st = _buffers(u, w, cfg)
    L, C = u.shape[1:]
    _bwd_fused[st["grid"]](u, w, bias, dy, st["du"], st["dwp"], st["dbp"], L, C, u.stride(0), u.stride(1),
                           HAS_BIAS=True, **st["opts"])
    return _grads(st)


def loop_bwd(u, w, bias, dy, cfg, iters):
    st = _buffers(u, w, cfg, iters)
    L, C = u.shape[1:]
    _bwd_fused_loop[st["grid"]](u, w, bias, dy, st["du"], st["dwp"], st["dbp"], L, C, u.stride(0), u.stride(1), iters,
                                KP2=triton.next_power_of_2(w.shape[1]), HAS_BIAS=True, **st["opts"])
    return _grads(st)


def gpu_ms(fn, reps=7):
    fn(); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        with torch.cuda.graph(g):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
        e0.record(); [g.replay() for _ in range(10)]; e1.record(); torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) / 10)
    ts.sort()
    return ts[len(ts) // 2]


def rel(a, b):
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30))


SHAPES = {"n_p3": (32, 6400, 128), "n_p4": (32, 1600, 192), "n_p5": (32, 400, 320), "s_p3": (32, 6400, 256)}
CFGS = [(64, 64, 4), (32, 128, 4), (64, 128, 8)]  # (BLOCK_L, BLOCK_C, num_warps) of the candidates


def candidates():
    out = os.environ.get("OUT", ".")
    torch.manual_seed(0)
    res = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__, rows=[])
    K = 7
    cfgs = CFGS
    t0 = time.time()
    dt = torch.float32
    b, L, C = 2, 130, 70
    u = torch.randn(b, L, C + 5, device="cuda", dtype=dt)[..., :C]
    w = torch.randn(C, K, device="cuda", dtype=dt) * 0.3
    bias = torch.randn(C, device="cuda", dtype=dt)
    dy = torch.randn(b, L, C, device="cuda", dtype=dt)
    ref = cur_bwd(u, w, bias, dy, cfgs[0])
    for cfg in cfgs:
        errs = [rel(g, r) for g, r in zip(fused_bwd(u, w, bias, dy, cfg), ref)]
        errs += [rel(g, r) for g, r in zip(loop_bwd(u, w, bias, dy, cfg, 3), ref)]
        print("check", cfg, ["%.1e" % e for e in errs], "%.0fs" % (time.time() - t0), flush=True)
        assert max(errs) < 1e-5, errs
    for name in SHAPES:
        b, L, C = SHAPES[name]
        proj = torch.randn(b, L, C + 64, device="cuda", dtype=torch.bfloat16)
        u = proj[..., :C]
        w = (torch.randn(C, K, device="cuda") * 0.3)
        bias = torch.randn(C, device="cuda")
        dy = torch.randn(b, L, C, device="cuda", dtype=torch.bfloat16)
        uw = u.detach().requires_grad_(True)
        ww = w.view(C, 1, K).clone().requires_grad_(True)
        bb = bias.clone().requires_grad_(True)

        def op_fb():
            y = dwconv_silu(uw, ww, bb)
            torch.autograd.grad(y, (uw, ww, bb), dy)
        row = dict(shape=name, b=b, L=L, C=C)
        row["op_fwd_bwd"] = gpu_ms(op_fb)
        row["op_fwd"] = gpu_ms(lambda: dwconv_silu(uw, ww, bb))
        row["cur_bwd"] = gpu_ms(lambda: cur_bwd(u, w, bias, dy, cfgs[0]))
        print(name, row, "%.0fs" % (time.time() - t0), flush=True)
        for cfg in cfgs:
            row[f"fused_bwd_{cfg}"] = gpu_ms(lambda: fused_bwd(u, w, bias, dy, cfg))
            for it in (4, 8):
                row[f"loop{it}_bwd_{cfg}"] = gpu_ms(lambda: loop_bwd(u, w, bias, dy, cfg, it))
            print(name, cfg, {k: v for k, v in row.items() if str(cfg) in k}, "%.0fs" % (time.time() - t0), flush=True)
        a, c = fused_bwd(u, w, bias, dy, cfgs[0]), cur_bwd(u, w, bias, dy, cfgs[0])
        row["fused_vs_cur_rel"] = [rel(x, y) for x, y in zip(a, c)]
        res["rows"].append(row)
        json.dump(res, open(os.path.join(out, "conv-study.json"), "w"), indent=1)


SWEEP_CFGS = [(64, 64, 4), (128, 64, 4), (128, 64, 8), (32, 128, 4), (64, 128, 8), (256, 32, 4), (128, 128, 8)]


def fwd_launch(u, w, bias, cfg):
    b, L, C = u.shape
    bl, bc, nw = cfg
    y = torch.empty((b, L, C), dtype=u.dtype, device=u.device)
    dk._dwconv_silu_fwd[(b, -(-L // bl), -(-C // bc))](u, w, bias, y, L, C, u.stride(0), u.stride(1), K=7,
                                                       HAS_BIAS=True, COMPUTE=compute_dtype(u.dtype), BLOCK_L=bl,
                                                       BLOCK_C=bc, num_warps=nw)
    return y


def sweep():
    out = os.environ.get("OUT", ".")
    t0 = time.time()
    res = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__, rows=[])
    for name in SHAPES:
        b, L, C = SHAPES[name]
        proj = torch.randn(b, L, C + 64, device="cuda", dtype=torch.bfloat16)
        u = proj[..., :C]
        w = torch.randn(C, 7, device="cuda") * 0.3
        bias = torch.randn(C, device="cuda")
        dy = torch.randn(b, L, C, device="cuda", dtype=torch.bfloat16)
        row = dict(shape=name)
        ref = cur_bwd(u, w, bias, dy, SWEEP_CFGS[0])
        for cfg in SWEEP_CFGS:
            row[f"fwd_{cfg}"] = gpu_ms(lambda: fwd_launch(u, w, bias, cfg))
            row[f"bwd_{cfg}"] = gpu_ms(lambda: cur_bwd(u, w, bias, dy, cfg))
            row[f"bwd_gpbf16_{cfg}"] = gpu_ms(lambda: cur_bwd(u, w, bias, dy, cfg, torch.bfloat16))
            got = cur_bwd(u, w, bias, dy, cfg, torch.bfloat16)
            row[f"gpbf16_rel_{cfg}"] = [rel(g, r) for g, r in zip(got, ref)]
        print(json.dumps(row), "%.0fs" % (time.time() - t0), flush=True)
        res["rows"].append(row)
        json.dump(res, open(os.path.join(out, "conv-sweep.json"), "w"), indent=1)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", action="store_true", help="configs and an input-dtype gp buffer of the package's kernels")
    (sweep if ap.parse_args().sweep else candidates)()
