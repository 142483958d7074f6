"""The buffers of the Triton-backed ops: the kernels' arithmetic and accumulation dtypes, and the allocator of their
output and gradient buffers with its NaN-poisoning test hook (unwritten elements and writes out of bounds show)."""
from __future__ import annotations

import contextlib
import math

import torch

from .. import config


def compute_dtype(dtype: torch.dtype):
    """The kernels' arithmetic type: fp64 for fp64 inputs (tests against float64), else fp32."""
    import triton.language as tl

    return tl.float64 if dtype == torch.float64 else tl.float32


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """compute_dtype as a torch dtype: that of the kernels' fp32 (fp64 for fp64 inputs) buffers and statistics."""
    return torch.float64 if dtype == torch.float64 else torch.float32


# test hook: allocate every output / gradient buffer filled with NaN so unwritten elements show
_POISON = config.POISON


@contextlib.contextmanager
def poison_outputs(enabled: bool = True):
    """Test hook: fill every output and gradient buffer with NaN before the kernels run."""
    global _POISON
    old = _POISON
    _POISON = enabled
    try:
        yield
    finally:
        _POISON = old


_GUARD = 64  # NaN elements before and after each poisoned buffer
_guarded: list = []


def alloc(shape, dtype, device):
    """An output or gradient buffer of a kernel (torch.empty; NaN-filled inside guard regions under poison_outputs)."""
    if _POISON:
        numel = math.prod(shape)
        buf = torch.full((numel + 2 * _GUARD,), float("nan"), dtype=dtype, device=device)
        _guarded.append((buf, numel))
        return buf[_GUARD:_GUARD + numel].view(shape)
    return torch.empty(shape, dtype=dtype, device=device)


def check_guards() -> bool:
    """Test hook: True when the NaN guard regions around every poisoned buffer allocated since the
    last call are intact (no kernel wrote outside its outputs). Forgets those buffers."""
    ok = True
    for buf, numel in _guarded:
        ok = ok and bool(torch.isnan(buf[:_GUARD]).all()) and bool(torch.isnan(buf[_GUARD + numel:]).all())
    _guarded.clear()
    return ok
