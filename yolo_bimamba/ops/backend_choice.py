"""How the ops (ops.bi_ssd, ops.dwconv, ops.gated_norm, ops.layer_norm) choose their backend: whether a graph is being
traced or exported, whether the Triton kernels may run for a call, and forcing one of a kernel's configs (tests)."""
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
    """True while a graph is being traced or exported (TorchScript, the ONNX exporters, torch.export, torch.compile):
    then the modules take their PyTorch expressions, which every exporter understands."""
    if torch.jit.is_tracing() or torch.jit.is_scripting() or torch.onnx.is_in_onnx_export():
        return True
    compiler = getattr(torch, "compiler", None)
    return bool(compiler is not None and any(getattr(compiler, f, lambda: False)()
                                             for f in ("is_compiling", "is_exporting")))


def triton_usable(kernels_module: str, switch=None) -> bool:
    """"auto" may run the kernels: not switched off (``switch``: the op's config function, e.g. config.fused_conv,
    when the op has such a switch), no graph being traced or exported, and the kernel module (hence Triton) imports."""
    if (switch is not None and not switch()) or graph_tracing():
        return False
    try:
        import importlib

        importlib.import_module(kernels_module)
    except Exception:  # noqa: BLE001 - no Triton, or it failed to import
        return False
    return True


def runs_triton(op: str, backend: str, t: torch.Tensor, usable) -> bool:
    """Whether a call of ``op`` with ``backend`` ("auto", "torch" or "triton", else ValueError) on tensor ``t`` runs
    the kernels: "triton" always, "auto" on CUDA tensors when ``usable()`` (the op's :func:`triton_usable` check)."""
    if backend not in ("auto", "torch", "triton"):
        raise ValueError(f"{op}: backend must be 'auto', 'torch' or 'triton', got {backend!r}")
    return backend == "triton" or (backend == "auto" and t.is_cuda and usable())
