"""The public op: bidirectional (Bi-Mamba2 / Hydra) structured state-space duality scan."""
from __future__ import annotations

import functools
import os

import torch

from .torch_backend import bi_ssd_torch
from ..backend_choice import graph_tracing, triton_usable
from .validate import triton_dims_supported, validate_bi_ssd


def auto_picks_triton(headdim: int, dstate: int, dtype: torch.dtype) -> bool:
    """backend="auto" on CUDA tensors: the Triton kernels unless a graph is traced or exported (TorchScript, ONNX,
    torch.export, torch.compile), Triton is missing, or the sizes are beyond what the kernels take (then the PyTorch
    op, which takes any size)."""
    return triton_usable("yolo_bimamba.ops.bi_ssd.autograd") and triton_dims_supported(headdim, dstate, dtype)


# The mixers (BiMamba2, Hydra) run the Triton kernels in bf16 when their inputs are fp16 (fp16 AMP, Ultralytics'
# default amp=True) on a GPU with bf16 tensor cores: the kernels' fp16 path needs tf32x3 state dots and fp32 buffers and
# takes 1.5-1.8x the GPU time of the bf16 path (benchmarks/results/README.md). "fp16" keeps fp16 scans.
FP16_SCAN = os.environ.get("YOLO_BIMAMBA_FP16_SCAN", "bf16").strip().lower()
if FP16_SCAN not in ("bf16", "fp16"):
    raise ValueError(f"YOLO_BIMAMBA_FP16_SCAN must be 'bf16' or 'fp16', got {FP16_SCAN!r}")


@functools.lru_cache(maxsize=None)
def _has_bf16_tensor_cores(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 8


def mixer_scan_dtype(x: torch.Tensor, headdim: int, dstate: int, backend: str = "auto") -> torch.dtype:
    """The dtype in which a mixer runs the scan of its inputs x (see FP16_SCAN): x's own, except fp16 CUDA inputs
    that the Triton kernels would take, on a GPU with bf16 tensor cores: bf16 (the same exponent range as fp32, so
    an fp16 value or loss-scaled gradient never overflows there; 8 instead of 11 significant bits, as in bf16 AMP).
    Never while a graph is traced or exported (the scan then runs the PyTorch op, in x's dtype)."""
    if x.dtype is not torch.float16 or not x.is_cuda or FP16_SCAN != "bf16" or backend == "torch" or graph_tracing():
        return x.dtype
    dev = x.device.index if x.device.index is not None else torch.cuda.current_device()
    if not _has_bf16_tensor_cores(dev):
        return x.dtype
    if backend == "auto" and not auto_picks_triton(headdim, dstate, torch.bfloat16):
        return x.dtype
    return torch.bfloat16


def bi_ssd(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    chunk_size: int = 64,
    D: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    direction: str = "both",
    shift: bool = False,
    dt_bwd: torch.Tensor | None = None,
    B_bwd: torch.Tensor | None = None,
    C_bwd: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Bidirectional SSD: ``y = SS(x) + flip(SS(flip(x))) + D * x``.

    Shapes: x (b, l, h, p); dt (b, l, h); A (h,); B, C (b, l, g, n) with g dividing h;
    D (h,) or (h, p); dt_bias (h,). Returns y shaped like x, in x's dtype.

    dt is shifted by dt_bias, passed through softplus when ``dt_softplus``, then clamped to
    ``dt_limit`` (default [0, inf): negative step sizes are zeroed). A is clamped to <= 0, so
    every decay exp(dt * A) lies in [0, 1]. With a_k = exp(dt_k A):

    * forward:  M_f[t, s] = (C_t . B_s) dt_s prod_{k=s+1..t} a_k, s <= t
    * backward: M_b[t, s] = (C_t . B_s) dt_s prod_{k=t..s-1} a_k, s >= t
    * ``direction`` picks "both" (default), "forward" (Mamba2's causal SSD) or "backward".
    * ``shift=True`` (Hydra): each direction's output moves one step away from the diagonal,
      and the backward direction may have its own ``dt_bwd``, ``B_bwd``, ``C_bwd``.

    ``backend``: "torch" (chunked PyTorch, any device, exportable), "triton" (fused kernels),
    or "auto" (Triton on CUDA tensors when available and the sizes fit the kernels, see
    validate.triton_dims_supported; PyTorch otherwise).
    """
    shape = validate_bi_ssd(
        x, dt, A, B, C, chunk_size=chunk_size, D=D, dt_bias=dt_bias, dt_limit=dt_limit,
        direction=direction, shift=shift, dt_bwd=dt_bwd, B_bwd=B_bwd, C_bwd=C_bwd, backend=backend,
    )
    use_triton = backend == "triton" or (
        backend == "auto" and x.is_cuda and auto_picks_triton(shape.headdim, shape.dstate, x.dtype)
    )
    kwargs = dict(
        chunk_size=chunk_size, D=D, dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=dt_limit,
        direction=direction, shift=shift, dt_bwd=dt_bwd, B_bwd=B_bwd, C_bwd=C_bwd,
    )
    if use_triton:
        from .autograd import bi_ssd_triton

        return bi_ssd_triton(x, dt, A, B, C, validate=False, **kwargs)  # validated above
    return bi_ssd_torch(x, dt, A, B, C, **kwargs)
