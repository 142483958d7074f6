"""GPU tests of whole-model CUDA-graph inference (yolo_bimamba.inference.graph_inference).

    python -m pytest -m gpu tests/gpu/test_gpu_inference_graph.py -v    # needs CUDA, torch, triton and ultralytics

A fused detection model with BiMamba2 blocks runs eagerly and through graph replays on the same inputs: the
outputs must agree, a replay must have happened, each new input shape gets its own graph, and an output the caller
keeps must not change when the next replay runs.
"""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
pytest.importorskip("ultralytics", reason="the detection models need Ultralytics: install the .whl wheels first")

from yolo_bimamba import graph_inference  # noqa: E402

# same kernels on the same buffers: the Triton kernels' fp32 atomics are in the backward only, so eval outputs are
# expected equal up to the ulps that cuDNN's algorithm choice may move
TOL = {torch.float32: 1e-5, torch.float16: 2e-3}


def detector(yaml):
    from ultralytics import YOLO

    return YOLO(yaml).model.fuse().eval().cuda()


def flat(out):
    return [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def rel(a, b):
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("yaml", ["yolov8n-bimamba.yaml", "yolov8n-bimamba-p5.yaml"])
def test_graph_replay_matches_eager(yaml, dtype):
    model = detector(yaml).to(dtype)
    x1 = torch.rand(2, 3, 256, 256, device="cuda", dtype=dtype)
    x2 = torch.rand(2, 3, 256, 256, device="cuda", dtype=dtype)
    x3 = torch.rand(1, 3, 320, 192, device="cuda", dtype=dtype)
    with torch.inference_mode():
        ref = [flat(model(x)) for x in (x1, x2, x3)]
        with graph_inference(model) as g:
            got1 = flat(model(x1))
            kept = [t.clone() for t in got1]
            got2 = flat(model(x2))  # a replay of the same graph: got1 must not change
            got3 = flat(model(x3))  # a new shape: a second graph
            assert len(g.graphs) == 2 and not g.failed
        assert "forward" not in vars(model)
    for got, want in ((got1, ref[0]), (got2, ref[1]), (got3, ref[2])):
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert a.shape == b.shape and torch.isfinite(a).all()
            assert rel(a, b) <= TOL[dtype], rel(a, b)
    for a, b in zip(got1, kept):
        assert torch.equal(a, b)


def test_training_mode_and_grad_stay_eager():
    model = detector("yolov8n-bimamba-p5.yaml")
    x = torch.rand(1, 3, 128, 128, device="cuda")
    with graph_inference(model) as g:
        with torch.no_grad():
            model.train()
            model(x)
            model.eval()
        model(x)  # gradients enabled
        assert not g.graphs
        with torch.no_grad():
            model(x)
        assert len(g.graphs) == 1
