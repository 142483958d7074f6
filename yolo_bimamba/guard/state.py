"""The guard's training arguments and per-trainer state, and the helpers every part of the guard uses."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

from torch import nn

#: nan_guard None (the default) = on for models that contain our blocks, off for stock models (see enabled)
GUARD_DEFAULTS = {"nan_guard": None, "nan_guard_max_skips": 25, "clip_max_norm": 10.0, "nan_debug": False}
CSV_SKIPPED, CSV_SKIPPED_TOTAL = "guard/skipped", "guard/skipped_total"
ULTRALYTICS_CLIP = 10.0  # the max_norm Ultralytics hard-codes in BaseTrainer.optimizer_step

_MARK = "_yolo_bimamba_guard"


@dataclass
class GuardState:
    """Per-trainer guard state, at ``trainer.guard``."""

    steps: int = 0  # optimizer steps attempted (guarded)
    skipped: int = 0  # steps skipped because the gradients were non-finite (whoever skipped them), whole run
    skipped_epoch: int = 0  # same, current epoch
    amp_skipped: int = 0  # of `skipped`, those the fp16 GradScaler skipped itself
    consecutive: int = 0  # current streak of skipped steps
    first_bad_param: str | None = None  # first parameter with a non-finite gradient in the current streak
    last_bad_param: str | None = None  # same, most recent skipped step
    refused_saves: int = 0  # save_model calls that wrote nothing because the state was not finite
    batch: int = -1  # batch index within the epoch (counted at on_train_batch_start)
    debug_forward: str | None = None  # nan_debug: first module with a non-finite forward output
    debug_backward: str | None = None  # nan_debug: first module output / parameter with a non-finite gradient
    need_snapshot: bool = field(default=True, repr=False)
    bn_model_id: int | None = field(default=None, repr=False)
    bn_live: list = field(default_factory=list, repr=False)  # BatchNorm buffers of the model (live tensors)
    bn_saved: list = field(default_factory=list, repr=False)  # their snapshot
    loss_sum: object = field(default=None, repr=False)  # running sum of the finite loss items this epoch
    loss_n: int = 0
    loss_bad: int = 0  # batches this epoch with non-finite loss items
    hooks: list = field(default_factory=list, repr=False)



# ------------------------------------------------------------------------------------------------ switches
def enabled(trainer) -> bool:
    """``nan_guard`` as set (True/False); unset (None): whether the trainer's model contains a module of this package,
    so that a stock model trains exactly as in Ultralytics unless ``nan_guard=True`` is asked for."""
    v = getattr(trainer.args, "nan_guard", None)
    if v is not None:
        return bool(v)
    return has_our_modules(getattr(trainer, "model", None))


_OURS = weakref.WeakKeyDictionary()  # model -> whether it holds a module of this package (asked at every step)


def has_our_modules(model) -> bool:
    """True if any submodule's class is defined in the ``yolo_bimamba`` package (our blocks, mixers, swapped layers)."""
    model = _unwrap(model)
    if not isinstance(model, nn.Module):
        return False
    found = _OURS.get(model)
    if found is None:
        found = any(type(m).__module__.split(".")[0] == "yolo_bimamba" for m in model.modules())
        _OURS[model] = found
    return found


def clip_value(trainer) -> float:
    v = getattr(trainer.args, "clip_max_norm", ULTRALYTICS_CLIP)
    return ULTRALYTICS_CLIP if v is None else float(v)


def max_skips(trainer) -> int:
    v = getattr(trainer.args, "nan_guard_max_skips", GUARD_DEFAULTS["nan_guard_max_skips"])
    return 0 if v is None else int(v)


def state(trainer) -> GuardState:
    st = trainer.__dict__.get("guard")
    if not isinstance(st, GuardState):
        st = GuardState()
        trainer.guard = st
    return st


def _unwrap(model):
    """The module inside DDP / DataParallel (Ultralytics' unwrap_model does this, but 8.3.0 lacks it)."""
    return model.module if isinstance(model, (nn.parallel.DataParallel, nn.parallel.DistributedDataParallel)) else model


def _rank():
    from ultralytics.utils import RANK

    return RANK


def _log(level, msg):
    from ultralytics.utils import LOGGER

    if _rank() in {-1, 0}:
        getattr(LOGGER, level)(msg)

