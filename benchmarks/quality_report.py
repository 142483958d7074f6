"""Table and plot of the detection-quality benchmark (benchmarks/quality.py): OUT/quality.md and OUT/quality.png
from the JSON's runs (mean and std over seeds per model and dataset) and speed entries (per model and GPU)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

__all__ = ["aggregate", "paired_deltas", "pareto", "stock_of", "write_report"]


def aggregate(doc: dict) -> dict:
    """{(mode, model, dataset): {"n", "seeds", "mAP50", "mAP50_std", "mAP50_95", "mAP50_95_std", ...}} over the
    successful runs; failed runs are counted under "failed"."""
    groups: dict = {}
    for r in doc.get("runs", {}).values():
        label = r["key"].split("|")[1]  # model name, or "ours<-stock" for fine-tuning
        g = groups.setdefault((r["mode"], label, r["dataset"]), {"ok": [], "failed": 0})
        if r.get("status") == "ok":
            g["ok"].append(r)
        else:
            g["failed"] += 1
    out = {}
    for k, g in groups.items():
        runs = sorted(g["ok"], key=lambda r: r["seed"])
        a = {"n": len(runs), "seeds": [r["seed"] for r in runs], "failed": g["failed"]}
        for m in ("mAP50", "mAP50_95", "test_mAP50_95", "train_images_per_s"):
            v = [r[m] for r in runs if m in r]
            a[m] = statistics.fmean(v) if v else math.nan
            a[m + "_std"] = statistics.stdev(v) if len(v) > 1 else (0.0 if v else math.nan)
        out[k] = a
    return out


def stock_of(model: str) -> str | None:
    """The model a run is paired with: for a BiMamba2 / Hydra variant the stock model it extends, the name before
    "-bimamba" / "-hydra" ("yolo11n-bimamba" -> "yolo11n", "yolov8n-bimamba-sppf" -> "yolov8n",
    "study/yolov8n-bimamba-p45" -> "yolov8n", "bimamba" (bimamba.yaml, a YOLOv8 at scale n) -> "yolov8n"); for a
    recipe variant the same model with the default recipe ("yolov8n-bimamba-sppf-p4@ssm-decay" ->
    "yolov8n-bimamba-sppf-p4"); None for a stock model."""
    if "@" in model:
        return model.rsplit("/", 1)[-1].split("@")[0]
    if model.rsplit("/", 1)[-1] == "bimamba":
        return "yolov8n"
    for tag in ("-bimamba", "-hydra"):
        if tag in model:
            return model.rsplit("/", 1)[-1].split(tag)[0]
    return None


def _pair_of(model: str) -> str | None:
    """The label of the run a row is paired with: :func:`stock_of` the model, and for a fine-tuning run ("ours<-src")
    the stock model fine-tuned from the same checkpoint ("yolo11n-bimamba<-yolo11n" -> "yolo11n<-yolo11n")."""
    net, arrow, src = model.partition("<-")
    stock = stock_of(net)
    return f"{stock}{arrow}{src}" if stock else None


def paired_deltas(doc: dict, metric: str = "mAP50_95") -> list[dict]:
    """Per (dataset, our model): ``metric`` (val mAP50-95, or ``test_mAP50_95``) minus its stock model's, paired by
    seed (runs of both that succeeded with the same seed, mode and recipe and have the metric), in points: the
    per-seed differences, their mean and std. Seed noise common to both (the data order, the augmentation draws)
    cancels in a paired difference. A fine-tuned model is paired with its stock model fine-tuned from the same
    checkpoint."""
    runs = [r for r in doc.get("runs", {}).values()
            if r.get("status") == "ok" and r.get("mode") in ("scratch", "finetune") and metric in r]
    by = {(r["key"].split("|")[1], r["dataset"], r["seed"], r["mode"] + repr(r.get("recipe"))): r for r in runs}
    rows = {}
    for (model, ds, seed, rec), r in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2])):
        stock = _pair_of(model)
        base = by.get((stock, ds, seed, rec)) if stock else None
        if base is not None:
            row = rows.setdefault((ds, model), {"dataset": ds, "model": model, "stock": stock, "seeds": [],
                                                "deltas": []})
            row["seeds"].append(seed)
            row["deltas"].append(100.0 * (r[metric] - base[metric]))
    out = []
    for row in rows.values():
        d = row["deltas"]
        out.append({**row, "mean": statistics.fmean(d), "std": statistics.stdev(d) if len(d) > 1 else math.nan,
                    "wins": sum(x > 0 for x in d)})
    return out


def pareto(points: list[tuple[float, float, str]]) -> list[str]:
    """Names of the points not dominated by another one (lower or equal x and higher y)."""
    front, best = [], -math.inf
    for x, y, name in sorted(points, key=lambda p: (p[0], -p[1])):
        if y > best:
            front.append(name)
            best = y
    return front


def _speed_by_model(doc: dict) -> tuple[dict, str]:
    """{model: speed entry} for the GPU of the latest call that measured one (else any entry)."""
    entries = [s for s in doc.get("speed", {}).values() if s.get("status") == "ok"]
    gpu = next((c.get("gpu") for c in reversed(doc.get("calls", [])) if any(s["gpu"] == c.get("gpu")
                                                                          for s in entries)), None)
    out = {}
    for s in entries:
        if gpu is None or s["gpu"] == gpu:
            out[s["model"]] = s
    return out, gpu or (entries[0]["gpu"] if entries else "")


def _network(model: str) -> str:
    """The network a row's model name trains, whose speed entry it shares: the name without its fine-tuning source
    ("x<-yolov8n") and its recipe variant ("x@ssm-decay")."""
    return model.split("<-")[0].split("@")[0]


def _f(v, fmt="{:.3f}"):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)


def table(doc: dict) -> str:
    agg = aggregate(doc)
    speed, gpu = _speed_by_model(doc)
    lines = []
    calls = doc.get("calls", [])
    if calls:
        c = calls[-1]
        lines.append(f"GPU {c.get('gpu')}, torch {c.get('torch')}, triton {c.get('triton', '-')}, Ultralytics "
                     f"{c.get('ultralytics')}, commit {c.get('commit')}; {len(calls)} call(s). Recipe of the latest: "
                     f"{c['grid'].get('epochs')} epochs, imgsz {c['grid'].get('imgsz')}, batch {c['grid'].get('batch')}, "
                     "AdamW lr0 0.003, from scratch, last.pt (EMA) validated on the val split (and the test split "
                     "where the dataset has one: designs are chosen on val, reported on test).")
        lines.append("")
    lat_px = calls[-1].get("grid", {}).get("latency_imgsz", 640) if calls else 640
    lines += [f"Speed on {gpu or '-'}: latency eager fp16 (fp32 on a CPU), Conv+BN fused, {lat_px} px, CUDA-synchronised "
              "medians; training step at 640 px, batch 32, fp16 AMP. Params and GFLOPs (at 640, the SSM work counted: "
              "yolo_bimamba.flops) of the 80-class model.", ""]
    for mode in ("scratch", "finetune", "pretrain"):
        keys = sorted({k for k in agg if k[0] == mode}, key=lambda k: (k[2], -agg[k]["mAP50_95"]
                                                                       if not math.isnan(agg[k]["mAP50_95"]) else 0))
        if not keys:
            continue
        test = any(not math.isnan(agg[k]["test_mAP50_95"]) for k in keys)
        lines += [f"### {mode}", "",
                  "| dataset | model | seeds | mAP50 | mAP50-95 | " + ("test mAP50-95 | " if test else "") +
                  "params (M) | GFLOPs | lat b1 ms | lat b32 ms | step img/s |",
                  "|---|---|---:|---:|---:|" + ("---:|" if test else "") + "---:|---:|---:|---:|---:|"]
        for k in keys:
            a = agg[k]
            s = speed.get(_network(k[1]), {})
            fail = f" ({a['failed']} failed)" if a["failed"] else ""
            t = f"{_f(a['test_mAP50_95'])} ± {_f(a['test_mAP50_95_std'])} | " if test else ""
            lines.append(
                f"| {k[2]} | {k[1]} | {a['n']}{fail} | {_f(a['mAP50'])} ± {_f(a['mAP50_std'])} | "
                f"{_f(a['mAP50_95'])} ± {_f(a['mAP50_95_std'])} | {t}{_f(s.get('params', math.nan) / 1e6, '{:.2f}')} | "
                f"{_f(s.get('gflops'), '{:.2f}')} | {_f(s.get('latency_b1_ms'), '{:.2f}')} | "
                f"{_f(s.get('latency_b32_ms'), '{:.2f}')} | {_f(s.get('train_step_images_per_s'), '{:.0f}')} |")
        lines.append("")
    for metric, split in (("mAP50_95", "val"), ("test_mAP50_95", "test")):
        deltas = paired_deltas(doc, metric)
        if not deltas:
            continue
        lines += [f"### against the stock model, paired by seed ({split} split)", "",
                  f"mAP50-95 on the {split} split of each BiMamba2 model minus its stock model's trained with the same "
                  "seed (fine-tuned: from the same checkpoint), in points.", "",
                  "| dataset | model | stock | seeds | per seed | mean ± std | higher in |",
                  "|---|---|---|---:|---|---:|---:|"]
        for d in deltas:
            per = ", ".join(f"{x:+.1f}" for x in d["deltas"])
            lines.append(f"| {d['dataset']} | {d['model']} | {d['stock']} | {len(d['seeds'])} | {per} | "
                         f"{d['mean']:+.1f} ± {_f(d['std'], '{:.1f}')} | {d['wins']} of {len(d['seeds'])} |")
        lines.append("")
    failed = [r for r in doc.get("runs", {}).values() if r.get("status") != "ok"]
    if failed:
        lines += ["Failed runs: " + ", ".join(r["key"] for r in failed), ""]
    return "\n".join(lines) + "\n"


def plot(doc: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    agg = aggregate(doc)
    speed, gpu = _speed_by_model(doc)
    calls = doc.get("calls") or [{}]
    lat_px = calls[-1].get("grid", {}).get("latency_imgsz", 640)
    dtype = next((s.get("dtype") for s in speed.values() if s.get("dtype")), "float16")
    datasets = sorted({k[2] for k in agg if k[0] == "scratch"}) or sorted({k[2] for k in agg})
    fig, axes = plt.subplots(1, max(1, len(datasets)), figsize=(6 * max(1, len(datasets)), 4.5), squeeze=False)
    for ax, ds in zip(axes[0], datasets):
        pts = []
        for (mode, model, d), a in agg.items():
            lat = speed.get(_network(model), {}).get("latency_b1_ms")
            if d == ds and mode == "scratch" and lat is not None and not math.isnan(a["mAP50_95"]):
                pts.append((lat, a["mAP50_95"], model, a["mAP50_95_std"]))
        front = set(pareto([(x, y, n) for x, y, n, _ in pts]))
        for x, y, n, sd in pts:
            ours = "bimamba" in n or "hydra" in n
            ax.errorbar(x, y, yerr=sd, fmt="o" if ours else "s", color="C3" if ours else "C0", capsize=3)
            ax.annotate(n, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        fx = sorted((x, y) for x, y, n, _ in pts if n in front)
        if fx:
            ax.plot(*zip(*fx), "--", color="gray", label="Pareto front")
            ax.legend(loc="lower right", fontsize=8)
        ax.set_title(f"{ds}: mAP50-95 (mean ± std over seeds)")
        ax.set_xlabel(f"latency, batch 1, {dtype}, {lat_px} px (ms) on {gpu or '-'}")
        ax.set_ylabel("mAP50-95 (val)")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(doc: dict, out: Path):
    out.mkdir(parents=True, exist_ok=True)
    (out / "quality.md").write_text("# Detection quality benchmark\n\n" + table(doc))
    plot(doc, out / "quality.png")
