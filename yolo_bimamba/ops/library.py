"""The blocks' fused ops as PyTorch custom ops (``torch.library``): what torch.compile and torch.export trace.

``torch.ops.yolo_bimamba.dwconv_silu``, ``.gated_rmsnorm`` and ``.layer_norm_channels_first`` (the SSD op is in
ops.bi_ssd.library). Each takes the backend its API function chose (``"triton"`` or ``"torch"``: the API validates
the arguments and decides, see ops.backend_choice.compiling), and has

- a fake (meta) implementation: the output's shape, dtype and strides (contiguous: the PyTorch expressions' results
  are made so), and those of the statistics the Triton forward keeps for its backward;
- an autograd formula (``register_autograd``). Triton backend: the forward op returns what the eager autograd
  function saves (the gated norm's rstd, the LayerNorm's mean and rstd) as extra outputs, and the backward is a second
  custom op that runs the same backward kernels as eager (``*_backward``): nothing is recomputed. PyTorch backend:
  the backward recomputes the op's PyTorch expression under ``enable_grad`` and differentiates it with
  ``torch.autograd.grad`` (plain ops, which the compiled backward graph holds); that forward runs twice in training.

Outputs never alias inputs, as custom ops require.
"""
from __future__ import annotations

import torch
from torch import Tensor

from . import dwconv, gated_norm, layer_norm
from .kernel_buffers import accumulation_dtype

BACKENDS = ("triton", "torch")


def _check_backend(op: str, backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"yolo_bimamba::{op}: backend must be one of {BACKENDS} (the API resolves 'auto'), "
                         f"got {backend!r}")


def _recomputed_grads(fn, inputs, needs, grad_out):
    """Gradients of ``fn(*inputs)`` (the PyTorch backend's expression, recomputed) for the inputs in ``needs``,
    None elsewhere; ``grad_out`` is the output's gradient."""
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_(bool(n)) if isinstance(t, Tensor) else t for t, n in zip(inputs, needs)]
        out = fn(*leaves)
        wanted = [t for t, n in zip(leaves, needs) if isinstance(t, Tensor) and n]
        got = iter(torch.autograd.grad(out, wanted, grad_out, allow_unused=True) if wanted else ())
    return [next(got) if isinstance(t, Tensor) and n else None for t, n in zip(inputs, needs)]


def _empty(like: Tensor, shape=None, dtype=None) -> Tensor:
    return like.new_empty(tuple(like.shape) if shape is None else shape, dtype=dtype or like.dtype)


# ---------------------------------------------------------------------------------------------------------------
# dwconv_silu: silu(depthwise conv1d over the sequence), (b, l, c) -> (b, l, c)
# ---------------------------------------------------------------------------------------------------------------
@torch.library.custom_op("yolo_bimamba::dwconv_silu", mutates_args=())
def dwconv_silu_op(u: Tensor, weight: Tensor, bias: Tensor | None, backend: str) -> Tensor:
    _check_backend("dwconv_silu", backend)
    if backend == "torch":
        return dwconv.dwconv_silu_reference(u, weight, bias).contiguous()
    return dwconv.triton_forward(u, weight, bias)


@dwconv_silu_op.register_fake
def _(u, weight, bias, backend):
    return _empty(u)


@torch.library.custom_op("yolo_bimamba::dwconv_silu_backward", mutates_args=())
def dwconv_silu_backward_op(dy: Tensor, u: Tensor, weight: Tensor, bias: Tensor | None) -> list[Tensor]:
    """The Triton backward kernels: [du, dweight] (+ [dbias] with a bias)."""
    du, dw, db = dwconv.triton_backward(dy, u, weight, bias)
    return [du, dw] if db is None else [du, dw, db]


@dwconv_silu_backward_op.register_fake
def _(dy, u, weight, bias):
    return [_empty(u), _empty(weight)] + ([] if bias is None else [_empty(bias)])


def _dwconv_setup(ctx, inputs, output):
    u, weight, bias, backend = inputs
    ctx.save_for_backward(u, weight, bias)
    ctx.backend = backend


def _dwconv_backward(ctx, dy):
    u, weight, bias = ctx.saved_tensors
    if ctx.backend == "torch":
        grads = _recomputed_grads(dwconv.dwconv_silu_reference, (u, weight, bias), ctx.needs_input_grad[:3], dy)
    else:
        got = dwconv_silu_backward_op(dy, u, weight, bias)
        grads = [got[0], got[1], got[2] if bias is not None else None]
    return (*grads, None)


dwconv_silu_op.register_autograd(_dwconv_backward, setup_context=_dwconv_setup)


# ---------------------------------------------------------------------------------------------------------------
# gated_rmsnorm: rmsnorm(x * silu(z)) * weight over the last dim
# ---------------------------------------------------------------------------------------------------------------
@torch.library.custom_op("yolo_bimamba::gated_rmsnorm", mutates_args=())
def gated_rmsnorm_op(x: Tensor, z: Tensor, weight: Tensor, eps: float, backend: str) -> tuple[Tensor, Tensor]:
    """(out, rstd): rstd per row from the Triton kernel (what its backward reads); an empty tensor for "torch"."""
    _check_backend("gated_rmsnorm", backend)
    if backend == "torch":
        return gated_norm.gated_rmsnorm_reference(x, z, weight, eps).contiguous(), x.new_empty(0)
    return gated_norm.triton_forward(x, z, weight, eps)


@gated_rmsnorm_op.register_fake
def _(x, z, weight, eps, backend):
    rows = x.numel() // x.shape[-1] if backend == "triton" else 0
    return _empty(x, dtype=z.dtype), _empty(x, (rows,), accumulation_dtype(x.dtype) if backend == "triton" else x.dtype)


@torch.library.custom_op("yolo_bimamba::gated_rmsnorm_backward", mutates_args=())
def gated_rmsnorm_backward_op(dout: Tensor, x: Tensor, z: Tensor, weight: Tensor,
                              rstd: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The Triton backward kernel: (dx, dz, dweight)."""
    return gated_norm.triton_backward(dout, x, z, weight, rstd)


@gated_rmsnorm_backward_op.register_fake
def _(dout, x, z, weight, rstd):
    return _empty(x), _empty(z), _empty(weight)


def _gated_setup(ctx, inputs, output):
    x, z, weight, eps, backend = inputs
    ctx.save_for_backward(x, z, weight, output[1])
    ctx.eps, ctx.backend = eps, backend


def _gated_backward(ctx, dout, _drstd):
    x, z, weight, rstd = ctx.saved_tensors
    if ctx.backend == "torch":
        fn = lambda x, z, w: gated_norm.gated_rmsnorm_reference(x, z, w, ctx.eps)  # noqa: E731
        grads = _recomputed_grads(fn, (x, z, weight), ctx.needs_input_grad[:3], dout)
    else:
        grads = gated_rmsnorm_backward_op(dout, x, z, weight, rstd)
    return (*grads, None, None)


gated_rmsnorm_op.register_autograd(_gated_backward, setup_context=_gated_setup)


def gated_rmsnorm(x: Tensor, z: Tensor, weight: Tensor, eps: float, backend: str) -> Tensor:
    """The op's output (without the statistics it keeps for its backward)."""
    return gated_rmsnorm_op(x, z, weight, eps, backend)[0]


# ---------------------------------------------------------------------------------------------------------------
# layer_norm_channels_first: LayerNorm over C of the tokens of (N, C, *spatial), token-major (N, L, C) out
# ---------------------------------------------------------------------------------------------------------------
@torch.library.custom_op("yolo_bimamba::layer_norm_channels_first", mutates_args=())
def layer_norm_op(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float,
                  backend: str) -> tuple[Tensor, Tensor, Tensor]:
    """(out, mean, rstd): per-token statistics from the Triton kernel (what its backward reads); empty for "torch"."""
    _check_backend("layer_norm_channels_first", backend)
    if backend == "torch":
        out = layer_norm.layer_norm_channels_first_reference(x, weight, bias, eps).contiguous()
        return out, x.new_empty(0), x.new_empty(0)
    return layer_norm.triton_forward(x, weight, bias, eps)


@layer_norm_op.register_fake
def _(x, weight, bias, eps, backend):
    n, c = x.shape[0], x.shape[1]
    tokens = x.numel() // (n * c) if x.numel() else 0
    out = x.new_empty((n, tokens, c))
    if backend == "torch":
        return out, x.new_empty(0), x.new_empty(0)
    stat = accumulation_dtype(x.dtype)
    return out, x.new_empty((n * tokens,), dtype=stat), x.new_empty((n * tokens,), dtype=stat)


@torch.library.custom_op("yolo_bimamba::layer_norm_channels_first_backward", mutates_args=())
def layer_norm_backward_op(dout: Tensor, x: Tensor, weight: Tensor, bias: Tensor, mean: Tensor,
                           rstd: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The Triton backward kernel: (dx, dweight, dbias)."""
    return layer_norm.triton_backward(dout, x, weight, bias, mean, rstd)


@layer_norm_backward_op.register_fake
def _(dout, x, weight, bias, mean, rstd):
    return _empty(x), _empty(weight), _empty(bias)


def _layer_norm_setup(ctx, inputs, output):
    x, weight, bias, eps, backend = inputs
    ctx.save_for_backward(x, weight, bias, output[1], output[2])
    ctx.eps, ctx.backend = eps, backend


def _layer_norm_backward(ctx, dout, _dmean, _drstd):
    x, weight, bias, mean, rstd = ctx.saved_tensors
    if ctx.backend == "torch":
        fn = lambda x, w, b: layer_norm.layer_norm_channels_first_reference(x, w, b, ctx.eps)  # noqa: E731
        grads = _recomputed_grads(fn, (x, weight, bias), ctx.needs_input_grad[:3], dout)
    else:
        grads = layer_norm_backward_op(dout, x, weight, bias, mean, rstd)
    return (*grads, None, None)


layer_norm_op.register_autograd(_layer_norm_backward, setup_context=_layer_norm_setup)


def layer_norm_channels_first(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float,
                              backend: str) -> Tensor:
    """The op's output (without the statistics it keeps for its backward)."""
    return layer_norm_op(x, weight, bias, eps, backend)[0]
