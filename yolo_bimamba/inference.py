"""Whole-model CUDA-graph replay for inference at fixed input shapes (opt-in).

At small batches a detector's eager forward on a fast GPU is bound by host time: every layer, and every kernel of a
BiMamba2 block, costs Python and launch time while the GPU waits. For a stream of inputs of one shape,
:func:`graph_inference` captures the model's whole eval forward once per input shape (``torch.cuda.CUDAGraph``) and
then replays it: one launch per call, the same kernels on the same buffers, so the same outputs as the eager model.

    from ultralytics import YOLO
    from yolo_bimamba import graph_inference

    model = YOLO("best.pt")
    with graph_inference(model):             # or graph_inference(model.model), any nn.Module
        results = model.predict(frames, imgsz=640, half=True)

Inside the block the model's ``forward`` replays a graph when that is safe and runs eagerly otherwise:
- not CUDA, the model in training mode, gradients enabled, keyword arguments that ask for more than the plain
  prediction (``augment``, ``visualize``, ``embed``), inside a trace, an export, ``torch.compile`` or another capture,
  or a module hook;
- more than ``max_shapes`` input shapes seen (each shape is one capture), or a capture that failed (one warning).
Parameters are read in place, but a parameter that is moved, cast or replaced (``fuse()``, ``half()``, ``to()``)
makes a new key and a new capture. Outputs are copies: nothing the caller keeps is overwritten by the next replay.
Leaving the block removes the override and frees the graphs; nothing is left on the model (it pickles as before).
"""
from __future__ import annotations

import contextlib
import logging

import torch
from torch import nn
from torch.utils import _pytree as pytree

from .nn.cuda_graph import capture, end_stuck_capture, hooked
from .ops.backend_choice import compiling, graph_tracing

__all__ = ["graph_inference", "GraphedForward"]

_LOG = logging.getLogger("yolo_bimamba")
WARMUP = 2  # eager runs before a capture: Triton kernels compile and autotune there, lazy state (anchors) is built


def _plain_call(args, kwargs) -> bool:
    """Whether the call asks for the plain prediction only (Ultralytics' predict/val pass these keys as falsy)."""
    return not args and set(kwargs) <= {"augment", "visualize", "embed"} and not any(kwargs.values())


class _Graph:
    """One captured eval forward: a static input buffer, the graph, its static outputs."""

    def __init__(self, forward, x: torch.Tensor, pool):
        self.x = x.clone()
        side = torch.cuda.Stream(device=x.device)
        side.wait_stream(torch.cuda.current_stream(x.device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP):
                forward(self.x)
        torch.cuda.synchronize(x.device)
        self.graph = torch.cuda.CUDAGraph()
        with capture(self.graph, pool=pool, stream=side):
            out = forward(self.x)
        self.flat, self.spec = pytree.tree_flatten(out)
        torch.cuda.synchronize(x.device)

    def __call__(self, x: torch.Tensor):
        self.x.copy_(x)
        self.graph.replay()
        return pytree.tree_unflatten([t.clone() if isinstance(t, torch.Tensor) else t for t in self.flat], self.spec)


class GraphedForward:
    """The forward that :func:`graph_inference` installs on a module: a graph replay where safe, else the eager one."""

    def __init__(self, module: nn.Module, max_shapes: int = 4):
        self.module, self.eager, self.max_shapes = module, module.forward, max_shapes
        self.graphs: dict = {}
        self.failed = False
        self.pool = None

    def _usable(self, x, args, kwargs) -> bool:
        return (isinstance(x, torch.Tensor) and x.is_cuda and not self.module.training and not torch.is_grad_enabled()
                and not self.failed and _plain_call(args, kwargs) and not graph_tracing()
                and not compiling()
                and not torch.cuda.is_current_stream_capturing() and not hooked(self.module))

    def __call__(self, x, *args, **kwargs):
        if not self._usable(x, args, kwargs):
            return self.eager(x, *args, **kwargs)
        params = [*self.module.parameters(), *self.module.buffers()]
        key = (tuple(x.shape), x.stride(), x.dtype, x.device, torch.is_inference_mode_enabled(),
               tuple((p.data_ptr(), p.dtype, p.shape) for p in params))
        g = self.graphs.get(key)
        if g is None:
            if len(self.graphs) >= self.max_shapes:
                return self.eager(x)
            try:
                self.pool = self.pool or torch.cuda.graph_pool_handle()
                g = _Graph(self.eager, x, self.pool)
            except Exception as e:  # noqa: BLE001 - a failed capture leaves the model eager; it must not stop inference
                self.failed = True
                with contextlib.suppress(Exception):
                    torch.cuda.synchronize(x.device)
                    end_stuck_capture(x.device)
                _LOG.warning(f"yolo_bimamba: CUDA-graph capture of the model failed ({type(e).__name__}: {e}); "
                             "inference runs eagerly")
                return self.eager(x)
            self.graphs[key] = g
        return g(x)


@contextlib.contextmanager
def graph_inference(model, max_shapes: int = 4):
    """Within the block, ``model`` (an Ultralytics ``YOLO`` or any ``nn.Module``) replays CUDA graphs of its eval
    forward, one per input shape (module docstring). Yields the installed :class:`GraphedForward`."""
    inner = getattr(model, "model", None)
    # an Ultralytics ``YOLO`` is an nn.Module too, but predict/val call the detection model it holds as ``.model``
    module = inner if isinstance(inner, nn.Module) and hasattr(model, "predictor") else model
    if not isinstance(module, nn.Module):
        raise TypeError(f"graph_inference: model must be an nn.Module or an Ultralytics YOLO, got {type(model).__name__}")
    if "forward" in vars(module):
        raise RuntimeError("graph_inference: the module's forward is already overridden (nested graph_inference?)")
    fwd = GraphedForward(module, max_shapes)
    module.forward = fwd
    try:
        yield fwd
    finally:
        del module.forward
        fwd.graphs.clear()
