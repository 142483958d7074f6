"""The autograd function of the bidirectional SSD's Triton backend: the forward and backward launch sequences.

Forward: the state kernel (segment-boundary states; none when the sequence is one segment), the forward kernel (the
pairs across chunks and D x; it also stores the processed dt for the kernels after it) and the forward's in-chunk
pairs kernel. Backward: the state kernel (state gradients), the segment kernel, once per direction or once for both
(tuning.backward_launches), the in-chunk pairs kernel (which also sums the per-head dB, dC over each group's heads
when ngroups < nheads, unless the segment kernel summed them in head order itself), pass C, and one small launch that
sums dA, d dt_bias and dD over the batch. Each launch runs the config tuning.config_for names (or the autotuner's).
"""
from __future__ import annotations

import functools

import torch

from ..kernel_buffers import accumulation_dtype, alloc as _alloc, compute_dtype
from ..launch import launch
from . import tuning
from .kernels_backward import _bi_ssd_bwd_kernel
from .kernels_backward_pairs import _bi_ssd_bwd_pairs_kernel
from .kernels_forward import _bi_ssd_fwd_kernel, _bi_ssd_fwd_pairs_kernel
from .kernels_reductions import _bi_ssd_bwd_dt_kernel, _bi_ssd_grad_sums_kernel
from .kernels_states import _bi_ssd_state_kernel
from .tuning import BWD_CONFIGS, FWD_CONFIGS, PAIRS_CONFIGS, STATE_CONFIGS, cdiv
from .api import kernel_tile, validate_bi_ssd

__all__ = ["bi_ssd_triton", "triton_forward", "triton_backward"]

# the backward's dot classes, each a keyword argument of the kernels naming an input precision (_dot_precisions)
DOT_CLASSES = ("DOT_ST", "DOT_RD", "DOT_MID", "DOT_IN", "DOT_LO")


def _launch(jit_fn, tuner, configs, which, grid_fn, args, kwargs, cfg=None):
    """Launch ``jit_fn`` with ``cfg``, else with the config :func:`tuning.config_for` names, else through ``tuner``
    (the autotuner's first choice for these arguments); returns the config it ran (None where the autotuner ran and
    did not say which it chose)."""
    if cfg is None:
        cfg = tuning.config_for(which, configs, args, kwargs)
        if cfg is None:
            return tuning.autotune(tuner, which, grid_fn, args, kwargs)
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
    kernels_common._dot): fp32 accuracy at half the cost of tf32x3 (two parts, 2^-17, or plain tf32 are not accurate
    enough for dA at long sequences with fast decays: tests/test_tf32_precision.py). The rest runs in bf16, whose
    rounding is that of the 16-bit outputs."""
    if x.dtype == torch.float64:
        return dict.fromkeys(DOT_CLASSES, "ieee")
    if x.dtype == torch.bfloat16:
        return dict(DOT_ST="bf16x3a", DOT_RD="bf16x3b", DOT_MID="bf16", DOT_IN="bf16", DOT_LO="bf16")
    if x.dtype == torch.float16:
        # fp16 values are not bf16 values (no exact operand for a bf16 split): tf32x3 state dots, the rest in tf32
        # (exact on two fp16 inputs), the in-chunk products too; no bf16 dots next to tf32 ones (Triton 3.6 miscompiled
        # that mix). fp16 inputs take 1.5-1.8x the GPU time of bf16 ones (the state dots)
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
    (kernels_common._entry_state).

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
        seg = tuning.segment_rows(b, h, l, x.device)
    nseg = cdiv(l, seg)
    if nseg == 1:
        return seg, 1, _no_states(cdt, x.device)
    st = _alloc((b * h, 2, nseg - 1, n, p), cdt, x.device)
    # the states feed the backward's log-decay gradients, which need DOT_ST's accuracy; a forward-only call's dots keep
    # Triton's default (tf32), as the forward kernel's do (see the kernels_common docstring)
    prec = _dot_precisions(x)["DOT_ST"] if grad or exact or x.dtype == torch.float64 else "tf32"
    _launch(_bi_ssd_state_kernel, tuning.state_tuner, STATE_CONFIGS, "state",
            lambda meta: (b * h, cdiv(p, meta["BLOCK_P"]), 2),
            (x, dt, A, B, C, bias_arg, dtb, Bb, Cb, dy if grad else x, st, l, h, g, seg, lo, hi),
            dict(P=p, N=n, BLOCK_N=kernel_tile(n), GRAD=grad, DO_F=do_f, DO_B=do_b, SHIFT=shift, HAS_BIAS=has_bias,
                 SOFTPLUS=dt_softplus, COMPUTE=compute_dtype(x.dtype), DOT_ST=prec))
    return seg, nseg, st


# what the kernels after the forward kernel are launched with: they read the processed dt it stored (dtp, dtbp) as it
# is (no bias, no softplus; limits that clamp nothing)
_PROCESSED = dict(HAS_BIAS=False, SOFTPLUS=False)
_PROCESSED_LIMITS = (float("-inf"), float("inf"))


def _shares(opts, separate) -> bool:
    """Both directions with the same dt, B, C and no shift (BiMamba2, not Hydra): the kernels then do the in-chunk
    pairs of both directions in one tile (kernels_common._pair_decay), in the causal direction's code, and the
    anti-causal direction's code only its state terms."""
    _softplus, _lo, _hi, do_f, do_b, shift = opts
    return do_f and do_b and not shift and not separate


def _chunk_tile(used, which):
    """(BLOCK_Q, BLOCK_P) of the config a segment kernel ran (``used``, from _launch): its pairs kernel must cut the
    sequence into the same chunks."""
    if used is None:
        raise RuntimeError(f"the {which} segment kernel's config is unknown (its autotuner reported none)")
    return used.kwargs["BLOCK_Q"], used.kwargs.get("BLOCK_P")


def triton_forward(x, dt, A, B, C, D, dt_bias, dt_bwd, B_bwd, C_bwd, opts, keep_states, seg=None):
    """The forward launches on contiguous inputs: (y in x's dtype, dtp, dtbp, st, seg), what the backward reads.

    dtp: the processed dt of the forward direction; dtbp: the backward direction's where it has its own dt (Hydra
    mode with both directions), else None (dtp serves both); st: the boundary states S_f, S_b (computed at the
    backward's precision) where ``keep_states`` and the sequence has several segments, else None; seg: the segment
    rows (``seg`` if given, else tuning.segment_rows). Called by _BiSSDFn (eager) and by the custom op
    ``yolo_bimamba::bi_ssd`` (ops.bi_ssd.library: torch.compile, torch.export)."""
    dt_softplus, lo, hi, do_f, do_b, shift = opts
    b, l, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    separate = dt_bwd is not None
    dtb, Bb, Cb = (dt_bwd, B_bwd, C_bwd) if separate else (dt, B, C)
    y = _alloc(x.shape, _acc_dtype(x.dtype), x.device)
    has_d, has_bias = D is not None, dt_bias is not None
    bias_arg = dt_bias if has_bias else x
    # the backward reads the forward's boundary states S_f, S_b (computed at its precision when it will run)
    seg, nseg, st = _segment_states(x, dt, A, B, C, bias_arg, dtb, Bb, Cb, None, opts, has_bias, seg=seg,
                                     exact=keep_states)
    # the processed dt (softplus, bias, limits) of each direction, stored by the forward kernel for the kernels
    # after it (they read it as it is: _PROCESSED)
    cdt = accumulation_dtype(x.dtype)
    dtp = _alloc(dt.shape, cdt, x.device)
    dtbp = _alloc(dt.shape, cdt, x.device) if separate and do_b else dtp
    store_dt = (1 if do_f else 0) + (2 if do_b and (separate or not do_f) else 0)
    args = (x, dt, A, B, C, D if has_d else x, bias_arg, dtb, Bb, Cb, y, st, dtp, dtbp, l, h, g, seg, lo, hi)
    common = dict(P=p, N=n, BLOCK_N=kernel_tile(n), DO_F=do_f, DO_B=do_b, SHIFT=shift, HAS_BIAS=has_bias,
                  SOFTPLUS=dt_softplus, COMPUTE=compute_dtype(x.dtype))
    used = _launch(_bi_ssd_fwd_kernel, tuning.fwd_tuner, FWD_CONFIGS, "fwd",
                   lambda meta: (b * h, cdiv(p, meta["BLOCK_P"]), nseg), args,
                   dict(common, HAS_D=has_d, D_PER_P=has_d and D.dim() == 2, AHEAD=tuning.fwd_ahead_bits(p, n),
                        STORE_DT=store_dt))
    # the in-chunk pairs, in the chunks and headdim blocks of the forward kernel's config
    q, bp = _chunk_tile(used, "forward")
    # (C B^T once per program, for each of its heads: fwd_pairs_heads)
    heads = tuning.fwd_pairs_heads(b, g, h // g, cdiv(p, bp) * cdiv(l, q), n, x.device)
    _launch(_bi_ssd_fwd_pairs_kernel, tuning.fwd_pairs_tuner, PAIRS_CONFIGS, "fwd_pairs",
            lambda meta: (b * g * cdiv(h // g, heads), cdiv(p, bp), cdiv(l, q)),
            (x, dtp, A, B, C, x, dtbp, Bb, Cb, y, l, h, g, heads, *_PROCESSED_LIMITS),
            dict(common, **_PROCESSED, SHARE=_shares(opts, separate), GROUPED=heads > 1, BLOCK_Q=q, BLOCK_P=bp))
    return y.to(x.dtype), dtp, None if dtbp is dtp else dtbp, st if keep_states and nseg > 1 else None, seg


def triton_backward(dy, x, dt, A, B, C, D, dt_bias, dt_bwd, B_bwd, C_bwd, dtp, dtbp, st, opts, seg):
    """The backward launches: the gradients (dx, ddt, dA, dB, dC, dD, ddt_bias, ddt_bwd, dB_bwd, dC_bwd; None where
    the input is None) from dy and what :func:`triton_forward` returned (dtbp, st None as it returns them)."""
    dt_softplus, lo, hi, do_f, do_b, shift = opts
    if dtbp is None:
        dtbp = dtp
    b, l, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    dev = x.device
    dy = dy.contiguous()
    separate = dt_bwd is not None
    dtb, Bb, Cb = (dt_bwd, B_bwd, C_bwd) if separate else (dt, B, C)
    share = _shares(opts, separate)
    cdt = accumulation_dtype(x.dtype)
    # ngroups < nheads: the segment kernel's dB, dC as each group's rows in fp32, summed over its heads in head
    # order (ordered), or as per-head rows that the pairs kernel sums over each group's heads in fp32; the latter in
    # the dtype of the buffers that are read back and added to (bf16 for bf16 inputs, as y and dx; fp32 for fp16)
    split, ordered = tuning.backward_launches(p, n, share, g != h, separate, do_f and do_b)
    per_head = g != h and not ordered
    gdt = cdt if ordered else _acc_dtype(B.dtype)
    gshape = (b, l, h, n) if per_head else (b, l, g, n)
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
                                     _PROCESSED["HAS_BIAS"], seg=seg)
    if st is None:  # one segment: no states in the forward either (gst is the stand-in)
        if nseg > 1:
            raise RuntimeError("bi_ssd_triton: the forward kept no boundary states for the backward")
        st = gst
    part_d = _alloc((b, h, nseg, p), cdt, dev)
    part = _alloc((b, h, 2), cdt, dev)
    # ORDERED: two ticket slots, then a counter per (batch * group, dB / dC, chunk), all zero
    cnt = torch.zeros(2 + 2 * b * g * cdiv(l, tuning.MIN_BWD_Q), dtype=torch.int32, device=dev) if ordered else part
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
        DOT_ST=dots["DOT_ST"], DOT_RD=dots["DOT_RD"], DOT_LO=dots["DOT_LO"], AHEAD=tuning.bwd_ahead_bits(p, n),
        **common,
    )
    grid = lambda meta: (b * h, nseg)  # noqa: E731
    bwd = functools.partial(_launch, _bi_ssd_bwd_kernel, tuning.bwd_tuner, BWD_CONFIGS, "bwd", grid)
    # (the pairs kernel's own AHEAD replaces the segment kernel's)
    pkw = {k: v for k, v in kwargs.items() if k not in ("HAS_D", "D_PER_P", "DOT_ST", "DOT_RD", "ORDERED")}
    pkw.update(DOT_MID=dots["DOT_MID"], DOT_IN=dots["DOT_IN"], AHEAD=tuning.bwd_pairs_ahead())

    def pairs(used, gB, gC, gBb, gCb, oB, oC, oBb, oCb, **flags):
        # the in-chunk pairs, after the segment kernel of the same directions, in the same chunks (its BLOCK_Q);
        # one program per (batch * group, chunk)
        q = _chunk_tile(used, "backward")[0]
        _launch(_bi_ssd_bwd_pairs_kernel, tuning.bwd_pairs_tuner, PAIRS_CONFIGS, "pairs",
                lambda meta: (b * g, cdiv(l, q)),
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
                COMPUTE=compute_dtype(x.dtype), BLOCK_Q=tuning.PASS_C_ROWS))

    # dA, d dt_bias, dD: the partials summed over the batch (and segments) in one launch, in a fixed order
    dA = _alloc(A.shape, A.dtype, dev)
    ddt_bias = _alloc(dt_bias.shape, dt_bias.dtype, dev) if has_bias else None
    dD = _alloc(D.shape, D.dtype, dev) if has_d else None
    launch(_bi_ssd_grad_sums_kernel, (h,), (part, part_d, dA, dA if ddt_bias is None else ddt_bias,
                                            dA if dD is None else dD, b, h, nseg),
           dict(P=p, BLOCK_P=kernel_tile(p), BLOCK_R=tuning.GRAD_SUM_ROWS, HAS_BIAS=has_bias, HAS_D=has_d,
                D_PER_P=has_d and D.dim() == 2, COMPUTE=compute_dtype(x.dtype), num_warps=1))
    grads = [dx.to(x.dtype), ddt, dA, gB, gC, dD, ddt_bias]
    if separate:
        grads += [ddtb, gBb, gCb]
    else:
        grads += [None, None, None]
    return grads


class _BiSSDFn(torch.autograd.Function):
    """The eager autograd function: :func:`triton_forward`, then :func:`triton_backward` on what it saved."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx, x, dt, A, B, C, D, dt_bias, dt_bwd, B_bwd, C_bwd, opts):
        y, dtp, dtbp, st, seg = triton_forward(x, dt, A, B, C, D, dt_bias, dt_bwd, B_bwd, C_bwd, opts,
                                               keep_states=any(ctx.needs_input_grad))
        ctx.save_for_backward(x, dt, A, B, C, D, dt_bias, dt_bwd, B_bwd, C_bwd, dtp, dtbp, st)
        ctx.opts, ctx.seg = opts, seg
        return y

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, dy):
        return (*triton_backward(dy, *ctx.saved_tensors, ctx.opts, ctx.seg), None)


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
