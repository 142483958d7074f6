"""BiMamba2: a bidirectional Mamba2 mixer over (batch, length, d_model) sequences."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.bi_ssd.api import mixer_bi_ssd
from ..ops.bi_ssd.torch_backend import bi_ssd_torch_channels_first
from ..ops.dwconv import dwconv_silu, dwconv_silu_channels_first
from ..ops.backend_choice import graph_tracing
from .norm import RMSNormGated

#: A = -exp(A_log) is computed with A_log clamped to at most this value (|A| <= 1e3), so that
#: dt * A stays finite for every finite dt and no inf - inf can reach the scan.
A_LOG_MAX = math.log(1e3)


def init_dt_bias(nheads, dt_min, dt_max, dt_init_floor, device=None, dtype=None) -> torch.Tensor:
    """Inverse softplus of a log-uniform step size in [dt_min, dt_max] (Mamba2's init)."""
    dt = torch.exp(
        torch.rand(nheads, device=device, dtype=torch.float32) * (math.log(dt_max) - math.log(dt_min))
        + math.log(dt_min)
    ).clamp(min=dt_init_floor)
    inv = dt + torch.log(-torch.expm1(-dt))
    return inv.to(dtype or torch.float32)


def init_A_log(nheads, A_init_range, device=None, dtype=None) -> torch.Tensor:
    lo, hi = A_init_range
    if not 0 < lo <= hi:
        raise ValueError(f"A_init_range must satisfy 0 < low <= high, got {A_init_range!r}")
    A = torch.empty(nheads, device=device, dtype=torch.float32).uniform_(lo, hi)
    return torch.log(A).to(dtype or torch.float32)


class BiMamba2(nn.Module):
    """Bidirectional Mamba2 mixer, (B, L, D) -> (B, L, D), with Hydra's constructor.

    in_proj -> [z | xBC | dt]; xBC -> non-causal depthwise conv1d -> SiLU -> x, B, C;
    dt -> softplus(dt + dt_bias) clamped to dt_limit; A = -exp(A_log);
    y = bi_ssd(x, dt, A, B, C, D) (both scan directions, diagonal in both);
    gated RMSNorm with z; out_proj.
    """

    def __init__(
        self,
        d_model: int,
        d_state: int = 64,
        d_conv: int = 7,
        conv_init: float | None = None,
        expand: int = 2,
        headdim: int = 64,
        ngroups: int = 1,
        A_init_range: tuple[float, float] = (1, 16),
        dt_min: float = 0.001,
        dt_max: float = 0.1,
        dt_init_floor: float = 1e-4,
        dt_limit: tuple[float, float] = (0.0, float("inf")),
        learnable_init_states: bool = False,
        activation: str = "swish",
        bias: bool = False,
        conv_bias: bool = True,
        chunk_size: int = 64,
        use_mem_eff_path: bool = False,
        layer_idx: int | None = None,
        backend: str = "auto",
        device=None,
        dtype=None,
    ):
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        d_inner = expand * d_model
        if d_inner % headdim != 0:
            raise ValueError(f"BiMamba2: expand * d_model = {d_inner} must be divisible by headdim = {headdim}")
        nheads = d_inner // headdim
        if nheads % ngroups != 0:
            raise ValueError(f"BiMamba2: ngroups = {ngroups} must divide nheads = {nheads}")
        if d_conv % 2 != 1:
            raise ValueError(f"BiMamba2: d_conv must be odd for a non-causal 'same' convolution, got {d_conv}")
        if activation not in ("swish", "silu"):
            raise ValueError(f"BiMamba2: activation must be 'swish' or 'silu', got {activation!r}")
        if learnable_init_states:
            raise ValueError("BiMamba2: learnable_init_states=True is not supported (a bidirectional scan has no initial state)")
        self.d_model, self.d_state, self.d_conv, self.expand = d_model, d_state, d_conv, expand
        self.headdim, self.ngroups, self.nheads, self.d_inner = headdim, ngroups, nheads, d_inner
        self.dt_limit = (float(dt_limit[0]), float(dt_limit[1]))
        self.chunk_size, self.layer_idx, self.backend = chunk_size, layer_idx, backend
        self.use_mem_eff_path = use_mem_eff_path  # accepted for Hydra compatibility; no effect

        conv_dim = d_inner + 2 * ngroups * d_state
        self.in_proj = nn.Linear(d_model, 2 * d_inner + 2 * ngroups * d_state + nheads, bias=bias, **fk)
        self.conv1d = nn.Conv1d(conv_dim, conv_dim, d_conv, groups=conv_dim, padding=d_conv // 2, bias=conv_bias, **fk)
        if conv_init is not None:
            nn.init.uniform_(self.conv1d.weight, -conv_init, conv_init)
        self.dt_bias = nn.Parameter(init_dt_bias(nheads, dt_min, dt_max, dt_init_floor, device=device, dtype=dtype))
        self.A_log = nn.Parameter(init_A_log(nheads, A_init_range, device=device, dtype=dtype))
        self.D = nn.Parameter(torch.ones(nheads, device=device, dtype=dtype))
        for p in (self.dt_bias, self.A_log, self.D):
            p._no_weight_decay = True
        self.norm = RMSNormGated(d_inner, eps=1e-5, norm_before_gate=False, **fk)
        self.out_proj = nn.Linear(d_inner, d_model, bias=bias, **fk)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        if u.dim() != 3 or u.shape[-1] != self.d_model:
            raise ValueError(f"BiMamba2: input must have shape (batch, seqlen, {self.d_model}), got {tuple(u.shape)}")
        if graph_tracing():
            return self._forward_graph(u)
        b, l, _ = u.shape
        gn = self.ngroups * self.d_state
        z, xbc, dt = torch.split(self.in_proj(u), [self.d_inner, self.d_inner + 2 * gn, self.nheads], dim=-1)
        xbc = dwconv_silu(xbc, self.conv1d.weight, self.conv1d.bias, backend=self.backend)  # fused on CUDA
        x, B, C = torch.split(xbc, [self.d_inner, gn, gn], dim=-1)
        A = self._A()
        y = mixer_bi_ssd(  # (the scan in bf16 under fp16 AMP on CUDA: ops.bi_ssd.api.mixer_scan_dtype)
            x.reshape(b, l, self.nheads, self.headdim), dt, A,
            B.reshape(b, l, self.ngroups, self.d_state), C.reshape(b, l, self.ngroups, self.d_state),
            chunk_size=self.chunk_size, D=self.D, dt_bias=self.dt_bias, dt_softplus=True,
            dt_limit=self.dt_limit, backend=self.backend,
        )
        y = self.norm(y.reshape(b, l, self.d_inner), z)
        return self.out_proj(y)

    def _A(self) -> torch.Tensor:
        """A = -exp(A_log) in fp32, A_log clamped to A_LOG_MAX (both forward forms)."""
        return -torch.exp(self.A_log.float().clamp(max=A_LOG_MAX))

    def _forward_graph(self, u: torch.Tensor) -> torch.Tensor:
        """The same function as plain-op graphs traced for a file hold it (ONNX, TorchScript: graph_tracing; under
        torch.compile and torch.export the forward above runs, with our custom ops): the
        in-projection's row blocks as separate products, x, B and C in the channels-first layout (b, c, l) that the
        depthwise conv takes, each convolved on its own (same weights), and the chunked op fed that layout. An
        exported graph then has no Split copies of the projection and no transposes around the conv: onnxruntime
        spent 1.1 of the 6.8 ms of yolov8n-bimamba's P3 mixer (L 6400) on them (2 CPU threads)."""
        w, wb = self.in_proj.weight, self.in_proj.bias
        cw, cb = self.conv1d.weight, self.conv1d.bias
        di, gn = self.d_inner, self.ngroups * self.d_state
        rows = lambda lo, hi: (w[lo:hi], None if wb is None else wb[lo:hi])  # noqa: E731
        z = F.linear(u, *rows(0, di))
        dt = F.linear(u, *rows(2 * di + 2 * gn, 2 * di + 2 * gn + self.nheads))
        ut = u.transpose(1, 2)  # (b, d_model, l): d_model channels, fewer than the conv's

        def conv(lo, hi):  # rows [lo, hi) of the conv's input, projected and convolved channels-first
            pw, pb = rows(di + lo, di + hi)
            t = torch.matmul(pw, ut) if pb is None else torch.matmul(pw, ut) + pb[:, None]
            return dwconv_silu_channels_first(t, cw[lo:hi], None if cb is None else cb[lo:hi])

        A = self._A()
        y = bi_ssd_torch_channels_first(
            conv(0, di), dt, A, conv(di, di + gn), conv(di + gn, di + 2 * gn), ngroups=self.ngroups,
            chunk_size=self.chunk_size, D=self.D, dt_bias=self.dt_bias, dt_softplus=True, dt_limit=self.dt_limit,
        )
        y = self.norm(y.reshape(*y.shape[:2], di), z)
        return self.out_proj(y)
