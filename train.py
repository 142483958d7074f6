#!/usr/bin/env python
"""Train a yolo-bimamba detector with Ultralytics.

    python train.py                                   # default model on the default digits dataset
    python train.py model=yolov8s-bimamba.yaml epochs=30 imgsz=320 batch=32 device=0
    python train.py --model bimamba.yaml --data digits.yaml --epochs 5 --amp false

Every option is passed through to Ultralytics' trainer (``model.train(**options)``), as ``key=value``,
``--key value`` or ``--key=value`` (a bare ``--flag`` means ``flag=True``); ``model`` selects the model (YAML or
checkpoint). With no arguments: ``bimamba.yaml`` (scale n) on ``digits.yaml`` (scenes of scikit-learn's handwritten
digits, built offline on first use) with CPU-friendly settings, on the GPU when one is present.

Offline-safe: YOLO_OFFLINE defaults to true (no downloads; the CUDA AMP check is skipped when its reference model is
not on disk) and the plotting fonts come from matplotlib. At the end the script prints the validation mAP after the
first and the last epoch and the path of best.pt.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

# Before anything imports Ultralytics (8.3 only honours the spelling "true").
if os.environ.get("YOLO_OFFLINE", "").strip().lower() in {"", "1", "true", "yes", "on", "y", "t"}:
    os.environ["YOLO_OFFLINE"] = "true"
os.environ.setdefault("YOLO_AUTOINSTALL", "0")

DEFAULT_MODEL = "bimamba.yaml"
DEFAULT_DATA = "digits.yaml"
# CPU defaults (measured on a 2-core CPU with the default model, bimamba.yaml = yolov8n-bimamba-p5: 76 s wall, val
# mAP50 0 -> 0.33 over 10 epochs): small images, small batches for more optimizer steps. GPU defaults: more epochs and
# larger batches.
CPU_DEFAULTS = dict(epochs=10, imgsz=128, batch=8, workers=max(1, min(4, (os.cpu_count() or 2) - 1)))
GPU_DEFAULTS = dict(epochs=30, imgsz=160, batch=32, workers=8)
# For the digits datasets (from scratch, few steps): AdamW at a fixed lr, short warm-up, no mosaic, and no
# left-right flips (mirrored digits are other symbols).
DIGITS_DEFAULTS = dict(optimizer="AdamW", lr0=0.003, warmup_epochs=1.0, close_mosaic=0, mosaic=0.0, fliplr=0.0,
                       scale=0.3)


def parse_args(argv: list[str]) -> dict:
    """key=value / --key value / --key=value / --flag -> dict of typed values (Ultralytics' own value parsing)."""
    from ultralytics.cfg import smart_value

    out, i = {}, 0
    while i < len(argv):
        a = argv[i]
        if a in {"-h", "--help"}:
            print(__doc__)
            sys.exit(0)
        if a.startswith("--"):
            a = a[2:]
            if "=" in a:
                k, v = a.split("=", 1)
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--") and "=" not in argv[i + 1]:
                k, v = a, argv[i + 1]
                i += 1
            else:
                k, v = a, "True"
        elif "=" in a:
            k, v = a.split("=", 1)
        else:
            raise SystemExit(f"train.py: cannot parse argument {a!r} (use key=value or --key value)")
        k = k.replace("-", "_")
        if not k:
            raise SystemExit(f"train.py: empty option name in {argv[i]!r}")
        out[k] = smart_value(v)
        i += 1
    return out


def main(argv: list[str] | None = None):
    args = parse_args(sys.argv[1:] if argv is None else argv)

    import torch

    import yolo_bimamba  # noqa: F401  (registers the blocks, YAML names and offline fixes with Ultralytics)
    from yolo_bimamba.ultralytics_glue import register
    from ultralytics import YOLO

    register()
    model_name = args.pop("model", DEFAULT_MODEL)
    args.setdefault("data", DEFAULT_DATA)
    dev = args.get("device")
    cuda = torch.cuda.is_available() and not (isinstance(dev, str) and dev.lower() in {"cpu", "mps"})
    for k, v in (GPU_DEFAULTS if cuda else CPU_DEFAULTS).items():
        args.setdefault(k, v)
    if str(args["data"]).startswith("digits"):
        for k, v in DIGITS_DEFAULTS.items():
            args.setdefault(k, v)
    args.setdefault("device", 0 if cuda else "cpu")
    args["workers"] = min(int(args["workers"]), os.cpu_count() or 1)

    history = {}  # epoch -> (mAP50, mAP50-95); the final validation of best.pt re-fires the callback

    def on_fit_epoch_end(trainer):
        if trainer.epoch >= trainer.epochs:  # the final validation of best.pt after the last epoch
            return
        m = trainer.metrics or {}
        history.setdefault(trainer.epoch + 1, (m.get("metrics/mAP50(B)"), m.get("metrics/mAP50-95(B)")))

    model = YOLO(model_name)
    model.add_callback("on_fit_epoch_end", on_fit_epoch_end)
    t0 = time.time()
    model.train(**args)
    wall = time.time() - t0

    trainer = model.trainer
    if not history and trainer is not None:  # DDP: the epochs ran in worker processes; rank 0 wrote results.csv
        history = _history_from_csv(Path(trainer.save_dir) / "results.csv")
    print(f"\ntrain.py: {model_name} on {args['data']}: {len(history)} epoch(s) in {wall:.0f} s")
    rows = [(ep, *v) for ep, v in sorted(history.items()) if v[0] is not None]
    for ep, m50, m5095 in rows:
        print(f"  epoch {ep:3d}: mAP50 {m50:.4f}  mAP50-95 {m5095:.4f}")
    if rows:
        print(f"  mAP50 first -> last epoch: {rows[0][1]:.4f} -> {rows[-1][1]:.4f}")
    if trainer is not None:
        print(f"  best weights: {trainer.best}")
    return model


def _history_from_csv(path: Path) -> dict:
    """epoch -> (mAP50, mAP50-95) from Ultralytics' results.csv ({} when it is missing)."""
    import csv

    if not path.is_file():
        return {}
    with path.open() as f:
        rows = [{k.strip(): v.strip() for k, v in r.items() if k} for r in csv.DictReader(f)]
    return {int(float(r["epoch"])): (float(r["metrics/mAP50(B)"]), float(r["metrics/mAP50-95(B)"]))
            for r in rows if r.get("epoch") and r.get("metrics/mAP50(B)")}


if __name__ == "__main__":
    main()
