"""Where the GPU time goes: per-kernel CUDA time of the bidirectional SSD op, and the share of the op in a model step.

    python benchmarks/profile_gpu.py kernels [--out FILE.json]   # torch.profiler over fwd+bwd at the benchmark shapes
    python benchmarks/profile_gpu.py model [--out FILE.json]     # yolov8{n,s}-bimamba step (needs Ultralytics)
    python benchmarks/profile_gpu.py host [--host-shape b,L,h,p,n]  # host (Python) cost of one op call, cProfile
    python benchmarks/profile_gpu.py host-parts [--host-shapes "b,L,h,p,n;..."]  # that host time, part by part

``kernels``: for each shape and each segmentation (programs per SM), the CUDA time of every kernel per fwd+bwd
call, summed over its launches, and the total. ``model``: one training step of the detection model (640 px,
batch 32, bf16 AMP) under the profiler: CUDA time of our kernels, of the rest, and the op's call shapes; the
step's host time (until it returns) and wall time (to a sync), and the host self time of the top ops.
Figures are medians of several profiled iterations; they are for finding the cost, the benchmark reports the
targets.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _kernel_times(fn, iters=5):
    """Median over ``iters`` profiled calls of fn: {kernel name: CUDA ms per call} and the number of launches."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    per_iter = []
    for _ in range(iters):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        acc = defaultdict(float)
        n = 0
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                us = ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
                acc[ev.name] += us / 1e3
                n += 1
        per_iter.append((dict(acc), n))
    names = set().union(*(d for d, _ in per_iter))
    med = {k: statistics.median(d.get(k, 0.0) for d, _ in per_iter) for k in names}
    return dict(sorted(med.items(), key=lambda kv: -kv[1])), statistics.median(n for _, n in per_iter)


def _host_and_wall(fn, iters=10):
    """Median ms of fn's host part (until it returns, GPU idle at the start) and of its wall time (to a sync)."""
    import time

    host, wall = [], []
    for _ in range(iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        host.append((t1 - t0) * 1e3)
        wall.append((t2 - t0) * 1e3)
    return round(statistics.median(host), 3), round(statistics.median(wall), 3)


def _cpu_self_times(fn, iters=3):
    """{op name: host self time in ms per call} of fn under the profiler (CPU activity), largest first."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    rows = {e.key: e.self_cpu_time_total / 1e3 / iters for e in prof.key_averages()}
    return {k: round(v, 3) for k, v in sorted(rows.items(), key=lambda kv: -kv[1])[:40]}


def _device_meta():
    """What every JSON of this script names: the GPU, torch and triton versions."""
    import triton

    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}


def _op_inputs(b, L, h, p, n, dtype, g=1):
    """Inputs of one fwd+bwd call on the GPU (ngroups g) and a function that runs it: call(**bi_ssd keywords)."""
    from yolo_bimamba.ops import bi_ssd

    torch.manual_seed(0)
    dev = "cuda"
    x = torch.randn(b, L, h, p, device=dev, dtype=dtype, requires_grad=True)
    dt = (torch.rand(b, L, h, device=dev) - 3.0).to(dtype).requires_grad_()
    A = (-torch.rand(h, device=dev) * 2 - 0.5).requires_grad_()
    B = torch.randn(b, L, g, n, device=dev, dtype=dtype, requires_grad=True)
    C = torch.randn(b, L, g, n, device=dev, dtype=dtype, requires_grad=True)
    D = torch.ones(h, device=dev, requires_grad=True)
    bias = torch.zeros(h, device=dev, requires_grad=True)
    dy = torch.randn_like(x)

    def call(**kw):
        y = bi_ssd(x, dt, A, B, C, D=D, dt_bias=bias, dt_softplus=True, backend="triton", **kw)
        torch.autograd.grad(y, (x, dt, A, B, C, D, bias), dy)

    call.inputs, call.dy = (x, dt, A, B, C, D, bias), dy  # for host_parts
    return x, call


def kernels(args):
    from bench_kernels import _enter_package_without_glue

    _enter_package_without_glue()
    from yolo_bimamba import config
    from yolo_bimamba.ops.bi_ssd import autograd, tuning

    shapes = [  # (name, b, L, h, p, n)
        ("b16_L1600_h8_p64_n64", 16, 1600, 8, 64, 64),
        ("b16_L1600_h8_p32_n32", 16, 1600, 8, 32, 32),
        ("b32_L400_h8_p32_n32", 32, 400, 8, 32, 32),
        # yolov8n-bimamba's own calls at 640 px, batch 32 (P4 and P3 layers)
        ("b32_L1600_h4_p32_n32", 32, 1600, 4, 32, 32),
        ("b32_L6400_h2_p32_n32", 32, 6400, 2, 32, 32),
        # yolov8s-bimamba's (P5, P4, P3)
        ("b32_L400_h16_p32_n32", 32, 400, 16, 32, 32),
        ("b32_L1600_h8_p32_n32", 32, 1600, 8, 32, 32),
        ("b32_L6400_h4_p32_n32", 32, 6400, 4, 32, 32),
        ("lm_b8_L8192_h32_p64_n128", 8, 8192, 32, 64, 128),
    ]
    unknown = set(args.shapes.split(",")) - {s[0] for s in shapes} if args.shapes else set()
    if unknown:
        raise SystemExit(f"profile_gpu.py kernels: unknown --shapes {sorted(unknown)}; known: {[s[0] for s in shapes]}")
    pps_list = [float(v) for v in args.pps.split(",")]
    out = {**_device_meta(), "runs": []}
    for (name, b, L, h, p, n), groups in [(s, gr) for s in shapes for gr in args.groups.split(",")]:
        if args.shapes and name not in args.shapes.split(","):
            continue
        g = h if groups == "h" else int(groups)
        x, call = _op_inputs(b, L, h, p, n, _DTYPES[args.dtype], g)
        ints = lambda v: [int(c) for c in v.split(",")] if v else [None]  # noqa: E731
        variants = [(d, pps, prec, cfg, split, fcfg, scfg, pcfg, fh, pa, fa, ba)
                    for d in args.directions.split(",") for pps in pps_list
                    for prec in (args.prec.split(";") if args.prec else [None])
                    for cfg in ints(args.bwd_cfgs)
                    for split in ([bool(int(v)) for v in args.splits.split(",")] if args.splits else [None])
                    for fcfg in ints(args.fwd_cfgs) for scfg in ints(args.state_cfgs)
                    for pcfg in ints(getattr(args, "pairs_cfgs", "")) for fh in ints(getattr(args, "fwd_heads", ""))
                    for pa in ints(getattr(args, "pairs_ahead", "")) for fa in ints(getattr(args, "fwd_ahead", ""))
                    for ba in ints(getattr(args, "bwd_ahead", ""))]
        orig_prec = autograd._dot_precisions
        for direction, pps, prec, cfg, split, fcfg, scfg, pcfg, fh, pa, fa, ba in variants:
            config.PROGRAMS_PER_SM = pps
            if prec:
                autograd._dot_precisions = lambda x, prec=prec: dict(zip(autograd.DOT_CLASSES, prec.split(",")))
            else:
                autograd._dot_precisions = orig_prec

            step = functools.partial(call, direction=direction)
            seg = tuning.segment_rows(b, h, L, x.device)
            forced = dict(bwd=cfg, split=split, fwd=fcfg, state=scfg)
            if pcfg is not None:  # (absent before the in-chunk pairs kernel: A/B runs against older commits)
                forced["pairs"] = pcfg
            if fh is not None:  # (absent before the forward pairs kernel walked a group's heads)
                forced["fwd_heads"] = fh
            if pa is not None:  # (absent before the backward pairs kernel's AHEAD)
                forced["pairs_ahead"] = pa
            if fa is not None:  # (absent before the forward's loads ahead)
                forced["fwd_ahead"] = fa
            if ba is not None:  # (absent before the backward segment kernel's AHEAD bits)
                forced["bwd_ahead"] = ba
            with tuning.force_config(**forced):
                times, launches = _kernel_times(step)
            total = sum(times.values())
            rec = {"shape": name, "ngroups": g, "dtype": args.dtype, "direction": direction, "programs_per_sm": pps,
                   "dot_prec": prec, "bwd_cfg": cfg,
                   "fwd_cfg": fcfg, "state_cfg": scfg, "pairs_cfg": pcfg, "fwd_heads": fh,
                   "pairs_ahead": pa, "fwd_ahead": fa, "bwd_ahead": ba, "split": split,
                   "seg_rows": seg,
                   "nseg": -(-L // seg),
                   "total_ms": round(total, 4),
                   "launches": launches,
                   "kernels_ms": {k: round(v, 4) for k, v in times.items()}}
            out["runs"].append(rec)
            top = ", ".join(f"{k[:40]}={v:.3f}" for k, v in list(times.items())[:6])
            print(f"{name} g{g} {direction} pps={pps} prec={prec} fwd={fcfg} bwd={cfg} state={scfg} pairs={pcfg} "
                  f"fwd_heads={fh} pairs_ahead={pa} fwd_ahead={fa} bwd_ahead={ba} "
                  f"split={split} seg={seg}: "
                  f"total {total:.3f} ms, "
                  f"{launches} launches; {top}", flush=True)
        autograd._dot_precisions = orig_prec
        del x, call
        torch.cuda.empty_cache()
    config.PROGRAMS_PER_SM = 4.0
    return out


def model(args):
    os.environ.setdefault("YOLO_OFFLINE", "1")
    from bench_train import PRECISIONS, make_batch
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import DetectionModel

    import yolo_bimamba.nn.bimamba2 as bm

    calls = defaultdict(int)
    orig = bm.bi_ssd

    out = {**_device_meta(), "precision": args.precision,
           "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("YOLO_BIMAMBA_")}, "runs": []}
    for yaml in args.models.split(","):
        dev = torch.device("cuda")
        torch.manual_seed(0)
        m = DetectionModel(yaml, nc=80, verbose=False).to(dev).train()
        m.args = get_cfg()
        opt = torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)
        batch = make_batch(32, 640, dev)
        dtype = PRECISIONS[args.precision]

        def step():
            with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
                loss = m(batch)[0].sum()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        # the op's call shapes in one forward
        calls.clear()

        def spy(x, *a, **k):
            calls[(tuple(x.shape), tuple(a[2].shape) if len(a) > 2 else None)] += 1
            return orig(x, *a, **k)

        bm.bi_ssd = spy
        for _ in range(3):
            step()
        calls.clear()
        step()
        bm.bi_ssd = orig
        times, launches = _kernel_times(step, iters=3)
        host, wall = _host_and_wall(step)
        cpu_ops = _cpu_self_times(step)
        ours = {k: v for k, v in times.items() if "bi_ssd" in k}
        total = sum(times.values())
        rec = {"model": yaml, "precision": args.precision, "cuda_total_ms": round(total, 3), "launches": launches,
               "bi_ssd_ms": round(sum(ours.values()), 3),
               "bi_ssd_kernels_ms": {k: round(v, 3) for k, v in ours.items()},
               "top_kernels_ms": {k: round(v, 3) for k, v in list(times.items())[:25]},
               "op_calls": {str(k): v for k, v in calls.items()},
               "host_ms_median": host, "wall_ms_median": wall, "top_cpu_self_ms": cpu_ops}
        out["runs"].append(rec)
        print(json.dumps({k: rec[k] for k in ("model", "cuda_total_ms", "launches", "bi_ssd_ms", "op_calls",
                                              "host_ms_median", "wall_ms_median")}),
              flush=True)
        for k, v in list(times.items())[:25]:
            print(f"   {v:8.3f}  {k[:110]}")
        print("   host (CPU) self time per step, top ops:")
        for k, v in list(cpu_ops.items())[:25]:
            print(f"   {v:8.3f}  {k[:110]}")
        m = opt = None  # free this model before the next (rebinding, not del: step() closes over the names)
        torch.cuda.empty_cache()
    return out


def host(args):
    """Host (Python) cost of one fwd+bwd call of the op at a model-sized shape: the wall time per call when the GPU
    keeps up, and cProfile's top functions (cumulative), to see what the launch path spends."""
    import cProfile
    import io
    import pstats
    import time

    from bench_kernels import _enter_package_without_glue

    _enter_package_without_glue()
    b, L, h, p, n = (int(v) for v in args.host_shape.split(","))
    dtype = _DTYPES[args.precision]
    _, call = _op_inputs(b, L, h, p, n, dtype)

    for _ in range(5):
        call()
    torch.cuda.synchronize()
    gpu = sum(_kernel_times(call)[0].values())
    reps = 200
    t0 = time.perf_counter()
    for _ in range(reps):
        call()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(50):
        call()
    prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(45)
    from yolo_bimamba import config
    from yolo_bimamba.ops import launch

    rec = {"shape": [b, L, h, p, n], "precision": args.precision, "direct_launch": config.DIRECT_LAUNCH,
           "launches": dict(launch.counts), "gpu_ms_per_call": round(gpu, 4),
           "host_ms_per_call": round((t1 - t0) * 1e3 / reps, 4), "wall_ms_per_call": round((t2 - t0) * 1e3 / reps, 4),
           "cprofile_top": buf.getvalue().splitlines()[:80]}
    print(json.dumps({k: v for k, v in rec.items() if k != "cprofile_top"}), flush=True)
    print("\n".join(rec["cprofile_top"]))
    return {**_device_meta(), "runs": [rec]}


def _host_ms(fn, reps=200, rounds=5):
    """Median over rounds of the host time per call of ``reps`` back-to-back calls (the GPU idle at each start)."""
    import time

    out = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        out.append((time.perf_counter() - t0) / reps * 1e3)
    torch.cuda.synchronize()
    return round(statistics.median(out), 4)


def host_parts(args):
    """Where the host time of one fwd+bwd call goes: the whole call, the forward alone, the call's Triton launches
    replayed through ops.launch (and their keys alone, and Triton's launcher alone), 12 allocations, the backward's
    torch reductions, and an empty autograd.Function with the same inputs. Host time only: where the GPU is slower
    than the host (large shapes) the figures are the GPU's."""
    from bench_kernels import _enter_package_without_glue

    _enter_package_without_glue()
    from yolo_bimamba.ops import bi_ssd, launch as launch_mod
    from yolo_bimamba.ops.bi_ssd import autograd

    dtype = _DTYPES[args.precision]
    runs = []
    for shape in args.host_shapes.split(";"):
        b, L, h, p, n = (int(v) for v in shape.split(","))
        _, call = _op_inputs(b, L, h, p, n, dtype)
        ins, dy = call.inputs, call.dy
        x, dt, A, B, C, D, bias = ins
        for _ in range(10):
            call()
        rec = {"shape": [b, L, h, p, n], "precision": args.precision, "whole_call": _host_ms(call)}

        def fwd_only():
            with torch.no_grad():
                bi_ssd(x, dt, A, B, C, D=D, dt_bias=bias, dt_softplus=True, backend="triton")

        rec["forward_no_grad"] = _host_ms(fwd_only)
        launches = []  # (fn, grid, args, kwargs) of every Triton launch of one call
        real = autograd.launch

        def recording(*t):
            launches.append(t)
            return real(*t)

        autograd.launch = recording
        try:
            call()
        finally:
            autograd.launch = real
        torch.cuda.synchronize()
        rec["triton_launches"] = len(launches)
        rec["launches_replayed"] = _host_ms(lambda: [launch_mod.launch(*t) for t in launches])
        dev = torch.cuda.current_device()

        def key(fn, _grid, a, kw):  # ops.launch's key of a launch
            return launch_mod.cache_key(fn, dev, a, kw)

        rec["launch_keys"] = _host_ms(lambda: [launch_mod._kept.get(key(*t)) for t in launches])
        kept = [launch_mod._kept.get(key(*t)) for t in launches]
        if all(k is not None for k in kept):
            def raw():
                stream = torch._C._cuda_getCurrentRawStream(dev)
                for (_fn, kernel, tail, _spec), (_f, grid, a, _kw) in zip(kept, launches):
                    g = tuple(grid) + (1, 1)
                    kernel.run(g[0], g[1], g[2], stream, kernel.function, kernel.packed_metadata, None, None, None,
                               *a, *tail)

            rec["triton_launcher"] = _host_ms(raw)
        rec["12_allocations"] = _host_ms(lambda: [torch.empty((b * h, 6, L), device="cuda") for _ in range(12)])
        part, part_d = torch.randn(b, h, 2, device="cuda"), torch.randn(b, h, 2, p, device="cuda")

        def reductions():  # as the op's backward does them
            tot = part.sum(0)
            tot[:, 0].to(torch.float32), tot[:, 1].to(torch.float32)
            part_d.sum((0, 2)).sum(1)

        rec["torch_reductions"] = _host_ms(reductions)

        class Empty(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *a):
                ctx.save_for_backward(*a)
                return torch.empty_like(a[0])

            @staticmethod
            def backward(ctx, gy):
                return tuple(torch.empty_like(t) for t in ctx.saved_tensors)

        rec["empty_autograd_function"] = _host_ms(lambda: torch.autograd.grad(Empty.apply(*ins), ins, dy))
        print(json.dumps(rec), flush=True)
        runs.append(rec)
    return {**_device_meta(), "autotune": os.environ.get("YOLO_BIMAMBA_AUTOTUNE", "1"), "runs": runs}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["kernels", "model", "host", "host-parts"])
    ap.add_argument("--out", default=None)
    ap.add_argument("--pps", default="4", help="kernels: programs per SM values, comma separated")
    ap.add_argument("--directions", default="both,forward", help="kernels: directions, comma separated")
    ap.add_argument("--prec", default="",
                    help="kernels: backward dot precisions, ST,RD,MID,IN,LO;... (see autograd._dot_precisions)")
    ap.add_argument("--bwd-cfgs", default="", help="kernels: forced backward configs, comma separated")
    ap.add_argument("--fwd-cfgs", default="", help="kernels: forced forward configs, comma separated")
    ap.add_argument("--state-cfgs", default="", help="kernels: forced state-kernel configs, comma separated")
    ap.add_argument("--pairs-cfgs", default="", help="kernels: forced in-chunk pairs kernel configs, comma separated")
    ap.add_argument("--fwd-heads", default="", help="kernels: forced heads per program of the forward's in-chunk "
                    "pairs kernel, comma separated")
    ap.add_argument("--pairs-ahead", default="", help="kernels: forced AHEAD bits of the backward's in-chunk pairs "
                    "kernel (0-3), comma separated")
    ap.add_argument("--fwd-ahead", default="", help="kernels: forced AHEAD bits of the forward kernel "
                    "(tuning.fwd_ahead_bits, 0-3), comma separated")
    ap.add_argument("--bwd-ahead", default="", help="kernels: forced AHEAD bits of the backward segment kernel "
                    "(tuning.bwd_ahead_bits, 0-7), comma separated")
    ap.add_argument("--splits", default="",
                    help="kernels: backward directions in two launches (1) or one (0), e.g. 1,0")
    ap.add_argument("--shapes", default="", help="kernels: shape names, comma separated (default all)")
    ap.add_argument("--groups", default="1", help="kernels: ngroups values, comma separated (h: one per head)")
    ap.add_argument("--dtype", default="bf16", choices=list(_DTYPES), help="kernels: the inputs' dtype")
    ap.add_argument("--models", default="yolov8n-bimamba.yaml,yolov8n.yaml")
    ap.add_argument("--precision", default="bf16", choices=list(_DTYPES))
    ap.add_argument("--host-shape", default="32,400,4,64,64", help="host: b,L,h,p,n")
    ap.add_argument("--host-shapes", default="16,400,8,64,64;16,1600,8,64,64;32,400,8,32,32",
                    help="host-parts: b,L,h,p,n;...")
    args = ap.parse_args()
    res = {"kernels": kernels, "model": model, "host": host, "host-parts": host_parts}[args.what](args)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1))
        print("wrote", args.out)


if __name__ == "__main__":
    main()
