"""Speed of the fused depthwise conv1d + SiLU (yolo_bimamba.ops.dwconv) against the PyTorch expression it replaces.

    python benchmarks/bench_dwconv.py [--out-dir DIR]     # CUDA; writes DIR/dwconv-<gpu>.json (default benchmarks/results)

Shapes: the convolutions of yolov8n-bimamba at 640 px, batch 32 (P3, P4, P5 layers), and of yolov8s-bimamba's P3.
Inputs as the modules see them under bf16 AMP: a bf16 slice of the in-projection's output, fp32 weights.
  torch  F.silu(F.conv1d(u.transpose(1, 2), w, b, groups=c).transpose(1, 2)) under autocast, as the module ran before;
  fused  dwconv_silu(u, w, b) (Triton).
fwd+bwd = forward + torch.autograd.grad of u, w, b. Times: median ms, ordinary launches (wall) and GPU time (CUDA graph
replay), with bench_kernels' timers; peak memory above the inputs.
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

SHAPES = {"n_p3": (32, 6400, 128), "n_p4": (32, 1600, 192), "n_p5": (32, 400, 320), "s_p3": (32, 6400, 256)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--budget", type=float, default=1.0, help="seconds per timing")
    args = ap.parse_args()
    import triton

    rows = []
    for name, (b, L, C) in SHAPES.items():
        big = torch.randn(b, L, C + 64, device="cuda", dtype=torch.bfloat16)
        u = big[:, :, 32:32 + C].requires_grad_()
        w = (torch.randn(C, 1, 7, device="cuda") / 7 ** 0.5).requires_grad_()
        bias = torch.randn(C, device="cuda").requires_grad_()
        dy = torch.randn(b, L, C, device="cuda", dtype=torch.bfloat16)

        def torch_fwd():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return dwconv_silu_reference(u, w, bias)

        def fused_fwd():
            return dwconv_silu(u, w, bias, backend="triton")

        for case, fwd in (("torch", torch_fwd), ("fused", fused_fwd)):
            def fwd_bwd(fwd=fwd):
                return torch.autograd.grad(fwd(), (u, w, bias), dy)

            for mode, call in (("fwd", fwd), ("fwd+bwd", fwd_bwd)):
                wall, _ = time_wall(call, "cuda", args.budget)
                gpu = time_graph(call, args.budget)
                peak, _ = peak_memory(call, "cuda")
                rows.append(dict(shape=name, b=b, L=L, C=C, case=case, mode=mode, wall_ms=round(wall, 4),
                                 gpu_ms=round(gpu, 4), peak_mb=round(peak / 2**20, 1)))
                print(rows[-1], flush=True)
    out = {"meta": dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                        python=platform.python_version(), command=" ".join(sys.argv)), "rows": rows}
    tag = "".join(c if c.isalnum() else "-" for c in torch.cuda.get_device_name().lower().replace("nvidia", "").strip())
    path = Path(args.out_dir) / f"dwconv-{tag.strip('-')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print("| shape | mode | torch wall / GPU ms | fused wall / GPU ms | GPU speed-up |")
    print("|---|---|---|---|---:|")
    for name in SHAPES:
        for mode in ("fwd", "fwd+bwd"):
            t, f = (next(r for r in rows if r["shape"] == name and r["mode"] == mode and r["case"] == c)
                    for c in ("torch", "fused"))
            print(f"| {name} | {mode} | {t['wall_ms']} / {t['gpu_ms']} | {f['wall_ms']} / {f['gpu_ms']} | "
                  f"{t['gpu_ms'] / f['gpu_ms']:.2f}x |")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
