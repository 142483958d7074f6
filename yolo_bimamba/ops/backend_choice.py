"""What the Triton-backed ops (ops.bi_ssd, ops.dwconv, ops.gated_norm) share: forcing one of a kernel's configs
(tests), the decision whether a call launches Triton kernels, the kernels' arithmetic type, and the allocator of
their output buffers with its NaN-poisoning test hook."""
from __future__ import annotations

import contextlib
import math
import os

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


def triton_usable(kernels_module: str, env_var: str | None = None) -> bool:
    """"auto" may run the kernels: not switched off by ``env_var=0`` (when the op has such a switch), no graph being
    traced or exported, and the kernel module (hence Triton) imports."""
    if (env_var is not None and os.environ.get(env_var, "1") == "0") or graph_tracing():
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


def compute_dtype(dtype: torch.dtype):
    """The kernels' arithmetic type: fp64 for fp64 inputs (tests against float64), else fp32."""
    import triton.language as tl

    return tl.float64 if dtype == torch.float64 else tl.float32


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """compute_dtype as a torch dtype: that of the kernels' fp32 (fp64 for fp64 inputs) buffers and statistics."""
    return torch.float64 if dtype == torch.float64 else torch.float32


# test hook: allocate every output / gradient buffer filled with NaN so unwritten elements show
_POISON = os.environ.get("YOLO_BIMAMBA_POISON", "0") not in ("", "0")


@contextlib.contextmanager
def poison_outputs(enabled: bool = True):
    """Test hook: fill every output and gradient buffer with NaN before the kernels run."""
    global _POISON
    old = _POISON
    _POISON = enabled
    try:
        yield
    finally:
        _POISON = old


_GUARD = 64  # NaN elements before and after each poisoned buffer
_guarded: list = []


def alloc(shape, dtype, device):
    """An output or gradient buffer of a kernel (torch.empty; NaN-filled inside guard regions under poison_outputs)."""
    if _POISON:
        numel = math.prod(shape)
        buf = torch.full((numel + 2 * _GUARD,), float("nan"), dtype=dtype, device=device)
        _guarded.append((buf, numel))
        return buf[_GUARD:_GUARD + numel].view(shape)
    return torch.empty(shape, dtype=dtype, device=device)


def check_guards() -> bool:
    """Test hook: True when the NaN guard regions around every poisoned buffer allocated since the
    last call are intact (no kernel wrote outside its outputs). Forgets those buffers."""
    ok = True
    for buf, numel in _guarded:
        ok = ok and bool(torch.isnan(buf[:_GUARD]).all()) and bool(torch.isnan(buf[_GUARD + numel:]).all())
    _guarded.clear()
    return ok
