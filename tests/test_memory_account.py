"""benchmarks/memory_account.py, the GPU-free accounting of the Triton op's peak memory: with every launch mocked on
the meta device it must record the same buffers, in the same order and with the same peak, as a real run of the
kernels (Triton interpreter, CPU), and it must single out the per-head dB, dC buffers only where there are any."""
from __future__ import annotations

import os

import pytest
import torch

import benchmark_script  # tests/benchmark_script.py

memory_account = benchmark_script.load("memory_account")

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="CPU check under the interpreter")

# three segments of SEG_MULTIPLE rows at 4 SMs (the interpreter's count): the boundary states are allocated too
SHAPE = dict(b=1, l=150, h=2, p=16, g=1, n=16)


def _record(res):
    return [(b["shape"], b["dtype"], b["line"], b["per_head_grad"]) for b in res["buffers"]]


@pytest.mark.parametrize("g", [1, 2])
def test_mocked_launches_allocate_what_a_real_run_allocates(g):
    shape = dict(SHAPE, g=g)
    real = memory_account.account(shape, torch.float32, device="cpu")
    mocked = memory_account.account(shape, torch.float32, device="meta", sms=4)
    assert _record(mocked) == _record(real)
    assert mocked["peak_mb"] == real["peak_mb"] > 0
    assert any(len(b["shape"]) == 5 for b in real["buffers"]), "no boundary states: the shape has one segment"
    per_head = [b for b in real["buffers"] if b["per_head_grad"]]
    if g < shape["h"]:
        assert [b["shape"] for b in per_head] == [[1, 150, 2, 16]] * 2
        assert mocked["mem_ratio_without_per_head_grads"] < mocked["mem_ratio"]
    else:
        assert not per_head and mocked["mem_ratio_without_per_head_grads"] == mocked["mem_ratio"]
