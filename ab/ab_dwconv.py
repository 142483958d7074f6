"""A/B of the depthwise conv's input-gradient kernel on a GPU: the per-tile kernel (7 tap loads and 7 row
reductions per tile) vs the span kernel (3D tap loads, dw accumulated over a span), at the detection models'
shapes. Also the whole fused op (fwd+bwd, CUDA graph) with the default span."""
import json, sys, os
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import torch, triton, triton.testing
import triton.language as tl
tl_f32 = tl.float32
from yolo_bimamba.ops import dwconv as dw
from yolo_bimamba.ops import dwconv_kernels as k
from bench_kernels import time_graph

SHAPES = {"n_p3": (32, 6400, 128), "n_p4": (32, 1600, 192), "n_p5": (32, 400, 320),
          "s_p3": (32, 6400, 192), "s_p4": (32, 1600, 320), "s_p5": (32, 400, 576)}
out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__, "rows": []}
for name, (b, L, C) in SHAPES.items():
    big = torch.randn(b, L, C + 64, device="cuda", dtype=torch.bfloat16)
    u = big[:, :, 32:32 + C]
    w = (torch.randn(C, 7, device="cuda") / 7 ** 0.5)
    bias = torch.randn(C, device="cuda")
    dy = torch.randn(b, L, C, device="cuda", dtype=torch.bfloat16)
    bl, bc, nw = dw._config(C)
    nlb = -(-L // bl)
    gp = torch.empty(b, L, C, device="cuda")
    dbp = torch.empty(b * nlb, C, device="cuda")
    pre = lambda: k._dwconv_silu_bwd_pre[(b, nlb, -(-C // bc))](u, w, bias, dy, gp, dbp, L, C, u.stride(0), u.stride(1), K=7, HAS_BIAS=True, COMPUTE=tl_f32, BLOCK_L=bl, BLOCK_C=bc, num_warps=nw)
    pre()
    du = torch.empty_like(dy)
    dwp_old = torch.empty(b * nlb, 7, C, device="cuda")
    old = lambda: k._dwconv_silu_bwd_in_tiles[(b, nlb, -(-C // bc))](u, w, gp, du, dwp_old, L, C, u.stride(0), u.stride(1), K=7, COMPUTE=tl_f32, BLOCK_L=bl, BLOCK_C=bc, num_warps=nw)
    old(); ref_du = du.clone(); ref_dw = dwp_old.sum(0)
    row = {"shape": name, "b": b, "L": L, "C": C, "cfg": [bl, bc, nw],
           "pre_ms": triton.testing.do_bench(pre, return_mode="median"),
           "in_tiles_ms": triton.testing.do_bench(old, return_mode="median")}
    for sb in (1, 2, 4, 8, 16):
        dw.SPAN_BLOCKS = sb
        span, sub = dw._in_tiles(bl, bc, nw, 7)
        ns = -(-L // span)
        dwp = torch.empty(ns * b, 7, C, device="cuda")
        new = lambda: k._dwconv_silu_bwd_in[(b, ns, -(-C // bc))](u, w, gp, du, dwp, L, C, u.stride(0), u.stride(1), K=7, KP=8, COMPUTE=tl_f32, SPAN=span, BLOCK_C=bc, SUB=sub, num_warps=nw)
        new()
        err_du = ((du.float() - ref_du.float()).abs().max() / ref_du.float().abs().max()).item()
        err_dw = ((dwp.sum(0) - ref_dw).abs().max() / ref_dw.abs().max()).item()
        row[f"in_span{sb}_ms"] = triton.testing.do_bench(new, return_mode="median")
        row[f"in_span{sb}_err"] = [err_du, err_dw]
    dw.SPAN_BLOCKS = 2
    uu = u.detach().requires_grad_(); ww = w.view(C, 1, 7).clone().requires_grad_(); bb = bias.clone().requires_grad_()
    call = lambda: torch.autograd.grad(dw.dwconv_silu(uu, ww, bb, backend="triton"), (uu, ww, bb), dy)
    row["op_fwd_bwd_graph_ms"] = time_graph(call, 0.5)
    print(json.dumps({kk: (round(v, 4) if isinstance(v, float) else v) for kk, v in row.items()}), flush=True)
    out["rows"].append(row)
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "ab-dwconv.json"), "w"), indent=1)
