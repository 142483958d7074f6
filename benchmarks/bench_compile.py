"""torch.compile against eager: the training step of a BiMamba detector on a CUDA GPU.

The model step of bench_train.py (forward, loss, backward, clip, optimizer step on a fixed batch, 640 px, batch 32)
with the model's forward run eager (CUDA-graph replay of the BiMamba layers on and off) and compiled with
``torch.compile(model, mode=M)`` for each ``--compile-modes`` M (Inductor; the blocks then call our custom ops, which
run the Triton kernels, and the layers do not replay their own CUDA graphs; ``reduce-overhead``, which Ultralytics
takes as ``compile=reduce-overhead``, replays Inductor's graphs as CUDA graphs instead). The loss (Ultralytics' assigner, data-dependent) runs eager after the compiled
forward, as it would in a trainer that compiles the model. Also counts the compiled forward's graph breaks
(torch._dynamo.explain). Target: compiled step time <= the eager one (speed-up >= 1.0x).

    python benchmarks/bench_compile.py [--models yolov8n-bimamba.yaml] [--precisions fp32 fp16]
                                       [--compile-modes default reduce-overhead] [--out DIR]

Prints a markdown table and writes compile-<gpu>.json to --out (default benchmarks/out).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from bench_train import PRECISIONS, graphs_env, make_batch, train_step  # (this folder; it registers the blocks)


def step_bench(yaml: str, precision: str, mode: str, bs: int, imgsz: int, steps: int, warmup: int,
               compile_mode: str = "default") -> dict:
    """Median training-step time of ``yaml`` with its forward ``mode``: "eager" or "compiled" (with
    ``torch.compile``'s ``compile_mode``)."""
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import DetectionModel

    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = DetectionModel(yaml, nc=80, verbose=False).to(dev).train()
    model.args = get_cfg()
    dtype = PRECISIONS[precision]
    forward = model
    breaks = None
    if mode == "compiled":
        torch._dynamo.reset()
        breaks = torch._dynamo.explain(model)(torch.randn(2, 3, imgsz, imgsz, device=dev)).graph_break_count
        torch._dynamo.reset()
        forward = torch.compile(model, mode=compile_mode)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.937, nesterov=True)
    scaler = torch.amp.GradScaler("cuda", enabled=dtype is torch.float16)
    batch = make_batch(bs, imgsz, dev)
    times, first = [], None
    for i in range(warmup + steps):
        torch.cuda.synchronize()
        if mode == "compiled" and compile_mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()  # a new training step: earlier replays' outputs may be reused
        t0 = time.perf_counter()
        loss = train_step(lambda: model.loss(batch, forward(batch["img"]))[0].sum(), model, opt, scaler, dtype)
        if i == 0:
            first = time.perf_counter() - t0
        if i >= warmup:
            times.append(time.perf_counter() - t0)
        if not torch.isfinite(loss):
            raise RuntimeError(f"non-finite loss in {yaml} {precision} {mode}")
    return {"model": yaml, "precision": precision, "mode": mode, "batch": bs, "imgsz": imgsz,
            "step_ms_median": round(statistics.median(times) * 1e3, 2), "first_step_s": round(first, 1),
            "graph_breaks": breaks, "steps": steps, **({"compile_mode": compile_mode} if mode == "compiled" else {})}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["yolov8n-bimamba.yaml"])
    ap.add_argument("--precisions", nargs="+", default=["fp32", "fp16"], choices=list(PRECISIONS))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps (the compiled run compiles in the first)")
    ap.add_argument("--compile-modes", nargs="+", default=["default", "reduce-overhead"],
                    choices=["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"])
    ap.add_argument("--out", default=str(Path(__file__).parent / "out"))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_compile.py needs a CUDA GPU")
    rows = []
    for yaml in args.models:
        for precision in args.precisions:
            eager = {}
            for graphs in ("1", "0"):  # eager with the layers' CUDA-graph replay on (the default) and off
                with graphs_env(graphs):
                    row = step_bench(yaml, precision, "eager", args.batch, args.imgsz, args.steps, args.warmup)
                row["cuda_graphs"] = graphs == "1"
                eager[graphs] = row["step_ms_median"]
                rows.append(row)
                print(f"{yaml} {precision} eager (CUDA graphs {graphs}): {row['step_ms_median']} ms", flush=True)
            for cmode in args.compile_modes:
                row = step_bench(yaml, precision, "compiled", args.batch, args.imgsz, args.steps, args.warmup, cmode)
                row["speedup_vs_eager"] = round(eager["1"] / row["step_ms_median"], 3)
                row["speedup_vs_eager_no_graphs"] = round(eager["0"] / row["step_ms_median"], 3)
                rows.append(row)
                print(f"{yaml} {precision} compiled ({cmode}): {row['step_ms_median']} ms, first step "
                      f"{row['first_step_s']} s, {row['graph_breaks']} graph breaks", flush=True)
    gpu = torch.cuda.get_device_name().replace(" ", "-")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"compile-{gpu}.json").write_text(json.dumps({"gpu": gpu, "torch": torch.__version__, "rows": rows},
                                                        indent=1))
    print("| model | precision | forward | step ms | speed-up vs eager (graphs on / off) | graph breaks |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        mode = (f"eager (CUDA graphs {'on' if r['cuda_graphs'] else 'off'})" if r["mode"] == "eager"
                else f"compiled ({r['compile_mode']})")
        speed = f"{r['speedup_vs_eager']} / {r['speedup_vs_eager_no_graphs']}" if r["mode"] == "compiled" else ""
        print(f"| {r['model']} | {r['precision']} | {mode} | {r['step_ms_median']} | {speed} | "
              f"{'' if r['graph_breaks'] is None else r['graph_breaks']} |")


if __name__ == "__main__":
    main()
