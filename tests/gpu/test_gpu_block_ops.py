"""GPU tests of the fused block ops at the shapes of the detection models: the depthwise conv1d + SiLU
(yolo_bimamba.ops.dwconv), the gated RMSNorm (yolo_bimamba.ops.gated_norm) and the layers' channels-first token
LayerNorm (yolo_bimamba.ops.layer_norm).

    python -m pytest -m gpu tests/gpu/test_gpu_block_ops.py -v

Against float64 on random inputs, every config forced, NaN-poisoned output and gradient buffers, bitwise repeatable.
The activations come in fp32 or bf16 with fp32 weights (what AMP hands over from the in-projection).
"""
from __future__ import annotations

import functools

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

from fused_ops_check import check_against_float64, poisoned_run, rel  # noqa: E402
from yolo_bimamba.ops.dwconv import dwconv_silu, dwconv_silu_reference, force_config  # noqa: E402
from yolo_bimamba.ops.dwconv_kernels import CONFIGS  # noqa: E402
from yolo_bimamba.ops import gated_norm, gated_norm_kernels, layer_norm, layer_norm_kernels  # noqa: E402

# (b, L, channels) of the conv in yolov8n-bimamba at 640 px, batch 32 (P3, P4, P5 layers), and an odd one
SHAPES = {"p3": (32, 6400, 128), "p4": (32, 1600, 192), "p5": (32, 400, 320), "odd": (3, 1001, 77)}
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 5e-3}


def run_twice(op, leaves, dy, force_config, cfg):
    """Two poisoned runs of op and its gradients, which must be bitwise equal; the first one."""
    first, second = (poisoned_run(op, leaves, dy, force_config, cfg) for _ in range(2))
    for a, c in zip(first, second):
        assert torch.equal(a, c), "not bitwise repeatable"
    return first


@pytest.mark.parametrize("cfg", range(len(CONFIGS)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("shape", list(SHAPES), ids=list(SHAPES))
def test_matches_float64_every_config_and_repeats(shape, dtype, cfg):
    b, L, C = SHAPES[shape]
    g = torch.Generator(device="cuda").manual_seed(0)
    big = torch.randn(b, L, C + 40, device="cuda", generator=g).to(dtype)
    u = big[:, :, 16:16 + C].requires_grad_()  # a slice of a wider projection, as in the modules
    w = (torch.randn(C, 1, 7, device="cuda", generator=g) / 7 ** 0.5).requires_grad_()
    bias = torch.randn(C, device="cuda", generator=g).requires_grad_()
    dy = torch.randn(b, L, C, device="cuda", generator=g).to(dtype)
    got = run_twice(lambda *t: dwconv_silu(*t, backend="triton"), (u, w, bias), dy, force_config, cfg)
    check_against_float64(got, dwconv_silu_reference, (u, w, bias), dy, ("y", "du", "dweight", "dbias"), TOL[dtype],
                          (dtype, dtype, w.dtype, w.dtype))


# (b, L, d_inner) of the norm in yolov8n-bimamba at 640 px, batch 32, the widest of the s/m models, and an odd one
NORM_SHAPES = {"p3": (32, 6400, 64), "p5": (32, 400, 256), "wide": (4, 400, 1024), "odd": (3, 1001, 77)}


@pytest.mark.parametrize("cfg", range(len(gated_norm_kernels.CONFIGS)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("shape", list(NORM_SHAPES), ids=list(NORM_SHAPES))
def test_gated_norm_matches_float64_every_config_and_repeats(shape, dtype, cfg):
    b, L, d = NORM_SHAPES[shape]
    g = torch.Generator(device="cuda").manual_seed(0)
    big = torch.randn(b, L, 3 * d, device="cuda", generator=g).to(dtype)
    z = big[:, :, d:2 * d].requires_grad_()
    x = torch.randn(b, L, d, device="cuda", generator=g).to(dtype).requires_grad_()
    w = (1 + 0.3 * torch.randn(d, device="cuda", generator=g)).requires_grad_()
    dy = torch.randn(b, L, d, device="cuda", generator=g).to(dtype)
    got = run_twice(lambda *t: gated_norm.gated_rmsnorm(*t, 1e-5, backend="triton"), (x, z, w), dy,
                    gated_norm.force_config, cfg)
    check_against_float64(got, lambda *t: gated_norm.gated_rmsnorm_reference(*t, 1e-5), (x, z, w), dy,
                          ("y", "dx", "dz", "dweight"), TOL[dtype], (dtype, dtype, dtype, w.dtype))


# (N, C, H, W) of the layers' LayerNorm in yolov8n-bimamba (P3, P5) and yolov8s-bimamba (P5) at 640 px, batch 32,
# and an odd one
LN_SHAPES = {"n-p3": (32, 32, 80, 80), "n-p5": (32, 128, 20, 20), "s-p5": (32, 256, 20, 20), "odd": (3, 77, 13, 7)}


@pytest.mark.parametrize("cfg", range(len(layer_norm_kernels.CONFIGS)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("shape", list(LN_SHAPES), ids=list(LN_SHAPES))
def test_layer_norm_matches_float64_every_config_and_repeats(shape, dtype, cfg):
    n, c, h, w = LN_SHAPES[shape]
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(n, c, h, w, device="cuda", generator=g) * 2 + 0.5).to(dtype).requires_grad_()
    weight = (1 + 0.3 * torch.randn(c, device="cuda", generator=g)).requires_grad_()
    bias = (0.3 * torch.randn(c, device="cuda", generator=g)).requires_grad_()
    dy = torch.randn(n, h * w, c, device="cuda", generator=g).to(dtype)
    got = run_twice(lambda *t: layer_norm.layer_norm_channels_first(*t, 1e-5, backend="triton"), (x, weight, bias),
                    dy, layer_norm.force_config, cfg)
    check_against_float64(got, lambda *t: layer_norm.layer_norm_channels_first_reference(*t, 1e-5),
                          (x, weight, bias), dy, ("y", "dx", "dweight", "dbias"), TOL[dtype],
                          (dtype, dtype, weight.dtype, bias.dtype))


def test_layer_runs_the_fused_layer_norm_on_cuda(monkeypatch):
    """backend "auto" on CUDA: BiMambaLayer2D's LayerNorm goes through the kernel (spied on), and the layer's output
    and gradients equal those with PyTorch's LayerNorm (YOLO_BIMAMBA_FUSED_NORM=0) under bf16 autocast."""
    from yolo_bimamba.nn.blocks import BiMambaLayer2D

    calls = []
    orig = layer_norm._LayerNormCF.apply
    monkeypatch.setattr(layer_norm._LayerNormCF, "apply", lambda *a: calls.append(1) or orig(*a))
    monkeypatch.setenv("YOLO_BIMAMBA_CUDA_GRAPHS", "0")
    torch.manual_seed(0)
    m = BiMambaLayer2D(64, d_state=32, headdim=32).cuda().train()
    x = torch.randn(4, 64, 20, 15, device="cuda", requires_grad=True)
    outs = []
    for on in ("1", "0"):
        monkeypatch.setenv("YOLO_BIMAMBA_FUSED_NORM", on)
        m.zero_grad(set_to_none=True)
        x.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = m(x)
        y.float().square().sum().backward()
        outs.append((y.float(), x.grad, m.norm.weight.grad, m.norm.bias.grad))
    assert len(calls) == 1, calls
    for a, b in zip(outs[0], outs[1]):
        assert torch.isfinite(a).all() and rel(a, b) <= 2e-2, rel(a, b)


def test_modules_run_the_fused_ops_on_cuda(monkeypatch):
    """backend "auto" on CUDA: BiMamba2's conv and norm go through the kernels (spied on), and the result equals the
    PyTorch expressions (YOLO_BIMAMBA_FUSED_CONV=0 / YOLO_BIMAMBA_FUSED_NORM=0) under bf16 autocast."""
    from yolo_bimamba.nn.bimamba2 import BiMamba2
    from yolo_bimamba.ops import dwconv

    calls = []
    for fn in (dwconv._DWConvSiLU, gated_norm._GatedRMSNorm):
        orig = fn.apply
        monkeypatch.setattr(fn, "apply", lambda *a, _o=orig, _n=fn.__name__: calls.append(_n) or _o(*a))
    torch.manual_seed(0)
    m = BiMamba2(64, d_state=32, headdim=32).cuda().train()
    x = torch.randn(4, 300, 64, device="cuda")
    outs = []
    for on in ("1", "0"):
        monkeypatch.setenv("YOLO_BIMAMBA_FUSED_CONV", on)
        monkeypatch.setenv("YOLO_BIMAMBA_FUSED_NORM", on)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            outs.append(m(x).float())
    assert calls == ["_DWConvSiLU", "_GatedRMSNorm"], calls
    assert rel(outs[0], outs[1]) <= 2e-2


def _fwd_bwd(m, u, autocast: bool):
    """A mixer's output (fp16 autocast on or off) and its parameters' gradients of a fixed weighting of it."""
    m.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.float16, enabled=autocast):
        y = m(u)
    (y.float() * torch.linspace(-1, 1, y.shape[-1], device="cuda")).sum().backward()
    return y, torch.cat([p.grad.flatten().float() for p in m.parameters() if p.grad is not None])


@pytest.mark.parametrize("mixer", ["bimamba2", "hydra"])
def test_fp16_autocast_runs_the_scan_in_bf16(monkeypatch, mixer):
    """Under fp16 autocast on a GPU with bf16 tensor cores the mixers hand the scan bf16 x, B, C (ops.bi_ssd
    .mixer_scan_dtype) and return fp16; with YOLO_BIMAMBA_FP16_SCAN=fp16 the scan gets fp16. Both results and the
    parameters' gradients are within the 16-bit tolerance of the fp32 module's, and finite."""
    from yolo_bimamba.nn.bimamba2 import BiMamba2
    from yolo_bimamba.nn.hydra import Hydra
    from yolo_bimamba import config
    from yolo_bimamba.ops.bi_ssd import autograd

    assert torch.cuda.get_device_capability()[0] >= 8, "this test wants a GPU with bf16 tensor cores"
    # the default configs (no autotuning: this is about the dtypes; the first Hydra call of three dtypes autotuned
    # for over 2 minutes on an H200)
    monkeypatch.setattr(config, "AUTOTUNE", False)
    seen = []
    orig = autograd.bi_ssd_triton
    monkeypatch.setattr(autograd, "bi_ssd_triton",
                        lambda x, dt, A, B, C, **kw: seen.append((x.dtype, B.dtype, C.dtype)) or orig(x, dt, A, B, C, **kw))
    torch.manual_seed(0)
    cls = BiMamba2 if mixer == "bimamba2" else Hydra
    m = cls(64, d_state=32, headdim=32).cuda().train()
    u = torch.randn(4, 300, 64, device="cuda")
    run = functools.partial(_fwd_bwd, m, u)

    y32, g32 = run(False)
    out = {}
    for mode in ("bf16", "fp16"):
        monkeypatch.setattr(config, "FP16_SCAN", mode)
        seen.clear()
        y, g = run(True)
        want = torch.bfloat16 if mode == "bf16" else torch.float16
        assert seen == [(want, want, want)], (mode, seen)
        assert y.dtype == torch.float16
        assert torch.isfinite(y).all() and torch.isfinite(g).all()
        out[mode] = (y, g)
        assert rel(y.float(), y32) <= 2e-2, (mode, rel(y.float(), y32))
        assert rel(g, g32) <= 3e-2, (mode, rel(g, g32))


@pytest.mark.parametrize("mixer", ["bimamba2", "hydra"])
def test_fp16_autocast_scan_output_beyond_fp16_range_stays_finite(monkeypatch, mixer):
    """A scan without decay over 300 tokens of large x, B, C: y passes fp16's 65504 (about 1e10 here). Under fp16
    autocast the mixers keep the bf16 scan's output into the gated norm, so the output and every gradient are finite
    and within the 16-bit tolerance of fp32 (cast to fp16, y was inf and the norm's output NaN: two fp16 training runs
    of the quality benchmark stopped on it)."""
    from yolo_bimamba import config
    from yolo_bimamba.nn.bimamba2 import BiMamba2
    from yolo_bimamba.nn.hydra import Hydra

    monkeypatch.setattr(config, "AUTOTUNE", False)
    torch.manual_seed(0)
    m = (BiMamba2 if mixer == "bimamba2" else Hydra)(64, d_state=32, headdim=32).cuda().train()
    with torch.no_grad():  # x = B = C = silu(20) at every token, dt = softplus(3), A = -exp(-12): no decay
        m.conv1d.weight.zero_()
        m.conv1d.bias.fill_(20.0)
        m.dt_bias.fill_(3.0)
        m.A_log.fill_(-12.0)
    u = torch.randn(2, 300, 64, device="cuda")
    y32, g32 = _fwd_bwd(m, u, False)
    y16, g16 = _fwd_bwd(m, u, True)
    y32, y16 = y32.float(), y16.float()
    assert torch.isfinite(y32).all() and torch.isfinite(g32).all()
    assert torch.isfinite(y16).all() and torch.isfinite(g16).all()
    assert rel(y16, y32) <= 3e-2, rel(y16, y32)


@pytest.mark.parametrize("mixer", ["bimamba2", "hydra"])
def test_half_mixers_run_the_scan_in_bf16_and_return_fp16(monkeypatch, mixer):
    """A half model (no autocast: Ultralytics validates and predicts with model.half()): the scan runs in bf16, the
    gated norm writes fp16 for the fp16 out-projection, and output and gradients are within 16-bit tolerance of the
    fp32 module's (the norm once returned the scan's bf16, which the fp16 out-projection refused)."""
    import copy

    from yolo_bimamba import config
    from yolo_bimamba.nn.bimamba2 import BiMamba2
    from yolo_bimamba.nn.hydra import Hydra

    monkeypatch.setattr(config, "AUTOTUNE", False)
    torch.manual_seed(0)
    m = (BiMamba2 if mixer == "bimamba2" else Hydra)(64, d_state=32, headdim=32).cuda()
    u = torch.randn(2, 300, 64, device="cuda")
    y32, g32 = _fwd_bwd(m, u, False)
    y16, g16 = _fwd_bwd(copy.deepcopy(m).half(), u.half(), False)
    assert y16.dtype == torch.float16 and torch.isfinite(y16).all() and torch.isfinite(g16).all()
    assert rel(y16.float(), y32) <= 2e-2, rel(y16.float(), y32)
    assert rel(g16, g32) <= 5e-2, rel(g16, g32)
