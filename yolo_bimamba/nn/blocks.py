"""2D blocks for (N, C, H, W) feature maps: a residual SSM mixer layer and a C2f-style CSP block."""
from __future__ import annotations

import math

import torch
from timm.layers import DropPath, Mlp
from torch import nn
from ultralytics.nn.modules import Conv

from ..ops.backend_choice import graph_tracing
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

    ``layer_scale``: ``None`` (default) adds each branch as it is; a number adds a learnable per-channel scale
    (``gamma`` for the mixer, ``gamma2`` for the MLP) initialised to it, so ``layer_scale=0.0`` makes the layer
    exactly the identity at step 0 (a block inserted into a trained model keeps its outputs). The scales, like the
    mixer's A_log, D and dt_bias, are marked ``_no_weight_decay`` (see :mod:`yolo_bimamba.recipe`).

    ``local=k`` (odd k, default 0: off) adds a depthwise k x k convolution of the normalised map beside the mixer
    (its output is summed with the mixer's, inside the scaled branch): local detail next to global context.
    ``pos=True`` adds a conditional positional encoding before the layer, ``x + dwconv3x3(x)``, its convolution
    initialised to zero (so the layer's output at init does not change; it learns from step 0).
    """

    mixer_cls = BiMamba2

    def __init__(self, dim: int, scan: str = "row", mlp_ratio: float = 0.0, drop_path: float = 0.0,
                 layer_scale: float | None = None, local: int = 0, pos: bool = False, **mixer_kwargs):
        super().__init__()
        if scan not in SCAN_ORDERS:
            raise ValueError(f"{type(self).__name__}: scan must be one of {SCAN_ORDERS}, got {scan!r} ('rowcol' "
                             "already scans four ways: row-major and column-major order, each in both directions)")
        if isinstance(local, bool) or not isinstance(local, int) or local < 0 or (local and local % 2 == 0):
            raise ValueError(f"{type(self).__name__}: local must be 0 (off) or an odd kernel size, got {local!r}")
        if not isinstance(pos, bool):
            raise ValueError(f"{type(self).__name__}: pos must be True or False, got {pos!r}")
        if layer_scale is not None and not (isinstance(layer_scale, (int, float)) and math.isfinite(layer_scale)):
            raise ValueError(f"{type(self).__name__}: layer_scale must be None or a finite number, got {layer_scale!r}")
        self.dim, self.scan = dim, scan
        self.norm = nn.LayerNorm(dim)
        self.mixer = self.mixer_cls(dim, **{**BLOCK_MIXER_DEFAULTS, **mixer_kwargs})
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        if mlp_ratio > 0:
            self.norm2 = nn.LayerNorm(dim)
            self.mlp = Mlp(dim, hidden_features=int(dim * mlp_ratio), act_layer=nn.GELU)
        else:
            self.norm2 = self.mlp = None
        self.local_conv = nn.Conv2d(dim, dim, local, padding=local // 2, groups=dim) if local else None
        self.pos_conv = None
        if pos:
            self.pos_conv = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
            nn.init.zeros_(self.pos_conv.weight)
            nn.init.zeros_(self.pos_conv.bias)
        self.gamma = self.gamma2 = None
        if layer_scale is not None:
            self.gamma = nn.Parameter(torch.full((dim,), float(layer_scale)))
            self.gamma._no_weight_decay = True
            if self.mlp is not None:
                self.gamma2 = nn.Parameter(torch.full((dim,), float(layer_scale)))
                self.gamma2._no_weight_decay = True

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
        if cuda_graph.may_replay_eval(self, x):  # CUDA inference of small inputs: a forward graph's replay
            return cuda_graph.run_eval(self, self._forward, x)
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        # optional parts: absent (None) in layers built without them and in layers pickled before they existed
        pos_conv, local_conv = getattr(self, "pos_conv", None), getattr(self, "local_conv", None)
        if pos_conv is not None:
            x = x + pos_conv(x)
        # one view of x feeds both the norm and the residual, so that their gradients are summed before they reach x
        # (in eager autograd as inside a CUDA-graph replay of this layer: the same rounding)
        xf = x.flatten(2)  # (N, C, H*W)
        # LN of the (N, H*W, C) row-major tokens, read channels-first as they are (fused on CUDA: ops.layer_norm);
        # traced or exported: the module itself, whose normalized_shape is a constant (not x's traced channel count,
        # which a dynamic-shape ONNX export cannot take as LayerNormalization's shape)
        if graph_tracing():
            tokens = self.norm(xf.transpose(1, 2))
        else:
            tokens = layer_norm_channels_first(xf, self.norm.weight, self.norm.bias, self.norm.eps,
                                               backend=getattr(self.mixer, "backend", "auto"))
        # layer scales: absent from layers built without layer_scale and from layers pickled before it existed
        gamma, gamma2 = getattr(self, "gamma", None), getattr(self, "gamma2", None)
        mixed = self._mix(tokens, h, w)
        if local_conv is not None:  # the normalised tokens as a map, convolved, back to tokens
            mixed = mixed + local_conv(tokens.transpose(1, 2).reshape(n, c, h, w)).flatten(2).transpose(1, 2)
        if gamma is not None:
            mixed = mixed * gamma.to(mixed.dtype)
        mixed = self.drop_path(mixed)
        if self.mlp is None:  # the residual sum written channels-first at once
            return (xf + mixed.transpose(1, 2)).reshape(n, c, h, w)
        t = xf.transpose(1, 2) + mixed
        m = self.mlp(self.norm2(t))
        if gamma2 is not None:
            m = m * gamma2.to(m.dtype)
        t = t + self.drop_path(m)
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
