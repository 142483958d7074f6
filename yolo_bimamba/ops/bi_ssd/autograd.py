"""Autograd wrapper of the fused Triton bidirectional SSD kernels (``bi_ssd(..., backend="triton")``).

Forward: a state kernel (segment-boundary states; skipped when the sequence is one segment) and one forward
launch. Backward: a state kernel, one segment-kernel launch per direction (or one for both, ``split=False``) for the
state terms, the in-chunk pairs kernel (which also sums the per-head dB, dC over each group's heads when ngroups <
nheads, unless the segment kernel summed them in head order itself: YOLO_BIMAMBA_ORDERED_ROWS=1), the pass-C kernel,
plus one small launch that sums dA, d dt_bias and dD over the batch. On CUDA the kernels are autotuned over
:data:`FWD_CONFIGS` / :data:`BWD_CONFIGS` / :data:`STATE_CONFIGS` / :data:`PAIRS_CONFIGS` (``YOLO_BIMAMBA_AUTOTUNE=0``:
no autotuning, :func:`default_config`); under the Triton
interpreter (``TRITON_INTERPRET=1``, CPU tensors) the default configs run unless one is forced with
:func:`force_config`.
"""
from __future__ import annotations

import contextlib
import functools
import os

import torch
import triton

from .kernels import (
    AHEAD_MAX_TILE, BWD_CONFIGS, FWD_CONFIGS, PAIRS_CONFIGS, PASS_C_ROWS, SEG_MULTIPLE, STATE_CONFIGS,
    _bi_ssd_bwd_dt_kernel,
    _bi_ssd_bwd_kernel, _bi_ssd_bwd_pairs_kernel, _bi_ssd_fwd_kernel, _bi_ssd_fwd_pairs_kernel,
    _bi_ssd_grad_sums_kernel, _bi_ssd_state_kernel,
    prune_bwd_configs,
)
from ..backend_choice import accumulation_dtype, alloc as _alloc, compute_dtype
from ..backend_choice import check_guards, poison_outputs  # noqa: F401 (test hooks)
from ..launch import launch
from .validate import kernel_tile, validate_bi_ssd

__all__ = ["bi_ssd_triton", "force_config", "FWD_CONFIGS", "BWD_CONFIGS", "STATE_CONFIGS", "PAIRS_CONFIGS"]

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
_forced = {"fwd": None, "bwd": None, "state": None, "pairs": None, "seg": None, "split": None, "ordered": None,
           "fwd_heads": None, "pairs_ahead": None, "fwd_ahead": None, "bwd_ahead": None}
# "both" directions: the backward's segment kernel runs once per direction (the second launch adds to the first's
# dx, dB, dC) instead of once with both directions in one program (fewer registers per program). "auto" (default):
# two launches, except in BiMamba2 mode (SHARE) with headdim and d_state <= 64, where the one launch reuses the causal
# direction's loads for the anti-causal one. Since the in-chunk pairs have their own kernel, one launch was faster on
# an H200 at every detection shape (b32 L1600 h8 p32 n32: 1.296 vs 1.453 ms per fwd+bwd; b16 L1600 h8 p64 n64: 1.127
# vs 1.200), two at the LM shape, p64 n128 (16.1 vs 21.5 ms): benchmarks/results/session10/sweep-cfg-split-*.txt.
# "1" / "0": always / never.
_SPLIT_DIRECTIONS = os.environ.get("YOLO_BIMAMBA_SPLIT_DIRECTIONS", "auto").strip().lower()
_OFF = ("", "0", "false", "no")  # what the two switches above and below read as "no"
# ngroups < nheads (BiMamba2 mode): the backward's segment kernel adds each head's dB, dC terms to the group's fp32 rows
# in head order (ORDERED; one direction per launch) instead of writing per-head rows that the pairs kernel sums: the
# per-head rows were the whole excess of the op's peak memory over 1.1x its I/O (benchmarks/memory_account.py). On an
# H200 (bf16, YOLO_BIMAMBA_AUTOTUNE=0) the ordered rows took fwd+bwd peak memory / I/O from 1.37 to 1.02 at b16 L1600 h8
# p64 n64 and from 1.74 to 0.87 at the LM shape, for 15 % and 13 % more GPU time (1.078 vs 0.938 ms, 15.37 vs
# 13.63 ms; benchmarks/results/session20/kernels-h200-s20-ordered*.md), 8 % more at the detection layers' b32 L1600 h8
# p32 n32 (1.288 vs 1.191 ms, ordinary launches). "0" (default): per-head rows, the faster; "1": ordered group rows
_ORDERED_ROWS = os.environ.get("YOLO_BIMAMBA_ORDERED_ROWS", "0").strip().lower() not in _OFF
# segment-parallel kernels: aim for about this many backward programs per streaming multiprocessor. 2 was faster than
# 4 and 8 on an H200 at every shape of benchmarks/profile_gpu.py (fewer segments: a shorter state-kernel walk and fewer
# boundary states), e.g. b16 L1600 h8 fwd+bwd 1.89 / 2.12 / 2.04 ms GPU time (benchmarks/results/prof-*.json)
_PROGRAMS_PER_SM = float(os.environ.get("YOLO_BIMAMBA_PROGRAMS_PER_SM", "2"))
# the forward's in-chunk pairs kernel: at least this many programs per SM before it walks more than one head per
# program (fwd_pairs_heads)
_FWD_PAIRS_PER_SM = float(os.environ.get("YOLO_BIMAMBA_FWD_PAIRS_PER_SM", "4"))
# YOLO_BIMAMBA_AUTOTUNE=0: no autotuning (no compile of every config on first use); default_config's configs are used
_AUTOTUNE = os.environ.get("YOLO_BIMAMBA_AUTOTUNE", "1") not in ("", "0")
# ("pairs" is the backward's in-chunk pairs kernel, "fwd_pairs" the forward's, which force_config(pairs=) forces too;
# the forward's runs 2 warps at every chunk size: in chunks of 64 on an H200, bf16, its CUDA time over three rounds,
# 0.050 ms against 0.058-0.060 with 4 warps at b16 L1600 h8 p64 n64, 0.56-0.57 against 0.57-0.58 at the LM shape and
# 0.33 against 0.45 there with one direction; benchmarks/results/session28)
DEFAULT_CONFIGS = {"fwd": 2, "bwd": 0, "state": 3, "pairs": 0, "fwd_pairs": 0}
# ... except the backward at headdim and d_state <= 32 (the detection models' shapes): there the two-stage config was
# 7-10 % faster than config 0 on an H200 (benchmarks/results/session9/dedup-prof-f9c7dcb.json); at 64 it was 26 % slower
DEFAULT_BWD_SMALL = 3
# ... and the forward's state terms there: (BLOCK_Q 64, BLOCK_P 32) was faster than (64, 64) with its in-chunk pairs
# kernel on an H200 (b32 L1600 h8 p32 n32: 1.153 vs 1.182 ms per fwd+bwd; b32 L400 h16: 0.578 vs 0.595;
# benchmarks/results/session10/ab5-B-fwd-cfgs.json)
DEFAULT_FWD_SMALL = 1
# the backward's in-chunk pairs kernel in chunks of 64 rows (backward configs with BLOCK_Q 64): 4 warps
# (PAIRS_CONFIGS[1]); on an H200 (bf16, the processed dt read as it is; benchmarks/results/session28) 0.182 ms at b16
# L1600 h8 p64 n64 against 0.331 with 2 warps, and 0.295 against 0.424 at b32 L1600 h8 p32 n32 (where session 11's
# kernel had been faster with 2)
DEFAULT_PAIRS_Q64 = 1


def default_config(which, kwargs) -> int:
    """Index of the config that runs without autotuning (and under the interpreter, unless one is forced)."""
    if which in ("bwd", "fwd") and max(kwargs["P"], kwargs["N"]) <= 32:
        return DEFAULT_BWD_SMALL if which == "bwd" else DEFAULT_FWD_SMALL
    if which == "pairs" and kwargs["BLOCK_Q"] >= 64:
        return DEFAULT_PAIRS_Q64
    return DEFAULT_CONFIGS[which]


# test hook (interpreter only): run the autotuners, timed on the CPU, instead of the default configs
_TUNE_IN_INTERPRETER = False


def _cpu_bench(fn, quantiles=None, reps=2):
    """The autotuners' timer under the interpreter (no CUDA events there): median wall time of ``reps`` calls."""
    import time

    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    med = sorted(times)[len(times) // 2]
    return [med] * len(quantiles) if quantiles else med


_BENCH = dict(do_bench=_cpu_bench) if _INTERPRET else {}
# the backward's dot classes, each a keyword argument of the kernels naming an input precision (_dot_precisions)
DOT_CLASSES = ("DOT_ST", "DOT_RD", "DOT_MID", "DOT_IN", "DOT_LO")
_KEY = ["P", "N", "DO_F", "DO_B", "SHIFT", "SHARE", "HAS_D", "D_PER_P", "HAS_BIAS", "SOFTPLUS", "COMPUTE"]
_PAIRS_KEY = [k for k in _KEY if k not in ("HAS_D", "D_PER_P")]  # (D is the segment kernels')
_fwd_tuned = triton.autotune(configs=FWD_CONFIGS, key=[k for k in _KEY if k != "SHARE"] + ["AHEAD"],
                             **_BENCH)(_bi_ssd_fwd_kernel)
# the forward's in-chunk pairs add to the y the forward kernel wrote: timed on a copy restored after every timed call
_fwd_pairs_tuned = triton.autotune(
    configs=PAIRS_CONFIGS, key=_PAIRS_KEY + ["GROUPED", "BLOCK_Q", "BLOCK_P"],
    restore_value=["y_ptr"], **_BENCH,
)(_bi_ssd_fwd_pairs_kernel)
# the backward adds to dx (and dB, dC) that an earlier launch wrote (ACC): the autotuner times each config on copies
# restored after every timed call, so tuning never adds the same contribution twice
_bwd_tuned = triton.autotune(
    configs=BWD_CONFIGS,
    key=_KEY + ["SEPARATE", "GRAD_PER_HEAD", "ORDERED", "ACC", "DOT_ST", "DOT_RD", "DOT_LO", "AHEAD"],
    prune_configs_by={"early_config_prune": prune_bwd_configs},
    restore_value=["dx_ptr", "dB_ptr", "dC_ptr", "cnt_ptr"], **_BENCH,
)(_bi_ssd_bwd_kernel)
# the in-chunk pairs add to what the segment kernel wrote: timed on copies restored after every timed call, as above
_pairs_tuned = triton.autotune(
    configs=PAIRS_CONFIGS,
    key=_PAIRS_KEY + ["SEPARATE", "GRAD_PER_HEAD", "BLOCK_Q", "DOT_MID", "DOT_IN", "DOT_LO", "AHEAD"],
    restore_value=["dx_ptr", "dB_ptr", "dC_ptr", "dBb_ptr", "dCb_ptr", "scr_ptr"], **_BENCH,
)(_bi_ssd_bwd_pairs_kernel)
_state_tuned = triton.autotune(
    configs=STATE_CONFIGS, key=["P", "N", "GRAD", "DO_F", "DO_B", "SHIFT", "HAS_BIAS", "SOFTPLUS", "COMPUTE", "DOT_ST"],
    **_BENCH,
)(_bi_ssd_state_kernel)


@contextlib.contextmanager
def interpreter_autotune():
    """Test hook: under the Triton interpreter, launch through the autotuners (every config timed on the CPU, the
    tuning cache cleared first) instead of the default configs, so tuning itself is exercised off the GPU."""
    global _TUNE_IN_INTERPRETER
    old = _TUNE_IN_INTERPRETER
    _TUNE_IN_INTERPRETER = True
    for tuned in (_fwd_tuned, _bwd_tuned, _state_tuned, _pairs_tuned, _fwd_pairs_tuned):
        tuned.cache.clear()
    _chosen.clear()
    try:
        yield
    finally:
        _TUNE_IN_INTERPRETER = old


@contextlib.contextmanager
def force_config(fwd: int | None = None, bwd: int | None = None, state: int | None = None, seg: int | None = None,
                 split: bool | None = None, pairs: int | None = None, ordered: bool | None = None,
                 fwd_heads: int | None = None, pairs_ahead: int | None = None,
                 fwd_ahead: int | None = None, bwd_ahead: int | None = None):
    """Run the kernels with ``FWD_CONFIGS[fwd]`` / ``BWD_CONFIGS[bwd]`` / ``STATE_CONFIGS[state]`` /
    ``PAIRS_CONFIGS[pairs]`` instead of
    autotuning, with segments of ``seg`` rows (a multiple of ``SEG_MULTIPLE``), and (``split``) with the backward's
    two directions in two launches (True) or one (False), (``ordered``) with dB, dC summed over a group's heads
    in the segment kernel in head order (True; needs two launches) or per head (False), (``fwd_heads``) with that
    many heads per program of the forward's in-chunk pairs kernel (at most a group's), (``pairs_ahead``) with the
    backward's in-chunk pairs kernel's AHEAD bits (0-3: its docstring), (``fwd_ahead``) with the forward kernel's
    (0-3), (``bwd_ahead``) with the backward segment kernel's (0-7). Arguments left ``None``
    keep what an enclosing
    ``force_config`` set (nested calls add to each other)."""
    if seg is not None and (seg < SEG_MULTIPLE or seg % SEG_MULTIPLE):
        raise ValueError(f"seg must be a positive multiple of {SEG_MULTIPLE}, got {seg}")
    old = dict(_forced)
    if fwd_heads is not None and fwd_heads < 1:
        raise ValueError(f"fwd_heads must be >= 1, got {fwd_heads}")
    for name, bits, top in (("pairs_ahead", pairs_ahead, 3), ("fwd_ahead", fwd_ahead, 3), ("bwd_ahead", bwd_ahead, 7)):
        if bits is not None and bits not in range(top + 1):
            raise ValueError(f"{name} must be one of 0-{top}, got {bits}")
    given = dict(fwd=fwd, bwd=bwd, state=state, pairs=pairs, seg=seg, split=split, ordered=ordered,
                 fwd_heads=fwd_heads, pairs_ahead=pairs_ahead, fwd_ahead=fwd_ahead, bwd_ahead=bwd_ahead)
    _forced.update({k: v for k, v in given.items() if v is not None})
    try:
        yield
    finally:
        _forced.update(old)


def _cdiv(a, b):
    # host-side ceil division (triton.cdiv is a constexpr function: 7.7 us per call on the 2-core CI machine, about
    # 13 calls per fwd+bwd)
    return -(-a // b)


@functools.lru_cache(maxsize=None)
def _num_sms(device_index):
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def sm_count(device) -> int:
    """Streaming multiprocessors the segments are cut for: the CUDA device's; 4 elsewhere (the interpreter)."""
    if device.type != "cuda":
        return 4
    return _num_sms(device.index if device.index is not None else torch.cuda.current_device())


def fwd_pairs_heads(b, g, heads_per_group, tiles, n, device) -> int:
    """Heads per program of the forward's in-chunk pairs kernel (``tiles``: its headdim blocks x chunks): above 1 it
    computes a chunk's C B^T once and walks its heads, loading each one head ahead (GROUPED). That pays where C B^T is
    the larger product, at d_state (``n``) 128 and up: on an H200 (bf16, both directions) the kernel took 0.69 ms
    instead of 1.06 at the LM shape (b8 L8192 h32 p64 n128, 32 heads per program), but 0.087 instead of 0.074 at
    b16 L1600 h8 p64 n64 (its registers), and 0.088-0.098 against 0.093 at b32 L1600 h8 p32 n32
    (benchmarks/results/session25). There, the whole group where that leaves at least ``_FWD_PAIRS_PER_SM`` programs
    per SM, fewer heads (the group cut into equal blocks) where it does not; one head below d_state 128."""
    if _forced["fwd_heads"] is not None:
        return max(1, min(_forced["fwd_heads"], heads_per_group))
    if kernel_tile(n) < 128:
        return 1
    per_group = b * g * tiles  # programs with a whole group each
    blocks = max(1, min(heads_per_group, _cdiv(int(_FWD_PAIRS_PER_SM * sm_count(device)), per_group)))
    return _cdiv(heads_per_group, blocks)


def bwd_pairs_ahead() -> int:
    """The backward's in-chunk pairs kernel's AHEAD bits (its docstring): the rows a head adds to loaded before its
    products (2), at every headdim and d_state; its inputs one head ahead (1) are not loaded. On
    an H200 (bf16, both directions, the pairs kernel's CUDA time, two rounds): 2 took b16 L1600 h8 p64 n64 from 0.162
    to 0.148 ms and the LM shape (p64 n128) from 1.289 to 1.185, where 3 took 0.165 and 1.26 (the tiles held a head
    ahead spill on sm_90: 640 bytes of stack against 192; benchmarks/results/session26). At b32 L1600 h8 p32 n32, 3
    had been the faster before the processed dt was computed once (session 26); since, 2 is: 0.136 / 0.134 against
    0.140 / 0.139 ms on an H200 (session 28), 0.136 / 0.137 against 0.141 / 0.141 on an H100, and 0.112 / 0.113
    against 0.120 / 0.120 in one direction (benchmarks/results/session31)."""
    forced = _forced["pairs_ahead"]
    if forced is not None:
        return forced
    return 2


def bwd_ahead_bits(p, n) -> int:
    """The backward segment kernel's AHEAD bits (its docstring: which of a chunk's inputs besides dt are loaded one
    chunk ahead; 1 B and C, 2 dz, 4 x) at headdim ``p`` and d_state ``n``: all of them (7) where headdim x d_state tiles
    are at most 32 x 32 (triton_kernels.AHEAD_MAX_TILE; session 11), B, C and dz (3) up to 64 x 64, dz alone (2) above.
    On an H200 (bf16, that kernel's CUDA time, default configs; benchmarks/results/session27), against dt alone (0):
    at b16 L1600 h8 p64 n64 3 took it from 0.435 to 0.422 ms (both directions in one launch) and from 0.240 to 0.203
    (one direction), where 2 took 0.428 / 0.220 and 7 0.453 / 0.218; at the LM shape (p64 n128, one launch per
    direction) 2 took it from 6.95 to 6.85 ms, where 3 took 7.50 and 7 7.69 (the tiles held ahead spill)."""
    forced = _forced["bwd_ahead"]
    if forced is not None:
        return forced
    tile = kernel_tile(p) * kernel_tile(n)
    return 7 if tile <= AHEAD_MAX_TILE.value else 3 if tile <= 64 * 64 else 2


def fwd_ahead_bits(p, n) -> int:
    """The forward kernel's AHEAD bits (its docstring: 1, a chunk's dt, x, C one chunk ahead; 2, the anti-causal pass
    reads y before the chunk's products) at headdim ``p`` and d_state ``n``: both up to d_state 64, neither above. On
    an H200 (bf16, both directions, that kernel's CUDA time, two rounds; benchmarks/results/session26): 3 took it from
    0.110 to 0.106 ms at b16 L1600 h8 p64 n64 and from 0.136 to 0.124 at b32 L1600 h8 p32 n32; at the LM shape (d_state
    128) bit 1 took 1.59 to 1.89 ms (the tiles held a chunk ahead spill: 560 bytes of stack on sm_90 against 264) and
    bit 2 alone changed nothing (1.604)."""
    forced = _forced["fwd_ahead"]
    if forced is not None:
        return forced
    return 3 if kernel_tile(n) <= 64 else 0


def segment_rows(b, h, L, device) -> int:
    """Rows per program of the segment-parallel backward: enough segments for about
    ``_PROGRAMS_PER_SM`` programs per SM, each a whole number of ``SEG_MULTIPLE`` rows."""
    if _forced["seg"] is not None:
        return _forced["seg"]
    sms = sm_count(device)
    blocks = _cdiv(L, SEG_MULTIPLE)
    nseg = max(1, min(blocks, int(_PROGRAMS_PER_SM * sms) // (b * h)))
    return SEG_MULTIPLE * _cdiv(blocks, nseg)


# the config each autotuner chose, by (kernel, keyword arguments, dtypes of the arguments): a finer key than the
# autotuner's own (its key names are among the keyword arguments; it adds every argument's dtype), so a later call
# launches the config the autotuner would pick, without going through triton's Autotuner.run, which cost about 0.08 ms
# of host time per launch on the H200 machine, a sixth of the op's host time at a detection model's shape
# (benchmarks/results/profile/host-*.json); the op is host-bound there. Every launch then goes through ops.launch,
# which also skips Triton's JITFunction.run once a specialisation is compiled
_chosen: dict = {}
_CHOSEN_MAX = 4096


def _launch(jit_fn, tuned_fn, configs, which, grid_fn, args, kwargs, cfg=None):
    """Launch with the forced, default, cached or tuned config (``cfg``: this one); returns the config it ran (None
    where the autotuner ran but did not say which it chose)."""
    if cfg is not None:
        return _run_config(jit_fn, grid_fn, args, kwargs, cfg)
    idx = _forced["pairs" if which == "fwd_pairs" else which]  # (pairs= forces both pairs kernels)
    if idx is None and ((_INTERPRET and not _TUNE_IN_INTERPRETER) or not _AUTOTUNE):
        # under the interpreter the tests force each config explicitly (interpreter_autotune() runs the tuners, timed
        # on the CPU); without autotuning, the config that was fastest on an H200 at the detection shapes
        idx = default_config(which, kwargs)
    if idx is None:
        key = (which, tuple(kwargs.items()), tuple(getattr(a, "dtype", None) for a in args))
        cfg = _chosen.get(key)
        if cfg is None:
            tuned_fn[grid_fn](*args, **kwargs)
            best = getattr(tuned_fn, "best_config", None)  # absent where Autotuner.run is replaced (sm_90 recorder)
            if best is not None:
                if len(_chosen) >= _CHOSEN_MAX:
                    _chosen.clear()
                _chosen[key] = best
            return best
    else:
        cfg = configs[idx]
    return _run_config(jit_fn, grid_fn, args, kwargs, cfg)


def _run_config(jit_fn, grid_fn, args, kwargs, cfg):
    meta = dict(cfg.kwargs)
    opts = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    if cfg.maxnreg is not None:
        opts["maxnreg"] = cfg.maxnreg
    launch(jit_fn, grid_fn(meta), args, {**kwargs, **meta, **opts})
    return cfg


def _acc_dtype(dtype):
    """Dtype of the buffers the kernels read back and add to (y; dx, dB, dC): fp16 would overflow at 65504 in a
    partial sum whose total fits, so those are fp32 for fp16 inputs (bf16 has fp32's range and is kept)."""
    return torch.float32 if dtype == torch.float16 else dtype


def _dot_precisions(x):
    """Input precisions of the backward's dots (keyword arguments of the kernels), by what each dot feeds:

    DOT_ST  state updates, S <- a S + (w V)^T R: the states' errors reach the log-decay gradients (ddt, dA, d dt_bias)
            through the sums that pass C telescopes, so these need about fp32 accuracy;
    DOT_RD  read-outs of a state (dz S^T, B dS) that feed the same sums;
    DOT_MID in-chunk products that feed dx and the direct part of ddt only;
    DOT_IN  dots of two loaded inputs (C B^T, dz x^T), which also give the in-chunk pair terms of the log-decay
            gradients: exact in tf32 for 16-bit inputs, and in bf16 for bf16 ones;
    DOT_LO  dots that feed only dx, dB, dC.
    bf16 inputs: the operand of a state dot that is not a loaded input is split into three bf16 parts ("bf16x3a/b", see
    triton_kernels._dot): fp32 accuracy at half the cost of tf32x3. Two parts (2^-17) made dA 30 times less accurate on
    an H200 at L = 65536 with fast decays (0.35 relative error), and plain tf32 (2^-11) 70 times under emulation
    (tests/test_tf32_precision.py). The rest runs in bf16, whose rounding is that of the 16-bit outputs."""
    if x.dtype == torch.float64:
        return dict.fromkeys(DOT_CLASSES, "ieee")
    if x.dtype == torch.bfloat16:
        return dict(DOT_ST="bf16x3a", DOT_RD="bf16x3b", DOT_MID="bf16", DOT_IN="bf16", DOT_LO="bf16")
    if x.dtype == torch.float16:
        # fp16 values are not bf16 values (no exact operand for a bf16 split): tf32x3 state dots, the rest in tf32
        # (exact on two fp16 inputs), the in-chunk products too, as for fp32 inputs (tf32x3 there was 1.5 % slower on
        # an H200; fp16 tensor-core dots of two inputs 1 % slower than tf32: benchmarks/results/session12/). No bf16
        # dots: next to tf32 ones in this kernel they hit an illegal memory access on an H200 (Triton 3.6) while
        # autotuning fp16 AMP training. fp16 inputs take 1.5-1.8x the GPU time of bf16 ones (the state dots)
        return dict(DOT_ST="tf32x3", DOT_RD="tf32x3", DOT_MID="tf32", DOT_IN="tf32", DOT_LO="tf32")
    return dict(DOT_ST="tf32x3", DOT_RD="tf32x3", DOT_MID="tf32", DOT_IN="tf32x3", DOT_LO="tf32")


_stand_ins: dict = {}


def _no_states(dtype, device):
    """What a one-segment call passes for its boundary states (there are none, and the kernels read nothing there):
    one element of the states' dtype, kept per (device, dtype) so that every call has the same specialisation and
    no allocation; a fresh one while a CUDA graph is captured (its memory then belongs to the graph's pool)."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return torch.empty(1, dtype=dtype, device=device)
    t = _stand_ins.get((device, dtype))
    if t is None:
        t = _stand_ins[(device, dtype)] = torch.empty(1, dtype=dtype, device=device)
    return t


def _segment_states(x, dt, A, B, C, bias_arg, dtb, Bb, Cb, dy, opts, has_bias, seg=None, exact=False):
    """(segment rows, number of segments, states at the boundaries between segments), shape (b*h, 2, nseg - 1, n, p)
    (triton_kernels._entry_state).

    dy None (forward): S_f, S_b; dy given (backward): dS_b, dS_f. One segment has none (no state kernel launch; the
    kernels start from zero states and are passed a stand-in that they never read). ``seg``: the forward's segment
    rows (the backward's must be the same); ``exact``: a forward whose states the backward will read, at the
    backward's precision."""
    dt_softplus, lo, hi, do_f, do_b, shift = opts
    b, l, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    grad = dy is not None
    cdt = accumulation_dtype(x.dtype)
    if seg is None:
        seg = segment_rows(b, h, l, x.device)
    nseg = _cdiv(l, seg)
    if nseg == 1:
        return seg, 1, _no_states(cdt, x.device)
    st = _alloc((b * h, 2, nseg - 1, n, p), cdt, x.device)
    # the states feed the backward's log-decay gradients, which need DOT_ST's accuracy; a forward-only call's dots keep
    # Triton's default (tf32), as the forward kernel's do (see the triton_kernels docstring)
    prec = _dot_precisions(x)["DOT_ST"] if grad or exact or x.dtype == torch.float64 else "tf32"
    _launch(_bi_ssd_state_kernel, _state_tuned, STATE_CONFIGS, "state",
            lambda meta: (b * h, _cdiv(p, meta["BLOCK_P"]), 2),
            (x, dt, A, B, C, bias_arg, dtb, Bb, Cb, dy if grad else x, st, l, h, g, seg, lo, hi),
            dict(P=p, N=n, BLOCK_N=kernel_tile(n), GRAD=grad, DO_F=do_f, DO_B=do_b, SHIFT=shift, HAS_BIAS=has_bias,
                 SOFTPLUS=dt_softplus, COMPUTE=compute_dtype(x.dtype), DOT_ST=prec))
    return seg, nseg, st


# what the kernels after the forward kernel are launched with: they read the processed dt it stored (dtp, dtbp) as it
# is (no bias, no softplus; limits that clamp nothing)
_PROCESSED = dict(HAS_BIAS=False, SOFTPLUS=False)
_PROCESSED_LIMITS = (float("-inf"), float("inf"))


def _split_directions(p, n, share) -> bool:
    """Whether the backward runs its two directions in two launches (see _SPLIT_DIRECTIONS)."""
    if _SPLIT_DIRECTIONS in _OFF:
        return False
    if _SPLIT_DIRECTIONS == "auto":
        return not (share and max(p, n) <= 64)
    return True


def _ordered_rows(per_head, separate, one_direction_per_launch) -> bool:
    """Whether the backward sums dB, dC over each group's heads in the segment kernel (see _ORDERED_ROWS): with
    ngroups < nheads, one dB / dC per direction pair (BiMamba2 mode, not Hydra's), and one direction per launch (in a
    launch with both, a row gets terms in both passes, and one pass's turn would wait for a program that may not have
    started)."""
    wanted = _forced["ordered"]
    if wanted is None:
        wanted = _ORDERED_ROWS
    return bool(wanted) and per_head and not separate and one_direction_per_launch


# rows per step of the batch sums (_bi_ssd_grad_sums_kernel)
_GRAD_SUM_ROWS = 16

# the fewest rows per chunk of any backward config: the ORDERED counters' layout is cut for it
_MIN_BWD_Q = min(c.kwargs["BLOCK_Q"] for c in BWD_CONFIGS)


def _shares(opts, separate) -> bool:
    """Both directions with the same dt, B, C and no shift (BiMamba2, not Hydra): the kernels then do the in-chunk
    pairs of both directions in one tile (triton_kernels._pair_decay), in the causal direction's code, and the
    anti-causal direction's code only its state terms."""
    _softplus, _lo, _hi, do_f, do_b, shift = opts
    return do_f and do_b and not shift and not separate


def _chunk_tile(used, which):
    """(BLOCK_Q, BLOCK_P) of the config a segment kernel ran (``used``, from _launch): its pairs kernel must cut the
    sequence into the same chunks."""
    if used is None:
        raise RuntimeError(f"the {which} segment kernel's config is unknown (its autotuner reported none)")
    return used.kwargs["BLOCK_Q"], used.kwargs.get("BLOCK_P")


class _BiSSDFn(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx, x, dt, A, B, C, D, dt_bias, dt_bwd, B_bwd, C_bwd, opts):
        dt_softplus, lo, hi, do_f, do_b, shift = opts
        b, l, h, p = x.shape
        g, n = B.shape[2], B.shape[3]
        separate = dt_bwd is not None
        dtb, Bb, Cb = (dt_bwd, B_bwd, C_bwd) if separate else (dt, B, C)
        y = _alloc(x.shape, _acc_dtype(x.dtype), x.device)
        has_d, has_bias = D is not None, dt_bias is not None
        bias_arg = dt_bias if has_bias else x
        # the backward reads the forward's boundary states S_f, S_b (computed at its precision when it will run)
        wants_grad = any(ctx.needs_input_grad)
        seg, nseg, st = _segment_states(x, dt, A, B, C, bias_arg, dtb, Bb, Cb, None, opts, has_bias, exact=wants_grad)
        # the processed dt (softplus, bias, limits) of each direction, stored by the forward kernel for the kernels
        # after it (they read it as it is: _PROCESSED)
        cdt = accumulation_dtype(x.dtype)
        dtp = _alloc(dt.shape, cdt, x.device)
        dtbp = _alloc(dt.shape, cdt, x.device) if separate and do_b else dtp
        store_dt = (1 if do_f else 0) + (2 if do_b and (separate or not do_f) else 0)
        args = (x, dt, A, B, C, D if has_d else x, bias_arg, dtb, Bb, Cb, y, st, dtp, dtbp, l, h, g, seg, lo, hi)
        common = dict(P=p, N=n, BLOCK_N=kernel_tile(n), DO_F=do_f, DO_B=do_b, SHIFT=shift, HAS_BIAS=has_bias,
                      SOFTPLUS=dt_softplus, COMPUTE=compute_dtype(x.dtype))
        used = _launch(_bi_ssd_fwd_kernel, _fwd_tuned, FWD_CONFIGS, "fwd",
                       lambda meta: (b * h, _cdiv(p, meta["BLOCK_P"]), nseg), args,
                       dict(common, HAS_D=has_d, D_PER_P=has_d and D.dim() == 2, AHEAD=fwd_ahead_bits(p, n),
                            STORE_DT=store_dt))
        # the in-chunk pairs, in the chunks and headdim blocks of the forward kernel's config
        q, bp = _chunk_tile(used, "forward")
        # (C B^T once per program, for each of its heads: fwd_pairs_heads)
        heads = fwd_pairs_heads(b, g, h // g, _cdiv(p, bp) * _cdiv(l, q), n, x.device)
        _launch(_bi_ssd_fwd_pairs_kernel, _fwd_pairs_tuned, PAIRS_CONFIGS, "fwd_pairs",
                lambda meta: (b * g * _cdiv(h // g, heads), _cdiv(p, bp), _cdiv(l, q)),
                (x, dtp, A, B, C, x, dtbp, Bb, Cb, y, l, h, g, heads, *_PROCESSED_LIMITS),
                dict(common, **_PROCESSED, SHARE=_shares(opts, separate), GROUPED=heads > 1, BLOCK_Q=q, BLOCK_P=bp))
        ctx.save_for_backward(x, dt, A, B, C, D, dt_bias, dt_bwd, B_bwd, C_bwd, dtp, None if dtbp is dtp else dtbp,
                              st if wants_grad and nseg > 1 else None)
        ctx.opts, ctx.seg = opts, seg
        return y.to(x.dtype)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, dy):
        x, dt, A, B, C, D, dt_bias, dt_bwd, B_bwd, C_bwd, dtp, dtbp, st = ctx.saved_tensors
        dt_softplus, lo, hi, do_f, do_b, shift = ctx.opts
        if dtbp is None:
            dtbp = dtp
        b, l, h, p = x.shape
        g, n = B.shape[2], B.shape[3]
        dev = x.device
        dy = dy.contiguous()
        separate = dt_bwd is not None
        dtb, Bb, Cb = (dt_bwd, B_bwd, C_bwd) if separate else (dt, B, C)
        share = _shares(ctx.opts, separate)
        split = _forced["split"]
        cdt = accumulation_dtype(x.dtype)
        # ngroups < nheads: the segment kernel's dB, dC as each group's rows in fp32, summed over its heads in head
        # order (ordered: one direction per launch, so it takes two launches unless two are ruled out), or as per-head
        # rows that the pairs kernel sums over each group's heads in fp32; the latter in the dtype of the buffers that
        # are read back and added to (bf16 for bf16 inputs, as y and dx; fp32 for fp16 ones)
        may_split = split if split is not None else _SPLIT_DIRECTIONS not in _OFF
        ordered = _ordered_rows(g != h, separate, may_split or not (do_f and do_b))
        if split is None:
            split = ordered or _split_directions(p, n, share)
        per_head = g != h and not ordered
        gdt = cdt if ordered else _acc_dtype(B.dtype)
        gshape = (b, l, h, n) if per_head else (b, l, g, n)
        split = split and do_f and do_b
        dx = _alloc(x.shape, _acc_dtype(x.dtype), dev)
        ddt = _alloc(dt.shape, dt.dtype, dev)
        dB = _alloc(gshape, gdt, dev)
        dC = _alloc(gshape, gdt, dev)
        if separate:
            ddtb = _alloc(dt.shape, dt_bwd.dtype, dev)
            # two launches: the backward direction's dB, dC are allocated after the forward direction's were summed
            # into its gradients
            dBb, dCb = (None, None) if split else (_alloc(gshape, gdt, dev), _alloc(gshape, gdt, dev))
        else:
            ddtb, dBb, dCb = ddt, dB, dC
        scr = _alloc((b * h, 6, l), cdt, dev)
        has_d, has_bias = D is not None, dt_bias is not None
        bias_arg = dt_bias if has_bias else x
        # the segment, state and pairs kernels read the forward's processed dt (dtp, dtbp) as it is; the last pass
        # (ddt, dA, d dt_bias) takes dt as given, with its softplus, bias and limits
        seg, nseg, gst = _segment_states(x, dtp, A, B, C, x, dtbp, Bb, Cb, dy,
                                         (_PROCESSED["SOFTPLUS"], *_PROCESSED_LIMITS, do_f, do_b, shift),
                                         _PROCESSED["HAS_BIAS"], seg=ctx.seg)
        if st is None:  # one segment: no states in the forward either (gst is the stand-in)
            if nseg > 1:
                raise RuntimeError("bi_ssd_triton: the forward kept no boundary states for the backward")
            st = gst
        part_d = _alloc((b, h, nseg, p), cdt, dev)
        part = _alloc((b, h, 2), cdt, dev)
        # ORDERED: two ticket slots, then a counter per (batch * group, dB / dC, chunk), all zero
        cnt = torch.zeros(2 + 2 * b * g * _cdiv(l, _MIN_BWD_Q), dtype=torch.int32, device=dev) if ordered else part
        common = dict(DO_F=do_f, DO_B=do_b, SHIFT=shift, **_PROCESSED, COMPUTE=compute_dtype(x.dtype))

        def args(gB, gC, gBb, gCb):
            return (x, dtp, A, B, C, D if has_d else x, x, dtbp, Bb, Cb, dy,
                    dx, gB, gC, ddt, gBb, gCb, ddtb, scr, part_d, st, gst, cnt, l, h, g, seg, *_PROCESSED_LIMITS)

        dots = _dot_precisions(x)

        def outputs(tB, tC, likeB, likeC):
            # what the pairs kernel stores the gradients into (the per-head buffers summed over each group's heads):
            # with one head per group, the segment kernel's buffers themselves where they have the inputs' dtypes
            if not per_head and tB.dtype == likeB.dtype and tC.dtype == likeC.dtype:
                return tB, tC
            return _alloc(likeB.shape, likeB.dtype, dev), _alloc(likeC.shape, likeC.dtype, dev)

        kwargs = dict(
            P=p, N=n, BLOCK_P=kernel_tile(p), BLOCK_N=kernel_tile(n), SEPARATE=separate,
            SHARE=share, HAS_D=has_d,
            D_PER_P=has_d and D.dim() == 2, GRAD_PER_HEAD=per_head, ORDERED=ordered,
            DOT_ST=dots["DOT_ST"], DOT_RD=dots["DOT_RD"], DOT_LO=dots["DOT_LO"], AHEAD=bwd_ahead_bits(p, n), **common,
        )
        grid = lambda meta: (b * h, nseg)  # noqa: E731
        bwd = functools.partial(_launch, _bi_ssd_bwd_kernel, _bwd_tuned, BWD_CONFIGS, "bwd", grid)
        # (the pairs kernel's own AHEAD replaces the segment kernel's)
        pkw = {k: v for k, v in kwargs.items() if k not in ("HAS_D", "D_PER_P", "DOT_ST", "DOT_RD", "ORDERED")}
        pkw.update(DOT_MID=dots["DOT_MID"], DOT_IN=dots["DOT_IN"], AHEAD=bwd_pairs_ahead())

        def pairs(used, gB, gC, gBb, gCb, oB, oC, oBb, oCb, **flags):
            # the in-chunk pairs, after the segment kernel of the same directions, in the same chunks (its BLOCK_Q);
            # one program per (batch * group, chunk)
            q = _chunk_tile(used, "backward")[0]
            _launch(_bi_ssd_bwd_pairs_kernel, _pairs_tuned, PAIRS_CONFIGS, "pairs", lambda meta: (b * g, _cdiv(l, q)),
                    (x, dtp, A, B, C, x, dtbp, Bb, Cb, dy, dx, gB, gC, gBb, gCb, oB, oC, oBb, oCb, scr, l, h, g,
                     *_PROCESSED_LIMITS),
                    {**pkw, **flags, "BLOCK_Q": q})

        gB, gC = outputs(dB, dC, B, C)
        if split and separate:
            # Hydra mode in two launches: each direction has its own dB, dC (per head when ngroups < nheads, the
            # largest buffers of the backward); the first direction's are summed into its gradients and freed
            # before the second direction's are allocated, so at most two of the four exist at a time. A launch never
            # touches the other direction's dB, dC: their arguments are placeholders.
            used = bwd(args(dB, dC, dB, dC), {**kwargs, "DO_B": False, "ACC": False})
            pairs(used, dB, dC, dB, dC, gB, gC, gB, gC, DO_B=False)
            del dB, dC
            dBb, dCb = _alloc(gshape, gdt, dev), _alloc(gshape, gdt, dev)
            gBb, gCb = outputs(dBb, dCb, B_bwd, C_bwd)
            used = bwd(args(dBb, dCb, dBb, dCb), {**kwargs, "DO_F": False, "ACC": True})
            pairs(used, dBb, dCb, dBb, dCb, gBb, gCb, gBb, gCb, DO_F=False)
        else:
            gBb, gCb = outputs(dBb, dCb, B_bwd, C_bwd) if separate else (gB, gC)
            if split:
                used = bwd(args(dB, dC, dBb, dCb), {**kwargs, "DO_B": False, "ACC": False})
                # one pairs launch does both directions' in-chunk pairs (with SHARE in one tile), in the chunks of both
                # segment launches: the second runs the first's config (the autotuner would time each launch alone
                # and could pick another BLOCK_Q for each)
                bwd(args(dB, dC, dBb, dCb), {**kwargs, "DO_F": False, "ACC": True}, cfg=used)
            else:
                used = bwd(args(dB, dC, dBb, dCb), {**kwargs, "ACC": False})
            pairs(used, dB, dC, dBb, dCb, gB, gC, gBb, gCb)
        launch(_bi_ssd_bwd_dt_kernel, (b * h,), (dt, A, bias_arg, dtb, ddt, ddtb, scr, part, l, h, lo, hi),
               dict(DO_F=do_f, DO_B=do_b, SEPARATE=separate, HAS_BIAS=has_bias, SOFTPLUS=dt_softplus,
                    COMPUTE=compute_dtype(x.dtype), BLOCK_Q=PASS_C_ROWS))

        # dA, d dt_bias, dD: the partials summed over the batch (and segments) in one launch, in a fixed order
        dA = _alloc(A.shape, A.dtype, dev)
        ddt_bias = _alloc(dt_bias.shape, dt_bias.dtype, dev) if has_bias else None
        dD = _alloc(D.shape, D.dtype, dev) if has_d else None
        launch(_bi_ssd_grad_sums_kernel, (h,), (part, part_d, dA, dA if ddt_bias is None else ddt_bias,
                                                dA if dD is None else dD, b, h, nseg),
               dict(P=p, BLOCK_P=kernel_tile(p), BLOCK_R=_GRAD_SUM_ROWS, HAS_BIAS=has_bias, HAS_D=has_d,
                    D_PER_P=has_d and D.dim() == 2, COMPUTE=compute_dtype(x.dtype), num_warps=1))
        grads = [dx.to(x.dtype), ddt, dA, gB, gC, dD, ddt_bias]
        if separate:
            grads += [ddtb, gBb, gCb]
        else:
            grads += [None, None, None]
        return (*grads, None)


def bi_ssd_triton(
    x, dt, A, B, C, *, chunk_size=64, D=None, dt_bias=None, dt_softplus=False,
    dt_limit=(0.0, float("inf")), direction="both", shift=False, dt_bwd=None, B_bwd=None, C_bwd=None,
    validate=True,
):
    """Fused Triton bidirectional SSD; same semantics and arguments as :func:`yolo_bimamba.ops.bi_ssd`.

    ``chunk_size`` is validated and accepted for API compatibility; the kernels' internal tile
    along the sequence is a tuning parameter and does not change the result.
    ``validate=False`` skips the argument checks (the ``bi_ssd`` dispatcher has already run them).
    dt_limit is applied in fp32 precision.
    """
    if validate:
        validate_bi_ssd(
            x, dt, A, B, C, chunk_size=chunk_size, D=D, dt_bias=dt_bias, dt_limit=dt_limit,
            direction=direction, shift=shift, dt_bwd=dt_bwd, B_bwd=B_bwd, C_bwd=C_bwd, backend="triton",
        )
    c = lambda t: None if t is None else t.contiguous()  # noqa: E731
    opts = (bool(dt_softplus), float(dt_limit[0]), float(dt_limit[1]),
            direction in ("both", "forward"), direction in ("both", "backward"), bool(shift))
    return _BiSSDFn.apply(c(x), c(dt), c(A), c(B), c(C), c(D), c(dt_bias), c(dt_bwd), c(B_bwd), c(C_bwd), opts)
