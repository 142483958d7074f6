"""Test helper: a pure-PyTorch transcription of the published Hydra mixer's forward.

Hydra (Hwang et al., 2024; goombalab/hydra, ``hydra/modules/hydra.py``) computes its
quasiseparable bidirectional mixer by stacking the sequence and its time-reversal along the
batch, running one causal SSD scan over both, rolling the result one step forward in time,
zeroing the first step, and adding the un-flipped forward half to the re-flipped backward
half. This module reproduces that computation step by step (same attribute names, so the
same state_dict keys and shapes), with the causal scan supplied by this project:

* ``scan="ssd"``: ``yolo_bimamba.ops.bi_ssd(direction="forward", backend="torch")``;
* ``scan="reference"``: the float64 quadratic reference, forward direction only;
* ``scan="recurrent"``: an independent sequential state recurrence (one step at a time),
  which also supports the published ``learnable_init_states``.

It is the yardstick for ``yolo_bimamba.nn.Hydra`` and for the fused Hydra mode of ``bi_ssd``;
it is deliberately slow (flip/cat/roll) and not part of the package.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from yolo_bimamba.ops import bi_ssd, bi_ssd_reference


class PublishedGatedRMSNorm(nn.Module):
    """RMS norm with a SiLU gate as in mamba_ssm's gated RMSNorm (key: ``weight`` only)."""

    def __init__(self, hidden_size, eps=1e-5, group_size=None, norm_before_gate=True, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        self.register_parameter("bias", None)
        self.group_size = group_size
        self.norm_before_gate = norm_before_gate

    def forward(self, x, z=None):
        out_dtype = x.dtype
        xf = x.float()
        zf = None if z is None else z.float()
        if zf is not None and not self.norm_before_gate:
            xf = xf * (zf * torch.sigmoid(zf))
        gs = xf.shape[-1] if self.group_size is None else self.group_size
        xg = xf.reshape(*xf.shape[:-1], xf.shape[-1] // gs, gs)
        inv_rms = 1.0 / torch.sqrt(xg.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        out = (xg * inv_rms).reshape(xf.shape) * self.weight.float()
        if zf is not None and self.norm_before_gate:
            out = out * (zf * torch.sigmoid(zf))
        return out.to(out_dtype)


def recurrent_causal_scan(x, dt, A, B, C, initial_states=None):
    """Sequential causal SSM: h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T, y_t = h_t C_t.

    x (b, l, h, p), dt (b, l, h) already processed, A (h,), B/C (b, l, g, n),
    initial_states (b, h, p, n) or None. Computes in x's dtype.
    """
    b, l, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    Bh = B.repeat_interleave(h // g, dim=2).to(x.dtype)
    Ch = C.repeat_interleave(h // g, dim=2).to(x.dtype)
    dt = dt.to(x.dtype)
    A = A.to(x.dtype)
    state = x.new_zeros(b, h, p, n) if initial_states is None else initial_states.to(x.dtype).clone()
    ys = []
    for t in range(l):
        decay = torch.exp(dt[:, t] * A)  # (b, h)
        state = state * decay[:, :, None, None] + (dt[:, t, :, None] * x[:, t])[..., None] * Bh[:, t, :, None, :]
        ys.append(torch.einsum("bhpn,bhn->bhp", state, Ch[:, t]))
    return torch.stack(ys, dim=1)


class PublishedHydra(nn.Module):
    """Transcription of the published ``Hydra`` (constructor arguments, parameters, forward)."""

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
        scan="ssd",
    ):
        fk = {"device": device, "dtype": dtype}
        super().__init__()
        self.d_model, self.d_state, self.d_conv, self.conv_init = d_model, d_state, d_conv, conv_init
        self.expand = expand
        self.d_inner = expand * d_model
        self.headdim, self.ngroups = headdim, ngroups
        assert self.d_inner % headdim == 0
        self.nheads = self.d_inner // headdim
        self.dt_limit = dt_limit
        self.learnable_init_states = learnable_init_states
        self.activation = activation
        self.chunk_size = chunk_size
        self.use_mem_eff_path = use_mem_eff_path
        self.layer_idx = layer_idx
        self.scan = scan

        gn = ngroups * d_state
        # in_proj output layout: z | x | B_fwd C_fwd B_bwd C_bwd | dt_fwd dt_bwd
        self.in_proj = nn.Linear(d_model, 2 * self.d_inner + 4 * gn + 2 * self.nheads, bias=bias, **fk)
        conv_dim = self.d_inner + 4 * gn
        self.conv1d = nn.Conv1d(conv_dim, conv_dim, d_conv, groups=conv_dim, padding=d_conv // 2, bias=conv_bias, **fk)
        if conv_init is not None:
            nn.init.uniform_(self.conv1d.weight, -conv_init, conv_init)
        if learnable_init_states:
            self.init_states = nn.Parameter(torch.zeros(self.nheads, headdim, d_state, **fk))
        self.act = nn.SiLU()
        dt0 = torch.exp(torch.rand(self.nheads, **fk) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        dt0 = dt0.clamp(min=dt_init_floor)
        self.dt_bias = nn.Parameter(dt0 + torch.log(-torch.expm1(-dt0)))
        self.A_log = nn.Parameter(torch.zeros(self.nheads, dtype=torch.float32, device=device).to(dtype=dtype))
        self.D = nn.Parameter(torch.ones(self.nheads, device=device))
        self.fc_D = nn.Linear(self.d_inner, self.nheads, bias=False, **fk)
        self.norm = PublishedGatedRMSNorm(self.d_inner, eps=1e-5, norm_before_gate=True, **fk)
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=bias, **fk)

    def _causal(self, x, dt, A, B, C, initial_states):
        """The published call: chunk scan over (2*batch) sequences, no D, no z."""
        if self.scan == "recurrent":
            dtp = dt.clamp(min=float(self.dt_limit[0]), max=float(self.dt_limit[1]))
            return recurrent_causal_scan(x, dtp, A, B, C, initial_states).to(x.dtype)
        if initial_states is not None:
            raise ValueError("initial states need scan='recurrent'")
        if self.scan == "ssd":
            return bi_ssd(x, dt, A, B, C, chunk_size=self.chunk_size, dt_limit=self.dt_limit,
                          direction="forward", backend="torch")
        if self.scan == "reference":
            return bi_ssd_reference(x, dt, A, B, C, dt_limit=self.dt_limit, direction="forward").to(x.dtype)
        raise ValueError(f"unknown scan {self.scan!r}")

    def forward(self, u, seq_idx=None):
        assert seq_idx is None
        batch, seqlen, _ = u.shape
        h, p, g, n = self.nheads, self.headdim, self.ngroups, self.d_state
        zxbcdt = self.in_proj(u)
        A = -torch.exp(self.A_log.float())
        init = None
        if self.learnable_init_states:
            init = self.init_states[None].expand(2 * batch, *self.init_states.shape)
        z, xBC, dt = torch.split(zxbcdt, [self.d_inner, self.d_inner + 4 * g * n, 2 * h], dim=-1)
        # the backward direction's dt is the second half, time-reversed, stacked on the batch
        dt = torch.cat((dt[:, :, :h], torch.flip(dt[:, :, h:], (1,))), dim=0)
        dt = F.softplus(dt + self.dt_bias)
        assert self.activation in ("silu", "swish")
        xBC = self.act(self.conv1d(xBC.transpose(1, 2)).transpose(1, 2))
        x, BC = torch.split(xBC, [self.d_inner, 4 * g * n], dim=-1)
        x_og = x
        x = torch.cat((x, torch.flip(x, (1,))), dim=0)
        BC = torch.cat((BC[:, :, : 2 * g * n], torch.flip(BC[:, :, 2 * g * n:], (1,))), dim=0)
        B, C = torch.split(BC, [g * n, g * n], dim=-1)
        y = self._causal(
            x.reshape(2 * batch, seqlen, h, p), dt, A,
            B.reshape(2 * batch, seqlen, g, n), C.reshape(2 * batch, seqlen, g, n), init,
        )
        y = y.reshape(2 * batch, seqlen, h * p)
        y = torch.roll(y, shifts=1, dims=1)
        y[:, 0, :] = 0.0
        y_fw, y_bw = y[:batch], torch.flip(y[batch:], (1,))
        skip = F.linear(x_og, self.fc_D.weight, bias=self.D)  # (b, l, h)
        y = y_fw + y_bw + x_og * skip.repeat_interleave(p, dim=-1)
        y = self.norm(y, z)
        return self.out_proj(y)


def randomize_(module: nn.Module, seed: int = 0, scale: float = 0.5) -> nn.Module:
    """Give every parameter non-trivial values (A_log, dt_bias, D, norm too), deterministically."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, prm in module.named_parameters():
            r = torch.randn(prm.shape, generator=gen, dtype=torch.float64)
            if name.endswith("A_log"):
                val = r * 0.5  # A = -exp(A_log) in about [-2.7, -0.4]
            elif name.endswith("dt_bias"):
                val = r * 0.5 - 1.0
            elif name.endswith("norm.weight") or name.endswith(".D") or name == "D":
                val = 1.0 + 0.3 * r
            else:
                val = r * scale / math.sqrt(max(1, prm[0].numel() if prm.dim() > 1 else 1))
            prm.copy_(val.to(prm.dtype))
    return module
