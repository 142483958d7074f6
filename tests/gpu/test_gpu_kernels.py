"""GPU suite for the fused Triton bi-SSD kernels (run on a CUDA machine).

    python -m pytest -m gpu tests/gpu -v        # the project's addopts deselect 'gpu' by default

What it checks, against float64 (the chunked PyTorch op run in float64 on the GPU: the quadratic
reference is O(L^2) and too large at these lengths; tests/test_op_torch.py ties the two together):

* detection shapes (b16, L 400/1600/6400, h 4/8, p64, n64) and the LM shape (b8, L8192, h32, p64,
  n128), fp32 and bf16: y and every gradient within 2e-3 (fp32) / 1.5e-2 (bf16) relative
  (||out - ref|| / ||ref||); every run twice: y, dx, dB, dC bitwise equal, ddt, dA, dD, ddt_bias
  within 1e-6 relative; output and gradient memory poisoned with NaN through the caching
  allocator before each run, so an unwritten element cannot pass;
* fp16 (5e-3) at b16 L1600 h8 p64 n64 and b32 L1600 h8 p32 n32, under every config and autotuned;
* direction="forward"/"backward", D per (head, channel), ngroups > 1, Hydra mode (shift=True with
  dt_bwd/B_bwd/C_bwd);
* every autotune config of every kernel forced one at a time;
* the backward's ordered group rows (YOLO_BIMAMBA_ORDERED_ROWS=1, forced): detection and LM shapes, one direction
  at a time, and every backward config at ngroups 2, with dB, dC bitwise repeatable under real concurrency;
* stress inputs: softplus input of dt up to +10, dt up to 1e2, A down to -1e2, L = 65536:
  finite outputs and gradients, and still accurate: every output within the tolerance, except dA and d(dt_bias)
  (sums of cancelling terms over b * L positions), held to 5e-2 there (see CANCELLING_STRESS_TOL).

Environment knobs (only for dry runs of this file elsewhere): BI_SSD_GPU_DEVICE (default cuda),
BI_SSD_GPU_BACKEND (default triton), BI_SSD_GPU_SMALL=1 (tiny shapes).
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
from pathlib import Path

import pytest
import torch

from yolo_bimamba.ops import bi_ssd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the stress recipes shared with the CPU tests
from stress_recipes import STRESS  # noqa: E402

DEVICE = os.environ.get("BI_SSD_GPU_DEVICE", "cuda")
BACKEND = os.environ.get("BI_SSD_GPU_BACKEND", "triton")
SMALL = os.environ.get("BI_SSD_GPU_SMALL", "0") == "1"

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA device"),
]

TOL = {torch.float32: 2e-3, torch.bfloat16: 1.5e-2, torch.float16: 5e-3}
DTYPES = [torch.float32, torch.bfloat16]
# fp16 (Ultralytics' default AMP dtype) has a dot policy of its own (autograd._dot_precisions): its cases run at the
# detection shapes, every config and the autotuned first call
FP16 = [torch.float16]
CHUNK = 64


def _shape(b, l, h, p, n, g=1):
    if SMALL:  # dry-run sizes: same structure, tiny problem
        hs = min(h, 2 if h < 8 else 4)
        return dict(b=min(b, 2), l=max(3, l // 100), h=hs, p=8, n=min(n, 16), g=min(g, hs))
    return dict(b=b, l=l, h=h, p=p, n=n, g=g)


DET_SHAPES = [_shape(16, l, h, 64, 64) for h in (8, 4) for l in (400, 1600, 6400)]
LM_SHAPE = _shape(8, 8192, 32, 64, 128)


def _sid(s):
    return f"b{s['b']}_L{s['l']}_h{s['h']}_p{s['p']}_n{s['n']}_g{s['g']}"


# ------------------------------------------------------------------------------------------
# inputs, reference, the op under test
# ------------------------------------------------------------------------------------------

def make_inputs(s, *, seed, hydra=False, D_per_channel=False, dt_raw=None, dt_softplus=True, A=None,
                dt_limit=(0.0, float("inf"))):
    """fp32 inputs whose values are exactly representable in bf16 (one reference serves both dtypes).

    Realistic Mamba2 ranges: dt = softplus(dt_raw + dt_bias) with dt_bias from dt0 in [1e-3, 0.1],
    A = -exp(U[0, log 16]); x, B, C standard normal.
    """
    gen = torch.Generator(device="cpu").manual_seed(seed)
    b, l, h, p, n, g = s["b"], s["l"], s["h"], s["p"], s["n"], s["g"]

    def rnd(*shape, scale=1.0, shift=0.0):
        t = torch.randn(*shape, generator=gen) * scale + shift
        return t.to(torch.bfloat16).float().to(DEVICE)

    dt0 = torch.exp(torch.rand(h, generator=gen) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
    inp = dict(
        x=rnd(b, l, h, p),
        dt=rnd(b, l, h, scale=0.5, shift=-0.5) if dt_raw is None else dt_raw(gen, (b, l, h)).to(DEVICE),
        A=(-torch.exp(torch.rand(h, generator=gen) * math.log(16.0))).to(DEVICE) if A is None else A.to(DEVICE),
        B=rnd(b, l, g, n),
        C=rnd(b, l, g, n),
        D=rnd(h, p) if D_per_channel else rnd(h),
        dt_bias=(dt0 + torch.log(-torch.expm1(-dt0))).to(DEVICE),
    )
    if hydra:
        inp.update(
            dt_bwd=rnd(b, l, h, scale=0.5, shift=-0.5) if dt_raw is None else dt_raw(gen, (b, l, h)).to(DEVICE),
            B_bwd=rnd(b, l, g, n),
            C_bwd=rnd(b, l, g, n),
        )
    dy = rnd(b, l, h, p)
    opts = dict(chunk_size=CHUNK, dt_softplus=dt_softplus, dt_limit=dt_limit)
    return inp, dy, opts


LOWP = ("x", "dt", "B", "C", "dt_bwd", "B_bwd", "C_bwd")  # in the test dtype; A, D, dt_bias stay fp32 (parameters)


def run(inp, dy, opts, dtype, *, backend, grads=True, **extra):
    """y and the gradients of every tensor input, in a dict keyed like ``inp`` (plus 'y')."""
    leaves = {}
    for k, v in inp.items():
        t = v.detach().to(dtype if (k in LOWP or dtype == torch.float64) else torch.float32)
        leaves[k] = t.requires_grad_(grads)
    args = [leaves[k] for k in ("x", "dt", "A", "B", "C")]
    kw = {k: leaves[k] for k in leaves if k not in ("x", "dt", "A", "B", "C")}
    y = bi_ssd(*args, **kw, **opts, **extra, backend=backend)
    out = {"y": y.detach()}
    if grads:
        names = list(leaves)
        gs = torch.autograd.grad(y, [leaves[k] for k in names], dy.to(y.dtype))
        out.update({"d" + k: gv for k, gv in zip(names, gs)})
    return out


REF_SLICE_NUMEL = int(os.environ.get("BI_SSD_GPU_REF_SLICE", str(1 << 24)))  # x elements per reference slice


def reference(inp, dy, opts, **extra):
    """float64 chunked PyTorch op; large problems in batch slices (the op is independent per batch
    item; parameter gradients are summed), so that several test processes fit on one GPU."""
    b = inp["x"].shape[0]
    per = max(1, REF_SLICE_NUMEL // max(1, inp["x"][0].numel()))
    if per >= b:
        return run(inp, dy, opts, torch.float64, backend="torch", **extra)
    parts = []
    for i in range(0, b, per):
        sl = {k: (v[i:i + per] if k in LOWP else v) for k, v in inp.items()}
        parts.append(run(sl, dy[i:i + per], opts, torch.float64, backend="torch", **extra))
    out = {}
    for k in parts[0]:
        if k[1:] in LOWP or k == "y":
            out[k] = torch.cat([p[k] for p in parts], dim=0)
        else:  # A, D, dt_bias: summed over the batch
            out[k] = sum(p[k] for p in parts)
    return out


def rel(a, ref):
    a, ref = a.double(), ref.double()
    return ((a - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def poison_allocator(nbytes):
    """Fill free memory of the caching allocator with NaN so torch.empty outputs start as NaN."""
    if DEVICE != "cuda":
        return
    torch.cuda.synchronize()
    n = int(nbytes) // 4 + 1
    big = torch.full((n,), float("nan"), device=DEVICE)
    del big
    # small blocks (< 1 MiB) come from their own pool: poison a spread of them as well
    smalls = [torch.full((k,), float("nan"), device=DEVICE) for k in (64, 256, 1024, 4096, 16384, 65536) for _ in range(8)]
    del smalls
    torch.cuda.synchronize()


def io_bytes(inp, dtype):
    el = 2 if dtype in (torch.bfloat16, torch.float16) else 4
    return sum(v.numel() * (el if k in LOWP else 4) for k, v in inp.items())


# dA and d(dt_bias) are sums over b * L positions of terms that cancel (a shift of every log-decay changes nothing).
# The kernels get them by telescoping per-position log-decay gradients over the whole sequence (pass C), whose fp32
# rounding grows with the sequence and with fast decays: at stress inputs they are held to CANCELLING_STRESS_TOL (a
# guard against real breakage: a wrong term gives O(1) errors), and the PyTorch op's error in the same dtype is
# printed beside them for comparison (it telescopes within chunks only and is 10-100x more accurate there). Every
# other output, and dA / d(dt_bias) at normal inputs, keeps the plain tolerance.
CANCELLING = ("dA", "ddt_bias")
CANCELLING_STRESS_TOL = 5e-2


def accuracy_problems(out, ref, dtype, what, yardstick=None):
    tol = TOL[dtype]
    bad = []
    for k, r in ref.items():
        a = out[k]
        if not torch.isfinite(a).all():
            bad.append(f"{k}: {int((~torch.isfinite(a)).sum())} non-finite of {a.numel()}")
            continue
        e = rel(a, r)
        bar = tol
        note = ""
        if yardstick is not None and k in CANCELLING:
            bar = max(tol, CANCELLING_STRESS_TOL)
            note = f"  (PyTorch op in {str(dtype)[6:]}: {rel(yardstick[k], r):.2e}; bar {bar:g})"
        print(f"  {what} {k:10s} rel {e:.2e}{note}")
        if not e <= bar:
            bad.append(f"{k}: rel err {e:.3e} > {bar:g}")
    return bad


def check(out, ref, dtype, what):
    bad = accuracy_problems(out, ref, dtype, what)
    assert not bad, f"{what}: " + "; ".join(bad)


def repeat_problems(o1, o2):
    bad = []
    for k in o1:
        a, b = o1[k], o2[k]
        if k in ("y", "dx", "dB", "dC", "dB_bwd", "dC_bwd"):
            if not torch.equal(a, b):
                bad.append(f"{k} not bitwise repeatable (max diff {(a.double() - b.double()).abs().max().item():.3e})")
        else:
            e = rel(a, b) if b.abs().max() > 0 else (a - b).abs().max().item()
            if not e <= 1e-6:
                bad.append(f"{k} differs run to run by {e:.3e} relative")
    return bad


_REF_CACHE: dict = {}


def cached_reference(key, make):
    if key not in _REF_CACHE:
        _REF_CACHE.clear()
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
        _REF_CACHE[key] = make()
    return _REF_CACHE[key]


def _op_module():
    """The Triton backend's tuning module (None for the PyTorch backend)."""
    if BACKEND != "triton":
        return None
    from yolo_bimamba.ops.bi_ssd import tuning

    return tuning


def poisoned_run(inp, dy, opts, dtype, forcer=contextlib.nullcontext, **extra):
    """One run with NaN-poisoned memory: the caching allocator's free blocks, and (the op's test hook)
    every output / gradient buffer inside NaN guard regions that must stay untouched."""
    poison_allocator(4 * io_bytes(inp, dtype) + (64 << 20))
    from yolo_bimamba.ops import kernel_buffers

    to = _op_module()
    hook = kernel_buffers.poison_outputs(True) if to is not None else contextlib.nullcontext()
    with hook, forcer():
        out = run(inp, dy, opts, dtype, backend=BACKEND, **extra)
    if to is not None:
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        assert kernel_buffers.check_guards(), "a kernel wrote outside its output buffers (NaN guard regions changed)"
    return out


def accuracy_case(s, dtype, *, seed, label, hydra=False, extra=None, forcer=contextlib.nullcontext, stress=False,
                  **mk):
    extra = extra or {}
    inp, dy, opts = make_inputs(s, seed=seed, hydra=hydra, **mk)
    key = (_sid(s), seed, hydra, repr(sorted(extra.items())), repr(sorted((k, repr(v)) for k, v in mk.items())))
    ref = cached_reference(key, lambda: reference(inp, dy, opts, **extra))
    outs = [poisoned_run(inp, dy, opts, dtype, forcer=forcer, **extra) for _ in range(2)]
    yardstick = run(inp, dy, opts, dtype, backend="torch", **extra) if stress else None
    what = f"{label} {_sid(s)} {dtype}"
    bad = accuracy_problems(outs[0], ref, dtype, what, yardstick) + repeat_problems(outs[0], outs[1])
    assert not bad, f"{what}: " + "; ".join(bad)


@pytest.fixture(scope="module", autouse=True)
def _backend_present():
    if BACKEND == "triton":  # a missing Triton backend is a failure here, never a skip
        from yolo_bimamba.ops.bi_ssd import autograd, tuning  # noqa: F401
    if DEVICE == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # the float64 reference must not use tf32
    yield
    _REF_CACHE.clear()


@pytest.fixture(autouse=True)
def _release_memory():
    """Several test processes share one GPU (pytest-xdist): hand cached blocks back after each test."""
    yield
    if DEVICE == "cuda":
        import gc

        gc.collect()
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------
# Tests are grouped by the kernel specialisation they compile (flags, dtype, and whether L is a
# multiple of 16): with ``-n N --dist loadgroup`` (pytest-xdist) each group's autotuning compiles
# happen once, in one worker, in parallel with the other groups. Sequence lengths are multiples of
# 16 but not of every tile (400, 1200: partial last tiles) except where an odd L is the point.
# ------------------------------------------------------------------------------------------

def group(name, dtype):
    return pytest.mark.xdist_group(f"{name}-{str(dtype)[6:]}")


def _p(cases):
    """[(args..., dtype)] -> pytest params with the dtype's xdist group and readable ids."""
    out = []
    for grp, args, dtype, cid in cases:
        out.append(pytest.param(*args, dtype, marks=group(grp, dtype), id=f"{cid}-{str(dtype)[6:]}"))
    return out


# accuracy and repeatability at the target shapes ------------------------------------------
_ACC = [("both", (s,), dt, _sid(s)) for dt in DTYPES for s in DET_SHAPES] + \
       [("lm", (LM_SHAPE,), dt, _sid(LM_SHAPE)) for dt in DTYPES] + \
       [("both", (s,), dt, _sid(s)) for dt in FP16 for s in (_shape(16, 1600, 8, 64, 64), _shape(32, 1600, 8, 32, 32))]


@pytest.mark.parametrize("s,dtype", _p(_ACC))
def test_accuracy_and_repeatability(s, dtype):
    accuracy_case(s, dtype, seed=1, label="both")


DET = _shape(16, 1600, 8, 64, 64)


@pytest.mark.parametrize("direction,dtype", _p([(d, (d,), dt, d) for dt in DTYPES for d in ("forward", "backward")]))
def test_single_direction(direction, dtype):
    accuracy_case(DET, dtype, seed=2, label=direction, extra={"direction": direction})


HYDRA_SHAPES = [_shape(16, 1600, 8, 64, 64), _shape(16, 400, 4, 64, 64), _shape(16, 6400, 8, 64, 64)]


@pytest.mark.parametrize("s,dtype", _p([("hydra", (s,), dt, _sid(s)) for dt in DTYPES for s in HYDRA_SHAPES]))
def test_hydra_mode(s, dtype):
    accuracy_case(s, dtype, seed=4, label="hydra", hydra=True, extra={"shift": True})


# odd L, ngroups 2, D per channel, dt_limit; then every config forced at the same specialisation
ODD = _shape(4, 1637, 8, 64, 64, g=2)


@pytest.mark.parametrize("dtype", _p([("odd", (), dt, "g2-Dhp-limit") for dt in DTYPES]))
def test_odd_length_groups_channel_D_dt_limit(dtype):
    accuracy_case(ODD, dtype, seed=3, label="g2-Dhp-limit", D_per_channel=True, dt_limit=(0.01, 0.3))


# one head per group (ngroups == nheads): the backward keeps no per-head dB, dC and its pairs kernel adds to the
# segment kernel's buffers in place (for fp16 inputs: fp32 buffers, stored as fp16); BiMamba2 and Hydra modes
G_EQ_H = _shape(8, 1637, 4, 64, 64, g=4)


@pytest.mark.parametrize("hydra,dtype", _p([("g-eq-h", (hy,), dt, "hydra" if hy else "bimamba2")
                                            for dt in DTYPES + FP16 for hy in (False, True)]))
def test_one_head_per_group(hydra, dtype):
    accuracy_case(G_EQ_H, dtype, seed=6, label=f"g == h {'hydra' if hydra else 'bimamba2'}", hydra=hydra,
                  extra={"shift": True} if hydra else None)


def config_forcers():
    """[(label, context manager factory)] for every config of every kernel (kernel helper's API).

    ``tuning.force_config(fwd=i, bwd=j, state=k, pairs=m, split=...)`` with ``FWD_CONFIGS`` / ``BWD_CONFIGS`` /
    ``STATE_CONFIGS`` / ``PAIRS_CONFIGS``: the lists are cycled together, so every config of each list runs at least
    once, with the backward's two directions alternately in two launches and in one.
    """
    if BACKEND != "triton":
        return [("default", contextlib.nullcontext)]
    from yolo_bimamba.ops.bi_ssd import tuning as tk

    nf, nb, ns, npair = len(tk.FWD_CONFIGS), len(tk.BWD_CONFIGS), len(tk.STATE_CONFIGS), len(tk.PAIRS_CONFIGS)
    out = []
    for i in range(max(nf, nb, ns, npair)):
        fi, bi, si, pi = i % nf, i % nb, i % ns, i % npair
        split = i % 2 == 0  # the backward's directions in two launches or in one
        out.append((f"fwd{fi}-bwd{bi}-state{si}-pairs{pi}-{'split' if split else 'fused'}",
                    lambda fi=fi, bi=bi, si=si, pi=pi, split=split: tk.force_config(
                        fwd=fi, bwd=bi, state=si, pairs=pi, split=split)))
    return out


try:
    _FORCERS = config_forcers()
except Exception as _exc:  # noqa: BLE001 - reported as a failing test below, never skipped
    _FORCERS = [("config-discovery-failed", _exc)]


@pytest.mark.parametrize("label,forcer,dtype", _p([("odd", (lb, f), dt, lb) for dt in DTYPES + FP16
                                                    for lb, f in _FORCERS]))
def test_every_config(label, forcer, dtype):
    if isinstance(forcer, Exception):
        raise forcer
    accuracy_case(ODD, dtype, seed=3, label=f"config {label}", forcer=forcer, D_per_channel=True, dt_limit=(0.01, 0.3))


@pytest.mark.parametrize("label,forcer,dtype", _p([("odd-hydra", (lb, f), dt, lb) for dt in DTYPES + FP16
                                                    for lb, f in _FORCERS]))
def test_every_config_hydra(label, forcer, dtype):
    if isinstance(forcer, Exception):
        raise forcer
    accuracy_case(ODD, dtype, seed=5, label=f"config {label} hydra", forcer=forcer, hydra=True,
                  extra={"shift": True}, D_per_channel=True)


# ordered group rows (YOLO_BIMAMBA_ORDERED_ROWS=1): the heads of a group add their dB, dC terms to the group's fp32
# rows in head order under real concurrency (tickets, acquire / release counters); accuracy and bitwise repeatability
# at the detection and LM shapes, one direction at a time, ngroups 2 with every backward config forced
def _ordered(bwd=None):
    to = _op_module()
    if to is None:
        return contextlib.nullcontext
    return lambda: to.force_config(ordered=True, bwd=bwd)


_ORDERED = [("ordered", (s, None), dt, _sid(s)) for dt in DTYPES for s in (DET_SHAPES[1], DET_SHAPES[0], LM_SHAPE)] + \
           [("ordered", (DET, d), dt, f"{_sid(DET)}-{d}") for dt in DTYPES for d in ("forward", "backward")]


@pytest.mark.parametrize("s,direction,dtype", _p(_ORDERED))
def test_ordered_group_rows(s, direction, dtype):
    extra = {"direction": direction} if direction else None
    accuracy_case(s, dtype, seed=7, label=f"ordered {direction or 'both'}", forcer=_ordered(), extra=extra)


try:
    from yolo_bimamba.ops.bi_ssd.tuning import BWD_CONFIGS as _BWD_CONFIGS
    _BWD_IDS = list(range(len(_BWD_CONFIGS)))
except Exception as _exc:  # noqa: BLE001 - reported as a failing test below, never skipped
    _BWD_IDS = [_exc]


@pytest.mark.parametrize("bwd,dtype", _p([("odd-ordered", (i,), dt, f"bwd{i}" if isinstance(i, int) else "discovery")
                                          for dt in DTYPES + FP16 for i in _BWD_IDS]))
def test_ordered_group_rows_every_bwd_config(bwd, dtype):
    if isinstance(bwd, Exception):
        raise bwd
    accuracy_case(ODD, dtype, seed=3, label=f"ordered bwd{bwd}", forcer=_ordered(bwd), D_per_channel=True,
                  dt_limit=(0.01, 0.3))


# stress inputs ------------------------------------------------------------------------------

STRESS_SHAPE = _shape(4, 1200, 8, 64, 64)


def _stress_kw(name, s):
    mk = dict(STRESS[name]) if name != "normal" else {}
    if "A" in mk:
        mk["A"] = mk["A"][: s["h"]]
    return mk


def _stress_group(name, hydra):
    base = "both" if name in ("normal", "softplus-input-10") else "nosoftplus"
    return base + ("-hydra" if hydra else "")


@pytest.mark.parametrize("name,hydra,dtype", _p(
    [(("hydra" if h else "both") if n == "softplus-input-10" else _stress_group(n, h), (n, h), dt,
      f"{n}{'-hydra' if h else ''}") for dt in DTYPES for n in STRESS for h in (False, True)]))
def test_stress_values(name, hydra, dtype):
    s = STRESS_SHAPE
    accuracy_case(s, dtype, seed=6, label=f"stress-{name}{'-hydra' if hydra else ''}", hydra=hydra,
                  extra={"shift": True} if hydra else {}, stress=True, **_stress_kw(name, s))


LONG = _shape(2, 65536, 8, 64, 64)


@pytest.mark.parametrize("name,dtype", _p([(_stress_group(n, False), (n,), dt, n) for dt in DTYPES
                                          for n in ("normal", "softplus-input-10", "dt-1e2-A-1e2")]))
def test_stress_long_sequence(name, dtype):
    accuracy_case(LONG, dtype, seed=7, label=f"L65536-{name}", stress=True, **_stress_kw(name, LONG))


# clamp boundaries ------------------------------------------------------------------------------

def _dt_with_exact_zeros(gen, shape):
    t = torch.rand(shape, generator=gen).to(torch.bfloat16).float()
    t[:, ::3] = 0.0  # dt exactly 0 (masked positions) = the lower bound of the default dt_limit
    return t


@pytest.mark.parametrize("dtype", _p([("boundary", (), dt, "dt0-A0") for dt in DTYPES]))
def test_clamp_boundary_gradients(dtype):
    """dt exactly at dt_limit's lower bound and A exactly 0: gradients follow the PyTorch op
    (torch.clamp passes no gradient at the boundary)."""
    s = _shape(2, 400, 8, 64, 64)
    A = torch.tensor([0.0, -1.0, 0.0, -3.0, -0.5, 0.0, -2.0, -8.0])[: s["h"]]
    inp, dy, opts = make_inputs(s, seed=8, dt_raw=_dt_with_exact_zeros, dt_softplus=False, A=A)
    inp.pop("dt_bias")
    ref = reference(inp, dy, opts)
    out = poisoned_run(inp, dy, opts, dtype)
    check(out, ref, dtype, f"clamp-boundary {_sid(s)} {dtype}")


# the default path: autotuning on ---------------------------------------------------------------

@pytest.mark.parametrize("dtype", _p([("autotune", (), dt, "first-call") for dt in DTYPES + FP16]))
def test_autotuned_first_call(dtype):
    """What users run: the autotuners time every config on the first call of a specialisation (fresh caches here),
    then the chosen one runs. The tuning must not leave its mark on the results (the backward's second launch adds
    to buffers the first wrote). The case runs twice: the second call launches the chosen configs directly (the op's
    cache, without triton's Autotuner), and must equal the first as the repeatability rules say."""
    to = _op_module()
    if to is None:
        pytest.skip("autotuning belongs to the triton backend")
    from yolo_bimamba import config

    old = config.AUTOTUNE
    config.AUTOTUNE = True
    for tuned in (to.fwd_tuner, to.bwd_tuner, to.state_tuner, to.bwd_pairs_tuner, to.fwd_pairs_tuner):
        tuned.cache.clear()
    to._chosen.clear()
    try:
        accuracy_case(_shape(4, 1200, 8, 64, 64), dtype, seed=9, label="autotuned", hydra=dtype == torch.float32,
                      extra={"shift": True} if dtype == torch.float32 else {})
        assert to._chosen, "the tuned configs were not kept for the second call"
    finally:
        config.AUTOTUNE = old


# launches after the first of a specialisation: the kept compiled kernel, without Triton's JITFunction.run ------

@pytest.mark.parametrize("dtype", _p([("direct", (), dt, "direct-launch") for dt in DTYPES]))
def test_direct_launch(dtype):
    """After the first call of a specialisation the op launches the kept compiled kernels itself (ops.launch), with
    Triton's own specialisation checked on each such launch (YOLO_BIMAMBA_CHECK_LAUNCH, set by conftest): the results
    equal launches through Triton bitwise, and inputs that are not 16-byte aligned (a view one element into a buffer)
    get a kernel of their own, as Triton's specialisation requires, and are still accurate."""
    if BACKEND != "triton":
        pytest.skip("direct launches belong to the triton backend")
    from yolo_bimamba import config
    from yolo_bimamba.ops import launch

    assert config.CHECK_LAUNCH, "the GPU suite checks every direct launch (conftest sets YOLO_BIMAMBA_CHECK_LAUNCH=1)"
    s = _shape(4, 1000, 8, 32, 32)
    inp, dy, opts = make_inputs(s, seed=12)
    old = config.DIRECT_LAUNCH
    try:
        config.DIRECT_LAUNCH = False
        through_triton = run(inp, dy, opts, dtype, backend=BACKEND)
        config.DIRECT_LAUNCH = True
        run(inp, dy, opts, dtype, backend=BACKEND)  # compiles or finds the kernels, keeps them
        before = dict(launch.counts)
        direct = run(inp, dy, opts, dtype, backend=BACKEND)
        assert launch.counts["direct"] - before["direct"] >= 7 and launch.counts["triton"] == before["triton"], \
            f"expected every launch of the third call to be direct: {before} -> {launch.counts}"
        bad = repeat_problems(through_triton, direct)
        assert not bad, "direct launches differ from launches through Triton: " + "; ".join(bad)

        def shifted(t):  # the same values, one element into a fresh buffer: not 16-byte aligned
            buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
            out = buf[1:].view(t.shape)
            out.copy_(t)
            return out

        mis = {k: shifted(v.to(dtype if k in LOWP else torch.float32)) if k in ("x", "B", "C") else v
               for k, v in inp.items()}
        assert mis["x"].data_ptr() % 16 != 0
        before = dict(launch.counts)
        outs = [run(mis, dy, opts, dtype, backend=BACKEND) for _ in range(2)]
        assert launch.counts["triton"] > before["triton"], "misaligned inputs reused the aligned inputs' kernels"
        ref = cached_reference(("direct", _sid(s)), lambda: reference(inp, dy, opts))
        bad = accuracy_problems(outs[1], ref, dtype, "misaligned") + repeat_problems(outs[0], outs[1])
        assert not bad, "misaligned inputs: " + "; ".join(bad)
    finally:
        config.DIRECT_LAUNCH = old


# the bf16 split of the state dots on the GPU's real bf16 bit operations ------------------------

def test_bf16_rounding_and_split_on_the_gpu():
    """The split the bf16 policy's state dots use (kernels_common._split_bf16: masks and a bit cast to bf16 on the
    GPU, fp32 values in the interpreter) gives the same exact parts on the GPU as the CPU test checks emulated."""
    if BACKEND != "triton":
        pytest.skip("the split belongs to the triton backend")
    from bf16_split_check import bf16_split_case, check_bf16_split

    check_bf16_split(*(t.cpu() for t in bf16_split_case(DEVICE)))
