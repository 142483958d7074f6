"""Per-epoch losses and mAP of a `train.py` run, read back from its console log (for runs whose results.csv did not
come back from the GPU machine): writes <log stem>.csv and one PNG with the curves of every log given. Ultralytics'
own results.csv files (any name ending in .csv) are read as they are.

    python benchmarks/train_log_curves.py benchmarks/out/*.log --png curves.png   # the logs gpu_train.sh copies there
    python benchmarks/train_log_curves.py ybm-runs/*/results.csv --png curves.png  # from a gpu_train.sh tgz

Losses are the training means Ultralytics prints at the end of each epoch's progress bar; mAP50 and mAP50-95 are
the validation figures train.py prints per epoch.
"""
from __future__ import annotations

import argparse
import csv
import re
from pathlib import Path

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# "      3/20     0.82G      4.357      4.086      3.386         33        160: 100% ..."
_PROGRESS = re.compile(r"^\s*(\d+)/(\d+)\s+\S+G\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+\d+\s+\d+:")
_MAP = re.compile(r"^\s*epoch\s+(\d+): mAP50 ([\d.]+)\s+mAP50-95 ([\d.]+)")


def parse(path: Path) -> list[dict]:
    text = _ANSI.sub("", path.read_text(errors="replace"))
    losses: dict[int, tuple] = {}
    maps: dict[int, tuple] = {}
    for line in re.split(r"[\r\n]", text):
        m = _PROGRESS.match(line)
        if m:  # the last progress line of an epoch carries its final running means
            losses[int(m.group(1))] = tuple(float(m.group(i)) for i in (3, 4, 5))
            continue
        m = _MAP.match(line)
        if m:
            maps[int(m.group(1))] = (float(m.group(2)), float(m.group(3)))
    rows = []
    for ep in sorted(set(losses) & set(maps)):
        box, cls, dfl = losses[ep]
        rows.append(dict(epoch=ep, box_loss=box, cls_loss=cls, dfl_loss=dfl, mAP50=maps[ep][0], mAP50_95=maps[ep][1]))
    if not rows:
        raise SystemExit(f"{path}: no epochs found (is it a train.py log?)")
    return rows


def read_results_csv(path: Path) -> list[dict]:
    """Rows of an Ultralytics results.csv in the form parse() returns."""
    with path.open(newline="") as f:
        rows = [{k.strip(): v for k, v in r.items()} for r in csv.DictReader(f)]
    return [dict(epoch=int(r["epoch"]), box_loss=float(r["train/box_loss"]), cls_loss=float(r["train/cls_loss"]),
                 dfl_loss=float(r["train/dfl_loss"]), mAP50=float(r["metrics/mAP50(B)"]),
                 mAP50_95=float(r["metrics/mAP50-95(B)"])) for r in rows]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", nargs="+", type=Path)
    ap.add_argument("--png", type=Path, default=None, help="curves of every run in one figure")
    args = ap.parse_args()
    runs = {}
    for log in args.logs:
        if log.suffix == ".csv":
            rows, out, name = read_results_csv(log), log, log.name.removesuffix(".csv").removesuffix(".results")
        else:
            rows, out, name = parse(log), log.with_suffix(".csv"), log.stem
            with out.open("w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows(rows)
        runs[name] = rows
        last = rows[-1]
        print(f"{name}: {len(rows)} epochs, box loss {rows[0]['box_loss']} -> {last['box_loss']}, "
              f"mAP50 {last['mAP50']:.3f}, mAP50-95 {last['mAP50_95']:.3f} -> {out}")
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 3, figsize=(15, 4))
        for name, rows in runs.items():
            ep = [r["epoch"] for r in rows]
            axes[0].plot(ep, [r["box_loss"] for r in rows], label=name)
            axes[1].plot(ep, [r["cls_loss"] for r in rows], label=name)
            axes[2].plot(ep, [r["mAP50_95"] for r in rows], label=name)
        for ax, title in zip(axes, ("train box loss", "train cls loss", "val mAP50-95")):
            ax.set_title(title)
            ax.set_xlabel("epoch")
            ax.grid(alpha=0.3)
        axes[2].legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.png, dpi=110)
        print("wrote", args.png)


if __name__ == "__main__":
    main()
