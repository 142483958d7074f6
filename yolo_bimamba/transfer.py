"""What Ultralytics' pretrained transfer takes from a checkpoint into a model, before (or instead of) loading it.

Ultralytics (``DetectionModel.load``, behind ``YOLO(...).load(ckpt)`` and the trainer's ``pretrained=``) copies every
tensor of the checkpoint whose name and shape match a tensor of the model. :func:`transfer_report` applies the same
rule and says which tensors would transfer, which of the checkpoint's would be left behind and which of the model's
are new (start from their initialisation).
"""
from __future__ import annotations

from pathlib import Path

from torch import nn

__all__ = ["transfer_report"]


def transfer_report(model, ckpt) -> dict:
    """``model``: a ``YOLO`` or an ``nn.Module``; ``ckpt``: a checkpoint path (loaded by Ultralytics'
    ``load_checkpoint``), a checkpoint dict (``ema`` or ``model``) or an ``nn.Module``. Returns a dict with
    ``transferred`` (names), ``left_behind`` (checkpoint tensors without a same-named, same-shaped model tensor),
    ``new`` (model tensors the checkpoint does not provide) and the counts ``n_transferred``, ``n_checkpoint``,
    ``n_model``. (Ultralytics' own load may also copy class-head rows by class name when the class counts differ;
    those are reported here as left behind / new.)"""
    from ultralytics.engine.model import Model

    target = model.model if isinstance(model, Model) else model
    if not isinstance(target, nn.Module):
        raise TypeError(f"transfer_report: model must be a YOLO or an nn.Module, got {type(model).__name__}")
    if isinstance(ckpt, (str, Path)):
        from ultralytics.nn.tasks import load_checkpoint

        src, _ = load_checkpoint(ckpt)
    elif isinstance(ckpt, dict):
        src = ckpt.get("ema") or ckpt.get("model")
    else:
        src = ckpt
    if not isinstance(src, nn.Module):
        raise TypeError("transfer_report: ckpt must be a checkpoint path, a checkpoint dict holding 'ema' or 'model', "
                        f"or an nn.Module; got {type(ckpt).__name__}")
    csd, sd = src.state_dict(), target.state_dict()
    ok = [k for k, v in csd.items() if k in sd and sd[k].shape == v.shape]
    return {
        "transferred": ok,
        "left_behind": [k for k in csd if k not in set(ok)],
        "new": [k for k in sd if k not in csd or sd[k].shape != csd[k].shape],
        "n_transferred": len(ok), "n_checkpoint": len(csd), "n_model": len(sd),
    }
