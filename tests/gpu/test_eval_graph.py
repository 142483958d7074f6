"""GPU tests of the inference replay of BiMamba layers (yolo_bimamba.nn.cuda_graph.run_eval).

    python -m pytest -m gpu tests/gpu/test_eval_graph.py -v    # needs CUDA, torch, triton and ultralytics

In eval mode with gradients off, a layer's small input replays a captured forward graph (YOLO_BIMAMBA_EVAL_GRAPHS=1,
the default, set for every test here). Each test compares with the eager layer (YOLO_BIMAMBA_CUDA_GRAPHS=0) on the same weights
and inputs, and checks when a graph is (not) made: a key is captured the second time it comes.
"""
from __future__ import annotations

import copy

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
pytest.importorskip("ultralytics", reason="the blocks use Ultralytics' Conv: install the .whl wheels first")

from yolo_bimamba.nn import C2fBiMamba, C2fHydra, cuda_graph  # noqa: E402
from yolo_bimamba.nn.blocks import BiMambaLayer2D  # noqa: E402

# the same kernels on the same values (the forward has no atomics); fp16 leaves room for cuBLAS picking another
# algorithm inside a capture
TOL = {torch.float32: 1e-6, torch.float16: 2e-3}


@pytest.fixture(autouse=True)
def _eval_graphs_on(monkeypatch):
    monkeypatch.setenv("YOLO_BIMAMBA_EVAL_GRAPHS", "1")  # (the default; set in case the environment turned it off)


def rel(a, b):
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def layers(block):
    return [m for m in block.modules() if isinstance(m, BiMambaLayer2D)]


def eager(block, x, monkeypatch, mode=torch.inference_mode):
    monkeypatch.setenv("YOLO_BIMAMBA_CUDA_GRAPHS", "0")
    with mode():
        y = block(x)
    monkeypatch.setenv("YOLO_BIMAMBA_CUDA_GRAPHS", "1")
    return y


@pytest.mark.parametrize("mode", [torch.inference_mode, torch.no_grad], ids=["inference_mode", "no_grad"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("kind", ["bimamba-rowcol-mlp", "bimamba-local-pos", "hydra"])
def test_replay_equals_eager(kind, dtype, mode, monkeypatch):
    torch.manual_seed(0)
    if kind == "hydra":
        block = C2fHydra(64, 64, n=2)
    elif kind == "bimamba-local-pos":
        block = C2fBiMamba(64, 64, n=1, local=5, pos=True, layer_scale=0.5)
    else:
        block = C2fBiMamba(64, 64, n=2, scan="rowcol", mlp_ratio=2.0)
    block = block.cuda().eval().to(dtype)
    ref = copy.deepcopy(block)
    xs = [torch.randn(2, 64, 12, 10, device="cuda", dtype=dtype) for _ in range(3)]
    monkeypatch.setenv("YOLO_BIMAMBA_CUDA_GRAPHS", "1")
    with mode():
        got = [block(x) for x in xs]
    want = [eager(ref, x, monkeypatch, mode) for x in xs]
    assert all(cuda_graph.eval_graphed_shapes(m) == [(2, 32, 12, 10)] for m in layers(block))
    assert all(not cuda_graph.eval_graphed_shapes(m) for m in layers(ref))
    for a, b in zip(got, want):  # the first output is intact after two more replays
        assert a.dtype == dtype and torch.isfinite(a).all() and rel(a, b) <= TOL[dtype], rel(a, b)


def test_weights_changed_in_place_or_replaced(monkeypatch):
    """A replay reads the parameters in place (an update is seen); half() replaces them: a new graph, in fp16."""
    torch.manual_seed(0)
    layer = BiMambaLayer2D(32, layer_scale=1.0).cuda().eval()
    x = torch.randn(1, 32, 9, 7, device="cuda")
    with torch.inference_mode():
        layer(x)
    with torch.no_grad():
        for p in layer.parameters():
            p.mul_(1.1)
    with torch.inference_mode():
        got = layer(x)
    assert rel(got, eager(layer, x, monkeypatch)) <= TOL[torch.float32]
    layer.half()
    with torch.inference_mode():
        layer(x.half())  # a new key (the parameters were replaced): eager the first time, captured the second
        got = layer(x.half())
    assert got.dtype == torch.float16 and rel(got, eager(layer, x.half(), monkeypatch)) <= TOL[torch.float16]
    assert cuda_graph.eval_graphed_shapes(layer) == [(1, 32, 9, 7)] * 2


def test_at_most_max_shapes_kept_least_recent_dropped(monkeypatch):
    torch.manual_seed(0)
    layer = BiMambaLayer2D(16).cuda().eval()
    shapes = [(1, 16, h, 5) for h in range(3, 3 + cuda_graph.MAX_SHAPES + 1)]
    with torch.inference_mode():
        for s in shapes:
            x = torch.randn(*s, device="cuda")
            for _ in range(2):  # captured the second time
                assert rel(layer(x), eager(layer, x, monkeypatch)) <= TOL[torch.float32]
    assert cuda_graph.eval_graphed_shapes(layer) == shapes[1:]


def test_eager_where_a_replay_is_not_safe_or_not_worth_it(monkeypatch):
    """Gradients on, training mode, a hook, an input above YOLO_BIMAMBA_EVAL_GRAPH_MAX_NUMEL, inference replay off,
    all replay off: no inference graph, and the output is the eager one."""
    torch.manual_seed(0)
    layer = BiMambaLayer2D(32).cuda().eval()
    x = torch.randn(1, 32, 6, 6, device="cuda")
    want = eager(layer, x, monkeypatch)
    assert rel(layer(x), want) <= TOL[torch.float32]  # gradients on
    layer.train()
    with torch.no_grad():
        layer(x)
    layer.eval()
    h = layer.register_forward_hook(lambda *a: None)
    with torch.inference_mode():
        layer(x)
    h.remove()
    monkeypatch.setenv("YOLO_BIMAMBA_EVAL_GRAPH_MAX_NUMEL", str(x.numel() - 1))
    with torch.inference_mode():
        layer(x)
    monkeypatch.delenv("YOLO_BIMAMBA_EVAL_GRAPH_MAX_NUMEL")
    monkeypatch.setenv("YOLO_BIMAMBA_EVAL_GRAPHS", "0")
    with torch.inference_mode():
        layer(x)
    monkeypatch.setenv("YOLO_BIMAMBA_EVAL_GRAPHS", "1")
    monkeypatch.setenv("YOLO_BIMAMBA_CUDA_GRAPHS", "0")
    with torch.inference_mode():
        layer(x)
    assert not cuda_graph.eval_graphed_shapes(layer)
    monkeypatch.setenv("YOLO_BIMAMBA_CUDA_GRAPHS", "1")
    with torch.inference_mode():
        assert rel(layer(x), want) <= TOL[torch.float32]
        assert not cuda_graph.eval_graphed_shapes(layer)  # the first call of a key is eager
        assert rel(layer(x), want) <= TOL[torch.float32]
    assert cuda_graph.eval_graphed_shapes(layer) == [(1, 32, 6, 6)]


@pytest.mark.parametrize("yaml,shape", [("bimamba.yaml", (1, 3, 320, 256)), ("yolov8n-bimamba.yaml", (1, 3, 320, 256)),
                                        ("bimamba.yaml", (32, 3, 640, 640))], ids=["b1", "c2f-b1", "b32-640"])
def test_fused_half_detector_equals_eager(yaml, shape, monkeypatch):
    """A fused fp16 detector as ``yolo predict`` runs it, at batch 1, and at batch 32 and 640 px with the replay's
    limit raised to cover it: every BiMamba layer replays, the outputs are the eager ones."""
    from ultralytics import YOLO

    torch.manual_seed(0)
    monkeypatch.setenv("YOLO_BIMAMBA_EVAL_GRAPH_MAX_NUMEL", str(1 << 24))
    model = YOLO(yaml).model.fuse().eval().cuda().half()
    x = torch.rand(*shape, device="cuda", dtype=torch.float16)
    with torch.inference_mode():
        model(x)
        got = model(x)[0]  # the second call captures
    want = eager(model, x, monkeypatch)[0]
    assert all(cuda_graph.eval_graphed_shapes(m) for m in layers(model))
    assert rel(got, want) <= TOL[torch.float16], rel(got, want)
