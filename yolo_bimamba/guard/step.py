"""The step decision: total gradient norm, clip, step or skip (``BaseTrainer.optimizer_step``)."""

from __future__ import annotations

import torch

from .batchnorm import _restore_bn
from .report import first_nonfinite_grad
from .state import _log, clip_value, max_skips, state


def _foreach_ok(trainer):
    return not (trainer.device.type == "npu")  # Ultralytics clips with foreach=False on NPU


def total_grad_norm(params, foreach=None, device=None):
    """2-norm over all gradients (a 0-dim tensor, not synchronised)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros((), device=device)  # on the trainer's device: NCCL reduces only CUDA tensors
    if hasattr(torch.nn.utils, "get_total_norm"):  # torch >= 2.6
        return torch.nn.utils.get_total_norm(grads, 2.0, error_if_nonfinite=False, foreach=foreach)
    norms = [torch.linalg.vector_norm(g.detach(), 2.0) for g in grads]
    return torch.linalg.vector_norm(torch.stack([n.to(norms[0].device) for n in norms]), 2.0)


def clip_with_norm(params, max_norm, total_norm, foreach=None):
    """Scale the gradients so that their total norm is at most max_norm (the arithmetic of clip_grad_norm_)."""
    params = [p for p in params if p.grad is not None]
    if hasattr(torch.nn.utils, "clip_grads_with_norm_"):  # torch >= 2.6 (clip_grad_norm_ = get_total_norm + this)
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total_norm, foreach=foreach)
    else:
        torch.nn.utils.clip_grad_norm_(params, max_norm=max_norm, foreach=foreach)


def any_rank(flag: torch.Tensor) -> bool:
    """True on every rank if the flag is true on any rank (all_reduce MAX under torch.distributed)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        t = flag.detach().to(torch.float32).reshape(1).clone()
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item() > 0)
    return bool(flag)


def _plain_step(trainer, clip):
    """Ultralytics' optimizer_step with a configurable max-norm (the guard is off)."""
    trainer.scaler.unscale_(trainer.optimizer)
    if clip > 0:
        foreach = None if _foreach_ok(trainer) else False
        torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), max_norm=clip, foreach=foreach)
    trainer.scaler.step(trainer.optimizer)
    trainer.scaler.update()
    trainer.optimizer.zero_grad()
    if trainer.ema:
        trainer.ema.update(trainer.model)


def _guarded_step(trainer):
    st = state(trainer)
    st.steps += 1
    scaler, optimizer = trainer.scaler, trainer.optimizer
    scaler.unscale_(optimizer)
    params = list(trainer.model.parameters())
    foreach = None if _foreach_ok(trainer) else False
    total = total_grad_norm(params, foreach=foreach, device=trainer.device)
    local_bad = ~torch.isfinite(total)
    bad = any_rank(local_bad)
    st.need_snapshot = True  # the next batch opens a new accumulation window
    if not bad:
        clip = clip_value(trainer)
        if clip > 0:
            clip_with_norm(params, clip, total, foreach=foreach)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        if trainer.ema:
            trainer.ema.update(trainer.model)
        st.consecutive = 0
        st.first_bad_param = None
        return

    # ---- skip: no optimizer step, no EMA update
    by_scaler = scaler.is_enabled() and bool(local_bad)
    scale_msg = ""
    if scaler.is_enabled():
        old = scaler.get_scale()
        if by_scaler:
            scaler.step(optimizer)  # the scaler saw the same inf/NaN in unscale_ and skips optimizer.step itself
        scaler.update()  # lets the loss scale back off as it would without the guard
        scale_msg = f", fp16 loss scale {old:g} -> {scaler.get_scale():g}"
    name, n_bad, n_all = first_nonfinite_grad(trainer)
    optimizer.zero_grad()
    _restore_bn(trainer, st)
    st.skipped += 1
    st.skipped_epoch += 1
    st.amp_skipped += int(by_scaler)
    st.consecutive += 1
    st.last_bad_param = name
    if st.first_bad_param is None:
        st.first_bad_param = name
    who = "the fp16 GradScaler skipped the optimizer step" if by_scaler else "skipped the optimizer step"
    _log("warning" if not by_scaler else "info",
         f"nan_guard: non-finite gradient norm ({float(total):g}) at epoch {trainer.epoch + 1} batch {st.batch + 1}: "
         f"{who}, the EMA update, and restored BatchNorm statistics [{st.consecutive} consecutive, {st.skipped} in "
         f"this run{scale_msg}]; first parameter with a non-finite gradient: {name} ({n_bad}/{n_all} parameters)")
    limit = max_skips(trainer)
    if limit and st.consecutive >= limit:
        extra = ""
        if st.debug_forward or st.debug_backward:
            extra = f" nan_debug: first non-finite forward output in {st.debug_forward}, first non-finite gradient " \
                    f"in {st.debug_backward}."
        raise RuntimeError(
            f"nan_guard: {st.consecutive} consecutive optimizer steps had non-finite gradients "
            f"(nan_guard_max_skips={limit}); the first parameter with a non-finite gradient was "
            f"'{st.first_bad_param}' (most recent: '{name}').{extra} Lower lr0, use nan_debug=True to find the "
            f"module, or set nan_guard_max_skips=0 to never stop."
        )

