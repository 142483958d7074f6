"""End-to-end training benchmark on a CUDA GPU.

Measures, for yolov8n/s, yolov8n/s-bimamba and yolov8n/s-bimamba-p5 at imgsz 640, batch 32:
  1. the model step alone (forward + loss + backward + clip + optimizer step on a fixed GPU batch),
     median over repeats, images/s and peak memory, in fp32 / bf16 / fp16 AMP, with our Triton
     kernels and with the PyTorch op;
  2. the real `yolo train` loop throughput (epochs after the first, RAM-cached synthetic 640 px
     data) - with --loop;
  3. params, GFLOPs and ONNX CPU latency per image (onnxruntime) - with --onnx.
Writes benchmarks/out/train-<gpu>.json (or into --out) and prints a markdown table.

    python benchmarks/bench_train.py [--loop] [--onnx] [--out DIR] [--cuda-graphs on|off|both]

The BiMamba layers replay CUDA graphs in training (yolo_bimamba.nn.cuda_graph, on by default as users run them);
--cuda-graphs both measures every BiMamba model with and without them, side by side in one run.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_AUTOINSTALL", "0")

import torch  # noqa: E402

import yolo_bimamba  # noqa: E402,F401  (registers the blocks)
from yolo_bimamba.nn import BiMamba2  # noqa: E402

MODELS = ["yolov8n.yaml", "yolov8n-bimamba.yaml", "yolov8n-bimamba-p5.yaml",
          "yolov8s.yaml", "yolov8s-bimamba.yaml", "yolov8s-bimamba-p5.yaml"]
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def set_backend(model: torch.nn.Module, backend: str) -> int:
    n = 0
    for m in model.modules():
        if isinstance(m, BiMamba2):
            m.backend = backend
            n += 1
    return n


def make_batch(bs: int, imgsz: int, device, nc: int = 80, boxes_per_img: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    n = bs * boxes_per_img
    xy = torch.rand(n, 2, generator=g) * 0.8 + 0.1
    wh = torch.rand(n, 2, generator=g) * 0.15 + 0.03
    return {
        "img": torch.rand(bs, 3, imgsz, imgsz, generator=g).to(device),
        "batch_idx": torch.arange(bs).repeat_interleave(boxes_per_img).float().to(device),
        "cls": torch.randint(0, nc, (n, 1), generator=g).float().to(device),
        "bboxes": torch.cat([xy, wh], 1).to(device),
    }


GRAPHS = {"on": ("1",), "off": ("0",), "both": ("1", "0")}


def runs_of(yaml: str, graphs: str) -> tuple:
    """Values of YOLO_BIMAMBA_CUDA_GRAPHS to measure a model with (a plain YOLO model has no BiMamba layer: one run,
    the environment as it is)."""
    return GRAPHS[graphs] if "bimamba" in yaml or "hydra" in yaml else (None,)


@contextlib.contextmanager
def graphs_env(value):
    old = os.environ.get("YOLO_BIMAMBA_CUDA_GRAPHS")
    if value is not None:
        os.environ["YOLO_BIMAMBA_CUDA_GRAPHS"] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("YOLO_BIMAMBA_CUDA_GRAPHS", None)
        else:
            os.environ["YOLO_BIMAMBA_CUDA_GRAPHS"] = old


def train_step(loss_of, model, opt, scaler, dtype) -> torch.Tensor:
    """One training step as Ultralytics' trainer takes it: ``loss_of()`` under autocast (``dtype`` None: fp32), the
    scaled backward, unscale, clip at max-norm 10, the optimizer step; returns the loss once the GPU is done."""
    with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
        loss = loss_of()
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return loss


def model_step_bench(yaml: str, precision: str, backend: str, bs: int, imgsz: int, steps: int, warmup: int) -> dict:
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import DetectionModel

    dev = torch.device("cuda")
    # what earlier rows of this process left (a model in a reference cycle waits for the garbage collector) must not
    # count as this row's memory: collect it, and report the peak above what is still allocated before the row
    # (without this, yolov8n measured 3.9 GB first in a process and 5.7 GB after three other models)
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.manual_seed(0)
    model = DetectionModel(yaml, nc=80, verbose=False).to(dev).train()
    model.args = get_cfg()
    if set_backend(model, backend) == 0:
        backend = "none"  # a plain YOLO model: no SSM op to switch
    dtype = PRECISIONS[precision]
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.937, nesterov=True)
    scaler = torch.amp.GradScaler("cuda", enabled=dtype is torch.float16)
    batch = make_batch(bs, imgsz, dev)
    times = []
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        loss = train_step(lambda: model(batch)[0].sum(), model, opt, scaler, dtype)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
        if not torch.isfinite(loss):
            raise RuntimeError(f"non-finite loss in {yaml} {precision} {backend}")
    ms = statistics.median(times) * 1e3
    return {
        "model": yaml, "precision": precision, "backend": backend, "batch": bs, "imgsz": imgsz,
        "step_ms_median": round(ms, 2), "images_per_s": round(bs / ms * 1e3, 1),
        "peak_mem_mb": round((torch.cuda.max_memory_allocated() - base) / 2**20, 1),
        "mem_before_mb": round(base / 2**20, 1), "steps": steps,
    }


def model_info(yaml: str, imgsz: int = 640) -> dict:
    """Params, and GFLOPs at imgsz counted by torch's FlopCounterMode (matmul/conv/einsum FLOPs, 2 per MAC): the
    same counter for every model, since Ultralytics' thop-based count misses the einsums of the SSM blocks."""
    from torch.utils.flop_counter import FlopCounterMode
    from ultralytics.nn.tasks import DetectionModel

    m = DetectionModel(yaml, nc=80, verbose=False).eval()
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        m(torch.zeros(1, 3, imgsz, imgsz))
    return {"params": sum(p.numel() for p in m.parameters()), "gflops": round(fc.get_total_flops() / 1e9, 2)}


def onnx_only(args, reps: int = 21) -> None:
    """Params, GFLOPs and ONNX CPU latency of every model, timed in interleaved rounds (one run of each model per
    round, median over the rounds) so that the ratios between models are measured side by side."""
    import numpy as np
    import onnxruntime as ort
    import ultralytics
    from ultralytics import YOLO

    threads = args.onnx_threads or os.cpu_count()
    meta = {"host": platform.node(), "processor": platform.processor(), "cpu_count": os.cpu_count(),
            "onnx_threads": threads, "onnxruntime": ort.__version__, "torch": torch.__version__,
            "ultralytics": ultralytics.__version__, "python": platform.python_version(), "imgsz": args.imgsz,
            "rounds": reps, "command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    work = Path(tempfile.mkdtemp(prefix="bench_onnx_"))
    x = np.random.default_rng(0).random((1, 3, args.imgsz, args.imgsz), dtype=np.float32)
    info, sessions = {}, {}
    for yaml in args.models:
        info[yaml] = model_info(yaml, args.imgsz)
        with _in_dir(work):  # a model built from a YAML exports into the working directory
            path = Path(YOLO(yaml).export(format="onnx", imgsz=args.imgsz, simplify=False, device="cpu")).resolve()
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        name = sess.get_inputs()[0].name
        sessions[("onnx", yaml)] = lambda sess=sess, name=name: sess.run(None, {name: x})
        if args.openvino:  # the same model as Ultralytics exports it for OpenVINO, fp32 on the CPU, same threads
            import openvino as ov

            with _in_dir(work):
                folder = Path(YOLO(yaml).export(format="openvino", imgsz=args.imgsz, device="cpu")).resolve()
            compiled = ov.Core().compile_model(str(next(Path(folder).glob("*.xml"))), "CPU", {
                "INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": threads})
            sessions[("openvino", yaml)] = lambda c=compiled: c(x)
            meta["openvino"] = ov.__version__
    for run in sessions.values():
        for _ in range(3):
            run()
    times = {key: [] for key in sessions}
    for _ in range(reps):
        for key, run in sessions.items():
            t0 = time.perf_counter()
            run()
            times[key].append(time.perf_counter() - t0)
    base = args.models[0]
    for (fmt, yaml), ts in times.items():
        info[yaml][f"{fmt}_cpu_ms_per_image"] = round(statistics.median(ts) * 1e3, 2)
    for yaml in args.models:
        for fmt in ("onnx", "openvino"):
            if f"{fmt}_cpu_ms_per_image" in info[yaml]:
                info[yaml][f"{fmt}_ratio_to_{base}"] = round(
                    info[yaml][f"{fmt}_cpu_ms_per_image"] / info[base][f"{fmt}_cpu_ms_per_image"], 3)
        print(yaml, info[yaml], flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"onnx-cpu-{meta['cpu_count']}core.json"
    path.write_text(json.dumps({"meta": meta, "models": info}, indent=2))
    print(f"wrote {path}")


@contextlib.contextmanager
def _in_dir(path):
    """Run the block in ``path`` (contextlib.chdir, which Python 3.10 lacks)."""
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def onnx_latency(yaml: str, imgsz: int, workdir: Path, reps: int = 20, threads: int | None = None) -> dict:
    import numpy as np
    import onnxruntime as ort
    from ultralytics import YOLO

    m = YOLO(yaml)
    with _in_dir(workdir):  # a model built from a YAML exports into the working directory
        path = Path(m.export(format="onnx", imgsz=imgsz, simplify=False, device="cpu")).resolve()
    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    x = np.random.rand(1, 3, imgsz, imgsz).astype(np.float32)
    name = sess.get_inputs()[0].name
    for _ in range(3):
        sess.run(None, {name: x})
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        sess.run(None, {name: x})
        ts.append(time.perf_counter() - t0)
    return {"onnx_cpu_ms_per_image": round(statistics.median(ts) * 1e3, 2), "onnx_threads": threads or os.cpu_count()}


def make_synthetic_dataset(root: Path, n_train: int, imgsz: int) -> Path:
    import cv2
    import numpy as np

    rng = np.random.default_rng(0)
    for split, n in (("train", n_train), ("val", max(16, n_train // 16))):
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        (root / "labels" / split).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            img = (rng.random((imgsz, imgsz, 3)) * 64).astype(np.uint8)
            lines = []
            for _ in range(rng.integers(1, 6)):
                w, h = rng.integers(imgsz // 16, imgsz // 4, size=2)
                x0, y0 = rng.integers(0, imgsz - w), rng.integers(0, imgsz - h)
                c = int(rng.integers(0, 4))
                img[y0:y0 + h, x0:x0 + w] = (60 * (c + 1), 255 - 50 * c, 40 * c)
                lines.append(f"{c} {(x0 + w / 2) / imgsz:.6f} {(y0 + h / 2) / imgsz:.6f} {w / imgsz:.6f} {h / imgsz:.6f}")
            cv2.imwrite(str(root / "images" / split / f"{i:05d}.jpg"), img)
            (root / "labels" / split / f"{i:05d}.txt").write_text("\n".join(lines) + "\n")
    yaml = root / "synthetic.yaml"
    yaml.write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames: {{0: a, 1: b, 2: c, 3: d}}\n")
    return yaml


def loop_bench(run: tuple, data: Path, workdir: Path, n_train: int, epochs: int, bs: int, imgsz: int, workers: int) -> dict:
    """Runs the stock trainer in a subprocess and reads per-epoch wall times from its log. run: (model yaml, value of
    YOLO_BIMAMBA_CUDA_GRAPHS or None to leave it as it is)."""
    yaml, graphs = run
    env = dict(os.environ, **({"YOLO_BIMAMBA_CUDA_GRAPHS": graphs} if graphs is not None else {}))
    code = (
        "import time, yolo_bimamba; from ultralytics import YOLO\n"
        "from ultralytics.utils import callbacks\n"
        "m = YOLO(%r); ts = []\n"
        "m.add_callback('on_train_epoch_start', lambda t: ts.append(time.perf_counter()))\n"
        "m.add_callback('on_train_epoch_end', lambda t: ts.append(time.perf_counter()))\n"
        "m.train(data=%r, epochs=%d, batch=%d, imgsz=%d, workers=%d, cache='ram', val=False, plots=False,"
        " amp=True, project=%r, name='loop', exist_ok=True, verbose=False)\n"
        "print('EPOCH_TIMES', [round(ts[i+1]-ts[i], 3) for i in range(0, len(ts), 2)])\n"
    ) % (yaml, str(data), epochs, bs, imgsz, workers, str(workdir))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900, env=env)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("EPOCH_TIMES")]
    if out.returncode != 0 or not line:
        raise RuntimeError(f"loop bench failed for {yaml}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    times = json.loads(line[-1].split(" ", 1)[1])
    later = times[1:] or times
    return {"loop_epoch_s": later, "loop_images_per_s": round(n_train / statistics.median(later), 1)}


def loop_rounds(models, n_rounds, bench, on_run=None) -> dict:
    """bench(yaml) for every model in ``n_rounds`` rounds of alternating order (drift of the host, which bounds the
    loop, spreads evenly over the models): per model the epoch times of every round, each round's images/s and
    their median. A run that raises does not stop the others: its error goes to ``loop_failures`` (the median is
    over the rounds that ran; a model with none has no figures). ``on_run(partial result)`` after every run, so that a
    caller can save what was measured before a time limit or a crash."""
    rounds = {yaml: [] for yaml in models}
    failures = {yaml: [] for yaml in models}

    def summary():
        out = {}
        for yaml, rs in rounds.items():
            out[yaml] = {}
            if rs:
                out[yaml] = dict(loop_epoch_s=[t for res in rs for t in res["loop_epoch_s"]],
                                 loop_images_per_s_rounds=[res["loop_images_per_s"] for res in rs],
                                 loop_images_per_s=round(statistics.median(res["loop_images_per_s"] for res in rs), 1))
            if failures[yaml]:
                out[yaml]["loop_failures"] = failures[yaml]
        return out

    for r in range(n_rounds):
        for yaml in (models if r % 2 == 0 else models[::-1]):
            try:
                res = bench(yaml)
            except Exception as e:  # noqa: BLE001 - recorded, reported, and main() exits non-zero
                failures[yaml].append(f"round {r}: {type(e).__name__}: {str(e)[-2000:]}")
                print(yaml, f"round {r} FAILED", type(e).__name__, str(e)[-600:], flush=True)
            else:
                rounds[yaml].append(res)
                print(yaml, f"round {r}", res, flush=True)
            if on_run is not None:
                on_run(summary())
    return summary()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=MODELS)
    ap.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=list(PRECISIONS))
    ap.add_argument("--backends", nargs="+", default=["triton", "torch"], choices=["triton", "torch"])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--steps", type=int, default=15, help="timed model steps per row; 0 skips the model-step bench")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--loop", action="store_true", help="also time the real `yolo train` loop")
    ap.add_argument("--loop-images", type=int, default=1024)
    ap.add_argument("--loop-epochs", type=int, default=3)
    ap.add_argument("--loop-rounds", type=int, default=1,
                    help="loop: rounds over the models, in alternating order; the median round is reported")
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--cuda-graphs", choices=list(GRAPHS), default="on",
                    help="CUDA-graph replay of the BiMamba layers (YOLO_BIMAMBA_CUDA_GRAPHS): on (the default, as users "
                         "train), off, or both (each BiMamba model measured both ways, side by side)")
    ap.add_argument("--onnx", action="store_true", help="also export ONNX and time CPU inference")
    ap.add_argument("--out", default=str(Path(__file__).parent / "out"))
    ap.add_argument("--onnx-only", action="store_true",
                    help="only params, GFLOPs and ONNX CPU latency (no GPU needed); writes onnx-cpu-<host>.json")
    ap.add_argument("--onnx-threads", type=int, default=None, help="onnxruntime intra-op threads (default: all cores)")
    ap.add_argument("--openvino", action="store_true", help="with --onnx-only: also OpenVINO (fp32) in the same rounds")
    args = ap.parse_args()
    if args.onnx_only:
        return onnx_only(args)
    if not torch.cuda.is_available():
        sys.exit("bench_train.py needs a CUDA GPU (or --onnx-only)")
    import triton
    import ultralytics

    gpu = torch.cuda.get_device_name(0)
    meta = {
        "gpu": gpu, "torch": torch.__version__, "triton": triton.__version__, "ultralytics": ultralytics.__version__,
        "python": platform.python_version(), "cpu_count": os.cpu_count(), "command": " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        # the package's switches of this run (YOLO_BIMAMBA_AUTOTUNE, _FP16_SCAN, _CUDA_GRAPHS, ...)
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("YOLO_BIMAMBA_")},
    }
    rows, info = [], {}
    for yaml in args.models:
        info[yaml] = model_info(yaml)
        for prec in args.precisions if args.steps > 0 else ():  # --steps 0: no model-step rows (e.g. --loop alone)
            for backend in args.backends:
                for graphs in runs_of(yaml, args.cuda_graphs):
                    with graphs_env(graphs):
                        r = model_step_bench(yaml, prec, backend, args.batch, args.imgsz, args.steps, args.warmup)
                    r["cuda_graphs"] = None if graphs is None else graphs != "0"  # None: a model without BiMamba layers
                    rows.append(r)
                    print(json.dumps(r), flush=True)
                if "bimamba" not in yaml:
                    break  # plain YOLO has no SSM op: one row per precision
    work = Path(tempfile.mkdtemp(prefix="bench_train_"))
    if args.onnx:
        for yaml in args.models:
            info[yaml].update(onnx_latency(yaml, args.imgsz, work))
            print(yaml, info[yaml], flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result_file = out / f"train-{gpu.replace(' ', '-')}.json"

    def save(loop_results=None):  # after every loop run too: a time limit or a crash keeps what was measured
        models = {yaml: dict(v) for yaml, v in info.items()}
        for (yaml, graphs), res in (loop_results or {}).items():
            models[yaml].update(res if graphs != "0" or len(runs_of(yaml, args.cuda_graphs)) == 1
                                else {f"{k}_graphs_off": v for k, v in res.items()})
        result_file.write_text(json.dumps({"meta": meta, "model_step": rows, "models": models}, indent=2))
        return models

    loop_failed = False
    if args.loop:
        data = make_synthetic_dataset(work / "synthetic", args.loop_images, args.imgsz)
        loop = functools.partial(loop_bench, data=data, workdir=work, n_train=args.loop_images, epochs=args.loop_epochs,
                                 bs=args.batch, imgsz=args.imgsz, workers=args.workers)
        runs = [(yaml, g) for yaml in args.models for g in runs_of(yaml, args.cuda_graphs)]
        loop_results = loop_rounds(runs, args.loop_rounds, loop, on_run=save)
        loop_failed = any("loop_failures" in res for res in loop_results.values())
        info = save(loop_results)
    else:
        save()
    print("\n| model | precision | backend | CUDA graphs | step ms | img/s | peak MB |\n|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['precision']} | {r['backend']} | {r['cuda_graphs']} | {r['step_ms_median']} | "
              f"{r['images_per_s']} | {r['peak_mem_mb']} |")
    print("\n| model | params | GFLOPs | ONNX CPU ms | loop img/s | loop img/s, graphs off |\n|---|---|---|---|---|---|")
    for k, v in info.items():
        print(f"| {k} | {v['params']} | {v['gflops']} | {v.get('onnx_cpu_ms_per_image', '-')} | "
              f"{v.get('loop_images_per_s', '-')} | {v.get('loop_images_per_s_graphs_off', '-')} |")
    if loop_failed:
        sys.exit(f"bench_train.py: some loop runs failed (loop_failures in {result_file})")


if __name__ == "__main__":
    main()
