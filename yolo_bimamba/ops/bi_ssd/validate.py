"""Input validation shared by every backend of :func:`yolo_bimamba.ops.bi_ssd`.

Every check runs on shapes, dtypes and devices only (no device synchronisation), before any
kernel launch, and raises ``ValueError`` naming the argument and the expected shape.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

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
