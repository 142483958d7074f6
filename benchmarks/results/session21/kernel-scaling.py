"""Session 21: how each kernel's CUDA time scales with the batch (more programs, same work each), the heads (longer
head loop in the pairs kernel, more programs elsewhere) and the length, at p64 n64 bf16 default configs. On a CUDA machine, from the repository root:

    YOLO_BIMAMBA_AUTOTUNE=0 PYTHONPATH=$PWD OUT=<folder> python3 benchmarks/results/session21/kernel-scaling.py
"""
import json, os, sys
sys.path.insert(0, "benchmarks")
import torch
import profile_gpu as pg
from bench_kernels import _enter_package_without_glue
_enter_package_without_glue()
from yolo_bimamba.ops import triton_op
out = {**pg._device_meta(), "runs": []}
for b, L, h in [(16, 1600, 8), (32, 1600, 8), (64, 1600, 8), (8, 1600, 8), (16, 1600, 16), (16, 3200, 8), (16, 6400, 8)]:
    x, call = pg._op_inputs(b, L, h, 64, 64, torch.bfloat16)
    seg = triton_op.segment_rows(b, h, L, x.device)
    times, n = pg._kernel_times(call)
    rec = dict(b=b, L=L, h=h, seg=seg, nseg=-(-L // seg), total=round(sum(times.values()), 4),
               kernels={k[:40]: round(v, 4) for k, v in times.items() if v > 0.005})
    out["runs"].append(rec); print(json.dumps(rec), flush=True)
    del x, call; torch.cuda.empty_cache()
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "kernel-scaling.json"), "w"), indent=1)
