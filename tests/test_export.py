"""ONNX and TorchScript export of a yolo-bimamba detector; the exported files run without the package.

The exported files are loaded in a fresh process in which yolo_bimamba, triton and ultralytics cannot be imported
(a meta-path finder refuses them, the repository is off sys.path, the autoload hook is disabled), and their outputs
must match the PyTorch model's to 1e-4 relative.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import yolo_bimamba  # noqa: F401
from yolo_bimamba import ultralytics_glue as glue

glue.register()

REPO = Path(__file__).resolve().parents[1]
IMGSZ = 64

_BLOCKED_RUNNER = r"""
import sys
BLOCKED = ("yolo_bimamba", "triton", "ultralytics")

for m in list(sys.modules):
    assert m.split(".")[0] not in BLOCKED, m
for m in BLOCKED:  # what an uninstalled package looks like: import raises, importlib.util.find_spec gives None
    sys.modules[m] = None
repo = sys.argv[4]
sys.path[:] = [p for p in sys.path if p not in ("", ".") and not p.startswith(repo)]

import numpy as np
fmt, model_path, x_path = sys.argv[1:4]
x = np.load(x_path)
if fmt == "onnx":
    import onnxruntime as ort
    sess = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    y = sess.run(None, {sess.get_inputs()[0].name: x})[0]
else:
    import torch
    m = torch.jit.load(model_path, map_location="cpu").eval()
    with torch.no_grad():
        y = m(torch.from_numpy(x))
    y = (y[0] if isinstance(y, (list, tuple)) else y).numpy()
for m, mod in list(sys.modules.items()):
    assert mod is None or m.split(".")[0] not in BLOCKED, m
np.save(sys.argv[5], y)
"""


# p5: train.py's default; yolo11n-bimamba: stock-extension blocks (C3k2BiMamba through the exporter's forward_split)
@pytest.fixture(scope="module", params=["yolov8n-bimamba.yaml", "yolov8n-bimamba-p5.yaml", "yolo11n-bimamba.yaml"])
def checkpoint(tmp_path_factory, request):
    from ultralytics import YOLO

    tmp = tmp_path_factory.mktemp("export")
    det = YOLO(request.param).model
    with torch.no_grad():  # layer scales (identity at init) made non-zero, so that the mixers count in the outputs
        for name, p in det.named_parameters():
            if name.rsplit(".", 1)[-1] in ("gamma", "gamma2"):
                p.fill_(0.5)
    det.train()
    with torch.no_grad():  # non-trivial BN statistics, so that BN folding at export is exercised
        for _ in range(2):
            det(torch.rand(2, 3, IMGSZ, IMGSZ))
    det.eval()
    path = tmp / "best.pt"
    torch.save({"model": copy.deepcopy(det).half(), "train_args": {"imgsz": IMGSZ}}, path)  # like best.pt (fp16)
    x = torch.rand(1, 3, IMGSZ, IMGSZ, generator=torch.Generator().manual_seed(0))
    np.save(tmp / "x.npy", x.numpy())
    with torch.no_grad():
        ref = YOLO(str(path)).model.float().eval()(x)[0].numpy()
    return path, tmp / "x.npy", ref


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_export_runs_without_package(checkpoint, fmt):
    from ultralytics import YOLO

    path, x_path, ref = checkpoint
    out = YOLO(str(path)).export(format=fmt, imgsz=IMGSZ, device="cpu")
    assert Path(out).is_file()
    y_path = Path(out).with_suffix(".out.npy")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["YOLO_BIMAMBA_AUTOLOAD"] = "0"
    r = subprocess.run([sys.executable, "-c", _BLOCKED_RUNNER, fmt, str(out), str(x_path), str(REPO), str(y_path)],
                       env=env, cwd=path.parent, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    y = np.load(y_path)
    assert y.shape == ref.shape and np.isfinite(y).all()
    err = np.abs(y.astype(np.float64) - ref).max() / np.abs(ref).max()
    assert err <= 1e-4, f"{fmt}: max relative error {err:.2e}"


def test_blocked_runner_really_blocks(tmp_path):
    code = _BLOCKED_RUNNER.split("import numpy as np")[0] + "\nimport yolo_bimamba\n"
    r = subprocess.run([sys.executable, "-c", code, "onnx", "x", "x", str(REPO), "y"], capture_output=True, text=True,
                       cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode != 0 and "ModuleNotFoundError" in r.stderr and "yolo_bimamba" in r.stderr
