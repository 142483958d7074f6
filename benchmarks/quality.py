#!/usr/bin/env python
"""Detection-quality benchmark: a grid of models x datasets x seeds trained from scratch with one recipe, validated on
each dataset's val split, plus each model's size, GFLOPs (SSM work included) and GPU speed.

    python benchmarks/quality.py prepare [--data-dir .quality-data]          # here (needs scikit-learn, Fashion-MNIST)
    python benchmarks/quality.py run --data-dir .quality-data --out OUT [--budget-s 540] [--parallel 6] [...]
    python benchmarks/quality.py run --mode finetune ...                    # stock checkpoint -> stock vs BiMamba2
    python benchmarks/quality.py report --out OUT                           # table + plot from OUT/quality.json

``prepare`` writes the datasets' sources (scikit-learn's digits, the Fashion-MNIST photo pools: about 8.5 MB) to
``DATA_DIR/sources`` and builds the scenes there; carry ``DATA_DIR/sources`` to a machine without scikit-learn or the
Debian package and ``run`` builds the same scenes from it (``YOLO_BIMAMBA_CACHE`` is set to DATA_DIR for every run).

``run`` trains every (model, dataset, seed) not yet in ``OUT/quality.json`` (or in ``--merge FILE``, a JSON of an
earlier call) with the same recipe, ``--parallel`` runs at once on one GPU, each a subprocess with ``--workers``
data-loader workers; it validates each run's last.pt (the EMA weights of the last epoch: no checkpoint is picked on
the val split) for mAP50 and mAP50-95, on the val split and, where the dataset has one, on its test split (choose
designs on val, report test). ``--budget-s`` stops launching runs that would not finish in time (their
expected length: the median of finished runs on that dataset) and stops any still running at the budget, so a grid
can be split over several calls: reruns add or replace entries. Then, per model and GPU, once: params, GFLOPs at
640 (:mod:`yolo_bimamba.flops`), inference latency (eager, fp16, Conv+BN fused, 640 px, batch 1 and 32,
CUDA-synchronised medians) and the training step's images/s (640 px, batch 32, fp16 AMP). It writes
``OUT/quality.json``, ``OUT/quality.md`` (table) and ``OUT/quality.png`` (mAP50-95 against latency, Pareto front).
Grid options come from ``--grid FILE`` (YAML with the same keys as the flags) and the flags (flags win);
``--speed-only`` measures only the speed entries. A model named ``NAME.yaml@VARIANT`` trains with a variant of the SSM
parameters' recipe (``RECIPE_VARIANTS``; ``@ssm-decay``: under weight decay, as Ultralytics groups weights), keyed
``NAME@VARIANT`` and paired in the report with NAME trained by the package's default recipe.

On an offline GPU machine (torch, triton, timm there; Ultralytics from the wheels that ../shared/tools/gpu-wheels.sh
puts in .whl/), carrying ``.whl`` and ``.quality-data/sources``, from the repository root::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=$PWD:/tmp/site:$PYTHONPATH YOLO_CONFIG_DIR=/tmp/ybm-config
    python3 benchmarks/quality.py run --out $OUT --budget-s 520 [--merge EARLIER/quality.json]

Default grid: the 6 baselines + 8 of ours (yolov8n-bimamba-p5 = bimamba.yaml, yolov8n-bimamba, yolo11n-,
yolo26n-bimamba, yolov8n-bimamba-sppf, yolov8n-bimamba-sppf-p4, study p45 and p5-rowcol) x digits
(256 px) and fashion (320 px) x seeds 0, 1, 2; 30 epochs, batch 32, fp16 AMP, RAM cache; 6 runs at once with 2
loader workers each. Measured time (H100, 42 runs of 7 n models, 8 at a time with 1 loader worker each, the GPU
suite beside them for the first 275 s): 951 s in all; a digits run 46-225 s, a fashion run 112-359 s (the n models
with BiMamba2 layers 1.5-2.5x the stock ones: their host time). The 84 runs of the default grid so take about four
calls of --budget-s 520 (runs are seed-major, so the first call covers seed 0 of every model on both datasets); the
speed entries then take about 15 s per model (108 s for 7 models).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_AUTOINSTALL", "0")

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

BASELINES = ["yolov8n.yaml", "yolov8s.yaml", "yolo11n.yaml", "yolo11s.yaml", "yolo26n.yaml", "yolo12n.yaml"]
OURS = ["yolov8n-bimamba-p5.yaml", "yolov8n-bimamba.yaml", "yolo11n-bimamba.yaml", "yolo26n-bimamba.yaml",
        "yolov8n-bimamba-sppf.yaml", "yolov8n-bimamba-sppf-p4.yaml", "study/yolov8n-bimamba-p45.yaml",
        "study/yolov8n-bimamba-p5-rowcol.yaml"]
DATASETS = {"digits": "digits.yaml", "fashion": "fashion.yaml", "digits-tiny": "digits-tiny.yaml",
            "fashion-tiny": "fashion-tiny.yaml"}
# The recipe every model trains with (from scratch; few epochs): AdamW at a fixed lr, short warm-up, no mosaic.
RECIPE = dict(optimizer="AdamW", lr0=0.003, warmup_epochs=1.0, close_mosaic=0, mosaic=0.0, scale=0.3)
DATASET_RECIPE = {"digits": dict(fliplr=0.0), "digits-tiny": dict(fliplr=0.0)}  # mirrored digits are other symbols
#: Variants of how our SSM parameters train, for the design study: a model named ``NAME.yaml@VARIANT`` trains with
#: these environment variables (yolo_bimamba.config) set for its runs only; its key and table rows say
#: ``NAME@VARIANT``, and the report pairs it with ``NAME`` (the package's default recipe) by seed.
#: ``ssm-decay``: A_log, D, dt_bias, norm weights and layer scales under weight decay, as Ultralytics groups weights.
RECIPE_VARIANTS = {"ssm-decay": {"YOLO_BIMAMBA_SSM_NO_DECAY": "0"}}
GRID_DEFAULTS = dict(mode="scratch", models=BASELINES + OURS, datasets=["digits", "fashion"], seeds=[0, 1, 2],
                     epochs=30, imgsz={"digits": 256, "fashion": 320}, batch=32, parallel=6, workers=2, device="0",
                     budget_s=0.0, amp=True, cache="ram", pretrain_data="fashion", pretrain_epochs=20,
                     finetune_pairs=["yolo11n.yaml:yolo11n-bimamba.yaml", "yolo26n.yaml:yolo26n-bimamba.yaml",
                                     "yolov8n.yaml:yolov8n-bimamba-sppf-p4.yaml"], speed=True, latency_imgsz=640,
                     run_timeout_s=3600.0)


# ------------------------------------------------------------------------------------------------------ helpers
def _load_json(path: Path) -> dict:
    if path and Path(path).is_file():
        return json.loads(Path(path).read_text())
    return {"runs": {}, "speed": {}, "calls": []}


def _save_json(path: Path, doc: dict):
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True))
    os.replace(tmp, path)


def _imgsz(g: dict, dataset: str) -> int:
    v = g["imgsz"]
    if isinstance(v, dict):
        return int(v.get(dataset, v.get(dataset.split("-")[0], max(v.values()))))
    return int(v)


def recipe(g: dict, dataset: str) -> dict:
    """Training arguments shared by every model on ``dataset`` (the seed is added per run)."""
    return {**RECIPE, **DATASET_RECIPE.get(dataset, {}), "epochs": int(g["epochs"]), "imgsz": _imgsz(g, dataset),
            "batch": int(g["batch"]), "amp": g["amp"]}


def _hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:10]


def split_variant(cfg: str) -> tuple[str, str | None]:
    """``NAME.yaml@VARIANT`` -> (``NAME.yaml``, ``VARIANT``): the model and the recipe variant it trains with (None:
    the package's defaults). An unknown variant is an error naming the known ones."""
    base, sep, variant = cfg.partition("@")
    if sep and variant not in RECIPE_VARIANTS:
        raise ValueError(f"model {cfg!r}: unknown recipe variant {variant!r} (known: {', '.join(RECIPE_VARIANTS)})")
    return base, (variant if sep else None)


def model_name(cfg: str) -> str:
    """The model's name in run keys and tables: the file's stem, with its recipe variant (``bimamba@ssm-decay``)."""
    base, variant = split_variant(cfg)
    name = Path(base).name.removesuffix(".yaml").removesuffix(".pt")
    return f"{name}@{variant}" if variant else name


def model_path(cfg: str) -> str:
    """A model YAML: a name relative to cfg/ (study/yolov8n-x.yaml: the file cfg/study/yolov8-x.yaml at scale n, as
    Ultralytics resolves scale letters), else a bare name (ours or Ultralytics' own) or a path as given; a recipe
    variant (``@...``) is not part of the path."""
    cfg = split_variant(cfg)[0]
    return str(ROOT / "cfg" / cfg) if "/" in cfg and not Path(cfg).is_absolute() and not Path(cfg).exists() else cfg


def jobs(g: dict) -> list[dict]:
    """Every run of the grid, seed-major (a partial grid has every model at the first seeds)."""
    out = []
    if g["mode"] == "scratch":
        for seed in g["seeds"]:
            for ds in g["datasets"]:
                r = recipe(g, ds)
                for m in g["models"]:
                    out.append(dict(mode="scratch", model=m, dataset=ds, seed=int(seed), recipe=r,
                                    key=f"scratch|{model_name(m)}|{ds}|{seed}"))
        return out
    for seed in g["seeds"]:
        pre = recipe(g, g["pretrain_data"]) | {"epochs": int(g["pretrain_epochs"])}
        for pair in g["finetune_pairs"]:
            stock, ours = pair.split(":")
            pkey = f"pretrain|{model_name(stock)}|{g['pretrain_data']}|{seed}"
            out.append(dict(mode="pretrain", model=stock, dataset=g["pretrain_data"], seed=int(seed), recipe=pre,
                            key=pkey))
            for ds in g["datasets"]:
                r = recipe(g, ds)
                for m in (stock, ours):
                    out.append(dict(mode="finetune", model=m, dataset=ds, seed=int(seed), recipe=r, base=pkey,
                                    key=f"finetune|{model_name(m)}<-{model_name(stock)}|{ds}|{seed}"))
    return out


def _env(data_dir: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["YOLO_BIMAMBA_CACHE"] = str(data_dir)
    env.setdefault("YOLO_OFFLINE", "1")
    env.setdefault("YOLO_AUTOINSTALL", "0")
    return env


# ------------------------------------------------------------------------------------------------------ prepare
def prepare(data_dir: Path, datasets: list[str]) -> dict:
    """Write the sources and build the datasets into data_dir; returns {dataset: data YAML} and prints sizes."""
    os.environ["YOLO_BIMAMBA_CACHE"] = str(data_dir)
    from yolo_bimamba import data as D

    built = {}
    for ds in datasets:
        spec = D.dataset_spec(ROOT / "cfg" / DATASETS[ds])
        gen = spec.pop("generator")
        if gen == "digits":
            try:
                D.write_sources(data_dir)
            except ImportError:
                pass  # no scikit-learn here: the sources must already be in data_dir/sources
        else:
            from yolo_bimamba import fashion_scenes as F

            if F.source_dir().joinpath("train-images-idx3-ubyte.gz").is_file():
                F.write_sources(data_dir, **{k: v for k, v in spec.items() if k in F.DEFAULTS})
        built[ds] = str(D.build_dataset(gen, root=data_dir, **spec))
    return built


def _size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20 if path.exists() else 0.0


# ---------------------------------------------------------------------------------------------- training worker
def train_worker(spec: dict) -> dict:
    """One run in this process: train, then validate last.pt on the val split (and on the test split where the
    dataset has one). Returns the result entry."""
    import yolo_bimamba  # noqa: F401  (registers blocks, YAML names, offline fixes)
    from ultralytics import YOLO

    r = spec["recipe"]
    name = spec["key"].replace("|", "_").replace("<-", "_from_").replace("/", "_")
    args = dict(data=DATASETS[spec["dataset"]], seed=spec["seed"], deterministic=False, workers=spec["workers"],
                device=spec["device"], project=spec["runs_dir"], name=name, exist_ok=True, val=False, plots=False,
                cache=spec["cache"], verbose=False, **r)
    if spec["mode"] == "finetune":
        args["pretrained"] = spec["pretrained"]
    t0 = time.time()
    model = YOLO(model_path(spec["model"]))
    model.train(**args)
    train_s = time.time() - t0
    save_dir = Path(model.trainer.save_dir)
    last = save_dir / "weights" / "last.pt"
    def validate(split: str):
        return YOLO(str(last)).val(data=DATASETS[spec["dataset"]], split=split, imgsz=r["imgsz"], batch=r["batch"],
                                   device=spec["device"], workers=spec["workers"], plots=False, verbose=False,
                                   project=spec["runs_dir"], name=f"{name}_{split}", exist_ok=True).box

    m = validate("val")
    n_train = sum(1 for _ in (Path(model.trainer.data["train"])).glob("*"))
    out = dict(mAP50=float(m.map50), mAP50_95=float(m.map), train_s=round(train_s, 1),
               train_images_per_s=round(n_train * r["epochs"] / train_s, 1), n_train=n_train,
               params=sum(p.numel() for p in model.model.parameters()))
    if model.trainer.data.get("test"):  # a held-out split: the figure to report once designs were chosen on val
        t = validate("test")
        out.update(test_mAP50=float(t.map50), test_mAP50_95=float(t.map))
    if spec["mode"] == "pretrain":
        out["checkpoint"] = str(last)
    return out


# ---------------------------------------------------------------------------------------------- speed worker
def speed_worker(cfg: str, imgsz: int, device: str) -> dict:
    """Params, GFLOPs at imgsz (SSM work counted), fp16 eager latency (fused Conv+BN) at batch 1 and 32, and the
    training step's images/s (batch 32, fp16 AMP) on the GPU."""
    import copy

    import torch

    import yolo_bimamba  # noqa: F401
    from ultralytics.nn.tasks import DetectionModel

    from yolo_bimamba.flops import model_gflops

    torch.manual_seed(0)
    cuda = torch.cuda.is_available() and device != "cpu"
    dev = torch.device(f"cuda:{device.split(',')[0]}" if cuda and device.isdigit() else ("cuda" if cuda else "cpu"))
    m = DetectionModel(model_path(cfg), nc=80, verbose=False)
    out = dict(params=sum(p.numel() for p in m.parameters()), gflops=round(model_gflops(m.to(dev), 640), 3),
               gflops_thop_only=round(model_gflops(m, 640, mixers=False), 3), device=_device_name(dev))
    fm = copy.deepcopy(m).to(dev).eval().fuse(verbose=False)
    dtype = torch.float16 if cuda else torch.float32
    fm = fm.to(dtype)
    for bs, warm, reps in ((1, 10, 50), (32, 3, 15)) if cuda else ((1, 1, 3),):
        x = torch.randn(bs, 3, imgsz, imgsz, device=dev, dtype=dtype)
        times = []
        with torch.inference_mode():
            for i in range(warm + reps):
                if cuda:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                fm(x)
                if cuda:
                    torch.cuda.synchronize()
                if i >= warm:
                    times.append(time.perf_counter() - t0)
        out[f"latency_b{bs}_ms"] = round(statistics.median(times) * 1e3, 3)
    del fm
    if cuda:
        import bench_train

        step = bench_train.model_step_bench(model_path(cfg), "fp16", "auto", 32, 640, steps=10, warmup=3)
        out["train_step_images_per_s"] = step["images_per_s"]
        out["train_step_ms"] = step["step_ms_median"]
    out["dtype"] = str(dtype).removeprefix("torch.")
    return out


def _device_name(dev) -> str:
    import torch

    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    import platform

    return f"cpu ({platform.processor() or platform.machine()})"


# -------------------------------------------------------------------------------------------------- scheduler
def run_env(spec: dict) -> dict:
    """The environment of one run's subprocess: ours (:func:`_env`) and its model's recipe variant, if any."""
    return {**_env(Path(spec["data_dir"])), **RECIPE_VARIANTS.get(split_variant(spec["model"])[1], {})}


def _launch(spec: dict, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, str(Path(__file__).resolve()), "_worker", json.dumps(spec)]
    log.parent.mkdir(parents=True, exist_ok=True)
    f = log.open("w")
    p = subprocess.Popen(cmd, cwd=spec["runs_dir"], env=run_env(spec), stdout=f,
                         stderr=subprocess.STDOUT, start_new_session=True)
    p._log, p._logf, p._t0 = log, f, time.time()
    return p


def _finish(p: subprocess.Popen) -> dict | None:
    p._logf.close()
    text = p._log.read_text(errors="replace")
    import re

    for line in reversed(text.splitlines()):
        if line.startswith("QUALITY_RESULT "):
            res = json.loads(line[len("QUALITY_RESULT "):])
            t = re.search(r"Transferred (\d+)/(\d+) items from pretrained weights", text)
            if t:  # fine-tuning: how many tensors of the checkpoint the model took over (Ultralytics' count)
                res["transferred"] = [int(t.group(1)), int(t.group(2))]
            return res
    return {"status": "failed", "rc": p.returncode, "log_tail": text[-2000:]}


def _kill(p: subprocess.Popen):
    import signal

    try:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    p._logf.close()


def _estimate(doc: dict, job: dict) -> float:
    done = [r["train_s"] + r.get("val_s", 0) for r in doc["runs"].values()
            if r.get("status") == "ok" and r["dataset"] == job["dataset"] and r["recipe"] == job["recipe"]]
    return 1.15 * statistics.median(done) + 20 if done else 0.0


def run_grid(g: dict, out: Path, data_dir: Path, runs_dir: Path, doc: dict, deadline: float, rerun: bool,
             retry_failed: bool = False):
    """Train the grid's missing runs, ``g['parallel']`` at a time, writing OUT/quality.json after each. A run already
    in the JSON with the same recipe is kept (a failed one too, unless ``retry_failed``; a pretraining run only while
    its checkpoint is on disk)."""
    todo = []
    for j in jobs(g):
        old = doc["runs"].get(j["key"])
        if old and old["recipe"] == j["recipe"] and not rerun:
            if old.get("status") == "failed" and not retry_failed:
                continue
            if old.get("status") == "ok" and (j["mode"] != "pretrain" or Path(old.get("checkpoint", "")).is_file()):
                continue
        todo.append(j)
    print(f"quality: {len(todo)} run(s) to do, {g['parallel']} at a time", flush=True)
    running, skipped = [], []
    logs = runs_dir / "logs"
    while todo or running:
        for p in list(running):
            if p.poll() is not None:
                running.remove(p)
                res = _finish(p)
                wall = time.time() - p._t0
                entry = {**p._job, **res, "wall_s": round(wall, 1)}
                entry.setdefault("status", "ok")
                doc["runs"][p._job["key"]] = entry
                _save_json(out / "quality.json", doc)
                print(f"  done {p._job['key']}: {entry['status']} "
                      f"mAP50-95 {entry.get('mAP50_95', float('nan')):.4f} in {wall:.0f} s", flush=True)
            elif deadline and time.time() > deadline:
                print(f"  budget: stopping {p._job['key']} (not recorded)", flush=True)
                _kill(p)
                running.remove(p)
        ready = [j for j in todo if j["mode"] != "finetune" or
                 (doc["runs"].get(j["base"], {}).get("status") == "ok")]
        while ready and len(running) < g["parallel"]:
            j = ready.pop(0)
            if deadline and time.time() + _estimate(doc, j) > deadline:
                todo.remove(j)
                skipped.append(j["key"])
                continue
            todo.remove(j)
            spec = {**j, "workers": g["workers"], "device": g["device"], "cache": g["cache"],
                    "runs_dir": str(runs_dir), "data_dir": str(data_dir)}
            if j["mode"] == "finetune":
                spec["pretrained"] = doc["runs"][j["base"]]["checkpoint"]
            p = _launch({"kind": "train", **spec}, logs / (j["key"].replace("|", "_").replace("/", "_") + ".log"))
            p._job = {k: j[k] for k in ("mode", "model", "dataset", "seed", "recipe", "key")}
            running.append(p)
        if not running and todo and not ready:  # finetune runs whose checkpoint run failed or was skipped
            skipped += [j["key"] for j in todo]
            todo = []
        time.sleep(0.5)
    if skipped:
        print(f"quality: {len(skipped)} run(s) left for a later call (budget or missing checkpoint)", flush=True)
    return skipped


def run_speed(g: dict, out: Path, data_dir: Path, runs_dir: Path, doc: dict, deadline: float, rerun: bool):
    # a recipe variant is the same network: its speed is its model's
    models = sorted({split_variant(j["model"])[0] for j in jobs(g) if j["mode"] != "pretrain"})
    dev_key = _gpu_name()
    for m in models:
        key = f"{model_name(m)}|{dev_key}"
        if key in doc["speed"] and not rerun:
            continue
        if deadline and time.time() + 60 > deadline:
            print(f"quality: speed of {m} left for a later call (budget)", flush=True)
            continue
        spec = {"kind": "speed", "model": m, "imgsz": g["latency_imgsz"], "device": str(g["device"]),
                "runs_dir": str(runs_dir), "data_dir": str(data_dir)}
        p = _launch(spec, runs_dir / "logs" / f"speed_{model_name(m)}.log")
        try:
            p.wait(timeout=max(30.0, deadline - time.time()) if deadline else 900)
        except subprocess.TimeoutExpired:
            _kill(p)
            print(f"quality: speed of {m} stopped (budget)", flush=True)
            continue
        res = _finish(p)
        doc["speed"][key] = {"model": model_name(m), "gpu": dev_key, **res, "status": res.get("status", "ok")}
        _save_json(out / "quality.json", doc)
        print(f"  speed {model_name(m)}: {json.dumps(res)[:200]}", flush=True)


def _gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def _versions() -> dict:
    import torch
    import ultralytics

    v = {"torch": torch.__version__, "ultralytics": ultralytics.__version__, "gpu": _gpu_name(),
         "python": sys.version.split()[0]}
    try:
        import triton

        v["triton"] = triton.__version__
    except ImportError:
        pass
    v["commit"] = os.environ.get("GIT_COMMIT") or _git_commit()
    return v


def _git_commit() -> str:
    """This tree's commit (+dirty), from git. A copy on another machine names its commit in GIT_COMMIT instead: its
    .git, if any, may be stale."""
    c = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return (c.stdout.strip() or "unknown") + ("+dirty" if dirty else "")


# ------------------------------------------------------------------------------------------------------- CLI
def _grid(args) -> dict:
    g = dict(GRID_DEFAULTS)
    if args.grid:
        import yaml

        extra = yaml.safe_load(Path(args.grid).read_text()) or {}
        unknown = set(extra) - set(g)
        if unknown:
            raise SystemExit(f"quality: unknown grid key(s) {sorted(unknown)} in {args.grid}; valid: {sorted(g)}")
        g.update(extra)
    for k in g:
        v = getattr(args, k, None)
        if v is not None:
            g[k] = v
    if isinstance(g["imgsz"], (list, tuple)):
        g["imgsz"] = int(g["imgsz"][0])
    for ds in g["datasets"]:
        if ds not in DATASETS:
            raise SystemExit(f"quality: unknown dataset {ds!r}; known: {sorted(DATASETS)}")
    g["device"] = str(g["device"])
    if str(g["cache"]).lower() in {"false", "none", "0"}:
        g["cache"] = False
    return g


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    pp = sub.add_parser("prepare", help="write sources and build the datasets (run where scikit-learn is)")
    pp.add_argument("--data-dir", type=Path, default=ROOT / ".quality-data")
    pp.add_argument("--datasets", nargs="+", default=["digits", "fashion"])
    rp = sub.add_parser("run", help="train + validate the grid, measure speed, write JSON / table / plot")
    rp.add_argument("--grid", help="YAML file with grid keys (as the flags, with underscores)")
    rp.add_argument("--data-dir", type=Path, default=ROOT / ".quality-data")
    rp.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out" / "quality")
    rp.add_argument("--merge", type=Path, help="quality.json of an earlier call: its entries are kept")
    rp.add_argument("--runs-dir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "ybm-quality-runs")
    rp.add_argument("--mode", choices=["scratch", "finetune"])
    rp.add_argument("--models", nargs="+")
    rp.add_argument("--datasets", nargs="+")
    rp.add_argument("--seeds", nargs="+", type=int)
    rp.add_argument("--epochs", type=int)
    rp.add_argument("--imgsz", type=int, nargs="+", help="one size for every dataset (default digits 256, fashion 320)")
    rp.add_argument("--batch", type=int)
    rp.add_argument("--parallel", type=int)
    rp.add_argument("--workers", type=int)
    rp.add_argument("--device")
    rp.add_argument("--budget-s", dest="budget_s", type=float)
    rp.add_argument("--amp", type=lambda s: s.lower() in {"1", "true", "yes"})
    rp.add_argument("--cache", choices=["ram", "disk", "False"])
    rp.add_argument("--pretrain-data", dest="pretrain_data")
    rp.add_argument("--pretrain-epochs", dest="pretrain_epochs", type=int)
    rp.add_argument("--finetune-pairs", dest="finetune_pairs", nargs="+", help="STOCK.yaml:OURS.yaml ...")
    rp.add_argument("--latency-imgsz", dest="latency_imgsz", type=int)
    rp.add_argument("--no-speed", dest="speed", action="store_false", default=None,
                    help="skip the speed measurements (params, GFLOPs, latency, step images/s)")
    rp.add_argument("--speed-only", action="store_true", help="only the speed measurements of the grid's models")
    rp.add_argument("--rerun", action="store_true", help="redo runs already in the JSON")
    rp.add_argument("--retry-failed", action="store_true", help="redo runs that failed (kept as failed otherwise)")
    rep = sub.add_parser("report", help="rewrite OUT/quality.md and OUT/quality.png from OUT/quality.json")
    rep.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out" / "quality")
    wp = sub.add_parser("_worker")
    wp.add_argument("spec")
    return ap


def main(argv=None):
    args = parser().parse_args(argv)

    if args.cmd == "_worker":
        spec = json.loads(args.spec)
        res = train_worker(spec) if spec["kind"] == "train" else speed_worker(spec["model"], spec["imgsz"],
                                                                                spec["device"])
        print("QUALITY_RESULT " + json.dumps({"status": "ok", **res}), flush=True)
        return
    if args.cmd == "prepare":
        built = prepare(args.data_dir.resolve(), args.datasets)
        for ds, y in built.items():
            print(f"{ds}: {y} ({_size_mb(Path(y).parent):.1f} MB)")
        src = args.data_dir.resolve() / "sources"
        print(f"data dir: {args.data_dir.resolve()} ({_size_mb(args.data_dir):.1f} MB); sources to carry: {src} "
              f"({_size_mb(src):.1f} MB)")
        return
    from quality_report import write_report

    if args.cmd == "report":
        write_report(_load_json(args.out / "quality.json"), args.out)
        return

    t_start = time.time()
    g = _grid(args)
    out, data_dir, runs_dir = args.out.resolve(), args.data_dir.resolve(), args.runs_dir.resolve()
    deadline = t_start + g["budget_s"] if g["budget_s"] else 0.0
    doc = _load_json(out / "quality.json")
    if args.merge:
        old = _load_json(args.merge)
        for k in ("runs", "speed"):
            doc[k] = {**old.get(k, {}), **doc[k]}
        doc["calls"] = old.get("calls", []) + doc.get("calls", [])
    runs_dir.mkdir(parents=True, exist_ok=True)
    ds_needed = set(g["datasets"]) | ({g["pretrain_data"]} if g["mode"] == "finetune" else set())
    if not args.speed_only:  # (the speed entries need no dataset)
        print(f"quality: datasets {json.dumps(prepare(data_dir, sorted(ds_needed)))}", flush=True)
    call = {"grid": g, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t_start)), **_versions()}
    skipped = [] if args.speed_only else run_grid(g, out, data_dir, runs_dir, doc, deadline, args.rerun,
                                                           args.retry_failed)
    if g["speed"] or args.speed_only:
        run_speed(g, out, data_dir, runs_dir, doc, deadline, args.rerun)
    call["wall_s"], call["left_for_later"] = round(time.time() - t_start, 1), skipped
    doc.setdefault("calls", []).append(call)
    _save_json(out / "quality.json", doc)
    write_report(doc, out)
    print(f"quality: wrote {out / 'quality.json'}, quality.md, quality.png in {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
