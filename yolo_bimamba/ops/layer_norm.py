"""The blocks' token LayerNorm, taken straight from a channels-first feature map.

``layer_norm_channels_first(x, weight, bias, eps)`` maps x (N, C, *spatial) to the LayerNorm over C of its
L = prod(spatial) tokens, (N, L, C): what ``nn.LayerNorm(C)(x.flatten(2).transpose(1, 2))`` computes. On CUDA it runs
one Triton kernel forward and one backward (ops.layer_norm_kernels) that read x channels-first and write the
token-major output, in x's dtype, with fp32 arithmetic. PyTorch's path instead copies the transposed tokens, casts
them to fp32 (autocast runs layer_norm in fp32), and under AMP the next projection casts the fp32 output back (most
of its time the weight and bias gradients' reduction). Elsewhere (CPU, TorchScript / ONNX tracing, backend "torch")
it is that expression, as before. ``YOLO_BIMAMBA_FUSED_NORM=0`` turns the kernels off (as for the gated RMSNorm).

Under autocast the kernel's output keeps x's dtype (bf16 / fp16) where PyTorch's is fp32: the in-projection that
follows casts its input to that dtype anyway, so it sees the same rounded values.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import config
from .backend_choice import ForcedConfig, compiling, runs_triton, triton_usable
from .kernel_buffers import accumulation_dtype, alloc, compute_dtype
from .launch import launch

MAX_TILE = 8192  # tokens x padded channels per program

force_config = ForcedConfig()  # tests: ``with force_config(i):`` every launch uses config i of CONFIGS

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def layer_norm_channels_first_reference(x, weight, bias, eps) -> torch.Tensor:
    """PyTorch's expression: LayerNorm over the channels of x's tokens, (N, C, *spatial) -> (N, L, C)."""
    return F.layer_norm(x.flatten(2).transpose(1, 2), (x.shape[1],), weight, bias, eps)


def validate_layer_norm_channels_first(x, weight, bias) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() < 3:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"layer_norm_channels_first: x must be a tensor (N, C, *spatial) with at least one spatial "
                         f"dim, got {shape}")
    c = x.shape[1]
    for name, t in (("weight", weight), ("bias", bias)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != (c,):
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"layer_norm_channels_first: {name} must have shape ({c},) (x's channels), got {got}")
        if t.device != x.device:
            raise ValueError(f"layer_norm_channels_first: {name} is on {t.device}, x on {x.device}")
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        if t is not None and t.dtype not in _FLOATS:
            raise ValueError(f"layer_norm_channels_first: {name} must be float16, bfloat16, float32 or float64, "
                             f"got {t.dtype}")


def _triton_ok() -> bool:
    return triton_usable("yolo_bimamba.ops.layer_norm_kernels", config.fused_norm)


def layer_norm_channels_first(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                              eps: float = 1e-5, *, backend: str = "auto") -> torch.Tensor:
    """LayerNorm over C of the tokens of x (N, C, *spatial), returned token-major (N, L, C). backend: "auto" (Triton
    on CUDA when weight and bias are both given), "torch", "triton" (needs weight and bias)."""
    validate_layer_norm_channels_first(x, weight, bias)
    affine = weight is not None and bias is not None
    if backend == "triton" and not affine:
        raise ValueError("layer_norm_channels_first: backend 'triton' needs both weight and bias")
    triton = affine and runs_triton("layer_norm_channels_first", backend, x, _triton_ok)
    if compiling():  # torch.compile / torch.export: the custom op (ops.library), running the backend chosen here
        return torch.ops.yolo_bimamba.layer_norm_channels_first(x, weight, bias, float(eps),
                                                                "triton" if triton else "torch")[0]
    if not triton:
        return layer_norm_channels_first_reference(x, weight, bias, eps)
    return _LayerNormCF.apply(x, weight, bias, float(eps))


def _launch_shape(C: int):
    from .layer_norm_kernels import CONFIGS, block_c

    bc = block_c(C)
    toks, warps = CONFIGS[force_config.index if force_config.index is not None else 0]
    return max(1, min(toks, MAX_TILE // bc)), bc, warps


def triton_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float):
    """The forward kernel: (out (N, L, C) in x's dtype, mean, rstd per token in fp32 / fp64)."""
    from .layer_norm_kernels import _layer_norm_cf_fwd

    N, C = x.shape[:2]
    x3 = x.reshape(N, C, -1).contiguous()
    L = x3.shape[2]
    bl, bc, nw = _launch_shape(C)
    stat = accumulation_dtype(x.dtype)
    out = alloc((N, L, C), x.dtype, x.device)
    mean, rstd = alloc((N * L,), stat, x.device), alloc((N * L,), stat, x.device)
    launch(_layer_norm_cf_fwd, (-(-L // bl), N), (x3, weight, bias, out, mean, rstd, C, L, eps),
           dict(COMPUTE=compute_dtype(x.dtype), BLOCK_L=bl, BLOCK_C=bc, num_warps=nw))
    return out, mean, rstd


def triton_backward(dout, x, weight, bias, mean, rstd):
    """The backward kernel: (dx, dweight, dbias) from dout, the forward's inputs and statistics."""
    from .layer_norm_kernels import _layer_norm_cf_bwd

    N, C = x.shape[:2]
    x3 = x.reshape(N, C, -1).contiguous()
    L = x3.shape[2]
    bl, bc, nw = _launch_shape(C)
    nprog = -(-L // bl)
    dx = alloc((N, C, L), x3.dtype, x3.device)
    dw_part = alloc((N * nprog, C), rstd.dtype, x3.device)
    db_part = alloc((N * nprog, C), rstd.dtype, x3.device)
    launch(_layer_norm_cf_bwd, (nprog, N),
           (x3, weight, mean, rstd, dout.contiguous(), dx, dw_part, db_part, C, L),
           dict(COMPUTE=compute_dtype(x3.dtype), BLOCK_L=bl, BLOCK_C=bc, num_warps=nw))
    return dx.view(x.shape), dw_part.sum(0).to(weight.dtype), db_part.sum(0).to(bias.dtype)


class _LayerNormCF(torch.autograd.Function):
    """The eager autograd function of the Triton backend (:func:`triton_forward`, :func:`triton_backward`)."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        x3 = x.reshape(x.shape[0], x.shape[1], -1).contiguous()  # saved as the kernels read it (no second copy)
        out, mean, rstd = triton_forward(x3, weight, bias, eps)
        ctx.save_for_backward(x3, weight, bias, mean, rstd)
        ctx.shape = x.shape
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        dx, dw, db = triton_backward(dout, *ctx.saved_tensors)
        return dx.view(ctx.shape), dw, db, None
