"""Gated RMSNorm, norm after the gate (Mamba2 / Hydra): ``rmsnorm(x * silu(z)) * weight`` over the last dim, in fp32,
written in the gate's (z's) dtype.

``gated_rmsnorm(x, z, weight, eps)`` equals :func:`gated_rmsnorm_reference` (the PyTorch expression of
``nn.RMSNormGated``). On CUDA it runs one Triton kernel forward and one backward (ops.gated_norm_kernels) instead of
about ten elementwise and reduction kernels over fp32 copies; elsewhere (CPU, TorchScript / ONNX tracing) it is the
expression. ``YOLO_BIMAMBA_FUSED_NORM=0`` turns the kernels off.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import config
from .backend_choice import ForcedConfig, compiling, runs_triton, triton_usable
from .kernel_buffers import accumulation_dtype, alloc, compute_dtype
from .launch import launch

MAX_TILE = 8192  # rows x padded channels per program


force_config = ForcedConfig()  # tests: ``with force_config(i):`` every launch uses config i of CONFIGS


def gated_rmsnorm_reference(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    ct = accumulation_dtype(x.dtype)  # fp32 at least, as the kernels
    g = x.to(ct) * F.silu(z.to(ct))
    return (g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + eps) * weight.to(ct)).to(z.dtype)


def validate_gated_rmsnorm(x, z, weight) -> None:
    if not all(isinstance(t, torch.Tensor) for t in (x, z, weight)):
        raise ValueError("gated_rmsnorm: x, z and weight must be tensors")
    if x.dim() < 1 or tuple(z.shape) != tuple(x.shape):
        raise ValueError(f"gated_rmsnorm: z must have the shape of x {tuple(x.shape)}, got {tuple(z.shape)}")
    if tuple(weight.shape) != (x.shape[-1],):
        raise ValueError(f"gated_rmsnorm: weight must have shape ({x.shape[-1]},), got {tuple(weight.shape)}")
    floats = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    for name, t in (("x", x), ("z", z), ("weight", weight)):
        if t.dtype not in floats:
            raise ValueError(f"gated_rmsnorm: {name} must be float16, bfloat16, float32 or float64, got {t.dtype}")
        if t.device != x.device:
            raise ValueError(f"gated_rmsnorm: {name} is on {t.device}, x on {x.device}")


def _triton_ok() -> bool:
    return triton_usable("yolo_bimamba.ops.gated_norm_kernels", config.fused_norm)


def gated_rmsnorm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5, *,
                  backend: str = "auto") -> torch.Tensor:
    """rmsnorm(x * silu(z)) * weight in fp32, returned in z's dtype. backend: "auto" (Triton on CUDA), "torch",
    "triton".

    z's dtype, not x's: in the mixers z is the in-projection's output (the model's activation dtype) and x the scan's
    output, which under fp16 (AMP or a half model) is bf16 (ops.bi_ssd.api.mixer_bi_ssd says why); the norm's output
    (|out| <= sqrt(d) |weight|) fits fp16 and goes on into the fp16 out-projection."""
    validate_gated_rmsnorm(x, z, weight)
    triton = runs_triton("gated_rmsnorm", backend, x, _triton_ok)
    if compiling():  # torch.compile / torch.export: the custom op (ops.library), running the backend chosen here
        return torch.ops.yolo_bimamba.gated_rmsnorm(x, z, weight, float(eps), "triton" if triton else "torch")[0]
    if not triton:
        return gated_rmsnorm_reference(x, z, weight, eps)
    return _GatedRMSNorm.apply(x, z, weight, float(eps))


def _launch_shape(D: int):
    from .gated_norm_kernels import CONFIGS, block_d

    bd = block_d(D)
    idx = force_config.index if force_config.index is not None else 0
    rows, warps = CONFIGS[idx]
    return max(1, min(rows, MAX_TILE // bd)), bd, warps


def _rows_view(t: torch.Tensor, D: int):
    """(rows, D) view with unit channel stride and one row stride, or a contiguous copy."""
    t2 = t.reshape(-1, D) if t.dim() != 2 else t
    if t2.stride(-1) != 1 or (t2.shape[0] > 1 and t2.stride(0) < D):
        t2 = t2.contiguous()
    return t2


def triton_forward(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float):
    """The forward kernel: (out shaped like x in z's dtype, rstd per row in fp32 / fp64), what the backward reads."""
    from .gated_norm_kernels import _gated_rmsnorm_fwd

    D = x.shape[-1]
    x2 = x.reshape(-1, D).contiguous()
    z2 = _rows_view(z, D)
    R = x2.shape[0]
    br, bd, nw = _launch_shape(D)
    comp = compute_dtype(x.dtype)
    out = alloc((R, D), z.dtype, x.device)
    rstd = alloc((R,), accumulation_dtype(x.dtype), x.device)
    launch(_gated_rmsnorm_fwd, (-(-R // br),), (x2, z2, weight, out, rstd, R, D, z2.stride(0), eps),
           dict(COMPUTE=comp, BLOCK_R=br, BLOCK_D=bd, num_warps=nw))
    return out.view(x.shape), rstd


def triton_backward(dout: torch.Tensor, x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor):
    """The backward kernel: (dx, dz, dweight) from dout, the forward's inputs and its rstd."""
    from .gated_norm_kernels import _gated_rmsnorm_bwd

    shape, D = x.shape, x.shape[-1]
    x2 = x.reshape(-1, D).contiguous()
    z2 = _rows_view(z, D)
    R = x2.shape[0]
    br, bd, nw = _launch_shape(D)
    nprog = -(-R // br)
    dout2 = dout.reshape(R, D).contiguous()
    dx = alloc((R, D), x2.dtype, x2.device)
    dz = alloc((R, D), z.dtype, x2.device)
    dw_part = alloc((nprog, D), rstd.dtype, x2.device)
    launch(_gated_rmsnorm_bwd, (nprog,), (x2, z2, weight, rstd, dout2, dx, dz, dw_part, R, D, z2.stride(0)),
           dict(COMPUTE=compute_dtype(x2.dtype), BLOCK_R=br, BLOCK_D=bd, num_warps=nw))
    return dx.view(shape), dz.view(shape), dw_part.sum(0).to(weight.dtype)


class _GatedRMSNorm(torch.autograd.Function):
    """The eager autograd function of the Triton backend (:func:`triton_forward`, :func:`triton_backward`)."""

    @staticmethod
    def forward(ctx, x, z, weight, eps):
        D = x.shape[-1]
        x2, z2 = x.reshape(-1, D).contiguous(), _rows_view(z, D)  # saved as the kernels read them (no second copy)
        out, rstd = triton_forward(x2, z2, weight, eps)
        ctx.save_for_backward(x2, z2, weight, rstd)
        ctx.shape = x.shape
        return out.view(x.shape)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        dx, dz, dw = triton_backward(dout, *ctx.saved_tensors)
        return dx.view(ctx.shape), dz.view(ctx.shape), dw, None
