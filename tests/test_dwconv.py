"""The fused depthwise conv1d + SiLU (yolo_bimamba.ops.dwconv) under the Triton interpreter, against float64.

Every config of dwconv_kernels.CONFIGS is forced in turn; output and gradient buffers are NaN-poisoned (with NaN
guard regions around them) so an element left unwritten or a write out of bounds fails the test.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any triton kernel module is imported

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

from yolo_bimamba.ops.bi_ssd import tuning  # noqa: E402
from yolo_bimamba.ops import kernel_buffers  # noqa: E402
from yolo_bimamba.ops.dwconv import dwconv_silu, dwconv_silu_reference, force_config  # noqa: E402
from yolo_bimamba.ops.dwconv_kernels import CONFIGS  # noqa: E402
from fused_ops_check import check_against_float64, poisoned_run, rel  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
if DEV == "cpu" and not tuning._INTERPRET:
    pytest.skip("no CUDA and TRITON_INTERPRET is not set", allow_module_level=True)

# (b, L, C, k): L and C not multiples of any block, L shorter than the kernel's reach, one channel, k = 1
SHAPES = [(2, 37, 40, 7), (1, 5, 130, 3), (3, 129, 17, 7), (1, 1, 1, 5), (2, 64, 64, 1)]


def inputs(b, L, C, k, dtype, strided=True, bias=True):
    big = torch.randn(b, L, C + 11, dtype=dtype, device=DEV) * 2
    u = (big[:, :, 5:5 + C] if strided else big[:, :, :C].contiguous()).detach().requires_grad_()
    w = (torch.randn(C, 1, k, dtype=dtype, device=DEV) / k ** 0.5).requires_grad_()
    bb = torch.randn(C, dtype=dtype, device=DEV).requires_grad_() if bias else None
    return u, w, bb


def run(u, w, bb, dy, cfg):
    leaves = [t for t in (u, w, bb) if t is not None]
    out = poisoned_run(lambda *t: dwconv_silu(*t, backend="triton"), leaves, dy, force_config, cfg)
    return out[0], out[1:]


@pytest.mark.parametrize("cfg", range(len(CONFIGS)))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_float64_reference_every_config(shape, dtype, cfg):
    u, w, bb = inputs(*shape, dtype, bias=shape[2] != 17)
    dy = torch.randn(u.shape, dtype=dtype, device=DEV)
    leaves = [t for t in (u, w, bb) if t is not None]
    got = poisoned_run(lambda *t: dwconv_silu(*t, backend="triton"), leaves, dy, force_config, cfg)
    assert got[0].is_contiguous()
    check_against_float64(got, lambda u, w, b=None: dwconv_silu_reference(u, w, b), leaves, dy, ("y", "u", "weight", "bias"), 1e-12 if dtype == torch.float64 else 1e-5,
                          [dtype] * 4)


def test_gradcheck_float64():
    u, w, bb = inputs(2, 9, 5, 3, torch.float64)
    with force_config(1):
        assert torch.autograd.gradcheck(lambda *t: dwconv_silu(*t, backend="triton"), (u, w, bb), fast_mode=True)


def test_repeatable_bitwise():
    u, w, bb = inputs(2, 70, 33, 7, torch.float32)
    dy = torch.randn(u.shape, device=DEV)
    first = run(u, w, bb, dy, 0)
    second = run(u, w, bb, dy, 0)
    for a, b in zip((first[0], *first[1]), (second[0], *second[1])):
        assert torch.equal(a, b)


def test_large_negative_and_positive_pre_activations_stay_finite():
    u, w, bb = inputs(1, 20, 8, 3, torch.float32)
    with torch.no_grad():
        u.mul_(1e4)
    dy = torch.randn(u.shape, device=DEV)
    y, grads = run(u, w, bb, dy, 0)
    assert torch.isfinite(y).all() and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("args, match", [
    (((2, 5), (4, 1, 3), (4,)), r"u must have shape \(batch, seqlen, channels\)"),
    (((2, 5, 4), (4, 1, 4), (4,)), r"weight must have shape \(4, 1, k\) with k odd"),
    (((2, 5, 4), (3, 1, 3), (3,)), r"weight must have shape \(4, 1, k\)"),
    (((2, 5, 4), (4, 1, 3), (5,)), r"bias must have shape \(4,\)"),
])
def test_bad_input_names_the_argument(args, match):
    us, ws, bs = args
    with pytest.raises(ValueError, match=match):
        dwconv_silu(torch.randn(us), torch.randn(ws), torch.randn(bs), backend="triton")
    with pytest.raises(ValueError, match="must be float16"):
        dwconv_silu(torch.ones(2, 5, 4, dtype=torch.int32), torch.randn(4, 1, 3), None)
    with pytest.raises(ValueError, match="backend"):
        dwconv_silu(torch.randn(2, 5, 4), torch.randn(4, 1, 3), None, backend="cuda")


def test_modules_use_it_and_match_their_conv1d():
    """BiMamba2 and Hydra run the fused op when their backend asks for Triton; the result equals the nn.Conv1d
    expression that the CPU and export path use."""
    from yolo_bimamba.nn import BiMamba2, Hydra

    for cls in (BiMamba2, Hydra):
        torch.manual_seed(0)
        m = cls(32, d_state=16, headdim=16, chunk_size=16).double().to(DEV)
        x = torch.randn(2, 21, 32, dtype=torch.float64, device=DEV)
        m.backend = "torch"
        ref = m(x)
        m.backend = "triton"
        with kernel_buffers.poison_outputs(True):
            out = m(x)
        assert rel(out, ref) <= 1e-10, cls.__name__


def test_auto_backend_and_its_switch(monkeypatch):
    """"auto" runs the kernels on CUDA only; YOLO_BIMAMBA_FUSED_CONV=0 turns them off there."""
    from yolo_bimamba.ops import dwconv

    assert dwconv._triton_ok()
    monkeypatch.setenv("YOLO_BIMAMBA_FUSED_CONV", "0")
    assert not dwconv._triton_ok()
    calls = []
    monkeypatch.setattr(dwconv._DWConvSiLU, "apply", lambda *a: calls.append(a))
    monkeypatch.delenv("YOLO_BIMAMBA_FUSED_CONV")
    dwconv_silu(torch.randn(1, 4, 3), torch.randn(3, 1, 3), None)  # CPU tensor: the PyTorch expression
    assert calls == []


def test_graph_tracing_is_seen_by_the_file_exporters():
    """The fused ops and the SSD op's "auto" fall back to their PyTorch expressions while a plain-op graph is traced
    for a file: jit.trace (TorchScript, and the ONNX exporter Ultralytics uses) and the dynamo ONNX exporter (which
    runs torch.export under its ONNX flag). Under torch.compile and a plain torch.export the ops are custom ops
    instead (backend_choice.compiling; tests/test_custom_ops.py)."""
    from yolo_bimamba.ops.backend_choice import graph_tracing

    class Probe(torch.nn.Module):
        def forward(self, x):
            return x + 1.0 if graph_tracing() else x - 1.0

    x = torch.zeros(2)
    assert torch.equal(Probe()(x), x - 1.0)
    assert torch.equal(torch.jit.trace(Probe(), (x,))(x), x + 1.0)
    assert torch.equal(torch.export.export(Probe(), (x,)).module()(x), x - 1.0)
    assert torch.equal(torch.compile(Probe(), backend="eager")(x), x - 1.0)
    from torch.onnx._internal.exporter import _flags  # (onnxscript, which the dynamo exporter needs, is absent here)

    assert _flags.set_onnx_exporting_flag(graph_tracing)()  # what torch.onnx.export(dynamo=True) wraps its work in


def test_triton_usable_is_the_one_auto_switch(monkeypatch):
    """bi_ssd, dwconv_silu and gated_rmsnorm take their "auto" decision from backend_choice.triton_usable: the kernel
    module must import, no graph may be traced, and an op's own switch (when it has one) must not be 0."""
    from yolo_bimamba.ops import backend_choice
    from yolo_bimamba.ops.bi_ssd import api as bi_ssd_mod

    assert backend_choice.triton_usable("yolo_bimamba.ops.bi_ssd.autograd")
    assert bi_ssd_mod.auto_picks_triton(64, 64, torch.float32)
    assert not backend_choice.triton_usable("yolo_bimamba.ops.no_such_kernels")
    monkeypatch.setenv("YOLO_BIMAMBA_FUSED_CONV", "0")
    assert backend_choice.triton_usable("yolo_bimamba.ops.bi_ssd.autograd")  # the SSD op has no such switch
    monkeypatch.setattr(backend_choice, "graph_tracing", lambda: True)
    assert not backend_choice.triton_usable("yolo_bimamba.ops.bi_ssd.autograd")
    assert not bi_ssd_mod.auto_picks_triton(64, 64, torch.float32)


def test_traced_and_exported_graphs_hold_a_depthwise_conv2d(tmp_path):
    """While a graph is traced or exported, dwconv_silu is the same convolution written as a depthwise Conv2d over a
    height-1 image (onnxruntime's CPU depthwise path runs it faster than a grouped 1-D Conv): equal to the Conv1d
    expression in float64 (k 3 and 7, with and without bias, L shorter than k too), and the ONNX file holds a 2-D
    Conv, with outputs equal to eager PyTorch."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    from yolo_bimamba.ops.dwconv import dwconv_silu_export

    g = torch.Generator().manual_seed(4)
    for l, k, with_bias in ((37, 7, True), (2, 3, False), (5, 7, False)):
        u = torch.randn(2, l, 5, generator=g, dtype=torch.float64)
        w = torch.randn(5, 1, k, generator=g, dtype=torch.float64)
        b = torch.randn(5, generator=g, dtype=torch.float64) if with_bias else None
        torch.testing.assert_close(dwconv_silu_export(u, w, b), dwconv_silu_reference(u, w, b), rtol=1e-12, atol=1e-12)

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv1d(6, 6, 7, groups=6, padding=3)

        def forward(self, u):
            return dwconv_silu(u, self.conv.weight, self.conv.bias)

    m, u = Layer().eval(), torch.randn(1, 50, 6)
    path = tmp_path / "dw.onnx"
    torch.onnx.export(m, (u,), str(path), opset_version=17, dynamo=False)
    convs = [n for n in onnx.load(str(path)).graph.node if n.op_type == "Conv"]
    assert len(convs) == 1
    assert [list(a.ints) for a in convs[0].attribute if a.name == "kernel_shape"] == [[1, 7]]
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    out = sess.run(None, {sess.get_inputs()[0].name: u.numpy()})[0]
    with torch.no_grad():
        np.testing.assert_allclose(out, m(u).numpy(), rtol=1e-5, atol=1e-6)
