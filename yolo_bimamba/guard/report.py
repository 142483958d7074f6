"""Reporting: which parameter or tensor is non-finite (steps, checkpoints), nan_debug hooks, CUDA-graph summary."""

from __future__ import annotations

import torch
from torch import nn

from .state import _log, _unwrap


def first_nonfinite_grad(trainer):
    """(name of the first parameter in model order with a non-finite gradient, how many, how many with grads)."""
    first, n_bad, n_all = None, 0, 0
    for name, p in _unwrap(trainer.model).named_parameters():
        if p.grad is None:
            continue
        n_all += 1
        if not bool(torch.isfinite(p.grad).all()):
            n_bad += 1
            first = first or name
    return first or "<none: the total norm overflowed>", n_bad, n_all


# ------------------------------------------------------------------------------------------------------ checkpoints
def _tensors(obj, prefix=""):
    if torch.is_tensor(obj):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _tensors(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _tensors(v, f"{prefix}.{i}" if prefix else str(i))


def _first_nonfinite(items):
    for k, v in items:
        if v.is_floating_point() or v.is_complex():
            if not bool(torch.isfinite(v).all()):
                return k
    return None


def nonfinite_state(trainer, parts=("ema", "model", "optimizer"), buffers=True) -> str | None:
    """Describe the first non-finite tensor of the EMA, the live model or the optimizer state (None: all finite).

    buffers=False checks only the model's parameters (its BatchNorm statistics may be poisoned by a bad batch of a
    still open accumulation window; the guard restores them at that window's step)."""
    for what in parts:
        if what == "ema":
            ema = getattr(getattr(trainer, "ema", None), "ema", None)
            if ema is None:
                continue
            items = ema.state_dict().items()
        elif what == "model":
            m = _unwrap(trainer.model)
            items = m.state_dict().items() if buffers else m.named_parameters()
        else:
            if getattr(trainer, "optimizer", None) is None:
                continue
            items = _tensors(trainer.optimizer.state_dict().get("state", {}))
        k = _first_nonfinite(items)
        if k is not None:
            return f"{'optimizer state' if what == 'optimizer' else what} tensor '{k}' is not finite"
    return None


def checkpoint_problems(ckpt) -> list[str]:
    """Non-finite tensors anywhere in a loaded checkpoint dict (EMA/model modules, optimizer state, ...)."""
    bad = []
    for key in ("ema", "model"):
        m = ckpt.get(key)
        if isinstance(m, nn.Module):
            bad += [f"{key}.{k}" for k, v in m.state_dict().items() if v.is_floating_point()
                    and not bool(torch.isfinite(v).all())]
    for key in ("optimizer", "scaler"):
        bad += [f"{key}.{k}" for k, v in _tensors(ckpt.get(key) or {}) if v.is_floating_point()
                and not bool(torch.isfinite(v).all())]
    return bad


# ------------------------------------------------------------------------------------------------------- nan_debug
def _iter_tensors(obj):
    if torch.is_tensor(obj):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _iter_tensors(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _iter_tensors(x)


def _add_debug_hooks(trainer, st):
    model = _unwrap(trainer.model)

    def report_fwd(name):
        if st.debug_forward is None:
            st.debug_forward = name
            _log("warning", f"nan_debug: first non-finite forward output in module '{name}' "
                 f"(epoch {trainer.epoch + 1}, batch {st.batch + 1})")

    def report_bwd(what):
        if st.debug_backward is None:
            st.debug_backward = what
            _log("warning", f"nan_debug: first non-finite gradient in {what} "
                 f"(epoch {trainer.epoch + 1}, batch {st.batch + 1})")

    def fwd_hook(name):
        def hook(module, inputs, output):
            if not module.training:
                return
            for t in _iter_tensors(output):
                if not t.is_floating_point():
                    continue
                if st.debug_forward is None and not bool(torch.isfinite(t).all()):
                    report_fwd(name)
                if st.debug_backward is None and t.requires_grad and torch.is_grad_enabled():
                    t.register_hook(grad_hook(name))

        return hook

    def grad_hook(name):
        def hook(g):
            if st.debug_backward is None and not bool(torch.isfinite(g).all()):
                report_bwd(f"the output gradient of module '{name}'")

        return hook

    def param_hook(name):
        def hook(p):
            if st.debug_backward is None and p.grad is not None and not bool(torch.isfinite(p.grad).all()):
                report_bwd(f"parameter '{name}'")

        return hook

    for name, m in model.named_modules():
        st.hooks.append(m.register_forward_hook(fwd_hook(name or "<model>")))
    if hasattr(torch.Tensor, "register_post_accumulate_grad_hook"):  # torch >= 2.1: sees the accumulated .grad
        for name, p in model.named_parameters():
            if p.requires_grad:
                st.hooks.append(p.register_post_accumulate_grad_hook(param_hook(name)))


def _remove_hooks(st):
    for h in st.hooks:
        h.remove()
    st.hooks.clear()


def _log_replay(trainer):
    """Say whether the BiMamba layers replayed CUDA graphs (yolo_bimamba.nn.cuda_graph), on CUDA training only."""
    if getattr(getattr(trainer, "device", None), "type", None) != "cuda" or getattr(trainer, "model", None) is None:
        return
    from ..nn import cuda_graph
    from ..nn.blocks import BiMambaLayer2D

    model = _unwrap(trainer.model)
    if any(isinstance(m, BiMambaLayer2D) for m in model.modules()):
        _log("info", f"yolo_bimamba: {cuda_graph.summary(model, BiMambaLayer2D)}")


