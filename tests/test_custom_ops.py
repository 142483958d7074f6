"""The fused ops as PyTorch custom ops (ops.library, ops.bi_ssd.library): schema, fake and autograd checks
(torch.library.opcheck), torch.compile with no graph break at our ops (fullgraph=True), torch.export, and the choice
between custom ops (torch.compile / torch.export) and plain PyTorch expressions (TorchScript, ONNX).

CPU tests: the PyTorch backend, and the Triton backend's custom ops under the Triton interpreter at tiny sizes;
tests/gpu/test_gpu_compile.py runs the Triton kernels on a GPU."""
import io

import pytest
import torch
import torch._dynamo

import yolo_bimamba  # noqa: F401  (registers the blocks and the custom ops)
from yolo_bimamba import config
from yolo_bimamba.nn import BiMamba2
from yolo_bimamba.nn.blocks import BiMambaLayer2D
from yolo_bimamba.ops import backend_choice
from yolo_bimamba.ops import library as lib
from yolo_bimamba.ops.bi_ssd import library as ssd_lib

OPS = torch.ops.yolo_bimamba


def _t(*shape, dtype=torch.float64, grad=True, lo=None, hi=None):
    t = torch.randn(*shape, dtype=dtype)
    if lo is not None:
        t = t.uniform_(lo, hi)
    return t.requires_grad_(grad)


def _ssd_args(b=2, l=11, h=2, p=4, g=1, n=4, D=True, bias=True, separate=False, dtype=torch.float64):
    args = [_t(b, l, h, p, dtype=dtype), _t(b, l, h, dtype=dtype, lo=-1.0, hi=1.0),
            _t(h, dtype=dtype, lo=-2.0, hi=-0.5),
            _t(b, l, g, n, dtype=dtype), _t(b, l, g, n, dtype=dtype),
            _t(h, dtype=dtype) if D else None, _t(h, dtype=dtype, lo=-1.0, hi=0.5) if bias else None]
    args += ([_t(b, l, h, dtype=dtype, lo=-1.0, hi=1.0), _t(b, l, g, n, dtype=dtype), _t(b, l, g, n, dtype=dtype)]
             if separate else [None, None, None])
    return args


# ---------------------------------------------------------------------------------------------------------------
# opcheck: schema, fake (meta) implementation, autograd registration, dispatch under torch.compile's tracers
# ---------------------------------------------------------------------------------------------------------------
# (test_aot_dispatch_dynamic traces the op, its fake and its backward under AOTAutograd with symbolic shapes: ~10 s
# a case on this CPU, so only the two block modes run it; the others run the schema, fake and autograd checks)
FAST_CHECKS = ("test_schema", "test_autograd_registration", "test_faketensor")


@pytest.mark.parametrize("case", ["bimamba", "hydra", "forward-only", "no-D-no-bias"])
def test_opcheck_bi_ssd_torch_backend(case):
    kw = dict(chunk_size=4, dt_softplus=True, dt_min=1e-3, dt_max=float("inf"), direction="both", shift=False)
    if case == "hydra":
        args, kw = _ssd_args(g=2, n=3, separate=True), dict(kw, shift=True)
    elif case == "forward-only":
        args, kw = _ssd_args(l=7), dict(kw, direction="forward", dt_softplus=False, dt_min=0.0, dt_max=2.0)
    elif case == "no-D-no-bias":
        args = _ssd_args(D=False, bias=False)
    else:
        args = _ssd_args()
    utils = FAST_CHECKS if case in ("forward-only", "no-D-no-bias") else torch.library._OPCHECK_DEFAULT_UTILS
    torch.library.opcheck(OPS.bi_ssd, (*args, *kw.values(), "torch", True), test_utils=utils)


@pytest.mark.parametrize("bias", [True, False])
def test_opcheck_dwconv_silu_torch_backend(bias):
    args = (_t(2, 9, 5), _t(5, 1, 3), _t(5) if bias else None, "torch")
    torch.library.opcheck(OPS.dwconv_silu, args)


def test_opcheck_gated_rmsnorm_torch_backend():
    torch.library.opcheck(OPS.gated_rmsnorm, (_t(2, 3, 8), _t(2, 3, 8), _t(8), 1e-5, "torch"))


@pytest.mark.parametrize("affine", [True, False])
def test_opcheck_layer_norm_channels_first_torch_backend(affine):
    w, b = (_t(6), _t(6)) if affine else (None, None)
    torch.library.opcheck(OPS.layer_norm_channels_first, (_t(2, 6, 3, 4), w, b, 1e-5, "torch"))


def test_opcheck_triton_backend_under_the_interpreter():
    """The Triton backend's custom ops (forward with its saved outputs, backward op) on CPU tensors under the Triton
    interpreter, at sizes of a few programs: fake outputs match the kernels' (shapes, dtypes, strides), and the
    gradients through the backward ops are the kernels' own (opcheck compares them with the op's eager autograd)."""
    if not config.triton_interpret():
        pytest.skip("the Triton interpreter is off (a GPU machine: tests/gpu/test_gpu_compile.py)")
    torch.library.opcheck(OPS.dwconv_silu, (_t(1, 6, 4), _t(4, 1, 3), _t(4), "triton"))
    torch.library.opcheck(OPS.gated_rmsnorm, (_t(2, 8), _t(2, 8), _t(8), 1e-5, "triton"))
    torch.library.opcheck(OPS.layer_norm_channels_first, (_t(1, 4, 2, 3), _t(4), _t(4), 1e-5, "triton"))
    args = _ssd_args(b=1, l=5, h=1, p=4, n=4)
    torch.library.opcheck(OPS.bi_ssd, (*args, 64, True, 0.0, float("inf"), "both", False, "triton", True))


def _layout(out):
    """(shape, dtype, strides of the dims longer than 1) of each tensor in an op's (nested) output."""
    if isinstance(out, (list, tuple)):
        return [_layout(o) for o in out]
    return (tuple(out.shape), out.dtype, tuple(s for s, n in zip(out.stride(), out.shape) if n > 1))


def _real_and_fake(op, args):
    from torch._subclasses.fake_tensor import FakeTensorMode

    real = op(*args)
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else
                     [mode.from_tensor(t) for t in a] if isinstance(a, list) else a for a in args]
        fake = op(*fake_args)
    return _layout(real), _layout(fake)


def test_triton_backend_ops_and_backward_ops_lay_out_outputs_as_their_fakes():
    """Each Triton-backed custom op, forward and backward, returns tensors with the shapes, dtypes and strides its
    fake says (inductor asserts the strides of what it compiled against: a transposed weight gradient of the depthwise
    conv's backward failed every compiled training step on an H100). Shapes of a few programs, under the interpreter;
    the weight of the conv not square (c != k), so a transposed layout cannot pass for contiguous."""
    if not config.triton_interpret():
        pytest.skip("the Triton interpreter is off (a GPU machine: tests/gpu/test_gpu_compile.py)")
    d = lambda *s: _t(*s, grad=False)  # noqa: E731
    u, w, b = d(2, 6, 5), d(5, 1, 3), d(5)
    cases = [(OPS.dwconv_silu, (u, w, b, "triton")), (OPS.dwconv_silu_backward, (d(2, 6, 5), u, w, b)),
             (OPS.dwconv_silu_backward, (d(2, 6, 5), u, w, None))]
    x, z, g = d(3, 8), d(3, 8), d(8)
    _, rstd = OPS.gated_rmsnorm(x, z, g, 1e-5, "triton")
    cases += [(OPS.gated_rmsnorm, (x, z, g, 1e-5, "triton")), (OPS.gated_rmsnorm_backward, (d(3, 8), x, z, g, rstd))]
    xl, wl, bl = d(2, 4, 2, 3), d(4), d(4)
    _, mean, rstd_l = OPS.layer_norm_channels_first(xl, wl, bl, 1e-5, "triton")
    cases += [(OPS.layer_norm_channels_first, (xl, wl, bl, 1e-5, "triton")),
              (OPS.layer_norm_channels_first_backward, (d(2, 6, 4), xl, wl, bl, mean, rstd_l))]
    args = [None if t is None else t.detach() for t in _ssd_args(b=1, l=5, h=2, p=4, n=4)]
    fwd = (*args, 64, True, 0.0, float("inf"), "both", False, "triton", True)
    y, saved = OPS.bi_ssd(*fwd)
    cases += [(OPS.bi_ssd, fwd),
              (OPS.bi_ssd_backward, (torch.randn_like(y), *args, saved, True, 0.0, float("inf"), "both", False))]
    for op, a in cases:
        real, fake = _real_and_fake(op, a)
        assert real == fake, (str(op), real, fake)


def test_triton_backend_custom_op_gradients_equal_eager_autograd():
    """Through the custom ops, the Triton backend's y and gradients equal its eager autograd function's (the same
    kernels: nothing recomputed differently), Hydra mode with two segments (boundary states saved as an output)."""
    if not config.triton_interpret():
        pytest.skip("the Triton interpreter is off (a GPU machine: tests/gpu/test_gpu_compile.py)")
    from yolo_bimamba.ops.bi_ssd import tuning
    from yolo_bimamba.ops.bi_ssd.autograd import bi_ssd_triton

    args = _ssd_args(b=1, l=70, h=1, p=4, n=4, separate=True)
    with tuning.force_config(seg=tuning.SEG_MULTIPLE):
        nseg = tuning.cdiv(70, tuning.SEG_MULTIPLE)
        y, saved = OPS.bi_ssd(*args, 64, True, 0.0, float("inf"), "both", True, "triton", True)
        assert nseg > 1 and [tuple(t.shape) for t in saved][-1] == (1, 2, nseg - 1, 4, 4)
        dy = torch.randn_like(y)
        tensors = [t for t in args if t is not None]
        got = torch.autograd.grad(y, tensors, dy)
        ref_y = bi_ssd_triton(*args[:5], D=args[5], dt_bias=args[6], dt_softplus=True, shift=True, dt_bwd=args[7],
                              B_bwd=args[8], C_bwd=args[9])
        ref = torch.autograd.grad(ref_y, tensors, dy)
    assert torch.equal(y, ref_y)
    for a, b in zip(got, ref):
        assert torch.equal(a, b)


def test_custom_ops_reject_unresolved_backend():
    with pytest.raises(ValueError, match="backend must be one of"):
        OPS.dwconv_silu(torch.randn(1, 3, 2), torch.randn(2, 1, 3), None, "auto")


# ---------------------------------------------------------------------------------------------------------------
# which form runs: custom ops under torch.compile / torch.export, plain expressions for TorchScript / ONNX
# ---------------------------------------------------------------------------------------------------------------
def test_compiling_and_graph_tracing_tell_the_tracers_apart():
    class Probe(torch.nn.Module):
        def forward(self, x):
            return x + (1.0 if backend_choice.graph_tracing() else 0.0) + (10.0 if backend_choice.compiling() else 0.0)

    x = torch.zeros(2)
    assert torch.equal(Probe()(x), x)
    assert torch.equal(torch.jit.trace(Probe(), (x,))(x), x + 1.0)  # TorchScript (and the ONNX exporters): plain
    assert torch.equal(torch.compile(Probe(), backend="eager", fullgraph=True)(x), x + 10.0)
    assert torch.equal(torch.export.export(Probe(), (x,)).module()(x), x + 10.0)
    assert torch.equal(torch.export.export(Probe(), (x,), strict=True).module()(x), x + 10.0)


def test_backend_decision_traces_without_graph_break(monkeypatch):
    """What the ops decide at trace time (the kernels' import, the op's switch variable) is a constant for Dynamo,
    not a graph break."""
    monkeypatch.setenv("YOLO_BIMAMBA_FUSED_CONV", "1")

    def f(x):
        on = backend_choice.triton_usable("yolo_bimamba.ops.dwconv_kernels", config.fused_conv)
        return x + 1.0 if on else x - 1.0

    x = torch.zeros(3)
    assert torch.equal(torch.compile(f, backend="eager", fullgraph=True)(x), f(x))


def _graph_ops(gm):
    return {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}


def test_export_holds_custom_ops_and_runs():
    """torch.export.export of a BiMamba2 holds our custom ops (no plain-op expansion of the scan) and the exported
    program computes the eager output; so does its module() with a new batch (dynamic batch dim), and the program
    saved and loaded (torch.export.save / load, with this package imported)."""
    torch.manual_seed(0)
    m = BiMamba2(d_model=16, d_state=8, headdim=8, chunk_size=8).eval()
    u = torch.randn(2, 13, 16)
    batch = torch.export.Dim("batch", min=1, max=8)
    ep = torch.export.export(m, (u,), dynamic_shapes=({0: batch},))
    ops = _graph_ops(ep.graph_module)
    assert {"yolo_bimamba.bi_ssd.default", "yolo_bimamba.dwconv_silu.default",
            "yolo_bimamba.gated_rmsnorm.default"} <= ops, ops
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    buf.seek(0)
    loaded = torch.export.load(buf)
    with torch.no_grad():
        for x in (u, torch.randn(3, 13, 16)):
            torch.testing.assert_close(ep.module()(x), m(x), rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(loaded.module()(x), m(x), rtol=1e-5, atol=1e-6)


def test_torchscript_trace_keeps_plain_ops():
    """TorchScript tracing (what Ultralytics' TorchScript and ONNX exporters run) still takes the plain-op form:
    no custom op in the graph, so the file runs without this package."""
    m = BiMamba2(d_model=16, d_state=8, headdim=8, chunk_size=8).eval()
    u = torch.randn(1, 9, 16)
    traced = torch.jit.trace(m, (u,))
    assert "yolo_bimamba::" not in str(traced.inlined_graph)  # (source paths name the package; ops would be ::)
    torch.testing.assert_close(traced(u), m(u), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# torch.compile: fullgraph=True (a graph break raises), outputs and gradients equal eager
# ---------------------------------------------------------------------------------------------------------------
def _grads(out, params, g):
    return torch.autograd.grad(out, params, g)


def _compare(module, x, backend="aot_eager", rtol=1e-10, atol=1e-12):
    ref = module(x)
    g = torch.randn_like(ref)
    params = [x] + [p for p in module.parameters() if p.requires_grad]
    g_ref = _grads(ref, params, g)
    torch._dynamo.reset()
    compiled = torch.compile(module, backend=backend, fullgraph=True)
    out = compiled(x)
    torch.testing.assert_close(out, ref, rtol=rtol, atol=atol)
    for a, b in zip(_grads(out, params, g), g_ref):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol)
    return compiled


@pytest.mark.parametrize("kw", [dict(d_model=16, d_state=8, headdim=8, chunk_size=8),
                                dict(d_model=24, d_state=4, headdim=8, ngroups=3, bias=True, chunk_size=4)])
def test_compile_bimamba2_fullgraph_train_and_eval(kw):
    torch.manual_seed(0)
    m = BiMamba2(**kw).double()
    with torch.no_grad():
        m.D.uniform_(-1, 1)
    u = torch.randn(2, 19, kw["d_model"], dtype=torch.float64, requires_grad=True)
    compiled = _compare(m, u)
    with torch.no_grad():  # inference: no saved outputs needed, same graph rules
        torch.testing.assert_close(compiled(u), m(u), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kw", [dict(scan="row"), dict(scan="rowcol", mlp_ratio=2.0)])
def test_compile_bimamba_layer2d_fullgraph_forward_backward(kw):
    torch.manual_seed(0)
    layer = BiMambaLayer2D(16, d_state=8, headdim=8, chunk_size=8, **kw).double().train()
    x = torch.randn(2, 16, 3, 5, dtype=torch.float64, requires_grad=True)
    _compare(layer, x)


def test_compile_hydra_layer2d_fullgraph_forward_backward():
    """Hydra (the op's shifted mode with the backward direction's own dt, B, C; norm before the gate)."""
    from yolo_bimamba.nn.hydra import HydraLayer2D

    torch.manual_seed(0)
    layer = HydraLayer2D(16, d_state=8, headdim=8, chunk_size=8).double().train()
    _compare(layer, torch.randn(2, 16, 3, 4, dtype=torch.float64, requires_grad=True))


def test_compile_triton_backend_equals_eager_under_the_interpreter():
    """A BiMambaLayer2D with backend="triton" (the SSD op, the conv and the token LayerNorm on the Triton kernels, as
    on a GPU) compiled with fullgraph=True: the custom ops launch the kernels (forward and backward) and the outputs
    and gradients are bitwise those of eager."""
    if not config.triton_interpret():
        pytest.skip("the Triton interpreter is off (a GPU machine: tests/gpu/test_gpu_compile.py)")
    from yolo_bimamba.ops import launch

    torch.manual_seed(0)
    layer = BiMambaLayer2D(16, d_state=16, headdim=16, chunk_size=64, backend="triton").train()
    x = torch.randn(1, 16, 3, 5, requires_grad=True)
    params = [x] + list(layer.parameters())
    ref = layer(x)
    g = torch.randn_like(ref)
    g_ref = torch.autograd.grad(ref, params, g)
    torch._dynamo.reset()
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    before = dict(launch.counts)
    out = compiled(x)
    mid = dict(launch.counts)
    got = torch.autograd.grad(out, params, g)
    assert sum(mid.values()) > sum(before.values()) and sum(launch.counts.values()) > sum(mid.values())
    assert torch.equal(out, ref)
    for a, b in zip(got, g_ref):
        assert torch.equal(a, b)


def test_compile_graph_holds_our_custom_ops():
    """The graph Dynamo hands the backend holds the custom ops (the scan, conv, gated norm and token LayerNorm), not
    the plain-op export form."""
    seen = []

    def backend(gm, inputs):
        seen.append(_graph_ops(gm))
        return gm.forward

    layer = BiMambaLayer2D(16, d_state=8, headdim=8, chunk_size=8).eval()
    torch._dynamo.reset()
    torch.compile(layer, backend=backend, fullgraph=True)(torch.randn(1, 16, 2, 3))
    names = {n.split(".")[1] for n in seen[0] if n.startswith("yolo_bimamba.")}  # (op packets and overloads)
    assert {"bi_ssd", "dwconv_silu", "gated_rmsnorm", "layer_norm_channels_first"} <= names, seen


@pytest.mark.slow
def test_compile_inductor_bimamba2():
    """Inductor (C++ on the CPU: about a minute here) compiles the graph around the custom ops: same output and
    gradients (fp32)."""
    torch.manual_seed(0)
    m = BiMamba2(d_model=8, d_state=4, headdim=4, chunk_size=4)
    _compare(m, torch.randn(1, 6, 8, requires_grad=True), backend="inductor", rtol=1e-4, atol=1e-5)


def test_compile_validation_errors_name_the_argument():
    """Validation runs while Dynamo traces, before any op: a bad argument raises the API's ValueError."""
    from yolo_bimamba.ops import bi_ssd

    def f(x, dt, A, B, C):
        return bi_ssd(x, dt, A, B, C)

    x, dt, A, B, C = (t.detach() for t in _ssd_args(dtype=torch.float32)[:5])
    torch._dynamo.reset()
    with pytest.raises(ValueError, match="argument 'A' must have shape"):
        torch.compile(f, backend="aot_eager")(x, dt, A[:1], B, C)
    # fullgraph=True: Dynamo reports the ValueError as an exception its graph cannot hold, with the same message
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported, match="argument 'A' must have shape"):
        torch.compile(f, backend="aot_eager", fullgraph=True)(x, dt, A[:1], B, C)


@pytest.mark.slow
def test_detector_graph_breaks_are_not_at_our_ops():
    """A whole yolov8n-bimamba detector under Dynamo (torch._dynamo.explain), train and eval mode: no graph break
    has one of our modules' or ops' frames on its stack. Training mode: one graph, no break. Eval mode: Ultralytics'
    anchor generation (ultralytics/utils/tal.py make_anchors, a tensor stride read as a number) breaks the graph;
    counted and printed, not ours."""
    from ultralytics.nn.tasks import DetectionModel

    torch.manual_seed(0)
    model = DetectionModel("yolov8n-bimamba.yaml", nc=2, verbose=False)
    x = torch.randn(1, 3, 64, 64)
    for train in (True, False):
        model.train(train)
        torch._dynamo.reset()
        explanation = torch._dynamo.explain(model)(x)
        where = []
        for br in explanation.break_reasons:
            assert br.user_stack, br  # every break says where it happened
            where.append(f"{br.user_stack[-1].filename}:{br.user_stack[-1].lineno}")
            assert not any("yolo_bimamba" in f.filename for f in br.user_stack), br
        if train:
            assert explanation.graph_break_count == 0 and explanation.graph_count == 1, where
        print(f"train={train}: {explanation.graph_count} graphs, {explanation.graph_break_count} graph breaks at",
              sorted(set(where)))


@pytest.mark.slow
def test_compiled_detector_training_step_equals_eager():
    """yolov8n-bimamba's training forward under torch.compile(fullgraph=True) (the loss eager after it, as a trainer
    that compiles the model runs it): the same loss and parameter gradients as eager."""
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import DetectionModel

    torch.manual_seed(0)
    model = DetectionModel("yolov8n-bimamba.yaml", nc=2, verbose=False).train()
    model.args = get_cfg()
    g = torch.Generator().manual_seed(1)
    batch = {"img": torch.rand(2, 3, 64, 64, generator=g), "batch_idx": torch.tensor([0.0, 1.0]),
             "cls": torch.tensor([[0.0], [1.0]]), "bboxes": torch.tensor([[0.5, 0.5, 0.3, 0.4], [0.3, 0.6, 0.2, 0.2]])}
    params = [p for p in model.parameters() if p.requires_grad]
    ref = model.loss(batch, model(batch["img"]))[0].sum()
    g_ref = torch.autograd.grad(ref, params, allow_unused=True)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    loss = model.loss(batch, compiled(batch["img"]))[0].sum()
    got = torch.autograd.grad(loss, params, allow_unused=True)
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    for a, b in zip(got, g_ref):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
