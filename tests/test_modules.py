"""nn modules: shapes, initial values, gradients reach every parameter, bad input."""
import math

import pytest
import torch

from yolo_bimamba.nn import BiMamba2, BiMambaLayer2D, C2fBiMamba, RMSNormGated
from yolo_bimamba.nn.bimamba2 import A_LOG_MAX


def test_bimamba2_shapes_and_param_layout():
    m = BiMamba2(64, d_state=16, d_conv=7, expand=2, headdim=32, ngroups=2)
    d_inner, nheads, gn = 128, 4, 2 * 16
    assert m.in_proj.weight.shape == (2 * d_inner + 2 * gn + nheads, 64)
    assert m.conv1d.weight.shape == (d_inner + 2 * gn, 1, 7)
    assert m.out_proj.weight.shape == (64, d_inner)
    assert m.dt_bias.shape == m.A_log.shape == m.D.shape == (nheads,)
    y = m(torch.randn(3, 29, 64))
    assert y.shape == (3, 29, 64) and torch.isfinite(y).all()


def test_bimamba2_init_values():
    torch.manual_seed(1)
    m = BiMamba2(256, headdim=32, dt_min=0.001, dt_max=0.1, A_init_range=(1, 16))
    dt = torch.nn.functional.softplus(m.dt_bias.detach())
    assert dt.min() >= 0.001 - 1e-6 and dt.max() <= 0.1 + 1e-6
    A = torch.exp(m.A_log.detach())
    assert A.min() >= 1 and A.max() <= 16
    assert torch.equal(m.D.detach(), torch.ones_like(m.D))
    assert torch.equal(m.norm.weight.detach(), torch.ones_like(m.norm.weight))
    assert all(getattr(p, "_no_weight_decay", False) for p in (m.dt_bias, m.A_log, m.D))


def test_every_parameter_gets_a_gradient():
    for mod, x in (
        (BiMamba2(32, d_state=16, headdim=16), torch.randn(2, 11, 32)),
        (C2fBiMamba(16, 32, n=2, scan="rowcol", mlp_ratio=2.0), torch.randn(2, 16, 5, 7)),
    ):
        mod(x).square().mean().backward()
        dead = [n for n, p in mod.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
        assert not dead, dead
        assert all(p.grad.abs().sum() > 0 for n, p in mod.named_parameters() if "D" != n.split(".")[-1]), "zero grads"


def test_bidirectional_context():
    """The first token's output must depend on the last token (and vice versa)."""
    m = BiMamba2(32, d_state=16, headdim=16).double()
    x = torch.randn(1, 40, 32, dtype=torch.float64, requires_grad=True)
    y = m(x)
    (g_first,) = torch.autograd.grad(y[0, 0].sum(), x, retain_graph=True)
    (g_last,) = torch.autograd.grad(y[0, -1].sum(), x)
    assert g_first[0, -1].abs().sum() > 0 and g_last[0, 0].abs().sum() > 0


@pytest.mark.parametrize("scan", ["row", "rowcol"])
def test_layer2d_shape_and_scan_orders_differ(scan):
    torch.manual_seed(0)
    layer = BiMambaLayer2D(32, scan=scan)
    x = torch.randn(2, 32, 6, 9)
    assert layer(x).shape == x.shape
    if scan == "rowcol":
        row = BiMambaLayer2D(32, scan="row")
        row.load_state_dict(layer.state_dict())
        assert not torch.allclose(row(x), layer(x))


def test_c2f_block_channels():
    blk = C2fBiMamba(48, 96, n=3, shortcut=True, e=0.5)
    assert blk.c == 48 and len(blk.m) == 3
    assert blk(torch.randn(1, 48, 8, 8)).shape == (1, 96, 8, 8)


def test_A_is_clamped_so_decays_stay_finite():
    m = BiMamba2(32, d_state=16, headdim=16)
    with torch.no_grad():
        m.A_log.fill_(1e4)  # exp would overflow to inf without the clamp
    y = m(torch.randn(1, 20, 32))
    assert torch.isfinite(y).all()
    assert A_LOG_MAX == pytest.approx(math.log(1e3))


def test_rmsnorm_gated_modes():
    x, z = torch.randn(4, 8), torch.randn(4, 8)
    after = RMSNormGated(8, norm_before_gate=False)(x, z)
    before = RMSNormGated(8, norm_before_gate=True)(x, z)
    g = x * torch.nn.functional.silu(z)
    assert torch.allclose(after, g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + 1e-5), atol=1e-6)
    assert torch.allclose(before, x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * torch.nn.functional.silu(z), atol=1e-6)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(d_model=30, headdim=16), "divisible by headdim"),
        (dict(d_model=32, headdim=16, ngroups=3), "ngroups"),
        (dict(d_model=32, headdim=16, d_conv=4), "odd"),
        (dict(d_model=32, headdim=16, learnable_init_states=True), "learnable_init_states"),
        (dict(d_model=32, headdim=16, activation="relu"), "activation"),
        (dict(d_model=32, headdim=16, A_init_range=(0, 4)), "A_init_range"),
    ],
)
def test_bad_constructor_args(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BiMamba2(**kwargs)


def test_bad_forward_input():
    with pytest.raises(ValueError, match=r"\(batch, seqlen, 32\)"):
        BiMamba2(32, headdim=16)(torch.randn(2, 5, 31))
    with pytest.raises(ValueError, match=r"\(N, 16, H, W\)"):
        BiMambaLayer2D(16)(torch.randn(2, 15, 4, 4))
    with pytest.raises(ValueError, match="scan"):
        BiMambaLayer2D(16, scan="diag")


def test_cuda_graph_replay_is_off_the_cuda_training_path():
    """cuda_graph.run only replays for CUDA tensors in training with gradients on (its GPU tests compare the replay
    with the eager layer): on the CPU, in eval and under no_grad, the layer is its eager forward, bit for bit, and
    nothing is captured."""
    from yolo_bimamba.nn import cuda_graph

    torch.manual_seed(0)
    layer = BiMambaLayer2D(32)
    x = torch.randn(2, 32, 5, 7, requires_grad=True)
    for mode in ("train", "eval"):
        getattr(layer, mode)()
        for grad in (True, False):
            with torch.set_grad_enabled(grad):
                assert torch.equal(layer(x), layer._forward(x))
    assert cuda_graph.graphed_shapes(layer) == []
    assert not cuda_graph._usable(layer.train(), x, tuple(layer.parameters()))


def test_cuda_graph_captures_ask_for_thread_local_mode(monkeypatch):
    """Every capture of a layer (forward, backward, and the reset after a failed capture) asks for thread-local
    capture mode. Under torch's default ("global") a DataLoader's pin-memory thread that allocates pinned memory while
    a layer is captured dies, and `yolo train` with it (seen on an H200). Capturing needs CUDA: the GPU test
    (tests/gpu/test_cuda_graph.py::test_capture_while_another_thread_pins_memory) runs it beside such a thread; here
    the layer's capture code runs on the CPU against a recording stand-in of torch.cuda's capture API."""
    import contextlib

    from yolo_bimamba.nn import cuda_graph

    modes = []

    class Stream:
        def __init__(self, *args, **kwargs):
            pass

        def wait_stream(self, other):
            pass

    @contextlib.contextmanager
    def graph(cuda_graph_, pool=None, stream=None, capture_error_mode="global"):
        modes.append(capture_error_mode)
        yield

    for name, value in dict(graph=graph, CUDAGraph=object, Stream=Stream, current_stream=lambda *a: Stream(),
                            stream=lambda s: contextlib.nullcontext(), synchronize=lambda *a: None,
                            graph_pool_handle=lambda: None).items():
        monkeypatch.setattr(torch.cuda, name, value)
    torch.manual_seed(0)
    layer = BiMambaLayer2D(16).train()
    x = torch.randn(1, 16, 3, 4, requires_grad=True)
    g = cuda_graph._Graphs(layer, layer._forward, x, tuple(layer.parameters()))
    cuda_graph.end_stuck_capture("cpu")
    assert modes == ["thread_local"] * 3
    assert g.out.shape == (1, 16, 3, 4) and len(g.grads) == 1 + len(list(layer.parameters()))


def test_cuda_graph_summary_counts_replaying_failed_and_eager_layers(monkeypatch):
    """The line the training guard logs at the end of CUDA training: layers with graphs (and their distinct input
    shapes), layers left eager by a failed capture, and the rest."""
    from yolo_bimamba.nn import C2fBiMamba, cuda_graph

    block = C2fBiMamba(32, 32, n=4)
    a, b, c, _ = block.m
    monkeypatch.setattr(cuda_graph, "_graphs", cuda_graph.weakref.WeakKeyDictionary())
    cuda_graph._graphs[a] = {((2, 16, 5, 5), "k1"): object(), ((1, 16, 5, 5), "k2"): object()}
    cuda_graph._graphs[b] = {((2, 16, 5, 5), "k3"): object()}
    cuda_graph._graphs[c] = None
    monkeypatch.setenv("YOLO_BIMAMBA_CUDA_GRAPHS", "1")
    assert cuda_graph.summary(block, BiMambaLayer2D) == (
        "CUDA-graph replay on: 2 of 4 BiMambaLayer2D layers replay graphs (2 input shapes), "
        "1 eager after a failed capture, 1 eager")
    monkeypatch.setenv("YOLO_BIMAMBA_CUDA_GRAPHS", "0")
    assert cuda_graph.summary(block, BiMambaLayer2D).startswith("CUDA-graph replay off (YOLO_BIMAMBA_CUDA_GRAPHS=0)")


def test_cuda_graph_stand_ins_share_storage_and_are_put_back():
    """The capture differentiates with respect to stand-ins of the layer's parameters (new leaves on the same storage);
    afterwards, and after an error too, every module holds its own parameters again."""
    from yolo_bimamba.nn import cuda_graph

    layer = BiMambaLayer2D(16)
    params = tuple(layer.parameters())
    stand_ins = [torch.nn.Parameter(p.detach(), requires_grad=True) for p in params]
    with cuda_graph._standing_in(layer, params, stand_ins):
        now = tuple(layer.parameters())
        assert all(a is b for a, b in zip(now, stand_ins)) and len(now) == len(params)
        assert all(a.data_ptr() == p.data_ptr() and a is not p for a, p in zip(now, params))
        out = layer._forward(torch.randn(1, 16, 3, 4))
        grads = torch.autograd.grad(out.sum(), stand_ins, allow_unused=True)
        assert all(p.grad is None for p in params) and any(g is not None for g in grads)
    assert all(a is b for a, b in zip(layer.parameters(), params))
    with pytest.raises(RuntimeError, match="boom"):
        with cuda_graph._standing_in(layer, params, stand_ins):
            raise RuntimeError("boom")
    assert all(a is b for a, b in zip(layer.parameters(), params))


def test_fp16_scans_keep_their_dtype_off_cuda_and_for_the_pytorch_op():
    """ops.bi_ssd.mixer_scan_dtype moves only fp16 CUDA scans of the Triton kernels to bf16 (tests/gpu checks that
    case): CPU inputs (the exports, the CPU tests) and backend="torch" keep their dtype, fp32 and bf16 too; the mixers
    return their input's dtype."""
    import importlib

    mod = importlib.import_module("yolo_bimamba.ops.bi_ssd.api")
    for dt in (torch.float16, torch.bfloat16, torch.float32):
        for backend in ("auto", "torch", "triton"):
            assert mod.mixer_scan_dtype(torch.zeros(2, 3, dtype=dt), 32, 32, backend) == dt
    torch.manual_seed(0)
    m = BiMamba2(32, d_state=16, headdim=16).to(torch.float16)
    assert m(torch.randn(1, 9, 32, dtype=torch.float16)).dtype == torch.float16


@pytest.mark.parametrize("mixer", ["bimamba2", "hydra"])
def test_mixers_return_their_dtype_when_the_scan_runs_in_another(monkeypatch, mixer):
    """Under fp16 (AMP or a half model, as Ultralytics validates and predicts) the Triton scan runs and returns bf16
    (ops.bi_ssd.api.mixer_bi_ssd); the gated norm then writes the model's dtype (z's), so a half model's out-projection
    gets fp16. Here the same path under the Triton interpreter, with the scan moved from fp32 to fp64: the mixer's
    output is fp32 and equals the fp64 module's (before, the norm returned the scan's dtype and the fp32
    out-projection refused it)."""
    import importlib

    from yolo_bimamba.nn.hydra import Hydra
    from yolo_bimamba.ops.bi_ssd import tuning

    if not tuning._INTERPRET:
        pytest.skip("needs the Triton interpreter (CPU) for backend='triton'")
    api = importlib.import_module("yolo_bimamba.ops.bi_ssd.api")
    seen = []
    monkeypatch.setattr(api, "_scan_dtype", lambda x, triton: seen.append(x.dtype) or torch.float64)
    torch.manual_seed(0)
    m = (BiMamba2 if mixer == "bimamba2" else Hydra)(32, d_state=16, headdim=16, chunk_size=8)
    for mod in m.modules():  # the mixer and its norm
        if hasattr(mod, "backend"):
            mod.backend = "triton"
    u = torch.randn(2, 19, 32)
    y = m(u)
    assert seen == [torch.float32] and y.dtype == torch.float32
    monkeypatch.undo()
    want = m.double()(u.double())
    assert (y.double() - want).abs().max() <= 1e-5 * want.abs().max()


@pytest.mark.parametrize("kw", [
    dict(d_model=32, d_state=32, headdim=32, chunk_size=64),
    dict(d_model=48, d_state=16, headdim=16, ngroups=2, bias=True, chunk_size=16),
    dict(d_model=24, d_state=8, headdim=8, conv_bias=False, chunk_size=8, dt_limit=(1e-3, 0.5)),
])
def test_bimamba2_graph_form_equals_eager(kw, monkeypatch, tmp_path):
    """The form traced and exported graphs hold (BiMamba2._forward_graph: the in-projection's row blocks as separate
    products, x, B, C channels-first through the conv and into the chunked op) is the eager function: equal in float64
    with its gradients (L shorter than the conv, not a multiple of the chunk, several chunks; ngroups 1 and 2; biases
    on and off), taken while a graph is traced (backend_choice.graph_tracing), and exported to ONNX without a Split or
    a Transpose before the conv, with outputs equal to eager PyTorch in onnxruntime."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    import yolo_bimamba.nn.bimamba2 as bm

    torch.manual_seed(0)
    m = BiMamba2(**kw).double()
    with torch.no_grad():
        m.D.uniform_(-1, 1)
        m.dt_bias.uniform_(-2, 1)
        m.norm.weight.uniform_(0.5, 1.5)
    for L in (1, 5, 37, 3 * kw["chunk_size"] + 5):
        u = torch.randn(2, L, kw["d_model"], dtype=torch.float64, requires_grad=True)
        ref = m(u)
        got = m._forward_graph(u)
        torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
        g = torch.randn_like(ref)
        params = [u] + list(m.parameters())
        g_ref = torch.autograd.grad(ref, params, g)
        g_got = torch.autograd.grad(got, params, g)
        for a, b in zip(g_got, g_ref):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    calls = []
    orig = bm.BiMamba2._forward_graph
    monkeypatch.setattr(bm.BiMamba2, "_forward_graph", lambda self, u: calls.append(1) or orig(self, u))
    monkeypatch.setattr(bm, "graph_tracing", lambda: True)
    m(torch.randn(1, 9, kw["d_model"], dtype=torch.float64))
    assert calls == [1]
    monkeypatch.undo()

    mf = BiMamba2(**kw).eval()
    u = torch.randn(1, 2 * kw["chunk_size"] + 3, kw["d_model"])
    path = tmp_path / "mixer.onnx"
    torch.onnx.export(mf, (u,), str(path), opset_version=17, dynamo=False)
    graph = onnx.load(str(path)).graph
    ops = [n.op_type for n in graph.node]
    assert "Split" not in ops and ops.count("Conv") == 3
    producers = {o: n for n in graph.node for o in n.output}
    for conv in (n for n in graph.node if n.op_type == "Conv"):
        src = producers.get(conv.input[0])
        while src is not None and src.op_type in ("Unsqueeze", "Add"):
            src = producers.get(src.input[0])
        assert src is not None and src.op_type == "MatMul", src  # the projection's rows, not a transposed copy
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    out = sess.run(None, {sess.get_inputs()[0].name: u.numpy()})[0]
    with torch.no_grad():
        np.testing.assert_allclose(out, mf(u).numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mlp_ratio", [0.0, 2.0])
def test_layer_scale_zero_is_the_identity_and_trains(mlp_ratio):
    torch.manual_seed(0)
    layer = BiMambaLayer2D(32, mlp_ratio=mlp_ratio, layer_scale=0.0)
    x = torch.randn(2, 32, 5, 7, requires_grad=True)
    y = layer(x)
    assert torch.equal(y, x)
    y.square().sum().backward()
    assert layer.gamma.grad.abs().sum() > 0  # the scales learn at once; the branches follow once they are non-zero
    assert (layer.gamma2 is None) == (mlp_ratio == 0) and (layer.gamma2 is None or layer.gamma2.grad.abs().sum() > 0)
    assert all(getattr(p, "_no_weight_decay", False) for p in (layer.gamma, layer.gamma2) if p is not None)
    with torch.no_grad():
        layer.gamma.fill_(1.0)
        if layer.gamma2 is not None:
            layer.gamma2.fill_(1.0)
        plain = BiMambaLayer2D(32, mlp_ratio=mlp_ratio)
        plain.load_state_dict({k: v for k, v in layer.state_dict().items() if not k.startswith("gamma")})
        torch.testing.assert_close(layer(x), plain(x), rtol=0, atol=0)  # a scale of 1 is the plain layer


def test_layer_scale_default_keeps_the_plain_layer_and_old_pickles_run(tmp_path):
    torch.manual_seed(0)
    layer = BiMambaLayer2D(16, mlp_ratio=2.0)
    assert layer.gamma is None and layer.gamma2 is None
    assert not any("gamma" in k for k in layer.state_dict())
    x = torch.randn(1, 16, 4, 3)
    ref = layer(x)
    for k in ("gamma", "gamma2"):  # a layer pickled before layer_scale existed has neither attribute
        layer.__dict__.pop(k)
    torch.save(layer, tmp_path / "old.pt")
    old = torch.load(tmp_path / "old.pt", weights_only=False)
    assert not hasattr(old, "gamma") and torch.equal(old(x), ref)
    with pytest.raises(ValueError, match="layer_scale"):
        BiMambaLayer2D(16, layer_scale=float("nan"))


def test_local_branch_sits_beside_the_mixer():
    torch.manual_seed(0)
    layer = BiMambaLayer2D(32, local=5)
    assert layer.local_conv.kernel_size == (5, 5) and layer.local_conv.groups == 32
    plain = BiMambaLayer2D(32)
    plain.load_state_dict({k: v for k, v in layer.state_dict().items() if not k.startswith("local_conv")})
    x = torch.randn(2, 32, 6, 7)
    with torch.no_grad():
        # the branch adds dwconv(LN(x)) to the mixer's output, inside the residual
        tokens = torch.nn.functional.layer_norm(x.flatten(2).transpose(1, 2), (32,), layer.norm.weight, layer.norm.bias)
        conv = layer.local_conv(tokens.transpose(1, 2).reshape(2, 32, 6, 7))
        torch.testing.assert_close(layer(x), plain(x) + conv, rtol=1e-5, atol=1e-5)
    layer(x).square().mean().backward()
    assert layer.local_conv.weight.grad.abs().sum() > 0
    scaled = BiMambaLayer2D(32, local=3, layer_scale=0.0)
    assert torch.equal(scaled(x), x)  # the branch is inside the scaled residual: still the identity at step 0


def test_pos_encoding_starts_at_zero_and_learns():
    torch.manual_seed(0)
    layer = BiMambaLayer2D(16, pos=True, mlp_ratio=2.0)
    plain = BiMambaLayer2D(16, mlp_ratio=2.0)
    plain.load_state_dict({k: v for k, v in layer.state_dict().items() if not k.startswith("pos_conv")})
    x = torch.randn(2, 16, 5, 4)
    assert torch.equal(layer(x), plain(x))  # zero-initialised: no change at init
    layer(x).square().mean().backward()
    assert layer.pos_conv.weight.grad.abs().sum() > 0 and layer.pos_conv.bias.grad.abs().sum() > 0
    with torch.no_grad():
        layer.pos_conv.weight.normal_()
        assert not torch.allclose(layer(x), plain(x))
        ref = plain(x + layer.pos_conv(x))  # x + dwconv3x3(x) before the layer
        torch.testing.assert_close(layer(x), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs, match", [
    (dict(scan="cross4"), "four ways"), (dict(local=4), "odd"), (dict(local=-1), "local"), (dict(local=True), "local"),
    (dict(pos=1), "pos"), (dict(layer_scale="0"), "layer_scale"),
])
def test_bad_layer_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BiMambaLayer2D(16, **kwargs)


def test_layer_options_reach_the_extension_blocks():
    from yolo_bimamba.nn import C3k2BiMamba

    blk = C3k2BiMamba(32, 32, 1, True, scan="rowcol", local=3, pos=True, layer_scale=0.1)
    assert blk.mix.scan == "rowcol" and blk.mix.local_conv is not None and blk.mix.pos_conv is not None
    assert torch.allclose(blk.mix.gamma, torch.full((32,), 0.1))
    assert blk(torch.randn(1, 32, 4, 4)).shape == (1, 32, 4, 4)
