"""Gated RMSNorm as used by Mamba2 and Hydra, computed in fp32."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNormGated(nn.Module):
    """``norm_before_gate=False``: rmsnorm(x * silu(z)) * w; ``True``: rmsnorm(x) * w * silu(z)."""

    def __init__(self, d: int, eps: float = 1e-5, norm_before_gate: bool = False, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.norm_before_gate = norm_before_gate
        self.weight = nn.Parameter(torch.ones(d, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        if z is not None and not self.norm_before_gate:
            x = x * F.silu(z.float())
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()
        if z is not None and self.norm_before_gate:
            x = x * F.silu(z.float())
        return x.to(dtype)
