"""fp16 ONNX export, ``yolo export model=best.pt format=onnx half=True device=0`` (Ultralytics exports half only on a
GPU), run by onnxruntime on the CPU in a process where yolo_bimamba, triton and ultralytics cannot be imported (the
runner of tests/test_export.py), against the fp32 PyTorch model.

    python -m pytest -m gpu tests/gpu/test_gpu_export.py -v   # needs CUDA, ultralytics, onnx, onnxruntime, onnxslim

Bound (fp16 against fp32): the outputs are box coordinates in pixels (up to the image size) and class scores in
[0, 1]. fp16 keeps 11 significant bits, a relative spacing of 2**-11 = 4.9e-4: at the largest box coordinate that is
one ulp of the output itself. Rounding through ~100 fp16 layers adds a few ulps (measured on the CPU, 320 px, an
untrained yolov8n-bimamba exported the same way by hand: 4.5e-4 of the largest coordinate with onnxruntime, 8.7e-4
with PyTorch's fp16). The test allows 5e-3 of the largest coordinate for boxes (about ten ulps) and 5e-3 absolute
for scores; a broken block errs by O(1).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
pytest.importorskip("ultralytics", reason="needs ultralytics: install the .whl wheels first")
pytest.importorskip("onnxruntime", reason="needs onnx, onnxruntime and onnxslim wheels next to the others")

from test_export import _BLOCKED_RUNNER, REPO, save_fp16_checkpoint  # noqa: E402  (tests/ is on sys.path: its conftest)

IMGSZ = 320
BOX_TOL, SCORE_TOL = 5e-3, 5e-3


@pytest.mark.parametrize("model", ["yolov8n-bimamba.yaml", "yolov8n-bimamba-p5.yaml"])
def test_onnx_half_export_runs_without_package(tmp_path, model):
    from ultralytics import YOLO

    path = save_fp16_checkpoint(model, tmp_path / "best.pt", IMGSZ)
    x = torch.rand(1, 3, IMGSZ, IMGSZ, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = YOLO(str(path)).model.float().eval()(x)[0].double().numpy()
    out = Path(YOLO(str(path)).export(format="onnx", imgsz=IMGSZ, device=0, half=True))
    import onnx

    graph = onnx.load(str(out)).graph
    assert graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16  # a real fp16 export
    x_path, y_path = tmp_path / "x.npz", tmp_path / "y.npz"
    np.savez(x_path, b1=x.half().numpy())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["YOLO_BIMAMBA_AUTOLOAD"] = "0"
    r = subprocess.run([sys.executable, "-c", _BLOCKED_RUNNER, "onnx", str(out), str(x_path), str(REPO), str(y_path)],
                       env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    y = np.load(y_path)["b1"]
    assert y.dtype == np.float16 and y.shape == ref.shape and np.isfinite(y).all()
    y = y.astype(np.float64)
    box_err = np.abs(y[:, :4] - ref[:, :4]).max() / np.abs(ref[:, :4]).max()
    score_err = np.abs(y[:, 4:] - ref[:, 4:]).max()
    assert box_err <= BOX_TOL and score_err <= SCORE_TOL, (box_err, score_err)
