"""CUDA-graph replay of a layer's forward and backward in training.

A detection model's training step is host-bound on a fast GPU: one BiMamba layer launches about 70 kernels (forward
and backward), each costing Python and launch time on the host while the GPU waits. In training the layer's input
shape is fixed from step to step, so :func:`run` captures the layer's forward and its backward once per input shape
(``torch.cuda.CUDAGraph``) and then replays the two graphs: two launches instead of about seventy.

What a replay computes is what the eager layer computes: the same kernels on the same buffers (the parameters are
read in place, so optimizer updates are seen). The captured backward differentiates with respect to stand-ins of the
parameters (new leaves on the same storage), so that the parameters' own autograd nodes (held by DDP, or by the
caller's previous step) never take part in a capture. Each call copies its input into the graph's input buffer and returns
copies of the output and the gradients, so nothing the caller keeps (``.grad`` accumulation over several steps, the
output) aliases a buffer that the next replay overwrites.

The eager layer is used instead whenever a replay could differ from it or could not be captured:
- not CUDA, not training, gradients off, or inside another capture or a traced or exported graph (``torch.jit``,
  ONNX export: ops.backend_choice.graph_tracing; ``torch.compile``, ``torch.export``: backend_choice.compiling);
- any module hook on the layer or global module hook (they may run host code, e.g. ``nan_debug``'s checks);
- a parameter that does not require a gradient (frozen layers);
- the previous replay of the same graph still waits for its backward (the layer called twice in one step): a second
  replay would overwrite the activations that backward reads;
- more than ``MAX_SHAPES`` input shapes seen (multi-scale training), or a capture that failed (the layer then stays
  eager, with one warning).
``YOLO_BIMAMBA_CUDA_GRAPHS=0`` turns replay off everywhere.

Inference (:func:`run_eval`; ``YOLO_BIMAMBA_EVAL_GRAPHS=0`` turns it off; tests/gpu/test_eval_graph.py compares it with
the eager layer): with gradients off and the layer in eval mode, an input of at most
``YOLO_BIMAMBA_EVAL_GRAPH_MAX_NUMEL`` elements (``config.eval_graph_max_numel``; 2^20 by default: batch 1 to 10 at 640
px for a 256-channel P5 layer) replays a captured forward graph: an input copy, the replay and an output copy instead of
about 18 launches and their Python (0.9 ms of host time per layer at batch 1 on an H100, against 0.07 ms of GPU time).
Larger inputs run eagerly, so that the graphs' memory stays small, though host time still shows there (batch 32 at 640
px: docs/design.md). The same exclusions hold (hooks, traced or compiled graphs, another capture, replay off), and a
layer keeps at most ``MAX_SHAPES`` graphs, the least recently used dropped first. An input key is captured the second
time it comes (the first call runs eagerly), so inputs whose shape changes on every call (``yolo val`` with rectangular
batches, a folder of images of many aspect ratios) run eagerly and pay for no capture.
"""
from __future__ import annotations

import contextlib
import logging
import weakref
from collections import OrderedDict

import torch
from torch import nn

from .. import config
from ..ops.backend_choice import compiling, graph_tracing

__all__ = ["run", "may_replay", "run_eval", "may_replay_eval", "enabled", "graphed_shapes", "eval_graphed_shapes",
           "summary", "capture", "end_stuck_capture", "hooked", "MAX_SHAPES", "EVAL_MAX_SEEN"]

MAX_SHAPES = 4  # input shapes per layer kept as graphs (training uses one or two: full batches and the last one)
EVAL_MAX_SEEN = 16  # inference keys seen once that a layer remembers (the least recent forgotten first)
WARMUP = 2  # eager fwd+bwd runs before a capture: the Triton kernels compile and autotune there, not in the capture
# Only the capturing thread's unsafe CUDA calls are refused while a layer is captured. Under torch's default ("global")
# every thread's are: a DataLoader's pin-memory thread that allocates pinned host memory during a capture then dies
# with "operation not permitted when stream is capturing" and takes `yolo train` down with it (workers and pin_memory
# on, as Ultralytics trains).
CAPTURE_MODE = "thread_local"

_LOG = logging.getLogger("yolo_bimamba")
_graphs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # layer -> {key: _Graphs}, or None (stay eager)
_eval_graphs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # layer -> OrderedDict{key: _EvalGraph | _SEEN} or None
_NO_TABLE = object()  # (a layer without graphs yet)
_SEEN = object()  # (an inference key seen once: captured when it comes again)


def enabled() -> bool:
    return config.cuda_graphs()


def graphed_shapes(layer: nn.Module) -> list:
    """Input shapes the layer has graphs for (for tests and logs)."""
    return [k[0] for k in (_graphs.get(layer) or {})]


def summary(model: nn.Module, kind: type) -> str:
    """One line on how the ``kind`` layers of ``model`` ran in CUDA training so far: how many replay graphs, how
    many stay eager after a failed capture, how many never captured (e.g. hooks, frozen parameters, CPU)."""
    layers = [m for m in model.modules() if isinstance(m, kind)]
    graphed = [m for m in layers if _graphs.get(m)]
    failed = sum(1 for m in layers if m in _graphs and _graphs[m] is None)
    shapes = sorted({k[0] for m in graphed for k in _graphs[m]})
    state = "on" if enabled() else "off (YOLO_BIMAMBA_CUDA_GRAPHS=0)"
    return (f"CUDA-graph replay {state}: {len(graphed)} of {len(layers)} {kind.__name__} layers replay graphs "
            f"({len(shapes)} input shapes), {failed} eager after a failed capture, "
            f"{len(layers) - len(graphed) - failed} eager")


def hooked(layer: nn.Module) -> bool:
    from torch.nn.modules import module as m

    if m._global_forward_hooks or m._global_forward_pre_hooks or m._global_backward_hooks \
            or getattr(m, "_global_backward_pre_hooks", None):
        return True
    return any(s._forward_hooks or s._forward_pre_hooks or s._backward_hooks or getattr(s, "_backward_pre_hooks", None)
               for s in layer.modules())


def may_replay(layer: nn.Module, x: torch.Tensor) -> bool:
    """The cheap part of the test whether :func:`run` may replay a graph: CUDA training with replay on. Layers call
    the eager forward themselves where it fails (inference, CPU, no gradients)."""
    return x.is_cuda and layer.training and torch.is_grad_enabled() and not compiling() and enabled()


def _usable(layer: nn.Module, x: torch.Tensor, params) -> bool:
    if not may_replay(layer, x):
        return False
    if graph_tracing() or torch.cuda.is_current_stream_capturing():
        return False
    if not params or not all(p.requires_grad and p.device == x.device for p in params):
        return False
    return not hooked(layer)


@contextlib.contextmanager
def _standing_in(layer: nn.Module, params, stand_ins):
    """Within the block, every module of ``layer`` holds the stand-in of each of its parameters."""
    by_id = {id(p): q for p, q in zip(params, stand_ins)}
    slots = [(m, name, p) for m in layer.modules() for name, p in m._parameters.items() if p is not None]
    try:
        for m, name, p in slots:
            m._parameters[name] = by_id[id(p)]
        yield
    finally:
        for m, name, p in slots:
            m._parameters[name] = p


def capture(graph, **kwargs):
    """``torch.cuda.graph`` in this module's capture mode: every capture of a layer goes through here."""
    return torch.cuda.graph(graph, capture_error_mode=CAPTURE_MODE, **kwargs)


def end_stuck_capture(dev) -> None:
    """After a failed capture: torch leaves the device's default random generator in its capturing state when a
    capture ends in an error (every later random op on the device then raises "Offset increment outside graph
    capture"). A small capture that succeeds ends that state."""
    a = torch.zeros(1, device=dev)
    g = torch.cuda.CUDAGraph()
    with capture(g, stream=torch.cuda.Stream(device=dev)):
        a.add_(1.0)


def _caller_autocast() -> dict:
    """The caller's CUDA autocast state, for the warm-up and capture (casts inside the graph, not cached)."""
    return dict(device_type="cuda", enabled=torch.is_autocast_enabled("cuda"), dtype=torch.get_autocast_dtype("cuda"),
                cache_enabled=False)


class _Token:  # lives as long as the autograd node of one replay
    pass


class _Graphs:
    def __init__(self, layer, forward, x, params):
        dev = x.device
        self.x = x.detach().clone().requires_grad_(x.requires_grad)
        # the graphs differentiate with respect to stand-ins of the parameters: new leaves on the same storage (so
        # replays read the parameters in place). The parameters' own AccumulateGrad nodes may be alive, made on the
        # default stream (by an earlier step's graph that the caller still holds, or by DDP, which keeps them): a
        # capture on the side stream that reached them would have to wait on the default stream, which invalidates it
        self.stand_ins = [nn.Parameter(p.detach(), requires_grad=True) for p in params]
        inputs = ([self.x] if x.requires_grad else []) + self.stand_ins
        self.x_has_grad = x.requires_grad
        amp = _caller_autocast()
        side = torch.cuda.Stream(device=dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with _standing_in(layer, params, self.stand_ins):
            with torch.cuda.stream(side), torch.autocast(**amp):
                for _ in range(WARMUP):
                    out = forward(self.x)
                    torch.autograd.grad(out, inputs, torch.zeros_like(out), allow_unused=True)
                del out
            torch.cuda.synchronize(dev)
            pool = torch.cuda.graph_pool_handle()
            self.fwd, self.bwd = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
            with torch.autocast(**amp):
                with capture(self.fwd, pool=pool, stream=side):
                    self.out = forward(self.x)
                self.gout = torch.empty_like(self.out)
                with capture(self.bwd, pool=pool, stream=side):
                    grads = torch.autograd.grad(self.out, inputs, self.gout, allow_unused=True)
        self.used = [gr is not None for gr in grads]  # an input the output does not depend on gets None
        self.grads = [gr for gr in grads if gr is not None]
        # drop the captured autograd graph: replays do not need it, and its AccumulateGrad nodes were made on the
        # capture stream
        self.out = self.out.detach()
        torch.cuda.synchronize(dev)
        self.live = None  # weakref to the _Token of the replay whose backward is still to come

    def pending(self) -> bool:
        return self.live is not None and self.live() is not None


class _Replay(torch.autograd.Function):
    @staticmethod
    def forward(ctx, g: _Graphs, x, *params):
        if g.x.data_ptr() != x.data_ptr():
            g.x.copy_(x)
        g.fwd.replay()
        ctx.g, ctx.token = g, _Token()
        g.live = weakref.ref(ctx.token)
        return g.out.clone()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gout):
        g = ctx.g
        g.gout.copy_(gout)
        g.bwd.replay()
        g.live = None
        copies = iter(torch._foreach_mul(g.grads, 1.0))  # one fused launch per dtype; .grad may keep them
        grads = [next(copies) if used else None for used in g.used]
        dx = grads.pop(0) if g.x_has_grad else None
        return (None, dx, *grads)


def _capture_failed(layer: nn.Module, x: torch.Tensor, e: Exception, where: str) -> None:
    """After a failed capture (the caller marks the layer eager): reset the device's random generator, say so."""
    try:
        torch.cuda.synchronize(x.device)
        end_stuck_capture(x.device)
    except Exception as e2:  # noqa: BLE001
        _LOG.warning(f"yolo_bimamba: could not reset the CUDA random generator after that ({e2})")
    _LOG.warning(f"yolo_bimamba: CUDA-graph capture of {type(layer).__name__}{where} failed ({type(e).__name__}: {e});"
                 f" this layer runs eagerly{where}")


def _replay_key(x: torch.Tensor, params, mode) -> tuple:
    """What a captured graph is valid for: the input's shape, strides, dtype and device, ``mode`` (the path's own
    state), the caller's autocast state, and each parameter's address, dtype and shape (the graphs read the parameters
    in place: a parameter moved or replaced by to(), half() or a new tensor gives another key, and a new capture)."""
    return (tuple(x.shape), x.stride(), x.dtype, x.device, mode, torch.is_autocast_enabled("cuda"),
            torch.get_autocast_dtype("cuda"), tuple((p.data_ptr(), p.dtype, p.shape) for p in params))


def run(layer: nn.Module, forward, x: torch.Tensor) -> torch.Tensor:
    """``forward(x)`` of ``layer``, as a graph replay where that is safe (module docstring), else eagerly."""
    params = tuple(layer.parameters())
    if not _usable(layer, x, params):
        return forward(x)
    table = _graphs.get(layer, {})
    if table is None:
        return forward(x)
    key = _replay_key(x, params, x.requires_grad)
    g = table.get(key)
    if g is None:
        if len(table) >= MAX_SHAPES:
            return forward(x)
        try:
            g = _Graphs(layer, forward, x, params)
        except Exception as e:  # noqa: BLE001 - any capture failure leaves this layer eager, it must not stop training
            _graphs[layer] = None
            _capture_failed(layer, x, e, "")
            return forward(x)
        table[key] = g
        _graphs[layer] = table
    if g.pending():
        return forward(x)
    return _Replay.apply(g, x, *params)


# ------------------------------------------------------------------------------------------------------ inference
def may_replay_eval(layer: nn.Module, x: torch.Tensor) -> bool:
    """The cheap part of the test whether :func:`run_eval` may replay: CUDA inference (eval mode, gradients off) of
    an input of at most ``config.eval_graph_max_numel()`` elements, inference replay not switched off (by
    ``YOLO_BIMAMBA_EVAL_GRAPHS=0`` or ``YOLO_BIMAMBA_CUDA_GRAPHS=0``)."""
    return (x.is_cuda and not layer.training and not torch.is_grad_enabled()
            and x.numel() <= config.eval_graph_max_numel() and not compiling() and config.eval_graphs())


class _EvalGraph:
    """The layer's forward captured for one input key: a static input, the graph, its static output."""

    def __init__(self, forward, x):
        dev = x.device
        self.x = x.clone()
        amp = _caller_autocast()
        side = torch.cuda.Stream(device=dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side), torch.autocast(**amp):
            for _ in range(WARMUP):  # the kernels compile and autotune here, not in the capture
                forward(self.x)
        torch.cuda.synchronize(dev)
        self.graph = torch.cuda.CUDAGraph()
        with torch.autocast(**amp), capture(self.graph, stream=side):
            self.out = forward(self.x)
        torch.cuda.synchronize(dev)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.x.copy_(x)
        self.graph.replay()
        return self.out.clone()  # the caller may keep it past the next replay


def run_eval(layer: nn.Module, forward, x: torch.Tensor) -> torch.Tensor:
    """``forward(x)`` of ``layer`` in inference, as a graph replay where that is safe (module docstring), else
    eagerly. The caller has checked :func:`may_replay_eval`."""
    if graph_tracing() or torch.cuda.is_current_stream_capturing() or hooked(layer):
        return forward(x)
    table = _eval_graphs.get(layer, _NO_TABLE)
    if table is None:
        return forward(x)
    if table is _NO_TABLE:
        table = OrderedDict()
        _eval_graphs[layer] = table
    # inference-mode tensors are kept apart from others (an inference tensor takes no copy outside inference mode)
    key = _replay_key(x, tuple(layer.parameters()), torch.is_inference_mode_enabled())
    g = table.get(key)
    if g is None:  # a key seen once runs eagerly: inputs whose shape keeps changing never pay for a capture
        table[key] = _SEEN
        _trim(table)
        return forward(x)
    if g is _SEEN:
        try:
            g = _EvalGraph(forward, x)
        except Exception as e:  # noqa: BLE001 - a capture failure leaves this layer eager, it must not stop inference
            _eval_graphs[layer] = None
            _capture_failed(layer, x, e, " in inference")
            return forward(x)
        table[key] = g
        table.move_to_end(key)
        _trim(table)
    else:
        table.move_to_end(key)
    return g(x)


def _trim(table: OrderedDict):
    """Drop the least recently used graphs beyond MAX_SHAPES and keys seen once beyond EVAL_MAX_SEEN."""
    graphs = [k for k, v in table.items() if v is not _SEEN]
    seen = [k for k, v in table.items() if v is _SEEN]
    for k in graphs[:max(0, len(graphs) - MAX_SHAPES)] + seen[:max(0, len(seen) - EVAL_MAX_SEEN)]:
        del table[k]


def eval_graphed_shapes(layer: nn.Module) -> list:
    """Input shapes the layer has inference graphs for (tests)."""
    return [k[0] for k, v in (_eval_graphs.get(layer) or {}).items() if v is not _SEEN]
