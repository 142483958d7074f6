"""The bf16 rounding and three-part split the kernels' dots use (kernels_common._round_bf16, _split_bf16), run as a
small Triton kernel: on the CPU under the interpreter (tests/test_tf32_precision.py, where the bf16 values are emulated
in fp32) and on a GPU with the real bf16 bit operations (tests/gpu/test_gpu_kernels.py)."""
import torch
import triton
import triton.language as tl

from yolo_bimamba.ops.bi_ssd.kernels_common import _round_bf16, _split_bf16


@triton.jit
def _bf16_kernel(v_ptr, r_ptr, hi_ptr, mid_ptr, lo_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(v_ptr + offs, mask=m, other=0.0)
    tl.store(r_ptr + offs, _round_bf16(v).to(tl.float32), mask=m)
    hi, mid, lo = _split_bf16(v)
    tl.store(hi_ptr + offs, hi.to(tl.float32), mask=m)
    tl.store(mid_ptr + offs, mid.to(tl.float32), mask=m)
    tl.store(lo_ptr + offs, lo.to(tl.float32), mask=m)


def bf16_split_case(device="cpu"):
    """Random values over 60 decades and edge cases through _bf16_kernel (also run on a GPU by the GPU suite):
    returns (v, rounded, hi, mid, lo)."""
    gen = torch.Generator().manual_seed(0)
    one_ulp = 2.0 ** -7
    v = torch.cat([
        torch.randn(3000, generator=gen) * torch.logspace(-30, 30, 3000),
        torch.tensor([1.0 + one_ulp / 2, 1.0 + 3 * one_ulp / 2, -(1.0 + one_ulp / 2), 3.0e38, -0.0, 1e-40,
                      1.0 + 2.0 ** -23, -(1.0 - 2.0 ** -24)]),
    ]).float().to(device)
    outs = [torch.empty_like(v) for _ in range(4)]
    _bf16_kernel[(1,)](v, *outs, v.numel(), BLOCK=4096)
    return (v, *outs)


def check_bf16_split(v, r, hi, mid, lo):
    """What the kernels rely on, exactly; values near the fp32 minimum (subnormal parts: a GPU may flush them) are
    held to the bit operations only."""
    normal = v.abs() > 1e-30
    assert torch.equal(r[normal], v.bfloat16().float()[normal])  # round to nearest even, as the GPU's cvt.rn.bf16
    # the split: hi is v truncated to bf16 (its top 16 bits), mid the same of v - hi, lo the rest; all bf16 values,
    # and their sum is v exactly
    trunc = lambda t: (t.view(torch.int32) & -65536).view(torch.float32)  # noqa: E731
    assert torch.equal(hi, trunc(v))
    v, hi, mid, lo = (t[normal] for t in (v, hi, mid, lo))
    assert torch.equal(mid, trunc(v - hi)) and torch.equal(lo, v - hi - mid)
    for part in (hi, mid, lo):
        assert torch.equal(part, part.bfloat16().float())
    assert torch.equal(hi + mid + lo, v)
    assert ((mid.abs() <= 2.0 ** -7 * v.abs()) & (lo.abs() <= 2.0 ** -15 * v.abs())).all()
