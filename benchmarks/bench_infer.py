"""Inference latency of detection models on one GPU: eager and CUDA-graph replay (``yolo_bimamba.graph_inference``).

    python benchmarks/bench_infer.py                                   # default models, batch 1/8/32, fp16 and fp32
    python benchmarks/bench_infer.py --models yolov8n.yaml yolov8n-bimamba.yaml --batch 1 32 --precisions fp16

Every model is built from its YAML (80 classes, random weights: latency does not depend on them), fused (Conv+BN)
and put in eval mode, as ``yolo predict`` runs it, at ``--imgsz`` px. For each model, batch and precision the eager
forward and the graph replay are timed in alternating rounds (``--rounds``), each the median of ``--reps`` calls
with the GPU synchronised after each call (a call's wall time, host included: what a caller waits for). The ratio
columns divide by the first model's time (the baseline) at the same batch, precision and mode, measured in the same
run. Memory: the GPU memory reserved after the warm-up (eager; graph pools of the layers' inference replay
included, the caching allocator's unused blocks released) and its peak. ``--eval-max-numel`` sets
``YOLO_BIMAMBA_EVAL_GRAPH_MAX_NUMEL`` (the largest layer input that replays a graph) for the run. Writes
``infer.json`` and ``infer.md`` to ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

os.environ.setdefault("YOLO_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODELS = ["yolov8n.yaml", "yolov8n-bimamba-p5.yaml", "yolov8n-bimamba.yaml", "yolo11n.yaml", "yolo26n.yaml"]
DTYPES = {"fp16": torch.float16, "fp32": torch.float32}


def build(yaml: str, device) -> torch.nn.Module:
    import yolo_bimamba  # noqa: F401  (registers our blocks and YAML names)
    from ultralytics import YOLO

    model = YOLO(yaml).model
    return model.fuse().eval().to(device)


def time_calls(fn, x, reps: int) -> float:
    """Median wall time in ms of ``fn(x)`` with the GPU synchronised after each call."""
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(x)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def bench_model(model, batch: int, imgsz: int, dtype, reps: int, rounds: int, warmup: int = 10) -> dict:
    from yolo_bimamba import graph_inference

    model = model.to(dtype)
    x = torch.rand(batch, 3, imgsz, imgsz, device="cuda", dtype=dtype)
    out: dict = {"eager": [], "graph": []}
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    with torch.inference_mode():
        for _ in range(warmup):
            model(x)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        mem = {"reserved_mb": torch.cuda.memory_reserved() / 2**20,
               "peak_reserved_mb": torch.cuda.max_memory_reserved() / 2**20}
        for _ in range(rounds):
            out["eager"].append(time_calls(model, x, reps))
            with graph_inference(model) as g:
                for _ in range(3):  # the capture and its warm-up are not timed
                    model(x)
                torch.cuda.synchronize()
                out["graph"].append(time_calls(model, x, reps))
                if not g.graphs:
                    out["graph_failed"] = True
    return {k: (statistics.median(v) if isinstance(v, list) else v) for k, v in out.items()} | mem | {
        "eager_rounds": out["eager"], "graph_rounds": out["graph"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=MODELS, help="model YAMLs; the first is the baseline of the ratios")
    ap.add_argument("--batch", nargs="+", type=int, default=[1, 8, 32])
    ap.add_argument("--precisions", nargs="+", default=["fp16", "fp32"], choices=list(DTYPES))
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--eval-max-numel", type=int, default=None,
                    help="YOLO_BIMAMBA_EVAL_GRAPH_MAX_NUMEL for this run (default: the environment's, else 2^20)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "out"))
    args = ap.parse_args()
    if args.eval_max_numel is not None:
        os.environ["YOLO_BIMAMBA_EVAL_GRAPH_MAX_NUMEL"] = str(args.eval_max_numel)
    if not torch.cuda.is_available():
        sys.exit("bench_infer.py needs a CUDA GPU")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import ultralytics
    import triton

    rows = []
    for name in args.models:
        model = build(name, "cuda")
        params = sum(p.numel() for p in model.parameters())
        for prec in args.precisions:
            for b in args.batch:
                r = bench_model(model, b, args.imgsz, DTYPES[prec], args.reps, args.rounds)
                rows.append({"model": name, "params": params, "precision": prec, "batch": b, **r})
                print(f"{name:28s} {prec} b{b:<3d} eager {r['eager']:7.2f} ms  graph {r['graph']:7.2f} ms  "
                      f"reserved {r['reserved_mb']:7.0f} MB (peak {r['peak_reserved_mb']:.0f})", flush=True)
        del model
        torch.cuda.empty_cache()
    base = {(r["precision"], r["batch"]): r for r in rows if r["model"] == args.models[0]}
    for r in rows:
        b = base[(r["precision"], r["batch"])]
        r["eager_ratio"], r["graph_ratio"] = r["eager"] / b["eager"], r["graph"] / b["graph"]
        r["graph_vs_base_eager"] = r["graph"] / b["eager"]
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "ultralytics": ultralytics.__version__, "imgsz": args.imgsz, "reps": args.reps, "rounds": args.rounds,
            "commit": os.environ.get("GIT_COMMIT", ""),
            "eval_max_numel": os.environ.get("YOLO_BIMAMBA_EVAL_GRAPH_MAX_NUMEL", "")}
    (out / "infer.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [f"{meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}, Ultralytics {meta['ultralytics']}, "
             f"{args.imgsz} px, fused, median of {args.rounds} rounds x {args.reps} calls; ratios to {args.models[0]}; "
             f"YOLO_BIMAMBA_EVAL_GRAPH_MAX_NUMEL={meta['eval_max_numel'] or 'default'}",
             "", "| model | prec | batch | eager ms | / base | graph ms | / base graph | / base eager | reserved MB |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['model']} | {r['precision']} | {r['batch']} | {r['eager']:.2f} | {r['eager_ratio']:.2f} | "
              f"{r['graph']:.2f} | {r['graph_ratio']:.2f} | {r['graph_vs_base_eager']:.2f} | {r['reserved_mb']:.0f} |"
              for r in rows]
    (out / "infer.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
