"""Speed of the fused block ops against the PyTorch expressions they replace, at the shapes of the detection models.

    python benchmarks/bench_block_ops.py [--out-dir DIR]   # CUDA; writes DIR/block-ops-<gpu>.json (default benchmarks/out)

Ops (inputs as the modules see them under bf16 AMP: bf16 activations, slices of the in-projection's output, fp32
weights):
  conv  depthwise conv1d + SiLU. torch: F.silu(F.conv1d(u.transpose(1, 2), w, b, groups=c).transpose(1, 2)) under
        autocast, as the modules ran before; fused: ops.dwconv.dwconv_silu (Triton).
  norm  gated RMSNorm rmsnorm(x * silu(z)) * w in fp32. torch: the expression nn.RMSNormGated ran before; fused:
        ops.gated_norm.gated_rmsnorm (Triton).
Shapes: yolov8n-bimamba at 640 px, batch 32 (P3, P4, P5 layers), and yolov8s-bimamba's P3.
fwd+bwd = forward + torch.autograd.grad of every input. Times: median ms, ordinary launches (wall) and GPU time (CUDA
graph replay), with bench_kernels' timers; peak memory above the inputs.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_kernels import peak_memory, time_graph, time_wall  # noqa: E402  (also enters the package)

from yolo_bimamba.ops.dwconv import dwconv_silu, dwconv_silu_reference  # noqa: E402
from yolo_bimamba.ops.gated_norm import gated_rmsnorm, gated_rmsnorm_reference  # noqa: E402

# (b, L, conv channels, d_inner) of each layer
SHAPES = {"n_p3": (32, 6400, 128, 64), "n_p4": (32, 1600, 192, 128), "n_p5": (32, 400, 320, 256),
          "s_p3": (32, 6400, 256, 128)}


def conv_case(b, L, C):
    big = torch.randn(b, L, C + 64, device="cuda", dtype=torch.bfloat16)
    u = big[:, :, 32:32 + C].requires_grad_()
    w = (torch.randn(C, 1, 7, device="cuda") / 7 ** 0.5).requires_grad_()
    bias = torch.randn(C, device="cuda").requires_grad_()

    def torch_fwd():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return dwconv_silu_reference(u, w, bias)

    return (u, w, bias), torch_fwd, lambda: dwconv_silu(u, w, bias, backend="triton")


def norm_case(b, L, d):
    big = torch.randn(b, L, 3 * d, device="cuda", dtype=torch.bfloat16)
    z = big[:, :, :d].requires_grad_()
    x = torch.randn(b, L, d, device="cuda", dtype=torch.bfloat16).requires_grad_()
    w = torch.ones(d, device="cuda").requires_grad_()
    return ((x, z, w), lambda: gated_rmsnorm_reference(x, z, w, 1e-5),
            lambda: gated_rmsnorm(x, z, w, 1e-5, backend="triton"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "out"))
    ap.add_argument("--budget", type=float, default=1.0, help="seconds per timing")
    args = ap.parse_args()
    import triton

    rows = []
    for name, (b, L, C, d) in SHAPES.items():
        for op, (leaves, torch_fwd, fused_fwd) in (("conv", conv_case(b, L, C)), ("norm", norm_case(b, L, d))):
            dy = torch.randn_like(torch_fwd())
            for case, fwd in (("torch", torch_fwd), ("fused", fused_fwd)):
                def fwd_bwd(fwd=fwd, leaves=leaves, dy=dy):
                    return torch.autograd.grad(fwd(), leaves, dy)

                for mode, call in (("fwd", fwd), ("fwd+bwd", fwd_bwd)):
                    wall, _ = time_wall(call, "cuda", args.budget)
                    gpu = time_graph(call, args.budget)
                    peak, _ = peak_memory(call, "cuda")
                    rows.append(dict(op=op, shape=name, b=b, L=L, channels=C if op == "conv" else d, case=case,
                                     mode=mode, wall_ms=round(wall, 4), gpu_ms=round(gpu, 4),
                                     peak_mb=round(peak / 2**20, 1)))
                    print(rows[-1], flush=True)
    out = {"meta": dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                        python=platform.python_version(), command=" ".join(sys.argv)), "rows": rows}
    tag = "".join(c if c.isalnum() else "-" for c in torch.cuda.get_device_name().lower().replace("nvidia", "").strip())
    path = Path(args.out_dir) / f"block-ops-{tag.strip('-')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print("| op | shape | mode | torch wall / GPU ms | fused wall / GPU ms | GPU speed-up | peak MB torch / fused |")
    print("|---|---|---|---|---|---:|---|")
    for op in ("conv", "norm"):
        for name in SHAPES:
            for mode in ("fwd", "fwd+bwd"):
                t, f = (next(r for r in rows if r["op"] == op and r["shape"] == name and r["mode"] == mode
                             and r["case"] == c) for c in ("torch", "fused"))
                print(f"| {op} | {name} | {mode} | {t['wall_ms']} / {t['gpu_ms']} | {f['wall_ms']} / {f['gpu_ms']} | "
                      f"{t['gpu_ms'] / f['gpu_ms']:.2f}x | {t['peak_mb']} / {f['peak_mb']} |")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
