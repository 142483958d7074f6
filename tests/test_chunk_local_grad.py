"""The log-decay gradient formulas of benchmarks/chunk_local_grad_study.py (the design study for bf16 state dots in
the backward): in float64 the chunk-local, the telescoped and the segment-local sums equal autograd through the
package's PyTorch op, for every input case of the study, so the study compares roundings of one correct quantity."""
from __future__ import annotations

import pytest
import torch

import benchmark_script  # tests/benchmark_script.py

study = benchmark_script.load("chunk_local_grad_study")


@pytest.mark.parametrize("case", study.CASES)
def test_both_sums_equal_autograd_in_float64(case):
    L, heads = 10 * study.Q, 3
    inp = study.inputs(L, heads, case, seed=3)
    for h in range(heads):
        args = (inp["x"][:, h], inp["dt"][:, h], inp["A"][h].item(), inp["B"], inp["C"], inp["dy"][:, h])
        G_loc, dA_loc = study.grads(*args, "exact", "local")
        G_tel, dA_tel = study.grads(*args, "exact", "telescoped")
        ref = study.autograd_dA(inp, h)
        assert abs(dA_loc.item() - ref) <= 1e-9 * max(1.0, abs(ref)), (case, h, dA_loc.item(), ref)
        assert abs(dA_tel.item() - ref) <= 1e-9 * max(1.0, abs(ref)), (case, h, dA_tel.item(), ref)
        assert study.rel(G_tel, G_loc) < 1e-10
        G_seg, dA_seg = study.grads(*args, "exact", "segment", seg_rows=2 * study.Q)
        assert abs(dA_seg.item() - ref) <= 1e-9 * max(1.0, abs(ref)), (case, h, dA_seg.item(), ref)
        assert study.rel(G_seg, G_loc) < 1e-10
        # one emulated plain-bf16 variant: finite, and not the exact value (the rounding is applied)
        G1, dA1 = study.grads(*args, 1, "local")
        assert torch.isfinite(G1).all() and 0 < study.rel(G1, G_loc) < 1e-2


def test_bf16_parts_converge_to_the_fp32_value():
    v = torch.randn(1000, dtype=torch.float64) * torch.logspace(-20, 20, 1000, dtype=torch.float64)
    v32 = v.to(torch.float32).to(torch.float64)
    errs = [float(((study.bf16_parts(v, k) - v32).abs() / v32.abs()).max()) for k in (1, 2, 3)]
    assert errs[0] <= 2.0 ** -8 and errs[1] <= 2.0 ** -16 and errs[2] <= 2.0 ** -23
    assert errs[0] > errs[1] > errs[2] >= 0
    assert study.bf16_parts(v, "exact") is v
