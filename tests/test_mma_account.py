"""benchmarks/mma_account.py, the tensor-core work of the Triton op counted from its kernels under the interpreter: the
counts must be the dots the kernels run (checked against a hand count from the kernels' loops and tiles), at the
precision each runs at on a GPU (split-bf16 dots three passes), and scaling a batch-1 count by the batch, or a
one-segment count by the rows, must give what a full run counts."""
from __future__ import annotations

import os
from unittest import mock

import pytest
import torch

import benchmark_script  # tests/benchmark_script.py

mma_account = benchmark_script.load("mma_account")

from yolo_bimamba.ops.bi_ssd import tuning  # noqa: E402
from yolo_bimamba.ops.bi_ssd.tuning import FWD_CONFIGS, STATE_CONFIGS  # noqa: E402
from yolo_bimamba.ops.bi_ssd.api import kernel_tile  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="CPU check under the interpreter")

# L not a multiple of any chunk; headdim and d_state tiles of different sizes
SHAPE = dict(b=2, l=150, h=2, p=32, g=1, n=16)


def _cdiv(a, b):
    return -(-a // b)


def test_forward_dots_match_a_hand_count():
    # one SM: one segment, so no state kernel; the forward alone, one direction
    r = mma_account.count(SHAPE, "forward", torch.bfloat16, sms=1, grad=False)
    cfg = FWD_CONFIGS[tuning.default_config("fwd", dict(P=SHAPE["p"], N=SHAPE["n"]))]
    q, bp, bn = cfg.kwargs["BLOCK_Q"], cfg.kwargs["BLOCK_P"], kernel_tile(SHAPE["n"])
    programs = SHAPE["b"] * SHAPE["h"] * _cdiv(SHAPE["p"], bp)
    chunks = _cdiv(SHAPE["l"], q)
    assert r["nseg"] == 1
    assert set(r["kernels"]) == {"_bi_ssd_fwd_kernel", "_bi_ssd_fwd_pairs_kernel"}
    # per chunk: the read-out C S and the state update B^T x, plain tl.dot on fp32 values (tf32 on a GPU)
    assert r["kernels"]["_bi_ssd_fwd_kernel"]["macs"] == {"tf32": programs * chunks * 2 * q * bn * bp}
    # per chunk: C B^T, then its product with x (one head per program below d_state 128)
    assert r["kernels"]["_bi_ssd_fwd_pairs_kernel"]["macs"] == {"tf32": programs * chunks * (q * bn * q + q * q * bp)}


def test_forward_pairs_grouped_count_one_cb_per_program():
    # d_state 128: the forward pairs kernel computes C B^T once per program, a block of a group's heads as the full
    # call on one SM cuts them (here the whole group of four), then its product with x per head
    shape = dict(SHAPE, h=4, n=128)
    r = mma_account.count(shape, "forward", torch.bfloat16, sms=1, grad=False)
    cfg = FWD_CONFIGS[tuning.default_config("fwd", dict(P=shape["p"], N=shape["n"]))]
    q, bp, bn = cfg.kwargs["BLOCK_Q"], cfg.kwargs["BLOCK_P"], kernel_tile(shape["n"])
    chunks, pblocks, r_heads = _cdiv(shape["l"], q), _cdiv(shape["p"], bp), shape["h"] // shape["g"]
    with mock.patch.object(tuning, "sm_count", lambda device: 1):
        heads = tuning.fwd_pairs_heads(shape["b"], shape["g"], r_heads, pblocks * chunks, shape["n"],
                                          torch.device("cpu"))
    assert heads == 4
    pair_programs = shape["b"] * shape["g"] * _cdiv(r_heads, heads) * pblocks
    assert r["kernels"]["_bi_ssd_fwd_pairs_kernel"]["macs"] == {
        "tf32": pair_programs * chunks * q * bn * q + shape["b"] * shape["h"] * pblocks * chunks * q * q * bp}
    assert r["floor_ms"] == pytest.approx(2 * r["macs"]["tf32"] / mma_account.PEAK["tf32"] * 1e3)


def test_state_dots_count_three_bf16_passes():
    # four SMs: two segments of 128 rows; the forward's boundary states at the backward's precision (the inputs
    # require grad), which for bf16 inputs is a dot split into three bf16 parts
    r = mma_account.count(SHAPE, "both", torch.bfloat16, sms=4, grad=False)
    seg, nseg = r["seg_rows"], r["nseg"]
    assert (seg, nseg) == (128, 2)
    cfg = STATE_CONFIGS[tuning.default_config("state", dict(P=SHAPE["p"], N=SHAPE["n"]))]
    q, bp, bn = cfg.kwargs["BLOCK_Q"], cfg.kwargs["BLOCK_P"], kernel_tile(SHAPE["n"])
    walk_f = (nseg - 1) * (seg // q)  # S_f: the chunks of every segment but the last
    walk_b = _cdiv(SHAPE["l"], q) - seg // q  # S_b: every segment but the first
    programs = SHAPE["b"] * SHAPE["h"] * _cdiv(SHAPE["p"], bp)
    assert r["kernels"]["_bi_ssd_state_kernel"]["macs"] == {"bf16": programs * (walk_f + walk_b) * bn * q * bp * 3}
    # the fp32 policy: one tf32x3 dot, three tf32 passes
    r32 = mma_account.count(SHAPE, "both", torch.float32, sms=4, grad=False)
    assert r32["kernels"]["_bi_ssd_state_kernel"]["macs"] == {"tf32": programs * (walk_f + walk_b) * bn * q * bp * 3}


def test_both_directions_share_the_in_chunk_pairs():
    both = mma_account.count(SHAPE, "both", torch.bfloat16, sms=4)
    one = mma_account.count(SHAPE, "forward", torch.bfloat16, sms=4)
    for k in ("_bi_ssd_fwd_pairs_kernel", "_bi_ssd_bwd_pairs_kernel"):
        assert both["kernels"][k]["macs"] == one["kernels"][k]["macs"]
    for k in ("_bi_ssd_fwd_kernel", "_bi_ssd_bwd_kernel", "_bi_ssd_state_kernel"):  # the state terms, per direction
        assert both["kernels"][k]["macs"] == {u: 2 * v for u, v in one["kernels"][k]["macs"].items()}
    assert 1.0 < both["floor_ms"] / one["floor_ms"] < 2.0


def test_batch_and_row_scaling_is_exact():
    # batch: the count at batch 1 times b is what a run at batch b counts
    scaled = mma_account.count(SHAPE, "both", torch.bfloat16, sms=4)
    inp = mma_account.bench_kernels.make_inputs(SHAPE, torch.float32, "cpu", hydra=False)
    full = mma_account.run_counted(inp, "both", mma_account.policy_of(torch.bfloat16), scaled["seg_rows"], True)
    assert {k: v["macs"] for k, v in scaled["kernels"].items()} == {k: dict(v) for k, v in full.macs.items()}
    # rows: a one-segment sequence counted at half its rows, times two
    long = dict(SHAPE, b=1, l=256)
    halves = mma_account.count(long, "both", torch.bfloat16, sms=1, rows=128)
    whole = mma_account.count(long, "both", torch.bfloat16, sms=1, rows=4096)
    assert (halves["counted_rows"], halves["scale"], whole["counted_rows"], whole["scale"]) == (128, 2, 256, 1)
    assert halves["kernels"] == whole["kernels"]
