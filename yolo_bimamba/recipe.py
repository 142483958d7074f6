"""Training recipe of the SSM parameters: no weight decay on A_log, D, dt_bias, norm weights and layer scales.

Mamba trains a mixer's A_log, D and dt_bias without weight decay (its reference marks them ``_no_weight_decay``), and
normalisation weights are conventionally not decayed either. Ultralytics' ``BaseTrainer.build_optimizer`` decays every
parameter that is neither a bias nor the weight of an ``nn.*Norm`` module, so on its own it decays all of these
except the LayerNorm weights (dt_bias escapes decay only by its name: Ultralytics puts it among the biases, whose
warmup starts at ``warmup_bias_lr``, 10x lr0 by default, a jolt to every timescale of the scan). :func:`install`
wraps ``build_optimizer``: for a model that contains one of our mixers or layers, the parameters
:func:`no_decay_parameters` names are moved from the decayed groups and the bias group into the ``weight_decay=0``
weight group (Ultralytics' ``"bn"`` group with the same learning rate: no decay, the weights' warmup); every other
parameter stays where Ultralytics put it, and a model without our modules gets Ultralytics' optimizer untouched.
``YOLO_BIMAMBA_SSM_NO_DECAY=0`` in the environment turns the recipe off (Ultralytics' grouping for every model), for
comparing the two recipes.
"""
from __future__ import annotations

import functools

from torch import nn

from . import config

__all__ = ["no_decay_parameters", "apply_no_decay", "install", "enabled"]

#: Parameter names, per module class, that are never decayed (looked up by name, so that modules pickled before a
#: parameter carried its ``_no_weight_decay`` mark are treated the same).
_SSM_PARAMS = ("A_log", "D", "dt_bias", "init_states")
_LAYER_PARAMS = ("gamma", "gamma2")


def _our_module_types():
    from .nn.bimamba2 import BiMamba2
    from .nn.blocks import BiMambaLayer2D
    from .nn.hydra import Hydra
    from .nn.norm import RMSNormGated

    return BiMamba2, Hydra, BiMambaLayer2D, RMSNormGated


def no_decay_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """Name -> parameter of every parameter of our modules in ``model`` that trains without weight decay: the mixers'
    A_log, D, dt_bias (and Hydra's init_states), the gated RMSNorm weights, the layers' scales (gamma, gamma2), and
    any other parameter of our mixers and layers marked ``_no_weight_decay``. (The layers' LayerNorm weights are
    undecayed by Ultralytics already.) Empty for a stock model."""
    bimamba2, hydra, layer, norm = _our_module_types()
    out = {}
    for mname, m in model.named_modules():
        own = dict(m.named_parameters(recurse=False))
        if isinstance(m, (bimamba2, hydra)):
            keep = [k for k in own if k in _SSM_PARAMS or getattr(own[k], "_no_weight_decay", False)]
        elif isinstance(m, layer):
            keep = [k for k in own if k in _LAYER_PARAMS or getattr(own[k], "_no_weight_decay", False)]
        elif isinstance(m, norm):
            keep = [k for k in own if k == "weight"]
        else:
            continue
        out.update({f"{mname}.{k}" if mname else k: own[k] for k in keep})
    return out


def apply_no_decay(optimizer, model: nn.Module) -> int:
    """Move :func:`no_decay_parameters` of ``model`` out of ``optimizer``'s decayed groups and its "bias" group into
    the ``weight_decay=0`` weight group with the same learning rate (Ultralytics' "bn" group; one is added, copying
    the source group's settings, if none matches). Returns how many parameters moved. Call before the optimizer has
    taken a step."""
    ids = {id(p) for p in no_decay_parameters(model).values()}
    if not ids:
        return 0
    moved = 0
    groups = list(optimizer.param_groups)
    for g in groups:
        if not g.get("weight_decay") and g.get("param_group") != "bias":
            continue
        take = [p for p in g["params"] if id(p) in ids]
        if not take:
            continue
        if any(p in optimizer.state for p in take):
            raise RuntimeError("apply_no_decay: the optimizer has already stepped; call it right after building it")
        g["params"] = [p for p in g["params"] if id(p) not in ids]
        target = next((t for t in optimizer.param_groups if t is not g and not t.get("weight_decay")
                       and t.get("param_group") == "bn" and t.get("lr") == g.get("lr")
                       and t.get("use_muon", False) is False), None)
        if target is None:
            target = {k: v for k, v in g.items() if k != "params"}
            target.update(params=[], weight_decay=0.0, param_group="bn")
            target.pop("use_muon", None)
            optimizer.add_param_group(target)
            target = optimizer.param_groups[-1]
        target["params"].extend(take)
        moved += len(take)
    return moved


def enabled() -> bool:
    """False when ``YOLO_BIMAMBA_SSM_NO_DECAY=0``: the trainer then groups our parameters as Ultralytics does."""
    return config.ssm_no_decay()


def _wrap_build_optimizer(original):
    @functools.wraps(original)
    def build_optimizer(self, model, *args, **kwargs):
        optimizer = original(self, model, *args, **kwargs)
        if not enabled():
            return optimizer
        from ultralytics.utils import LOGGER
        from ultralytics.utils.torch_utils import unwrap_model

        moved = apply_no_decay(optimizer, unwrap_model(model))
        if moved:
            LOGGER.info(f"yolo_bimamba: {moved} SSM parameters (A_log, D, dt_bias, norm weights, layer scales) "
                        "moved to the weight_decay=0 weight group")
        return optimizer

    build_optimizer._yolo_bimamba_original = original
    return build_optimizer


def install() -> None:
    """Wrap ``BaseTrainer.build_optimizer`` (idempotent)."""
    from ultralytics.engine.trainer import BaseTrainer

    if not hasattr(BaseTrainer.build_optimizer, "_yolo_bimamba_original"):
        BaseTrainer.build_optimizer = _wrap_build_optimizer(BaseTrainer.build_optimizer)
