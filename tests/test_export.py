"""ONNX, TorchScript and OpenVINO export of a yolo-bimamba detector; the exported files run without the package.

The exported files are loaded in a fresh process in which yolo_bimamba, triton and ultralytics cannot be imported
(a meta-path finder refuses them, the repository is off sys.path, the autoload hook is disabled), and their outputs
must match the PyTorch model's to 1e-4 relative: static exports at the export size (64 px, batch 1); the dynamic
ONNX export (``dynamic=True``, traced at 64 px) at batch 1 and 2 and at 64, 96 and 128 px - at 128 px the P3 maps
hold 256 tokens, four scan chunks where the trace saw one. OpenVINO runs with ``INFERENCE_PRECISION_HINT=f32``
(its CPU default may be bf16). fp16 ONNX (``half=True``) needs a GPU: tests/gpu/test_gpu_export.py.
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
IMGSZ = 64  # the export (trace) size
SHAPES = [(1, 64), (2, 64), (1, 96), (2, 128)]  # (batch, px) the dynamic ONNX export runs at
STATIC = "b1_64"

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
xs = dict(np.load(x_path))  # name -> input (b, 3, h, w)
if fmt == "onnx":
    import onnxruntime as ort
    sess = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    run = lambda x: sess.run(None, {sess.get_inputs()[0].name: x})[0]
elif fmt == "openvino":
    import openvino as ov
    compiled = ov.Core().compile_model(model_path, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    run = lambda x: compiled(x)[compiled.output(0)]
else:
    import torch
    m = torch.jit.load(model_path, map_location="cpu").eval()
    def run(x):
        with torch.no_grad():
            y = m(torch.from_numpy(x))
        return (y[0] if isinstance(y, (list, tuple)) else y).numpy()
ys = {k: run(x) for k, x in xs.items()}
for m, mod in list(sys.modules.items()):
    assert mod is None or m.split(".")[0] not in BLOCKED, m
np.savez(sys.argv[5], **ys)
"""


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """model YAML -> (best.pt like Ultralytics writes it, its folder, PyTorch outputs at SHAPES), built once each."""
    made = {}

    def get(name):
        if name not in made:
            made[name] = _make_checkpoint(name, tmp_path_factory.mktemp("export"))
        return made[name]

    return get


def save_fp16_checkpoint(name, path, imgsz, layer_scale=None):
    """The detector of YAML ``name`` with non-trivial BN statistics (so that BN folding at export is exercised) and,
    given ``layer_scale``, its layer scales (identity at init) set to it so that the mixers count in the outputs,
    saved to ``path`` like a best.pt (fp16). Shared with tests/gpu/test_gpu_export.py."""
    from ultralytics import YOLO

    det = YOLO(name).model
    if layer_scale is not None:
        with torch.no_grad():
            for pname, p in det.named_parameters():
                if pname.rsplit(".", 1)[-1] in ("gamma", "gamma2"):
                    p.fill_(layer_scale)
    det.train()
    with torch.no_grad():
        for _ in range(2):
            det(torch.rand(2, 3, imgsz, imgsz))
    det.eval()
    torch.save({"model": copy.deepcopy(det).half(), "train_args": {"imgsz": imgsz}}, path)
    return path


def _make_checkpoint(name, tmp):
    from ultralytics import YOLO

    path = save_fp16_checkpoint(name, tmp / "best.pt", IMGSZ, layer_scale=0.5)
    gen = torch.Generator().manual_seed(0)
    xs = {f"b{b}_{s}": torch.rand(b, 3, s, s, generator=gen) for b, s in SHAPES}
    np.savez(tmp / "x_static.npz", **{k: x.numpy() for k, x in xs.items() if k == STATIC})
    np.savez(tmp / "x_dynamic.npz", **{k: x.numpy() for k, x in xs.items()})
    with torch.no_grad():
        model = YOLO(str(path)).model.float().eval()
        refs = {k: model(x)[0].numpy() for k, x in xs.items()}
    return path, tmp, refs


# p5: train.py's default (one block, at P5); yolov8n-bimamba: blocks at P3-P5, whose P3 maps span several scan chunks
# at 128 px, so the dynamic export and OpenVINO (the slowest conversion) run on it; yolo11n-bimamba: stock-extension
# blocks (C3k2BiMamba through the exporter's forward_split)
CASES = [("yolov8n-bimamba.yaml", "onnx", False), ("yolov8n-bimamba.yaml", "onnx", True),
         ("yolov8n-bimamba.yaml", "torchscript", False), ("yolov8n-bimamba.yaml", "openvino", False),
         ("yolov8n-bimamba-p5.yaml", "onnx", False), ("yolov8n-bimamba-p5.yaml", "torchscript", False),
         ("yolo11n-bimamba.yaml", "onnx", False), ("yolo11n-bimamba.yaml", "torchscript", False)]


@pytest.mark.parametrize("model,fmt,dynamic", CASES)
def test_export_runs_without_package(checkpoint, model, fmt, dynamic):
    from ultralytics import YOLO

    path, tmp, refs = checkpoint(model)
    out = Path(YOLO(str(path)).export(format=fmt, imgsz=IMGSZ, device="cpu", dynamic=dynamic))
    if fmt == "openvino":  # a folder holding best.xml / best.bin
        out = out / path.with_suffix(".xml").name
    assert out.is_file()
    x_path = tmp / ("x_dynamic.npz" if dynamic else "x_static.npz")
    y_path = tmp / f"{fmt}{'_dynamic' if dynamic else ''}.out.npz"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["YOLO_BIMAMBA_AUTOLOAD"] = "0"
    r = subprocess.run([sys.executable, "-c", _BLOCKED_RUNNER, fmt, str(out), str(x_path), str(REPO), str(y_path)],
                       env=env, cwd=path.parent, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ys = dict(np.load(y_path))
    assert sorted(ys) == sorted(np.load(x_path))
    assert len(ys) == (len(SHAPES) if dynamic else 1)
    for k, y in ys.items():
        ref = refs[k]
        assert y.shape == ref.shape and np.isfinite(y).all(), (k, y.shape, ref.shape)
        err = np.abs(y.astype(np.float64) - ref).max() / np.abs(ref).max()
        assert err <= 1e-4, f"{fmt} ({k}): max relative error {err:.2e}"


def test_blocked_runner_really_blocks(tmp_path):
    code = _BLOCKED_RUNNER.split("import numpy as np")[0] + "\nimport yolo_bimamba\n"
    r = subprocess.run([sys.executable, "-c", code, "onnx", "x", "x", str(REPO), "y"], capture_output=True, text=True,
                       cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode != 0 and "ModuleNotFoundError" in r.stderr and "yolo_bimamba" in r.stderr
