"""benchmarks/ordered_head_sum_study.py: the head-ordered sum of per-head rows (a design study for the op's memory).
Under the Triton interpreter both schemes equal the float64 reference (a length that is not a multiple of the chunk
or the segment, three heads, two batches), the ordered one is bitwise repeatable and counts every head's addition;
and both variants of the kernel compile to an sm_90 cubin whose ordered variant holds the acquire / release
atomics. The interpreter runs programs one after another: only a GPU run contends the waits (the script's main)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import benchmark_script  # tests/benchmark_script.py

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "benchmarks" / "ordered_head_sum_study.py"
study = benchmark_script.load("ordered_head_sum_study")

SEG, Q = 32, 16  # segments of two chunks; L = 150: the last segment 22 rows, its last chunk 6


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="CPU check under the interpreter")
@pytest.mark.parametrize("ordered", [True, False])
def test_head_sums_match_float64(ordered):
    x, s = study.make_inputs(2, 150, 3, 16, 16)
    ref = study.reference(x, s, SEG, block_q=Q)
    out, cnt = study.group_sum(x, s, SEG, ordered, block_q=Q, dot="ieee", ph_dtype=torch.float32)
    assert torch.isfinite(out).all()
    assert float((out.double() - ref).norm() / ref.norm()) <= 1e-6
    if ordered:
        assert (cnt == 3).all()  # every (pass, batch, chunk) counted the three heads' additions
        again, _ = study.group_sum(x, s, SEG, ordered, block_q=Q, dot="ieee")
        assert torch.equal(out, again)


_COMPILE = r"""
import importlib.util, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
spec = importlib.util.spec_from_file_location("st", sys.argv[1])
st = importlib.util.module_from_spec(spec); spec.loader.exec_module(st)
sig = dict(x_ptr="*bf16", s_ptr="*bf16", ph_ptr="*fp32", acc_ptr="*fp32", cnt_ptr="*i32", ticket_ptr="*i32", L="i32",
           B="i32", H="i32", SEG="i32", NCH="i32", P="constexpr", N="constexpr", BLOCK_Q="constexpr",
           WORK="constexpr", ORDERED="constexpr", DOT="constexpr")
for ordered in (True, False):
    ck = triton.compile(ASTSource(st._study_kernel, sig, dict(P=64, N=64, BLOCK_Q=64, WORK=2, ORDERED=ordered,
                                                              DOT="tf32")),
                        target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    ptx = ck.asm["ptx"]
    print(ordered, len(ck.asm["cubin"]), sorted(set(re.findall(r"atom\.global\.[a-z0-9.]+", ptx))))
"""


def test_study_kernel_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", _COMPILE, str(STUDY)], capture_output=True, text=True, env=env,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.strip().splitlines())
    ordered, plain = lines["True"], lines["False"]
    assert int(ordered.split()[0]) > 0 and int(plain.split()[0]) > 0  # cubin bytes
    assert "acq" in ordered and "release" in ordered and "[]" in plain
