"""How the ops (ops.bi_ssd, ops.dwconv, ops.gated_norm, ops.layer_norm) choose their backend: whether a graph is being
traced or exported, whether the Triton kernels may run for a call, and forcing one of a kernel's configs (tests).

Three ways a call can run: eager (the op's autograd function or PyTorch expression); inside a plain-op graph traced
for a file (TorchScript, ONNX: :func:`graph_tracing`), as PyTorch expressions only; and under torch.compile or
torch.export (:func:`compiling`), as custom ops that run the same backend as eager would."""
from __future__ import annotations

import contextlib

import torch


class ForcedConfig:
    """Index of the config every launch uses, or None (the op's own choice); ``with forced(i):`` sets it."""

    def __init__(self):
        self.index = None

    @contextlib.contextmanager
    def __call__(self, index: int | None):
        old, self.index = self.index, index
        try:
            yield
        finally:
            self.index = old


def graph_tracing() -> bool:
    """True while a graph of plain PyTorch ops is traced for a file: TorchScript (``torch.jit.trace``/``script``)
    and ONNX export (the TorchScript-based exporter that Ultralytics uses, and the dynamo-based one, which flags
    itself as an ONNX export while it runs torch.export). The modules then take their PyTorch expressions (e.g.
    nn.BiMamba2._forward_graph), so that the file runs without this package. Not under torch.compile or a plain
    ``torch.export.export``: see :func:`compiling`."""
    return torch.jit.is_tracing() or torch.jit.is_scripting() or torch.onnx.is_in_onnx_export()


def compiling() -> bool:
    """True while torch.compile (Dynamo) or ``torch.export.export`` (strict or not) traces, and no plain-op graph is
    traced for a file (:func:`graph_tracing`, which wins: the dynamo ONNX exporter runs torch.export). The ops then
    enter the graph as PyTorch custom ops (``torch.ops.yolo_bimamba.*``, ops.library and ops.bi_ssd.library), which
    run the backend their API chose (the Triton kernels on CUDA tensors): no graph break at our ops."""
    compiler = torch.compiler
    return (compiler.is_compiling() or compiler.is_exporting()) and not graph_tracing()


@torch.compiler.assume_constant_result
def _importable(module: str) -> bool:
    # (a constant for Dynamo: called once while it traces, not traced itself)
    try:
        import importlib

        importlib.import_module(module)
    except Exception:  # noqa: BLE001 - no Triton, or it failed to import
        return False
    return True


@torch.compiler.assume_constant_result
def _switched_on(switch) -> bool:
    return bool(switch())  # an environment variable, read once while Dynamo traces (a constant of the graph)


def triton_usable(kernels_module: str, switch=None) -> bool:
    """"auto" may run the kernels: not switched off (``switch``: the op's config function, e.g. config.fused_conv,
    when the op has such a switch), no plain-op graph being traced (:func:`graph_tracing`), and the kernel module
    (hence Triton) imports. Under torch.compile the switch and the import are read while Dynamo traces and are
    constants of the compiled graph."""
    if (switch is not None and not _switched_on(switch)) or graph_tracing():
        return False
    return _importable(kernels_module)


def runs_triton(op: str, backend: str, t: torch.Tensor, usable) -> bool:
    """Whether a call of ``op`` with ``backend`` ("auto", "torch" or "triton", else ValueError) on tensor ``t`` runs
    the kernels: "triton" always, "auto" on CUDA tensors when ``usable()`` (the op's :func:`triton_usable` check)."""
    if backend not in ("auto", "torch", "triton"):
        raise ValueError(f"{op}: backend must be 'auto', 'torch' or 'triton', got {backend!r}")
    return backend == "triton" or (backend == "auto" and t.is_cuda and usable())
