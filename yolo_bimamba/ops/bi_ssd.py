"""The public op: bidirectional (Bi-Mamba2 / Hydra) structured state-space duality scan."""
from __future__ import annotations

import torch

from .chunked import bi_ssd_torch
from .fused_switch import triton_usable
from .validate import triton_dims_supported, validate_bi_ssd


def auto_picks_triton(headdim: int, dstate: int, dtype: torch.dtype) -> bool:
    """backend="auto" on CUDA tensors: the Triton kernels unless a graph is traced or exported (TorchScript, ONNX,
    torch.export, torch.compile), Triton is missing, or the sizes are beyond what the kernels take (then the PyTorch
    op, which takes any size)."""
    return triton_usable("yolo_bimamba.ops.triton_op") and triton_dims_supported(headdim, dstate, dtype)


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
        from .triton_op import bi_ssd_triton

        return bi_ssd_triton(x, dt, A, B, C, validate=False, **kwargs)  # validated above
    return bi_ssd_torch(x, dt, A, B, C, **kwargs)
