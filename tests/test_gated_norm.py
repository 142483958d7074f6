"""The fused gated RMSNorm (yolo_bimamba.ops.gated_norm) under the Triton interpreter, against float64.

Every config of gated_norm_kernels.CONFIGS is forced in turn; output and gradient buffers are NaN-poisoned (with NaN
guard regions) so an element left unwritten or a write out of bounds fails the test.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any triton kernel module is imported

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

from yolo_bimamba.ops.bi_ssd import tuning  # noqa: E402
from yolo_bimamba.ops.gated_norm import force_config, gated_rmsnorm, gated_rmsnorm_reference  # noqa: E402
from yolo_bimamba.ops.gated_norm_kernels import CONFIGS  # noqa: E402
from fused_ops_check import check_against_float64, poisoned_run, rel  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
if DEV == "cpu" and not tuning._INTERPRET:
    pytest.skip("no CUDA and TRITON_INTERPRET is not set", allow_module_level=True)

# (b, L, d): rows not a multiple of any row block, d not a power of two, a wide d (fewer rows per program)
SHAPES = [(2, 37, 40), (1, 5, 130), (3, 9, 3), (1, 3, 1100)]


def inputs(b, L, d, dtype):
    big = torch.randn(b, L, 3 * d + 5, dtype=dtype, device=DEV)
    z = big[:, :, 2:2 + d].detach().requires_grad_()  # a slice of the in-projection, as in the modules
    x = torch.randn(b, L, d, dtype=dtype, device=DEV, requires_grad=True)
    w = (1 + 0.3 * torch.randn(d, dtype=dtype, device=DEV)).requires_grad_()
    return x, z, w


def run(x, z, w, dy, cfg):
    out = poisoned_run(lambda *t: gated_rmsnorm(*t, 1e-5, backend="triton"), (x, z, w), dy, force_config, cfg)
    return out[0], out[1:]


@pytest.mark.parametrize("cfg", range(len(CONFIGS)))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_float64_reference_every_config(shape, dtype, cfg):
    x, z, w = inputs(*shape, dtype)
    dy = torch.randn(x.shape, dtype=dtype, device=DEV)
    got = poisoned_run(lambda *t: gated_rmsnorm(*t, 1e-5, backend="triton"), (x, z, w), dy, force_config, cfg)
    check_against_float64(got, lambda *t: gated_rmsnorm_reference(*t, 1e-5), (x, z, w), dy, ("y", "x", "z", "weight"),
                          1e-12 if dtype == torch.float64 else 2e-5, [dtype] * 4)


def test_gradcheck_float64():
    x, z, w = inputs(2, 5, 6, torch.float64)
    with force_config(1):
        assert torch.autograd.gradcheck(lambda *t: gated_rmsnorm(*t, 1e-5, backend="triton"), (x, z, w),
                                        fast_mode=True)


def test_repeatable_bitwise():
    x, z, w = inputs(3, 50, 64, torch.float32)
    dy = torch.randn(x.shape, device=DEV)
    first, second = run(x, z, w, dy, 0), run(x, z, w, dy, 0)
    for a, b in zip((first[0], *first[1]), (second[0], *second[1])):
        assert torch.equal(a, b)


def test_zero_rows_and_large_gates_stay_finite():
    x, z, w = inputs(1, 6, 16, torch.float32)
    with torch.no_grad():
        x[0, :2] = 0.0  # rows of zeros: rstd = 1/sqrt(eps), no 0/0
        z.mul_(100.0)
    y, grads = run(x, z, w, torch.randn(x.shape, device=DEV), 2)
    assert torch.isfinite(y).all() and all(torch.isfinite(g).all() for g in grads)


def test_output_in_the_gates_dtype():
    """x (the scan's output) may be in a wider dtype than z (bf16 against fp16 in the mixers under fp16): the output
    and dz are in z's dtype, dx and dweight in theirs, each within fp32 rounding of the float64 expression."""
    x, z, w = inputs(2, 13, 40, torch.float64)
    z32 = z.detach().float().requires_grad_()
    dy = torch.randn(x.shape, dtype=torch.float32, device=DEV)
    got = poisoned_run(lambda *t: gated_rmsnorm(*t, 1e-5, backend="triton"), (x, z32, w), dy, force_config, 1)
    check_against_float64(got, lambda *t: gated_rmsnorm_reference(*t, 1e-5), (x, z32, w), dy, ("y", "x", "z", "weight"),
                          1e-6, [torch.float32, torch.float64, torch.float32, torch.float64])
    assert gated_rmsnorm(x, z32, w, backend="torch").dtype == torch.float32


def test_bad_input_names_the_argument(monkeypatch):
    x = torch.randn(2, 3, 4)
    with pytest.raises(ValueError, match=r"z must have the shape of x \(2, 3, 4\)"):
        gated_rmsnorm(x, torch.randn(2, 3, 5), torch.ones(4))
    with pytest.raises(ValueError, match=r"weight must have shape \(4,\)"):
        gated_rmsnorm(x, x, torch.ones(5))
    with pytest.raises(ValueError, match="x must be float16"):
        gated_rmsnorm(x.int(), x, torch.ones(4))
    with pytest.raises(ValueError, match="backend"):
        gated_rmsnorm(x, x, torch.ones(4), backend="cuda")
    from yolo_bimamba.ops import gated_norm

    assert gated_norm._triton_ok()
    monkeypatch.setenv("YOLO_BIMAMBA_FUSED_NORM", "0")
    assert not gated_norm._triton_ok()


def test_module_uses_it_and_matches_its_expression():
    """RMSNormGated with backend "triton" equals its PyTorch form (norm after the gate), and the other form
    (norm before the gate) is unchanged."""
    from yolo_bimamba.nn.norm import RMSNormGated

    x, z, _ = inputs(2, 11, 24, torch.float64)
    m = RMSNormGated(24).double().to(DEV)
    with torch.no_grad():
        m.weight.normal_()
    m.backend = "torch"
    ref = m(x, z)
    m.backend = "triton"
    assert rel(m(x, z), ref) <= 1e-12
    before = RMSNormGated(24, norm_before_gate=True).double().to(DEV)
    want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * torch.nn.functional.silu(z)
    assert rel(before(x, z), want) <= 1e-6  # this form computes in fp32, as before
