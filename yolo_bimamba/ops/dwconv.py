"""Depthwise "same" convolution over the sequence, then SiLU: the short convolution of Mamba2 / Hydra blocks.

``dwconv_silu(u, weight, bias)`` takes the sequence layout (b, l, c) that the in-projection produces and returns
silu(conv1d(u)) in the same layout, equal to

    F.silu(F.conv1d(u.transpose(1, 2), weight, bias, padding=k // 2, groups=c).transpose(1, 2))

On CUDA it runs our Triton kernels (ops.dwconv_kernels): they read a slice of the in-projection's output in place
and skip the two transposes and PyTorch's generic depthwise kernels. Elsewhere (CPU, no Triton) it is that PyTorch
expression; while a plain-op graph is traced for a file (TorchScript, ONNX) it is the same convolution written as a
depthwise Conv2d over a height-1 image, so exported models contain a plain Conv node that onnxruntime's CPU depthwise
path runs 2.8x faster than a grouped 1-D Conv (5.8 vs 2.1 ms at 128 channels x 6400 positions with SiLU, 2 threads).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import config
from .backend_choice import ForcedConfig, compiling, graph_tracing, runs_triton, triton_usable
from .kernel_buffers import accumulation_dtype, alloc, compute_dtype
from .launch import launch


force_config = ForcedConfig()  # tests: ``with force_config(i):`` every launch uses config i of CONFIGS


def dwconv_silu_reference(u: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    c, k = weight.shape[0], weight.shape[-1]
    return F.silu(F.conv1d(u.transpose(1, 2), weight, bias, padding=k // 2, groups=c).transpose(1, 2))


def dwconv_silu_export(u: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """:func:`dwconv_silu_reference` as a depthwise 2-D convolution over (c, 1, l): what traced and exported graphs
    hold (the same sums; onnxruntime runs it faster than a grouped 1-D Conv on the CPU, see the module docstring)."""
    return dwconv_silu_channels_first(u.transpose(1, 2), weight, bias).transpose(1, 2)


def dwconv_silu_channels_first(u: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The same on the channels-first layout (b, c, l) -> (b, c, l), written as that depthwise Conv2d (the export
    path of nn.BiMamba2 feeds it the in-projection's rows in this layout, so that no transpose surrounds the conv)."""
    c, k = weight.shape[0], weight.shape[-1]
    y = F.conv2d(u.unsqueeze(2), weight.unsqueeze(2), bias, padding=(0, k // 2), groups=c)
    return F.silu(y.squeeze(2))


def validate_dwconv(u: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    if not isinstance(u, torch.Tensor) or u.dim() != 3:
        raise ValueError(f"dwconv_silu: u must have shape (batch, seqlen, channels), got "
                         f"{tuple(u.shape) if isinstance(u, torch.Tensor) else type(u).__name__}")
    b, l, c = u.shape
    if weight.dim() != 3 or weight.shape[0] != c or weight.shape[1] != 1 or weight.shape[2] % 2 != 1:
        raise ValueError(f"dwconv_silu: weight must have shape ({c}, 1, k) with k odd (a depthwise Conv1d's weight), "
                         f"got {tuple(weight.shape)}")
    if bias is not None and tuple(bias.shape) != (c,):
        raise ValueError(f"dwconv_silu: bias must have shape ({c},), got {tuple(bias.shape)}")
    floats = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    for name, t in (("u", u), ("weight", weight), ("bias", bias)):
        if t is not None and t.dtype not in floats:
            raise ValueError(f"dwconv_silu: {name} must be float16, bfloat16, float32 or float64, got {t.dtype}")
        if t is not None and t.device != u.device:
            raise ValueError(f"dwconv_silu: {name} is on {t.device}, u on {u.device}")


def _triton_ok() -> bool:
    return triton_usable("yolo_bimamba.ops.dwconv_kernels", config.fused_conv)


def dwconv_silu(u: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                backend: str = "auto") -> torch.Tensor:
    """silu(depthwise "same" conv1d of u over the sequence), u (b, l, c), weight (c, 1, k), k odd; (b, l, c) out.

    backend: "torch" (the PyTorch expression in the module docstring), "triton" (our kernels) or "auto" (Triton on
    CUDA tensors when it is importable and no plain-op graph is traced for a file; ``YOLO_BIMAMBA_FUSED_CONV=0`` turns
    that off)."""
    validate_dwconv(u, weight, bias)
    triton = runs_triton("dwconv_silu", backend, u, _triton_ok)
    if compiling():  # torch.compile / torch.export: the custom op (ops.library), running the backend chosen here
        return torch.ops.yolo_bimamba.dwconv_silu(u, weight, bias, "triton" if triton else "torch")
    if not triton:
        return (dwconv_silu_export if graph_tracing() else dwconv_silu_reference)(u, weight, bias)
    return _DWConvSiLU.apply(u, weight, bias)


def _config(C: int):
    from .dwconv_kernels import CONFIGS

    if force_config.index is not None:
        return CONFIGS[force_config.index]
    return CONFIGS[0] if C > 32 else CONFIGS[1]  # narrow layers: longer row blocks


def triton_forward(u: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The forward kernel: y (b, l, c), contiguous, in u's dtype (u read in place where its channels have stride 1)."""
    from .dwconv_kernels import _dwconv_silu_fwd

    if u.stride(-1) != 1:
        u = u.contiguous()
    b, L, C = u.shape
    K = weight.shape[-1]
    w = weight.reshape(C, K).contiguous()
    bl, bc, nw = _config(C)
    y = alloc((b, L, C), u.dtype, u.device)
    grid = (b, -(-L // bl), -(-C // bc))
    launch(_dwconv_silu_fwd, grid, (u, w, bias if bias is not None else w, y, L, C, u.stride(0), u.stride(1)),
           dict(K=K, HAS_BIAS=bias is not None, COMPUTE=compute_dtype(u.dtype), BLOCK_L=bl, BLOCK_C=bc,
                num_warps=nw))
    return y


def triton_backward(dy: torch.Tensor, u: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    """The backward kernels: (du, dweight, dbias or None) from dy and the forward's inputs."""
    from .dwconv_kernels import _dwconv_silu_bwd_in, _dwconv_silu_bwd_pre

    if u.stride(-1) != 1:
        u = u.contiguous()
    b, L, C = u.shape
    K = weight.shape[-1]
    w = weight.reshape(C, K).contiguous()
    dy = dy.contiguous()
    bl, bc, nw = _config(C)
    nlb = -(-L // bl)
    grid = (b, nlb, -(-C // bc))
    comp = compute_dtype(u.dtype)
    acc = accumulation_dtype(u.dtype)
    gp = alloc((b, L, C), acc, u.device)
    dbias_part = alloc((b * nlb, C), acc, u.device) if bias is not None else gp
    launch(_dwconv_silu_bwd_pre, grid,
           (u, w, bias if bias is not None else w, dy, gp, dbias_part, L, C, u.stride(0), u.stride(1)),
           dict(K=K, HAS_BIAS=bias is not None, COMPUTE=comp, BLOCK_L=bl, BLOCK_C=bc, num_warps=nw))
    du = alloc((b, L, C), u.dtype, u.device)
    dw_part = alloc((b * nlb, K, C), acc, u.device)
    launch(_dwconv_silu_bwd_in, grid, (u, w, gp, du, dw_part, L, C, u.stride(0), u.stride(1)),
           dict(K=K, COMPUTE=comp, BLOCK_L=bl, BLOCK_C=bc, num_warps=nw))
    dw = dw_part.sum(0).t().contiguous().view(weight.shape).to(weight.dtype)  # contiguous, as the op's fake says
    dbias = dbias_part.sum(0).to(bias.dtype) if bias is not None else None
    return du, dw, dbias


class _DWConvSiLU(torch.autograd.Function):
    """The eager autograd function of the Triton backend (:func:`triton_forward`, :func:`triton_backward`)."""

    @staticmethod
    def forward(ctx, u, weight, bias):
        ctx.save_for_backward(u, weight, bias)
        return triton_forward(u, weight, bias)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        return triton_backward(dy, *ctx.saved_tensors)
