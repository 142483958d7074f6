"""GPU tests of the CUDA-graph replay of BiMamba layers in training (yolo_bimamba.nn.cuda_graph).

    python -m pytest -m gpu tests/gpu/test_cuda_graph.py -v    # needs CUDA, torch, triton and ultralytics

Every test trains the same block twice from the same weights and inputs, once eagerly (YOLO_BIMAMBA_CUDA_GRAPHS=0)
and once with graph replays, and compares the outputs and the gradients that reach .grad, over several optimizer
steps with gradient accumulation (the case where a replay's static gradient buffer must not end up in .grad).
"""
from __future__ import annotations

import copy
import threading
import time
import warnings

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
pytest.importorskip("ultralytics", reason="the blocks use Ultralytics' Conv: install the .whl wheels first")

from yolo_bimamba.nn import C2fBiMamba, C2fHydra, cuda_graph  # noqa: E402
from yolo_bimamba.nn.blocks import BiMambaLayer2D  # noqa: E402

AMP = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
TOL = {"fp32": 1e-4, "bf16": 2e-3, "fp16": 2e-3}  # after optimizer steps: atomics in ddt/dA move the weights by ulps


def rel(a, b):
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def train(block, xs, amp, graphs, monkeypatch, accumulate=2, twice=False):
    """Steps of SGD on mean(out^2), stepping every ``accumulate`` batches: outputs, .grad before each step, the
    input gradients (xs require grad), and the layers' graphed shapes."""
    monkeypatch.setenv("YOLO_BIMAMBA_CUDA_GRAPHS", "1" if graphs else "0")
    opt = torch.optim.SGD(block.parameters(), lr=0.05)
    outs, grads = [], []
    for i, x in enumerate(xs):
        with torch.autocast("cuda", dtype=AMP[amp] or torch.float32, enabled=AMP[amp] is not None):
            y = block(x)
            if twice:  # the same layers again before the backward: the second call must run eagerly
                y = y + block(x.flip(-1))
        (y.float() ** 2).mean().backward()
        outs.append(y.detach().clone())
        if (i + 1) % accumulate == 0:
            grads.append([p.grad.clone() for p in block.parameters()])
            opt.step()
            opt.zero_grad()
    layers = [m for m in block.modules() if isinstance(m, BiMambaLayer2D)]  # block may be DDP-wrapped
    return outs, grads, [x.grad.clone() for x in xs], [cuda_graph.graphed_shapes(m) for m in layers]


def inputs(n, shape, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(*shape, device="cuda", generator=g).requires_grad_() for _ in range(n)]


def compare(block_cls, amp, monkeypatch, shapes=((4, 64, 12, 10),), twice=False, **kw):
    torch.manual_seed(0)
    block = block_cls(64, 64, n=2, **kw).cuda().train()
    ref = copy.deepcopy(block)
    xs = [x for i, s in enumerate(shapes) for x in inputs(4, s, seed=i)]
    xs_ref = [x.detach().clone().requires_grad_() for x in xs]
    out, grads, dxs, graphed = train(block, xs, amp, True, monkeypatch, twice=twice)
    out_r, grads_r, dxs_r, graphed_r = train(ref, xs_ref, amp, False, monkeypatch, twice=twice)
    assert all(not s for s in graphed_r), "eager run captured graphs"
    assert all(len(s) == len(shapes) for s in graphed), f"expected one graph per input shape, got {graphed}"
    tol = TOL[amp]
    for i, (a, b) in enumerate(zip(out, out_r)):
        assert torch.isfinite(a).all() and rel(a, b) <= tol, f"output {i}: {rel(a, b)}"
    for i, (a, b) in enumerate(zip(dxs, dxs_r)):
        assert rel(a, b) <= tol, f"input gradient {i}: {rel(a, b)}"
    names = [n for n, _ in block.named_parameters()]
    for s, (gs, gs_r) in enumerate(zip(grads, grads_r)):
        for name, a, b in zip(names, gs, gs_r):
            assert torch.isfinite(a).all() and rel(a, b) <= tol, f"step {s} {name}: {rel(a, b)}"


@pytest.mark.parametrize("amp", list(AMP))
def test_replay_matches_eager_training(amp, monkeypatch):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        compare(C2fBiMamba, amp, monkeypatch)
    # a replay must not leave autograd nodes of the capture stream behind (torch warns of a stream mismatch and
    # synchronizes on every step when it does)
    stream = [str(w.message) for w in seen if "stream" in str(w.message).lower()]
    assert not stream, stream


def test_replay_matches_eager_with_the_pytorch_op(monkeypatch):
    # the replay wraps the layer whatever backend the op uses: the PyTorch op's graph must match its eager run too
    # (fp32: in bf16 cuBLAS may pick other kernels inside a capture, which moves outputs by a bf16 ulp)
    compare(C2fBiMamba, "fp32", monkeypatch, backend="torch")


def test_capture_while_an_older_graph_holds_the_parameters(monkeypatch):
    """The caller's previous step (Ultralytics keeps its loss) or DDP keep the parameters' AccumulateGrad nodes alive,
    made on the default stream; the capture (on a side stream) must not touch them."""
    torch.manual_seed(0)
    layer = BiMambaLayer2D(32).cuda().train()
    ref = copy.deepcopy(layer)
    x = torch.randn(2, 32, 6, 7, device="cuda")
    monkeypatch.setenv("YOLO_BIMAMBA_CUDA_GRAPHS", "0")
    held = layer(x).sum()  # an eager graph over the parameters, alive during the capture below
    monkeypatch.setenv("YOLO_BIMAMBA_CUDA_GRAPHS", "1")
    layer(x).square().mean().backward()
    assert cuda_graph.graphed_shapes(layer) == [(2, 32, 6, 7)]
    monkeypatch.setenv("YOLO_BIMAMBA_CUDA_GRAPHS", "0")
    ref(x).square().mean().backward()
    for (name, p), q in zip(layer.named_parameters(), ref.parameters()):
        assert rel(p.grad, q.grad) <= 1e-4, name
    del held


def _capture_while_pinning(monkeypatch, mode):
    """Captures a layer while another thread keeps allocating pinned host memory, as a DataLoader's pin-memory thread
    does during training: (errors of that thread, pinned allocations it made, the layer's graphed shapes)."""
    monkeypatch.setattr(cuda_graph, "CAPTURE_MODE", mode)
    torch.manual_seed(0)
    layer = BiMambaLayer2D(64).cuda().train()
    x = torch.randn(4, 64, 20, 20, device="cuda", requires_grad=True)
    monkeypatch.setenv("YOLO_BIMAMBA_CUDA_GRAPHS", "0")
    BiMambaLayer2D(64).cuda().train()(x).sum().backward()  # kernels compiled before: the thread below runs briefly
    monkeypatch.setenv("YOLO_BIMAMBA_CUDA_GRAPHS", "1")
    errors, kept, stop = [], [], threading.Event()

    def pin():  # every tensor is kept, so that each one is a new cudaHostAlloc, not a cached block
        while not stop.is_set() and len(kept) < 20000:
            try:
                kept.append(torch.empty(4096 + len(kept), dtype=torch.uint8).pin_memory())
            except Exception as e:  # noqa: BLE001 - what the pin-memory thread would die of
                errors.append(e)
                return
    t = threading.Thread(target=pin, daemon=True)
    t.start()
    while not kept and not errors:
        time.sleep(0.001)
    try:
        layer(x).square().mean().backward()  # the first call warms up and captures
        torch.cuda.synchronize()
    finally:
        stop.set()
        t.join()
    return errors, len(kept), cuda_graph.graphed_shapes(layer)


def test_capture_while_another_thread_pins_memory(monkeypatch):
    """A capture must not make another thread's pinned-memory allocation fail (the DataLoader's pin-memory thread
    died of it in `yolo train`), and must itself succeed. Under torch's default capture mode ("global") the same
    run goes wrong (the thread's allocation or the capture fails): checked too, so that the test shows it overlaps
    a capture with the thread's allocations."""
    errors, n, shapes = _capture_while_pinning(monkeypatch, cuda_graph.CAPTURE_MODE)
    assert n > 0 and not errors, errors[:1]
    assert shapes == [(4, 64, 20, 20)]
    errors_global, n_global, shapes_global = _capture_while_pinning(monkeypatch, "global")
    assert errors_global or not shapes_global, \
        f"under 'global' the thread made {n_global} pinned allocations and the capture succeeded: no overlap"


def test_replay_under_ddp(monkeypatch, tmp_path):
    """DistributedDataParallel (one rank, NCCL) around a block: the reducer's hooks on the parameters fire from the
    replay's backward and the gradients equal eager training without DDP."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("nccl", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        block = C2fBiMamba(64, 64, n=2).cuda().train()
        ref = copy.deepcopy(block)
        ddp = DDP(block, device_ids=[torch.cuda.current_device()], find_unused_parameters=True)
        xs = inputs(4, (4, 64, 12, 10))
        out, grads, _, graphed = train(ddp, xs, "bf16", True, monkeypatch)
        out_r, grads_r, _, _ = train(ref, [x.detach().clone().requires_grad_() for x in xs], "bf16", False, monkeypatch)
        assert all(len(s) == 1 for s in graphed), graphed
        for a, b in zip(out, out_r):
            assert rel(a, b) <= TOL["bf16"]
        for gs, gs_r in zip(grads, grads_r):
            for a, b in zip(gs, gs_r):
                assert torch.isfinite(a).all() and rel(a, b) <= TOL["bf16"]
    finally:
        dist.destroy_process_group()


def test_failed_capture_leaves_the_layer_eager_and_random_ops_working(monkeypatch, caplog):
    monkeypatch.setenv("YOLO_BIMAMBA_CUDA_GRAPHS", "1")
    torch.manual_seed(0)
    layer = BiMambaLayer2D(32).cuda().train()
    eager = layer._forward

    def breaks_captures(x):
        if torch.cuda.is_current_stream_capturing():
            torch.cuda.synchronize()  # not allowed while a stream captures: the capture fails
        return eager(x)

    monkeypatch.setattr(layer, "_forward", breaks_captures)
    x = torch.randn(2, 32, 5, 6, device="cuda")
    with caplog.at_level("WARNING", logger="yolo_bimamba"):
        y = layer(x)
    assert "capture of BiMambaLayer2D failed" in caplog.text
    assert cuda_graph.graphed_shapes(layer) == []
    assert torch.equal(y, eager(x))
    y.sum().backward()
    # torch leaves the random generator in its capturing state after a failed capture; run() must end that state
    r = torch.rand(1000, device="cuda")
    assert torch.isfinite(r).all() and 0.4 < float(r.mean()) < 0.6
    assert torch.equal(layer(x), eager(x))  # stays eager, no second capture


def test_drop_path_draws_a_new_mask_on_every_replay(monkeypatch):
    monkeypatch.setenv("YOLO_BIMAMBA_CUDA_GRAPHS", "1")
    torch.manual_seed(0)
    layer = BiMambaLayer2D(32, drop_path=0.5).cuda().train()
    x = torch.randn(16, 32, 6, 6, device="cuda", requires_grad=True)
    kept = []
    for _ in range(6):
        y = layer(x)
        y.sum().backward()
        kept.append(tuple(bool(v) for v in ((y - x).flatten(1).abs().amax(1) > 0).tolist()))
    assert cuda_graph.graphed_shapes(layer) == [(16, 32, 6, 6)]
    # each sample's branch is dropped with probability 0.5: a frozen mask would repeat the same pattern
    assert len(set(kept[2:])) > 1, kept
    assert all(0 < sum(k) < 16 for k in kept), kept


def test_replay_matches_eager_hydra_rowcol_and_two_shapes(monkeypatch):
    compare(C2fHydra, "bf16", monkeypatch, shapes=((4, 64, 12, 10), (3, 64, 7, 9)), scan="rowcol")


def test_second_call_before_backward_runs_eagerly(monkeypatch):
    compare(C2fBiMamba, "fp32", monkeypatch, twice=True)


def test_hooks_frozen_parameters_and_eval_stay_eager(monkeypatch):
    monkeypatch.setenv("YOLO_BIMAMBA_CUDA_GRAPHS", "1")
    x = torch.randn(2, 32, 6, 6, device="cuda", requires_grad=True)
    hooked = BiMambaLayer2D(32).cuda().train()
    hooked.mixer.register_forward_hook(lambda m, i, o: None)
    hooked(x).sum().backward()
    frozen = BiMambaLayer2D(32).cuda().train()
    frozen.norm.weight.requires_grad_(False)
    frozen(x).sum().backward()
    evaluated = BiMambaLayer2D(32).cuda().eval()
    evaluated(x).sum().backward()
    graphed = BiMambaLayer2D(32).cuda().train()
    graphed(x).sum().backward()
    assert [cuda_graph.graphed_shapes(m) for m in (hooked, frozen, evaluated, graphed)] == [[], [], [], [(2, 32, 6, 6)]]


def test_more_shapes_than_kept_run_eagerly(monkeypatch):
    monkeypatch.setenv("YOLO_BIMAMBA_CUDA_GRAPHS", "1")
    layer = BiMambaLayer2D(32).cuda().train()
    ref = copy.deepcopy(layer)
    for w in range(3, 4 + cuda_graph.MAX_SHAPES):
        x = torch.randn(2, 32, 5, w, device="cuda")
        y = layer(x)
        monkeypatch.setenv("YOLO_BIMAMBA_CUDA_GRAPHS", "0")
        assert rel(y, ref(x)) <= 1e-6
        monkeypatch.setenv("YOLO_BIMAMBA_CUDA_GRAPHS", "1")
    assert len(cuda_graph.graphed_shapes(layer)) == cuda_graph.MAX_SHAPES
