"""BatchNorm running statistics: snapshot at the start of an accumulation window, restore when its step is skipped."""

from __future__ import annotations

import torch
from torch import nn

from .state import _unwrap


def _bn_buffers(model):
    out = []
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats:
            for b in (m.running_mean, m.running_var, m.num_batches_tracked):
                if b is not None:
                    out.append(b)
    return out


def _snapshot_bn(trainer, st):
    model = _unwrap(trainer.model)
    live = _bn_buffers(model)
    if st.bn_model_id != id(model) or len(live) != len(st.bn_live) or any(a is not b for a, b in zip(live, st.bn_live)):
        st.bn_model_id, st.bn_live = id(model), live
        st.bn_saved = [b.detach().clone() for b in live]
        return
    _copy_all(st.bn_saved, live)


def _restore_bn(trainer, st):
    """Copy the snapshot back IN PLACE (ModelEMA keeps references to the model's tensors)."""
    if not st.bn_live or st.bn_model_id != id(_unwrap(trainer.model)):
        return
    _copy_all(st.bn_live, st.bn_saved)


def _copy_all(dst, src):
    with torch.no_grad():
        if hasattr(torch, "_foreach_copy_"):  # one call instead of one launch per buffer
            torch._foreach_copy_(dst, src)
        else:
            for d, s in zip(dst, src):
                d.copy_(s)

