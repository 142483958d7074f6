"""2D blocks for (N, C, H, W) feature maps: a residual SSM mixer layer and a C2f-style CSP block."""
from __future__ import annotations

import torch
from timm.layers import DropPath, Mlp
from torch import nn
from ultralytics.nn.modules import Conv

from ..ops.layer_norm import layer_norm_channels_first
from . import cuda_graph
from .bimamba2 import BiMamba2

SCAN_ORDERS = ("row", "rowcol")

#: Defaults of the mixer inside detection blocks: small heads suit the narrow YOLO widths, and a
#: bounded dt keeps every decay exp(dt * A) finite and non-degenerate (see docs in README).
BLOCK_MIXER_DEFAULTS = dict(d_state=32, headdim=32, expand=2, d_conv=7, dt_limit=(1e-4, 10.0), chunk_size=64)


class BiMambaLayer2D(nn.Module):
    """x + DropPath(mixer(LN(tokens))) [+ x + DropPath(MLP(LN(x)))] over the H*W token sequence.

    ``scan="row"`` scans the row-major sequence (both directions); ``scan="rowcol"`` also scans
    the column-major order with the same mixer weights (both orders batched in one call) and
    averages the two.
    """

    mixer_cls = BiMamba2

    def __init__(self, dim: int, scan: str = "row", mlp_ratio: float = 0.0, drop_path: float = 0.0, **mixer_kwargs):
        super().__init__()
        if scan not in SCAN_ORDERS:
            raise ValueError(f"{type(self).__name__}: scan must be one of {SCAN_ORDERS}, got {scan!r}")
        self.dim, self.scan = dim, scan
        self.norm = nn.LayerNorm(dim)
        self.mixer = self.mixer_cls(dim, **{**BLOCK_MIXER_DEFAULTS, **mixer_kwargs})
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        if mlp_ratio > 0:
            self.norm2 = nn.LayerNorm(dim)
            self.mlp = Mlp(dim, hidden_features=int(dim * mlp_ratio), act_layer=nn.GELU)
        else:
            self.norm2 = self.mlp = None

    def _mix(self, t: torch.Tensor, h: int, w: int) -> torch.Tensor:
        if self.scan == "row":
            return self.mixer(t)
        n, _, c = t.shape
        col = t.reshape(n, h, w, c).transpose(1, 2).reshape(n, w * h, c)
        both = self.mixer(torch.cat([t, col], dim=0))
        row_out, col_out = both[:n], both[n:].reshape(n, w, h, c).transpose(1, 2).reshape(n, h * w, c)
        return 0.5 * (row_out + col_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1] != self.dim:
            raise ValueError(f"{type(self).__name__}: input must have shape (N, {self.dim}, H, W), got {tuple(x.shape)}")
        if cuda_graph.may_replay(self, x):  # CUDA training: graph replays (cuda_graph.run; eager where unsafe)
            return cuda_graph.run(self, self._forward, x)
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        # one view of x feeds both the norm and the residual, so that their gradients are summed before they reach x
        # (in eager autograd as inside a CUDA-graph replay of this layer: the same rounding)
        xf = x.flatten(2)  # (N, C, H*W)
        # LN of the (N, H*W, C) row-major tokens, read channels-first as they are (fused on CUDA: ops.layer_norm)
        tokens = layer_norm_channels_first(xf, self.norm.weight, self.norm.bias, self.norm.eps,
                                           backend=getattr(self.mixer, "backend", "auto"))
        mixed = self.drop_path(self._mix(tokens, h, w))
        if self.mlp is None:  # the residual sum written channels-first at once
            return (xf + mixed.transpose(1, 2)).reshape(n, c, h, w)
        t = xf.transpose(1, 2) + mixed
        t = t + self.drop_path(self.mlp(self.norm2(t)))
        return t.transpose(1, 2).reshape(n, c, h, w)


class C2fBiMamba(nn.Module):
    """CSP block with Ultralytics' C2f signature (c1, c2, n, shortcut, g, e) and BiMamba2 layers.

    cv1 splits the input into two halves of c = c2 * e channels; n mixer layers run on the last
    half in sequence; cv2 fuses all (2 + n) * c channels. ``shortcut`` and ``g`` are accepted for
    drop-in compatibility with C2f rows (the mixer layers are residual already). Extra keyword
    arguments (scan, mlp_ratio, drop_path, d_state, headdim, expand, ...) go to every layer.
    """

    layer_cls = BiMambaLayer2D

    def __init__(self, c1: int, c2: int, n: int = 1, shortcut: bool = False, g: int = 1, e: float = 0.5, **layer_kwargs):
        super().__init__()
        self.c = int(c2 * e)
        self.cv1 = Conv(c1, 2 * self.c, 1, 1)
        self.cv2 = Conv((2 + n) * self.c, c2, 1)
        self.m = nn.ModuleList(self.layer_cls(self.c, **layer_kwargs) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = list(self.cv1(x).chunk(2, 1))
        y.extend(m(y[-1]) for m in self.m)
        return self.cv2(torch.cat(y, 1))
