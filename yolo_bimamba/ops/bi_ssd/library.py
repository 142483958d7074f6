"""The bidirectional SSD as PyTorch custom ops (``torch.library``): what torch.compile and torch.export trace.

``torch.ops.yolo_bimamba.bi_ssd`` takes validated arguments and the backend the API chose (``"triton"`` or
``"torch"``; api._call calls it under ops.backend_choice.compiling) and returns ``(y, saved)``:

- Triton backend: ``saved`` is what the eager autograd function keeps for the backward kernels, as extra outputs:
  the processed dt (and the backward direction's own, Hydra mode), and, when ``keep_states``, the boundary states
  of a sequence cut into several segments. Its backward is a second custom op, ``yolo_bimamba::bi_ssd_backward``,
  which runs the backward kernels on them (autograd.triton_backward): nothing of the forward is recomputed. The
  segment rows are a function of the shapes and the device (tuning.segment_rows): the backward takes them from that
  rule again and checks them against the saved states.
- PyTorch backend: ``saved`` is empty; the backward recomputes the chunked PyTorch op under ``enable_grad`` and
  differentiates it (``torch.autograd.grad``: plain ops, which the compiled backward graph holds), so in training that
  forward runs twice.

The fake (meta) implementation gives every output's shape, dtype and (contiguous) strides.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..kernel_buffers import accumulation_dtype
from .torch_backend import bi_ssd_torch

BACKENDS = ("triton", "torch")
DIRECTIONS = ("both", "forward", "backward")


def _opts(dt_softplus, dt_min, dt_max, direction, shift):
    """The Triton functions' option tuple (autograd.bi_ssd_triton builds the same)."""
    return (bool(dt_softplus), float(dt_min), float(dt_max), direction in ("both", "forward"),
            direction in ("both", "backward"), bool(shift))


def _check(backend: str, direction: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"yolo_bimamba::bi_ssd: backend must be one of {BACKENDS} (the API resolves 'auto'), "
                         f"got {backend!r}")
    if direction not in DIRECTIONS:
        raise ValueError(f"yolo_bimamba::bi_ssd: direction must be one of {DIRECTIONS}, got {direction!r}")


def _own_bwd_dt(dt_bwd, direction) -> bool:
    """The backward direction has its own processed dt (autograd.triton_forward's dtbp)."""
    return dt_bwd is not None and direction in ("both", "backward")


def _segments(x: Tensor) -> tuple[int, int]:
    """(segment rows, segments) of the Triton kernels for x (tuning.segment_rows: a function of shapes and device)."""
    from . import tuning  # (imports Triton)

    b, l, h, _ = x.shape
    seg = tuning.segment_rows(b, h, l, x.device)
    return seg, tuning.cdiv(l, seg)


@torch.library.custom_op("yolo_bimamba::bi_ssd", mutates_args=())
def bi_ssd_op(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None, dt_bias: Tensor | None,
              dt_bwd: Tensor | None, B_bwd: Tensor | None, C_bwd: Tensor | None, chunk_size: int, dt_softplus: bool,
              dt_min: float, dt_max: float, direction: str, shift: bool, backend: str,
              keep_states: bool) -> tuple[Tensor, list[Tensor]]:
    """(y, saved): see the module docstring. Arguments as ops.bi_ssd's (validated there); dt_limit is (dt_min,
    dt_max)."""
    _check(backend, direction)
    if backend == "torch":
        y = bi_ssd_torch(x, dt, A, B, C, chunk_size=chunk_size, D=D, dt_bias=dt_bias, dt_softplus=dt_softplus,
                         dt_limit=(dt_min, dt_max), direction=direction, shift=shift, dt_bwd=dt_bwd, B_bwd=B_bwd,
                         C_bwd=C_bwd)
        return y.contiguous(), []  # (a slice of the padded sequence otherwise; the fake says contiguous)
    from .autograd import triton_forward  # (imports Triton)

    c = lambda t: None if t is None else t.contiguous()  # noqa: E731
    y, dtp, dtbp, st, _seg = triton_forward(c(x), c(dt), c(A), c(B), c(C), c(D), c(dt_bias), c(dt_bwd), c(B_bwd),
                                            c(C_bwd), _opts(dt_softplus, dt_min, dt_max, direction, shift),
                                            keep_states)
    return y, [t for t in (dtp, dtbp, st) if t is not None]


@bi_ssd_op.register_fake
def _(x, dt, A, B, C, D, dt_bias, dt_bwd, B_bwd, C_bwd, chunk_size, dt_softplus, dt_min, dt_max, direction, shift,
      backend, keep_states):
    y = x.new_empty(x.shape)
    if backend == "torch":
        return y, []
    cdt = accumulation_dtype(x.dtype)
    saved = [dt.new_empty(dt.shape, dtype=cdt)]
    if _own_bwd_dt(dt_bwd, direction):
        saved.append(dt.new_empty(dt.shape, dtype=cdt))
    if keep_states:
        b, l, h, p = x.shape
        _seg, nseg = _segments(x)
        if nseg > 1:
            saved.append(x.new_empty((b * h, 2, nseg - 1, B.shape[3], p), dtype=cdt))
    return y, saved


@torch.library.custom_op("yolo_bimamba::bi_ssd_backward", mutates_args=())
def bi_ssd_backward_op(dy: Tensor, x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None,
                       dt_bias: Tensor | None, dt_bwd: Tensor | None, B_bwd: Tensor | None, C_bwd: Tensor | None,
                       saved: list[Tensor], dt_softplus: bool, dt_min: float, dt_max: float, direction: str,
                       shift: bool) -> list[Tensor]:
    """The Triton backward kernels on the forward's ``saved``: the gradients of the inputs given, in the order x, dt,
    A, B, C, D, dt_bias, dt_bwd, B_bwd, C_bwd (those that are None left out)."""
    from .autograd import triton_backward  # (imports Triton)

    own = _own_bwd_dt(dt_bwd, direction)
    dtp, dtbp = saved[0], saved[1] if own else None
    st = saved[2 if own else 1] if len(saved) > (2 if own else 1) else None
    seg, nseg = _segments(x)
    if nseg != (1 if st is None else st.shape[2] + 1):
        raise RuntimeError(f"yolo_bimamba::bi_ssd_backward: the forward kept states for "
                           f"{1 if st is None else st.shape[2] + 1} segments, the segment rule now gives {nseg} "
                           f"(a forward run without keep_states, or tuning.force_config(seg=...) changed in between)")
    c = lambda t: None if t is None else t.contiguous()  # noqa: E731
    grads = triton_backward(dy, c(x), c(dt), c(A), c(B), c(C), c(D), c(dt_bias), c(dt_bwd), c(B_bwd), c(C_bwd),
                            dtp, dtbp, st, _opts(dt_softplus, dt_min, dt_max, direction, shift), seg)
    return [g for g in grads if g is not None]


@bi_ssd_backward_op.register_fake
def _(dy, x, dt, A, B, C, D, dt_bias, dt_bwd, B_bwd, C_bwd, saved, dt_softplus, dt_min, dt_max, direction, shift):
    return [t.new_empty(t.shape) for t in (x, dt, A, B, C, D, dt_bias, dt_bwd, B_bwd, C_bwd) if t is not None]


_TENSORS = 10  # x, dt, A, B, C, D, dt_bias, dt_bwd, B_bwd, C_bwd: the op's tensor inputs, first


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:_TENSORS], *output[1])
    ctx.scalars = inputs[_TENSORS:]  # chunk_size, dt_softplus, dt_min, dt_max, direction, shift, backend, keep_states


def _backward(ctx, dy, _dsaved):
    tensors = ctx.saved_tensors
    inputs, saved = tensors[:_TENSORS], list(tensors[_TENSORS:])
    chunk_size, dt_softplus, dt_min, dt_max, direction, shift, backend, _keep = ctx.scalars
    if backend == "torch":
        def fn(x, dt, A, B, C, D, dt_bias, dt_bwd, B_bwd, C_bwd):
            return bi_ssd_torch(x, dt, A, B, C, chunk_size=chunk_size, D=D, dt_bias=dt_bias, dt_softplus=dt_softplus,
                                dt_limit=(dt_min, dt_max), direction=direction, shift=shift, dt_bwd=dt_bwd,
                                B_bwd=B_bwd, C_bwd=C_bwd)

        from ..library import _recomputed_grads

        grads = _recomputed_grads(fn, inputs, ctx.needs_input_grad[:_TENSORS], dy)
    else:
        got = iter(bi_ssd_backward_op(dy, *inputs, saved, dt_softplus, dt_min, dt_max, direction, shift))
        grads = [None if t is None else next(got) for t in inputs]
    return (*grads, *([None] * 8))


bi_ssd_op.register_autograd(_backward, setup_context=_setup)


def call(x, dt, A, B, C, *, backend: str, chunk_size, D, dt_bias, dt_softplus, dt_limit, direction, shift, dt_bwd,
         B_bwd, C_bwd) -> Tensor:
    """y of the custom op for a validated ops.bi_ssd call (its keyword arguments; ``backend``: "triton" or "torch").
    The Triton forward keeps the boundary states where autograd will need them."""
    tensors = (x, dt, A, B, C, D, dt_bias, dt_bwd, B_bwd, C_bwd)
    keep = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    return bi_ssd_op(*tensors, int(chunk_size), bool(dt_softplus), float(dt_limit[0]), float(dt_limit[1]), direction,
                     bool(shift), backend, keep)[0]
