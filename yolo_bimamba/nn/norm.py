"""Gated RMSNorm as used by Mamba2 and Hydra, computed in fp32."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.gated_norm import gated_rmsnorm


class RMSNormGated(nn.Module):
    """``norm_before_gate=False``: rmsnorm(x * silu(z)) * w; ``True``: rmsnorm(x) * w * silu(z). In fp32, returned in
    z's dtype when z is given (the model's activation dtype; x, the scan's output, may be bf16 under fp16), else x's.

    The first form (the one Mamba2 and Hydra blocks use) runs fused on CUDA (ops.gated_norm); the attribute
    ``backend`` ("auto", "torch" or "triton") picks how."""

    def __init__(self, d: int, eps: float = 1e-5, norm_before_gate: bool = False, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.norm_before_gate = norm_before_gate
        self.weight = nn.Parameter(torch.ones(d, device=device, dtype=dtype))
        self.backend = "auto"

    def forward(self, x: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        if z is not None and not self.norm_before_gate:
            return gated_rmsnorm(x, z, self.weight, self.eps, backend=getattr(self, "backend", "auto"))
        dtype = x.dtype if z is None else z.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()
        if z is not None:
            x = x * F.silu(z.float())
        return x.to(dtype)
