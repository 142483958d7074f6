"""Session 27: run the op's fwd+bwd a few times at one shape (default configs), for Nsight Compute to pick a launch.

    YOLO_BIMAMBA_AUTOTUNE=0 ncu ... python benchmarks/results/session27/ncu_one.py b16|lm [direction]
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))
import torch  # noqa: E402
from profile_gpu import _op_inputs  # noqa: E402  (puts ROOT on sys.path)
from bench_kernels import _enter_package_without_glue  # noqa: E402

_enter_package_without_glue()
shapes = {"b16": (16, 1600, 8, 64, 64), "b32": (32, 1600, 8, 32, 32), "lm": (8, 8192, 32, 64, 128)}
_x, call = _op_inputs(*shapes[sys.argv[1]], torch.bfloat16)
for _ in range(4):
    call(direction=sys.argv[2] if len(sys.argv) > 2 else "both")
torch.cuda.synchronize()
print("done", sys.argv[1:])
