"""The chunked PyTorch bi-SSD against the float64 quadratic reference, and input validation."""
import math

import pytest
import torch

from yolo_bimamba.ops import bi_ssd, bi_ssd_reference

CHUNK = 16


def make_inputs(b=2, L=23, h=4, p=5, g=2, n=3, dtype=torch.float64, D_shape="h", hydra=False, requires_grad=False):
    x = torch.randn(b, L, h, p, dtype=dtype)
    dt = torch.randn(b, L, h, dtype=dtype)
    A = -torch.rand(h, dtype=dtype) * 2 - 0.1
    B = torch.randn(b, L, g, n, dtype=dtype)
    C = torch.randn(b, L, g, n, dtype=dtype)
    D = torch.randn(h, dtype=dtype) if D_shape == "h" else torch.randn(h, p, dtype=dtype)
    kw = dict(D=D, dt_bias=torch.randn(h, dtype=dtype), dt_softplus=True, dt_limit=(0.05, 1.5))
    if hydra:
        kw.update(dt_bwd=torch.randn(b, L, h, dtype=dtype), B_bwd=torch.randn(b, L, g, n, dtype=dtype),
                  C_bwd=torch.randn(b, L, g, n, dtype=dtype))
    args = [x, dt, A, B, C]
    if requires_grad:
        for t in args + [v for v in kw.values() if isinstance(v, torch.Tensor)]:
            t.requires_grad_(True)
    return args, kw


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


LENGTHS = [1, 7, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 5]


@pytest.mark.parametrize("L", LENGTHS)
@pytest.mark.parametrize("direction", ["both", "forward", "backward"])
@pytest.mark.parametrize("D_shape", ["h", "hp"])
def test_forward_matches_reference(L, direction, D_shape):
    args, kw = make_inputs(L=L, D_shape=D_shape)
    y = bi_ssd(*args, chunk_size=CHUNK, direction=direction, backend="torch", **kw)
    ref = bi_ssd_reference(*args, direction=direction, **kw)
    assert torch.isfinite(y).all()
    assert rel(y, ref) < 1e-12


@pytest.mark.parametrize("L", LENGTHS)
@pytest.mark.parametrize("hydra", [False, True])
def test_gradients_match_reference(L, hydra):
    args, kw = make_inputs(L=L, hydra=hydra, requires_grad=True)
    tensors = args + [v for v in kw.values() if isinstance(v, torch.Tensor)]
    dy = torch.randn_like(args[0])
    y = bi_ssd(*args, chunk_size=CHUNK, shift=hydra, backend="torch", **kw)
    g1 = torch.autograd.grad(y, tensors, dy)
    ref = bi_ssd_reference(*args, shift=hydra, **kw)
    g2 = torch.autograd.grad(ref, tensors, dy)
    for t, a, b in zip(tensors, g1, g2):
        assert torch.isfinite(a).all()
        assert rel(a, b) < 1e-10, t.shape


def test_fp32_and_low_precision_output_dtype():
    args, kw = make_inputs(L=40, dtype=torch.float64)
    for dtype, tol in ((torch.float32, 1e-5), (torch.float16, 5e-3), (torch.bfloat16, 3e-2)):
        a32 = [t.to(dtype) for t in args]
        kw32 = {k: (v.to(dtype) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
        y = bi_ssd(*a32, chunk_size=CHUNK, backend="torch", **kw32)
        assert y.dtype == dtype
        ref_q = bi_ssd_reference(*a32, **kw32)  # same quantised inputs
        assert rel(y.double(), ref_q) < tol


def test_autocast_runs_internals_in_fp32():
    args, kw = make_inputs(L=33, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = bi_ssd(*args, chunk_size=CHUNK, backend="torch", **kw)
    assert y.dtype == torch.float32
    assert rel(y.double(), bi_ssd_reference(*args, **kw)) < 1e-5


def test_chunk_size_does_not_change_result():
    args, kw = make_inputs(L=70)
    ys = [bi_ssd(*args, chunk_size=c, backend="torch", **kw) for c in (1, 8, 16, 64, 256)]
    for y in ys[1:]:
        assert rel(y, ys[0]) < 1e-12


def test_gradcheck_float64():
    args, kw = make_inputs(b=1, L=9, h=2, p=2, g=1, n=2, requires_grad=True)
    tensors = args + [kw["D"], kw["dt_bias"]]

    def f(x, dt, A, B, C, D, dt_bias):
        return bi_ssd(x, dt, A, B, C, chunk_size=4, D=D, dt_bias=dt_bias, dt_softplus=True, backend="torch")

    assert torch.autograd.gradcheck(f, tensors, fast_mode=True)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("case", ["huge_dt", "tiny_dt", "A_zero", "A_very_negative", "long", "zeros", "constant"])
def test_adversarial_inputs_stay_finite(case, backend):
    """Issue 5's adversarial matrix, on the PyTorch op and (under the interpreter on CPU) the Triton kernels."""
    L = 3000 if case == "long" else 50
    args, kw = make_inputs(b=1, L=L, h=2, p=4, g=1, n=4, dtype=torch.float32, requires_grad=False)
    x, dt, A, B, C = args
    kw["dt_limit"] = (0.0, float("inf"))
    if case == "huge_dt":
        dt = torch.full_like(dt, 1e4)
    elif case == "tiny_dt":
        dt = torch.full_like(dt, -1e4)
    elif case == "A_zero":
        A = torch.zeros_like(A)
    elif case == "A_very_negative":
        A = torch.full_like(A, -1e4)
    elif case == "zeros":
        x, B, C = torch.zeros_like(x), torch.zeros_like(B), torch.zeros_like(C)
    elif case == "constant":
        x, B, C = torch.ones_like(x), torch.ones_like(B), torch.ones_like(C)
    ts = [x, dt, A, B, C, kw["D"], kw["dt_bias"]]
    for t in ts:
        t.requires_grad_(True)
    y = bi_ssd(x, dt, A, B, C, chunk_size=64, backend=backend, **kw)
    grads = torch.autograd.grad(y.square().mean(), ts)
    assert torch.isfinite(y).all()
    for g in grads:
        assert torch.isfinite(g).all()


def _ok_args(b=2, L=5, h=4, p=3, g=2, n=3):
    return dict(x=torch.randn(b, L, h, p), dt=torch.rand(b, L, h), A=-torch.rand(h),
                B=torch.randn(b, L, g, n), C=torch.randn(b, L, g, n))


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(x=torch.randn(2, 5, 4)), "'x' must have shape"),
        (dict(dt=torch.rand(2, 5, 3)), "'dt' must have shape"),
        (dict(A=-torch.rand(3)), "'A' must have shape"),
        (dict(B=torch.randn(2, 5, 3, 3), C=torch.randn(2, 5, 3, 3)), "ngroups=3"),
        (dict(C=torch.randn(2, 5, 2, 4)), "'C' must have the shape of B"),
        (dict(x=torch.randint(0, 3, (2, 5, 4, 3))), "'x' must be a floating-point"),
        (dict(x=torch.randn(2, 0, 4, 3), dt=torch.rand(2, 0, 4), B=torch.randn(2, 0, 2, 3), C=torch.randn(2, 0, 2, 3)), "seqlen 0"),
        (dict(D=torch.randn(5)), "'D' must have shape"),
        (dict(dt_bias=torch.randn(2)), "'dt_bias' must have shape"),
        (dict(dt_bwd=torch.rand(2, 5, 4)), "dt_bwd, B_bwd and C_bwd go together"),
        (dict(dt_bwd=torch.rand(2, 5, 4), B_bwd=torch.randn(2, 5, 2, 3), C_bwd=torch.randn(2, 5, 1, 3)), "'C_bwd' must have shape"),
        (dict(direction="left"), "'direction'"),
        (dict(chunk_size=0), "'chunk_size'"),
        (dict(dt_limit=(1.0, 0.5)), "'dt_limit'"),
        (dict(backend="cuda"), "'backend'"),
        (dict(A=-torch.rand(4, dtype=torch.float64).to("meta")), "on meta"),
    ],
)
def test_bad_input_is_named(change, match):
    kw = _ok_args()
    kw.update(change)
    x, dt, A, B, C = (kw.pop(k) for k in ("x", "dt", "A", "B", "C"))
    with pytest.raises(ValueError, match=match):
        bi_ssd(x, dt, A, B, C, **kw)


def test_length_one_works():
    args, kw = make_inputs(L=1)
    y = bi_ssd(*args, chunk_size=CHUNK, backend="torch", **kw)
    assert rel(y, bi_ssd_reference(*args, **kw)) < 1e-12
    assert math.isfinite(y.sum().item())


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_clamp_boundaries_have_zero_gradient(backend):
    """dt exactly on a dt_limit bound and A exactly 0 get gradient 0 (one convention for every backend)."""
    x, dt, A, B, C = make_inputs(b=1, L=6, h=2, p=2, g=1, n=2)[0]
    dt = torch.tensor([[[0.0, 0.3], [0.5, 2.0], [0.2, 0.0], [2.0, 0.1], [0.4, 0.4], [0.0, 2.5]]], dtype=torch.float64)
    A = torch.tensor([0.0, -0.5], dtype=torch.float64)
    dt.requires_grad_(True)
    A.requires_grad_(True)
    y = bi_ssd(x, dt, A, B, C, dt_limit=(0.0, 2.0), backend=backend)
    gdt, gA = torch.autograd.grad(y.sum(), (dt, A))
    on_bound = (dt.detach() == 0.0) | (dt.detach() >= 2.0)
    assert (gdt[on_bound] == 0).all() and (gdt[~on_bound] != 0).all()
    assert gA[0] == 0 and gA[1] != 0
