"""Fused Triton bi-SSD kernels vs the float64 reference, under the Triton interpreter on CPU: every config forced
alone, the length sweeps, the option matrix, loads ahead, segments, ordered group rows (determinism, stress inputs,
dispatch, autotuning and the rules: test_triton_kernels_behaviour.py).

Every forward and backward config is forced in turn; outputs and gradient buffers are poisoned
with NaN and surrounded by NaN guard regions (an unwritten element or a stray write fails).
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any triton kernel module is imported

import pytest  # noqa: E402
import torch  # noqa: E402

triton = pytest.importorskip("triton")

from yolo_bimamba import config  # noqa: E402
from yolo_bimamba.ops.bi_ssd import autograd, tuning  # noqa: E402
from yolo_bimamba.ops import kernel_buffers  # noqa: E402
from yolo_bimamba.ops.bi_ssd.autograd import bi_ssd_triton  # noqa: E402
from yolo_bimamba.ops.bi_ssd.tuning import (  # noqa: E402
    BWD_CONFIGS, FWD_CONFIGS, PAIRS_CONFIGS, SEG_MULTIPLE, STATE_CONFIGS, force_config,
)
from bi_ssd_check import (  # noqa: E402
    DEV, TOL, _first_with_q, _qb, _qf, check_case, make_inputs, rel_err, run_reference, run_triton,
)

if DEV == "cpu" and not tuning._INTERPRET:
    pytest.skip("no CUDA and TRITON_INTERPRET is not set", allow_module_level=True)


# ---------------------------------------------------------------------------------------------
# 1. full length sweep, one forward and one backward config per BLOCK_Q
_QS = sorted({c.kwargs["BLOCK_Q"] for c in FWD_CONFIGS} | {c.kwargs["BLOCK_Q"] for c in BWD_CONFIGS})
# options rotate over the lengths so each BLOCK_Q sees every feature at least once
_OPTS = [
    dict(direction="both"),
    dict(direction="both", shift=True, sep=True, g=2, h=4),
    dict(direction="forward", d_shape="h", dt_limit=(0.05, 0.6)),
    dict(direction="backward", shift=True, bias=False),
    dict(direction="both", shift=True, d_shape=None, softplus=False),
    dict(direction="both", g=2, h=4, dt_limit=(0.0, 0.5), sep=True),
]


@pytest.mark.parametrize("q", _QS)
@pytest.mark.parametrize("which", range(6))
def test_length_sweep(q, which):
    lengths = [1, 7, q - 1, q, q + 1, 3 * q + 5]
    l = lengths[which]
    opt = dict(_OPTS[(which + _QS.index(q)) % len(_OPTS)])
    direction = opt.pop("direction")
    shift = opt.pop("shift", False)
    args, kw = make_inputs(l=l, seed=l, **opt)
    kw.update(direction=direction, shift=shift)
    fi = _first_with_q(FWD_CONFIGS, q) if any(c.kwargs["BLOCK_Q"] == q for c in FWD_CONFIGS) else 0
    bi = _first_with_q(BWD_CONFIGS, q) if any(c.kwargs["BLOCK_Q"] == q for c in BWD_CONFIGS) else 0
    check_case(args, kw, fi, bi)


# 2. every config forced alone, smaller sweep
@pytest.mark.parametrize("fi", range(len(FWD_CONFIGS)))
def test_every_fwd_config(fi):
    q = _qf(fi)
    for l, opt in [(q + 3, dict(direction="both", shift=True, sep=True)), (2 * q + 1, dict(direction="both", p=40))]:
        opt = dict(opt)
        direction, shift = opt.pop("direction"), opt.pop("shift", False)
        args, kw = make_inputs(l=l, seed=fi, **opt)
        kw.update(direction=direction, shift=shift)
        check_case(args, kw, fi, 0)


@pytest.mark.parametrize("bi", range(len(BWD_CONFIGS)))
def test_every_bwd_config(bi):
    q = _qb(bi)
    for l, opt in [(q + 3, dict(direction="both", shift=True, sep=True, g=2, h=4)), (2 * q + 1, dict(direction="both", p=24, n=20))]:
        opt = dict(opt)
        direction, shift = opt.pop("direction"), opt.pop("shift", False)
        args, kw = make_inputs(l=l, seed=bi, **opt)
        kw.update(direction=direction, shift=shift)
        check_case(args, kw, 0, bi)


@pytest.mark.parametrize("pi", range(len(PAIRS_CONFIGS)))
def test_every_pairs_config(pi):
    """The forward's and the backward's in-chunk pairs kernels under each of their configs, in both chunk sizes of the
    backward (its segment kernel's BLOCK_Q) and every forward tile (BLOCK_Q, BLOCK_P), in BiMamba2, Hydra and
    one-direction modes; the forward one also walking a group's heads."""
    cases = [(_first_with_q(BWD_CONFIGS, 32), 40, dict(direction="both")),
             (_first_with_q(BWD_CONFIGS, 64), 70, dict(direction="both", shift=True, sep=True, g=2, h=4)),
             (_first_with_q(BWD_CONFIGS, 32), 33, dict(direction="backward", d_shape="hp")),
             # one head per group: no per-head buffers, the pairs kernel adds to the segment kernel's dB, dC in place
             (_first_with_q(BWD_CONFIGS, 32), 45, dict(direction="both", g=2, h=2)),
             (_first_with_q(BWD_CONFIGS, 64), 66, dict(direction="both", shift=True, sep=True, g=2, h=2))]
    # the forward pairs kernel walking a group's heads (GROUPED, two per program: blocks 2 + 1), both modes
    grouped = [(_first_with_q(BWD_CONFIGS, 32), 41, dict(direction="both", h=3)),
               (_first_with_q(BWD_CONFIGS, 32), 37, dict(direction="both", shift=True, sep=True, h=3))]
    for (bi, l, opt), heads in [(c, None) for c in cases] + [(c, 2) for c in grouped]:
        opt = dict(opt)
        direction, shift = opt.pop("direction"), opt.pop("shift", False)
        args, kw = make_inputs(l=l, seed=l + pi, **opt)
        kw.update(direction=direction, shift=shift)
        with force_config(pairs=pi, fwd_heads=heads):
            check_case(args, kw, (bi + pi) % len(FWD_CONFIGS), bi)


_FWD_HEADS_MODES = [dict(direction="both"), dict(direction="both", shift=True, sep=True),
                    dict(direction="backward", shift=True), dict(direction="forward", d_shape="h")]


@pytest.mark.parametrize("mode", range(len(_FWD_HEADS_MODES)))
def test_fwd_pairs_heads_per_program(mode):
    """The forward's in-chunk pairs kernel computes C B^T once per program and walks that many heads of the group: y
    is the same, bit for bit, with one head per program, blocks of two (the group of three cut 2 + 1), the whole group
    and more than a group (clamped), in BiMamba2, Hydra and one-direction modes, over two headdim blocks and a partial
    last chunk; and the whole op (gradients too) matches the float64 reference with blocks of two."""
    opt = dict(_FWD_HEADS_MODES[mode])
    direction, shift = opt.pop("direction"), opt.pop("shift", False)
    fi = _first_with_q(FWD_CONFIGS, 32)
    assert FWD_CONFIGS[fi].kwargs["BLOCK_P"] < 40  # two headdim blocks
    args, kw = make_inputs(l=2 * 32 + 5, h=6, g=2, p=40, seed=50 + mode, **opt)
    kw.update(direction=direction, shift=shift)
    ys = {}
    for heads in (1, 2, 3, 5):
        with force_config(fwd=fi, fwd_heads=heads), torch.no_grad(), kernel_buffers.poison_outputs(True):
            ys[heads] = bi_ssd_triton(*args, **kw)
    assert torch.isfinite(ys[1]).all()
    for heads in (2, 3, 5):
        assert torch.equal(ys[heads], ys[1]), heads
    with force_config(fwd_heads=2):
        check_case(args, kw, fi, 0)


_BWD_PAIRS_AHEAD_MODES = [(dict(direction="both", g=2, h=6), 32),
                          (dict(direction="both", shift=True, sep=True, h=3), 64),
                          (dict(direction="backward", g=1, h=3), 32), (dict(direction="both", g=2, h=2), 64)]


@pytest.mark.slow  # every load-ahead combination bit for bit (the rule's own choice: fast tier); .ci/run runs the slow tier
@pytest.mark.parametrize("mode", range(len(_BWD_PAIRS_AHEAD_MODES)))
def test_bwd_pairs_ahead(mode):
    """The backward's in-chunk pairs kernel with each head's inputs loaded one head ahead (AHEAD bit 1) and the rows it
    adds to loaded before its products (bit 2): every gradient is the same, bit for bit, with each of the four
    combinations, in BiMamba2 (three heads per group), Hydra, one-direction and one-head-per-group modes, in chunks of
    32 and 64 with a partial last chunk; and the op matches the float64 reference with each."""
    opt, q = _BWD_PAIRS_AHEAD_MODES[mode]
    opt = dict(opt)
    direction, shift = opt.pop("direction"), opt.pop("shift", False)
    bi = _first_with_q(BWD_CONFIGS, q)
    args, kw = make_inputs(l=2 * q + 7, seed=70 + mode, **opt)
    kw.update(direction=direction, shift=shift)
    dy = torch.randn(args[0].shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64).to(args[0].dtype)
    grads = {}
    for ahead in range(4):
        with force_config(pairs_ahead=ahead):
            assert tuning.bwd_pairs_ahead() == ahead
            _y, grads[ahead], guards_ok = run_triton(args, kw, dy, 0, bi)
        assert guards_ok, ahead
    for name, g0 in grads[0].items():
        assert g0 is None or torch.isfinite(g0).all(), name
        for ahead in (1, 2, 3):
            g = grads[ahead][name]
            assert (g is None and g0 is None) or torch.equal(g, g0), (ahead, name)
    for ahead in (0, 1, 3):  # (2, the default at every size, is every other test's)
        with force_config(pairs_ahead=ahead):
            check_case(args, kw, 0, bi)


_FWD_AHEAD_MODES = [dict(direction="both", g=2, h=4), dict(direction="both", shift=True, sep=True),
                    dict(direction="forward", d_shape="h"), dict(direction="backward", shift=True)]


@pytest.mark.slow  # every load-ahead combination bit for bit (the rule's own choice: fast tier); .ci/run runs the slow tier
@pytest.mark.parametrize("mode", range(len(_FWD_AHEAD_MODES)))
def test_fwd_ahead(mode):
    """The forward kernel with its loads moved ahead (fwd_ahead_bits: its chunk inputs one chunk ahead, its
    anti-causal pass's early read of y): y is the same, bit for bit, with each of the four combinations, in BiMamba2,
    Hydra and one-direction modes, over several segments, two headdim blocks and a partial last chunk, under the
    forward configs of both chunk sizes; and the op matches the float64 reference with the loads at their use (0)."""
    opt = dict(_FWD_AHEAD_MODES[mode])
    direction, shift = opt.pop("direction"), opt.pop("shift", False)
    args, kw = make_inputs(l=2 * SEG_MULTIPLE + 37, p=40, seed=90 + mode, **opt)
    kw.update(direction=direction, shift=shift)
    for fi in (_first_with_q(FWD_CONFIGS, 32), _first_with_q(FWD_CONFIGS, 64)):
        assert FWD_CONFIGS[fi].kwargs["BLOCK_P"] < 40  # two headdim blocks
        ys = {}
        for bits in range(4):
            with force_config(fwd=fi, seg=SEG_MULTIPLE, fwd_ahead=bits), torch.no_grad(), \
                    kernel_buffers.poison_outputs(True):
                assert tuning.fwd_ahead_bits(16, 16) == bits
                ys[bits] = bi_ssd_triton(*args, **kw)
        assert torch.isfinite(ys[0]).all()
        for bits in range(1, 4):
            assert torch.equal(ys[bits], ys[0]), (fi, bits)
    with force_config(fwd_ahead=0):
        check_case(args, kw, 0, 0)
    with pytest.raises(ValueError, match="fwd_ahead"):
        with force_config(fwd_ahead=4):
            pass


def test_fwd_ahead_rule():
    """The forward kernel's loads ahead up to d_state 64, none above (forced values are taken as they are)."""
    rule = tuning.fwd_ahead_bits
    assert rule(16, 16) == rule(64, 64) == rule(128, 64) == rule(64, 33) == 3
    assert rule(64, 128) == rule(32, 65) == rule(64, 256) == 0
    with force_config(fwd_ahead=1):
        assert rule(64, 128) == 1


def test_bwd_pairs_ahead_rule():
    """The rows a head adds to loaded early at every size, its inputs at their use (on an H100 one head ahead was
    slower at 32 x 32 too); forced values are taken as they are, and only 0-3."""
    rule = tuning.bwd_pairs_ahead
    assert rule() == 2
    with force_config(pairs_ahead=0):
        assert rule() == 0
    with pytest.raises(ValueError, match="pairs_ahead"):
        with force_config(pairs_ahead=4):
            pass


_BWD_AHEAD_MODES = [(dict(direction="both", g=2, h=4), dict(split=False)),
                    (dict(direction="both", d_shape="h"), dict(split=True)),
                    (dict(direction="both", shift=True, sep=True), dict()),
                    (dict(direction="backward", shift=True), dict())]


@pytest.mark.slow  # every load-ahead combination bit for bit (the rule's own choice: fast tier); .ci/run runs the slow tier
@pytest.mark.parametrize("mode", range(len(_BWD_AHEAD_MODES)))
def test_bwd_ahead(mode):
    """The backward segment kernel with each subset of a chunk's B and C (bit 1), dz (bit 2) and x (bit 4) loaded one
    chunk ahead, the rest at their use: every gradient is the same, bit for bit, for all eight values, in BiMamba2
    (both directions in one launch and in two), Hydra and one-direction modes, over several segments with a partial
    last chunk, in chunks of 32 and 64; and the op matches the float64 reference with the values the rule takes above
    32 x 32 tiles (3, 2)."""
    opt, forced = _BWD_AHEAD_MODES[mode]
    opt = dict(opt)
    direction, shift = opt.pop("direction"), opt.pop("shift", False)
    args, kw = make_inputs(l=2 * SEG_MULTIPLE + 37, seed=110 + mode, **opt)
    kw.update(direction=direction, shift=shift)
    dy = torch.randn(args[0].shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64).to(args[0].dtype)
    bi = _first_with_q(BWD_CONFIGS, (32, 64)[mode % 2])
    grads = {}
    for bits in range(8):
        with force_config(seg=SEG_MULTIPLE, bwd_ahead=bits, **forced):
            assert tuning.bwd_ahead_bits(16, 16) == bits
            _y, grads[bits], guards_ok = run_triton(args, kw, dy, 0, bi)
        assert guards_ok, bits
    for name, g0 in grads[0].items():
        assert g0 is None or torch.isfinite(g0).all(), name
        for bits in range(1, 8):
            g = grads[bits][name]
            assert (g is None and g0 is None) or torch.equal(g, g0), (bits, name)
    with force_config(seg=SEG_MULTIPLE, bwd_ahead=(3, 2)[mode % 2], **forced):
        check_case(args, kw, 0, bi)


def test_bwd_ahead_rule():
    """Every input a chunk ahead up to tiles of 32 x 32, B, C and dz up to 64 x 64, dz alone above; forced values are
    taken as they are, and only 0-7."""
    rule = tuning.bwd_ahead_bits
    assert rule(16, 16) == rule(32, 32) == rule(24, 20) == 7
    assert rule(64, 32) == rule(32, 64) == rule(64, 64) == rule(40, 33) == 3
    assert rule(64, 128) == rule(128, 64) == rule(128, 128) == rule(64, 256) == 2
    with force_config(bwd_ahead=5):
        assert rule(64, 128) == 5
    with pytest.raises(ValueError, match="bwd_ahead"):
        with force_config(bwd_ahead=8):
            pass


def test_fwd_pairs_heads_rule():
    """From d_state 128: whole groups per program where that leaves 4 programs per SM (the interpreter's 4 SMs: 16),
    equal blocks of the group where it does not, one head where even one head per program leaves too few; one head
    below d_state 128; forced values are clamped to the group."""
    dev = torch.device("cpu")
    rule = tuning.fwd_pairs_heads
    assert rule(1, 1, 8, 16, 128, dev) == 8
    assert rule(2, 2, 8, 4, 128, dev) == 8
    assert rule(1, 1, 8, 5, 128, dev) == 2  # 4 blocks of 2: 20 programs
    assert rule(1, 1, 8, 6, 256, dev) == 3  # 3 blocks (3, 3, 2): 18 programs
    assert rule(1, 1, 8, 1, 128, dev) == 1
    assert rule(1, 1, 1, 1, 128, dev) == 1
    assert rule(1, 1, 8, 16, 64, dev) == 1
    assert rule(1, 1, 8, 16, 100, dev) == 8  # (a tile of 128)
    with force_config(fwd_heads=5):
        assert rule(1, 1, 3, 1, 16, dev) == 3
        assert rule(1, 1, 8, 100, 16, dev) == 5
    with pytest.raises(ValueError, match="fwd_heads"):
        with force_config(fwd_heads=0):
            pass


# 2a. the backward segment kernel's ways of loading a chunk: every input one chunk ahead (tiles up to
#     kernels_common.AHEAD_MAX_TILE, every other test's sizes), or some of its tiles at their use (larger tiles:
#     headdim x d_state 64 x 64 and up on the GPU, tuning.bwd_ahead_bits). All of them at their use (0) and the
#     rule's values above 32 x 32 tiles (3: B, C and dz ahead; 2: dz ahead), forced here at small sizes, under every
#     backward config and in every mode of the kernel (one and two launches, Hydra's own backward inputs and shift, one
#     direction).
_AT_USE_MODES = [
    (dict(direction="both"), dict(split=False)),
    (dict(direction="both"), dict(split=True)),
    (dict(direction="both", shift=True, sep=True, g=2, h=4), dict(split=True)),
    (dict(direction="both", shift=True, sep=True), dict(split=False)),
    (dict(direction="both", shift=True, d_shape="h"), dict()),
    (dict(direction="backward"), dict()),
]
_AT_USE_BITS = (0, 3, 2, 0, 3, 2)


@pytest.mark.parametrize("bi", range(len(BWD_CONFIGS)))
def test_every_bwd_config_with_tiles_loaded_at_use(monkeypatch, bi):
    launched = []
    orig = autograd._run_config

    def spy(jit_fn, grid_fn, args, kwargs, cfg):
        if jit_fn is autograd._bi_ssd_bwd_kernel:
            launched.append(kwargs["AHEAD"])
        return orig(jit_fn, grid_fn, args, kwargs, cfg)

    monkeypatch.setattr(autograd, "_run_config", spy)
    q = _qb(bi)
    for i, ((opt, forced), bits) in enumerate(zip(_AT_USE_MODES, _AT_USE_BITS)):
        opt = dict(opt)
        direction, shift = opt.pop("direction"), opt.pop("shift", False)
        args, kw = make_inputs(l=2 * q + 5 + i, seed=10 * bi + i, **opt)
        kw.update(direction=direction, shift=shift)
        launched.clear()
        with force_config(bwd_ahead=bits, **forced):
            check_case(args, kw, 0, bi)
        assert launched and set(launched) == {bits}, (i, launched)


# 2b. segment-parallel passes: every state-kernel config, several segments (the last one partial), the backward's
#     two directions in two launches (default) and in one
@pytest.mark.parametrize("si", range(len(STATE_CONFIGS)))
@pytest.mark.parametrize("split", [True, False])
def test_every_state_config_and_segments(si, split):
    seg = SEG_MULTIPLE
    for l, opt in [(3 * seg + 5, dict(direction="both", shift=True, sep=True, g=2, h=4)),
                   (2 * seg + 9, dict(direction="both", d_shape="h", dt_limit=(0.05, 0.8))),
                   (2 * seg - 3, dict(direction="forward", shift=True)),
                   (seg + 1, dict(direction="backward", bias=False))]:
        opt = dict(opt)
        direction, shift = opt.pop("direction"), opt.pop("shift", False)
        args, kw = make_inputs(l=l, seed=l + si, **opt)
        kw.update(direction=direction, shift=shift)
        with force_config(state=si, seg=seg, split=split):
            check_case(args, kw, si % len(FWD_CONFIGS), si % len(BWD_CONFIGS))


@pytest.mark.slow  # minutes under the interpreter; .ci/run runs the slow tier
def test_segment_length_does_not_change_the_result():
    """One segment, segments of 1 and 2 chunks: the same function (the states at the boundaries come from the state
    kernel, the rest from the segment kernels). Each against the float64 reference (dA and d dt_bias measured
    against their cancellation scale, see check_case), and y, dx, dB, dC against the one-segment run."""
    args, kw = make_inputs(b=2, l=4 * SEG_MULTIPLE + 7, h=2, sep=True)
    kw.update(shift=True)
    dy = torch.randn(args[0].shape, generator=torch.Generator().manual_seed(4)).to(DEV)
    out = []
    for seg in (8 * SEG_MULTIPLE, SEG_MULTIPLE, 2 * SEG_MULTIPLE):
        with force_config(seg=seg):
            assert tuning.segment_rows(2, 2, args[0].shape[1], torch.device(DEV)) == seg
            check_case(args, kw, 0, 0)
            out.append(run_triton(args, kw, dy, 0, 0))
    y0, g0, _ = out[0]
    for y, g, ok in out[1:]:
        assert ok
        assert rel_err(y, y0) < 1e-6
        for k in ("x", "B", "C", "B_bwd", "C_bwd", "dt", "dt_bwd"):
            assert rel_err(g[k], g0[k]) < 1e-5, k


def test_force_config_rejects_bad_segments():
    with pytest.raises(ValueError, match="seg"):
        with force_config(seg=SEG_MULTIPLE + 1):
            pass


# 3. option matrix on the smallest tile
@pytest.mark.parametrize("direction", ["both", "forward", "backward"])
@pytest.mark.parametrize("shift", [False, True])
def test_options(direction, shift):
    args, kw = make_inputs(b=2, l=45, h=4, g=2, p=16, n=16, d_shape="h" if shift else "hp", dt_limit=(0.1, 0.9))
    kw.update(direction=direction, shift=shift)
    check_case(args, kw, 0, 0)


@pytest.mark.parametrize("shift", [False, True])
def test_separate_bwd_params(shift):
    args, kw = make_inputs(b=2, l=40, h=2, g=1, sep=True)
    kw.update(shift=shift)
    check_case(args, kw, 0, 0)


def test_float64():
    args, kw = make_inputs(l=70, h=4, g=2, dtype=torch.float64, sep=True, dt_limit=(0.125, 2.0))
    kw.update(shift=True)
    check_case(args, kw, 0, 0)
    args, kw = make_inputs(l=37, h=2, dtype=torch.float64, d_shape="h")
    check_case(args, kw, 0, 0)


@pytest.mark.parametrize("g", [1, 2])
def test_float16_io(g):
    """fp16 inputs: dB, dC are summed in fp32 buffers and stored as fp16, with per-head buffers (g = 1) and with one
    head per group (g = 2)."""
    args, kw = make_inputs(l=40, h=2, g=g, dtype=torch.float16)
    check_case(args, kw, 0, 0, tol=5e-3)



# 2c. ordered group rows (YOLO_BIMAMBA_ORDERED_ROWS=1): the segment kernel adds each head's dB, dC terms to the
#     group's fp32 rows in head order (tickets and per-chunk counters) instead of writing per-head rows
def _spy_bwd_launches(monkeypatch):
    launched = []
    orig = autograd._run_config

    def spy(jit_fn, grid_fn, args, kwargs, cfg):
        if jit_fn is autograd._bi_ssd_bwd_kernel:
            launched.append((kwargs["ORDERED"], kwargs["GRAD_PER_HEAD"], kwargs["ACC"], kwargs["DO_F"], kwargs["DO_B"]))
        return orig(jit_fn, grid_fn, args, kwargs, cfg)

    monkeypatch.setattr(autograd, "_run_config", spy)
    return launched


@pytest.mark.slow  # minutes under the interpreter; .ci/run runs the slow tier
@pytest.mark.parametrize("bi", range(len(BWD_CONFIGS)))
def test_ordered_group_rows_every_bwd_config(monkeypatch, bi):
    """Every backward config, ngroups = 1 and 2 with 4 heads (turns 0..3 and 0..1 per group), both directions (two
    launches: the second one's turns follow the first's) and each alone, several segments (the last one partial):
    against the float64 reference with every output and gradient buffer NaN-poisoned (the group rows too: a turn 0
    that added instead of storing, or a row no head wrote, gives NaN), and the ordered launches did run."""
    launched = _spy_bwd_launches(monkeypatch)
    q = _qb(bi)
    for i, (g, direction) in enumerate([(1, "both"), (2, "both"), (1, "forward"), (2, "backward")]):
        args, kw = make_inputs(b=2, l=2 * SEG_MULTIPLE + q + 5, h=4, g=g, seed=20 * bi + i, d_shape="h")
        kw.update(direction=direction)
        launched.clear()
        with force_config(seg=SEG_MULTIPLE, ordered=True):
            check_case(args, kw, bi % len(FWD_CONFIGS), bi)
        # (ORDERED, GRAD_PER_HEAD, ACC, DO_F, DO_B) of each segment-kernel launch
        want = {"both": [(True, False, False, True, False), (True, False, True, False, True)],
                "forward": [(True, False, False, True, False)],
                "backward": [(True, False, False, False, True)]}[direction]
        assert launched == want, (direction, launched)


def test_ordered_group_rows_rule(monkeypatch):
    """Where the ordered rows run: asked for (force_config or YOLO_BIMAMBA_ORDERED_ROWS), ngroups < nheads and not
    Hydra's separate backward inputs; then both directions take two launches, unless one launch is forced, which
    keeps the per-head rows. Off by default."""
    launched = _spy_bwd_launches(monkeypatch)
    dy = None

    def run(g=1, sep=False, **forced):
        nonlocal dy
        args, kw = make_inputs(b=1, l=40, h=4, p=8, n=16, g=g, sep=sep, guard=False, seed=5)
        dy = torch.randn(1, 40, 4, 8, generator=torch.Generator().manual_seed(6)).float()
        launched.clear()
        with force_config(**forced):
            run_triton(args, kw, dy, poison=False)
        return [(o, ph) for o, ph, *_ in launched]

    assert config.ORDERED_ROWS is False
    assert run() == [(False, True)]  # the default: per-head rows, one launch (BiMamba2 mode at these sizes)
    assert run(ordered=True) == [(True, False)] * 2
    assert run(ordered=True, split=False) == [(False, True)]
    assert run(ordered=True, g=4) == [(False, False)]  # one head per group: nothing to sum, one launch
    assert run(ordered=True, sep=True) == [(False, True)] * 2  # Hydra: per-head rows (two launches at its sizes)
    monkeypatch.setattr(config, "ORDERED_ROWS", True)
    assert run() == [(True, False)] * 2


@pytest.mark.slow  # autotunes the ordered rows over every config (each config alone: the test above); .ci/run runs it
def test_ordered_group_rows_buffers_and_autotuning(monkeypatch):
    """With the ordered rows no per-head (b, L, h, n) buffer is allocated, and the result equals the per-head
    rows' to fp32 rounding (same configs). Under the autotuners (timed on the CPU) too: each timed config restores
    the counters (cnt_ptr in restore_value), or the next config's tickets would name segments past the grid."""
    args, kw = make_inputs(b=2, l=3 * SEG_MULTIPLE + 7, h=4, p=8, n=16, g=1, seed=8)
    per_head_shape = (2, 3 * SEG_MULTIPLE + 7, 4, 16)
    shapes = []
    orig = autograd._alloc

    def alloc(shape, dtype, device):
        shapes.append(tuple(shape))
        return orig(shape, dtype, device)

    monkeypatch.setattr(autograd, "_alloc", alloc)
    dy = torch.randn(args[0].shape, generator=torch.Generator().manual_seed(9)).float()
    with force_config(seg=SEG_MULTIPLE, ordered=False):
        _, per_head, _ = run_triton(args, kw, dy)
    assert per_head_shape in shapes
    shapes.clear()
    with force_config(seg=SEG_MULTIPLE, ordered=True):
        _, ordered, ok = run_triton(args, kw, dy)
    assert ok and per_head_shape not in shapes
    for k in per_head:
        assert rel_err(ordered[k], per_head[k]) <= 1e-6, k
    with tuning.interpreter_autotune(), force_config(seg=SEG_MULTIPLE, ordered=True):
        check_case(args, kw)  # (the tuned configs' chunks differ: against the float64 reference, as every config)


@pytest.mark.parametrize("split", [True, False])
def test_hydra_backward_per_head_buffers(split):
    """Hydra mode with ngroups < nheads: the backward's per-head dB, dC of each direction are its largest buffers.
    With the directions in two launches, the first direction's are summed into its gradients and freed before the
    second's are allocated (two alive at a time, not four); the gradients stay exact."""
    import weakref

    args, kw = make_inputs(b=1, l=40, h=4, p=8, n=16, g=1, sep=True, guard=False, seed=3)
    per_head_shape = (1, 40, 4, 16)
    live, peak = set(), [0]
    orig = autograd._alloc

    def alloc(shape, dtype, device):
        t = orig(shape, dtype, device)
        if tuple(shape) == per_head_shape:
            key = object()
            live.add(key)
            peak[0] = max(peak[0], len(live))
            weakref.finalize(t, live.discard, key)
        return t

    dy = torch.randn(1, 40, 4, 8, generator=torch.Generator().manual_seed(4), dtype=torch.float64).float()
    autograd._alloc = alloc
    try:
        with force_config(split=split, seg=SEG_MULTIPLE):
            y, grads, _ = run_triton(args, kw, dy, poison=False)
    finally:
        autograd._alloc = orig
    assert peak[0] == (2 if split else 4), peak
    y_ref, g_ref = run_reference(args, kw, dy)
    assert rel_err(y, y_ref) <= TOL[torch.float32]
    for k in g_ref:
        assert rel_err(grads[k], g_ref[k]) <= 2e-5, k
