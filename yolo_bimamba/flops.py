"""GFLOPs of detection models with the SSM work of our mixers counted.

Ultralytics' count (``ultralytics.utils.torch_utils.get_flops``, through ``thop``) sees modules it has a rule for
(convolutions, ``nn.Linear``) and plain torch products (matmul, einsum, F.linear); it does not see what runs inside
our fused kernels: the depthwise conv (its weights are passed to a kernel, the ``nn.Conv1d`` is never called), the
bidirectional SSD scan, and Hydra's ``fc_D`` product. :func:`model_gflops` runs the same ``thop`` profile with a rule
for each mixer class that adds exactly that work, counted analytically from the module's sizes and its input's shape
(:func:`mixer_macs`); ``in_proj`` / ``out_proj`` are ``nn.Linear`` modules called as such and keep thop's own rule.

What the mixer rule counts, in multiply-accumulates (MACs; GFLOPs = 2 x MACs / 1e9, as Ultralytics reports them),
for an input of b sequences of L tokens, H heads of P channels, N states in G groups, chunk length Q, conv width K,
and the chunks' lengths l_c (sum l_c = L, each at most Q):

* depthwise conv: b * L * conv_dim * K;
* the SSD in its chunked form, both directions: the in-chunk pairs once for both directions (the full l_c x l_c
  block, as the fused kernel computes it): C.B scores b * sum(l_c^2) * N * G (Hydra: separate B, C per direction,
  twice that) and scores x values b * sum(l_c^2) * H * P; per direction, every chunk's state from its tokens
  (b * L * H * P * N) and every token's output from the incoming state (b * L * H * P * N), so 4 b L H P N for both;
  the state passing between chunks, 2 * b * n_chunks * H * P * N; the D skip, b * L * H * P;
* Hydra only: ``fc_D``, b * L * d_inner * H.

Elementwise work (norms, gating, softplus, exp) is not counted, as thop does not count activations.
"""

from __future__ import annotations

import copy

import torch

__all__ = ["ssd_macs", "mixer_macs", "model_gflops"]


def ssd_macs(b: int, L: int, heads: int, headdim: int, d_state: int, ngroups: int, chunk: int,
             separate_bc: bool = False) -> int:
    """MACs of one bidirectional SSD call (see the module docstring)."""
    full, rest = divmod(L, chunk)
    lens = [chunk] * full + ([rest] if rest else [])
    pairs = sum(n * n for n in lens)
    scores = pairs * d_state * ngroups * (2 if separate_bc else 1)
    values = pairs * heads * headdim
    states = 4 * L * heads * headdim * d_state
    passing = 2 * len(lens) * heads * headdim * d_state
    skip = L * heads * headdim
    return b * (scores + values + states + passing + skip)


def mixer_macs(m, x: torch.Tensor) -> int:
    """MACs of a BiMamba2 or Hydra mixer on input ``x`` (b, L, d_model) that thop does not see (no projections)."""
    from .nn.bimamba2 import BiMamba2
    from .nn.hydra import Hydra

    if not isinstance(m, (BiMamba2, Hydra)):
        raise TypeError(f"mixer_macs: expected a BiMamba2 or Hydra module, got {type(m).__name__}")
    if x.dim() != 3 or x.shape[-1] != m.d_model:
        raise ValueError(f"mixer_macs: x must have shape (batch, seqlen, {m.d_model}), got {tuple(x.shape)}")
    b, L = int(x.shape[0]), int(x.shape[1])
    conv = b * L * m.conv1d.weight.shape[0] * m.conv1d.weight.shape[-1]
    if isinstance(m, Hydra):
        ssd = ssd_macs(b, L, m.nheads, m.headdim, m.d_state, m.ngroups, m.chunk_size, separate_bc=True)
        return conv + ssd + b * L * m.d_inner * m.nheads
    return conv + ssd_macs(b, L, m.nheads, m.headdim, m.d_state, m.ngroups, m.chunk_size)


def _rule(m, inputs, output):
    m.total_ops += mixer_macs(m, inputs[0])


def model_gflops(model: torch.nn.Module, imgsz: int = 640, mixers: bool = True) -> float:
    """GFLOPs of one ``imgsz`` x ``imgsz`` image through ``model``, counted by thop at full size (no extrapolation
    from small images: the SSD's in-chunk work is not proportional to the image area below a chunk's length), with
    the mixers' work added (``mixers=False``: thop's count alone, what Ultralytics reports)."""
    import thop

    from .nn.bimamba2 import BiMamba2
    from .nn.hydra import Hydra

    model = copy.deepcopy(model)
    p = next(model.parameters())
    im = torch.zeros((1, 3, imgsz, imgsz), device=p.device, dtype=p.dtype)
    custom = {BiMamba2: _rule, Hydra: _rule} if mixers else {}
    macs = thop.profile(model, inputs=[im], custom_ops=custom, verbose=False)[0]
    return macs * 2 / 1e9
