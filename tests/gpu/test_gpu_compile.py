"""GPU tests of the custom ops (ops.library, ops.bi_ssd.library) with the Triton backend: torch.library.opcheck on
CUDA tensors, and torch.compile (fullgraph=True: a graph break raises) against eager, outputs and gradients.

    python -m pytest -m gpu tests/gpu/test_gpu_compile.py -v

Under torch.compile the blocks call the custom ops, which run the same Triton kernels as eager (the launch counter
of ops.launch shows them running); CUDA-graph replay of the layers stays off there (backend_choice.compiling).
"""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

import torch._dynamo  # noqa: E402

from yolo_bimamba.nn import BiMamba2  # noqa: E402
from yolo_bimamba.nn.blocks import BiMambaLayer2D  # noqa: E402
from yolo_bimamba.ops import launch  # noqa: E402
from yolo_bimamba.ops.bi_ssd import tuning  # noqa: E402

OPS = torch.ops.yolo_bimamba
DEV = "cuda"


def _t(*shape, dtype=torch.float32, lo=None, hi=None):
    t = torch.randn(*shape, device=DEV, dtype=dtype)
    if lo is not None:
        t = t.uniform_(lo, hi)
    return t.requires_grad_(True)


def _ssd_args(b, l, h, p, g, n, dtype, separate=False):
    args = [_t(b, l, h, p, dtype=dtype), _t(b, l, h, lo=-1.0, hi=1.0), _t(h, lo=-2.0, hi=-0.5),
            _t(b, l, g, n, dtype=dtype), _t(b, l, g, n, dtype=dtype), _t(h), _t(h, lo=-1.0, hi=0.5)]
    args += ([_t(b, l, h, lo=-1.0, hi=1.0), _t(b, l, g, n, dtype=dtype), _t(b, l, g, n, dtype=dtype)]
             if separate else [None, None, None])
    return args


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("mode", ["bimamba", "hydra"])
def test_opcheck_bi_ssd_triton(dtype, mode):
    """Schema, fake outputs (the kept dt and boundary states: two segments forced), autograd registration and
    AOTAutograd with dynamic shapes, on CUDA tensors with the Triton backend."""
    separate = mode == "hydra"
    args = _ssd_args(2, 3 * tuning.SEG_MULTIPLE + 5, 4, 32, 2, 32, dtype, separate=separate)
    with tuning.force_config(seg=tuning.SEG_MULTIPLE):
        torch.library.opcheck(OPS.bi_ssd, (*args, 64, True, 1e-4, 10.0, "both", separate, "triton", True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_opcheck_block_ops_triton(dtype):
    torch.library.opcheck(OPS.dwconv_silu, (_t(2, 37, 48, dtype=dtype), _t(48, 1, 7), _t(48), "triton"))
    torch.library.opcheck(OPS.gated_rmsnorm, (_t(2, 37, 64, dtype=dtype), _t(2, 37, 64, dtype=dtype), _t(64), 1e-5,
                                              "triton"))
    torch.library.opcheck(OPS.layer_norm_channels_first, (_t(2, 32, 5, 7, dtype=dtype), _t(32), _t(32), 1e-5,
                                                          "triton"))


def _compare(module, x, backend, tol, mode=None):
    """Eager and torch.compile(fullgraph=True) outputs and gradients of ``module`` on ``x``; the compiled run must
    launch Triton kernels (the custom ops' Triton backend). With ``mode="reduce-overhead"`` the compiled steps after
    the first are CUDA-graph replays, which launch nothing from Python: the check is then of every step's result."""
    ref = module(x)
    g = torch.randn_like(ref)
    params = [x] + [p for p in module.parameters() if p.requires_grad]
    g_ref = torch.autograd.grad(ref, params, g)
    torch._dynamo.reset()
    compiled = torch.compile(module, backend=backend, fullgraph=True, mode=mode)
    before = launch.counts["direct"] + launch.counts["triton"]
    for step in range(3 if mode == "reduce-overhead" else 2):  # the first compiles (and autotunes where needed)
        torch.compiler.cudagraph_mark_step_begin()
        out = compiled(x)
        got = torch.autograd.grad(out, params, g)
        torch.testing.assert_close(out, ref, rtol=tol, atol=tol, msg=lambda m: f"step {step}: {m}")
        for a, b in zip(got, g_ref):
            torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=lambda m: f"step {step}: {m}")
    assert launch.counts["direct"] + launch.counts["triton"] > before, "no Triton kernel ran in the compiled steps"


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_bimamba2_matches_eager(backend):
    torch.manual_seed(0)
    m = BiMamba2(64, d_state=32, headdim=32, chunk_size=64).to(DEV)
    _compare(m, torch.randn(4, 1600, 64, device=DEV, requires_grad=True), backend, 2e-4)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("scan", ["row", "rowcol"])
def test_compile_bimamba_layer2d_train_matches_eager(backend, scan):
    torch.manual_seed(0)
    layer = BiMambaLayer2D(64, scan=scan).to(DEV).train()
    _compare(layer, torch.randn(4, 64, 40, 40, device=DEV, requires_grad=True), backend, 2e-4)


def test_compile_reduce_overhead_layer_train_matches_eager():
    """torch.compile(mode="reduce-overhead") (Ultralytics' compile=reduce-overhead): Inductor's graphs with our custom
    ops replayed as CUDA graphs; three training steps, each's output and gradients equal eager's."""
    torch.manual_seed(0)
    layer = BiMambaLayer2D(64).to(DEV).train()
    _compare(layer, torch.randn(4, 64, 20, 20, device=DEV, requires_grad=True), "inductor", 2e-4,
             mode="reduce-overhead")


def test_compile_under_fp16_autocast_matches_eager():
    """fp16 AMP (Ultralytics' default): the scan runs in bf16 under torch.compile as in eager (the trace-time
    bf16-tensor-core check is a constant for Dynamo), outputs and gradients within fp16 rounding of eager."""
    torch.manual_seed(0)
    layer = BiMambaLayer2D(64).to(DEV).train()
    x = torch.randn(4, 64, 20, 20, device=DEV, requires_grad=True)
    with torch.autocast("cuda", dtype=torch.float16):
        ref = layer(x).float()
        torch._dynamo.reset()
        out = torch.compile(layer, fullgraph=True)(x).float()
    torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2)
    g = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(out, [x, layer.mixer.A_log], g),
                    torch.autograd.grad(ref, [x, layer.mixer.A_log], g)):
        torch.testing.assert_close(a, b, rtol=5e-2, atol=5e-2)


def test_detector_training_step_has_no_graph_break():
    """yolov8n-bimamba's training forward under Dynamo on the GPU: one graph, no break."""
    pytest.importorskip("ultralytics", reason="the detector needs Ultralytics (not installed on this machine)")
    import yolo_bimamba  # noqa: F401  (registers the blocks)
    from ultralytics.nn.tasks import DetectionModel

    model = DetectionModel("yolov8n-bimamba.yaml", nc=80, verbose=False).to(DEV).train()
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(model)(torch.randn(2, 3, 320, 320, device=DEV))
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1, explanation.break_reasons
