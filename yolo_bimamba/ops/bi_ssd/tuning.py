"""The tuning of the bidirectional SSD's Triton kernels: their configs, autotuners and default-config rules, the
launch-shape rules (segments, heads per program, loads ahead, one or two backward launches), the choice of the
config each launch runs, and the test hooks that force any of them.

Every config and every rule gives the same result (up to rounding for BLOCK_Q); the tests force each one in turn.
On CUDA the kernels are autotuned over the configs (``YOLO_BIMAMBA_AUTOTUNE=0``: the default configs,
:func:`default_config`); under the Triton interpreter the default configs run unless one is forced
(:func:`force_config`) or :func:`interpreter_autotune` is on. The measurements behind the rules are in docs/design.md.
"""
from __future__ import annotations

import contextlib
import functools

import torch
import triton

from ... import config
from .kernels_backward import _bi_ssd_bwd_kernel
from .kernels_backward_pairs import _bi_ssd_bwd_pairs_kernel
from .kernels_common import AHEAD_MAX_TILE
from .kernels_forward import _bi_ssd_fwd_kernel, _bi_ssd_fwd_pairs_kernel
from .kernels_states import _bi_ssd_state_kernel
from .api import kernel_tile

__all__ = ["force_config", "interpreter_autotune", "FWD_CONFIGS", "BWD_CONFIGS", "STATE_CONFIGS", "PAIRS_CONFIGS"]

# ---------------------------------------------------------------------------------------------
# Configs
# ---------------------------------------------------------------------------------------------
# (BLOCK_Q, BLOCK_P, num_warps) of the forward and of the state kernel (BLOCK_Q 128 would force segments of 128 rows)
_QP_TILES = [(32, 32, 2), (64, 32, 4), (64, 64, 4)]


def _qp_configs(tiles, stages=1):
    return [triton.Config({"BLOCK_Q": bq, "BLOCK_P": bp}, num_warps=nw, num_stages=stages) for bq, bp, nw in tiles]


FWD_CONFIGS = _qp_configs(_QP_TILES)
# (BLOCK_Q, num_warps, num_stages) of the backward segment kernel: BLOCK_Q 128 needs over 227 KB of shared memory at
# headdim = d_state = 64 on sm_90; two stages (the next chunk's loads issued during this one) pay at small tiles only
BWD_CONFIGS = [
    triton.Config({"BLOCK_Q": bq}, num_warps=nw, num_stages=ns)
    for bq, nw, ns in [
        (32, 4, 1),
        (32, 8, 1),
        (64, 4, 1),
        (32, 4, 2),
    ]
]
# the in-chunk pairs kernels (one chunk per program): warps only, BLOCK_Q is the segment kernel's (the same chunks)
PAIRS_CONFIGS = [triton.Config({}, num_warps=nw) for nw in (2, 4, 8)]
# the chunk-boundary state walk: the forward's tiles, and the largest with two pipeline stages
STATE_CONFIGS = _qp_configs(_QP_TILES) + _qp_configs(_QP_TILES[2:], 2)
# segments are a whole number of chunks of every kernel and config (the BLOCK_Qs are powers of two)
SEG_MULTIPLE = max(c.kwargs["BLOCK_Q"] for c in FWD_CONFIGS + BWD_CONFIGS + STATE_CONFIGS)
assert all(SEG_MULTIPLE % c.kwargs["BLOCK_Q"] == 0 for c in FWD_CONFIGS + BWD_CONFIGS + STATE_CONFIGS)
# the fewest rows per chunk of any backward config: the ORDERED counters' layout is cut for it
MIN_BWD_Q = min(c.kwargs["BLOCK_Q"] for c in BWD_CONFIGS)
# rows per program of the last backward pass (per-position scalars only)
PASS_C_ROWS = 128
# rows per step of the batch sums (kernels_reductions._bi_ssd_grad_sums_kernel)
GRAD_SUM_ROWS = 16


def bwd_config_fits(cfg, P, N) -> bool:
    """Shared-memory rule measured with triton.compile for sm_90 (limit 227 KB): the backward at BLOCK_Q = 64 needs
    132 KB at headdim = d_state = 64 but 328 KB at 128; BLOCK_Q = 32 needs 115 KB at 128."""
    return cfg.kwargs["BLOCK_Q"] <= 32 or max(P, N) <= 64


def prune_bwd_configs(configs, named_args, **kwargs):
    P = kwargs.get("P", named_args.get("P"))
    N = kwargs.get("N", named_args.get("N"))
    kept = [c for c in configs if bwd_config_fits(c, P, N)]
    return kept or configs[:1]


# ---------------------------------------------------------------------------------------------
# Default configs (no autotuning; the interpreter), as data: the index each kernel runs, and the exceptions
# ---------------------------------------------------------------------------------------------
# forward (64, 64, 4 warps); backward (32 rows, 4 warps); state walk (64, 64) in two stages; pairs kernels 2 warps
DEFAULT_CONFIGS = {"fwd": 2, "bwd": 0, "state": 3, "pairs": 0, "fwd_pairs": 0}
# backward at headdim and d_state <= 32 (the detection layers): two pipeline stages hide the loads of small tiles
DEFAULT_BWD_SMALL = 3
# forward there: (BLOCK_Q 64, BLOCK_P 32), twice the programs of (64, 64) where the headdim is small
DEFAULT_FWD_SMALL = 1
# backward pairs kernel in chunks of 64 rows: 4 warps (the chunk's 64 x 64 pair tiles; 2 warps in chunks of 32)
DEFAULT_PAIRS_Q64 = 1


def default_config(which, kwargs) -> int:
    """Index of the config that runs without autotuning (and under the interpreter, unless one is forced)."""
    if which in ("bwd", "fwd") and max(kwargs["P"], kwargs["N"]) <= 32:
        return DEFAULT_BWD_SMALL if which == "bwd" else DEFAULT_FWD_SMALL
    if which == "pairs" and kwargs["BLOCK_Q"] >= 64:
        return DEFAULT_PAIRS_Q64
    return DEFAULT_CONFIGS[which]


# ---------------------------------------------------------------------------------------------
# Autotuners
# ---------------------------------------------------------------------------------------------
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


_INTERPRET = config.triton_interpret()  # (Triton reads it where the kernels are decorated: at import)
_BENCH = dict(do_bench=_cpu_bench) if _INTERPRET else {}
_KEY = ["P", "N", "DO_F", "DO_B", "SHIFT", "SHARE", "HAS_D", "D_PER_P", "HAS_BIAS", "SOFTPLUS", "COMPUTE"]
_PAIRS_KEY = [k for k in _KEY if k not in ("HAS_D", "D_PER_P")]  # (D is the segment kernels')
fwd_tuner = triton.autotune(configs=FWD_CONFIGS, key=[k for k in _KEY if k != "SHARE"] + ["AHEAD"],
                            **_BENCH)(_bi_ssd_fwd_kernel)
# the forward's in-chunk pairs add to the y the forward kernel wrote: timed on a copy restored after every timed call
fwd_pairs_tuner = triton.autotune(
    configs=PAIRS_CONFIGS, key=_PAIRS_KEY + ["GROUPED", "BLOCK_Q", "BLOCK_P"],
    restore_value=["y_ptr"], **_BENCH,
)(_bi_ssd_fwd_pairs_kernel)
# the backward adds to dx (and dB, dC) that an earlier launch wrote (ACC): the autotuner times each config on copies
# restored after every timed call, so tuning never adds the same contribution twice
bwd_tuner = triton.autotune(
    configs=BWD_CONFIGS,
    key=_KEY + ["SEPARATE", "GRAD_PER_HEAD", "ORDERED", "ACC", "DOT_ST", "DOT_RD", "DOT_LO", "AHEAD"],
    prune_configs_by={"early_config_prune": prune_bwd_configs},
    restore_value=["dx_ptr", "dB_ptr", "dC_ptr", "cnt_ptr"], **_BENCH,
)(_bi_ssd_bwd_kernel)
# the in-chunk pairs add to what the segment kernel wrote: timed on copies restored after every timed call, as above
bwd_pairs_tuner = triton.autotune(
    configs=PAIRS_CONFIGS,
    key=_PAIRS_KEY + ["SEPARATE", "GRAD_PER_HEAD", "BLOCK_Q", "DOT_MID", "DOT_IN", "DOT_LO", "AHEAD"],
    restore_value=["dx_ptr", "dB_ptr", "dC_ptr", "dBb_ptr", "dCb_ptr", "scr_ptr"], **_BENCH,
)(_bi_ssd_bwd_pairs_kernel)
state_tuner = triton.autotune(
    configs=STATE_CONFIGS, key=["P", "N", "GRAD", "DO_F", "DO_B", "SHIFT", "HAS_BIAS", "SOFTPLUS", "COMPUTE", "DOT_ST"],
    **_BENCH,
)(_bi_ssd_state_kernel)

# ---------------------------------------------------------------------------------------------
# Test hooks
# ---------------------------------------------------------------------------------------------
_forced = {"fwd": None, "bwd": None, "state": None, "pairs": None, "seg": None, "split": None, "ordered": None,
           "fwd_heads": None, "pairs_ahead": None, "fwd_ahead": None, "bwd_ahead": None}


@contextlib.contextmanager
def interpreter_autotune():
    """Test hook: under the Triton interpreter, launch through the autotuners (every config timed on the CPU, the
    tuning cache cleared first) instead of the default configs, so tuning itself is exercised off the GPU."""
    global _TUNE_IN_INTERPRETER
    old = _TUNE_IN_INTERPRETER
    _TUNE_IN_INTERPRETER = True
    for tuned in (fwd_tuner, bwd_tuner, state_tuner, bwd_pairs_tuner, fwd_pairs_tuner):
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
    ``PAIRS_CONFIGS[pairs]`` (both pairs kernels) instead of autotuning, with segments of ``seg`` rows (a multiple of
    ``SEG_MULTIPLE``), and (``split``) with the backward's two directions in two launches (True) or one (False),
    (``ordered``) with dB, dC summed over a group's heads in the segment kernel in head order (True; needs two
    launches) or per head (False), (``fwd_heads``) with that many heads per program of the forward's in-chunk pairs
    kernel (at most a group's), (``pairs_ahead``) with the backward's in-chunk pairs kernel's AHEAD bits (0-3: its
    docstring), (``fwd_ahead``) with the forward kernel's (0-3), (``bwd_ahead``) with the backward segment kernel's
    (0-7). Arguments left ``None`` keep what an enclosing ``force_config`` set (nested calls add to each other)."""
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


# ---------------------------------------------------------------------------------------------
# Launch-shape rules
# ---------------------------------------------------------------------------------------------
def cdiv(a, b):
    """Host-side ceil division (triton.cdiv is a constexpr function, microseconds per call)."""
    return -(-a // b)


@functools.lru_cache(maxsize=None)
def _num_sms(device_index):
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def sm_count(device) -> int:
    """Streaming multiprocessors the segments are cut for: the CUDA device's; 4 elsewhere (the interpreter)."""
    if device.type != "cuda":
        return 4
    return _num_sms(device.index if device.index is not None else torch.cuda.current_device())


def segment_rows(b, h, L, device) -> int:
    """Rows per program of the segment-parallel kernels: enough segments for about ``config.PROGRAMS_PER_SM``
    programs per SM (fewer segments: a shorter state walk and fewer boundary states), each a whole number of
    ``SEG_MULTIPLE`` rows."""
    if _forced["seg"] is not None:
        return _forced["seg"]
    sms = sm_count(device)
    blocks = cdiv(L, SEG_MULTIPLE)
    nseg = max(1, min(blocks, int(config.PROGRAMS_PER_SM * sms) // (b * h)))
    return SEG_MULTIPLE * cdiv(blocks, nseg)


def fwd_pairs_heads(b, g, heads_per_group, tiles, n, device) -> int:
    """Heads per program of the forward's in-chunk pairs kernel (``tiles``: its headdim blocks x chunks): above 1 it
    computes a chunk's C B^T once and walks its heads (GROUPED), which pays where C B^T is the larger product, at
    d_state (``n``) 128 and up; below, its registers cost more than the products it saves. There, the whole group
    where that leaves at least ``config.FWD_PAIRS_PER_SM`` programs per SM, fewer heads (the group cut into equal
    blocks) where it does not; one head below d_state 128."""
    if _forced["fwd_heads"] is not None:
        return max(1, min(_forced["fwd_heads"], heads_per_group))
    if kernel_tile(n) < 128:
        return 1
    per_group = b * g * tiles  # programs with a whole group each
    blocks = max(1, min(heads_per_group, cdiv(int(config.FWD_PAIRS_PER_SM * sm_count(device)), per_group)))
    return cdiv(heads_per_group, blocks)


# the backward's in-chunk pairs kernel's AHEAD bits (its docstring): the rows a head adds to loaded before its
# products (2), at every size; its inputs one head ahead (1) spill on sm_90
BWD_PAIRS_AHEAD = 2


def bwd_pairs_ahead() -> int:
    """The backward's in-chunk pairs kernel's AHEAD bits: :data:`BWD_PAIRS_AHEAD` unless forced."""
    forced = _forced["pairs_ahead"]
    return BWD_PAIRS_AHEAD if forced is None else forced


def bwd_ahead_bits(p, n) -> int:
    """The backward segment kernel's AHEAD bits (its docstring: which of a chunk's inputs besides dt are loaded one
    chunk ahead; 1 B and C, 2 dz, 4 x) at headdim ``p`` and d_state ``n``: all of them (7) where headdim x d_state tiles
    are at most 32 x 32 (kernels_common.AHEAD_MAX_TILE), B, C and dz (3) up to 64 x 64, dz alone (2) above, where the
    tiles held ahead would spill on sm_90."""
    forced = _forced["bwd_ahead"]
    if forced is not None:
        return forced
    tile = kernel_tile(p) * kernel_tile(n)
    return 7 if tile <= AHEAD_MAX_TILE.value else 3 if tile <= 64 * 64 else 2


def fwd_ahead_bits(p, n) -> int:
    """The forward kernel's AHEAD bits (its docstring: 1, a chunk's dt, x, C one chunk ahead; 2, the anti-causal pass
    reads y before the chunk's products) at headdim ``p`` and d_state ``n``: both up to d_state 64, neither above (the
    tiles held a chunk ahead would spill on sm_90)."""
    forced = _forced["fwd_ahead"]
    if forced is not None:
        return forced
    return 3 if kernel_tile(n) <= 64 else 0


def _split_directions(p, n, share) -> bool:
    """Whether the backward runs its two directions in two launches (config.SPLIT_DIRECTIONS: "auto", or never /
    always): one launch reuses the causal direction's loads for the anti-causal one, two need fewer registers per
    program."""
    if config.split_directions_off():
        return False
    if config.SPLIT_DIRECTIONS == "auto":
        return not (share and max(p, n) <= 64)
    return True


def _ordered_rows(per_head, separate, one_direction_per_launch) -> bool:
    """Whether the backward sums dB, dC over each group's heads in the segment kernel (config.ORDERED_ROWS): with
    ngroups < nheads, one dB / dC per direction pair (BiMamba2 mode, not Hydra's), and one direction per launch (in a
    launch with both, a row gets terms in both passes, and one pass's turn would wait for a program that may not have
    started)."""
    wanted = _forced["ordered"]
    if wanted is None:
        wanted = config.ORDERED_ROWS
    return bool(wanted) and per_head and not separate and one_direction_per_launch


def backward_launches(p, n, share, per_head, separate, both) -> tuple[bool, bool]:
    """(split, ordered) of a backward call: its two directions in two segment-kernel launches, and dB, dC summed over
    each group's heads in head order in the segment kernel (ordered: one direction per launch, so it takes two
    launches unless two are ruled out). ``per_head``: ngroups < nheads; ``both``: both directions run."""
    split = _forced["split"]
    may_split = split if split is not None else not config.split_directions_off()
    ordered = _ordered_rows(per_head, separate, may_split or not both)
    if split is None:
        split = ordered or _split_directions(p, n, share)
    return bool(split and both), ordered


# ---------------------------------------------------------------------------------------------
# The config a launch runs
# ---------------------------------------------------------------------------------------------
# the config each autotuner chose, by (kernel, keyword arguments, dtypes of the arguments): a finer key than the
# autotuner's own (its key names are among the keyword arguments; it adds every argument's dtype), so a later call
# launches the config the autotuner would pick without the host cost of triton's Autotuner.run
_chosen: dict = {}
_CHOSEN_MAX = 4096


def config_for(which, configs, args, kwargs):
    """The config a launch of kernel ``which`` runs: the forced one, else the default one (interpreter, or
    ``YOLO_BIMAMBA_AUTOTUNE=0``), else the one the autotuner chose for these arguments before; None where the
    autotuner has yet to choose (:func:`autotune`)."""
    idx = _forced["pairs" if which == "fwd_pairs" else which]  # (pairs= forces both pairs kernels)
    if idx is None and ((_INTERPRET and not _TUNE_IN_INTERPRETER) or not config.AUTOTUNE):
        idx = default_config(which, kwargs)
    if idx is not None:
        return configs[idx]
    return _chosen.get(_chosen_key(which, args, kwargs))


def autotune(tuner, which, grid_fn, args, kwargs):
    """Launch through the autotuner (it times every config and runs the fastest) and remember its choice; returns the
    config it chose (None where it did not say)."""
    tuner[grid_fn](*args, **kwargs)
    best = getattr(tuner, "best_config", None)  # absent where Autotuner.run is replaced (sm_90 recorder)
    if best is not None:
        if len(_chosen) >= _CHOSEN_MAX:
            _chosen.clear()
        _chosen[_chosen_key(which, args, kwargs)] = best
    return best


def _chosen_key(which, args, kwargs):
    return which, tuple(kwargs.items()), tuple(getattr(a, "dtype", None) for a in args)
