"""Test session set-up: offline Ultralytics, and the Triton interpreter on machines without CUDA.

TRITON_INTERPRET must be set before any Triton kernel module is imported, so it is decided here,
before the package is imported; `pytest -m gpu` on a CUDA machine runs the real kernels.
"""
import os
import shutil

os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_AUTOINSTALL", "0")
if "TRITON_INTERPRET" not in os.environ and shutil.which("nvidia-smi") is None:
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
