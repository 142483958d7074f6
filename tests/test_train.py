"""1-epoch CPU training from our YAML: Python API, the stock `yolo` CLI, `yolo-bimamba`, train.py; fresh-process reload.

The stock-CLI test runs Ultralytics' own `yolo` console script, which knows nothing about this package: the blocks
come in through the `yolo_bimamba_autoload.pth` import hook. When the package is installed (pip install . or -e .)
the hook is in site-packages; otherwise the test installs the hook into a temporary user site directory
(PYTHONUSERBASE) to exercise the same mechanism.
"""

from __future__ import annotations

import csv
import importlib.util
import os
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import yolo_bimamba  # noqa: F401
from yolo_bimamba import ultralytics_glue as glue

glue.register()

REPO = Path(__file__).resolve().parents[1]
COMMON = ["epochs=1", "imgsz=64", "batch=16", "workers=0", "device=cpu", "plots=False", "exist_ok=True"]


def _env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("YOLO_OFFLINE", "true")
    env.setdefault("YOLO_AUTOINSTALL", "0")
    env.update(extra)
    return env


def _run(cmd, cwd, env=None, timeout=600):
    r = subprocess.run(cmd, cwd=cwd, env=env or _env(), capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{cmd} failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return r


def _check_run(save_dir: Path):
    best = save_dir / "weights" / "best.pt"
    assert best.is_file(), f"no best.pt in {save_dir}"
    rows = list(csv.DictReader((save_dir / "results.csv").open()))
    assert len(rows) == 1
    for k, v in rows[0].items():
        if "loss" in k:
            assert float(v) == float(v) and float(v) > 0, (k, v)  # finite, not NaN
    return best


def _reload_in_fresh_process(best: Path, tmp_path: Path):
    script = f"""
import sys
from ultralytics import YOLO
m = YOLO({str(best)!r})
names = {{type(l).__name__ for l in m.model.model}}
assert "C2fBiMamba" in names, names
import torch
with torch.no_grad():
    y = m.model.float().eval()(torch.rand(1, 3, 64, 64))[0]
assert torch.isfinite(y).all()
print("reloaded", y.shape)
"""
    r = _run([sys.executable, "-c", script], cwd=tmp_path)
    assert "reloaded" in r.stdout


def test_train_python_api(tmp_path):
    from ultralytics import YOLO

    model = YOLO("yolov8n-bimamba.yaml")
    model.train(data="digits-tiny.yaml", epochs=1, imgsz=64, batch=16, workers=0, device="cpu",
                project=str(tmp_path), name="api", exist_ok=True, plots=True, val=True)
    best = _check_run(tmp_path / "api")
    assert (tmp_path / "api" / "labels.jpg").is_file()  # plotting worked offline (fonts)
    _reload_in_fresh_process(best, tmp_path)


def _hook_installed() -> bool:
    r = subprocess.run([sys.executable, "-c", "import sys; print(any(getattr(f, '_yolo_bimamba_hook', False) "
                        "for f in sys.meta_path))"], capture_output=True, text=True, env=_env())
    return r.stdout.strip() == "True"


def _stock_yolo_cmd():
    """The stock `yolo` console script of this interpreter, run with this interpreter: in its scripts folder, or in
    the base interpreter's (a venv with --system-site-packages), or on PATH; a Python script only (not a shell shim,
    e.g. pyenv's, which this interpreter cannot run)."""
    dirs = [Path(sys.executable).parent, Path(sysconfig.get_path("scripts")),
            Path(sysconfig.get_path("scripts", vars={"base": sys.base_prefix, "platbase": sys.base_prefix}))]
    found = shutil.which("yolo")
    for cand in [d / "yolo" for d in dirs] + ([Path(found)] if found else []):
        if cand.is_file() and _is_python_script(cand):
            return [sys.executable, str(cand)]
    raise AssertionError(f"Ultralytics' `yolo` console script not found (looked in {dirs} and PATH)")


def _is_python_script(path: Path) -> bool:
    with open(path, "rb") as f:
        first = f.readline()
    return first.startswith(b"#!") and b"python" in first


def _hook_env(tmp_path: Path):
    """Environment in which the autoload .pth is active: as installed, or from a temporary user site."""
    if _hook_installed():
        return _env()
    spec = importlib.util.spec_from_file_location("_yb_setup", REPO / "setup.py")
    setup_mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup_mod)
    base = tmp_path / "userbase"
    env = _env(PYTHONUSERBASE=str(base))
    r = subprocess.run([sys.executable, "-c", "import site; print(site.getusersitepackages())"], env=env,
                       capture_output=True, text=True)
    assert site.ENABLE_USER_SITE, "user site disabled: install the package (pip install .) to test the stock CLI"
    usersite = Path(r.stdout.strip())
    usersite.mkdir(parents=True, exist_ok=True)
    (usersite / setup_mod.PTH_NAME).write_text(setup_mod.pth_text())
    return env


def test_train_stock_yolo_cli(tmp_path):
    env = _hook_env(tmp_path)
    # interpreter start must stay light: the hook must not import torch / ultralytics / yolo_bimamba by itself
    r = _run([sys.executable, "-c", "import sys; print(sorted(m for m in ('torch', 'ultralytics', 'yolo_bimamba') "
              "if m in sys.modules), any(getattr(f, '_yolo_bimamba_hook', False) for f in sys.meta_path))"],
             cwd=tmp_path, env=env)
    assert r.stdout.split("\n")[0] == "[] True", r.stdout
    work = tmp_path / "elsewhere"
    work.mkdir()
    _run([*_stock_yolo_cmd(), "train", "model=yolov8n-bimamba.yaml", "data=digits-tiny.yaml",
          f"project={tmp_path}", "name=cli", *COMMON], cwd=work, env=env)
    best = _check_run(tmp_path / "cli")
    _run([*_stock_yolo_cmd(), "val", f"model={best}", "data=digits-tiny.yaml", "imgsz=64", "batch=16",
          "workers=0", "device=cpu", "plots=False", f"project={tmp_path}", "name=cli-val"], cwd=work, env=env)
    r = _run([*_stock_yolo_cmd(), "predict", f"model={best}", f"source={_a_val_image()}", "imgsz=64", "device=cpu",
              "save=False"], cwd=work, env=env)
    assert "64x64" in r.stdout + r.stderr


def _a_val_image():
    from ultralytics.data.utils import check_det_dataset

    return sorted(Path(check_det_dataset("digits-tiny.yaml")["val"]).glob("*.png"))[0]


def test_yolo_bimamba_console_script(tmp_path):
    from yolo_bimamba.cli import main

    prog = sys.argv[:]
    try:
        main(["train", "model=bimamba.yaml", "data=digits-tiny.yaml", f"project={tmp_path}", "name=ybm", *COMMON])
    finally:
        sys.argv[:] = prog
    _check_run(tmp_path / "ybm")


def test_train_py(tmp_path):
    r = _run([sys.executable, str(REPO / "train.py"), "model=yolov8n-bimamba.yaml", "--data", "digits-tiny.yaml",
              "--epochs=1", "--imgsz", "64", "batch=16", "workers=0", f"project={tmp_path}", "name=trainpy",
              "plots=False", "exist_ok=True"], cwd=tmp_path)
    best = _check_run(tmp_path / "trainpy")
    assert f"best weights: {best}" in r.stdout
    assert "epoch   1: mAP50" in r.stdout


def test_train_py_parse_args():
    spec = importlib.util.spec_from_file_location("_yb_train", REPO / "train.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    args = mod.parse_args(["epochs=3", "--imgsz", "96", "--amp=false", "--cos-lr", "--lr0", "0.01", "name=x y"])
    assert args == {"epochs": 3, "imgsz": 96, "amp": False, "cos_lr": True, "lr0": 0.01, "name": "x y"}
    with pytest.raises(SystemExit):
        mod.parse_args(["oops"])


def test_train_py_reads_the_epochs_of_ddp_runs_from_results_csv(tmp_path):
    """Under DDP the epochs run in worker processes, so train.py's summary comes from the results.csv of rank 0
    (here one written by an 80-epoch GPU run of yolov8n-bimamba-p5)."""
    spec = importlib.util.spec_from_file_location("_yb_train", REPO / "train.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    csv_path = REPO / "tests/data/results-80-epochs.csv"
    hist = mod._history_from_csv(csv_path)
    assert sorted(hist) == list(range(1, 81))
    assert hist[1] == (0.0, 0.0) and 0.9 < hist[80][1] <= 1.0 and 0.85 < hist[80][0] <= 1.0
    assert mod._history_from_csv(tmp_path / "missing.csv") == {}
