"""The public op ``bi_ssd``: the arguments validated once, the backend chosen once, then called.

Backends: the chunked PyTorch op (:mod:`.torch_backend`: any device, any size, exportable) and the fused Triton
kernels (:mod:`.autograd`: CUDA tensors, or CPU tensors under the Triton interpreter). ``backend="auto"`` takes the
kernels for CUDA tensors unless a plain-op graph is traced for a file (TorchScript, ONNX), Triton is missing, or the
sizes are beyond what the kernels take (:func:`triton_dims_supported`). Under torch.compile and torch.export the
chosen backend runs as the custom op of :mod:`.library`. The mixers (BiMamba2, Hydra) call :func:`mixer_bi_ssd`,
which makes one more choice with the same decision: under fp16 AMP the kernels run in bf16 (:func:`mixer_scan_dtype`).

Every check runs on shapes, dtypes and devices only (no device synchronisation), before any kernel launch, and
raises ``ValueError`` naming the argument and the expected shape.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from ... import config
from ..backend_choice import compiling, graph_tracing, triton_usable
from .torch_backend import bi_ssd_torch

DIRECTIONS = ("both", "forward", "backward")
BACKENDS = ("auto", "torch", "triton")


@dataclass(frozen=True)
class SSDShape:
    batch: int
    seqlen: int
    nheads: int
    headdim: int
    ngroups: int
    dstate: int


def _shape(t: torch.Tensor) -> tuple:
    return tuple(t.shape)


def _check_float(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"bi_ssd: argument '{name}' must be a torch.Tensor, got {type(t).__name__}")
    if not t.dtype.is_floating_point:
        raise ValueError(
            f"bi_ssd: argument '{name}' must be a floating-point tensor (float16, bfloat16, float32 or "
            f"float64), got dtype {t.dtype}"
        )


def kernel_tile(v: int) -> int:
    """The Triton kernels' tile for a headdim or d_state of v: the next power of two, at least 16 (tl.dot's minimum)."""
    return max(16, 1 << (int(v) - 1).bit_length())


def triton_dims_supported(headdim: int, dstate: int, dtype: torch.dtype) -> bool:
    """Whether the Triton kernels take this headdim and d_state for inputs of this dtype. They tile both in powers of
    two (at least 16), and the backward holds whole d_state x headdim tiles in shared memory, of which a Hopper block
    has 227 KB. Measured with triton.compile for sm_90 (tests/test_compile_sm90.py), the backward needs:
    16-bit inputs 139-164 KB at 64 x 256 and 256 x 64, 254-295 KB at 128 x 256 and 256 x 128, 475 KB at 256 x 256;
    fp32 246 KB at 64 x 256 (128 x 128 fits); fp64 131-172 KB at 64 x 128 and 128 x 64, 270 KB at 128 x 128."""
    big, small = max(kernel_tile(headdim), kernel_tile(dstate)), min(kernel_tile(headdim), kernel_tile(dstate))
    size = dtype.itemsize
    if size <= 2:
        return big <= 128 or (big <= 256 and small <= 64)
    if size == 4:
        return big <= 128
    return big <= 128 and small <= 64


def validate_bi_ssd(
    x, dt, A, B, C, *, chunk_size, D, dt_bias, dt_limit, direction, shift, dt_bwd, B_bwd, C_bwd, backend
) -> SSDShape:
    """Check every argument of ``bi_ssd``; return the problem sizes."""
    for name, t in (("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C)):
        _check_float(name, t)
    if x.dim() != 4:
        raise ValueError(
            f"bi_ssd: argument 'x' must have shape (batch, seqlen, nheads, headdim), got {_shape(x)}"
        )
    b, l, h, p = x.shape
    if l == 0:
        raise ValueError(f"bi_ssd: argument 'x' has seqlen 0 (shape {_shape(x)}); seqlen must be >= 1")
    if b == 0 or h == 0 or p == 0:
        raise ValueError(f"bi_ssd: argument 'x' has an empty dimension (shape {_shape(x)})")
    if _shape(dt) != (b, l, h):
        raise ValueError(f"bi_ssd: argument 'dt' must have shape (batch, seqlen, nheads) = {(b, l, h)}, got {_shape(dt)}")
    if _shape(A) != (h,):
        raise ValueError(f"bi_ssd: argument 'A' must have shape (nheads,) = {(h,)}, got {_shape(A)}")
    if B.dim() != 4 or B.shape[0] != b or B.shape[1] != l:
        raise ValueError(
            f"bi_ssd: argument 'B' must have shape (batch, seqlen, ngroups, d_state) = ({b}, {l}, ngroups, d_state), "
            f"got {_shape(B)}"
        )
    g, n = B.shape[2], B.shape[3]
    if g == 0 or n == 0 or h % g != 0:
        raise ValueError(
            f"bi_ssd: argument 'B' has ngroups={g} (shape {_shape(B)}); ngroups must be >= 1 and divide nheads={h}"
        )
    if _shape(C) != (b, l, g, n):
        raise ValueError(f"bi_ssd: argument 'C' must have the shape of B, (batch, seqlen, ngroups, d_state) = {(b, l, g, n)}, got {_shape(C)}")
    if D is not None:
        _check_float("D", D)
        if _shape(D) not in ((h,), (h, p)):
            raise ValueError(f"bi_ssd: argument 'D' must have shape (nheads,) = {(h,)} or (nheads, headdim) = {(h, p)}, got {_shape(D)}")
    if dt_bias is not None:
        _check_float("dt_bias", dt_bias)
        if _shape(dt_bias) != (h,):
            raise ValueError(f"bi_ssd: argument 'dt_bias' must have shape (nheads,) = {(h,)}, got {_shape(dt_bias)}")
    bwd = {"dt_bwd": dt_bwd, "B_bwd": B_bwd, "C_bwd": C_bwd}
    given = [k for k, v in bwd.items() if v is not None]
    if given and len(given) != 3:
        missing = [k for k in bwd if k not in given]
        raise ValueError(
            f"bi_ssd: arguments dt_bwd, B_bwd and C_bwd go together; got {', '.join(given)} without {', '.join(missing)}"
        )
    if given:
        expected = {"dt_bwd": (b, l, h), "B_bwd": (b, l, g, n), "C_bwd": (b, l, g, n)}
        for k, v in bwd.items():
            _check_float(k, v)
            if _shape(v) != expected[k]:
                raise ValueError(f"bi_ssd: argument '{k}' must have shape {expected[k]} (like the forward one), got {_shape(v)}")
        if direction != "both":
            raise ValueError(f"bi_ssd: dt_bwd/B_bwd/C_bwd need direction='both', got direction={direction!r}")
    if direction not in DIRECTIONS:
        raise ValueError(f"bi_ssd: argument 'direction' must be one of {DIRECTIONS}, got {direction!r}")
    if backend not in BACKENDS:
        raise ValueError(f"bi_ssd: argument 'backend' must be one of {BACKENDS}, got {backend!r}")
    if not isinstance(shift, bool):
        raise ValueError(f"bi_ssd: argument 'shift' must be a bool, got {shift!r}")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"bi_ssd: argument 'chunk_size' must be a positive int, got {chunk_size!r}")
    try:
        lo, hi = float(dt_limit[0]), float(dt_limit[1])
    except Exception as exc:  # noqa: BLE001 - re-raised with the argument's name
        raise ValueError(f"bi_ssd: argument 'dt_limit' must be a pair (min, max), got {dt_limit!r}") from exc
    if not (lo >= 0.0 and hi >= lo) or math.isnan(hi):
        raise ValueError(f"bi_ssd: argument 'dt_limit' must satisfy 0 <= min <= max, got {dt_limit!r}")
    if backend == "triton" and not triton_dims_supported(p, n, x.dtype):
        raise ValueError(
            f"bi_ssd: backend='triton' takes headdim (x.shape[3]) and d_state (B.shape[3]) up to 128 each (16-bit "
            f"inputs also 256 with the other at most 64; float64 128 with the other at most 64), got headdim {p}, "
            f"d_state {n} with {x.dtype} inputs; use backend='torch' ('auto' falls back to it)"
        )
    dev = x.device
    for name, t in (("dt", dt), ("A", A), ("B", B), ("C", C), ("D", D), ("dt_bias", dt_bias), *bwd.items()):
        if t is not None and t.device != dev:
            raise ValueError(f"bi_ssd: argument '{name}' is on {t.device} but 'x' is on {dev}; all tensors must share one device")
    return SSDShape(b, l, h, p, g, n)


def auto_picks_triton(headdim: int, dstate: int, dtype: torch.dtype) -> bool:
    """backend="auto" on CUDA tensors: the Triton kernels unless a plain-op graph is traced for a file (TorchScript,
    ONNX; under torch.compile and torch.export they run, through the custom op of library.py), Triton is missing, or
    the sizes are beyond what the kernels take (then the PyTorch op, which takes any size)."""
    return triton_usable(f"{__package__}.autograd") and triton_dims_supported(headdim, dstate, dtype)


def _runs_triton(x: torch.Tensor, headdim: int, dstate: int, backend: str) -> bool:
    """The backend decision of a validated call: the Triton kernels (True) or the PyTorch op (False)."""
    return backend == "triton" or (backend == "auto" and x.is_cuda and auto_picks_triton(headdim, dstate, x.dtype))


# The mixers (BiMamba2, Hydra) run the Triton kernels in bf16 when their inputs are fp16 (fp16 AMP, Ultralytics'
# default amp=True) on a GPU with bf16 tensor cores (config.FP16_SCAN "bf16", the default): the kernels' fp16 path needs
# tf32x3 state dots and fp32 buffers, and takes 1.5-1.8x the GPU time of the bf16 path. "fp16" keeps fp16 scans.
@functools.lru_cache(maxsize=None)
def _bf16_tensor_cores(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 8


@torch.compiler.assume_constant_result
def _has_bf16_tensor_cores(device_index: int) -> bool:
    # (a constant for Dynamo: called once while it traces, not traced itself)
    return _bf16_tensor_cores(device_index)


def _scan_dtype(x: torch.Tensor, triton: bool) -> torch.dtype:
    """The dtype a mixer's scan runs in, given the backend decision (see :func:`mixer_scan_dtype`)."""
    if not triton or x.dtype is not torch.float16 or not x.is_cuda or config.FP16_SCAN != "bf16" or graph_tracing():
        return x.dtype
    dev = x.device.index if x.device.index is not None else torch.cuda.current_device()
    return torch.bfloat16 if _has_bf16_tensor_cores(dev) else x.dtype


def mixer_scan_dtype(x: torch.Tensor, headdim: int, dstate: int, backend: str = "auto") -> torch.dtype:
    """The dtype in which a mixer runs the scan of its inputs x (YOLO_BIMAMBA_FP16_SCAN, config.FP16_SCAN): x's own,
    except fp16 CUDA inputs that the Triton kernels take, on a GPU with bf16 tensor cores: bf16 (the same exponent
    range as fp32, so an fp16 value or loss-scaled gradient never overflows there; 8 instead of 11 significant bits,
    as in bf16 AMP). Never while a plain-op graph is traced for a file (the scan then runs the PyTorch op, in x's
    dtype)."""
    return _scan_dtype(x, _runs_triton(x, headdim, dstate, backend))


def bi_ssd(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    chunk_size: int = 64,
    D: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    direction: str = "both",
    shift: bool = False,
    dt_bwd: torch.Tensor | None = None,
    B_bwd: torch.Tensor | None = None,
    C_bwd: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Bidirectional SSD: ``y = SS(x) + flip(SS(flip(x))) + D * x``.

    Shapes: x (b, l, h, p); dt (b, l, h); A (h,); B, C (b, l, g, n) with g dividing h;
    D (h,) or (h, p); dt_bias (h,). Returns y shaped like x, in x's dtype.

    dt is shifted by dt_bias, passed through softplus when ``dt_softplus``, then clamped to
    ``dt_limit`` (default [0, inf): negative step sizes are zeroed). A is clamped to <= 0, so
    every decay exp(dt * A) lies in [0, 1]. With a_k = exp(dt_k A):

    * forward:  M_f[t, s] = (C_t . B_s) dt_s prod_{k=s+1..t} a_k, s <= t
    * backward: M_b[t, s] = (C_t . B_s) dt_s prod_{k=t..s-1} a_k, s >= t
    * ``direction`` picks "both" (default), "forward" (Mamba2's causal SSD) or "backward".
    * ``shift=True`` (Hydra): each direction's output moves one step away from the diagonal,
      and the backward direction may have its own ``dt_bwd``, ``B_bwd``, ``C_bwd``.

    ``backend``: "torch" (chunked PyTorch, any device, exportable), "triton" (fused kernels),
    or "auto" (Triton on CUDA tensors when available and the sizes fit the kernels, see
    :func:`triton_dims_supported`; PyTorch otherwise).
    """
    return _call(x, dt, A, B, C, dict(
        chunk_size=chunk_size, D=D, dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=dt_limit, direction=direction,
        shift=shift, dt_bwd=dt_bwd, B_bwd=B_bwd, C_bwd=C_bwd), backend, mixer=False)


def mixer_bi_ssd(x, dt, A, B, C, *, backend: str = "auto", **kwargs) -> torch.Tensor:
    """:func:`bi_ssd` (the same keyword arguments) as the mixers run it: where the Triton kernels run fp16 inputs on a
    GPU with bf16 tensor cores (fp16 AMP), x, B, C (and B_bwd, C_bwd) go in as bf16 (:func:`mixer_scan_dtype`) and
    the result stays bf16: a scan with little decay sums up to L tokens, and in fp16 AMP training its output passed
    fp16's 65504 and became inf (then NaN in the gated norm) for 2 of 42 runs of the quality benchmark on an H100; the
    mixers' gated norm that follows is scale-invariant and computes in fp32. Otherwise the result is in x's dtype."""
    unknown = sorted(set(kwargs) - set(_DEFAULTS))
    if unknown:
        raise TypeError(f"mixer_bi_ssd: unexpected keyword arguments {unknown}")
    return _call(x, dt, A, B, C, {**_DEFAULTS, **kwargs}, backend, mixer=True)


# bi_ssd's keyword arguments besides backend, with their defaults
_DEFAULTS = dict(chunk_size=64, D=None, dt_bias=None, dt_softplus=False, dt_limit=(0.0, float("inf")), direction="both",
                 shift=False, dt_bwd=None, B_bwd=None, C_bwd=None)


def _call(x, dt, A, B, C, kw, backend, mixer):
    """Validate once, choose the backend once (and, for a mixer, the scan dtype), call it."""
    shape = validate_bi_ssd(x, dt, A, B, C, backend=backend, **{k: v for k, v in kw.items() if k != "dt_softplus"})
    triton = _runs_triton(x, shape.headdim, shape.dstate, backend)
    if compiling():  # torch.compile / torch.export: the custom op (library.py), running the backend chosen here
        from .library import call

        run = functools.partial(call, backend="triton" if triton else "torch")
    elif not triton:
        return bi_ssd_torch(x, dt, A, B, C, **kw)
    else:
        from .autograd import bi_ssd_triton  # (imports Triton)

        run = functools.partial(bi_ssd_triton, validate=False)  # validated above
    sd = _scan_dtype(x, True) if mixer and triton else x.dtype
    if sd == x.dtype:
        return run(x, dt, A, B, C, **kw)
    cast = lambda t: None if t is None else t.to(sd)  # noqa: E731
    kw = dict(kw, B_bwd=cast(kw.get("B_bwd")), C_bwd=cast(kw.get("C_bwd")))
    return run(x.to(sd), dt, A, cast(B), cast(C), **kw)  # (in sd: mixer_bi_ssd's docstring says why)
