"""Peak memory of the fused Triton op's fwd+bwd, buffer by buffer, without a GPU.

Every buffer the op allocates comes from ``autograd._alloc``. This script runs the op's autograd function on
PyTorch's meta device with every kernel launch replaced by a no-op, records each buffer (shape, dtype, bytes, the
source line that allocated it) and when it is freed, and reports the peak of the live buffers, and the ratio
benchmarks/bench_kernels.py measures on a GPU: (inputs + peak above the inputs and the upstream gradient) / (inputs
+ output + upstream gradient + input gradients). ``--sms``, the GPU's SM count, sets how many segments the sequence
is cut into, as on that GPU (132: an H200). The figure leaves out the few small tensors torch makes itself (the sums
over the batch of dA, dD, d dt_bias).

    python benchmarks/memory_account.py [--shapes lm_b8_L8192_h32,...] [--sms 132] [--dtype bf16] [--out F.json]

"per-head dB, dC": the backward's dB, dC buffers of one row per head (ngroups < nheads), which the in-chunk pairs
kernel sums over each group's heads; the ratio without them is what summing them inside the kernels would give.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import sys
import traceback
import types
import weakref
from pathlib import Path
from unittest import mock

import torch

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_kernels", ROOT / "benchmarks" / "bench_kernels.py")
bench_kernels = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_kernels)  # also enters the package without Ultralytics where that is missing
from yolo_bimamba.ops.bi_ssd import autograd, tuning  # noqa: E402

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class Recorder:
    """Wraps an allocator: records every buffer, keeps the live bytes and their peak (per-head dB, dC counted
    apart, so that the peak without them is known too)."""

    def __init__(self, alloc, per_head: bool):
        self.alloc, self.per_head = alloc, per_head
        self.buffers, self.live, self.live_other, self.peak, self.peak_other = [], 0, 0, 0, 0

    def __call__(self, shape, dtype, device):
        t = self.alloc(shape, dtype, device)
        caller = traceback.extract_stack(limit=2)[0]
        nbytes = t.numel() * t.element_size()
        # the backward allocates its dB, dC (per head when ngroups < nheads) with the shape named gshape
        per_head = self.per_head and "gshape" in (caller.line or "")
        self.buffers.append(dict(shape=list(shape), dtype=str(dtype).replace("torch.", ""), mb=nbytes / 2**20,
                                 line=caller.lineno, source=(caller.line or "").strip(), per_head_grad=per_head))
        self._add(nbytes, per_head)
        weakref.finalize(t, self._add, -nbytes, per_head)
        return t

    def _add(self, nbytes, per_head):
        self.live += nbytes
        self.live_other += 0 if per_head else nbytes
        self.peak = max(self.peak, self.live)
        self.peak_other = max(self.peak_other, self.live_other)


@contextlib.contextmanager
def launches_mocked(sms: int):
    """Every kernel launch of the op a no-op (returning a config of 64-row chunks), segments cut for ``sms`` SMs."""
    used = types.SimpleNamespace(kwargs={"BLOCK_Q": 64, "BLOCK_P": 64})
    with mock.patch.object(autograd, "_launch", lambda *a, **k: used), \
            mock.patch.object(autograd, "launch", lambda *a, **k: None), \
            mock.patch.object(tuning, "sm_count", lambda device: sms):
        yield


def account(shape: dict, dtype=torch.bfloat16, device="meta", sms: int | None = None) -> dict:
    """One fwd+bwd of ``bi_ssd_triton`` (both directions, D and dt_bias, softplus, as the benchmark calls it) with
    every buffer recorded. ``device="meta"`` with ``sms``: launches mocked; a CPU device under the Triton interpreter
    runs the kernels for real (the tests compare the two records)."""
    inp = bench_kernels.make_inputs(shape, dtype, device, hydra=False)  # the benchmark's inputs, shapes and dtypes
    rec = Recorder(autograd._alloc, per_head=shape["g"] != shape["h"])
    mocked = launches_mocked(sms) if sms is not None else contextlib.nullcontext()
    with mock.patch.object(autograd, "_alloc", rec), mocked:
        y = autograd.bi_ssd_triton(inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"], D=inp["D"],
                                    dt_bias=inp["dt_bias"], dt_softplus=True, validate=False)
        dy = torch.ones_like(y)
        grads = torch.autograd.grad(y, list(inp.values()), dy)
        del grads, y
    in_bytes = sum(t.numel() * t.element_size() for t in inp.values())
    y_bytes = inp["x"].numel() * inp["x"].element_size()
    io = 2 * in_bytes + 2 * y_bytes  # inputs, output, upstream gradient, input gradients (bench_kernels.measure)
    return dict(shape=shape, dtype=str(dtype).replace("torch.", ""), sms=sms, buffers=rec.buffers,
                peak_mb=rec.peak / 2**20, io_mb=io / 2**20, inputs_mb=in_bytes / 2**20,
                mem_ratio=(in_bytes + rec.peak) / io, mem_ratio_without_per_head_grads=(in_bytes + rec.peak_other) / io)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(bench_kernels.SHAPES))
    ap.add_argument("--sms", type=int, default=132, help="the GPU's SM count (132: H200)")
    ap.add_argument("--dtype", default="bf16", choices=list(_DTYPES))
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    res = []
    for name in a.shapes.split(","):
        r = account(bench_kernels.SHAPES[name], _DTYPES[a.dtype], sms=a.sms)
        res.append(dict(name=name, **r))
        print(f"== {name}: peak {r['peak_mb']:.1f} MB above the inputs ({r['inputs_mb']:.1f} MB), "
              f"io {r['io_mb']:.1f} MB, mem / io {r['mem_ratio']:.3f}, "
              f"without the per-head dB, dC {r['mem_ratio_without_per_head_grads']:.3f}")
        for buf in r["buffers"]:
            tag = "  (per-head dB, dC)" if buf["per_head_grad"] else ""
            print(f"  {buf['mb']:9.1f} MB  {buf['dtype']:9s} {str(tuple(buf['shape'])):24s} line {buf['line']}: "
                  f"{buf['source'][:70]}{tag}")
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        meta = dict(torch=torch.__version__, command="python " + " ".join(sys.argv))
        Path(a.out).write_text(json.dumps(dict(meta, rows=res), indent=1))
        print("wrote", a.out)


if __name__ == "__main__":
    main()
