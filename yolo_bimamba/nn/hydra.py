"""Hydra: the quasiseparable bidirectional mixer (Hwang et al., 2024), weight-compatible, fused.

``Hydra`` takes the constructor arguments of the published module (goombalab/hydra,
``hydra/modules/hydra.py``) and has the same parameters under the same state_dict keys and
shapes, so published checkpoints load with ``load_state_dict(strict=True)``:

==================  ===============================================  ==========================
key                 shape                                            content
==================  ===============================================  ==========================
in_proj.weight      (2*d_inner + 4*ngroups*d_state + 2*nheads,       rows: z | x | B_f | C_f |
                    d_model)                                         B_b | C_b | dt_f | dt_b
in_proj.bias        same rows (only with bias=True)
conv1d.weight       (d_inner + 4*ngroups*d_state, 1, d_conv)         channels: x | B_f | C_f |
conv1d.bias         (d_inner + 4*ngroups*d_state,) (conv_bias=True)  B_b | C_b
dt_bias, A_log, D   (nheads,)                                        shared by both directions
init_states         (nheads, headdim, d_state)                       learnable_init_states=True
fc_D.weight         (nheads, d_inner)                                data-dependent skip
norm.weight         (d_inner,)                                       gated RMSNorm
out_proj.weight     (d_model, d_inner) (+ out_proj.bias with bias)
==================  ===============================================  ==========================

Forward (identical function to the published one; f = forward, b = backward direction)::

    z, xBC, dt = split(in_proj(u)); xBC = silu(depthwise_conv1d(xBC))   # "same" padding
    x, B_f, C_f, B_b, C_b = split(xBC); dt_f, dt_b = split(dt)
    y = bi_ssd(x, dt_f, A, B_f, C_f, dt_bias, dt_softplus=True, dt_limit, shift=True,
               dt_bwd=dt_b, B_bwd=B_b, C_bwd=C_b)                      # A = -exp(A_log)
    y = y + x * (fc_D(x) + D)            # per head, broadcast over headdim
    out = out_proj(rmsnorm(y) * norm.weight * silu(z))                 # norm before gate

The published module stacks x with its time reversal along the batch, runs one causal scan,
rolls the output by one step, zeroes the first step and flips the second half back; the
fused Hydra mode of ``bi_ssd`` computes exactly that mixing matrix without the copies
(each direction shifted one step off the diagonal, with its own dt, B and C).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.bi_ssd.api import mixer_bi_ssd
from ..ops.dwconv import dwconv_silu
from ..ops.bi_ssd.reference import process_dt
from .bimamba2 import init_dt_bias
from .blocks import BiMambaLayer2D, C2fBiMamba
from .norm import RMSNormGated


class Hydra(nn.Module):
    """Hydra mixer, (batch, seqlen, d_model) -> (batch, seqlen, d_model).

    Arguments as in the published module. ``use_mem_eff_path`` is accepted and has no
    effect (the fused op is always the memory-efficient path); ``layer_idx`` is stored.
    The attribute ``backend`` ("auto", "torch" or "triton") picks the ``bi_ssd`` backend.
    Arguments the published forward would reject (even ``d_conv``, an activation other
    than SiLU, ``headdim`` not dividing ``expand * d_model``) raise ``ValueError`` here.
    """

    def __init__(
        self,
        d_model,
        d_state=64,
        d_conv=7,
        conv_init=None,
        expand=2,
        headdim=64,
        ngroups=1,
        dt_min=0.001,
        dt_max=0.1,
        dt_init_floor=1e-4,
        dt_limit=(0.0, float("inf")),
        learnable_init_states=False,
        activation="swish",
        bias=False,
        conv_bias=True,
        chunk_size=256,
        use_mem_eff_path=False,
        layer_idx=None,
        device=None,
        dtype=None,
    ):
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        d_inner = expand * d_model
        if d_inner != int(d_inner) or d_inner <= 0:
            raise ValueError(f"Hydra: expand * d_model must be a positive integer, got {expand} * {d_model}")
        d_inner = int(d_inner)
        if d_inner % headdim != 0:
            raise ValueError(f"Hydra: expand * d_model = {d_inner} must be divisible by headdim = {headdim}")
        nheads = d_inner // headdim
        if ngroups < 1 or nheads % ngroups != 0:
            raise ValueError(f"Hydra: ngroups = {ngroups} must divide nheads = {nheads}")
        if d_conv % 2 != 1:
            raise ValueError(
                f"Hydra: d_conv must be odd (the 'same' padding d_conv // 2 keeps the length only then), got {d_conv}"
            )
        if activation not in ("swish", "silu"):
            raise ValueError(f"Hydra: activation must be 'swish' or 'silu', got {activation!r}")
        self.d_model, self.d_state, self.d_conv, self.conv_init = d_model, d_state, d_conv, conv_init
        self.expand, self.d_inner, self.headdim, self.ngroups, self.nheads = expand, d_inner, headdim, ngroups, nheads
        self.dt_limit = (float(dt_limit[0]), float(dt_limit[1]))
        self.learnable_init_states = learnable_init_states
        self.activation = activation
        self.chunk_size = chunk_size
        self.use_mem_eff_path = use_mem_eff_path
        self.layer_idx = layer_idx
        self.backend = "auto"

        gn = ngroups * d_state
        self.in_proj = nn.Linear(d_model, 2 * d_inner + 4 * gn + 2 * nheads, bias=bias, **fk)
        conv_dim = d_inner + 4 * gn
        self.conv1d = nn.Conv1d(conv_dim, conv_dim, d_conv, groups=conv_dim, padding=d_conv // 2, bias=conv_bias, **fk)
        if conv_init is not None:
            nn.init.uniform_(self.conv1d.weight, -conv_init, conv_init)
        if learnable_init_states:
            self.init_states = nn.Parameter(torch.zeros(nheads, headdim, d_state, **fk))
            self.init_states._no_weight_decay = True
        self.act = nn.SiLU()
        # dt_bias: inverse softplus of a log-uniform step in [dt_min, dt_max]; A = -1 at init
        self.dt_bias = nn.Parameter(init_dt_bias(nheads, dt_min, dt_max, dt_init_floor, device=device, dtype=dtype))
        self.A_log = nn.Parameter(torch.zeros(nheads, device=device, dtype=torch.float32).to(dtype=dtype))
        self.D = nn.Parameter(torch.ones(nheads, device=device))  # float32, as published
        for p in (self.dt_bias, self.A_log, self.D):
            p._no_weight_decay = True
        self.fc_D = nn.Linear(d_inner, nheads, bias=False, **fk)
        self.norm = RMSNormGated(d_inner, eps=1e-5, norm_before_gate=True, **fk)
        self.out_proj = nn.Linear(d_inner, d_model, bias=bias, **fk)

    def _init_state_term(self, dt_f, dt_b, A, C_f, C_b, dtype):
        """Contribution of the learnable initial state to both shifted directions.

        Forward row t >= 1: C_f[t-1] . h0 * exp(sum_{k<=t-1} dt_f[k] A); backward row t <= L-2:
        C_b[t+1] . h0 * exp(sum_{k>=t+1} dt_b[k] A) (the state enters each scan at its start).
        """
        r = self.nheads // self.ngroups
        dt_f = process_dt(dt_f.float(), self.dt_bias.float(), True, self.dt_limit)
        dt_b = process_dt(dt_b.float(), self.dt_bias.float(), True, self.dt_limit)
        h0 = self.init_states.float()
        a_f = torch.exp(torch.cumsum(dt_f * A, dim=1))  # (b, l, h)
        a_b = torch.exp(torch.flip(torch.cumsum(torch.flip(dt_b * A, (1,)), dim=1), (1,)))
        v_f = torch.einsum("blhn,hpn->blhp", C_f.float().repeat_interleave(r, dim=2), h0) * a_f[..., None]
        v_b = torch.einsum("blhn,hpn->blhp", C_b.float().repeat_interleave(r, dim=2), h0) * a_b[..., None]
        v_f = F.pad(v_f[:, :-1], (0, 0, 0, 0, 1, 0))
        v_b = F.pad(v_b[:, 1:], (0, 0, 0, 0, 0, 1))
        return (v_f + v_b).to(dtype)

    def forward(self, u: torch.Tensor, seq_idx=None) -> torch.Tensor:
        if seq_idx is not None:
            raise ValueError("Hydra: seq_idx (packed variable-length sequences) is not supported; pass seq_idx=None")
        if u.dim() != 3 or u.shape[-1] != self.d_model:
            raise ValueError(f"Hydra: input must have shape (batch, seqlen, {self.d_model}), got {tuple(u.shape)}")
        b, l, _ = u.shape
        h, p, g, n = self.nheads, self.headdim, self.ngroups, self.d_state
        gn = g * n
        z, xbc, dt = torch.split(self.in_proj(u), [self.d_inner, self.d_inner + 4 * gn, 2 * h], dim=-1)
        if isinstance(self.act, nn.SiLU):  # fused on CUDA (ops.dwconv), the same expression elsewhere
            xbc = dwconv_silu(xbc, self.conv1d.weight, self.conv1d.bias, backend=self.backend)
        else:
            xbc = self.act(self.conv1d(xbc.transpose(1, 2)).transpose(1, 2))
        x, B_f, C_f, B_b, C_b = torch.split(xbc, [self.d_inner, gn, gn, gn, gn], dim=-1)
        dt_f, dt_b = dt[..., :h], dt[..., h:]
        A = -torch.exp(self.A_log.float())
        grp = lambda t: t.reshape(b, l, g, n)  # noqa: E731
        x4 = x.reshape(b, l, h, p)
        y = mixer_bi_ssd(  # (the scan in bf16 under fp16 AMP on CUDA: ops.bi_ssd.api.mixer_scan_dtype)
            x4, dt_f, A, grp(B_f), grp(C_f),
            chunk_size=self.chunk_size, dt_bias=self.dt_bias, dt_softplus=True, dt_limit=self.dt_limit,
            shift=True, dt_bwd=dt_b, B_bwd=grp(B_b), C_bwd=grp(C_b), backend=self.backend,
        )
        if self.learnable_init_states:
            y = y + self._init_state_term(dt_f, dt_b, A, grp(C_f), grp(C_b), y.dtype)
        skip = F.linear(x, self.fc_D.weight, self.D)  # (b, l, h): fc_D(x) + D
        y = y + x4 * skip[..., None]
        y = self.norm(y.reshape(b, l, self.d_inner), z)
        return self.out_proj(y)


class HydraLayer2D(BiMambaLayer2D):
    """Residual Hydra layer over the H*W token sequence of an (N, C, H, W) map.

    Same structure and arguments as :class:`~yolo_bimamba.nn.blocks.BiMambaLayer2D` (scan order,
    MLP, drop path; mixer keyword arguments on top of the block defaults) with a
    :class:`Hydra` mixer.
    """

    mixer_cls = Hydra


class C2fHydra(C2fBiMamba):
    """C2f-style CSP block ``(c1, c2, n=1, shortcut=False, g=1, e=0.5, **kw)`` of Hydra layers."""

    layer_cls = HydraLayer2D
