"""Tensor-core work of the fused Triton op's fwd+bwd, counted from its own kernels on the CPU, and the GPU time that
work needs at least (at a GPU's peak rates).

The op runs under the Triton interpreter with every ``tl.dot`` counted as it executes: the kernel it belongs to,
its tile shape (M x K by K x N: the full tiles, padding included, as a GPU computes them) and the precision it would
run at on a GPU, read from the kernels' own ``_dot`` / ``_dot_acc`` (a split-bf16 dot is three bf16 dots; tf32x3 is
three tf32 passes; a plain ``tl.dot`` on fp32 values is tf32). The dot precisions are the policy of the inputs' dtype
(``autograd._dot_precisions``), the configs the defaults (``YOLO_BIMAMBA_AUTOTUNE=0``), and the segments those of a
GPU with ``--sms`` SMs (132: an H200), so the kernels walk the same tiles as there. The inputs are fp32 at batch 1:
each batch element is its own programs, so the count is multiplied by the batch; a one-segment sequence longer than
``--rows`` rows, a multiple of it, is counted at that many rows and multiplied too (every chunk does the same work).

"floor ms": the MACs at the peak dense rate of their precision (``--peak``, FLOP/s; defaults: an H200 SXM, bf16
989.4 T, tf32 494.7 T, fp32 66.9 T). A kernel cannot run faster than that; the op's measured GPU time over this floor
says how far from compute-bound it is, and the ratio of two directions to one at the floor is what doing both
directions' state terms costs in arithmetic (the in-chunk pairs are shared, the states are not).

    python benchmarks/mma_account.py [--shapes lm_b8_L8192_h32,...] [--dtype bf16] [--sms 132] [--out F.json]
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import sys
from collections import defaultdict
from pathlib import Path
from unittest import mock

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_kernels", ROOT / "benchmarks" / "bench_kernels.py")
bench_kernels = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_kernels)  # also enters the package without Ultralytics where that is missing

from triton.runtime import interpreter as _interp  # noqa: E402

from yolo_bimamba.ops.bi_ssd import autograd, tuning  # noqa: E402

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
PEAK = {"bf16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12}  # dense FLOP/s of an H200 SXM (2 FLOPs per MAC)
# a _dot precision -> (the unit it runs on, passes per tl.dot call); bf16x3a/b are three tl.dot calls of one pass
_UNIT = {"bf16": ("bf16", 1), "bf16x3a": ("bf16", 1), "bf16x3b": ("bf16", 1), "tf32": ("tf32", 1),
         "tf32x3": ("tf32", 3), "ieee": ("fp32", 1)}


def _value(v):
    return getattr(v, "value", v)


class DotCounter:
    """Counts the MACs of every tl.dot the interpreter runs, by (kernel, unit): see the module docstring."""

    def __init__(self):
        self.macs = defaultdict(lambda: defaultdict(int))

    def record(self, a, b, input_precision):
        m, k = a.data.shape[-2], a.data.shape[-1]
        n = b.data.shape[-1]
        kernel, prec = None, None
        f = sys._getframe(2)
        while f is not None:
            name = f.f_code.co_name
            if prec is None and name in ("_dot", "_dot_acc") and "PREC" in f.f_locals:
                prec = str(_value(f.f_locals["PREC"]))
            if name.startswith("_bi_ssd_") and name.endswith("_kernel"):  # the kernel (its helpers run inside it)
                kernel = name
                break
            f = f.f_back
        if prec is None:  # a plain tl.dot (the forward's): its input precision, tf32 by default for fp32 values
            text = str(input_precision).lower()
            prec = "tf32x3" if "tf32x3" in text else "ieee" if "ieee" in text else "tf32"
        unit, passes = _UNIT[prec]
        self.macs[kernel or "?"][unit] += m * n * k * passes

    @contextlib.contextmanager
    def counting(self):
        orig = _interp.InterpreterBuilder.create_dot
        counter = self

        def create_dot(builder, a, b, d, input_precision, max_num_imprecise_acc):
            counter.record(a, b, input_precision)
            return orig(builder, a, b, d, input_precision, max_num_imprecise_acc)

        with mock.patch.object(_interp.InterpreterBuilder, "create_dot", create_dot):
            yield self


def floor_ms(macs_by_unit: dict, peak: dict = PEAK) -> float:
    return sum(2.0 * v / peak[u] for u, v in macs_by_unit.items()) * 1e3


def policy_of(dtype, prec: str | None = None) -> dict:
    """The backward's dot precisions: those of inputs of ``dtype`` (autograd._dot_precisions), or ``prec``
    ("ST,RD,MID,IN,LO", as benchmarks/profile_gpu.py --prec) for a policy the op does not use."""
    if prec:
        return dict(zip(autograd.DOT_CLASSES, prec.split(",")))
    return autograd._dot_precisions(torch.empty(0, dtype=dtype))


def run_counted(inp: dict, direction: str, policy: dict, seg: int, grad: bool) -> DotCounter:
    """One call of bi_ssd_triton on ``inp`` (bench_kernels.make_inputs) under the interpreter, in segments of ``seg``
    rows, with the dot precisions ``policy``, every dot counted."""
    counter = DotCounter()
    with mock.patch.object(autograd, "_dot_precisions", lambda x: dict(policy)), \
            tuning.force_config(seg=seg), counter.counting():
        y = autograd.bi_ssd_triton(inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"], D=inp["D"],
                                    dt_bias=inp["dt_bias"], dt_softplus=True, direction=direction, validate=False)
        if grad:
            torch.autograd.grad(y, list(inp.values()), torch.ones_like(y))
    return counter


def count(shape: dict, direction: str = "both", dtype=torch.bfloat16, sms: int = 132, rows: int = 1024,
          grad: bool = True, prec: str | None = None) -> dict:
    """MACs by kernel and unit of one call (fwd, and bwd with ``grad``) of bi_ssd_triton at ``shape`` (a
    bench_kernels.SHAPES entry, D and dt_bias, softplus, as the benchmark calls it), as the kernels run on a GPU of
    ``sms`` SMs with inputs of ``dtype`` (or the dot policy ``prec``, see policy_of); counted at batch 1 (and
    ``rows`` rows for a longer one-segment sequence) and scaled."""
    b, L, h = shape["b"], shape["l"], shape["h"]
    with mock.patch.object(tuning, "sm_count", lambda device: sms):
        seg = tuning.segment_rows(b, h, L, torch.device("cpu"))
    nseg = -(-L // seg)
    l_run, scale_l = L, 1
    if nseg == 1 and L > rows and L % rows == 0 and rows % tuning.SEG_MULTIPLE == 0:
        l_run, scale_l, seg = rows, L // rows, rows
    inp = bench_kernels.make_inputs(dict(shape, b=1, l=l_run), torch.float32, "cpu", hydra=False)
    heads_rule = tuning.fwd_pairs_heads

    def heads_of_full_call(_b, g, r, tiles, n, device):
        # the forward pairs kernel's heads per program as in the full call (batch b, all rows, sms SMs): its C B^T
        # dots are one per program
        with mock.patch.object(tuning, "sm_count", lambda device: sms):
            return heads_rule(b, g, r, tiles * scale_l, n, device)

    with mock.patch.object(tuning, "fwd_pairs_heads", heads_of_full_call):
        counter = run_counted(inp, direction, policy_of(dtype, prec), seg, grad)
    scale = b * scale_l
    kernels = {k: {u: v * scale for u, v in units.items()} for k, units in sorted(counter.macs.items())}
    total = defaultdict(int)
    for units in kernels.values():
        for u, v in units.items():
            total[u] += v
    return dict(shape=shape, direction=direction, dtype=str(dtype).replace("torch.", ""), dot_prec=prec, sms=sms,
                seg_rows=seg if scale_l == 1 else L, nseg=nseg, counted_batch=1, counted_rows=l_run, scale=scale,
                grad=grad, kernels={k: dict(macs=dict(u), floor_ms=floor_ms(u)) for k, u in kernels.items()},
                macs=dict(total), floor_ms=floor_ms(total))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(bench_kernels.SHAPES))
    ap.add_argument("--directions", default="both,forward")
    ap.add_argument("--dtype", default="bf16", choices=list(_DTYPES))
    ap.add_argument("--sms", type=int, default=132, help="the GPU's SM count (132: H200)")
    ap.add_argument("--rows", type=int, default=1024, help="count a longer one-segment sequence at this many rows")
    ap.add_argument("--prec", default=None, help="a dot policy ST,RD,MID,IN,LO instead of the dtype's (see policy_of)")
    ap.add_argument("--peak", default=None, help="bf16,tf32,fp32 dense FLOP/s (default: an H200 SXM's)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.peak:
        PEAK.update(zip(("bf16", "tf32", "fp32"), (float(v) for v in a.peak.split(","))))
    res = []
    for name in a.shapes.split(","):
        per_dir = {}
        for d in a.directions.split(","):
            r = count(bench_kernels.SHAPES[name], d, _DTYPES[a.dtype], a.sms, a.rows, prec=a.prec)
            res.append(dict(name=name, **r))
            per_dir[d] = r
            gmacs = {u: round(v / 1e9, 2) for u, v in r["macs"].items()}
            print(f"== {name} {d}: GMACs {gmacs}, floor {r['floor_ms']:.4f} ms (segments {r['nseg']} of "
                  f"{r['seg_rows']} rows)", flush=True)
            for k, v in r["kernels"].items():
                print(f"   {k:28s} {v['floor_ms']:.4f} ms  " + ", ".join(f"{u} {m / 1e9:.2f} G" for u, m in
                                                                    v["macs"].items()))
        if "both" in per_dir and "forward" in per_dir:
            print(f"   both / one direction at the floor: {per_dir['both']['floor_ms'] / per_dir['forward']['floor_ms']:.3f}")
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        import triton

        meta = dict(torch=torch.__version__, triton=triton.__version__, peak_flops=PEAK,
                    command="python " + " ".join(sys.argv))
        Path(a.out).write_text(json.dumps(dict(meta, rows=res), indent=1))
        print("wrote", a.out)


if __name__ == "__main__":
    main()
