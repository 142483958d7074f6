"""Fused Triton bi-SSD kernels vs the float64 reference, under the Triton interpreter on CPU: determinism, gradcheck,
adversarial and stress inputs, dispatch and validation, autotuned and reused configs, boundary states, size limits
and the tuning rules (every config and option one by one: test_triton_kernels.py).

Every forward and backward config is forced in turn; outputs and gradient buffers are poisoned
with NaN and surrounded by NaN guard regions (an unwritten element or a stray write fails).
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any triton kernel module is imported

import pytest  # noqa: E402
import torch  # noqa: E402

triton = pytest.importorskip("triton")

from yolo_bimamba import config  # noqa: E402
from yolo_bimamba.ops import bi_ssd  # noqa: E402
from yolo_bimamba.ops.bi_ssd import autograd, tuning  # noqa: E402
from yolo_bimamba.ops import kernel_buffers  # noqa: E402
from yolo_bimamba.ops.bi_ssd.autograd import bi_ssd_triton  # noqa: E402
from yolo_bimamba.ops.bi_ssd.tuning import (  # noqa: E402
    BWD_CONFIGS, FWD_CONFIGS, PAIRS_CONFIGS, SEG_MULTIPLE, STATE_CONFIGS, force_config,
)
from stress_recipes import STRESS  # noqa: E402
from bi_ssd_check import (  # noqa: E402
    DEV, TOL, _first_with_q, check_case, make_inputs, rel_err, run_reference, run_triton,
)

if DEV == "cpu" and not tuning._INTERPRET:
    pytest.skip("no CUDA and TRITON_INTERPRET is not set", allow_module_level=True)


def test_deterministic():
    args, kw = make_inputs(b=2, l=50, h=2, sep=True)
    kw.update(shift=True)
    dy = torch.randn(args[0].shape, generator=torch.Generator().manual_seed(3)).to(DEV)
    y1, g1, _ = run_triton(args, kw, dy, 0, 0)
    y2, g2, _ = run_triton(args, kw, dy, 0, 0)
    assert torch.equal(y1, y2)
    for k in g1:
        assert torch.equal(g1[k], g2[k]), k


def test_gradcheck_float64():
    args, kw = make_inputs(l=6, h=2, p=3, n=2, dtype=torch.float64, guard=False, sep=True)
    kw.update(shift=True)
    names = ["D", "dt_bias", "dt_bwd", "B_bwd", "C_bwd"]
    tensors = [a.clone().requires_grad_() for a in args] + [kw[k].clone().requires_grad_() for k in names]
    # A = 0.3 would sit on the clamp's kink; keep A strictly negative for finite differences
    tensors[2] = (-tensors[2].detach().abs() - 0.1).requires_grad_()
    # the dt clamp kink at 0 is never hit with softplus; keep it away from the upper limit too

    def f(x, dt, A, B, C, D, bias, dtb, Bb, Cb):
        with force_config(fwd=0, bwd=0):
            return bi_ssd_triton(x, dt, A, B, C, D=D, dt_bias=bias, dt_softplus=True, shift=True,
                                 dt_bwd=dtb, B_bwd=Bb, C_bwd=Cb)

    assert torch.autograd.gradcheck(f, tensors, fast_mode=True, eps=1e-6, atol=1e-7, rtol=1e-5)


def test_adversarial_finite():
    h = 3
    args, kw = make_inputs(b=1, l=70, h=h, softplus=True, guard=False)
    x, dt, A, B, C = args
    dt = dt.clone()
    dt[0, :10] = 10.0  # softplus input +10
    dt[0, 10:20] = 100.0  # dt up to 1e2
    dt[0, 20:30] = -50.0  # softplus -> ~0
    A = torch.tensor([-100.0, 0.0, -1.0])
    x = x.clone()
    x[0, 30:40] = 0.0
    B = B.clone()
    B[0, 40:50] = 0.0
    for opts in [dict(), dict(shift=True)]:
        y, grads, ok = run_triton([x, dt, A, B, C], {**kw, **opts}, torch.randn_like(x), 0, 0)
        assert ok and torch.isfinite(y).all()
        for k, v in grads.items():
            assert torch.isfinite(v).all(), k
    # without softplus, huge raw dt and all-zero inputs
    kw2 = dict(dt_softplus=False)
    y, grads, ok = run_triton([x, dt.abs() * 2, A, B, C], kw2, torch.randn_like(x), 0, 0)
    assert ok and torch.isfinite(y).all() and all(torch.isfinite(v).all() for v in grads.values())
    zeros = [torch.zeros_like(t) for t in (x, dt, A, B, C)]
    y, grads, ok = run_triton(zeros, {}, torch.ones_like(x), 0, 0)
    assert ok and torch.equal(y, torch.zeros_like(y))
    assert all(torch.isfinite(v).all() for v in grads.values())


def test_extreme_values_match_reference():
    args, kw = make_inputs(l=45, h=2, softplus=True)
    dt = args[1].clone()
    dt[0, 5:9] = 10.0
    dt[0, 20:22] = 30.0
    args[1] = dt
    args[2] = torch.tensor([-100.0, -0.5])
    # decays down to exp(-3000) per step: dA (measured against its cancellation scale) is the
    # least accurate output in fp32 here; everything else stays within 1e-5
    check_case(args, kw, 0, 0, tol=1e-4)


def test_non_contiguous_inputs():
    args, kw = make_inputs(l=30, h=2, guard=False)
    x = args[0].transpose(2, 3).contiguous().transpose(2, 3)  # same values, other strides
    B = torch.cat([args[3], args[3]], dim=3)[..., : args[3].shape[3]]
    assert not x.is_contiguous() and not B.is_contiguous()
    check_case([x, args[1], args[2], B, args[4]], kw, 0, 0)


def test_dispatch_and_validation():
    args, kw = make_inputs(l=20, guard=False)
    with force_config(0, 0):
        y1 = bi_ssd(*args, **kw, backend="triton")
    y2 = bi_ssd(*args, **kw, backend="torch")
    assert rel_err(y1, y2) < 1e-5
    with pytest.raises(ValueError, match="dt_bwd"):
        bi_ssd_triton(*args, dt_bwd=args[1])
    with pytest.raises(ValueError, match="'A'"):
        bi_ssd_triton(args[0], args[1], args[2][:1], args[3], args[4])


def test_guard_detects_stray_write():
    """The guard check itself can fail: a write past the end of a buffer is reported."""
    with kernel_buffers.poison_outputs(True):
        t = autograd._alloc((4, 5), torch.float32, DEV)
        t.fill_(0.0)
        assert kernel_buffers.check_guards()
        t = autograd._alloc((4, 5), torch.float32, DEV)
        t.fill_(0.0)
        t.view(-1).as_strided((21,), (1,))[20] = 1.0  # one element past the end
        assert not kernel_buffers.check_guards()


def test_fp16_partial_sums_do_not_overflow():
    """fp16 inputs: each direction's partial output exceeds 65504 but the total (with D*x) fits; the kernels keep
    partial sums they read back in fp32, so the result is finite and right."""
    from yolo_bimamba.ops import bi_ssd, bi_ssd_reference

    L = 700
    x = torch.full((1, L, 1, 16), 100.0, dtype=torch.float16)
    dt = torch.ones(1, L, 1, dtype=torch.float16)
    A = torch.zeros(1, dtype=torch.float16)
    B = torch.zeros(1, L, 1, 16, dtype=torch.float16)
    B[..., 0] = 1.0
    C = B.clone()
    D = torch.full((1,), -float(L), dtype=torch.float16)  # cancels the sum of both directions
    ts = [t.requires_grad_(True) for t in (x, dt, B, C)]
    y = bi_ssd(x, dt, A, B, C, D=D, backend="triton")
    ref = bi_ssd_reference(x, dt, A, B, C, D=D)
    assert torch.isfinite(y).all()
    assert ((y.double() - ref).norm() / ref.norm()).item() < 1e-3
    grads = torch.autograd.grad(y.float().sum() * 1e-3, ts)
    assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.slow  # minutes under the interpreter; .ci/run runs the slow tier
@pytest.mark.parametrize("sep", [False, True])
def test_autotuned_launch_matches_reference(sep):
    """The default path on a GPU autotunes: every config is timed on the live arguments before the chosen one runs.
    The backward's second launch adds to dx (and dB, dC) written by the first, so a tuner that timed it on the live
    buffers would add the anti-causal contribution once per timed call. Run the tuners here (CPU timer), on the first
    call of fresh tuning caches, with several segments and the two-launch backward, against the float64 reference."""
    args, kw = make_inputs(b=2, l=2 * SEG_MULTIPLE + 5, h=2, g=1, p=16, n=16, sep=sep)
    kw.update(shift=sep)
    calls = []
    orig = tuning._cpu_bench

    def counting_bench(fn, quantiles=None):
        calls.append(1)
        return orig(fn, quantiles)

    tuners = (tuning.fwd_tuner, tuning.bwd_tuner, tuning.state_tuner, tuning.bwd_pairs_tuner,
              tuning.fwd_pairs_tuner)
    for tuned in tuners:
        tuned.do_bench = counting_bench  # instance attribute over the autotuner's cached property
    try:
        with tuning.interpreter_autotune(), force_config(seg=SEG_MULTIPLE, split=True):
            check_case(args, kw)
    finally:
        for tuned in tuners:
            tuned.__dict__.pop("do_bench", None)
    # the tuners really ran: every config of the forward and its in-chunk pairs, the two state walks, the backward
    # launches and their in-chunk pairs launches was timed (BiMamba2 mode: the second segment launch runs the first
    # one's config and one pairs launch does both directions, see the next test; Hydra mode: each direction's
    # launches tuned)
    bwd_tuned = 2 if sep else 1
    assert len(calls) >= len(FWD_CONFIGS) + len(PAIRS_CONFIGS) + 2 * len(STATE_CONFIGS) + \
        bwd_tuned * (len(BWD_CONFIGS) + len(PAIRS_CONFIGS)), len(calls)


def test_second_backward_launch_runs_the_first_launchs_config(monkeypatch):
    """BiMamba2 mode (same dt, B, C, no shift): the two segment launches do the pairs across chunks of one direction
    each and one pairs launch does the in-chunk pairs of both, so all three must cut the sequence into the same
    chunks. An autotuner that chose a BLOCK_Q of 64 for the first launch and of 32 for the second (each timed alone)
    would count some pairs twice and miss others. Here the op's config cache says exactly that; the result must still
    match the reference, and the second segment launch and the pairs launch must have run the first one's BLOCK_Q."""
    big = next(c for c in BWD_CONFIGS if c.kwargs["BLOCK_Q"] == 64)
    small = next(c for c in BWD_CONFIGS if c.kwargs["BLOCK_Q"] == 32)

    class SplitMinds(dict):
        def get(self, key, default=None):
            which, kwargs = key[0], dict(key[1])
            if which != "bwd":
                configs = dict(fwd=FWD_CONFIGS, state=STATE_CONFIGS, pairs=PAIRS_CONFIGS, fwd_pairs=PAIRS_CONFIGS)
                return configs[which][tuning.DEFAULT_CONFIGS[which]]
            return big if kwargs["DO_F"] else small

    launched = []
    orig = autograd._launch

    def spy(jit_fn, tuned_fn, configs, which, grid_fn, args, kwargs, cfg=None):
        used = orig(jit_fn, tuned_fn, configs, which, grid_fn, args, kwargs, cfg)
        if which == "bwd":
            launched.append(used.kwargs["BLOCK_Q"])
        elif jit_fn is autograd._bi_ssd_bwd_pairs_kernel:
            launched.append(("pairs", kwargs["BLOCK_Q"]))
        return used

    monkeypatch.setattr(tuning, "_chosen", SplitMinds())
    monkeypatch.setattr(tuning, "_TUNE_IN_INTERPRETER", True)
    monkeypatch.setattr(autograd, "_launch", spy)
    args, kw = make_inputs(b=1, l=2 * SEG_MULTIPLE + 37, h=2, g=1, p=16, n=16)
    with force_config(split=True):
        check_case(args, kw)
    assert launched == [64, 64, ("pairs", 64)], launched


@pytest.mark.slow  # minutes under the interpreter; .ci/run runs the slow tier
def test_tuned_config_is_reused_without_the_autotuner():
    """After the autotuners chose, later calls with the same arguments launch the chosen config directly (the
    Autotuner's host cost skipped), with the same results bit for bit; other dtypes or flags go back to the tuners."""
    args, kw = make_inputs(b=2, l=2 * SEG_MULTIPLE + 5, h=2, g=1, p=16, n=16)
    dy = torch.randn(args[0].shape, generator=torch.Generator().manual_seed(3)).to(DEV)
    tuners = (tuning.fwd_tuner, tuning.bwd_tuner, tuning.state_tuner, tuning.bwd_pairs_tuner,
              tuning.fwd_pairs_tuner)
    runs = []
    origs = [t.run for t in tuners]
    for t, orig in zip(tuners, origs):
        t.run = lambda *a, _orig=orig, **k: (runs.append(1), _orig(*a, **k))[1]
    launched = []
    jits = {t: t.fn for t in tuners}
    orig_getitem = type(autograd._bi_ssd_fwd_kernel).__getitem__

    def spy_getitem(self, grid):
        launcher = orig_getitem(self, grid)

        def launch(*a, **k):
            launched.append((self, {key: k[key] for key in ("BLOCK_Q", "BLOCK_P", "num_warps") if key in k}))
            return launcher(*a, **k)
        return launch
    try:
        type(autograd._bi_ssd_fwd_kernel).__getitem__ = spy_getitem
        with tuning.interpreter_autotune(), force_config(seg=SEG_MULTIPLE, split=True):
            first = run_triton(args, kw, dy, poison=False)
            n_tuned = len(runs)
            # state + fwd + its pairs; state + the first backward launch (the second runs its config: BiMamba2 mode)
            # + its pairs
            assert n_tuned == 6
            assert len(tuning._chosen) == 6
            launched.clear()
            second = run_triton(args, kw, dy, poison=False)
            assert len(runs) == n_tuned, "the second call went through the autotuners again"
            # the launches of the second call used the configs the tuners chose
            expected = {(jits[t], tuple(sorted(t.cache[k].kwargs.items())), t.cache[k].num_warps)
                        for t in tuners for k in t.cache}
            # (BLOCK_P: bwd argument; BLOCK_Q, BLOCK_P: pairs kernels' arguments)
            cfg_keys = {jits[t]: set(t.configs[0].kwargs) for t in tuners}
            got = {(fn, tuple(sorted((k, v) for k, v in meta.items() if k in cfg_keys[fn])), meta["num_warps"])
                   for fn, meta in launched if fn in cfg_keys}
            assert got and got <= expected, (got, expected)
            # another dtype is another key: tuned again
            args64 = tuple(a.double() for a in args)
            kw64 = {k: v.double() if torch.is_tensor(v) else v for k, v in kw.items()}
            run_triton(args64, kw64, dy.double(), poison=False)
            assert len(runs) > n_tuned
    finally:
        type(autograd._bi_ssd_fwd_kernel).__getitem__ = orig_getitem
        for t in tuners:
            t.__dict__.pop("run", None)
    assert torch.equal(first[0], second[0])
    assert all(torch.equal(first[1][k], second[1][k]) for k in first[1])


def test_force_config_nests():
    """An inner force_config (run_triton's fwd/bwd) keeps the segments, state config and launch mode of the outer
    one, so the segment tests above really run the segments and state configs they name."""
    with force_config(state=1, seg=2 * SEG_MULTIPLE, split=False):
        with force_config(fwd=0, bwd=0):
            assert tuning._forced == dict(fwd=0, bwd=0, state=1, pairs=None, seg=2 * SEG_MULTIPLE, split=False,
                                             ordered=None, fwd_heads=None, pairs_ahead=None,
                                             fwd_ahead=None, bwd_ahead=None)
            assert tuning.segment_rows(1, 1, 10 * SEG_MULTIPLE, torch.device(DEV)) == 2 * SEG_MULTIPLE
        assert tuning._forced["fwd"] is None and tuning._forced["seg"] == 2 * SEG_MULTIPLE
    assert all(v is None for v in tuning._forced.values())




def _stress_inputs(case, b=1, l=1200, h=8, p=16, n=16, seed=6):
    """The GPU suite's stress inputs (tests/stress_recipes.py), at a CPU-sized width."""
    import math

    recipe = STRESS[case]
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to(torch.bfloat16).float()

    dt0 = torch.exp(torch.rand(h, generator=gen) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
    x, B, C = rnd(b, l, h, p), rnd(b, l, 1, n), rnd(b, l, 1, n)
    kw = dict(D=rnd(h), dt_bias=dt0 + torch.log(-torch.expm1(-dt0)), dt_softplus=recipe.get("dt_softplus", True))
    dt = recipe["dt_raw"](gen, (b, l, h))
    A = recipe["A"][:h] if "A" in recipe else -torch.exp(torch.rand(h, generator=gen) * math.log(16.0))
    return [x, dt, A, B, C], kw, rnd(b, l, h, p)


@pytest.mark.slow  # minutes under the interpreter; .ci/run runs the slow tier
@pytest.mark.parametrize("case", ["softplus-input-10", "A-zero-and-huge"])
def test_fast_decays_log_decay_gradients(case):
    """dA and d(dt_bias) are sums of cancelling terms; at fast decays they used to lose accuracy in fp32. Before the
    log-decay floor and the in-chunk summation of the pair terms (commit 1b22b26) these inputs gave dA 1.0e-2,
    d(dt_bias) 1.1e-2, ddt 7.7e-4 (softplus-input-10) and ddt 5.0e-4 (A-zero-and-huge); now 1.5e-4, 5.7e-5, 5.5e-6
    and 5.6e-5. Segments of 128 rows, so the state kernel's and the backward's chunk tiles both take part."""
    args, kw, dy = _stress_inputs(case)
    with force_config(fwd=2, bwd=0, state=2, seg=2 * SEG_MULTIPLE):
        y, grads, ok = run_triton(args, kw, dy, poison=False)
    y_ref, g_ref = run_reference(args, kw, dy)
    errs = {"y": rel_err(y, y_ref), **{k: rel_err(grads[k], g_ref[k]) for k in g_ref}}
    loose = ("A", "dt_bias")
    bad = {k: v for k, v in errs.items() if not v <= (2e-3 if k in loose else 2e-4)}
    assert not bad, f"{case}: {bad} (all: {errs})"


def test_one_segment_calls_have_no_boundary_states(monkeypatch):
    """A one-segment call launches no state kernel and passes the kernels a one-element stand-in for its boundary
    states, the same one for every call of a (device, dtype): no allocation, no fill launch, and nothing stored or
    read there (filled with NaN, it leaves every output finite and correct, and stays NaN)."""
    launched = []
    orig = autograd._launch

    def spy(jit_fn, tuned_fn, configs, which, grid_fn, args, kwargs, cfg=None):
        launched.append(which)
        return orig(jit_fn, tuned_fn, configs, which, grid_fn, args, kwargs, cfg)

    monkeypatch.setattr(autograd, "_launch", spy)
    autograd._stand_ins.clear()
    stand_in = autograd._no_states(torch.float32, torch.device("cpu"))
    stand_in.fill_(float("nan"))
    for l, h in ((SEG_MULTIPLE - 3, 2), (SEG_MULTIPLE, 3)):
        args, kw = make_inputs(b=2, l=l, h=h, g=1, p=16, n=16)
        with force_config(seg=SEG_MULTIPLE):
            check_case(args, kw)
    assert "state" not in launched and "bwd" in launched, launched
    assert list(autograd._stand_ins.values()) == [stand_in] and stand_in.numel() == 1
    assert bool(stand_in.isnan().all()), "a kernel wrote into the stand-in"


def test_backward_reads_the_forwards_boundary_states(monkeypatch):
    """With several segments the forward's boundary states S_f, S_b are kept for the backward, which computes only the
    state gradients: the forward walks its states at the backward's precision (DOT_ST) when a gradient is wanted, and
    at tf32 when not; the backward's state launch is the gradient one; the kept states are what the backward reads
    (poisoned, they poison its gradients)."""
    launched = []
    orig = autograd._launch

    def spy(jit_fn, tuned_fn, configs, which, grid_fn, args, kwargs, cfg=None):
        if which == "state":
            launched.append((kwargs["GRAD"], kwargs["DOT_ST"]))
        return orig(jit_fn, tuned_fn, configs, which, grid_fn, args, kwargs, cfg)

    monkeypatch.setattr(autograd, "_launch", spy)
    args, kw = make_inputs(b=1, l=3 * SEG_MULTIPLE + 5, h=2, g=1, p=16, n=16)
    dst = autograd._dot_precisions(args[0])["DOT_ST"]
    assert dst != "tf32"
    with force_config(seg=SEG_MULTIPLE):
        check_case(args, kw)
        assert launched == [(False, dst), (True, dst)], launched
        launched.clear()
        with torch.no_grad():
            bi_ssd_triton(*args, **kw)
        assert launched == [(False, "tf32")], launched
        leaves = [a.detach().clone().requires_grad_(True) for a in args]
        y = bi_ssd_triton(*leaves, **kw)
        st = y.grad_fn.saved_tensors[-1]
        assert st.shape == (2, 2, 3, 16, 16) and bool(torch.isfinite(st).all())  # 4 segments: 3 boundaries
        st.data.fill_(float("nan"))  # the saved storage itself (through .data: no version bump, no autograd error)
        y.backward(torch.ones_like(y))
    # (S_f, S_b feed dC through dz S^T, and dt, A through the log-decay terms; dx reads only the state gradients)
    assert not bool(torch.isfinite(leaves[4].grad).all()) and bool(torch.isfinite(leaves[0].grad).all())


@pytest.mark.parametrize("opt", [dict(direction="both", shift=True, sep=True), dict(direction="backward"),
                                 dict(direction="both", g=2, h=4)])
def test_kernels_after_the_forward_kernel_read_its_processed_dt(monkeypatch, opt):
    """The forward kernel stores each direction's processed dt (softplus, bias, limits); the forward pairs kernel and
    the backward's state, segment and pairs kernels read it as it is (no softplus, no bias), and only the last pass
    (ddt, dA, d dt_bias) takes dt as given. Over several segments, two headdim blocks (the first block's programs
    store it) and active limits, against the float64 reference with every buffer NaN-poisoned (a row the forward
    kernel did not store would poison the gradients)."""
    seen = []
    orig = autograd._launch

    def spy(jit_fn, tuned_fn, configs, which, grid_fn, args, kwargs, cfg=None):
        seen.append((which, kwargs.get("GRAD"), kwargs["SOFTPLUS"], kwargs["HAS_BIAS"]))
        return orig(jit_fn, tuned_fn, configs, which, grid_fn, args, kwargs, cfg)

    monkeypatch.setattr(autograd, "_launch", spy)
    opt = dict(opt)
    direction, shift = opt.pop("direction"), opt.pop("shift", False)
    args, kw = make_inputs(l=3 * SEG_MULTIPLE + 5, p=40, dt_limit=(0.05, 0.9), seed=31, **opt)
    kw.update(direction=direction, shift=shift)
    assert kw["dt_softplus"] and kw["dt_bias"] is not None
    with force_config(seg=SEG_MULTIPLE, fwd=_first_with_q(FWD_CONFIGS, 32)):
        assert FWD_CONFIGS[_first_with_q(FWD_CONFIGS, 32)].kwargs["BLOCK_P"] < 40  # two headdim blocks
        check_case(args, kw, None, 0)
    as_given, processed = (True, True), (False, False)
    want = [("state", False, *as_given), ("fwd", None, *as_given), ("fwd_pairs", None, *processed),
            ("state", True, *processed)]
    assert seen[:4] == want, seen
    assert {s[0] for s in seen[4:]} == {"bwd", "pairs"} and all(s[2:] == processed for s in seen[4:]), seen


def test_sizes_beyond_the_kernels_are_refused_before_launch():
    """headdim / d_state the kernels cannot hold in shared memory (measured for sm_90, see
    api.triton_dims_supported): backend="triton" raises a ValueError naming both sizes, before any launch;
    backend="auto" falls back to the PyTorch op there."""
    from yolo_bimamba.ops.bi_ssd.api import auto_picks_triton
    from yolo_bimamba.ops.bi_ssd.api import triton_dims_supported

    assert triton_dims_supported(128, 128, torch.float32) and triton_dims_supported(100, 33, torch.float32)
    assert triton_dims_supported(64, 256, torch.bfloat16) and triton_dims_supported(256, 48, torch.bfloat16)
    assert not triton_dims_supported(64, 256, torch.float32)
    assert not triton_dims_supported(128, 256, torch.bfloat16) and not triton_dims_supported(256, 129, torch.bfloat16)
    assert not triton_dims_supported(64, 257, torch.bfloat16) and not triton_dims_supported(256, 256, torch.bfloat16)
    assert triton_dims_supported(256, 64, torch.float16) and not triton_dims_supported(128, 256, torch.float16)
    assert triton_dims_supported(64, 128, torch.float64) and not triton_dims_supported(128, 128, torch.float64)
    assert auto_picks_triton(64, 64, torch.bfloat16) and not auto_picks_triton(256, 256, torch.bfloat16)

    launches = []
    orig = autograd._launch
    autograd._launch = lambda *a, **k: launches.append(a)
    try:
        for p, n, dtype in ((256, 256, torch.bfloat16), (64, 256, torch.float32), (200, 130, torch.bfloat16),
                            (128, 128, torch.float64)):
            args, kw = make_inputs(l=5, p=p, n=n, dtype=dtype, guard=False)
            with pytest.raises(ValueError, match=rf"headdim \(x.shape\[3\]\) and d_state.*got headdim {p}, d_state {n}"):
                bi_ssd(*args, **kw, backend="triton")
            y = bi_ssd(*args, **kw, backend="auto")  # CPU tensors: the PyTorch op, at any size
            assert torch.isfinite(y).all()
    finally:
        autograd._launch = orig
    assert not launches


@pytest.mark.parametrize("fi", range(len(FWD_CONFIGS)))
@pytest.mark.parametrize("p,n", [(64, 256), (256, 48)])
def test_kernels_at_256_tiles(monkeypatch, p, n, fi):
    """headdim or d_state of 256 (tiles of 256, taken for 16-bit inputs on the GPU): the kernels' arithmetic at those
    tile sizes, in fp32 under the interpreter (which cannot run bf16), against float64; L not a multiple of a chunk and
    two segments. Every forward and state config, and every backward config that is not pruned at these sizes."""
    from yolo_bimamba.ops.bi_ssd.tuning import bwd_config_fits

    monkeypatch.setattr(autograd, "validate_bi_ssd", lambda *a, **k: None)  # fp32 is refused at 256 on the GPU
    fitting = [i for i, c in enumerate(BWD_CONFIGS) if bwd_config_fits(c, p, n)]
    assert len(fitting) >= 2
    args, kw = make_inputs(l=SEG_MULTIPLE + 7, h=2, p=p, n=n, seed=p + n)
    with force_config(state=fi, seg=SEG_MULTIPLE):
        check_case(args, kw, fi, fitting[fi % len(fitting)])


def test_default_backward_config_rule(monkeypatch):
    """Without autotuning (and under the interpreter, nothing forced): the two-stage backward config at headdim and
    d_state <= 32, config 0 above; the op launches the one the rule names."""
    rule = tuning.default_config
    assert rule("bwd", dict(P=32, N=32)) == rule("bwd", dict(P=16, N=8)) == tuning.DEFAULT_BWD_SMALL
    assert rule("bwd", dict(P=64, N=32)) == rule("bwd", dict(P=32, N=64)) == tuning.DEFAULT_CONFIGS["bwd"]
    assert BWD_CONFIGS[tuning.DEFAULT_BWD_SMALL].num_stages == 2
    assert rule("fwd", dict(P=16, N=16)) == rule("fwd", dict(P=32, N=32)) == tuning.DEFAULT_FWD_SMALL
    assert rule("fwd", dict(P=64, N=32)) == tuning.DEFAULT_CONFIGS["fwd"]
    assert FWD_CONFIGS[tuning.DEFAULT_FWD_SMALL].kwargs == dict(BLOCK_Q=64, BLOCK_P=32)
    # the backward's pairs kernel: 2 warps in chunks of 32 rows, 4 in chunks of 64; the forward's: 2 warps in chunks
    # of either size (as measured on an H200)
    for pn in (dict(P=32, N=32), dict(P=64, N=64), dict(P=64, N=32), dict(P=64, N=128)):
        assert PAIRS_CONFIGS[rule("pairs", dict(pn, BLOCK_Q=32))].num_warps == 2
        assert PAIRS_CONFIGS[rule("pairs", dict(pn, BLOCK_Q=64))].num_warps == 4
        assert PAIRS_CONFIGS[rule("fwd_pairs", dict(pn, BLOCK_Q=32))].num_warps == 2
        assert PAIRS_CONFIGS[rule("fwd_pairs", dict(pn, BLOCK_Q=64))].num_warps == 2
    launched = []
    orig = autograd._run_config

    def spy(jit_fn, grid_fn, args, kwargs, cfg):
        if jit_fn is autograd._bi_ssd_bwd_kernel:
            launched.append((kwargs["P"], cfg))
        elif jit_fn is autograd._bi_ssd_fwd_pairs_kernel:
            fwd_pairs.append((kwargs["BLOCK_Q"], cfg.num_warps))
        return orig(jit_fn, grid_fn, args, kwargs, cfg)

    fwd_pairs = []
    monkeypatch.setattr(autograd, "_run_config", spy)
    for p in (16, 64):
        args, kw = make_inputs(b=1, l=40, h=2, g=1, p=p, n=16)
        check_case(args, kw)
    # (BiMamba2 mode: one backward launch for both directions at these sizes, see test_split_directions_rule)
    assert launched == [(16, BWD_CONFIGS[tuning.DEFAULT_BWD_SMALL]),
                        (64, BWD_CONFIGS[tuning.DEFAULT_CONFIGS["bwd"]])], launched
    # the forward's pairs kernel in the chunks of 64 of the forward's default configs, with 2 warps
    assert fwd_pairs == [(64, 2), (64, 2)], fwd_pairs


def test_split_directions_rule(monkeypatch):
    """Default ("auto"): one backward launch for BiMamba2 mode at headdim and d_state <= 64, two otherwise; the
    environment's "0" / "1" force one / two."""
    rule = tuning._split_directions
    monkeypatch.setattr(config, "SPLIT_DIRECTIONS", "auto")
    assert not rule(32, 32, True) and not rule(16, 24, True) and not rule(64, 64, True) and not rule(64, 32, True)
    assert rule(64, 128, True) and rule(128, 64, True) and rule(32, 32, False) and rule(64, 64, False)
    monkeypatch.setattr(config, "SPLIT_DIRECTIONS", "0")
    assert not rule(64, 64, False)
    monkeypatch.setattr(config, "SPLIT_DIRECTIONS", "1")
    assert rule(32, 32, True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("d_per_p,has_bias", [(True, True), (False, True), (True, False)])
def test_grad_sums_kernel_many_rows(dtype, d_per_p, has_bias):
    """_bi_ssd_grad_sums_kernel at more rows than one step of it (batch 37 > 16 rows, 3 segments: several steps and
    a masked tail; the op tests run batches of 1-2): dA, d dt_bias, dD equal the float64 sums of the partials, every
    element of the NaN-poisoned outputs written, nothing written past them (NaN guards), the same bits run to run."""
    from yolo_bimamba.ops.bi_ssd.kernels_reductions import _bi_ssd_grad_sums_kernel
    from yolo_bimamba.ops.bi_ssd.autograd import compute_dtype, kernel_tile, launch
    from yolo_bimamba.ops.bi_ssd.tuning import GRAD_SUM_ROWS as _GRAD_SUM_ROWS

    b, h, nseg, p = 37, 3, 3, 5
    assert b > _GRAD_SUM_ROWS and (b * nseg) % _GRAD_SUM_ROWS != 0
    gen = torch.Generator().manual_seed(7)
    part = torch.randn(b, h, 2, generator=gen, dtype=torch.float64)
    part_d = torch.randn(b, h, nseg, p, generator=gen, dtype=torch.float64)
    d_shape = (h, p) if d_per_p else (h,)

    def run():  # outputs from the op's own allocator, NaN-filled inside NaN guards (poison_outputs)
        with kernel_buffers.poison_outputs(True):
            dA, dbias, dD = (autograd._alloc(s, dtype, DEV) for s in ((h,), (h,), d_shape))
            launch(_bi_ssd_grad_sums_kernel, (h,), (part.to(dtype).to(DEV), part_d.to(dtype).to(DEV), dA,
                                                    dbias if has_bias else dA, dD, b, h, nseg),
                   dict(P=p, BLOCK_P=kernel_tile(p), BLOCK_R=_GRAD_SUM_ROWS, HAS_BIAS=has_bias, HAS_D=True,
                        D_PER_P=d_per_p, COMPUTE=compute_dtype(dtype), num_warps=1))
            assert kernel_buffers.check_guards(), "a write outside the outputs"
        return dA.cpu(), dbias.cpu(), dD.cpu()

    dA, dbias, dD = run()
    want_d = part_d.sum((0, 2))
    checks = [(dA, part[..., 0].sum(0)), (dD, want_d if d_per_p else want_d.sum(1))]
    if has_bias:
        checks.append((dbias, part[..., 1].sum(0)))
    else:
        assert torch.isnan(dbias).all()  # HAS_BIAS=False writes no d dt_bias
    for got, want in checks:
        assert not torch.isnan(got).any()
        torch.testing.assert_close(got.double(), want, rtol=TOL[dtype], atol=TOL[dtype])
    again = run()
    for x, y in zip((dA, dbias, dD), again):
        assert torch.equal(x.nan_to_num(), y.nan_to_num())
