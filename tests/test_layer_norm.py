"""The fused channels-first token LayerNorm (yolo_bimamba.ops.layer_norm) under the Triton interpreter, against
float64, and the blocks that use it.

Every config of layer_norm_kernels.CONFIGS is forced in turn; output and gradient buffers are NaN-poisoned (with NaN
guard regions) so an element left unwritten or a write out of bounds fails the test.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any triton kernel module is imported

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

from yolo_bimamba.ops.bi_ssd import tuning  # noqa: E402
from yolo_bimamba.ops.layer_norm import (  # noqa: E402
    force_config, layer_norm_channels_first, layer_norm_channels_first_reference,
)
from yolo_bimamba.ops.layer_norm_kernels import CONFIGS  # noqa: E402
from fused_ops_check import check_against_float64, poisoned_run, rel  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
if DEV == "cpu" and not tuning._INTERPRET:
    pytest.skip("no CUDA and TRITON_INTERPRET is not set", allow_module_level=True)

# (N, C, H, W): tokens not a multiple of any token block, C not a power of two, one token, a wide C (fewer tokens
# per program than the config asks)
SHAPES = [(2, 40, 7, 9), (1, 3, 5, 1), (3, 64, 1, 1), (1, 1100, 3, 2)]


def inputs(n, c, h, w, dtype):
    x = (torch.randn(n, c, h, w, dtype=dtype, device=DEV) * 2 + 0.5).requires_grad_()
    weight = (1 + 0.3 * torch.randn(c, dtype=dtype, device=DEV)).requires_grad_()
    bias = (0.2 * torch.randn(c, dtype=dtype, device=DEV)).requires_grad_()
    return x, weight, bias


def fused(*t):
    return layer_norm_channels_first(*t, 1e-5, backend="triton")


@pytest.mark.parametrize("cfg", range(len(CONFIGS)))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_float64_reference_every_config(shape, dtype, cfg):
    leaves = inputs(*shape, dtype)
    n, c, h, w = shape
    dy = torch.randn(n, h * w, c, dtype=dtype, device=DEV)
    got = poisoned_run(fused, leaves, dy, force_config, cfg)
    check_against_float64(got, lambda *t: layer_norm_channels_first_reference(*t, 1e-5), leaves, dy,
                          ("y", "x", "weight", "bias"), 1e-12 if dtype == torch.float64 else 2e-5, [dtype] * 4)


def test_low_precision_input_fp32_weights():
    """As under AMP: bf16 / fp16 x, fp32 weight and bias -> output and dx in x's dtype, dweight and dbias fp32."""
    for dtype in (torch.float16, torch.bfloat16):
        x, w, b = inputs(2, 24, 5, 3, torch.float32)
        x = x.detach().to(dtype).requires_grad_()
        dy = torch.randn(2, 15, 24, device=DEV).to(dtype)
        got = poisoned_run(fused, (x, w, b), dy, force_config, 0)
        check_against_float64(got, lambda *t: layer_norm_channels_first_reference(*t, 1e-5), (x, w, b), dy,
                              ("y", "x", "weight", "bias"), 1e-2, [dtype, dtype, torch.float32, torch.float32])


def test_gradcheck_float64():
    with force_config(1):
        assert torch.autograd.gradcheck(fused, inputs(2, 6, 3, 2, torch.float64), fast_mode=True)


def test_repeatable_bitwise_and_non_contiguous_input():
    x, w, b = inputs(2, 48, 6, 10, torch.float32)
    dy = torch.randn(2, 60, 48, device=DEV)
    first, second = (poisoned_run(fused, (x, w, b), dy, force_config, 0) for _ in range(2))
    assert all(torch.equal(p, q) for p, q in zip(first, second))
    xt = x.detach().transpose(2, 3).contiguous().transpose(2, 3).requires_grad_()  # same values, other strides
    third = poisoned_run(fused, (xt, w, b), dy, force_config, 0)
    assert all(torch.equal(p, q) for p, q in zip(first, third))


def test_constant_tokens_stay_finite():
    x, w, b = inputs(1, 16, 2, 3, torch.float32)
    with torch.no_grad():
        x[..., 0, :] = 3.0  # tokens with zero variance: rstd = 1/sqrt(eps), no 0/0
        x[..., 1, 0] = 1e4
    got = poisoned_run(fused, (x, w, b), torch.randn(1, 6, 16, device=DEV), force_config, 2)
    assert all(torch.isfinite(t).all() for t in got)


def test_bad_input_names_the_argument(monkeypatch):
    x = torch.randn(2, 4, 3, 3)
    with pytest.raises(ValueError, match=r"x must be a tensor \(N, C, \*spatial\).*got \(2, 4\)"):
        layer_norm_channels_first(torch.randn(2, 4), torch.ones(4), torch.zeros(4))
    with pytest.raises(ValueError, match=r"weight must have shape \(4,\)"):
        layer_norm_channels_first(x, torch.ones(5), torch.zeros(4))
    with pytest.raises(ValueError, match=r"bias must have shape \(4,\)"):
        layer_norm_channels_first(x, torch.ones(4), torch.zeros(2, 2))
    with pytest.raises(ValueError, match="x must be float16"):
        layer_norm_channels_first(x.int(), torch.ones(4), torch.zeros(4))
    with pytest.raises(ValueError, match="backend"):
        layer_norm_channels_first(x, torch.ones(4), torch.zeros(4), backend="cuda")
    with pytest.raises(ValueError, match="needs both weight and bias"):
        layer_norm_channels_first(x, torch.ones(4), None, backend="triton")
    want = torch.nn.LayerNorm(4, elementwise_affine=False)(x.flatten(2).transpose(1, 2))
    assert torch.equal(layer_norm_channels_first(x, None, None), want)  # no affine: PyTorch's expression
    from yolo_bimamba.ops import layer_norm

    assert layer_norm._triton_ok()
    monkeypatch.setenv("YOLO_BIMAMBA_FUSED_NORM", "0")
    assert not layer_norm._triton_ok()


@pytest.mark.parametrize("mlp_ratio,scan", [(0.0, "row"), (2.0, "rowcol")])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_layer_equals_its_token_expression(backend, mlp_ratio, scan):
    """BiMambaLayer2D (LN read channels-first, residual written channels-first) computes, with every gradient,
    what its definition over the transposed tokens does: x + mixer(LN(tokens)) [+ MLP(LN2(.))], back to (N, C, H, W)."""
    from yolo_bimamba.nn.blocks import BiMambaLayer2D

    torch.manual_seed(0)
    layer = BiMambaLayer2D(32, scan=scan, mlp_ratio=mlp_ratio, d_state=16, headdim=16).double().to(DEV)
    layer.mixer.backend = backend
    with torch.no_grad():
        layer.norm.weight.normal_(1.0, 0.3)
        layer.norm.bias.normal_(0.0, 0.3)
    x = torch.randn(2, 32, 5, 7, dtype=torch.float64, device=DEV, requires_grad=True)

    def by_definition(x):
        n, c, h, w = x.shape
        t = x.flatten(2).transpose(1, 2)
        t = t + layer._mix(layer.norm(t), h, w)
        if layer.mlp is not None:
            t = t + layer.mlp(layer.norm2(t))
        return t.transpose(1, 2).reshape(n, c, h, w)

    dy = torch.randn(x.shape, dtype=torch.float64, device=DEV)
    params = [x, layer.norm.weight, layer.norm.bias]
    got = (layer(x), *torch.autograd.grad(layer(x), params, dy))
    want = (by_definition(x), *torch.autograd.grad(by_definition(x), params, dy))
    for a, b in zip(got, want):
        assert a.shape == b.shape and rel(a, b) <= 1e-10, rel(a, b)
